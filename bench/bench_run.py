"""`farm run` (issue 8): a no-op run over the full grid, and the Python axis of farm_demo.

1. No-op: a test manifest holds the build key of every cell of the full grid (as the host runner keys
   them); `farm run --runner host` must plan and skip everything in under 3 s. Baseline: `farm plan
   --format json` over the same grid, in the same run.
2. The Python axis (environments pre-warmed, host runner, a cold compiler cache of its own via
   FARM_CCACHE_DIR): one Python built cold is the baseline; four Pythons (3.10-3.13) in one run with
   the cache; the per-file hit rate of the three that follow the first; a rebuild of the same cell on
   the same Python. Without a cache the four Pythons cost 4.0x by construction (four cold compiles
   of identical work), so that figure is not spent again here.
   The diso 0.1.4 measurement is not repeated here (its recipe needs_patch in this farm).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .figures import Figure, median_time

PROJECT = Path(__file__).resolve().parent.parent
FARM = [sys.executable, "-m", "farm"]
PYTHONS = ("3.10", "3.11", "3.12", "3.13")


def _full_manifest(house: Path) -> int:
    """manifest.jsonl with one entry per cell of the full grid, keyed as `farm run --runner host` keys it."""
    from farm.buildkey import KeyMaker
    from farm.plan import full_plan
    from farm.run import Contexts

    plan = full_plan()
    keys = KeyMaker(plan.defaults, plan.recipes)
    contexts = Contexts("host")
    lines = []
    for cell in plan.cells:
        py = cell.python.replace(".", "")
        plat = {"linux": "manylinux_2_34_x86_64", "linux_aarch64": "manylinux_2_34_aarch64",
                "windows": "win_amd64"}[cell.platform]
        file = f"{cell.recipe_name}-0.1.0+{cell.local_label}-cp{py}-cp{py}-{plat}.whl"
        lines.append(json.dumps({
            "op": "add", "file": file, "project": cell.recipe_name.replace("_", "-"), "name": cell.recipe_name,
            "version": f"0.1.0+{cell.local_label}", "build_tag": None, "python_tag": f"cp{py}",
            "abi_tag": f"cp{py}", "platform_tag": plat, "cuda": cell.cuda,
            "torch": cell.torch if cell.links_torch else None, "platform": cell.platform,
            "pythons": [cell.python], "size": 1, "sha256": "0" * 64, "metadata_sha256": "0" * 64,
            "requires_python": None, "cell": cell.id, "build_key": keys.key(cell, contexts.for_platform(cell.platform)),
            "arch_list": cell.arch.arch_list.torch(), "published": "2026-01-01T00:00:00Z", "host": "bench", "extra": {},
        }, sort_keys=True, separators=(",", ":")))
    house.mkdir(parents=True, exist_ok=True)
    (house / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return len(lines)


def _quiet(argv, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=PROJECT, env={**os.environ, **(env or {})}, capture_output=True, text=True)


def noop_figures() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        house = Path(tmp) / "house"
        count = _full_manifest(house)
        argv = [*FARM, "run", "--plain", "--runner", "host", "--wheelhouse", str(house), "--build-dir", str(Path(tmp) / "b")]
        first = _quiet(argv)
        assert first.returncode == 0 and f"{count} already built (skipped), 0 to build" in first.stdout, first.stdout[-800:]
        noop = median_time(lambda: _quiet(argv))
        plan = median_time(lambda: _quiet([*FARM, "plan", "--format", "json"]))
    return [Figure("run: no-op `farm run` over the full grid (every key in the manifest)", noop, plan, 3.0,
                   note=f"{count} cells skipped; baseline `farm plan --format json`; goal: under 3 s absolute "
                        f"({'met' if noop < 3 else 'NOT met'})")]


def _run_cells(pythons, house: Path, build: Path, env: dict, extra=()) -> dict[str, dict]:
    argv = [*FARM, "run", "--plain", "--runner", "host", "--jobs", "1", "--wheelhouse", str(house), "--build-dir",
            str(build), "--package", "farm_demo", "--cuda", "13.0", "--torch", "2.13", "--platform", "linux", *extra]
    for py in pythons:
        argv += ["--python", py]
    res = _quiet(argv, env)
    report = json.loads((house / "runs" / "latest.json").read_text())
    cells = {c["id"]: c for c in report["cells"]}
    for cell_id, c in cells.items():
        # A cell whose compile finished counts for the timing even if a later step refused its wheel
        # (py3.13 from pyenv: see _gate_failures); anything else is a broken benchmark.
        steps = build / cell_id / "steps.json"
        if c["status"] != "built" and not (steps.exists() and "compile" in json.loads(steps.read_text())):
            raise RuntimeError(f"farm run failed: {res.stdout[-1500:]}{res.stderr[-500:]}")
    return cells


def _gate_failures(cells: dict) -> str:
    bad = [f"{i.split('-')[-1]}: {c['message'][:140]}" for i, c in sorted(cells.items()) if c["status"] != "built"]
    return ("; cells compiled but refused after the compile (time included): " + " | ".join(bad)) if bad else ""


def _compile_seconds(build: Path, cell: str) -> float:
    return json.loads((build / cell / "steps.json").read_text())["timings"]["compile"]


def _files(build: Path, cell: str) -> dict:
    return json.loads((build / cell / "steps.json").read_text())["compile"]["compiler_cache"]["stats"]["files"]


def python_axis_figures() -> list[Figure]:
    from farm.environments import EnvRequest, base_environment, download_environment
    from farm.runners.host import HostRunner

    runner = HostRunner()
    for py in PYTHONS:   # pre-warm: the axis measures compiles, not environment builds
        req = EnvRequest(py, "2.13.0", "13.0", "linux", "2.36")
        download_environment(req)
        base_environment(req, runner.python(py)[0], target="host")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # one Python, cold cache
        env1 = {"FARM_CCACHE_DIR": str(root / "cache-one")}
        one = _run_cells(["3.11"], root / "h1", root / "b1", env1)
        cell311 = "farm_demo-cu130-torch2.13-py311"
        t_one = one[cell311]["duration"]
        c_one = _compile_seconds(root / "b1", cell311)
        # the same cell again on the same Python, same cache
        again = _run_cells(["3.11"], root / "h1b", root / "b1b", env1)
        t_again = again[cell311]["duration"]
        c_again = _compile_seconds(root / "b1b", cell311)
        # four Pythons in one run, a cold cache of their own
        env4 = {"FARM_CCACHE_DIR": str(root / "cache-four")}
        t0 = time.monotonic()
        four = _run_cells(PYTHONS, root / "h4", root / "b4", env4)
        wall4 = time.monotonic() - t0
        t_four = sum(c["duration"] for c in four.values())
        hits = total = 0
        per_file: dict[str, list[str]] = {}
        for cell in sorted(four)[1:]:   # every Python after the first may hit the first's objects
            for f, outcome in _files(root / "b4", cell).items():
                per_file.setdefault(Path(f).name, []).append(outcome)
                total += 1
                hits += outcome == "hit"
        shutil.rmtree(root, ignore_errors=True)
    rate = hits / total if total else 0.0
    detail = "; ".join(f"{name}: {'/'.join(v)}" for name, v in sorted(per_file.items()))
    return [
        Figure("run: farm_demo, four Pythons (3.10-3.13) vs one, with ccache", t_four, t_one, 2.7,
               note=f"sum of cell times (wall {wall4:.0f}s); per-file hit rate after the first Python "
                    f"{rate:.0%} ({detail}); without a cache 4.0x by construction{_gate_failures(four)}"),
        Figure("run: farm_demo rebuild, same cell and Python, warm ccache (whole cell)", t_again, t_one, 0.10,
               note=f"compile step {c_again:.1f}s vs {c_one:.1f}s cold"),
    ]


def run() -> list[Figure]:
    figures = noop_figures()
    if os.environ.get("FARM_BENCH_SKIP_BUILDS"):
        return figures
    return figures + python_axis_figures()
