"""What every kind of source shares: what a fetch returns, the cache folder, git's line
that explains a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from farm.process import last_line
from farm.settings import cache_dir


@dataclass(frozen=True)
class Fetched:
    """What fetching one kind of source gave: the tree's pin and how to describe it."""

    kind: str
    pin: str
    description: str
    commit: str | None = None
    sha256: str | None = None
    submodules: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    exclude: tuple[str, ...] = ()


def sources_cache() -> Path:
    return cache_dir() / "sources"


def git_error_line(text: str) -> str:
    """git's first 'fatal:' or 'error:' line (what went wrong; later lines are consequences)."""
    return last_line(text, prefer=lambda ln: ln.startswith(("fatal:", "error:")), first=True)
