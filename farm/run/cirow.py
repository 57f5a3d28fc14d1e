"""`farm ci row ROW_ID`: what one CI row job builds (design.md §11.5).

The row's Python siblings are built one after the other, lowest Python first, on this host's runner,
sharing the row's compiler cache group, so every sibling after the first compiles warm. Each sibling
is keyed against the fetched wheelhouse (a sibling already there is skipped), built without publishing,
then published on its own into the row's staging folder: a sibling that fails leaves the others'
wheels in staging, and the row goes on with the next one.

Within `budget_minutes` (the job's time after its set-up and before its upload) a sibling starts only
while the time left holds the longest sibling seen so far; the rest are `deferred`, left for the next
run, whose plan job lists the row again. The job exits 1 when a sibling failed, 0 otherwise (deferred
siblings are not failures), and the report says which sibling ended how.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from farm.errors import BadInput, FarmError
from farm.run.ci import Row, ci_cells, rows_of
from farm.yamlio import write_atomic

REPORT = "row-report.json"
STATUSES = ("built", "up-to-date", "failed", "deferred")


@dataclass
class Sibling:
    cell: str
    status: str                 # one of STATUSES
    seconds: float = 0.0
    wheel: str = ""
    why: str = ""               # failed: the build's one line; deferred: what did not fit


@dataclass
class RowReport:
    row: str
    cache_group: str
    budget_minutes: float | None
    siblings: list[Sibling] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(1 for s in self.siblings if s.status == status)

    @property
    def failed(self) -> bool:
        return self.count("failed") > 0

    def summary(self) -> str:
        parts = [f"{self.count(s)} {s}" for s in STATUSES if self.count(s)]
        return f"row {self.row}: {', '.join(parts) or 'nothing to build'}"

    def markdown(self) -> str:
        """The job's step summary: one line per sibling."""
        lines = [f"### {self.summary()}", "", "| cell | status | seconds | wheel or why |", "| --- | --- | --- | --- |"]
        lines += [f"| {s.cell} | {s.status} | {s.seconds:.0f} | {s.wheel or s.why} |" for s in self.siblings]
        return "\n".join(lines) + "\n"


def find_row(row_id: str, plan, cells) -> Row:
    """The row `row_id` of the selected `cells` (a row job builds the siblings its workflow selected: the
    same filters); one line with a did-you-mean when the selection has no such row."""
    keep, left = ci_cells(plan, list(cells))
    rows = {r.id: r for r in rows_of(keep)}
    if row_id in rows:
        return rows[row_id]
    if any(row_id == r.id for r in rows_of([c for c in cells if c.recipe_name in left])):
        raise BadInput("farm ci row", "ROW_ID", row_id, "its recipe needs a patch nobody wrote (needs_patch)")
    import difflib

    close = difflib.get_close_matches(row_id, list(rows), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise BadInput("farm ci row", "ROW_ID", row_id, f"no such row in the selected cells{hint}")


def build_row(row: Row, plan, *, staging: Path, wheelhouse: Path | None, out: Path, runner_kind: str | None = None,
              budget_minutes: float | None = None, log=print, clock=time.monotonic) -> RowReport:
    """Build the row's missing siblings in sequence into `staging`; the report is also written to
    out/row-report.json. `wheelhouse`: the house whose manifest says what is built (None: nothing is)."""
    from farm.build.cell import build_cell
    from farm.build.request import BuildRequest
    from farm.run.selection import missing_cells
    from farm.wheelhouse import publish

    report = RowReport(row.id, row.cache_group, budget_minutes)
    todo = {c.id for c in missing_cells(plan, list(row.cells), wheelhouse, runner=runner_kind)} \
        if wheelhouse is not None else {c.id for c in row.cells}
    started = clock()
    longest = 0.0
    for cell in row.cells:
        if cell.id not in todo:
            report.siblings.append(Sibling(cell.id, "up-to-date", why="its build key is in the wheelhouse"))
            continue
        used = clock() - started
        if budget_minutes is not None and longest and used + longest > budget_minutes * 60:
            report.siblings.append(Sibling(cell.id, "deferred", why=(
                f"{used / 60:.1f} of {budget_minutes:g} min used and a sibling took {longest / 60:.1f} min: "
                "left for the next run")))
            continue
        t0 = clock()
        try:
            request = BuildRequest.make(cell.id, runner_kind=runner_kind, out=out / cell.id, publish=False,
                                        wheelhouse=wheelhouse)
            result = build_cell(request, log=log)
            if result.wheel is None:
                raise FarmError(f"{cell.id}: the build made no wheel ({result.status})")
            if result.status == "built":
                publish([result.wheel], staging, record=result.record_path)
            sibling = Sibling(cell.id, result.status, wheel=result.wheel.name)
        except (FarmError, OSError) as exc:   # one sibling's failure (or a full disk) stays in its sibling
            sibling = Sibling(cell.id, "failed", why=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        sibling.seconds = round(clock() - t0, 1)
        longest = max(longest, sibling.seconds)
        report.siblings.append(sibling)
        log(f"{cell.id}: {sibling.status} in {sibling.seconds:.0f}s" + (f": {sibling.why}" if sibling.why else ""))
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / REPORT, json.dumps(asdict(report), indent=2) + "\n")
    return report
