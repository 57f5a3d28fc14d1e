"""What `farm run` shows and leaves behind: live progress, the summary table, JSON and HTML reports.

Progress: rich on a terminal (done / failed / skipped / running, the current cells, elapsed, ETA),
plain lines otherwise (CI logs), with a heartbeat line every minute.

Reports: `<wheelhouse>/runs/<run id>.json` and `.html` (and `latest.json` / `latest.html`), per
cell: status, duration, wheel, log link, failure excerpt, peak memory, max_jobs and its clamp.
The logs of failed cells are copied to `runs/<run id>/logs/` so the links work wherever the
wheelhouse is served; built cells link to their build log on the build host.
"""

from __future__ import annotations

import html
import json
import shutil
import socket
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from farm.build.display import Terminal, fmt_s
from farm.yamlio import write_atomic

if TYPE_CHECKING:
    from rich.live import Live
    from rich.progress import Progress, TaskID


def iso_utc(ts: float) -> str:
    """A timestamp as the reports write it: 2026-12-02T16:12:57Z."""
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

RUNS = "runs"
DONE = ("built", "up-to-date")
FAILED = ("failed", "oom", "blocked")
STOPPED = ("interrupted", "not-started")   # a Ctrl-C's doing, not the cell's: counted apart
SUMMARY_ROWS = 200


def _fmt_s(seconds: float | None) -> str:
    return fmt_s(seconds, tenths=False)


class Display(Terminal):
    def __init__(self, plain: bool | None = None, stream=None):
        super().__init__(plain, stream, prefix="[farm run]")
        self.t0 = time.time()
        self.total = 0
        self.skipped = 0
        self.counts: Counter = Counter()
        self.durations: list[float] = []
        self._live: Live | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._last_beat = time.monotonic()
        self._sched = None

    # ----- live progress
    def start(self, total: int, skipped: int) -> None:
        self.total, self.skipped = total, skipped
        self.t0 = time.time()
        if not self.rich:
            return
        from rich.live import Live
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(SpinnerColumn(), TextColumn("[bold]farm run"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
                                  TextColumn("ETA {task.fields[eta]}"), console=self.console)
        self._task = self._progress.add_task("cells", total=total, stats=self._stats(0), eta="?")
        self._live = Live(self._renderable(), console=self.console, refresh_per_second=4, transient=False)
        self._live.start()

    def _stats(self, running: int) -> str:
        c = self.counts
        stopped = sum(c[s] for s in STOPPED)
        return (f"done {c['built'] + c['up-to-date']}  failed {sum(c[s] for s in FAILED)}  "
                f"expected-fail {c['expected-fail']}  skipped {self.skipped}  running {running}"
                + (f"  interrupted {stopped}" if stopped else ""))

    def eta(self, sched) -> str:
        if not self.durations or sched is None:
            return "?"
        remaining = len(sched.pending) + len(sched.running)
        if remaining == 0:
            return "0s"
        mean = sum(self.durations) / len(self.durations)
        lanes = max(1, min(sched.jobs, remaining))
        return _fmt_s(mean * remaining / lanes)

    def _renderable(self):
        from rich.console import Group
        from rich.table import Table

        table = Table(box=None, show_header=True, header_style="dim", pad_edge=False)
        table.add_column("running")
        table.add_column("for", justify="right")
        table.add_column("max_jobs", justify="right")
        table.add_column("try", justify="right")
        sched = self._sched
        for job in (sched.running.values() if sched else ()):
            c = job.cell
            table.add_row(c.id, _fmt_s(time.time() - c.started), str(c.max_jobs) + (" (clamped)" if c.max_jobs_clamp else ""),
                          str(c.attempts))
        return Group(self._progress, table) if sched and sched.running else Group(self._progress)

    def event(self, kind: str, cell, sched) -> None:
        self._sched = sched
        if kind == "finish":
            self.counts[cell.status] += 1
            if cell.duration is not None and cell.status in DONE:
                self.durations.append(cell.duration)
        if self.rich:
            self._rich_event(kind, cell, sched)
        else:
            self._plain_event(kind, cell, sched)

    def _rich_event(self, kind, cell, sched) -> None:
        if kind == "finish":
            style = {"built": "green", "up-to-date": "green", "expected-fail": "yellow"}.get(cell.status, "red")
            extra = f" ({cell.message})" if cell.message and cell.status not in DONE else ""
            from rich.markup import escape

            self.console.print(f"[{style}]{cell.status:<13}[/] {escape(cell.id)} in {_fmt_s(cell.duration)}"
                               f"{escape(extra)}", highlight=False)
        elif kind == "oom-retry":
            self.console.print(f"[yellow]oom[/] {cell.id}: retrying once with max_jobs halved", highlight=False)
        elif kind == "interrupt":
            self.console.print("[yellow]interrupted: stopping the running cells (Ctrl-C again to kill at once)",
                               highlight=False)
        if self._progress is not None and self._task is not None and self._live is not None:   # started
            finished = sum(self.counts.values())
            self._progress.update(self._task, completed=finished, stats=self._stats(len(sched.running)),
                                  eta=self.eta(sched))
            self._live.update(self._renderable())

    def _plain_event(self, kind, cell, sched) -> None:
        if kind == "start":
            clamp = f", clamped: {cell.max_jobs_clamp}" if cell.max_jobs_clamp else ""
            self.line(f"start {cell.id} (max_jobs {cell.max_jobs}{clamp}; attempt {cell.attempts})")
        elif kind == "finish":
            done = sum(self.counts.values())
            extra = f": {cell.message}" if cell.message and cell.status not in DONE else ""
            self.line(f"{cell.status} {cell.id} in {_fmt_s(cell.duration)}{extra} "
                      f"[{done}/{self.total}; {self._stats(len(sched.running))}; ETA {self.eta(sched)}]")
        elif kind == "oom-retry":
            self.line(f"oom {cell.id}: retrying once with max_jobs halved")
        elif kind == "interrupt":
            self.line("interrupted: stopping the running cells")
        elif kind == "tick" and time.monotonic() - self._last_beat >= 60:
            self._last_beat = time.monotonic()
            running = ", ".join(f"{j.cell.id} ({_fmt_s(time.time() - j.cell.started)})" for j in sched.running.values())
            self.line(f"{_fmt_s(time.time() - self.t0)} elapsed; {self._stats(len(sched.running))}; "
                      f"ETA {self.eta(sched)}; running: {running or '-'}")

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    # ----- the end
    def summary(self, result) -> None:
        counts = result.counts()
        rows = [c for c in result.cells if c.status not in ("skipped", "pending")]
        if rows:
            if self.rich:
                from rich.table import Table

                table = Table(title="farm run", show_lines=False)
                table.add_column("cell", no_wrap=True)
                for col in ("status", "time", "max_jobs", "peak MB"):
                    table.add_column(col, no_wrap=True)
                table.add_column("wheel / why", overflow="ellipsis", no_wrap=True, max_width=70)
                for c in rows[:SUMMARY_ROWS]:
                    style = "green" if c.status in DONE else "yellow" if c.status == "expected-fail" else "red"
                    table.add_row(c.id, f"[{style}]{c.status}[/]", _fmt_s(c.duration), _jobs_text(c),
                                  str(c.peak_process_mb or "-"), _why(c))
                self.console.print(table)
            else:
                width = max(len(c.id) for c in rows[:SUMMARY_ROWS])
                self.line(f"{'cell':<{width}}  {'status':<13} {'time':>7} {'max_jobs':>9} {'peak MB':>8}  wheel / why")
                for c in rows[:SUMMARY_ROWS]:
                    self.line(f"{c.id:<{width}}  {c.status:<13} {_fmt_s(c.duration):>7} {_jobs_text(c):>9} "
                              f"{str(c.peak_process_mb or '-'):>8}  {_why(c)}")
            if len(rows) > SUMMARY_ROWS:
                self.line(f"... and {len(rows) - SUMMARY_ROWS} more (see the report)")
        self.line(tally_line(counts, len(result.cells), result.seconds))
        total = sum(len(v) for v in result.unbuildable.values())
        if total:
            parts = "; ".join(f"{len(ids)}: {why}" for why, ids in sorted(result.unbuildable.items(),
                                                                            key=lambda kv: -len(kv[1])))
            self.line(f"unbuildable here (not selected, exit code unaffected): {total} cells ({parts})")
        if result.report_json:
            self.line(f"report: {result.report_json} and {result.report_html}")
        self.line(f"exit {result.exit_code}")


# The order the final line counts statuses in; a skipped cell is one a run before this one finished.
_TALLY_ORDER = ("skipped", "built", "up-to-date", "pending", "expected-fail", "failed", "oom", "blocked",
                "interrupted", "not-started")
_TALLY_WORDS = {"skipped": "already in the wheelhouse (not rebuilt)"}


def tally_line(counts: Counter, selected: int, seconds: float) -> str:
    """The run's last count: a resumed run says outright how many cells it found finished and left alone
    (design.md §11.1), e.g. `12 cells: 9 already in the wheelhouse (not rebuilt), 3 built in 41 min`."""
    tally = ", ".join(f"{counts[s]} {_TALLY_WORDS.get(s, s)}" for s in _TALLY_ORDER if counts[s])
    if not tally:
        return "cells: none selected"
    return f"{selected} cell{'s' if selected != 1 else ''}: {tally} in {_fmt_s(seconds)}"


def _jobs_text(c) -> str:
    if c.max_jobs is None:
        return "-"
    return f"{c.max_jobs}*" if c.max_jobs_clamp else str(c.max_jobs)


def _why(c) -> str:
    if c.status in DONE:
        return Path(c.wheel).name if c.wheel else ""
    return (c.message or "")[:160]


# ---------------------------------------------------------------- reports

def write_reports(house: Path, run_id: str, cells, unbuildable: dict, *, options, runner: str, started: float,
                  result=None) -> tuple[Path, Path]:
    runs = Path(house) / RUNS
    runs.mkdir(parents=True, exist_ok=True)
    logs = runs / run_id / "logs"
    data_cells = []
    skipped = []
    for c in cells:
        if c.status == "skipped":   # a full-grid no-op run lists 14k of these: ids only
            skipped.append(c.id)
            continue
        d = c.public()
        if c.status not in DONE and c.log:
            d["log_link"] = _copy_log(c, logs, runs)
        elif c.log:
            d["log_link"] = Path(c.log).resolve().as_uri()
        data_cells.append(d)
    counts = Counter(c.status for c in cells)
    report = {
        "run": run_id, "host": socket.gethostname(), "runner": runner,
        "started": iso_utc(started),
        "finished": iso_utc(time.time()) if result else None,
        "seconds": round(result.seconds, 1) if result else round(time.time() - started, 1),
        "exit_code": result.exit_code if result else None,
        "options": _options(options), "counts": dict(counts),
        "unbuildable": {why: {"count": len(ids), "cells": ids} for why, ids in unbuildable.items()},
        "cells": data_cells, "skipped": skipped,
    }
    json_path, html_path = runs / f"{run_id}.json", runs / f"{run_id}.html"
    text = json.dumps(report, indent=None if len(cells) > 1000 else 1, sort_keys=True, default=str) + "\n"
    write_atomic(json_path, text)
    page = render_html(report)
    write_atomic(html_path, page)
    write_atomic(runs / "latest.json", text)
    write_atomic(runs / "latest.html", page)   # log links are relative to runs/: valid from both names
    return json_path, html_path


def _copy_log(c, logs: Path, runs: Path) -> str:
    """build.log, then compile.log, into one file under runs/<id>/logs/ (the report is rewritten as
    cells finish: a log already copied since the cell's last attempt is not copied again)."""
    logs.mkdir(parents=True, exist_ok=True)
    target = logs / f"{c.id}.log"
    log = Path(c.log)
    parts = [p for p in (log, log.with_name("compile.log")) if p.exists()]
    newest = max((p.stat().st_mtime for p in parts), default=0.0)
    if not target.exists() or target.stat().st_mtime < newest:
        with open(target.with_suffix(".tmp"), "wb") as out:
            for part in parts:
                out.write(f"===== {part}\n".encode())
                with open(part, "rb") as fh:
                    shutil.copyfileobj(fh, out)
        target.with_suffix(".tmp").replace(target)
    return target.relative_to(runs).as_posix()


def _options(options) -> dict:
    f = options.filters
    return {"package": list(f.package), "cuda": list(f.cuda), "torch": list(f.torch), "python": list(f.python),
            "platform": list(f.platform), "shard": "/".join(map(str, options.shard)) if options.shard else None,
            "jobs": options.jobs, "mem_budget_gb": options.mem_budget_gb, "runner": options.runner,
            "compiler_cache": options.compiler_cache}


_STYLE = """body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
.built,.up-to-date{color:#17702f}.failed,.oom,.blocked,.interrupted,.not-started{color:#b00020}
.expected-fail{color:#a06000}pre{white-space:pre-wrap;margin:0;font-size:12px;max-height:18em;overflow:auto}"""


def render_html(report: dict) -> str:
    e = html.escape
    counts = ", ".join(f"{n} {s}" for s, n in sorted(report["counts"].items()))
    rows = []
    for c in report["cells"]:
        if c["status"] == "skipped":
            continue
        link = f'<a href="{e(c["log_link"])}">log</a>' if c.get("log_link") else ""
        wheel = e(Path(c["wheel"]).name) if c.get("wheel") else ""
        jobs = "" if c.get("max_jobs") is None else str(c["max_jobs"])
        if c.get("max_jobs_clamp"):
            jobs += f' <span title="{e(c["max_jobs_clamp"])}">(clamped)</span>'
        why = e(c.get("message") or "")
        excerpt = f"<pre>{e(c['excerpt'])}</pre>" if c.get("excerpt") else ""
        peak = c.get("peak_process_mb") or c.get("peak_tree_mb") or ""
        rows.append(f'<tr><td>{e(c["id"])}</td><td class="{e(c["status"])}">{e(c["status"])}</td>'
                    f'<td>{_fmt_s(c.get("duration"))}</td><td>{wheel}</td><td>{link}</td><td>{jobs}</td>'
                    f'<td>{peak}</td><td>{why}{excerpt}</td></tr>')
    skipped = report["counts"].get("skipped", 0)
    unb = "".join(f"<li>{v['count']}: {e(why)}</li>" for why, v in report["unbuildable"].items())
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>farm run {e(report['run'])}</title>"
            f"<style>{_STYLE}</style></head><body><h1>farm run {e(report['run'])}</h1>"
            f"<p>host {e(report['host'])}, runner {e(report['runner'])}, started {e(report['started'])}, "
            f"{_fmt_s(report['seconds'])}, exit code {e(str(report['exit_code']))}</p>"
            f"<p>{e(counts)}; {skipped} already in the wheelhouse (not rebuilt, not listed)</p>"
            + (f"<p>Unbuildable here (not selected):</p><ul>{unb}</ul>" if unb else "")
            + "<table><tr><th>cell</th><th>status</th><th>time</th><th>wheel</th><th>log</th><th>max_jobs</th>"
              "<th>peak MB</th><th>why / excerpt</th></tr>" + "".join(rows) + "</table></body></html>\n")
