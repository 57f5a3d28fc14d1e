"""The parallel loop of `farm run` (design.md §11.2 and 11): admit cells as memory and their
dependencies allow, start each in its child process, reap, retry an out-of-memory kill once, stop on an
interrupt.

- **Memory admission** (design.md §11.2): a cell reserves `max_jobs x peak_gb_per_job` of the budget
  (`--mem-budget`, default: MemAvailable at start), and never more than a build container may hold.
  When its recipe's max_jobs does not fit, max_jobs is clamped for that build and the clamp recorded
  in its build record; an out of memory kill (exit 137, SIGKILL, a compiler "Killed") is `oom` and
  retried once with max_jobs halved. Arch lists are never trimmed. Emulated aarch64 cells have their own cap (`--arm-jobs`).
- **Interrupts**: SIGINT/SIGTERM stop admitting, let each child remove its container, then stop
  whatever is left of its process tree (farm.run.processes).
"""

from __future__ import annotations

import json
import os
import select as io_select
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm import settings
from farm.errors import BadInput
from farm.process import Popen, spawn, useful_lines
from farm.recipes.buildrecord import BuildRecord
from farm.run.processes import descendants, proc_table, stop_tree
from farm.run.selection import OK_STATUSES, CellRun, Selection
from farm.runners.admission import admit_jobs
from farm.runners.emulation import is_emulated

OOM_PATTERNS = ("Killed signal terminated program", "died due to signal 9", "out of memory", "Out of memory",
                "std::bad_alloc", "exit 137")
CHILD_GRACE_S = 20.0


def default_jobs() -> int:
    """One cell per CPU: memory admission bounds what runs at once, and cells that follow a sibling
    (another Python of the same build) mostly hit the compiler cache and compile one file at a time."""
    return max(1, os.cpu_count() or 2)


@dataclass
class _Job:
    cell: CellRun
    proc: Popen
    reserved_gb: float
    result_path: Path
    out_path: Path
    emulated: bool
    exit_fd: int | None = None   # a pidfd: readable once the child has exited (see Scheduler._pause)


class Scheduler:
    def __init__(self, sel: Selection, budget_gb: float, jobs: int, state_dir: Path, build_dir: Path,
                 events: Callable[[str, CellRun | None, Scheduler], None], *, compiler_cache: bool = True, arm_jobs: int = 1,
                 cap_gb: float | None = None):
        self.sel, self.budget_gb, self.jobs, self.cap_gb = sel, budget_gb, jobs, cap_gb
        self.state_dir, self.build_dir, self.events = state_dir, build_dir, events
        self.compiler_cache, self.arm_jobs = compiler_cache, arm_jobs
        self.pending: list[CellRun] = list(sel.todo)
        self.cells = {c.id: c for c in sel.todo}
        self.running: dict[str, _Job] = {}
        # Sibling cells (the Pythons of one build) share every object that does not see Python.h: the
        # first of them runs alone and fills the compiler cache, the rest start when it has ended.
        self.leading: set[str] = set()    # sibling groups whose first cell is running
        self.led: set[str] = set()        # sibling groups whose first cell has ended
        self.interrupted = 0
        self._last_sample = 0.0
        from farm.platforms import host_arch

        self.host_arch = host_arch()

    # -- signals
    def on_signal(self, signum, frame) -> None:
        self.interrupted += 1
        if self.interrupted == 1:
            self.events("interrupt", None, self)

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
            self.events("tick", None, self)
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
                self.events("finish", cell, self)
                continue
            if deps == "wait" or (cell.siblings in self.leading and self.compiler_cache):
                continue
            emulated = is_emulated(cell.platform, self.host_arch)
            if emulated and sum(1 for j in self.running.values() if j.emulated) >= self.arm_jobs:
                continue
            want = cell.max_jobs_recipe if not cell.oom_retry else max(1, (cell.max_jobs or 1) // 2)
            free = self.budget_gb - self.reserved_gb
            jobs, clamp = admit_jobs(want, cell.peak_gb, free, bool(self.running), self.cap_gb)
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
        argv = [sys.executable, "-m", "farm.run.processes", "--child", cell.id, "--result", str(result),
                "--wheelhouse", str(self.sel.house), "--out", str(self.build_dir / cell.id),
                "--runner", self.sel.runner]
        argv += ["--max-jobs", str(jobs)]   # admitted here: the child does not admit again
        if clamp:
            argv += ["--max-jobs-reason", clamp]
        if not self.compiler_cache:
            argv.append("--no-compiler-cache")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            x for x in (str(settings.PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if x)}
        with open(out, "ab") as fh:
            fh.write(f"# attempt {cell.attempts}: {' '.join(argv)}\n".encode())
            fh.flush()
            proc = spawn(argv, fh, env=env)   # a group of its own: Ctrl-C reaches the run only
        try:
            exit_fd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):   # not Linux >= 5.3: the loop polls every 0.2 s
            exit_fd = None
        self.running[cell.id] = _Job(cell, proc, jobs * cell.peak_gb, result, out, emulated, exit_fd)
        self.events("start", cell, self)

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
        assert cell.started is not None, "a job in running has started"
        cell.duration = round(cell.finished - cell.started, 1)
        result = _read_json(job.result_path) or {}
        out_dir = self.build_dir / cell.id
        cell.log = str(out_dir / "build.log") if (out_dir / "build.log").exists() else str(job.out_path)
        if code == 0 and result.get("status") in ("built", "up-to-date"):
            cell.status = result["status"]
            cell.wheel = result.get("wheel")
            record = _build_record(result.get("record_path"))
            if record:
                # a build_requires_farm dependent is keyed by the build, after its dependencies published
                cell.build_key = record.build_key or cell.build_key
                cell.peak_process_mb = record.peak_process_mb
                cell.compiler_cache = _cache_summary(record.compiler_cache)
                cell.compile_cpu_s = record.compile_cpu_s
            if cell.expected_fail:
                cell.message = f"built although expected to fail ({cell.expected_fail}): drop its expected_fail?"
            self.events("finish", cell, self)
            return
        cell.excerpt = failure_excerpt(out_dir, job.out_path)
        if self.interrupted or code in (130, -signal.SIGINT):
            cell.status = "interrupted"
            cell.message = "stopped by an interrupt of the run; the next run builds it again"
            self.events("finish", cell, self)
            return
        message = result.get("message") or _last_farm_line(job.out_path) or f"exit {code}"
        first = next((ln.strip() for ln in (cell.excerpt or "").splitlines() if "error:" in ln), None)
        cell.message = f"{first} ({message})" if first and first not in message else message
        oom = code in (137, -signal.SIGKILL) or any(p in (cell.excerpt or "") for p in OOM_PATTERNS)
        if oom and not cell.oom_retry:
            cell.oom_retry = True
            cell.status = "pending"
            self.pending.insert(0, cell)
            self.events("oom-retry", cell, self)
            return
        elif cell.expected_fail:
            cell.status = "expected-fail"
        else:
            cell.status = "oom" if oom else "failed"
        self.events("finish", cell, self)

    # -- memory sampling (host runner: the child's whole process tree)
    def _sample(self) -> None:
        now = time.monotonic()
        # A container's processes are not the child's descendants (the engine starts them): no tree to sum.
        if now - self._last_sample < 2.0 or not self.running or self.sel.runner != "host":
            return
        self._last_sample = now
        table = proc_table()
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
    """The last one-line error the child's CLI printed ('farm: ...'), without its prefix."""
    try:
        said = useful_lines(out, skip=lambda ln: not ln.startswith("farm: "))
    except OSError:
        return None
    return said[-1][6:] if said else None


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


def _build_record(path: object) -> BuildRecord | None:
    """The child's build.json, when it wrote one this farm reads (the summary does without it)."""
    if not isinstance(path, str) or not path:
        return None
    try:
        return BuildRecord.read(Path(path))
    except BadInput:
        return None


def _cache_summary(cache: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not cache:
        return None
    stats = cache.get("stats") or {}
    return {"enabled": cache.get("enabled"), "active": cache.get("active"), "hits": stats.get("hits"),
            "misses": stats.get("misses"), "hit_rate": stats.get("hit_rate")}
