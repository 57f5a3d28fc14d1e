"""The plan: every cell of every recipe, with filters, shards and build keys (design.md §5.3).

`full_plan()` loads defaults, recipes, grid and PCWM once and returns the
cells; `session_index()` is the small cached list (ids and tags) the
noxfile reads so that listing sessions stays fast with the full grid.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from farm import settings
from farm.arch.resolve import NO_OVERRIDES
from farm.errors import BadInput
from farm.policy import Defaults, load_defaults
from farm.recipes.cells import Cell, Resolutions, recipe_cells
from farm.yamlio import write_atomic

if TYPE_CHECKING:
    from farm.matrix.grid import Grid, Pcwm
    from farm.recipes.model import Recipe


@dataclass(frozen=True)
class Filters:
    package: tuple[str, ...] = ()
    cuda: tuple[str, ...] = ()
    torch: tuple[str, ...] = ()
    python: tuple[str, ...] = ()
    platform: tuple[str, ...] = ()

    def match(self, cell: Cell) -> bool:
        return ((not self.package or cell.recipe_name in self.package)
                and (not self.cuda or cell.cuda in self.cuda)
                and (not self.torch or (cell.links_torch and cell.torch in self.torch))
                and (not self.python or cell.python in self.python)
                and (not self.platform or cell.platform in self.platform))


@dataclass(frozen=True)
class Plan:
    cells: tuple[Cell, ...]
    recipes: dict[str, Recipe]
    defaults: Defaults

    def by_id(self) -> dict[str, Cell]:
        return {c.id: c for c in self.cells}

    def select(self, filters: Filters) -> list[Cell]:
        return [c for c in self.cells if filters.match(c)]


def full_plan(defaults: Defaults | None = None, recipes: dict[str, Recipe] | None = None, grid: Grid | None = None,
              pcwm: Pcwm | None = None, cells_of: Iterable[str] | None = None) -> Plan:
    """Every cell of every recipe; `cells_of` names the only recipes whose cells are derived (the
    plan still holds every recipe: build keys read the recipes a cell depends on)."""
    from farm.matrix.grid import load_grid, load_pcwm
    from farm.recipes.reader import load_recipes

    defaults = defaults or load_defaults()
    recipes = recipes if recipes is not None else load_recipes(defaults=defaults)
    grid = grid or load_grid()
    pcwm = pcwm or load_pcwm()
    shared: Resolutions = {}   # policy resolutions, shared by every recipe without arch overrides
    cells: list[Cell] = []
    for name in sorted(recipes):
        if cells_of is not None and name not in cells_of:
            continue
        recipe = recipes[name]
        cells += recipe_cells(recipe, defaults, grid, pcwm, shared if recipe.arch == NO_OVERRIDES else {})
    return Plan(tuple(cells), recipes, defaults)


def cell_plan(cell_id: str) -> tuple[Cell, Plan]:
    """A cell by id and a plan holding only its recipe's cells: what one build needs. A child of
    `farm run` builds one cell, and deriving the whole grid for it cost half a second per cell."""
    from farm.recipes.reader import load_recipes

    defaults = load_defaults()
    recipes = load_recipes(defaults=defaults)
    owners = [name for name in recipes if cell_id.startswith(name + "-")]
    plan = full_plan(defaults, recipes, cells_of=owners)
    cell = plan.by_id().get(cell_id)
    if cell is not None:
        return cell, plan
    plan = full_plan(defaults, recipes)   # for the nearest ids of the error
    return find_cell(cell_id, plan), plan


def find_cell(cell_id: str, plan: Plan | None = None) -> Cell:
    """A cell by id, or a one-line error with the nearest ids."""
    if plan is None:
        return cell_plan(cell_id)[0]
    cells = plan.by_id()
    if cell_id in cells:
        return cells[cell_id]
    import difflib

    near = difflib.get_close_matches(cell_id, list(cells), n=2)
    hint = f" (did you mean {' or '.join(near)}?)" if near else ""
    raise BadInput("command line", "cell", cell_id, f"no such cell in the plan{hint}")


def shard_of(cell_id: str, count: int) -> int:
    """1-based shard of a cell: a hash of its id, so adding a recipe moves no other cell."""
    return int.from_bytes(hashlib.sha256(cell_id.encode()).digest()[:8], "big") % count + 1


def parse_shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
        if not 1 <= index <= count:
            raise ValueError
    except ValueError:
        raise BadInput("command line", "--shard", text, "expected i/n with 1 <= i <= n, e.g. 3/8") from None
    return index, count


def in_shard(cells: Iterable[Cell], shard: tuple[int, int] | None) -> list[Cell]:
    if shard is None:
        return list(cells)
    index, count = shard
    return [c for c in cells if shard_of(c.id, count) == index]


# ---------------------------------------------------------------- cached session index for the noxfile

def inputs_digest() -> str:
    """Hash of every file under defaults/ and recipes/ (and the planner's own code)."""
    h = hashlib.sha256()
    roots = [settings.defaults_dir(), settings.recipes_dir()]
    # The planner's code: whole stage packages, so a module split off one of them still counts.
    farm_dir = settings.PROJECT_ROOT / "farm"
    code = [p for pkg in ("recipes", "matrix", "arch") for p in sorted((farm_dir / pkg).glob("*.py"))]
    for root in roots:
        for path in sorted(root.rglob("*")) if root.is_dir() else ():
            if path.is_file():
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    for path in code:
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def session_index() -> list[tuple[str, tuple[str, ...]]]:
    """(cell id, tags) of the whole plan, cached by inputs_digest()."""
    cache = settings.cache_dir() / "plan" / f"sessions-{inputs_digest()}.json"
    try:
        return [(i, tuple(t)) for i, t in json.loads(cache.read_text())]
    except (OSError, ValueError):
        pass
    index = [(c.id, c.tags) for c in full_plan().cells]
    write_atomic(cache, json.dumps(index, separators=(",", ":")))
    return index
