"""`farm run` (design.md §11.1, §11.2): plan, skip what is built, build the rest in parallel, resumably.

    result = run_farm(RunOptions(filters=Filters(package=("farm_demo",)), jobs=2))
    result.exit_code   # 0 only when every selected cell is built, skipped or an expected failure

The pipeline, one module each:
- farm.run.selection: what to build (finished = build key in the manifest; unbuildable here; cells
  pulled in through `build_requires_farm`, built first);
- farm.run.scheduling: the parallel loop with memory admission and the out-of-memory retry;
- farm.run.processes: the child process per cell (`farm build`'s build_cell) and stopping its tree;
- farm.run.report: progress lines and the JSON/HTML run report.
Interrupts (SIGINT/SIGTERM) end the run with exit code 130 after the report is written.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from farm import settings
from farm.recipes.plan import Filters
from farm.run.scheduling import Scheduler, default_jobs
from farm.run.selection import OK_STATUSES, CellRun, Selection, select
from farm.runners.admission import mem_available_gb


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


def run_farm(options: RunOptions, *, out=None) -> RunResult:
    """Plan, skip, build, report. Returns the result; the exit code follows design.md §11.1."""
    from farm.run.report import Display

    t0 = time.time()
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{os.getpid()}"
    display = Display(plain=options.plain, stream=out)
    sel = select(options.filters, shard=options.shard, runner=options.runner, wheelhouse=options.wheelhouse)
    build_dir = Path(options.build_dir or settings.PROJECT_ROOT / "build")
    unbuildable_total = sum(len(v) for v in sel.unbuildable.values())
    display.line(f"farm run {run_id}: {len(sel.todo) + len(sel.skipped) + unbuildable_total} cells planned: "
                 f"{len(sel.skipped)} already in the wheelhouse (not rebuilt), {len(sel.todo)} to build, "
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
    cap_gb = _build_memory_cap_gb(sel)
    display.line(f"building {len(sel.todo)} cells, {jobs} at a time, memory budget {budget:.1f} GB"
                 + (f", at most {cap_gb:g} GB per build container" if cap_gb else ""))
    cells_all = sel.skipped + sel.todo
    reporter = _Reporter(run_id, sel, options, cells_all, t0)
    display.start(len(sel.todo), len(sel.skipped))

    def events(kind: str, cell: CellRun | None, sched: Scheduler) -> None:
        display.event(kind, cell, sched)
        if kind in ("finish", "oom-retry"):
            reporter.write(throttle=True)

    sched = Scheduler(sel, budget, jobs, state_dir, build_dir, events,
                      compiler_cache=options.compiler_cache, arm_jobs=options.arm_jobs,
                      cap_gb=cap_gb)
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


def _build_memory_cap_gb(sel: Selection) -> float | None:
    """What one child build may hold: asked of the runner its `farm build` makes (a container's memory
    limit; the host runner sets none), so the scheduler admits against the cap the child will have."""
    from farm.platforms import cell_arch
    from farm.runners.choose import get_runner

    return get_runner(sel.runner, arch=cell_arch(sel.todo[0].platform)).memory_cap_gb()


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
