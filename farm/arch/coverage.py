"""Which GPUs a cell serves (design.md §3.7): native, JIT-only, dead or unknown.

A device is native for a list when some cubin runs on it, JIT-only when only
PTX reaches it (and the driver can JIT that toolkit's PTX), dead otherwise.
A cell's verdict is the worst of three terms: torch's own list for that combo
(the PAM; skipped for torch-free cells), the package's list, and the driver
floor of the CUDA major.
"""

from __future__ import annotations

from dataclasses import dataclass

from farm.archlist import ArchList, ArchToken
from farm.policy import Defaults, Gpu

NATIVE, JIT, UNKNOWN, DEAD = "native", "jit-only", "unknown", "dead"
_WORSE = {NATIVE: 0, JIT: 1, UNKNOWN: 2, DEAD: 3}


@dataclass(frozen=True)
class Verdict:
    status: str
    reason: str

    def worse_than(self, other: Verdict) -> bool:
        return _WORSE[self.status] > _WORSE[other.status]


def device_for_sm(cc: tuple[int, int], defaults: Defaults) -> Gpu:
    """A device by compute capability: the table's entry, or an anonymous one."""
    known = defaults.gpus.by_cc(cc)
    if known:
        return known
    return Gpu(cc=cc, products=(f"sm_{cc[0]}{cc[1]} device",), family="", platforms=(), current=False,
               tegra=cc in defaults.gpus.tegra_ccs, alias=None)


def cubin_runs(token: ArchToken, device: Gpu, tegra_ccs: frozenset) -> bool:
    """CUDA binary compatibility of one cubin with one device."""
    if token.cc == device.cc or token.cc == device.alias:
        return True
    if token.variant == "a":          # arch-specific: exactly that device
        return False
    if device.tegra or token.cc in tegra_ccs:   # never between desktop and Tegra parts
        return False
    return token.major == device.cc[0] and device.cc[1] >= token.minor   # plain and `f`: same major, >= minor


def list_verdict(device: Gpu, arch_list: ArchList, jit_floor: int | None, driver: int | None,
                 tegra_ccs: frozenset, what: str) -> Verdict:
    """One term: can a binary built for `arch_list` run on `device`? `what` names the list in reasons."""
    cc = f"{device.cc[0]}.{device.cc[1]}"
    cubins = [t for t in arch_list if cubin_runs(t, device, tegra_ccs)]
    if cubins:
        return Verdict(NATIVE, f"{what}: sm_{cubins[0].sm}{cubins[0].variant} cubin runs on {cc}")
    ptx = [t for t in arch_list if t.ptx and device.cc >= t.cc]
    if ptx:
        best = max(ptx, key=lambda t: t.cc)
        if driver is not None and jit_floor is not None and driver < jit_floor:
            return Verdict(DEAD, f"{what}: only compute_{best.sm} PTX reaches {cc}, and driver {driver} is below "
                                 f"R{jit_floor}, the oldest that can JIT this toolkit's PTX")
        return Verdict(JIT, f"{what}: no cubin for {cc}; compute_{best.sm} PTX JIT-compiles on it")
    why = "a Tegra (Jetson) GPU runs only cubins built for it" if device.tegra else "no cubin of its major at or below it"
    same_major = [str(t) for t in arch_list if t.major == device.cc[0]]
    detail = f" (the list's {', '.join(same_major)} cannot run on it: {why})" if same_major else ""
    return Verdict(DEAD, f"{what} has no cubin for {cc} and no PTX at or below it{detail}")


def driver_verdict(cuda: str, driver: int | None, defaults: Defaults) -> Verdict:
    major = int(cuda.split(".")[0])
    floor = defaults.gpus.driver_floor.get(major)
    if driver is not None and floor is not None and driver < floor:
        return Verdict(DEAD, f"CUDA {major}.x needs driver R{floor}+; driver {driver} cannot load it")
    return Verdict(NATIVE, f"driver floor R{floor} for CUDA {major}.x" if floor else "no driver floor known")


@dataclass(frozen=True)
class CellVerdict:
    status: str
    terms: tuple[Verdict, ...]    # torch (PAM), package, driver

    @property
    def deciding(self) -> Verdict:
        return max(self.terms, key=lambda v: _WORSE[v.status])

    @property
    def reason(self) -> str:
        return self.deciding.reason


def cell_verdict(device: Gpu, cuda: str, torch_minor: str, platform: str, package_list: ArchList,
                 defaults: Defaults, *, links_torch: bool = True, driver: int | None = None) -> CellVerdict:
    """The worst of the PAM term (skipped for torch-free cells), the package term and the driver floor."""
    toolkit = defaults.toolkits.get(cuda)
    jit_floor = toolkit.jit_driver_floor if toolkit else None
    tegra = defaults.gpus.tegra_ccs
    terms = []
    if links_torch:
        torch_list = defaults.pam.lookup(torch_minor, cuda, platform)
        if torch_list is None:
            terms.append(Verdict(UNKNOWN, f"torch {torch_minor} cu{cuda.replace('.', '')} {platform} is not in the "
                                          f"PAM: torch's own arch list is unknown (farm pam measure)"))
        else:
            terms.append(list_verdict(device, torch_list, jit_floor, driver, tegra, f"torch's own list {torch_list}"))
    terms.append(list_verdict(device, package_list, jit_floor, driver, tegra, f"the package's list {package_list}"))
    terms.append(driver_verdict(cuda, driver, defaults))
    worst = max(terms, key=lambda v: _WORSE[v.status])
    return CellVerdict(worst.status, tuple(terms))


def rank(status: str) -> int:
    """Smaller is better: native < jit-only < unknown < dead."""
    return _WORSE[status]
