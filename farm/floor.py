"""The manylinux floor of a cell (design.md §7.8): the oldest Linux its wheel must install on.

A wheel of the farm sits beside the user's torch, so it must install wherever that torch installs:
by default the floor is the manylinux tag of the cell's own torch wheel, which the farm downloads
anyway (manylinux_2_28 for torch 2.13 on x86_64 and aarch64). The grid policy may name another
floor per Linux platform (`manylinux_floor` in defaults/python_cuda_torch_os_policy.yml).
`FARM_MANYLINUX_FLOOR` may only RAISE it, for a builder that cannot reach it (a Debian 12 builder
gives manylinux_2_34); the records then say that the torch floor was not reached, and by how much.

The gate's `floor` check judges the wheel by auditwheel's own policy table for the floor (the
symbol versions each manylinux policy allows), never by the wheel's tag text: `symbol_versions`.
A floor is spelt `manylinux_X_Y` without the machine, and must be one auditwheel has a policy for.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm import settings
from farm.errors import BadInput
from farm.platforms import plat_glibc

FLOOR = re.compile(r"manylinux_(\d+)_(\d+)")   # fullmatch
_ARCH_OF = {"linux": "x86_64", "linux_aarch64": "aarch64"}
SOURCES = ("torch", "policy", settings.MANYLINUX_FLOOR.name)   # where the floor in force came from


@functools.cache
def _policies(arch: str) -> dict[str, Mapping[str, frozenset[str]]]:
    """auditwheel's manylinux policies for `arch`: floor tag -> symbol-version prefix -> allowed versions."""
    from auditwheel.architecture import Architecture
    from auditwheel.libc import Libc
    from auditwheel.policy import WheelPolicies

    policies = WheelPolicies(libc=Libc.GLIBC, arch=Architecture(arch))
    suffix = f"_{arch}"
    return {p.name[: -len(suffix)]: p.symbol_versions for p in policies if p.name.startswith("manylinux_")}


def known_floors() -> list[str]:
    """Every floor auditwheel has a policy for on both machines the farm builds, oldest first."""
    return sorted(set(_policies("x86_64")) & set(_policies("aarch64")), key=plat_glibc)


def floor_problem(value: object) -> str | None:
    """None when `value` is a floor auditwheel judges (manylinux_2_28), else what is expected."""
    if isinstance(value, str) and FLOOR.fullmatch(value) and value in known_floors():
        return None
    return f"expected a manylinux_X_Y tag auditwheel has a policy for ({', '.join(known_floors())})"


def symbol_versions(floor: str, platform: str) -> Mapping[str, frozenset[str]]:
    """The versioned symbols auditwheel's `floor` policy allows on `platform`'s machine, per prefix
    (GLIBC, GLIBCXX, CXXABI, GCC, ...): {'GLIBC': {'2.2.5', ..., '2.31'}, ...}."""
    return _policies(_ARCH_OF[platform])[floor]


def highest(versions: frozenset[str]) -> str:
    """The newest numbered version of a set ('2.31' of GLIBC's); unnumbered ones (TM_1) do not count."""
    numbered = [v for v in versions if re.fullmatch(r"\d+(?:\.\d+)*", v)]
    return max(numbered, key=lambda v: tuple(int(p) for p in v.split("."))) if numbered else "none"


@dataclass(frozen=True)
class Floor:
    """The floor in force for a cell, and the torch wheel's tag it is measured against."""

    tag: str                 # manylinux_2_34: what the gate holds the wheel to
    torch: str | None        # manylinux_2_28: the cell's torch wheel's tag (None: torch's not known)
    source: str              # one of SOURCES

    @property
    def raised_by(self) -> int:
        """How many glibc minors the floor in force sits above torch's (0: torch's floor is reached)."""
        if self.torch is None:
            return 0
        return max(0, plat_glibc(self.tag)[1] - plat_glibc(self.torch)[1])

    def text(self) -> str:
        """For a person: `manylinux_2_28 (torch's)`, or `manylinux_2_34 (torch's manylinux_2_28 not
        reached: +6 minor)`; the setting or policy that decided it is named."""
        if self.torch is None:
            return f"{self.tag} ({self.source})"
        if self.raised_by:
            why = "" if self.source == "torch" else f", {self.source}"
            return f"{self.tag} (torch's {self.torch} not reached: +{self.raised_by} minor{why})"
        if self.tag == self.torch:
            return f"{self.tag} (torch's)"
        return f"{self.tag} ({self.source}; torch's {self.torch})"

    def record(self) -> dict[str, Any]:
        """As build records carry it (farm/recipes/buildrecord.py checks its form)."""
        return {"tag": self.tag, "torch": self.torch, "source": self.source, "text": self.text()}


def setting_floor() -> str | None:
    """FARM_MANYLINUX_FLOOR, checked (one line, exit 2, for a value that is no floor); None when unset."""
    value = settings.MANYLINUX_FLOOR.get()
    if value is None or value == "":
        return None
    problem = floor_problem(value)
    if problem:
        raise BadInput(settings.MANYLINUX_FLOOR.name, None, value, problem)
    return value


def wheel_floor(wheel: str | Path) -> str | None:
    """The lowest manylinux_X_Y a wheel's file name promises (its compressed tag set's oldest), or None."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        tags = parse_wheel_filename(Path(wheel).name)[3]
    except InvalidWheelFilename:
        return None
    found = []
    for tag in tags:
        try:
            found.append(plat_glibc(tag.platform))
        except ValueError:
            continue
    return f"manylinux_{min(found)[0]}_{min(found)[1]}" if found else None


def cell_floor(torch_wheel: Path, platform: str, policy: Mapping[str, str]) -> Floor:
    """The floor in force for a Linux cell whose torch is `torch_wheel` (the file the farm downloaded),
    with the grid policy's per-platform `manylinux_floor` and FARM_MANYLINUX_FLOOR applied. A setting
    that would lower the floor is refused in one line (exit 2)."""
    torch = wheel_floor(torch_wheel)
    if torch is not None and floor_problem(torch):
        raise BadInput(torch_wheel.name, "platform tag", torch, floor_problem(torch) or "")
    base = Floor(policy[platform], torch, "policy") if platform in policy else \
        Floor(torch, torch, "torch") if torch is not None else None
    raised = setting_floor()
    if raised is None:
        if base is None:
            raise BadInput(torch_wheel.name, "platform tag", None, "torch's wheel carries no manylinux tag and "
                           "the policy names no manylinux_floor for " + platform)
        return base
    if base is not None and plat_glibc(raised) < plat_glibc(base.tag):
        raise BadInput(settings.MANYLINUX_FLOOR.name, None, raised,
                       f"may only raise the floor, and {platform}'s is {base.tag} ({base.source})")
    if base is not None and raised == base.tag:
        return base
    return Floor(raised, torch, settings.MANYLINUX_FLOOR.name)
