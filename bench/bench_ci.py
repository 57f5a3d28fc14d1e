"""CI row jobs against per-cell jobs (issue 18), measured by running the generated jobs' `farm ci row` step here.

For farm_demo and diso (its PyPI sdist, as bench_run), cu130 / torch 2.13 / Linux, four Pythons (3.10-3.13):
- per-cell jobs: the generated row job's command narrowed to one Python (what a per-cell matrix job builds),
  four jobs, each with a fresh compiler cache as on a fresh runner;
- the row job: the same command over the four Pythons, one fresh compiler cache shared by its siblings;
- warm reruns: every job again with a fresh wheelhouse and staging folder and its saved compiler cache
  copied in, as `actions/cache` restores it on the next run (a recipe or policy change: every key new).
CPU-seconds are the jobs' children (the host runner, so every compiler process is a descendant); wall
time is per job (per-cell jobs would run side by side on four runners: their baseline is the longest).
The torch environments and the toolkit are pre-warmed and shared: CI downloads them in both shapes
alike (one environment per Python), so they would add the same to both sides.
Job counts: the full grid's row jobs against its cells, the jobs per-cell matrices would need.
FARM_BENCH_CI_PACKAGES="diso" (space-separated) measures only the packages named (default: both).
CPU-seconds grow when other work shares the cores (caches, memory bandwidth); a hosted runner is a
machine of its own, so figures meant to stand for CI are taken with nothing else running.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from .bench_run import PYTHONS, diso_recipes, prewarm_environments
from .figures import Figure

PROJECT = Path(__file__).resolve().parent.parent
FARM = [sys.executable, "-m", "farm"]
CPU_GOAL, WARM_GOAL, JOBS_GOAL = 0.6, 0.15, 0.25


def row_command(package: str, pythons, env: dict) -> list[str]:
    """The generated workflow's `farm ci row` step for this selection, as argv (host runner, no summary)."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [*FARM, "ci", "github", "--out", tmp, "--package", package, "--cuda", "13.0", "--torch", "2.13",
                "--platform", "linux"]
        for py in pythons:
            argv += ["--python", py]
        subprocess.run(argv, cwd=PROJECT, env={**os.environ, **env}, check=True, capture_output=True)
        wf = yaml.safe_load((Path(tmp) / "farm-build.yml").read_text())
    (job,) = [j for k, j in wf["jobs"].items() if k.startswith("build_")]
    line = next(ln for s in job["steps"] for ln in s.get("run", "").splitlines() if "farm ci row \"$ROW\" --staging" in ln)
    words = line.split("farm ci row", 1)[1].split()
    out, skip = ["ci", "row"], False
    for word in words:
        if skip:
            skip = False
            continue
        if word == "--summary":   # $GITHUB_STEP_SUMMARY: a runner's file
            skip = True
            continue
        out.append(word.strip('"'))
    return [*FARM, *out, "--runner", "host"]


def run_job(argv: list[str], row: str, root: Path, env: dict, ccache: Path) -> tuple[float, float, dict]:
    """One job in its own folder: (CPU-seconds of its processes, wall seconds, its row report)."""
    root.mkdir(parents=True)
    (root / "wheelhouse").mkdir()
    argv = [a.replace("$ROW", row) for a in argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    res = subprocess.run(argv, cwd=root, env={**os.environ, **env, "FARM_CCACHE_DIR": str(ccache)},
                         capture_output=True, text=True)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = json.loads((root / "build" / "row-report.json").read_text()) if (root / "build" / "row-report.json").exists() else {}
    built = [s for s in report.get("siblings", []) if s["status"] == "built"]
    if res.returncode != 0 or not built:
        raise RuntimeError(f"{' '.join(argv)}: exit {res.returncode}: {res.stdout[-1500:]}{res.stderr[-800:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    for sibling in report.get("siblings", []):   # what each sibling's compile hit, for the figure's note
        record = root / "build" / sibling["cell"] / "build.json"
        cache = json.loads(record.read_text()).get("compiler_cache", {}) if record.is_file() else {}
        stats = cache.get("stats") or {}
        sibling["hits"], sibling["misses"] = stats.get("hits"), stats.get("misses")
    return cpu, wall, report


def siblings_text(report: dict) -> str:
    """'py310 94s 0/3 hits, py311 40s 2/3 hits, ...': where a row's time went."""
    return ", ".join(f"{s['cell'].rsplit('-', 1)[-1]} {s['seconds']:.0f}s {s.get('hits')}/"
                     f"{(s.get('hits') or 0) + (s.get('misses') or 0)} hits" for s in report.get("siblings", []))


def package_figures(package: str, env: dict, root: Path) -> list[Figure]:
    row = f"{package}-cu130-torch2.13"
    load = os.getloadavg()[0]   # other work on the cores inflates CPU-seconds
    per_cell = {py: row_command(package, [py], env) for py in PYTHONS}
    whole = row_command(package, PYTHONS, env)
    measured: dict[str, dict[str, tuple[float, float]]] = {"cell": {}, "row": {}}
    reports: dict[str, dict] = {}
    for phase in ("cold", "warm"):
        for py, argv in per_cell.items():
            cache = root / f"cache-cell-{py}-{phase}"
            if phase == "warm":   # the cache the cold job saved, restored
                shutil.copytree(root / f"cache-cell-{py}-cold", cache)
            cpu, wall, _ = run_job(argv, row, root / f"cell-{py}-{phase}", env, cache)
            measured["cell"][f"{py}-{phase}"] = (cpu, wall)
        cache = root / f"cache-row-{phase}"
        if phase == "warm":
            shutil.copytree(root / "cache-row-cold", cache)
        cpu, wall, report = run_job(whole, row, root / f"row-{phase}", env, cache)
        assert len([s for s in report["siblings"] if s["status"] == "built"]) == len(PYTHONS), report
        measured["row"][phase] = (cpu, wall)
        reports[phase] = report

    def cells(phase: str, i: int) -> list[float]:
        return [measured["cell"][f"{py}-{phase}"][i] for py in PYTHONS]

    cpu_cell = {p: sum(cells(p, 0)) for p in ("cold", "warm")}
    cpu_row = {p: measured["row"][p][0] for p in ("cold", "warm")}
    wall_row = {p: measured["row"][p][1] for p in ("cold", "warm")}
    detail = ", ".join(f"{py} {c:.0f}s" for py, c in zip(PYTHONS, cells("cold", 0), strict=True))
    return [
        Figure(f"ci: {package} row job vs four per-cell jobs, cold, CPU-seconds", cpu_row["cold"], cpu_cell["cold"],
               CPU_GOAL, note=f"per-cell jobs {detail}; row siblings {siblings_text(reports['cold'])}; "
                              f"1-min load average at start {load:.2f}"),
        Figure(f"ci: {package} row job vs four per-cell jobs, warm rerun, CPU-seconds", cpu_row["warm"],
               cpu_cell["warm"], None, note="both with their saved compiler caches restored"),
        Figure(f"ci: {package} row job, warm rerun vs cold, CPU-seconds", cpu_row["warm"], cpu_row["cold"], WARM_GOAL),
        Figure(f"ci: {package} per-cell jobs, warm rerun vs cold, CPU-seconds", cpu_cell["warm"], cpu_cell["cold"],
               WARM_GOAL),
        Figure(f"ci: {package} row job wall vs the longest per-cell job (four runners side by side), cold",
               wall_row["cold"], max(cells("cold", 1)), None,
               note=f"per-cell walls summed {sum(cells('cold', 1)):.0f}s (one runner)"),
        Figure(f"ci: {package} row job wall, warm rerun vs cold", wall_row["warm"], wall_row["cold"], WARM_GOAL,
               note=f"per-cell warm/cold walls summed {sum(cells('warm', 1)):.0f}s / {sum(cells('cold', 1)):.0f}s"),
    ]


def job_count_figure() -> Figure:
    from farm.recipes.plan import full_plan
    from farm.run.ci import ci_layout

    plan = full_plan()
    chunks, left = ci_layout(plan, list(plan.cells))
    rows = sum(len(c.rows) for c in chunks)
    cells = len(plan.cells) - sum(len(v) for v in left.values())
    return Figure("ci: build jobs of the full grid, row jobs vs per-cell jobs", rows, cells, JOBS_GOAL, unit=" jobs",
                  note=f"{len(chunks)} matrices of at most 256 rows; {cells / rows:.1f} Pythons per row")


def run() -> list[Figure]:
    figures = [job_count_figure()]
    if os.environ.get("FARM_BENCH_SKIP_BUILDS"):
        return figures
    packages = os.environ.get("FARM_BENCH_CI_PACKAGES", "farm_demo diso").split()
    prewarm_environments()
    for package in packages:
        with tempfile.TemporaryDirectory() as tmp:
            env = {"FARM_RECIPES": str(diso_recipes(Path(tmp) / "recipes"))} if package == "diso" else {}
            figures += package_figures(package, env, Path(tmp) / package)
    return figures
