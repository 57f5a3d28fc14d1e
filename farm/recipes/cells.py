"""Cells: one (package, CUDA, torch, Python, platform) build, one wheel (design.md §5.1, §5.2).

A recipe's rows are its own `combinations` (exact patches, looked up in the
PCWM) or the grid (filtered by min/max torch). Rows x Pythons x platforms,
minus phantoms, minus ARM cells on lines without an ARM policy row. Two
collapses: torch-free recipes get one cell per (CUDA line, Python, platform),
built against the newest torch of the line that has a wheel for it; abi3,
py3-none and pure recipes get one cell per (CUDA, torch, platform).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from farm.arch.resolve import Resolution, resolve
from farm.archlist import ArchList, parse_token
from farm.errors import BadInput
from farm.platforms import cell_suffix
from farm.policy import Defaults
from farm.versions import cuda_tag, minor_of, python_tag, vtuple

if TYPE_CHECKING:   # for the annotations only: listing the plan's sessions stays as light as it was
    from farm.matrix.grid import Grid, Pcwm
    from farm.recipes.model import Recipe

PYTHON_COLLAPSED = {"abi3": "abi3", "py3-none": "py3", "pure": "pure"}


@dataclass(frozen=True)
class Cell:
    recipe_name: str
    cuda: str               # '13.0'
    torch: str              # torch minor of the channel, '2.13'
    torch_pin: str          # the exact torch the environment installs for this platform, '2.13.0'
    python: str             # '3.11' (abi3 / py3-none / pure: the floor Python of the row)
    platform: str           # linux | windows | linux_aarch64
    links_torch: bool
    wheel_abi: str          # cpython | abi3 | py3-none | pure
    arch: Resolution
    id: str

    @property
    def local_label(self) -> str:
        """cu130torch2.13 for torch-linked wheels, cu130 for torch-free ones (design.md §6.5)."""
        return f"{cuda_tag(self.cuda)}torch{self.torch}" if self.links_torch else cuda_tag(self.cuda)

    @property
    def tags(self) -> tuple[str, ...]:
        """nox tags: package, cuNNN, torchM.m (torch-linked), pyXY (or abi3/py3/pure), platform."""
        py = PYTHON_COLLAPSED.get(self.wheel_abi, f"py{python_tag(self.python)}")
        torch = (f"torch{self.torch}",) if self.links_torch else ()
        return (self.recipe_name, cuda_tag(self.cuda), *torch, py, self.platform)


def cell_id(name: str, cuda: str, torch: str | None, python: str, platform: str, wheel_abi: str = "cpython") -> str:
    """`<name>-cu<NNN>-torch<M.m>-py<XY>[-aarch64|-win]`; torch-free ones have no torch part."""
    py = PYTHON_COLLAPSED.get(wheel_abi, f"py{python_tag(python)}")
    torch_part = f"-torch{torch}" if torch else ""
    return f"{name}-{cuda_tag(cuda)}{torch_part}-{py}{cell_suffix(platform)}"


def row_id(cell: Cell) -> str:
    """`<name>-cu<NNN>-torch<M.m>[-aarch64|-win]`: the cell id without its Python part. A row's Pythons share
    a compiler cache group (design.md §11.3); torch-free rows have no torch part, as their cells."""
    torch_part = f"-torch{cell.torch}" if cell.links_torch else ""
    return f"{cell.recipe_name}-{cuda_tag(cell.cuda)}{torch_part}{cell_suffix(cell.platform)}"


def row_of_cell_id(cell: str) -> str:
    """The row of a cell id, for a record that names only its cell: the id without its `-py<XY>` part.
    An abi3 or pure id has no such part and is its row's only cell already."""
    return re.sub(r"-py\d+(?=-|$)", "", cell, count=1)


# (cuda, torch, platform, id of the row's own list) -> its resolution; full_plan shares one between recipes.
Resolutions = dict[tuple[str, str, str, int], Resolution]


@dataclass(frozen=True)
class _Row:
    """One (CUDA, torch) row a recipe builds: its pins per platform and Pythons per platform."""

    cuda: str
    torch: str
    pins: Mapping[str, str]                     # platform -> exact torch
    pythons: Mapping[str, tuple[str, ...]]      # platform -> Pythons with a wheel
    arch_list: ArchList | None = None           # an own combination's list


def _grid_rows(recipe: Recipe, defaults: Defaults, grid: Grid) -> Iterable[_Row]:
    for row in grid.rows:
        if recipe.min_torch and vtuple(row.torch) < vtuple(recipe.min_torch):
            continue
        if recipe.max_torch and vtuple(row.torch) > vtuple(recipe.max_torch):
            continue
        pins = {p: pin for p in recipe.platforms if (pin := row.pin(p))}
        pythons = {p: tuple(py for py in row.pythons if not grid.is_phantom(row.cuda, row.torch, py, p))
                   for p in pins}
        yield _Row(row.cuda, row.torch, pins, pythons)


def _own_rows(recipe: Recipe, pcwm: Pcwm) -> Iterable[_Row]:
    """Own combinations name exact patches: a cell exists when the PCWM has that exact wheel (design.md §2.6)."""
    for combo in recipe.combinations:
        pythons = {p: tuple(py for py in combo.pythons if pcwm.has(combo.cuda, combo.torch, py, p))
                   for p in recipe.platforms}
        pythons = {p: pys for p, pys in pythons.items() if pys}
        yield _Row(combo.cuda, minor_of(combo.torch), {p: combo.torch for p in pythons}, pythons, combo.arch_list)


def recipe_cells(recipe: Recipe, defaults: Defaults, grid: Grid, pcwm: Pcwm,
                 resolutions: Resolutions | None = None) -> list[Cell]:
    """Every cell of one recipe, in grid order."""
    resolutions = {} if resolutions is None else resolutions
    rows = list(_own_rows(recipe, pcwm) if recipe.combinations else _grid_rows(recipe, defaults, grid))
    where = str(recipe.path)

    def arch(cuda, torch, platform, row_list):
        key = (cuda, torch, platform, id(row_list))
        if key not in resolutions:
            resolutions[key] = resolve(cuda, torch, platform, defaults, recipe.arch, row_list, where)
        return resolutions[key]

    def arm_ok(cuda, platform):
        return platform != "linux_aarch64" or cuda in defaults.arch_policy.aarch64

    cells: list[Cell] = []
    if not recipe.links_torch:
        # Torch-free: one cell per (line, Python, platform), against the newest row that has the wheel.
        newest: dict[tuple[str, str, str], _Row] = {}
        for row in rows:
            for platform, pythons in row.pythons.items():
                for py in pythons:
                    key = (row.cuda, py, platform)
                    if key not in newest or vtuple(row.torch) > vtuple(newest[key].torch):
                        newest[key] = row
        for (cuda, py, platform), row in sorted(newest.items(), key=lambda kv: (vtuple(kv[0][0]), vtuple(kv[0][1]), kv[0][2])):
            if arm_ok(cuda, platform):
                cells.append(_cell(recipe, row, py, platform, arch(cuda, row.torch, platform, row.arch_list)))
        return _collapse(recipe, cells)
    for row in rows:
        for platform in recipe.platforms:
            if platform not in row.pythons or not arm_ok(row.cuda, platform):
                continue
            resolution = arch(row.cuda, row.torch, platform, row.arch_list)
            for py in row.pythons[platform]:
                cells.append(_cell(recipe, row, py, platform, resolution))
    return _collapse(recipe, cells)


def _cell(recipe: Recipe, row: _Row, python: str, platform: str, resolution: Resolution) -> Cell:
    torch_part = row.torch if recipe.links_torch else None
    return Cell(recipe.name, row.cuda, row.torch, row.pins[platform], python, platform, recipe.links_torch,
                recipe.wheel_abi, resolution, cell_id(recipe.name, row.cuda, torch_part, python, platform, recipe.wheel_abi))


def _collapse(recipe: Recipe, cells: list[Cell]) -> list[Cell]:
    """abi3 / py3-none / pure: keep one cell per id (the floor Python of the row)."""
    if recipe.wheel_abi not in PYTHON_COLLAPSED:
        return cells
    first: dict[str, Cell] = {}
    for cell in cells:
        if cell.id not in first or vtuple(cell.python) < vtuple(first[cell.id].python):
            first[cell.id] = cell
    return list(first.values())


def smoke_cell(cell, choice: str | None):
    """The cell with one token of its list: `choice` (e.g. `8.6` or `12.0+PTX`), else the lowest. The
    token keeps its own PTX, so `12.0+PTX` is smoke-built as SASS and PTX of 12.0."""
    full = cell.arch.arch_list
    token = full.lowest()
    if choice is not None:
        want = parse_token(choice.strip(), "farm build", "--arch")
        found = [t for t in full if (t.major, t.minor, t.variant) == (want.major, want.minor, want.variant)]
        if not found:
            raise BadInput("farm build", "--arch", choice, f"not a token of {cell.id}'s list {full.torch()}")
        token = found[0]
    return replace(cell, arch=replace(cell.arch, arch_list=ArchList.of([token]),
                                      provenance=f"smoke: {token} of {full.torch()} ({cell.arch.provenance})"))
