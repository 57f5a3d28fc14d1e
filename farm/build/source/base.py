"""What every kind of source shares: what a fetch returns, the cache folder, git's line
that explains a failure, the source's date (SOURCE_DATE_EPOCH, design.md §6.5).
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
    # SOURCE_DATE_EPOCH of the tree (design.md §6.5): a function of the pin alone, never of when or
    # where it was fetched, so two builds of one build key stamp the same times.
    date_epoch: int = 0


# 1980-01-01T00:00:00Z, the earliest time a zip entry can hold: the date of a source with no date of its own.
ZIP_EPOCH = 315532800


def sources_cache() -> Path:
    return cache_dir() / "sources"


def git_error_line(text: str) -> str:
    """git's first 'fatal:' or 'error:' line (what went wrong; later lines are consequences)."""
    return last_line(text, prefer=lambda ln: ln.startswith(("fatal:", "error:")), first=True)
