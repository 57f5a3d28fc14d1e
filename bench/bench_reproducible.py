"""Reproducibility (issue 34): one cell built three times with the same build key, compared byte for byte.

    a  cold: an empty compiler cache of its own
    b  cold: another empty compiler cache
    c  warm: b's cache again (every object a ccache hit)

a against b says whether a build from scratch is reproducible; b against c whether a cached rebuild
is. Where two wheels differ, each differing entry is printed, and in an ELF file each differing
section with the strings only one side has (farm.build.wheeldiff). Every .so is also searched for a
folder of the build host (the cache, the work dir, the Python prefix, the home folder): the count
must be 0. The runner is the farm's default (FARM_BENCH_RUNNER=host|container to choose); the cell is
FARM_BENCH_CELL (default the demo's). Heavy: three real compiles (run it under the heavy-work lock).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from farm import settings
from farm.build.wheeldiff import compare_wheels, host_strings

from .figures import Figure

CELL = os.environ.get("FARM_BENCH_CELL", "farm_demo-cu130-torch2.13-py311")


def _build(out: Path, ccache: Path) -> tuple[Path, float, dict]:
    runner = os.environ.get("FARM_BENCH_RUNNER")
    cmd = [sys.executable, "-m", "farm", "build", CELL, "--force", "--no-publish", "-q", "--out", str(out)]
    cmd += ["--runner", runner] if runner else []
    env = {**os.environ, "FARM_CCACHE_DIR": str(ccache), "FARM_WHEELHOUSE": str(out.parent / "empty-wheelhouse")}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"farm build {CELL} failed: {(done.stderr or done.stdout).strip()[-800:]}")
    wheel = next((out / "wheel").glob("*.whl"))
    record = json.loads((out / "build.json").read_text())
    return wheel, took, record


def _host_folders(out: Path, cell: str) -> list[str]:
    """What a binary must not name: the cache and home folders, the cell's work dir, the Python prefix
    (the build's interpreter as the spec names it; an image's own /usr Python by its include folder)."""
    python = Path(json.loads((out / "spec-host.json").read_text())["python"])
    prefix = str(Path(os.path.realpath(python)).parent.parent)
    if prefix in ("/usr", "/"):
        prefix = f"{prefix.rstrip('/')}/include/python"
    return [str(settings.cache_dir()), str(settings.cache_dir() / "work" / cell), prefix, os.path.expanduser("~")]


def _so_host_strings(wheel: Path, needles: list[str]) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return [f"{n}: {s}" for n in zf.namelist() if ".so" in Path(n).name
                for s in host_strings(zf.read(n), needles)]


def _report(label: str, a: Path, b: Path) -> int:
    diffs = compare_wheels(a, b)
    if not diffs:
        print(f"[reproducible] {label}: byte-identical ({a.stat().st_size} bytes)", file=sys.stderr)
    else:
        print(f"[reproducible] {label}: {len(diffs)} entr{'y' if len(diffs) == 1 else 'ies'} differ", file=sys.stderr)
        for d in diffs:
            for line in d.lines():
                print(f"[reproducible]   {line}", file=sys.stderr)
    return len(diffs)


def run() -> list[Figure]:
    work = Path(tempfile.mkdtemp(prefix="bench-reproducible-"))
    try:
        wa, ta, rec = _build(work / "a", work / "ccache-a")
        wb, tb, _ = _build(work / "b", work / "ccache-b")
        wc, tc, rc = _build(work / "c", work / "ccache-b")
        hits = (rc.get("compiler_cache") or {}).get("stats", {}).get("hits")
        cold = _report("cold a vs cold b", wa, wb)
        warm = _report("cold b vs warm c (ccache hits)", wb, wc)
        needles = _host_folders(work / "a", rec["cell"])
        leaks = sorted({s for w in (wa, wb, wc) for s in _so_host_strings(w, needles)})
        for line in leaks[:20]:
            print(f"[reproducible] host path in a binary: {line}", file=sys.stderr)
        return [
            Figure(f"reproducible: entries differing, cold vs cold ({CELL})", cold, None, unit="",
                   note=f"builds {ta:.0f}s and {tb:.0f}s"),
            Figure("reproducible: entries differing, cold vs warm", warm, None, unit="",
                   note=f"warm build {tc:.0f}s, {hits} ccache hits"),
            Figure("reproducible: host-path strings in the .so files", len(leaks), None, unit="",
                   note="searched for: " + ", ".join(needles)),
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
