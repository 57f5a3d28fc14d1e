"""The builder's host compiler (issue 34): compile time with the image's sysroot toolchain (bullseye's
gcc 10, glibc 2.31; design.md §6.4) against the image's own gcc (`FARM_HOST_COMPILER=image`, the
builder as it was before), per recipe, in one run.

Each cell is built on the container runner with `--force --no-publish --no-compiler-cache`, once per
compiler, alternating so that a load change on the shared host falls on both; the figure is the
`compile` step's seconds from the build record (the rest of a build does not depend on the compiler).
FARM_BENCH_BUILDER_CELLS names the cells (default: three small recipes); FARM_BENCH_REPEAT the
builds per compiler (default 1: each is a full compile, minutes on 2 cores). Goal: at most 1.15x.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .figures import Figure

DEFAULT_CELLS = ("farm_demo-cu130-torch2.13-py311", "nvdiffrec_render-cu130-torch2.13-py312",
                 "diso-cu130-torch2.13-py312")
COMPILERS = ("toolchain", "image")   # farm.runners.hostcompiler.CHOICES: measured, baseline
GOAL = 1.15


def compile_seconds(cell: str, compiler: str, out: Path) -> tuple[float, str]:
    """One forced container build of `cell` with `compiler`: its compile step's seconds and its wheel's tag."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "FARM_HOST_COMPILER": compiler, "FARM_WHEELHOUSE": str(out.parent / "empty-wheelhouse")}
    if compiler == "image":
        # The old builder's wheels reach only its own glibc's tag, which the gate's floor check (torch's
        # manylinux_2_28) fails after the compile: raise the floor to it, so the baseline build finishes.
        # What is measured is the compile step alone.
        env["FARM_MANYLINUX_FLOOR"] = "manylinux_2_34"
    else:
        env.pop("FARM_MANYLINUX_FLOOR", None)
    cmd = [sys.executable, "-m", "farm", "build", cell, "--runner", "container", "--force", "--no-publish",
           "--no-compiler-cache", "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{cell} ({compiler}) failed: {(done.stderr or done.stdout).strip()[-400:]}")
    record = json.loads((out / "build.json").read_text())
    return float(record["steps"]["compile"]), record.get("image_tag", "")


def run() -> list[Figure]:
    cells = os.environ.get("FARM_BENCH_BUILDER_CELLS", "").split() or list(DEFAULT_CELLS)
    repeat = int(os.environ.get("FARM_BENCH_REPEAT", "1"))
    work = Path(tempfile.mkdtemp(prefix="bench-builder-"))
    figures = []
    try:
        for cell in cells:
            seconds: dict[str, list[float]] = {c: [] for c in COMPILERS}
            tags: dict[str, str] = {}
            for _ in range(repeat):
                for compiler in COMPILERS:
                    took, tags[compiler] = compile_seconds(cell, compiler, work / f"{cell}-{compiler}")
                    seconds[compiler].append(took)
            recipe = cell.split("-cu")[0]
            figures.append(Figure(f"builder: compile, sysroot toolchain vs image gcc ({recipe})",
                                  statistics.median(seconds["toolchain"]), statistics.median(seconds["image"]), GOAL,
                                  note=f"{cell}, container, no ccache, median of {repeat}; tags "
                                       f"{tags['toolchain']} vs {tags['image']}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return figures
