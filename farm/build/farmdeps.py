"""`build_requires_farm` (design.md §4.4): the farm's own wheels a cell's build installs.

A recipe naming others there (spconv needs cumm's wheel at build time) builds
against the wheel each of them has in the wheelhouse for the SAME CUDA line,
torch (a torch-free dependency: its +cuNNN wheel of that line), Python and
platform: the newest published build of that dependency's cell, read from the
manifest. The wheels' sha256 enter the dependent's build key (farm/build/buildkey.py),
so a rebuilt dependency reopens its dependents; `farm build` stages the files
for the environment step, which installs them with --no-deps into the cell's
overlay environment after its build_deps (farm/build/environments.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.recipes.cells import cell_id
from farm.versions import cuda_tag
from farm.wheelhouse.manifest import ManifestEntry

if TYPE_CHECKING:
    from farm.recipes.cells import Cell
    from farm.recipes.model import Recipe


@dataclass(frozen=True)
class FarmWheel:
    """One dependency of a cell: its recipe, its cell id and its newest published wheel (None: none yet)."""

    recipe: str
    cell: str
    coords: str                 # 'cu130/torch2.13/py3.12/linux' (torch-free: no torch part)
    entry: ManifestEntry | None

    @property
    def sha256(self) -> str | None:
        return self.entry.sha256 if self.entry is not None else None

    @property
    def published(self) -> ManifestEntry:
        """The wheel's manifest entry, for a dependency `farm build` has checked is published."""
        if self.entry is None:
            raise ValueError(f"{self.cell} has no published wheel")
        return self.entry

    def path(self, house: Path) -> Path:
        return Path(house) / "files" / self.published.project / self.published.file

    def record(self) -> dict[str, Any]:
        """What the build record and farm_build.json say about it."""
        e = self.published
        return {"recipe": self.recipe, "cell": self.cell, "file": e.file, "sha256": e.sha256,
                "build_key": e.build_key}


def dependency_cell(cell: Cell, dep: Recipe) -> str:
    """The cell id the recipe `dep` has for `cell`'s CUDA, torch, Python and platform (design.md §5.2)."""
    return cell_id(dep.name, cell.cuda, cell.torch if dep.links_torch else None, cell.python, cell.platform,
                   dep.wheel_abi)


def _coords(cell: Cell, dep: Recipe) -> str:
    torch = f"/torch{cell.torch}" if dep.links_torch else ""
    return f"{cuda_tag(cell.cuda)}{torch}/py{cell.python}/{cell.platform}"


def _fits(e: ManifestEntry, cell: Cell, dep: Recipe, project: str) -> bool:
    """The manifest's fields, not the entry's cell id: a wheel published without a build record has an id
    derived from its file name, which spells the project with hyphens (farm-dep-cu130-...)."""
    return (e.project == project and e.cuda == cell.cuda and e.torch == (cell.torch if dep.links_torch else None)
            and e.platform in (cell.platform, None) and (not e.pythons or cell.python in e.pythons))


def by_project(entries: Iterable[ManifestEntry]) -> dict[str, list[ManifestEntry]]:
    """A journal's live entries per project, in publish order (a run keys many cells against one house)."""
    out: dict[str, list[Any]] = {}
    for e in entries:
        out.setdefault(e.project, []).append(e)
    return out


def farm_wheels(cell: Cell, recipes: Mapping[str, Recipe],
                entries: Mapping[str, list[ManifestEntry]] | Iterable[ManifestEntry]) -> list[FarmWheel]:
    """The dependencies of `cell`'s recipe, in the recipe's order, each with its newest wheel in `entries`
    (a journal's live entries in publish order, or by_project() of them: the last one of its cell's
    coordinates) or None."""
    from farm.wheelhouse import normalize

    recipe = recipes[cell.recipe_name]
    projects = entries if isinstance(entries, Mapping) else by_project(entries)
    found = []
    for name in recipe.build_requires_farm:
        dep = recipes[name]
        project = normalize(dep.name)
        matches = [e for e in projects.get(project, ()) if _fits(e, cell, dep, project)]
        found.append(FarmWheel(name, dependency_cell(cell, dep), _coords(cell, dep), matches[-1] if matches else None))
    return found


def missing_line(cell_id_: str, wheel: FarmWheel, house: Path) -> str:
    """The one line `farm build` refuses a cell with when a dependency's wheel is not published."""
    from farm.settings import display

    return (f"{cell_id_}: needs {wheel.recipe}'s wheel for {wheel.coords} in {display(house)}: "
            f"build it first (farm build {wheel.cell})")


def key_input(wheels: list[FarmWheel]) -> dict[str, str | None]:
    """What enters the build key: each dependency's wheel sha256 (None while it has none)."""
    return {w.recipe: w.sha256 for w in wheels}
