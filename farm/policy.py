"""The farm's data in defaults/, loaded once into immutable objects.

One loader per file, one bundle (`Defaults`) for all of them. Every problem in
a file is reported as one line naming the file, the key and the value.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from farm import settings
from farm.archlist import ArchList, ArchToken, parse_token
from farm.errors import BadInput
from farm.platforms import PLATFORMS
from farm.versions import vtuple
from farm.yamlio import load_yaml, top_mapping

ARCH_POLICY_FILE = "arch_policy.yml"
GRID_POLICY_FILE = "python_cuda_torch_os_policy.yml"
GPUS_FILE = "gpus.yml"
PAM_FILE = "torch_arch_matrix.yml"
PAM_MEASURED_FILE = "pam_measured.yml"   # written by `farm pam measure`, overrides PAM_FILE
TOOLKITS_FILE = "cuda_toolkits.yml"


# design.md §11.2: what one compile job may peak at, when neither the policy nor the recipe says.
DEFAULT_PEAK_GB_PER_JOB = 8.0

# The range each number the policy or a recipe sets must fall in (inclusive; peak_gb_per_job: above
# the floor). Beyond these a value is a typo, not a machine: 10**30 compile jobs would reach
# subprocess and memory admission as is.
LIMITS: Mapping[str, tuple[float, float]] = MappingProxyType({
    "max_jobs": (1, 256),                 # parallel compile jobs of one cell
    "nvcc_threads": (1, 64),              # nvcc --threads
    "timeout": (1, 7200),                 # minutes per cell: GitHub's self-hosted job limit is 5 days
    "peak_gb_per_job": (0, 1024),         # GB one compile job may peak at
    "build_epoch": (0, 1_000_000),        # bumped by hand
})
PEAK_GB_PROBLEM = f"expected a positive number of GB up to {LIMITS['peak_gb_per_job'][1]:g}, e.g. 8 or 2.5"


def out_of_bounds(key: str, value) -> str | None:
    """Why the number `value` of `key` is outside LIMITS[key] (the range in the text), or None."""
    low, high = LIMITS[key]
    strict = key == "peak_gb_per_job"     # 0 GB is no job
    if value != value or value > high or value < low or (strict and value == low):   # value != value: NaN
        return f"must be {'above' if strict else 'at least'} {low} and at most {high:,}"
    return None


def positive_gb(value) -> float | None:
    """`peak_gb_per_job` as a float (the policy's and a recipe's may be fractional), None when it is
    not a positive number within LIMITS."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or out_of_bounds("peak_gb_per_job", value):
        return None
    return float(value)


def frozen(d: Mapping) -> Mapping:
    return MappingProxyType(dict(d))


class _Reader:
    """Typed access to a parsed YAML mapping, raising BadInput naming file and key."""

    def __init__(self, path: Path):
        self.path = path
        self.where = settings.display(path)

    def mapping(self, data, key: str) -> Mapping:
        if not isinstance(data, Mapping):
            raise BadInput(self.where, key, data, "expected a mapping")
        return data

    def version(self, value, key: str) -> str:
        if not isinstance(value, str):
            raise BadInput(self.where, key, value, "write versions as quoted strings, e.g. '12.8'")
        try:
            vtuple(value)
        except ValueError:
            raise BadInput(self.where, key, value, "not a version like '12.8'") from None
        return value

    def strings(self, value, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise BadInput(self.where, key, value, "expected a list of strings")
        return tuple(value)

    def integer(self, value, key: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise BadInput(self.where, key, value, "expected an integer")
        return value

    def require(self, data: Mapping, key: str, parent: str = ""):
        if key not in data:
            raise BadInput(self.where, f"{parent}{key}", None, "missing required key")
        return data[key]


# ---------------------------------------------------------------- toolkits

@dataclass(frozen=True)
class Toolkit:
    """What one CUDA line's nvcc can emit (static table; the env step asks the real nvcc)."""

    cuda: str
    sm: frozenset[tuple[int, int]]
    a: frozenset[tuple[int, int]]
    f: frozenset[tuple[int, int]]
    jit_driver_floor: int | None
    version: str | None = None      # the full toolkit version the farm builds with (keyed)

    def cannot_emit(self, token: ArchToken) -> str | None:
        """Why this toolkit cannot emit `token`, or None when it can."""
        allowed = {"": self.sm, "a": self.a, "f": self.f}[token.variant]
        if token.cc in allowed:
            return None
        kind = {"": "sm", "a": "arch-specific", "f": "family-specific"}[token.variant]
        have = " ".join(f"{M}.{m}" for M, m in sorted(allowed)) or "none"
        return f"CUDA {self.cuda}'s nvcc cannot emit {kind} {token} (it emits: {have})"


def _cc(text: str, reader: _Reader, key: str) -> tuple[int, int]:
    t = parse_token(text, reader.where, key)
    return t.cc


def load_toolkits(path: Path) -> Mapping[str, Toolkit]:
    r = _Reader(path)
    data = top_mapping(load_yaml(path), r.where, "policy file")
    table = r.mapping(r.require(data, "toolkits"), "toolkits")
    floors = r.mapping(data.get("jit_driver_floor", {}), "jit_driver_floor")
    versions = r.mapping(data.get("versions", {}), "versions")
    out = {}
    for cuda, row in table.items():
        key = f"toolkits[{cuda}]"
        r.version(cuda, key)
        row = r.mapping(row, key)
        sets = {}
        for kind in ("sm", "a", "f"):
            values = r.strings(row.get(kind, []), f"{key}.{kind}")
            sets[kind] = frozenset(_cc(v, r, f"{key}.{kind}") for v in values)
        floor = floors.get(cuda)
        version = versions.get(cuda)
        out[cuda] = Toolkit(cuda, sets["sm"], sets["a"], sets["f"],
                            None if floor is None else r.integer(floor, f"jit_driver_floor[{cuda}]"),
                            None if version is None else r.version(version, f"versions[{cuda}]"))
    return frozen(out)


# ---------------------------------------------------------------- arch policy

@dataclass(frozen=True)
class ArchPolicy:
    x86: Mapping[str, ArchList]                      # CUDA line -> list (linux, windows)
    aarch64: Mapping[str, ArchList]                  # CUDA line -> list (linux_aarch64)
    exceptions: Mapping[tuple[str, str], tuple[ArchToken, ...]]  # (cuda, torch minor) -> added tokens
    where: str


def _checked_list(text, r: _Reader, key: str, cuda: str, toolkits: Mapping[str, Toolkit]) -> ArchList:
    arch_list = ArchList.parse(text, r.where, key)
    clamp(arch_list, cuda, toolkits, r.where, key)
    return arch_list


def clamp(arch_list: ArchList, cuda: str, toolkits: Mapping[str, Toolkit], where: str, key: str) -> None:
    """An arch the line's nvcc cannot emit is an error, never a silent drop (design.md §3.5)."""
    toolkit = toolkits.get(cuda)
    if toolkit is None:
        raise BadInput(where, key, cuda, f"no toolkit row for CUDA {cuda} in defaults/{TOOLKITS_FILE}")
    for token in arch_list:
        problem = toolkit.cannot_emit(token)
        if problem:
            raise BadInput(where, key, str(token), problem)


def load_arch_policy(path: Path, toolkits: Mapping[str, Toolkit]) -> ArchPolicy:
    r = _Reader(path)
    data = top_mapping(load_yaml(path), r.where, "policy file")
    lanes = {}
    for table in ("arch_policy", "arch_policy_aarch64"):
        rows = r.mapping(r.require(data, table), table)
        lanes[table] = frozen({
            r.version(cuda, f"{table}[{cuda}]"): _checked_list(text, r, f"{table}[{cuda}]", cuda, toolkits)
            for cuda, text in rows.items()
        })
    exceptions = {}
    for combo, delta in r.mapping(data.get("arch_exceptions", {}), "arch_exceptions").items():
        key = f"arch_exceptions[{combo}]"
        cuda, _, torch = str(combo).partition("/")
        r.version(cuda, key)
        r.version(torch, key)
        if cuda not in lanes["arch_policy"]:
            raise BadInput(r.where, key, combo, f"CUDA {cuda} has no arch_policy row to add to")
        delta = r.mapping(delta, key)
        if set(delta) != {"add"}:
            raise BadInput(r.where, key, dict(delta), "an exception is {add: [tokens]}: it adds to the policy row, never removes")
        added = ArchList.parse(" ".join(r.strings(delta["add"], f"{key}.add")), r.where, f"{key}.add")
        clamp(added, cuda, toolkits, r.where, f"{key}.add")
        exceptions[(cuda, torch)] = added.tokens
    return ArchPolicy(lanes["arch_policy"], lanes["arch_policy_aarch64"], frozen(exceptions), r.where)


# ---------------------------------------------------------------- grid policy

@dataclass(frozen=True)
class GridPolicy:
    supported_cudas: tuple[str, ...]
    min_cuda: str
    python_min: str
    prerelease_pythons: tuple[str, ...]
    platforms: tuple[str, ...]
    fallback: Mapping[str, tuple[str, str]]   # platform -> (cuda, torch minor)
    defaults: Mapping[str, object]            # package build defaults (max_jobs, nvcc_threads, ...)
    where: str
    manylinux_floor: Mapping[str, str]        # Linux platform -> a floor other than its torch wheel's tag (§7.8)

    def whole_default(self, key: str, fallback: int) -> int:
        """max_jobs, nvcc_threads or build_epoch of `defaults`: load_grid_policy refused any but whole numbers."""
        value = self.defaults.get(key, fallback)
        assert isinstance(value, int), key
        return value

    @property
    def peak_gb_per_job(self) -> float:
        """Always there: load_grid_policy checked it, or put in DEFAULT_PEAK_GB_PER_JOB, as a float."""
        value = self.defaults["peak_gb_per_job"]
        assert isinstance(value, float)
        return value


def load_grid_policy(path: Path) -> GridPolicy:
    r = _Reader(path)
    data = top_mapping(load_yaml(path), r.where, "policy file")
    cudas = r.strings(r.require(data, "supported_cudas"), "supported_cudas")
    for c in cudas:
        r.version(c, "supported_cudas")
    platforms = r.strings(data.get("platforms", list(PLATFORMS)), "platforms")
    for p in platforms:
        if p not in PLATFORMS:
            raise BadInput(r.where, "platforms", p, f"unknown platform (expected one of {', '.join(PLATFORMS)})")
    fallback = {}
    for platform, combo in r.mapping(data.get("fallback", {}), "fallback").items():
        key = f"fallback[{platform}]"
        if platform not in PLATFORMS:
            raise BadInput(r.where, key, platform, "unknown platform")
        combo = r.mapping(combo, key)
        fallback[platform] = (r.version(combo.get("cuda"), f"{key}.cuda"), r.version(combo.get("torch"), f"{key}.torch"))
    floors = {}
    for platform, tag in r.mapping(data.get("manylinux_floor", {}), "manylinux_floor").items():
        from farm.floor import floor_problem

        key = f"manylinux_floor[{platform}]"
        if platform not in ("linux", "linux_aarch64"):
            raise BadInput(r.where, key, platform, "a manylinux floor is for linux or linux_aarch64")
        if floor_problem(tag):
            raise BadInput(r.where, key, tag, floor_problem(tag) or "")
        floors[platform] = tag
    prerelease = r.strings(data.get("prerelease_pythons", []), "prerelease_pythons")
    for p in prerelease:
        r.version(p, "prerelease_pythons")
    defaults = dict(r.mapping(data.get("defaults", {}), "defaults"))
    for k in ("max_jobs", "nvcc_threads", "build_epoch"):
        if k in defaults:
            problem = out_of_bounds(k, r.integer(defaults[k], f"defaults.{k}"))
            if problem:
                raise BadInput(r.where, f"defaults.{k}", defaults[k], problem)
    peak = defaults.get("peak_gb_per_job", DEFAULT_PEAK_GB_PER_JOB)
    if positive_gb(peak) is None:
        raise BadInput(r.where, "defaults.peak_gb_per_job", peak, PEAK_GB_PROBLEM)
    defaults["peak_gb_per_job"] = positive_gb(peak)
    return GridPolicy(
        supported_cudas=cudas,
        min_cuda=r.version(r.require(data, "min_cuda"), "min_cuda"),
        python_min=r.version(r.require(data, "python_min"), "python_min"),
        prerelease_pythons=prerelease,
        platforms=platforms,
        fallback=frozen(fallback),
        defaults=frozen(defaults),
        where=r.where,
        manylinux_floor=frozen(floors),
    )


# ---------------------------------------------------------------- GPUs

@dataclass(frozen=True)
class Gpu:
    cc: tuple[int, int]
    products: tuple[str, ...]
    family: str
    platforms: tuple[str, ...]
    current: bool
    tegra: bool
    alias: tuple[int, int] | None

    @property
    def cc_text(self) -> str:
        return f"{self.cc[0]}.{self.cc[1]}"

    @property
    def name(self) -> str:
        return self.products[0]


@dataclass(frozen=True)
class GpuTable:
    devices: tuple[Gpu, ...]
    driver_floor: Mapping[int, int]   # CUDA major -> minimum driver branch
    tegra_ccs: frozenset[tuple[int, int]]  # integrated parts: no cubin compatibility with desktop parts

    def by_name(self, name: str) -> Gpu | None:
        wanted = _squash(name)
        exact = [d for d in self.devices if any(_squash(p) == wanted for p in d.products)]
        if exact:
            return exact[0]
        loose = [d for d in self.devices if any(wanted in _squash(p) for p in d.products)]
        return loose[0] if len(loose) == 1 else None

    def by_cc(self, cc: tuple[int, ...]) -> Gpu | None:
        return next((d for d in self.devices if d.cc == cc or d.alias == cc), None)


def _squash(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def load_gpus(path: Path) -> GpuTable:
    r = _Reader(path)
    data = top_mapping(load_yaml(path), r.where, "policy file")
    devices = []
    for i, row in enumerate(r.require(data, "devices")):
        key = f"devices[{i}]"
        row = r.mapping(row, key)
        alias = row.get("alias")
        devices.append(Gpu(
            cc=_cc(r.version(r.require(row, "cc", f"{key}."), f"{key}.cc"), r, f"{key}.cc"),
            products=r.strings(r.require(row, "products", f"{key}."), f"{key}.products"),
            family=str(row.get("family", "")),
            platforms=r.strings(row.get("platforms", []), f"{key}.platforms"),
            current=bool(row.get("current", False)),
            tegra=bool(row.get("tegra", False)),
            alias=None if alias is None else _cc(r.version(alias, f"{key}.alias"), r, f"{key}.alias"),
        ))
    floors = {int(k): r.integer(v, f"driver_floor[{k}]")
              for k, v in r.mapping(r.require(data, "driver_floor"), "driver_floor").items()}
    tegra = frozenset(_cc(r.version(v, "tegra_ccs"), r, "tegra_ccs")
                      for v in r.strings(data.get("tegra_ccs", []), "tegra_ccs"))
    tegra |= {d.cc for d in devices if d.tegra} | {d.alias for d in devices if d.tegra and d.alias}
    return GpuTable(tuple(devices), frozen(floors), tegra)


# ---------------------------------------------------------------- PAM

@dataclass(frozen=True)
class Pam:
    """What torch itself is compiled for, per (torch minor, CUDA line, platform)."""

    x86: Mapping[tuple[str, str], ArchList]       # (torch minor, cuda) -> list, linux
    aarch64: Mapping[tuple[str, str], ArchList]   # (torch minor, cuda) -> list
    windows: Mapping[str, ArchList]               # cuda -> list, every torch minor of the line

    def lookup(self, torch_minor: str, cuda: str, platform: str) -> ArchList | None:
        """None when the combo is unknown (its verdicts are then `unknown`, never `native`)."""
        if platform == "windows":
            return self.windows.get(cuda)
        table = self.aarch64 if platform == "linux_aarch64" else self.x86
        return table.get((torch_minor, cuda))

    def measured(self, torch_minor: str, cuda: str, platform: str, arch_list: ArchList) -> Pam:
        """A copy where a measurement overrides the table for one combo."""
        if platform == "windows":
            return Pam(self.x86, self.aarch64, frozen({**self.windows, cuda: arch_list}))
        field = "aarch64" if platform == "linux_aarch64" else "x86"
        table = {**getattr(self, field), (torch_minor, cuda): arch_list}
        return Pam(**{**self.__dict__, field: frozen(table)})


def load_pam(path: Path) -> Pam:
    r = _Reader(path)
    data = top_mapping(load_yaml(path), r.where, "policy file")
    lanes = {}
    for lane_key in ("x86", "aarch64"):
        table = {}
        for torch, row in r.mapping(r.require(data, lane_key), lane_key).items():
            r.version(torch, f"{lane_key}[{torch}]")
            for cuda, text in r.mapping(row, f"{lane_key}[{torch}]").items():
                key = f"{lane_key}[{torch}][{cuda}]"
                table[(torch, r.version(cuda, key))] = ArchList.parse(text, r.where, key)
        lanes[lane_key] = frozen(table)
    windows = {r.version(cuda, f"windows[{cuda}]"): ArchList.parse(text, r.where, f"windows[{cuda}]")
               for cuda, text in r.mapping(r.require(data, "windows"), "windows").items()}
    return Pam(lanes["x86"], lanes["aarch64"], frozen(windows))


def apply_pam_measured(pam: Pam, path: Path) -> Pam:
    """`farm pam measure` results (same shape as the table) override it combo by combo (design.md §3.8)."""
    if not Path(path).exists():
        return pam
    measured = load_pam(path)
    for lane_table, platform in ((measured.x86, "linux"), (measured.aarch64, "linux_aarch64")):
        for (torch, cuda), arch_list in lane_table.items():
            pam = pam.measured(torch, cuda, platform, arch_list)
    for cuda, arch_list in measured.windows.items():
        pam = pam.measured("", cuda, "windows", arch_list)
    return pam


# ---------------------------------------------------------------- the bundle

@dataclass(frozen=True)
class Defaults:
    grid_policy: GridPolicy
    arch_policy: ArchPolicy
    toolkits: Mapping[str, Toolkit]
    gpus: GpuTable
    pam: Pam
    folder: Path


@functools.lru_cache(maxsize=8)
def _load(folder: Path) -> Defaults:
    toolkits = load_toolkits(folder / TOOLKITS_FILE)
    return Defaults(
        grid_policy=load_grid_policy(folder / GRID_POLICY_FILE),
        arch_policy=load_arch_policy(folder / ARCH_POLICY_FILE, toolkits),
        toolkits=toolkits,
        gpus=load_gpus(folder / GPUS_FILE),
        pam=apply_pam_measured(load_pam(folder / PAM_FILE), folder / PAM_MEASURED_FILE),
        folder=folder,
    )


def load_defaults(folder: Path | str | None = None) -> Defaults:
    """Everything in defaults/ (or `folder`), validated; loaded once per folder."""
    return _load(Path(folder or settings.defaults_dir()).resolve())
