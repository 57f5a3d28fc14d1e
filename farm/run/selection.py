"""What `farm run` builds (design.md §11.1): the selected cells that are not built yet, the cells
they need through `build_requires_farm`, minus what this host cannot build.

- **Finished** means the cell's build key is in the wheelhouse manifest: a restart after SIGINT or a
  crash skips exactly those, so an interrupted cell is rebuilt and a finished one is never touched.
- **Unbuildable here** (Windows on Linux, `needs_patch`, a CUDA line with no toolkit here, a torch that
  cannot be downloaded from here, aarch64 without a way to run it) is counted in one summary line and
  never changes the exit code.
"""

from __future__ import annotations

import enum
import fnmatch
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from farm import settings
from farm.errors import BadInput, FarmError
from farm.platforms import cell_arch
from farm.policy import DEFAULT_PEAK_GB_PER_JOB
from farm.recipes.cells import Cell
from farm.recipes.plan import Filters, Plan, full_plan, in_shard
from farm.run.report import iso_utc
from farm.runners.emulation import is_emulated

if TYPE_CHECKING:   # the engine is looked for only when a cell needs an image
    from farm.runners.engine import Engine

# Statuses of a cell in a run. Exit 0 needs every selected cell in OK_STATUSES.
OK_STATUSES = ("built", "skipped", "up-to-date", "expected-fail")


@dataclass
class CellRun:
    id: str
    recipe: str
    platform: str
    build_key: str | None = None
    status: str = "pending"
    deps: list[str] = field(default_factory=list)
    pulled_in: bool = False               # built because a selected cell needs it (build_requires_farm)
    expected_fail: str | None = None      # the recipe's reason when the cell matches expected_fail
    max_jobs_recipe: int = 1
    peak_gb: float = DEFAULT_PEAK_GB_PER_JOB
    max_jobs: int | None = None           # what the last attempt ran with
    max_jobs_clamp: str | None = None
    attempts: int = 0
    oom_retry: bool = False
    started: float | None = None
    finished: float | None = None
    duration: float | None = None
    wheel: str | None = None
    log: str | None = None
    message: str | None = None
    excerpt: str | None = None
    peak_process_mb: int | None = None    # the largest single process of the build (one compile job)
    peak_tree_mb: int | None = None       # sampled sum over the child's process tree (host runner)
    compiler_cache: dict | None = None
    compile_cpu_s: float | None = None    # CPU seconds of the compile's processes (the build record's)
    siblings: str = ""                    # cells of one recipe, CUDA, torch and platform: they share objects

    def public(self) -> dict:
        d = asdict(self)
        for key in ("started", "finished"):
            d[key] = iso_utc(d[key]) if d[key] else None
        return d


@dataclass
class Selection:
    plan: Plan
    todo: list[CellRun]
    skipped: list[CellRun]
    unbuildable: dict[str, list[str]]     # reason -> cell ids
    runner: str
    house: Path


# ---------------------------------------------------------------- the build context keys are made with

def resolve_runner(kind: str | None) -> str:
    from farm.runners.choose import default_kind

    return kind or default_kind()


class Contexts:
    """The BuildContext `farm build` will key a cell with, per platform, without building anything;
    and the builder image per arch, when one is built (the engine is asked once)."""

    def __init__(self, runner: str):
        self.runner = runner
        self._by_platform: dict[str, object] = {}
        self._images: dict[str, object] = {}
        self._engine_asked = False
        self._engine: Engine | None = None

    def image(self, arch: str):
        if arch not in self._images:
            from farm.runners.engine import Engine
            from farm.runners.images import load_image

            if not self._engine_asked:
                self._engine, self._engine_asked = Engine.available(), True
            self._images[arch] = load_image(arch, self._engine) if self._engine else None
        return self._images[arch]

    def key_of(self, keys, cell) -> str:
        """`cell`'s build key from `keys` (a KeyMaker) in the context of this runner."""
        return keys.key(cell, self.for_platform(cell.platform))

    def for_platform(self, platform: str):
        from farm.build.buildkey import context_for

        if platform not in self._by_platform:
            self._by_platform[platform] = context_for(platform, self.runner)
        return self._by_platform[platform]


# ---------------------------------------------------------------- what this host cannot build

class Buildability:
    """Why a cell cannot build on this host (None: it can), with every probe done once per run."""

    def __init__(self, runner: str, contexts: Contexts):
        self.runner = runner
        self.contexts = contexts
        self._toolkit: dict[str, str | None] = {}
        self._index: dict[str, str | None] = {}
        self._python: dict[str, str | None] = {}
        self._system: dict[str, str | None] = {}

    def why_not(self, cell, recipe) -> str | None:
        from farm.build.cell import refusal

        why = refusal(cell, recipe, self.runner)   # what `farm build` itself refuses
        if why:
            return why[0]
        if cell.platform == "linux_aarch64" and is_emulated(cell.platform) and not _qemu_registered():
            return "aarch64 cells: no qemu-aarch64 emulation registered (farm images setup-qemu)"
        tk = self.toolkit(cell.cuda)
        if tk:
            return tk
        py = self.python(cell)
        if py:
            return py
        system = self.system_packages(cell, recipe)
        if system:
            return system
        return self.torch(cell)

    def system_packages(self, cell, recipe) -> str | None:
        """The host runner installs nothing: a recipe's Linux system packages must be on this host already
        (what `farm build` would refuse per cell, said once for all the recipe's cells)."""
        if self.runner != "host" or cell.platform == "windows" or not recipe.system_packages:
            return None
        if recipe.name not in self._system:
            from farm.runners.syspkgs import check_host

            try:
                check_host(recipe.system_packages, settings.display(recipe.path))
                self._system[recipe.name] = None
            except BadInput as exc:
                self._system[recipe.name] = str(exc)
        return self._system[recipe.name]

    def python(self, cell) -> str | None:
        """The cell's Python must exist where the steps run (the image's own or a mounted pyenv prefix)."""
        arch = cell_arch(cell.platform)
        key = f"{arch}-{cell.python}"
        if key not in self._python:
            found = True
            if self.runner == "host":
                from farm.runners.host import HostRunner

                try:
                    HostRunner(arch=arch).python(cell.python)
                except FarmError:
                    found = False
            else:
                from farm.runners.cpython import buildable

                # no image yet: the lane's facts answered already (refusal); a CPython the farm builds counts
                image = self.contexts.image(arch)
                found = image is None or image.python(cell.python) is not None or buildable(arch, cell.python)
            self._python[key] = None if found else f"Python {cell.python}: not on this host or in its image"
        return self._python[key]

    def toolkit(self, cuda: str) -> str | None:
        if cuda not in self._toolkit:
            from farm.versions import vtuple

            why = None
            if vtuple(cuda)[0] < 13:   # NVIDIA's PyPI wheels carry nvcc from CUDA 13 on
                if self.runner == "host":
                    from farm.build.toolkit import find_system_toolkit

                    found = find_system_toolkit(cuda)[0] is not None
                else:
                    image = self.contexts.image("x86_64")
                    found = image is not None and bool(getattr(image, "cuda_home", "")) and \
                        str(getattr(image, "cuda", "")).startswith(cuda)
                if not found:
                    why = f"CUDA {cuda}: no toolkit here (PyPI has no nvcc for 12.x; none installed or in the image)"
            self._toolkit[cuda] = why
        return self._toolkit[cuda]

    def torch(self, cell) -> str | None:
        from farm.build.environments import torch_index

        index = torch_index(cell.torch_pin, cell.cuda, cell.platform)
        if index.extra_url is None:   # PyPI's own default build
            return None
        if index.url not in self._index:
            why = index.reachable(timeout=3.0)
            self._index[index.url] = None if why is None else \
                f"torch from {index.url} (not PyPI's default build): unreachable from here"
        return self._index[index.url]


def _qemu_registered() -> bool:
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    try:
        return entry.read_text().startswith("enabled")
    except OSError:
        return False


# ---------------------------------------------------------------- selection

def matches_expected_fail(recipe, cell_id: str) -> str | None:
    ef = recipe.expected_fail
    if ef and any(fnmatch.fnmatchcase(cell_id, pattern) for pattern in ef.cells):
        return ef.reason
    return None


class Readiness(enum.Enum):
    DONE = "done"                  # its build key is in the manifest
    TODO = "todo"                  # it joins the run
    UNBUILDABLE = "unbuildable"    # this host cannot build it (or a cell it needs)


@dataclass(frozen=True)
class CellState:
    readiness: Readiness
    why: str | None = None         # for UNBUILDABLE: the reason the summary line counts it under
    key: str | None = None


@dataclass
class _Walk:
    """What `visit` reads (the plan and this host's probes) and what it fills (todo, states)."""
    plan: Plan
    chosen_ids: set[str]
    key_of: Callable[[Cell], str]
    done: set[str]
    able: Buildability
    by_coords: dict[tuple, Cell]   # (recipe, cuda, torch if it links torch, python, platform) -> cell
    todo: dict[str, CellRun] = field(default_factory=dict)
    states: dict[str, CellState] = field(default_factory=dict)


def visit(cell: Cell, walk: _Walk) -> CellState:
    """The state of a cell; todo cells (and the cells they need) join `walk.todo`."""
    if cell.id in walk.states:
        return walk.states[cell.id]
    walk.states[cell.id] = CellState(Readiness.UNBUILDABLE, "build_requires_farm loop")   # guards a cycle
    key = walk.key_of(cell)   # keyed with the dependencies' wheels the house holds now (farm/build/farmdeps.py)
    plan = walk.plan
    recipe = plan.recipes[cell.recipe_name]
    dep_why, deps = None, []
    for dep_name in recipe.build_requires_farm:
        coords = (dep_name, cell.cuda, cell.torch if plan.recipes[dep_name].links_torch else None,
                  cell.python, cell.platform)
        dep = walk.by_coords.get(coords)
        if dep is None:
            dep_why = dep_why or f"needs {dep_name} for the same CUDA/torch/Python/platform, which has no cell"
            continue
        readiness = visit(dep, walk).readiness
        if readiness is Readiness.UNBUILDABLE:
            dep_why = dep_why or f"needs {dep.id}, which cannot build here"
        elif readiness is Readiness.TODO:
            deps.append(dep.id)
    if key in walk.done and not deps:   # a dependency built in this run gives new wheels: its dependents reopen
        state = CellState(Readiness.DONE, key=key)
    elif why := walk.able.why_not(cell, recipe) or dep_why:
        state = CellState(Readiness.UNBUILDABLE, why, key)
    else:
        walk.todo[cell.id] = CellRun(cell.id, cell.recipe_name, cell.platform, key, deps=deps,
                                     pulled_in=cell.id not in walk.chosen_ids,
                                     expected_fail=matches_expected_fail(recipe, cell.id),
                                     max_jobs_recipe=recipe.parallelism(plan.defaults)[0],
                                     peak_gb=recipe.peak_gb(plan.defaults),
                                     siblings=f"{cell.recipe_name}/{cell.cuda}/{cell.torch}/{cell.platform}")
        state = CellState(Readiness.TODO, key=key)
    walk.states[cell.id] = state
    return state


def select(filters: Filters, *, shard: tuple[int, int] | None = None, runner: str | None = None,
           wheelhouse: Path | None = None, plan: Plan | None = None) -> Selection:
    """The cells of `plan` (default: the full plan) that `filters` and `shard` select, sorted into
    todo (with what they need), skipped (built) and unbuildable here."""
    from farm.build.buildkey import KeyMaker
    from farm.settings import default_wheelhouse
    from farm.wheelhouse import built_keys

    plan = plan or full_plan()
    runner = resolve_runner(runner)
    house = default_wheelhouse(wheelhouse)
    contexts = Contexts(runner)
    keys = KeyMaker(plan.defaults, plan.recipes, wheelhouse=house)
    chosen = in_shard(plan.select(filters), shard)
    walk = _Walk(plan, chosen_ids={c.id for c in chosen}, key_of=lambda cell: contexts.key_of(keys, cell),
                 done=built_keys(house), able=Buildability(runner, contexts),
                 by_coords={(c.recipe_name, c.cuda, c.torch if c.links_torch else None, c.python, c.platform): c
                            for c in plan.cells})
    skipped: list[CellRun] = []
    unbuildable: dict[str, list[str]] = {}
    for cell in chosen:
        state = visit(cell, walk)
        if state.readiness is Readiness.DONE:
            skipped.append(CellRun(cell.id, cell.recipe_name, cell.platform, state.key, status="skipped"))
        elif state.readiness is Readiness.UNBUILDABLE:
            assert state.why is not None, "visit gives an unbuildable cell its reason"
            unbuildable.setdefault(state.why, []).append(cell.id)
    # Known failures last: everything else gets the machine first; dependencies before dependents.
    ordered = sorted(walk.todo.values(), key=lambda c: (c.expected_fail is not None, _depth(c, walk.todo)))
    return Selection(plan, ordered, skipped, unbuildable, runner, house)


def missing_cells(plan: Plan, cells, wheelhouse=None, runner: str | None = None) -> list:
    """The cells whose build key (as `farm build` on `runner` would key them; default: this host's
    runner) is not in the wheelhouse manifest: `farm plan --missing` and the CI plan jobs."""
    from farm.build.buildkey import KeyMaker
    from farm.wheelhouse import built_keys

    done = built_keys(wheelhouse)
    keys = KeyMaker(plan.defaults, plan.recipes, wheelhouse=wheelhouse)
    contexts = Contexts(resolve_runner(runner))
    return [c for c in cells if contexts.key_of(keys, c) not in done]


def _depth(cell: CellRun, todo: dict[str, CellRun]) -> int:
    """How many build_requires_farm levels a cell sits above (its dependencies sort first)."""
    return 1 + max((_depth(todo[d], todo) for d in cell.deps if d in todo), default=-1)
