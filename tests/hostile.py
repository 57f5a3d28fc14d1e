"""The malformed-input corpus's one rule, shared by every area's cases (recipes, CLI values,
wheels, HTTP requests): a bad input gets exactly one line on stderr, the right exit code,
no traceback, and nothing written half-way.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def assert_one_line_refusal(res: subprocess.CompletedProcess, code: int = 2, needle: str | None = None,
                            max_len: int = 1000) -> str:
    """`res` (a finished `farm` child) refused in one short line with exit `code`; returns that line."""
    err = res.stderr
    assert "Traceback" not in err, err[-3000:]
    assert res.returncode == code, f"exit {res.returncode}, wanted {code}: {err[-2000:]}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"wanted one line on stderr, got {len(lines)}: {err[-2000:]}"
    assert len(lines[0]) <= max_len, f"an error line of {len(lines[0])} characters"
    if needle is not None:
        assert needle in lines[0], lines[0]
    return lines[0]


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its (size, mtime_ns): compare before and after to see that
    nothing was written, created or removed."""
    if not root.exists():
        return {}
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            state[str(p.relative_to(root))] = (st.st_size if not p.is_dir() else 0, st.st_mtime_ns)
    return state


def assert_recipe_check_refuses(tmp_path: Path, text: str, needle: str) -> None:
    """`farm recipes check --dir` on a folder holding only `pkg.yml` with `text`: one line naming the file
    and `needle`, exit 2, nothing written."""
    from farmcli import run_farm

    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "pkg.yml").write_text(text)
    before = tree_state(tmp_path)
    res = run_farm("recipes", "check", "--dir", str(folder), timeout=60)
    assert_one_line_refusal(res, 2, f"farm: {folder}/pkg.yml: {needle}")
    assert tree_state(tmp_path) == before
