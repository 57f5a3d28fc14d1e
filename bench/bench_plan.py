"""Planning speed (issue 4): full-grid plan, `nox -l`, and `nox -s build-<cell>` up to `farm build`.

Baselines run in the same session: a noxfile registering the same number of
trivial sessions, and a bare Python start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from .figures import Figure, median_time

PROJECT = Path(__file__).resolve().parent.parent
NOX = [sys.executable, "-m", "nox"]


def _run(argv, cwd, env=None):
    subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _baseline_noxfile(folder: Path, count: int, mark: Path) -> None:
    (folder / "noxfile.py").write_text(textwrap.dedent(f"""
        import sys
        import nox
        nox.options.default_venv_backend = "none"

        def _make(i):
            def s(session):
                session.run(sys.executable, "-c", "import time; open({str(mark)!r}, 'w').write(repr(time.time()))",
                            external=True)
            nox.session(name=f"build-trivial-{{i}}", tags=["t{{i % 7}}"], venv_backend="none")(s)

        for i in range({count}):
            _make(i)
        """))


def _time_to_mark(argv, cwd, mark: Path, env=None) -> float:
    times = []
    for _ in range(3):
        mark.unlink(missing_ok=True)
        start = time.time()
        subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        times.append(float(mark.read_text()) - start)
    return sorted(times)[1]


def run() -> list[Figure]:
    from farm.recipes.plan import full_plan, session_index

    cells = full_plan().cells
    session_index()  # warm the cached session index, as any second call would find it
    count = len(cells)
    python = median_time(lambda: _run([sys.executable, "-c", "pass"], PROJECT))
    plan = median_time(lambda: _run([sys.executable, "-m", "farm", "plan", "--format", "json"], PROJECT))
    figures = [Figure("plan: full-grid `farm plan --format json` (process)", plan, python, None,
                      note=f"{count} cells; goal: under 1 s absolute ({'met' if plan < 1 else 'NOT met'})")]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        mark = base / "mark"
        _baseline_noxfile(base, count, mark)
        nox_base = median_time(lambda: _run([*NOX, "-l"], base))
        nox_ours = median_time(lambda: _run([*NOX, "-l"], PROJECT))
        figures.append(Figure("plan: `nox -l` vs trivial noxfile with as many sessions", nox_ours, nox_base, 1.2))
        cell = next(c.id for c in cells if c.recipe_name == "farm_demo")
        start_base = _time_to_mark([*NOX, "-s", "build-trivial-7"], base, mark)
        start_ours = _time_to_mark([*NOX, "-s", f"build-{cell}"], PROJECT, mark, {"FARM_START_MARK": str(mark)})
        figures.append(Figure("plan: `nox -s build-<cell>` until `farm build` starts", start_ours, start_base, 0.5))
    return figures
