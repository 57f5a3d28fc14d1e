"""The recipe's patches, applied in order to a fresh tree: `.py` scripts run in the tree, the rest go
through `git apply`; `when` selects them per platform and CUDA line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from farm.build.source.base import git_error_line, inside
from farm.errors import BadInput, PatchFailed
from farm.process import run
from farm.recipes.model import when_matches
from farm.settings import display


def apply_patches(
    work_dir: Path, patches: Sequence[Mapping], patches_dir: Path, *, platform: str, cuda: str,
    where: str = "recipe",
) -> tuple[tuple, tuple]:
    """Apply `[{file, when?}]` in order: `.py` files run as patch scripts in the tree, anything
    else goes through `git apply`. Returns ((file, sha256) applied, files skipped)."""
    applied, skipped = [], []
    for i, item in enumerate(patches or ()):
        key = f"patches[{i}]"
        if isinstance(item, str):
            item = {"file": item}
        if not isinstance(item, Mapping) or not isinstance(item.get("file"), str):
            raise BadInput(where, key, item, "expected {file, when?}")
        rel = item["file"]
        path = inside(Path(patches_dir), rel, where, f"{key}.file")
        if not path.is_file():
            raise BadInput(where, f"{key}.file", rel, f"no such file in {display(patches_dir)}")
        when = item.get("when")
        if when is not None and not isinstance(when, Mapping):
            raise BadInput(where, f"{key}.when", when, "expected {platform?, cuda?}")
        try:
            matches = when_matches(when, platform, cuda)
        except ValueError as exc:
            raise BadInput(where, f"{key}.when.cuda", str(exc), "expected a CUDA line like 12.8 or >=12.8") from None
        if not matches:
            skipped.append(rel)
            continue
        if path.suffix == ".py":
            _run_patch_script(path, Path(work_dir), rel)
        else:
            _git_apply(path, Path(work_dir), rel)
        applied.append((rel, hashlib.sha256(path.read_bytes()).hexdigest()))
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
    if os.geteuid() == 0 and shutil.which("unshare"):
        cmd = ["unshare", "--net", "--", *cmd]
    proc = run(cmd, cwd=tree)
    if proc.returncode != 0:
        raise PatchFailed(f"patch script {rel} failed (exit {proc.returncode}): {git_error_line(proc.stderr)}")
