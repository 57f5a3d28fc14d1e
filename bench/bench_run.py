"""`farm run` (issue 8): a no-op run over the full grid, and the Python axis of farm_demo.

1. No-op: a test manifest holds the build key of every cell of the full grid (as the host runner keys
   them); `farm run --runner host` must plan and skip everything in under 3 s. Baseline: `farm plan
   --format json` over the same grid, in the same run.
2. The Python axis (environments pre-warmed, host runner, a cold compiler cache of its own via
   FARM_CCACHE_DIR): one Python built cold is the baseline; four Pythons (3.10-3.13) in one run with
   the cache; the per-file hit rate of the three that follow the first; a rebuild of the same cell on
   the same Python (median of three). Without a cache the four Pythons cost 4.0x by construction
   (four cold compiles of identical work), so that figure is not spent again here. The same for the
   real PyPI sdist diso 0.1.4 (its recipe's GitHub source swapped for that sdist: GitHub is out of
   reach here).
3. The wheel_abi collapse: cells planned for the recipes whose one wheel serves every Python.
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
    from farm.build.buildkey import KeyMaker
    from farm.recipes.plan import full_plan
    from farm.run.selection import Contexts
    from farm.wheelhouse import ManifestEntry

    plan = full_plan()
    keys = KeyMaker(plan.defaults, plan.recipes)
    contexts = Contexts("host")
    lines = []
    for cell in plan.cells:
        py = cell.python.replace(".", "")
        plat = {"linux": "manylinux_2_34_x86_64", "linux_aarch64": "manylinux_2_34_aarch64",
                "windows": "win_amd64"}[cell.platform]
        version = f"0.1.0+{cell.local_label}"
        lines.append(ManifestEntry(
            file=f"{cell.recipe_name}-{version}-cp{py}-cp{py}-{plat}.whl", project=cell.recipe_name.replace("_", "-"),
            name=cell.recipe_name, version=version, build_tag=None, python_tag=f"cp{py}", abi_tag=f"cp{py}",
            platform_tag=plat, cuda=cell.cuda, torch=cell.torch if cell.links_torch else None,
            platform=cell.platform, pythons=(cell.python,), size=1, sha256="0" * 64, metadata_sha256="0" * 64,
            requires_python=None, cell=cell.id, build_key=contexts.key_of(keys, cell),
            arch_list=cell.arch.arch_list.torch(), published="2026-01-01T00:00:00Z", host="bench").to_json())
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


def _run_cells(package: str, pythons, house: Path, build: Path, env: dict) -> tuple[dict[str, dict], float]:
    """`farm run` (the host runner, its default --jobs) over the package's cu130/torch2.13 cells of
    `pythons`: (the report's cells by id, the run's wall time)."""
    argv = [*FARM, "run", "--plain", "--runner", "host", "--wheelhouse", str(house), "--build-dir",
            str(build), "--package", package, "--cuda", "13.0", "--torch", "2.13", "--platform", "linux"]
    for py in pythons:
        argv += ["--python", py]
    t0 = time.monotonic()
    res = _quiet(argv, env)
    wall = time.monotonic() - t0
    report = json.loads((house / "runs" / "latest.json").read_text())
    cells = {c["id"]: c for c in report["cells"]}
    bad = {i: c for i, c in cells.items() if c["status"] != "built"}
    if bad or len(cells) != len(pythons):
        raise RuntimeError(f"farm run did not build every cell ({sorted(bad)}): {res.stdout[-1500:]}{res.stderr[-500:]}")
    return cells, wall


def _compile_seconds(build: Path, cell: str) -> float:
    return json.loads((build / cell / "steps.json").read_text())["timings"]["compile"]


def _files(build: Path, cell: str) -> dict:
    return json.loads((build / cell / "steps.json").read_text())["compile"]["compiler_cache"]["stats"]["files"]


def diso_recipes(folder: Path) -> Path:
    """The project's recipes with diso's source swapped for its PyPI sdist (GitHub is out of reach here;
    the sdist of 0.1.4 is the same release), for the Python-axis figure of a real package."""
    import yaml

    shutil.copytree(PROJECT / "recipes", folder)
    path = folder / "diso.yml"
    recipe = yaml.safe_load(path.read_text())
    recipe["source"] = {"sdist": {"pypi": f"diso=={recipe['version']}", "sha256": DISO_SDIST_SHA256}}
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return folder


DISO_SDIST_SHA256 = "2ada1c21b84f72fdcec6abc3c4e09200824a7cc9d5de9623a28052e8b1f22c95"   # diso-0.1.4.tar.gz


def prewarm_environments() -> None:
    """The axis measures compiles, not environment builds."""
    from farm.build.environments import EnvRequest, base_environment, download_environment
    from farm.runners.host import HostRunner

    runner = HostRunner()
    for py in PYTHONS:
        req = EnvRequest(py, "2.13.0", "13.0", "linux", "2.36")
        download_environment(req)
        base_environment(req, runner.python(py)[0], target="host")


def python_axis_figures(package: str, env: dict | None = None) -> list[Figure]:
    """Four Pythons vs one (each run with a cold compiler cache of its own), per-file hit rates, and a
    rebuild of the same cell on the same Python."""
    env = env or {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # one Python, cold cache
        env1 = {**env, "FARM_CCACHE_DIR": str(root / "cache-one")}
        one_cell = f"{package}-cu130-torch2.13-py311"
        one, wall1 = _run_cells(package, ["3.11"], root / "h1", root / "b1", env1)
        t_one = one[one_cell]["duration"]
        c_one = _compile_seconds(root / "b1", one_cell)
        # the same cell again on the same Python, same cache: the median of three (a few seconds each)
        rebuilds = []
        for i in range(3):
            again, _ = _run_cells(package, ["3.11"], root / f"h1b{i}", root / f"b1b{i}", env1)
            rebuilds.append((again[one_cell]["duration"], _compile_seconds(root / f"b1b{i}", one_cell)))
        t_again, c_again = sorted(rebuilds)[1]
        # four Pythons in one run, a cold cache of their own
        env4 = {**env, "FARM_CCACHE_DIR": str(root / "cache-four")}
        four, wall4 = _run_cells(package, PYTHONS, root / "h4", root / "b4", env4)
        t_four = sum(c["duration"] for c in four.values())
        first = min(four.values(), key=lambda c: c["started"])["id"]
        hits = total = 0
        per_file: dict[str, list[str]] = {}
        for cell in sorted(set(four) - {first}):   # the Pythons after the first may hit its objects
            for f, outcome in _files(root / "b4", cell).items():
                per_file.setdefault(Path(f).name, []).append(outcome)
                total += 1
                hits += outcome == "hit"
    rate = hits / total if total else 0.0
    detail = "; ".join(f"{name}: {'/'.join(v)}" for name, v in sorted(per_file.items()))
    return [
        Figure(f"run: {package}, four Pythons (3.10-3.13) vs one, with ccache (wall time of the run)", wall4, wall1,
               2.7, note=f"{os.cpu_count()} CPUs, default --jobs, first Python ({first.rsplit('-', 1)[1]}) alone "
                         f"then its siblings; sum of cell times {t_four:.0f}s vs {t_one:.0f}s = "
                         f"{t_four / t_one:.2f}x; per-file outcome after the first {rate:.0%} hits ({detail}); "
                         "without a cache 4.0x by construction (four cold compiles)"),
        Figure(f"run: {package} rebuild, same cell and Python, warm ccache (whole cell)", t_again, t_one, 0.10,
               note=f"median of 3 ({', '.join(f'{t:.1f}s' for t, _ in rebuilds)}); compile step {c_again:.1f}s "
                    f"vs {c_one:.1f}s cold"),
    ]


def collapse_figures() -> list[Figure]:
    """The other cut of the Python axis: a wheel that serves every Python (abi3, py3-none, pure) is one
    cell per row instead of one per Python. Cells of the collapsing recipes vs the same recipes per Python."""
    import dataclasses

    from farm.recipes.plan import full_plan

    plan = full_plan()
    collapsing = sorted(n for n, r in plan.recipes.items() if r.wheel_abi != "cpython")
    if not collapsing:
        return []
    as_cpython = {n: dataclasses.replace(plan.recipes[n], wheel_abi="cpython") for n in collapsing}
    expanded = full_plan(recipes=as_cpython)
    planned = sum(1 for c in plan.cells if c.recipe_name in as_cpython)
    return [Figure("run: cells of the abi3 / py3-none / pure recipes vs one per Python (the wheel_abi collapse)",
                   planned, len(expanded.cells), None, unit=" cells",
                   note=f"{', '.join(collapsing)}; a recipe that could declare abi3 would cost 1 build per row "
                        f"on the Python axis instead of one per Python")]


def run() -> list[Figure]:
    figures = noop_figures() + collapse_figures()
    if os.environ.get("FARM_BENCH_SKIP_BUILDS"):
        return figures
    prewarm_environments()
    figures += python_axis_figures("farm_demo")
    with tempfile.TemporaryDirectory() as tmp:
        figures += python_axis_figures("diso", {"FARM_RECIPES": str(diso_recipes(Path(tmp) / "recipes"))})
    return figures
