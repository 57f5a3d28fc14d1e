"""What every kind of source shares: what a fetch returns, the cache folder, and the
checks of names and digests a recipe gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from farm.errors import BadInput
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


def check_sha256(value: object, where: str, key: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise BadInput(where, key, value, "expected a sha256 (64 hex digits)")
    return value.lower()


def unsafe_name(name: str) -> str | None:
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        return "'..' in path"
    return None


def inside(root: Path, rel: object, where: str, key: str) -> Path:
    if not isinstance(rel, str) or not rel or unsafe_name(rel):
        raise BadInput(where, key, rel, "expected a relative path inside the source tree")
    return root / rel
