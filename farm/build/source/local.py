"""A local folder as the source: copied (no cache), its content digest is the pin."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from farm.build.source.base import ZIP_EPOCH, Fetched
from farm.errors import BadInput
from farm.settings import display

# Left out of a local path copy and its digest: artefacts of earlier in-place builds.
_PATH_IGNORED_ANYWHERE = ("__pycache__", "*.egg-info", ".git", "*.pyc")
_PATH_IGNORED_TOP = ("build", "dist", ".eggs")


def _path_ignore(top: Path) -> Callable[[str, list[str]], set[str]]:
    def ignore(folder: str, names: list[str]) -> set[str]:
        import fnmatch

        out = {n for n in names if any(fnmatch.fnmatch(n, pat) for pat in _PATH_IGNORED_ANYWHERE)}
        if Path(folder) == top:
            out |= {n for n in names if n in _PATH_IGNORED_TOP}
        return out

    return ignore


def tree_digest(root: Path) -> str:
    """sha256 over the relative paths, modes and contents of a local source (ignored names excluded)."""
    root = Path(root)
    ignore = _path_ignore(root)
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(root):
        skip = ignore(folder, dirs + files)
        dirs[:] = sorted(d for d in dirs if d not in skip and not Path(folder, d).is_symlink())
        links = [d for d in os.listdir(folder) if Path(folder, d).is_symlink() and d not in skip]
        for name in sorted(set(f for f in files if f not in skip) | set(links)):
            p = Path(folder, name)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                digest.update(f"L {rel} {os.readlink(p)}\n".encode())
                continue
            digest.update(f"F {rel} {p.stat().st_mode & 0o111:o} {p.stat().st_size}\n".encode())
            with open(p, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def copy_path(folder: Path, dest: Path, *, written: str, where: str = "recipe") -> Fetched:
    """Copy a local source folder (a loaded `Source.path`, `written` as the recipe has it) into `dest`;
    the pin is its content digest. The folder must still be there when the step runs.

    Its date is ZIP_EPOCH, fixed: the pin is the content alone, and file times (a checkout's, a
    copy's) say when the folder was written here, not what it holds (design.md §6.5)."""
    if not folder.is_dir():
        raise BadInput(where, "source.path", written, f"no such folder ({display(folder)})")
    digest = tree_digest(folder)
    shutil.copytree(folder, dest, symlinks=True, ignore=_path_ignore(folder))
    return Fetched("path", digest, f"path {display(folder)} (content {digest[:12]})", date_epoch=ZIP_EPOCH)
