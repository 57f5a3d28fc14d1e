"""The pipeline's overhead (issue 5): `farm build --force`, no compiler cache, warm image/env/toolkit,
against a bare `pip wheel` of the same source in the same torch environment with the same variables.

Both run on the host runner (the same environment is then literally the same venv). Median of
FARM_BENCH_REPEAT runs each (default 3; each is a full compile of farm_demo, minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .figures import Figure, median_time

PROJECT = Path(__file__).resolve().parent.parent
CELL = "farm_demo-cu130-torch2.13-py311"


def run() -> list[Figure]:
    repeat = int(os.environ.get("FARM_BENCH_REPEAT", "3"))
    out = Path(tempfile.mkdtemp(prefix="bench-build-"))
    build = [sys.executable, "-m", "farm", "build", CELL, "--runner", "host", "--force", "--no-publish",
             "--no-compiler-cache", "--out", str(out / "farm")]
    subprocess.run(build, check=True, capture_output=True)          # warm: image, env, toolkit
    farm = median_time(lambda: subprocess.run(build, check=True, capture_output=True), repeat)
    steps = json.loads((out / "farm" / "steps.json").read_text())
    compile_env = steps["compile"]["env"]
    env_python = steps["env"]["overlay"]["python"] if steps["env"].get("overlay") else steps["env"]["base"]["python"]
    env = {**compile_env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1"}

    def bare() -> None:
        src = out / "bare-src"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(PROJECT / "examples" / "farm-demo", src)
        subprocess.run([env_python, "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps", "--no-cache-dir",
                        "-w", str(out / "bare")], cwd=src, env=env, check=True, capture_output=True)

    baseline = median_time(bare, repeat)
    shutil.rmtree(out, ignore_errors=True)
    figures = [Figure("build: `farm build --force` vs bare `pip wheel` (farm_demo, host, no ccache)", farm, baseline,
                      1.25, note=f"median of {repeat}")]
    for step, seconds in sorted(steps.get("timings", {}).items()):
        figures.append(Figure(f"build: step {step}", seconds, None, note="last farm build"))
    return figures
