"""What a cell promises (`Expectation`) and what the gate found (`CheckResult`, `Report`).

The expectation is built by the pipeline (from the cell, the recipe and the label step's resolved
requires_dist, `Expectation.for_cell`) or by `farm verify` (from --cell: `cell_expectation`, or
from --arch-list/--platform). `GateCannotRun` (exit 2) means the gate itself could not judge,
e.g. the wheel file is missing or no fitting interpreter exists.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.archlist import ArchList
from farm.errors import GateCannotRun
from farm.recipes.model import Verify as VerifyKnobs
from farm.versions import cuda_tag
from farm.versions import python_tag as _pytag
from farm.yamlio import write_atomic

if TYPE_CHECKING:
    from farm.recipes.cells import Cell
    from farm.recipes.model import Recipe


@dataclass(frozen=True)
class Expectation:
    """What the cell promised. None means "not checked" (farm verify --arch-list knows less than a cell).

    version is the public version (1.2.3); the wheel must carry `version+local_label`.
    python_tag is the interpreter tag (cp311; abi3: the floor, cp39; py3-none: py3).
    platform is the farm's spelling (linux, windows, linux_aarch64); platform_tag, when the
    pipeline knows the image's tag, is checked exactly (manylinux_2_28_x86_64).
    """

    name: str | None
    version: str | None
    local_label: str | None
    python_tag: str | None
    platform: str
    arch_list: ArchList | None
    links_torch: bool
    requires_dist: tuple[str, ...] | None = None
    knobs: VerifyKnobs = field(default_factory=VerifyKnobs)
    platform_tag: str | None = None
    floor: str | None = None        # manylinux_2_28: the cell's floor in force (design.md §7.8); None: not judged

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "version": self.version, "local_label": self.local_label,
            "python_tag": self.python_tag, "platform": self.platform, "platform_tag": self.platform_tag,
            "floor": self.floor,
            "arch_list": None if self.arch_list is None else self.arch_list.torch(),
            "links_torch": self.links_torch,
            "requires_dist": None if self.requires_dist is None else list(self.requires_dist),
        }

    @classmethod
    def for_cell(cls, cell: Cell, *, knobs: VerifyKnobs | None = None, requires_dist: Iterable[str] | None = None,
                 version: str | None = None, platform_tag: str | None = None,
                 floor: str | None = None) -> Expectation:
        """From a farm.recipes.cells.Cell (and its recipe's verify knobs and resolved requires_dist)."""
        abi = getattr(cell, "wheel_abi", "cpython")
        py = {"py3-none": "py3", "pure": "py3"}.get(abi, f"cp{_pytag(cell.python)}")
        return cls(
            name=cell.recipe_name, version=version, local_label=cell.local_label, python_tag=py,
            platform=cell.platform, arch_list=None if abi == "pure" else cell.arch.arch_list,
            links_torch=cell.links_torch,
            requires_dist=None if requires_dist is None else tuple(requires_dist),
            knobs=knobs or VerifyKnobs(), platform_tag=platform_tag, floor=floor,
        )


@dataclass
class CheckResult:
    name: str
    status: str            # pass | warn | fail | skip
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "message": self.message, "details": self.details}

    @classmethod
    def of(cls, name: str, problems: list[str], warnings: list[str], ok: str, details: dict[str, Any] | None = None,
           ) -> CheckResult:
        """fail with every problem (and warning), else warn with the warnings, else pass with `ok`."""
        if problems:
            return cls(name, "fail", "; ".join(problems + warnings), details or {})
        if warnings:
            return cls(name, "warn", "; ".join(warnings), details or {})
        return cls(name, "pass", ok, details or {})


@dataclass
class Report:
    wheel: str
    expectation: Expectation
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.status == "fail"]

    @property
    def warned(self) -> list[str]:
        return [c.name for c in self.checks if c.status == "warn"]

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def as_dict(self) -> dict[str, Any]:
        return {"wheel": self.wheel, "passed": self.passed, "failed": self.failed, "warned": self.warned,
                "expectation": self.expectation.as_dict(), "checks": [c.as_dict() for c in self.checks]}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=False) + "\n"

    def write(self, path: Path) -> None:
        write_atomic(Path(path), self.to_json())

    def lines(self) -> list[str]:
        """Human-readable: a verdict line, then one line per check."""
        out = [f"{'PASS' if self.passed else 'FAIL'} {self.wheel}"]
        for c in self.checks:
            out.append(f"  {c.status:<4} {c.name}: {c.message}")
        return out


def resolve_requires_dist(recipe: Recipe, cell: Cell, recipes: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The recipe's requires_dist for this cell: {LOCAL}, {LOCAL:x} and pinned {VER:x} filled in.

    A {VER:x} whose recipe pins no version is known only after x is built: it becomes `*`
    (any version) and the metadata check matches that entry as a pattern.
    """
    from farm.build.label import substitute_requires

    if recipe.requires_dist is None:
        return None
    labels = {name: cuda_tag(cell.cuda) + (f"torch{cell.torch}" if other.links_torch else "")
              for name, other in recipes.items()}
    versions = {name: other.version or "*" for name, other in recipes.items()}
    return tuple(substitute_requires(list(recipe.requires_dist), cell.local_label, versions, labels,
                                     where=str(getattr(recipe, "path", "recipe"))))


def cell_expectation(cell_id: str) -> Expectation:
    """What a cell of the plan promises (farm verify --cell): its label, tags, arch list and recipe knobs."""
    try:
        from farm.recipes.plan import cell_plan
    except ImportError as exc:
        raise GateCannotRun(f"--cell {cell_id}: the planner is not available ({exc}); "
                            f"use --arch-list and --platform") from None
    cell, plan = cell_plan(cell_id)
    recipe = plan.recipes.get(cell.recipe_name)
    if recipe is None:
        raise GateCannotRun(f"--cell {cell_id}: no recipe {cell.recipe_name}")
    return Expectation.for_cell(cell, knobs=recipe.verify, version=recipe.version,
                                requires_dist=resolve_requires_dist(recipe, cell, plan.recipes))
