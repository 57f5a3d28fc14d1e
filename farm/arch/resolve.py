"""Arch resolution per cell (design.md §3.1, §3.3-3.6): which list, from which rule, and the hazards.

The x86 lane and the ARM lane are resolved by two separate functions with
separate inputs: the ARM resolver never reads a recipe's x86 lists nor the
policy's exceptions (design.md §3.4). Hazards make the consequences visible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from farm.archlist import ArchList
from farm.errors import BadInput, NoSuchCell
from farm.platforms import ARM_LANE, X86_LANE, lane
from farm.policy import Defaults, clamp

X86_KEYS = ("arch_list", "arch_list_by_cuda")
ARM_KEYS = ("arch_list_aarch64", "arch_list_by_cuda_aarch64")


@dataclass(frozen=True)
class ArchOverrides:
    """A recipe's arch fields, parsed. Lists per CUDA line are validated against that line's toolkit."""

    arch_list: ArchList | None = None
    arch_list_by_cuda: Mapping[str, ArchList] = field(default_factory=dict)
    arch_list_aarch64: ArchList | None = None
    arch_list_by_cuda_aarch64: Mapping[str, ArchList] = field(default_factory=dict)
    arch_fallback_policy: bool = False

    @classmethod
    def from_mapping(cls, data: Mapping, where: str) -> ArchOverrides:
        def one(key):
            return None if data.get(key) is None else ArchList.parse(data[key], where, key)

        def by_cuda(key):
            table = data.get(key) or {}
            if not isinstance(table, Mapping):
                raise BadInput(where, key, table, "expected a mapping of CUDA line -> arch list")
            out = {}
            for cuda, text in table.items():
                if not isinstance(cuda, str):
                    raise BadInput(where, f"{key}[{cuda}]", cuda, "write CUDA lines as quoted strings, e.g. '12.8'")
                out[cuda] = ArchList.parse(text, where, f"{key}[{cuda}]")
            return out

        fallback = data.get("arch_fallback")
        if fallback not in (None, "policy"):
            raise BadInput(where, "arch_fallback", fallback, "the only value is 'policy'")
        return cls(one("arch_list"), by_cuda("arch_list_by_cuda"), one("arch_list_aarch64"),
                   by_cuda("arch_list_by_cuda_aarch64"), fallback == "policy")

    def lane_lists(self, lane_name: str) -> tuple[ArchList | None, Mapping[str, ArchList]]:
        if lane_name == ARM_LANE:
            return self.arch_list_aarch64, self.arch_list_by_cuda_aarch64
        return self.arch_list, self.arch_list_by_cuda

    def explicit(self, lane_name: str, cuda: str) -> tuple[ArchList, str] | None:
        """The recipe's own list for (lane, line), with the key it came from, or None."""
        package_wide, table = self.lane_lists(lane_name)
        suffix = "_aarch64" if lane_name == ARM_LANE else ""
        if cuda in table:
            return table[cuda], f"recipe arch_list_by_cuda{suffix}[{cuda}]"
        if package_wide is not None:
            return package_wide, f"recipe arch_list{suffix}"
        return None

    def floor(self) -> tuple[int, int] | None:
        """The lowest arch the recipe wrote anywhere, both lanes."""
        lists = [x for x in (self.arch_list, self.arch_list_aarch64) if x is not None]
        lists += [*self.arch_list_by_cuda.values(), *self.arch_list_by_cuda_aarch64.values()]
        return min((x.lowest().cc for x in lists), default=None)

    def check_toolkits(self, defaults: Defaults, where: str, lines: Iterable[str]) -> None:
        """Every list a line would use must be emittable by that line's nvcc."""
        for lane_name in (X86_LANE, ARM_LANE):
            package_wide, table = self.lane_lists(lane_name)
            suffix = "_aarch64" if lane_name == ARM_LANE else ""
            for cuda, arch_list in table.items():
                clamp(arch_list, cuda, defaults.toolkits, where, f"arch_list_by_cuda{suffix}[{cuda}]")
            if package_wide is not None:
                for cuda in lines:
                    if cuda not in table:
                        clamp(package_wide, cuda, defaults.toolkits, where, f"arch_list{suffix}")


NO_OVERRIDES = ArchOverrides()


@dataclass(frozen=True)
class Resolution:
    """A cell's arch list and the rule that produced it (design.md §3.6)."""

    arch_list: ArchList        # normalised
    provenance: str            # which rule of design.md §3.3, §3.4
    lane: str
    cuda: str
    torch: str | None

    @property
    def fell_back_to_policy(self) -> bool:
        return self.provenance.startswith(("arch_policy", "arch_exceptions"))

    def exports(self) -> dict[str, str]:
        return {
            "TORCH_CUDA_ARCH_LIST": self.arch_list.torch(),
            "CUDAARCHS": self.arch_list.cmake(),
            "CMAKE_CUDA_ARCHITECTURES": self.arch_list.cmake(),
        }


def resolve_x86(cuda: str, torch_minor: str | None, overrides: ArchOverrides, defaults: Defaults,
                combination_list: ArchList | None = None) -> tuple[ArchList, str]:
    """design.md §3.3, first hit wins."""
    if combination_list is not None:
        return combination_list, "recipe combinations[].arch_list"
    own = overrides.explicit(X86_LANE, cuda)
    if own:
        return own
    policy = defaults.arch_policy
    if cuda not in policy.x86:
        raise BadInput(policy.where, f"arch_policy[{cuda}]", cuda, "no arch_policy row for this CUDA line")
    added = policy.exceptions.get((cuda, torch_minor)) if torch_minor else None
    if added:
        return (policy.x86[cuda].plus(added),
                f"arch_exceptions[{cuda}/{torch_minor}] (arch_policy[{cuda}] + {' '.join(map(str, added))})")
    return policy.x86[cuda], f"arch_policy[{cuda}]"


def resolve_aarch64(cuda: str, overrides: ArchOverrides, defaults: Defaults) -> tuple[ArchList, str]:
    """design.md §3.4, first hit wins. Never reads x86 lists or exceptions."""
    own = overrides.explicit(ARM_LANE, cuda)
    if own:
        return own
    rows = defaults.arch_policy.aarch64
    if cuda not in rows:
        raise NoSuchCell(f"no such cell: CUDA {cuda} has no arch_policy_aarch64 row, so the farm builds no "
                         f"linux_aarch64 cells for it")
    return rows[cuda], f"arch_policy_aarch64[{cuda}]"


def resolve(cuda: str, torch_minor: str | None, platform: str, defaults: Defaults,
            overrides: ArchOverrides = NO_OVERRIDES, combination_list: ArchList | None = None,
            where: str = "<recipe>") -> Resolution:
    """The normalised, toolkit-checked list of one cell."""
    lane_name = lane(platform)
    if lane_name == ARM_LANE:
        arch_list, provenance = resolve_aarch64(cuda, overrides, defaults)
    else:
        arch_list, provenance = resolve_x86(cuda, torch_minor, overrides, defaults, combination_list)
    key = provenance.removeprefix("recipe ").split(" ")[0]
    source = where if provenance.startswith("recipe") else defaults.arch_policy.where
    clamp(arch_list, cuda, defaults.toolkits, source, key)
    return Resolution(arch_list.normalised(), provenance, lane_name, cuda, torch_minor)


# ---------------------------------------------------------------- hazards (design.md §3.5)

@dataclass(frozen=True)
class Hazard:
    recipe: str
    cuda: str
    lane: str
    kind: str        # "a", "b" or "c"
    message: str

    def __str__(self) -> str:
        return f"{self.recipe}: {self.lane} {self.cuda}: ({self.kind}) {self.message}"


def _arch_set(arch_list: ArchList) -> set[str]:
    return {f"{t.major}.{t.minor}{t.variant}" for t in arch_list}


def fallback_hazards(recipe: str, overrides: ArchOverrides, built: Mapping[str, Iterable[str]],
                     defaults: Defaults) -> list[Hazard]:
    """Hazards per (line, lane) the recipe builds. `built` maps lane -> CUDA lines built on it."""
    hazards = []
    floor = overrides.floor()
    for lane_name in (X86_LANE, ARM_LANE):
        other = ARM_LANE if lane_name == X86_LANE else X86_LANE
        package_wide, table = overrides.lane_lists(lane_name)
        suffix = "_aarch64" if lane_name == ARM_LANE else ""
        for cuda in sorted(set(built.get(lane_name, ())), key=lambda c: tuple(map(int, c.split(".")))):
            if lane_name == ARM_LANE:
                arch_list, provenance = resolve_aarch64(cuda, overrides, defaults)
            else:
                arch_list, provenance = resolve_x86(cuda, None, overrides, defaults)
            fell_back = provenance.startswith("arch_policy")

            def add(kind, message, cuda=cuda, lane_name=lane_name):
                hazards.append(Hazard(recipe, cuda, lane_name, kind, message))

            if fell_back and table and package_wide is None and not overrides.arch_fallback_policy:
                add("a", f"arch_list_by_cuda{suffix} has no key {cuda!r} and there is no package-wide list: "
                         f"falls back to {provenance} = {arch_list} (declare arch_fallback: policy if intended)")
            other_own = overrides.explicit(other, cuda)
            # arch_fallback: policy declares the policy row intended on every lane: design.md §3.5 counts
            # diso (x86 lists for 12.4/12.6 only, ARM 12.6 on policy) clean once it declares it.
            if fell_back and other_own and not overrides.arch_fallback_policy:
                mine, theirs = _arch_set(arch_list), _arch_set(other_own[0])
                if mine != theirs:
                    extra = " ".join(sorted(mine - theirs, key=_num)) or "-"
                    missing = " ".join(sorted(theirs - mine, key=_num)) or "-"
                    add("b", f"falls back to {provenance} = {arch_list}, which differs from the {other} lane's "
                             f"{other_own[1]} = {other_own[0]} (added: {extra}; missing: {missing})")
            if floor is not None and arch_list.lowest().cc < floor:
                add("c", f"resolved list {arch_list} ({provenance}) goes below the recipe's floor "
                         f"{floor[0]}.{floor[1]}")
    return hazards


def _num(token: str) -> tuple[int, int]:
    major, minor = token.rstrip("af").split(".")
    return int(major), int(minor)
