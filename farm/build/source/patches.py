"""The recipe's patches (the loaded `Patch` values: file, path, `when`), applied in order to a fresh
tree: `.py` scripts run in the tree, the rest go through `git apply`; `when` selects them per
platform and CUDA line. A patch that does not apply, or a script that fails, fails the cell.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from farm.build.source.base import git_error_line
from farm.errors import PatchFailed
from farm.process import run
from farm.recipes.model import Patch


def apply_patches(
    work_dir: Path, patches: Sequence[Patch], *, platform: str, cuda: str,
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """Apply the loaded recipe's patches in order, those whose `when` matches (`platform`, `cuda`):
    `.py` files run as patch scripts in the tree, anything else goes through `git apply`.
    Returns ((file, sha256) applied, files skipped)."""
    applied, skipped = [], []
    for patch in patches:
        if not patch.applies(platform, cuda):
            skipped.append(patch.file)
            continue
        if patch.is_script:
            _run_patch_script(patch.path, Path(work_dir), patch.file)
        else:
            _git_apply(patch.path, Path(work_dir), patch.file)
        applied.append((patch.file, hashlib.sha256(patch.path.read_bytes()).hexdigest()))
    return tuple(applied), tuple(skipped)


def _git_apply(patch: Path, tree: Path, rel: str) -> None:
    # The ceiling keeps git from treating an enclosing repository as the patch's root.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.resolve().parent), LC_ALL="C")
    run(["git", "apply", "--whitespace=nowarn", patch.resolve()], cwd=tree, env=env,
        error=PatchFailed, what=f"patch {rel} does not apply", explain=git_error_line)


def _run_patch_script(script: Path, tree: Path, rel: str) -> None:
    """A patch script runs once in a fresh tree, without network where this process can make
    a network namespace (root with unshare), with the tree as its working directory."""
    cmd = [sys.executable, str(script.resolve())]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("unshare"):   # not on Windows
        cmd = ["unshare", "--net", "--", *cmd]
    proc = run(cmd, cwd=tree)
    if proc.returncode != 0:
        raise PatchFailed(f"patch script {rel} failed (exit {proc.returncode}): {git_error_line(proc.stderr)}")
