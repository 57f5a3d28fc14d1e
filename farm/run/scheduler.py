"""`farm run` (SPEC 11, 8.4): plan, skip what is built, build the rest in parallel, resumably.

    result = run_farm(RunOptions(filters=Filters(package=("farm_demo",)), jobs=2))
    result.exit_code   # 0 only when every selected cell is built, skipped or an expected failure

- **Finished** means the cell's build key is in the wheelhouse manifest: a restart after SIGINT or a
  crash skips exactly those, so an interrupted cell is rebuilt and a finished one is never touched.
- **Selection**: the plan's cells (filters, `--shard`) that are not built, minus the cells this host
  cannot build (`unbuildable-here`: Windows on Linux, `needs_patch`, a CUDA line with no toolkit here,
  a torch that cannot be downloaded from here, aarch64 without a way to run it), which are counted in
  one summary line and never change the exit code; cells a selected cell needs through
  `build_requires_farm` are pulled in and built first.
- **Isolation**: every cell builds in its own child process (`python -m farm.run.scheduler --child`, which
  calls farm.build.cell.build_cell) in its own session; a crash or a failure stays in that cell.
- **Memory admission** (SPEC 8.4): a cell reserves `max_jobs x peak_gb_per_job` of the budget
  (`--mem-budget`, default: MemAvailable at start). When its recipe's max_jobs does not fit what is
  free, max_jobs is clamped for that build and the clamp recorded in its build record; an out of
  memory kill (exit 137, SIGKILL, a compiler "Killed") is `oom` and retried once with max_jobs
  halved. Arch lists are never trimmed. Emulated aarch64 cells have their own cap (`--arm-jobs`).
- **Interrupts**: SIGINT/SIGTERM stop admitting, let each child remove its container, then stop
  whatever is left of its process tree; the report is written and the exit code is 130.
"""

from __future__ import annotations

import fnmatch
import json
import os
import select as io_select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from farm import paths
from farm.errors import FarmError
from farm.policy import DEFAULT_PEAK_GB_PER_JOB
from farm.recipes.plan import Filters, Plan, full_plan, in_shard
from farm.run.report import iso_utc
from farm.runners.emulation import cell_arch, is_emulated

# Statuses of a cell in a run. Exit 0 needs every selected cell in OK_STATUSES.
OK_STATUSES = ("built", "skipped", "up-to-date", "expected-fail")
OOM_PATTERNS = ("Killed signal terminated program", "died due to signal 9", "out of memory", "Out of memory",
                "std::bad_alloc", "exit 137")
CHILD_GRACE_S = 20.0


class RunError(FarmError):
    exit_code = 2


@dataclass
class RunOptions:
    filters: Filters = field(default_factory=Filters)
    shard: tuple[int, int] | None = None
    jobs: int | None = None              # cells at once (default: one per CPU)
    mem_budget_gb: float | None = None   # default: MemAvailable at start
    runner: str | None = None            # container | host | None (container when an engine answers)
    wheelhouse: Path | None = None
    build_dir: Path | None = None        # build/<cell>/ per cell (default: the project's build/)
    compiler_cache: bool = True
    arm_jobs: int = 1                    # emulated aarch64 cells at once
    dry_run: bool = False
    plain: bool | None = None            # None: rich on a terminal, plain lines otherwise


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


@dataclass
class RunResult:
    run_id: str
    exit_code: int
    cells: list[CellRun]
    unbuildable: dict[str, list[str]]
    report_json: Path | None = None
    report_html: Path | None = None
    seconds: float = 0.0

    def counts(self) -> Counter:
        return Counter(c.status for c in self.cells)


# ---------------------------------------------------------------- the build context keys are made with

def resolve_runner(kind: str | None) -> str:
    from farm.runners import default_kind

    return kind or default_kind()


class Contexts:
    """The BuildContext `farm build` will key a cell with, per platform, without building anything;
    and the builder image per arch, when one is built (the engine is asked once)."""

    def __init__(self, runner: str):
        self.runner = runner
        self._by_platform: dict[str, object] = {}
        self._images: dict[str, object] = {}
        self._engine: object = False    # not asked yet

    def image(self, arch: str):
        if arch not in self._images:
            from farm.runners.engine import Engine
            from farm.runners.images import load_image

            if self._engine is False:
                self._engine = Engine.available()
            self._images[arch] = load_image(arch, self._engine) if self._engine else None
        return self._images[arch]

    def key_of(self, keys, cell) -> str:
        """`cell`'s build key from `keys` (a KeyMaker) in the context of this runner."""
        return keys.key(cell, self.for_platform(cell.platform))

    def for_platform(self, platform: str):
        from farm.recipes.buildkey import context_for

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
        return self.torch(cell)

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
                image = self.contexts.image(arch)
                found = image is None or image.python(cell.python) is not None   # no image yet: it will say
            self._python[key] = None if found else f"Python {cell.python}: not on this host or in its image"
        return self._python[key]

    def toolkit(self, cuda: str) -> str | None:
        if cuda not in self._toolkit:
            from farm.versions import vtuple

            why = None
            if vtuple(cuda)[0] < 13:   # NVIDIA's PyPI wheels carry nvcc from CUDA 13 on
                if self.runner == "host":
                    from farm.build.toolkit import find_system_toolkit

                    found = find_system_toolkit(cuda)[0]
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


def select(options: RunOptions, plan: Plan | None = None) -> Selection:
    from farm.recipes.buildkey import KeyMaker
    from farm.wheelhouse import built_keys
    from farm.wheelhouse.paths import default_wheelhouse

    plan = plan or full_plan()
    runner = resolve_runner(options.runner)
    house = default_wheelhouse(options.wheelhouse)
    contexts = Contexts(runner)
    keys = KeyMaker(plan.defaults, plan.recipes, wheelhouse=house)
    done = built_keys(house)
    able = Buildability(runner, contexts)
    by_coords = {(c.recipe_name, c.cuda, c.torch if c.links_torch else None, c.python, c.platform): c
                 for c in plan.cells}

    def key_of(cell) -> str:
        return contexts.key_of(keys, cell)

    chosen = in_shard(plan.select(options.filters), options.shard)
    todo: dict[str, CellRun] = {}
    skipped: list[CellRun] = []
    unbuildable: dict[str, list[str]] = {}
    states: dict[str, tuple[str, str | None, str | None]] = {}   # id -> (state, why, key)

    def visit(cell) -> tuple[str, str | None, str | None]:
        """('done' | 'todo' | 'unbuildable', why, key) for a cell; todo cells (and their needs) join the run."""
        if cell.id in states:
            return states[cell.id]
        states[cell.id] = ("unbuildable", "build_requires_farm loop", None)   # guards a cycle
        key = key_of(cell)   # keyed with the dependencies' wheels the house holds now (farm/build/farmdeps.py)
        recipe = plan.recipes[cell.recipe_name]
        dep_why, deps = None, []
        for dep_name in recipe.build_requires_farm:
            coords = (dep_name, cell.cuda, cell.torch if plan.recipes[dep_name].links_torch else None,
                      cell.python, cell.platform)
            dep = by_coords.get(coords)
            if dep is None:
                dep_why = dep_why or f"needs {dep_name} for the same CUDA/torch/Python/platform, which has no cell"
                continue
            state = visit(dep)[0]
            if state == "unbuildable":
                dep_why = dep_why or f"needs {dep.id}, which cannot build here"
            elif state == "todo":
                deps.append(dep.id)
        if key in done and not deps:   # a dependency built in this run gives new wheels: its dependents reopen
            states[cell.id] = ("done", None, key)
            return states[cell.id]
        why = able.why_not(cell, recipe) or dep_why
        if why:
            states[cell.id] = ("unbuildable", why, key)
            return states[cell.id]
        todo[cell.id] = CellRun(cell.id, cell.recipe_name, cell.platform, key, deps=deps,
                                pulled_in=cell.id not in chosen_ids,
                                expected_fail=matches_expected_fail(recipe, cell.id),
                                max_jobs_recipe=recipe.parallelism(plan.defaults)[0],
                                peak_gb=recipe.peak_gb(plan.defaults),
                                siblings=f"{cell.recipe_name}/{cell.cuda}/{cell.torch}/{cell.platform}")
        states[cell.id] = ("todo", None, key)
        return states[cell.id]

    chosen_ids = {c.id for c in chosen}
    for cell in chosen:
        state, why, key = visit(cell)
        if state == "done":
            skipped.append(CellRun(cell.id, cell.recipe_name, cell.platform, key, status="skipped"))
        elif state == "unbuildable":
            unbuildable.setdefault(why, []).append(cell.id)
    # Known failures last: everything else gets the machine first; dependencies before dependents.
    ordered = sorted(todo.values(), key=lambda c: (c.expected_fail is not None, _depth(c, todo)))
    return Selection(plan, ordered, skipped, unbuildable, runner, house)


def missing_cells(plan: Plan, cells, wheelhouse=None, runner: str | None = None) -> list:
    """The cells whose build key (as `farm build` on `runner` would key them; default: this host's
    runner) is not in the wheelhouse manifest: `farm plan --missing` and the CI plan jobs."""
    from farm.recipes.buildkey import KeyMaker
    from farm.wheelhouse import built_keys

    done = built_keys(wheelhouse)
    keys = KeyMaker(plan.defaults, plan.recipes, wheelhouse=wheelhouse)
    contexts = Contexts(resolve_runner(runner))
    return [c for c in cells if contexts.key_of(keys, c) not in done]


def _depth(cell: CellRun, todo: dict[str, CellRun]) -> int:
    """How many build_requires_farm levels a cell sits above (its dependencies sort first)."""
    return 1 + max((_depth(todo[d], todo) for d in cell.deps if d in todo), default=-1)


# ---------------------------------------------------------------- memory and processes

def mem_available_gb() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1024 * 1024)
    except OSError:
        pass
    return 8.0


def default_jobs() -> int:
    """One cell per CPU: memory admission bounds what runs at once, and cells that follow a sibling
    (another Python of the same build) mostly hit the compiler cache and compile one file at a time."""
    return max(1, os.cpu_count() or 2)


def admit_jobs(want: int, peak_gb: float, free_gb: float, anything_running: bool) -> tuple[int | None, str | None]:
    """(max_jobs to run with, the clamp's reason) for a cell, or (None, None) to wait (SPEC 8.4)."""
    fit = int(free_gb // peak_gb) if peak_gb > 0 else want
    if fit >= want:
        return want, None
    if fit >= 1:
        return fit, (f"memory admission: {want} jobs x {peak_gb:g} GB exceed the {free_gb:.1f} GB free "
                     f"of the budget; clamped to {fit}")
    if not anything_running:
        return 1, (f"memory admission: even one job ({peak_gb:g} GB) exceeds the {free_gb:.1f} GB budget; "
                   "building with 1")
    return None, None


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, rss pages, state) for every process we can read."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                data = fh.read().decode(errors="replace")
        except OSError:
            continue
        rest = data[data.rfind(")") + 2:].split()
        # fields after the name: state ppid ... (rss is field 24 overall, index 21 here)
        table[int(entry.name)] = (int(rest[1]), int(rest[21]), rest[0])
    return table


def descendants(roots: set[int], table: dict[int, tuple[int, int, str]] | None = None) -> set[int]:
    table = table if table is not None else _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        for kid in children.get(pid, ()):
            if kid not in found:
                found.add(kid)
                stack.append(kid)
    return found


def stop_tree(pids: set[int]) -> None:
    """SIGSTOP everything (so nothing spawns), widen to new descendants until stable, then SIGKILL."""
    frozen: set[int] = set()
    todo = set(pids)
    for _ in range(20):
        for pid in todo - frozen:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        frozen |= todo
        grown = descendants(frozen) - frozen
        if not grown:
            break
        todo = grown
    for pid in frozen:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------- the child: one cell

def child_main(argv: list[str]) -> int:
    """`python -m farm.run.scheduler --child <cell> ...`: build_cell in this process, result JSON to --result."""
    import argparse

    from farm.build.cell import build_cell

    parser = argparse.ArgumentParser(prog="python -m farm.run.scheduler --child")
    parser.add_argument("cell")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--wheelhouse", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--runner")
    parser.add_argument("--max-jobs", type=int)
    parser.add_argument("--max-jobs-reason")
    parser.add_argument("--no-compiler-cache", action="store_true")
    args = parser.parse_args(argv)
    try:
        res = build_cell(args.cell, runner_kind=args.runner, out=args.out, wheelhouse=args.wheelhouse,
                         max_jobs=args.max_jobs, max_jobs_reason=args.max_jobs_reason,
                         compiler_cache=not args.no_compiler_cache, log=lambda m: print(m, flush=True))
    except FarmError as exc:
        print(f"farm: {exc}", file=sys.stderr, flush=True)
        _write_json(args.result, {"status": "error", "message": str(exc), "exit_code": exc.exit_code})
        return exc.exit_code
    except KeyboardInterrupt:
        print("farm: interrupted", file=sys.stderr, flush=True)
        return 130
    _write_json(args.result, {"status": res.status, "wheel": str(res.wheel) if res.wheel else None,
                              "record_path": str(res.record_path) if res.record_path else None})
    return 0


def _write_json(path: Path, data) -> None:
    from farm.yamlio import write_atomic

    write_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")


# ---------------------------------------------------------------- the scheduler

@dataclass
class _Job:
    cell: CellRun
    proc: subprocess.Popen
    reserved_gb: float
    result_path: Path
    out_path: Path
    emulated: bool
    exit_fd: int | None = None   # a pidfd: readable once the child has exited (see Scheduler._pause)


class Scheduler:
    def __init__(self, sel: Selection, options: RunOptions, budget_gb: float, jobs: int, state_dir: Path,
                 build_dir: Path, events: Callable[[str, CellRun | None], None]):
        self.sel, self.options, self.budget_gb, self.jobs = sel, options, budget_gb, jobs
        self.state_dir, self.build_dir, self.events = state_dir, build_dir, events
        self.pending: list[CellRun] = list(sel.todo)
        self.cells = {c.id: c for c in sel.todo}
        self.running: dict[str, _Job] = {}
        # Sibling cells (the Pythons of one build) share every object that does not see Python.h: the
        # first of them runs alone and fills the compiler cache, the rest start when it has ended.
        self.leading: set[str] = set()    # sibling groups whose first cell is running
        self.led: set[str] = set()        # sibling groups whose first cell has ended
        self.interrupted = 0
        self._last_sample = 0.0
        from farm.runners.images import host_arch

        self.host_arch = host_arch()

    # -- signals
    def on_signal(self, signum, frame) -> None:
        self.interrupted += 1
        if self.interrupted == 1:
            self.events("interrupt", None)

    @property
    def reserved_gb(self) -> float:
        return sum(j.reserved_gb for j in self.running.values())

    def run(self) -> None:
        while self.pending or self.running:
            if self.interrupted:
                self._stop_all()
                break
            self._reap()
            self._admit()
            self._sample()
            self.events("tick", None)
            self._pause(0.2)
        for cell in self.pending:   # only an interrupt leaves cells pending
            cell.status = "not-started"

    def _pause(self, seconds: float) -> None:
        """Up to `seconds`, or until a child exits: its cell's time ends when it ends, and the next
        cell starts at once."""
        fds = [j.exit_fd for j in self.running.values() if j.exit_fd is not None]
        if fds:
            io_select.select(fds, [], [], seconds)
        else:
            time.sleep(seconds)

    # -- admission
    def _deps_state(self, cell: CellRun) -> str:
        states = [self.cells[d].status for d in cell.deps if d in self.cells]
        if any(s not in OK_STATUSES and s not in ("pending", "running") for s in states) or \
                any(s == "expected-fail" for s in states):
            return "failed"
        if all(s in ("built", "up-to-date", "skipped") for s in states):
            return "ready"
        return "wait"

    def _admit(self) -> None:
        for cell in list(self.pending):
            if len(self.running) >= self.jobs:
                return
            deps = self._deps_state(cell)
            if deps == "failed":
                self.pending.remove(cell)
                cell.status = "blocked"
                failed = [d for d in cell.deps if d in self.cells and self.cells[d].status not in
                          ("built", "up-to-date", "skipped", "pending", "running")]
                cell.message = f"not built: it needs {', '.join(failed)}, which did not build"
                self.events("finish", cell)
                continue
            if deps == "wait" or (cell.siblings in self.leading and self.options.compiler_cache):
                continue
            emulated = is_emulated(cell.platform, self.host_arch)
            if emulated and sum(1 for j in self.running.values() if j.emulated) >= self.options.arm_jobs:
                continue
            want = cell.max_jobs_recipe if not cell.oom_retry else max(1, (cell.max_jobs or 1) // 2)
            free = self.budget_gb - self.reserved_gb
            jobs, clamp = admit_jobs(want, cell.peak_gb, free, bool(self.running))
            if jobs is None:
                continue
            if cell.oom_retry:
                clamp = (f"out of memory with max_jobs {cell.max_jobs}: retried with {jobs}"
                         + (f"; {clamp}" if clamp else ""))
            self.pending.remove(cell)
            self._start(cell, jobs, clamp, emulated)

    def _start(self, cell: CellRun, jobs: int, clamp: str | None, emulated: bool) -> None:
        if cell.siblings not in self.led:
            self.leading.add(cell.siblings)
        cell.attempts += 1
        cell.status = "running"
        cell.started = time.time()
        cell.max_jobs, cell.max_jobs_clamp = jobs, clamp
        result = self.state_dir / f"{cell.id}.result.json"
        result.unlink(missing_ok=True)
        out = self.state_dir / f"{cell.id}.out"
        argv = [sys.executable, "-m", "farm.run.scheduler", "--child", cell.id, "--result", str(result),
                "--wheelhouse", str(self.sel.house), "--out", str(self.build_dir / cell.id),
                "--runner", self.sel.runner]
        if jobs != cell.max_jobs_recipe or clamp:
            argv += ["--max-jobs", str(jobs), "--max-jobs-reason", clamp or "farm run"]
        if not self.options.compiler_cache:
            argv.append("--no-compiler-cache")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            x for x in (str(paths.PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if x)}
        with open(out, "ab") as fh:
            fh.write(f"# attempt {cell.attempts}: {' '.join(argv)}\n".encode())
            fh.flush()
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)   # Ctrl-C reaches the run only
        try:
            exit_fd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):   # not Linux >= 5.3: the loop polls every 0.2 s
            exit_fd = None
        self.running[cell.id] = _Job(cell, proc, jobs * cell.peak_gb, result, out, emulated, exit_fd)
        self.events("start", cell)

    # -- completion
    def _reap(self) -> None:
        for cell_id, job in list(self.running.items()):
            code = job.proc.poll()
            if code is None:
                continue
            del self.running[cell_id]
            self._finish(job, code)

    def _finish(self, job: _Job, code: int) -> None:
        if job.exit_fd is not None:
            os.close(job.exit_fd)
        cell = job.cell
        if cell.siblings in self.leading:
            self.leading.discard(cell.siblings)
            self.led.add(cell.siblings)
        cell.finished = time.time()
        cell.duration = round(cell.finished - cell.started, 1)
        result = _read_json(job.result_path) or {}
        out_dir = self.build_dir / cell.id
        cell.log = str(out_dir / "build.log") if (out_dir / "build.log").exists() else str(job.out_path)
        if code == 0 and result.get("status") in ("built", "up-to-date"):
            cell.status = result["status"]
            cell.wheel = result.get("wheel")
            record = _read_json(Path(result["record_path"])) if result.get("record_path") else None
            if record:
                # a build_requires_farm dependent is keyed by the build, after its dependencies published
                cell.build_key = record.get("build_key") or cell.build_key
                cell.peak_process_mb = record.get("peak_process_mb")
                cell.compiler_cache = _cache_summary(record.get("compiler_cache"))
            if cell.expected_fail:
                cell.message = f"built although expected to fail ({cell.expected_fail}): drop its expected_fail?"
            self.events("finish", cell)
            return
        cell.excerpt = failure_excerpt(out_dir, job.out_path)
        if self.interrupted or code in (130, -signal.SIGINT):
            cell.status = "interrupted"
            cell.message = "stopped by an interrupt of the run; the next run builds it again"
            self.events("finish", cell)
            return
        message = result.get("message") or _last_farm_line(job.out_path) or f"exit {code}"
        first = next((ln.strip() for ln in (cell.excerpt or "").splitlines() if "error:" in ln), None)
        cell.message = f"{first} ({message})" if first and first not in message else message
        oom = code in (137, -signal.SIGKILL) or any(p in (cell.excerpt or "") for p in OOM_PATTERNS)
        if oom and not cell.oom_retry:
            cell.oom_retry = True
            cell.status = "pending"
            self.pending.insert(0, cell)
            self.events("oom-retry", cell)
            return
        elif cell.expected_fail:
            cell.status = "expected-fail"
        else:
            cell.status = "oom" if oom else "failed"
        self.events("finish", cell)

    # -- memory sampling (host runner: the child's whole process tree)
    def _sample(self) -> None:
        now = time.monotonic()
        # A container's processes are not the child's descendants (the engine starts them): no tree to sum.
        if now - self._last_sample < 2.0 or not self.running or self.sel.runner != "host":
            return
        self._last_sample = now
        table = _proc_table()
        page_mb = os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)
        for job in self.running.values():
            tree = descendants({job.proc.pid}, table) | {job.proc.pid}
            mb = int(sum(table[p][1] for p in tree if p in table) * page_mb)
            job.cell.peak_tree_mb = max(job.cell.peak_tree_mb or 0, mb)

    # -- interrupt
    def _stop_all(self) -> None:
        if not self.running:
            return
        trees = {cid: descendants({j.proc.pid}) for cid, j in self.running.items()}
        for job in self.running.values():
            try:
                os.kill(job.proc.pid, signal.SIGINT)   # a container step removes its container on this
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (0 if self.interrupted > 1 else CHILD_GRACE_S)
        while time.monotonic() < deadline and any(j.proc.poll() is None for j in self.running.values()):
            time.sleep(0.2)
            if self.interrupted > 1:
                break
        for cid, job in list(self.running.items()):
            alive = {p for p in trees[cid] if Path(f"/proc/{p}").exists()}
            if job.proc.poll() is None:
                alive |= {job.proc.pid} | descendants({job.proc.pid})
            stop_tree(alive)
            job.proc.wait()
            del self.running[cid]
            self._finish(job, 130)


def _read_json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _last_farm_line(out: Path) -> str | None:
    try:
        lines = out.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("farm: "):
            return line[6:]
    return None


def failure_excerpt(out_dir: Path, child_out: Path, limit: int = 25) -> str:
    """The lines a reader needs first: compiler errors from compile.log, else the tail of build.log / output."""
    compile_log = out_dir / "compile.log"
    if compile_log.exists():
        lines = compile_log.read_text(errors="replace").splitlines()
        hits = [i for i, ln in enumerate(lines)
                if ("error" in ln.lower() or "fatal" in ln.lower() or "Killed" in ln) and not ln.startswith("#   ")]
        if hits:
            picked: list[str] = []
            for i in hits[:8]:
                for ln in lines[max(0, i - 1):i + 2]:
                    if ln not in picked[-3:]:
                        picked.append(ln)
            return "\n".join(ln[:300] for ln in picked[:limit])
    for path in (out_dir / "build.log", child_out):
        if path.exists():
            tail = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()][-limit:]
            if tail:
                return "\n".join(ln[:300] for ln in tail)
    return ""


def _cache_summary(cache: dict | None) -> dict | None:
    if not cache:
        return None
    stats = cache.get("stats") or {}
    return {"enabled": cache.get("enabled"), "active": cache.get("active"), "hits": stats.get("hits"),
            "misses": stats.get("misses"), "hit_rate": stats.get("hit_rate")}


# ---------------------------------------------------------------- the run

def run_farm(options: RunOptions, *, out=None) -> RunResult:
    """Plan, skip, build, report. Returns the result; the exit code follows SPEC 11."""
    from farm.run.report import Display

    t0 = time.time()
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}"
    display = Display(plain=options.plain, stream=out)
    sel = select(options)
    build_dir = Path(options.build_dir or paths.PROJECT_ROOT / "build")
    unbuildable_total = sum(len(v) for v in sel.unbuildable.values())
    display.line(f"farm run {run_id}: {len(sel.todo) + len(sel.skipped) + unbuildable_total} cells planned: "
                 f"{len(sel.skipped)} already built (skipped), {len(sel.todo)} to build, "
                 f"{unbuildable_total} unbuildable here; runner {sel.runner}; wheelhouse {sel.house}")
    if options.dry_run:
        for cell in sel.todo:
            display.line(f"would build {cell.id}" + (" (needed by another cell)" if cell.pulled_in else ""))
        result = RunResult(run_id, 0, sel.skipped + sel.todo, sel.unbuildable, seconds=time.time() - t0)
        display.summary(result)
        return result
    if not sel.todo:
        result = RunResult(run_id, 0, sel.skipped, sel.unbuildable, seconds=time.time() - t0)
        result.report_json, result.report_html = _Reporter(run_id, sel, options, sel.skipped, t0).write(final=result)
        display.summary(result)
        return result

    budget = options.mem_budget_gb if options.mem_budget_gb is not None else mem_available_gb()
    jobs = options.jobs or default_jobs()
    state_dir = build_dir / ".farm-run" / run_id
    state_dir.mkdir(parents=True, exist_ok=True)
    display.line(f"building {len(sel.todo)} cells, {jobs} at a time, memory budget {budget:.1f} GB")
    cells_all = sel.skipped + sel.todo
    reporter = _Reporter(run_id, sel, options, cells_all, t0)
    display.start(len(sel.todo), len(sel.skipped))

    def events(kind: str, cell: CellRun | None) -> None:
        display.event(kind, cell, sched)
        if kind in ("finish", "oom-retry"):
            reporter.write(throttle=True)

    sched = Scheduler(sel, options, budget, jobs, state_dir, build_dir, events=events)
    previous = {s: signal.signal(s, sched.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        sched.run()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        display.stop()
    if sched.interrupted:
        reconcile_with_wheelhouse(cells_all, sel.house)
    statuses = [c.status for c in cells_all]
    code = 130 if sched.interrupted else (0 if all(s in OK_STATUSES for s in statuses) else 1)
    result = RunResult(run_id, code, cells_all, sel.unbuildable, seconds=time.time() - t0)
    result.report_json, result.report_html = reporter.write(final=result)
    display.summary(result)
    return result


def reconcile_with_wheelhouse(cells: list[CellRun], house: Path) -> list[CellRun]:
    """After an interrupt the report must say what the manifest says: a child can publish its wheel and
    take the signal before it reports, so a cell whose build key is now served is `built` (the next run
    skips it), whatever its exit said. Returns the cells it corrected."""
    from farm.wheelhouse import built_keys, read_journal

    unsettled = [c for c in cells if c.build_key and c.status not in OK_STATUSES]
    if not unsettled:
        return []
    served = built_keys(house)
    files = {e.build_key: house / "files" / e.project / e.file for e in read_journal(house).entries if e.build_key}
    fixed = []
    for cell in unsettled:
        if cell.build_key in served:
            cell.status, cell.wheel = "built", str(files[cell.build_key])
            cell.message = "published before the interrupt reached it"
            cell.excerpt = None
            fixed.append(cell)
    return fixed


class _Reporter:
    """Writes the JSON (and at the end the HTML) run report into <wheelhouse>/runs/."""

    def __init__(self, run_id: str, sel: Selection, options: RunOptions, cells: list[CellRun], t0: float):
        self.run_id, self.sel, self.options, self.cells, self.t0 = run_id, sel, options, cells, t0
        self._last = 0.0

    def write(self, throttle: bool = False, final: RunResult | None = None):
        from farm.run.report import write_reports

        if throttle and time.monotonic() - self._last < 5.0:
            return None, None
        self._last = time.monotonic()
        return write_reports(self.sel.house, self.run_id, self.cells, self.sel.unbuildable, options=self.options,
                             runner=self.sel.runner, started=self.t0, result=final)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(child_main(sys.argv[2:]))
    print("python -m farm.run.scheduler --child <cell> ...: the per-cell child of `farm run`", file=sys.stderr)
    sys.exit(2)
