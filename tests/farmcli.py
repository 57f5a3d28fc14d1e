"""Run the real `farm` command in a child process, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def run_farm(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 300):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or PROJECT, timeout=timeout)


def copy_defaults(tmp_path: Path) -> Path:
    """A private copy of defaults/ that a test may break."""
    import shutil

    target = tmp_path / "defaults"
    shutil.copytree(PROJECT / "defaults", target)
    return target
