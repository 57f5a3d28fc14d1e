"""The emulated ARM build against the native x86_64 build of the same cell (design.md §8.4).

Builds farm_demo-cu130-torch2.13-py311-aarch64 in the arm64 image under QEMU user
emulation and compares its times with farm_demo-cu130-torch2.13-py311 built natively
in the x86_64 image. The x86 time is read from a build record written during this
same bench run (build/<cell>/build.json, newer than this process) when there is one,
else that cell is built here too. Both builds use the container runner with warm
caches (torch environments, toolkits), so the ratios are about compiling, not
downloading, and no compiler cache (`--no-compiler-cache`; a record from the run
counts only when ccache served none of its files). Figures: the compile step, and
the whole build.

Needs an x86_64 host with an engine, qemu-aarch64 registered and the aarch64 image
(`make test-arm` or `farm images setup-qemu && farm images build --arch aarch64`);
otherwise it says why and reports nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from .figures import Figure

PROJECT = Path(__file__).resolve().parent.parent
X86_CELL = "farm_demo-cu130-torch2.13-py311"
ARM_CELL = X86_CELL + "-aarch64"


def _build(cell: str, out: Path) -> dict:
    """`farm build <cell>` (container runner, forced, cold: no compiler cache, not published); its record."""
    cmd = [sys.executable, "-m", "farm", "build", cell, "--runner", "container", "--force", "--no-publish",
           "--no-compiler-cache", "--out", str(out)]
    p = subprocess.run(cmd, cwd=PROJECT, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[2:])} failed: {(p.stderr or p.stdout).strip()[-500:]}")
    return json.loads((out / "build.json").read_text())


def _why_not() -> str | None:
    from farm.platforms import host_arch
    from farm.runners import images
    from farm.runners.engine import Engine

    if host_arch() != "x86_64":
        return "not an x86_64 host: nothing is emulated here"
    try:
        engine = Engine.detect()
    except Exception as exc:  # no engine answers
        return f"no container engine ({exc})"
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        return "qemu-aarch64 is not registered (farm images setup-qemu)"
    if images.load_image("aarch64", engine) is None:
        return "no aarch64 image (farm images build --arch aarch64)"
    return None


def run() -> list[Figure]:
    why = _why_not()
    if why:
        print(f"[bench] arm: skipped: {why}", file=sys.stderr)
        return []
    with tempfile.TemporaryDirectory(prefix="bench-arm-") as tmp:
        x86 = _build(X86_CELL, Path(tmp) / "x86")
        arm = _build(ARM_CELL, Path(tmp) / "arm")
    note = f"{ARM_CELL} under qemu vs {X86_CELL} native, container runner, warm caches"
    return [
        Figure("arm: emulated/native compile step", arm["steps"]["compile"], x86["steps"]["compile"], note=note),
        Figure("arm: emulated/native whole build", arm["seconds"], x86["seconds"], note=note),
    ]
