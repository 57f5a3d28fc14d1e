"""Shared fixtures. Each helper appends its own; keep them small."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from replay_server import serve

# Many tests build on the host runner, whose toolchain here is Debian 12's (glibc 2.36): its wheels reach
# manylinux_2_34 at best, never torch's manylinux_2_28, so the suite raises the floor the one way the farm
# allows (design.md §7.8). Container builds reach manylinux_2_24 and their tests assert that tag themselves;
# a test of the floor sets its own.
os.environ.setdefault("FARM_MANYLINUX_FLOOR", "manylinux_2_34")


@pytest.fixture(scope="session")
def replay_url():
    """The upstream replay (../shared/upstream-replay) served on loopback: the index root `.../whl/`."""
    with serve() as base:
        yield base + "whl/"


# ---------------------------------------------------------------- the suite leaves nothing in the checkout

_CHECKOUT = Path(__file__).resolve().parent.parent
# what running the suite may create: the venv, caches, bytecode, the benchmarks' results, the editable install
_LEFT_OK = (".venv/", ".pytest_cache/", ".ruff_cache/", "bench/results/", "cuda_wheel_farm.egg-info/")


def _stray_paths() -> set[str] | None:
    """Untracked and ignored paths of the checkout, as `git status` names them (None: not a git checkout)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=_CHECKOUT,
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    paths = {line[3:] for line in out.stdout.splitlines() if line[:2] in ("??", "!!")}
    return {p for p in paths if not p.startswith(_LEFT_OK) and "__pycache__/" not in p}


def pytest_sessionstart(session):
    session.config._farm_stray_before = _stray_paths()


def pytest_sessionfinish(session, exitstatus):
    """Fail the session when a test left a file in the checkout (e.g. conmon's `oom` in the working folder)."""
    before = getattr(session.config, "_farm_stray_before", None)
    after = _stray_paths() if before is not None else None
    if after is None or hasattr(session.config, "workerinput"):
        return
    left = sorted(after - before)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"the tests left {len(left)} file(s) in the checkout: {', '.join(left[:20])}"
        if reporter:
            reporter.write_line(f"\nERROR: {message}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
