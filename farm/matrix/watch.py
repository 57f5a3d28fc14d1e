"""`farm matrix watch`: what the live index has that the committed grid lacks (design.md §2.8).

The live index is scraped into memory and derived with the owned policy; the
result is compared with the committed `grid.generated.yml`. Nothing under
defaults/ is touched. A line already in the committed PCWM but absent from
`supported_cudas` is a decision taken, not news.

Recipes: when `farm.recipes.reader` exists and loads, a new line's checklist names
the recipes whose `arch_list_by_cuda` / `arch_list_by_cuda_aarch64` maps lack
it; otherwise the checklist says the recipes were not checked.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from farm import settings
from farm.errors import BadInput
from farm.matrix.grid import PCWM_FILE, Grid, GridRow, Pcwm, cell_key, derive, load_grid, load_pcwm
from farm.matrix.upstream import scrape
from farm.platforms import ARM_LANE, PLATFORMS, X86_LANE
from farm.policy import ARCH_POLICY_FILE, GRID_POLICY_FILE, TOOLKITS_FILE, Defaults, load_defaults
from farm.versions import cuda_tag

EXIT_NOTHING, EXIT_NEWS, EXIT_UNREADABLE = 0, 3, 4

Cell = tuple[str, str, str, str]   # (cuda, torch minor, python, platform)


@dataclass(frozen=True)
class Task:
    text: str
    done: bool

    def as_dict(self) -> dict:
        return {"task": self.text, "done": self.done}


@dataclass(frozen=True)
class NewLine:
    cuda: str
    torches: tuple[str, ...]          # exact versions published on the line
    platforms: tuple[str, ...]
    checklist: tuple[Task, ...]

    def as_dict(self) -> dict:
        return {"cuda": self.cuda, "tag": cuda_tag(self.cuda), "torches": list(self.torches),
                "platforms": list(self.platforms), "checklist": [t.as_dict() for t in self.checklist]}


@dataclass(frozen=True)
class MovedPin:
    cuda: str
    torch: str
    platform: str
    old: str
    new: str


@dataclass(frozen=True)
class Report:
    new_lines: tuple[NewLine, ...]
    new_minors: tuple[GridRow, ...]
    new_cells: tuple[Cell, ...]
    moved_pins: tuple[MovedPin, ...]
    vanished_cells: tuple[Cell, ...]
    warnings: tuple[str, ...]
    recipes_checked: bool
    index_url: str = ""

    @property
    def news(self) -> bool:
        return bool(self.new_lines or self.new_minors or self.new_cells or self.moved_pins or self.vanished_cells)

    @property
    def exit_code(self) -> int:
        return EXIT_NEWS if self.news else EXIT_NOTHING

    def as_dict(self) -> dict:
        return {
            "news": self.news,
            "index_url": self.index_url,
            "new_lines": [n.as_dict() for n in self.new_lines],
            "new_minors": [_row_dict(r) for r in self.new_minors],
            "new_cells": [_cell_dict(c) for c in self.new_cells],
            "moved_pins": [m.__dict__ for m in self.moved_pins],
            "vanished_cells": [_cell_dict(c) for c in self.vanished_cells],
            "warnings": list(self.warnings),
            "recipes_checked": self.recipes_checked,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2) + "\n"

    def to_text(self) -> str:
        out = []
        for n in self.new_lines:
            out.append(f"new CUDA line {n.cuda} ({cuda_tag(n.cuda)}): torch {', '.join(n.torches)} "
                       f"on {', '.join(n.platforms)}")
            out.append("  checklist:")
            out += [f"    [{'x' if t.done else ' '}] {t.text}" for t in n.checklist]
        for r in self.new_minors:
            pins = ", ".join(f"{p} {r.pins[p]}" for p in PLATFORMS if p in r.pins)
            out.append(f"new torch minor: {cuda_tag(r.cuda)} torch {r.torch} ({pins}; Pythons {', '.join(r.pythons)})")
        out += [f"new cell: {_cell_text(c)}" for c in self.new_cells]
        out += [f"pin moved: {cuda_tag(m.cuda)} torch {m.torch} {m.platform}: {m.old} -> {m.new}"
                for m in self.moved_pins]
        out += [f"vanished cell: {_cell_text(c)}" for c in self.vanished_cells]
        out += [f"warning: {w}" for w in self.warnings]
        if not self.news:
            out.append(f"nothing new upstream ({self.index_url})")
        return "\n".join(out) + "\n"


def _row_dict(r: GridRow) -> dict:
    return {"cuda": r.cuda, "torch": r.torch, "pins": dict(r.pins), "pythons": list(r.pythons)}


def _cell_dict(c: Cell) -> dict:
    return dict(zip(("cuda", "torch", "python", "platform"), c, strict=True))


def _cell_text(c: Cell) -> str:
    cuda, torch, python, platform = c
    return f"{cuda_tag(cuda)} torch {torch} py{python} {platform}"


def _cells(grid: Grid, platforms) -> set[Cell]:
    return {(r.cuda, r.torch, py, p) for r in grid.rows for py in r.pythons for p in platforms
            if not grid.is_phantom(r.cuda, r.torch, py, p)}


def recipes_lacking(cuda: str) -> tuple[list[str] | None, str | None]:
    """Recipes whose *_by_cuda maps lack `cuda`, as 'name (key)'; None when recipes cannot be read."""
    if importlib.util.find_spec("farm.recipes.reader") is None:
        return None, "farm.recipes.reader is not available"
    try:
        recipes = importlib.import_module("farm.recipes.reader").load_recipes()
        lacking = []
        for name in sorted(recipes):
            arch = recipes[name].arch
            for lane_name, suffix in ((X86_LANE, ""), (ARM_LANE, "_aarch64")):
                package_wide, table = arch.lane_lists(lane_name)
                if table and cuda not in table:
                    meanwhile = f"arch_list{suffix}" if package_wide is not None else "the policy row"
                    lacking.append(f"{name} (arch_list_by_cuda{suffix}; meanwhile {meanwhile})")
        return lacking, None
    except Exception as exc:   # a broken recipe must not hide upstream news
        return None, f"recipes could not be loaded: {exc}"


def checklist(cuda: str, live: Pcwm, defaults: Defaults) -> tuple[tuple[Task, ...], bool]:
    """What a human must do before the farm builds a new line (design.md §2.8)."""
    folder = defaults.folder

    def shown(name):
        return settings.display(folder / name)

    has_arm = any(c.cuda == cuda and c.platform == "linux_aarch64" for c in live.combos)
    tasks = [
        Task(f'add "{cuda}" to supported_cudas in {shown(GRID_POLICY_FILE)}',
             cuda in defaults.grid_policy.supported_cudas),
        Task(f"add a toolkit row for {cuda} in {shown(TOOLKITS_FILE)}", cuda in defaults.toolkits),
        Task(f"add an arch_policy row for {cuda} in {shown(ARCH_POLICY_FILE)}", cuda in defaults.arch_policy.x86),
    ]
    if has_arm:
        tasks.append(Task(f"decide the ARM lane: an arch_policy_aarch64 row for {cuda} in {shown(ARCH_POLICY_FILE)}, "
                          f"or none (then no linux_aarch64 cells)", cuda in defaults.arch_policy.aarch64))
    lacking, problem = recipes_lacking(cuda)
    if lacking is None:
        tasks.append(Task(f"check recipes' *_by_cuda maps for {cuda} by hand (not checked: {problem})", False))
    elif lacking:
        tasks.append(Task(f"add {cuda} to the *_by_cuda maps of: {', '.join(lacking)}", False))
    else:
        tasks.append(Task(f"no recipe has a *_by_cuda map lacking {cuda}", True))
    tasks.append(Task("then `farm matrix scrape` and `farm matrix derive`, and commit defaults/", False))
    return tuple(tasks), lacking is not None


def compare(live: Pcwm, grid: Grid, known: Pcwm | None, defaults: Defaults,
            warnings: tuple[str, ...] = ()) -> Report:
    """News = the live index against the committed grid (and the committed PCWM for declined lines)."""
    policy = defaults.grid_policy
    declined = {c for c in (known.cudas if known else ()) if c not in policy.supported_cudas}
    new_lines, recipes_checked = [], True
    for cuda in live.cudas:
        if cuda in grid.cudas or cuda in declined:
            continue
        tasks, checked = checklist(cuda, live, defaults)
        recipes_checked &= checked
        new_lines.append(NewLine(cuda, live.torches(cuda),
                                 tuple(sorted({c.platform for c in live.combos if c.cuda == cuda})), tasks))
    fresh = {n.cuda for n in new_lines}
    live_grid = derive(live, policy)
    platforms = [p for p in PLATFORMS if p in policy.platforms]
    old_cells, new_cells = _cells(grid, platforms), _cells(live_grid, platforms)
    new_minors = tuple(r for r in live_grid.rows if grid.row(r.cuda, r.torch) is None and r.cuda not in fresh)
    added = sorted((c for c in new_cells - old_cells if grid.row(c[0], c[1]) is not None), key=cell_key)
    vanished = sorted(old_cells - new_cells, key=cell_key)
    moved = []
    for r in grid.rows:
        now = live_grid.row(r.cuda, r.torch)
        for p in platforms:
            old_pin, new_pin = r.pin(p), (now.pin(p) if now else None)
            if old_pin and new_pin and old_pin != new_pin:
                moved.append(MovedPin(r.cuda, r.torch, p, old_pin, new_pin))
    return Report(tuple(new_lines), new_minors, tuple(added), tuple(moved), tuple(vanished),
                  tuple(warnings), recipes_checked)


def watch(index_url: str, defaults_dir: Path | str | None = None) -> Report:
    """Scrape `index_url` and compare; raises UpstreamUnreadable when the index cannot be read."""
    defaults = load_defaults(defaults_dir)
    grid = load_grid(defaults.folder)
    try:
        known = load_pcwm(defaults.folder)
    except BadInput:
        if (defaults.folder / PCWM_FILE).exists():
            raise
        known = None
    result = scrape(index_url, defaults.grid_policy)
    return dataclasses.replace(compare(result.pcwm, grid, known, defaults, result.warnings), index_url=index_url)
