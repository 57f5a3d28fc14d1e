"""`source.git.exclude`: paths of a repository its build never reads (design.md §4.3, issue 15).

The patterns follow git's sparse-checkout (gitignore) syntax: `assets/` is a folder anywhere,
`/assets/` only the top one, `*.png` a name anywhere. The source step checks the commit out
with `/*` plus one `!pattern` line each (a non-cone sparse checkout), so git never reads an
excluded blob: a snapshot that lacks them (files over a size limit, LFS content) still builds.
This module is what the recipe loader and the source step share; it imports nothing heavy.
"""

from __future__ import annotations

from pathlib import PurePosixPath

KEY = "exclude"


def pattern_problem(pattern: object) -> str | None:
    """Why `pattern` cannot be an exclude pattern, or None when it can."""
    if not isinstance(pattern, str):
        return "expected a pattern string"
    if not pattern.strip():
        return "must not be empty"
    if pattern != pattern.strip():
        return "leading or trailing blanks (git would read a different pattern)"
    if any(c in pattern for c in "\n\r\0"):
        return "a line break or NUL would split it into several patterns"
    if pattern.startswith("!"):
        return "a '!' re-include is not an exclude: list only the paths to leave out"
    if ".." in PurePosixPath(pattern.lstrip("/")).parts:
        return "'..' leads outside the repository"
    if not pattern.strip("/*"):
        return "would exclude the whole tree"
    return None


def sparse_spec(patterns: tuple[str, ...]) -> str:
    """The `info/sparse-checkout` text: everything, then each excluded pattern negated."""
    return "/*\n" + "".join(f"!{p}\n" for p in patterns)
