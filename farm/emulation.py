"""Emulated builds: an aarch64 cell on an x86_64 host runs under QEMU user emulation (SPEC 0.4, 8.4).

Every instruction of the compiler is translated, so an emulated cell costs several
native ones (`make bench` measures the ratio) and gets its own, lower concurrency
cap: `FARM_EMULATED_JOBS` (default 1) cells at a time, whatever the native cap is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .errors import BadInput

EMULATED_JOBS_ENV = "FARM_EMULATED_JOBS"
DEFAULT_EMULATED_JOBS = 1


def emulated_concurrency(environ: Mapping[str, str] | None = None) -> int:
    """How many emulated cells may build at once (a positive integer; default 1)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(EMULATED_JOBS_ENV, "").strip()
    if not raw:
        return DEFAULT_EMULATED_JOBS
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise BadInput("environment", EMULATED_JOBS_ENV, raw, "must be a whole number of at least 1")
    return value


def cell_arch(platform: str) -> str:
    """The machine a cell's platform builds for: linux_aarch64 -> aarch64, else x86_64."""
    return "aarch64" if platform == "linux_aarch64" else "x86_64"


def is_emulated(platform: str, host_arch: str | None = None) -> bool:
    """True when a cell of `platform` (farm spelling) would run under emulation on this host."""
    if platform == "windows":
        return False
    if host_arch is None:
        from .images import host_arch as _host_arch

        host_arch = _host_arch()
    return cell_arch(platform) != host_arch
