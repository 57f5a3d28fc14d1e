"""Build step 1 for one cell (design.md §6): fetch the source, add the extra sources,
apply the patches, and put the tree in place as the cell's work dir.

The work dir is assembled in a temporary sibling and renamed into place only
when fetching, extra sources and patches all succeeded: a failure leaves no
half-made work dir. The inputs are the loaded recipe's typed parts (`Source`,
`ExtraSource`, `Patch`, as the step spec carries them), which the recipe loader
checked: this step checks only what the fetched world says (a tag that does not
resolve, a download whose sha256 differs, blobs upstream lacks, a `dest` the tree
already has or leads out of through a link, a patch that does not apply).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from farm.build.source.archive import ARCHIVE_SUFFIXES, archive_name, download, extract_archive, fetch_sdist
from farm.build.source.base import Fetched, sources_cache
from farm.build.source.git import checkout, ensure_mirror, fetch_git, resolve_ref
from farm.build.source.local import copy_path
from farm.build.source.patches import apply_patches
from farm.errors import BadInput
from farm.recipes import gitsparse
from farm.recipes.model import ExtraSource, Patch, Source


@dataclass(frozen=True)
class SourceResult:
    """What the source step produced: where the tree is and what exactly it is."""

    work_dir: Path
    kind: str                                      # git | sdist | path
    pin: str                                       # commit SHA | sdist sha256 | path content digest
    description: str                               # one line for logs and records
    commit: str | None = None                      # git only
    sha256: str | None = None                      # sdist only
    submodules: tuple[tuple[str, str], ...] = ()   # (path, commit), recursive, sorted
    extra_sources: tuple[tuple[str, ...], ...] = ()  # (dest, sha256) | (dest, git url, commit)
    patches: tuple[tuple[str, str], ...] = ()      # (file, sha256) applied, in order
    skipped_patches: tuple[str, ...] = ()          # files whose `when` did not match
    exclude: tuple[str, ...] = ()                  # git only: paths left out of the checkout
    source_date_epoch: int = 0                     # SOURCE_DATE_EPOCH of the tree (design.md §6.5)

    def key_inputs(self) -> dict[str, Any]:
        """The semantic inputs for the build key (design.md §5.4): no paths, no descriptions."""
        out = {
            "kind": self.kind,
            "pin": self.pin,
            "submodules": [list(s) for s in self.submodules],
            "extra_sources": [list(e) for e in self.extra_sources],
            "patches": [list(p) for p in self.patches],
        }
        if self.exclude:    # only when given: every other source keys as before
            out["exclude"] = list(self.exclude)
        return out

    def record(self) -> dict[str, Any]:
        """For the build record and farm_build.json."""
        out = self.key_inputs()
        out.update(
            description=self.description,
            commit=self.commit,
            sha256=self.sha256,
            skipped_patches=list(self.skipped_patches),
            work_dir=str(self.work_dir),
            source_date_epoch=self.source_date_epoch,
        )
        return out


def prepare_source(
    source: Source,
    work_dir: Path,
    *,
    platform: str,
    cuda: str,
    submodules: bool = False,
    extra_sources: Sequence[ExtraSource] = (),
    patches: Sequence[Patch] = (),
    where: str = "recipe",
) -> SourceResult:
    """Step 1 for one cell: fetch `source` into `work_dir`, place `extra_sources` in it, and apply the
    `patches` whose `when` matches (`platform`, `cuda`). `work_dir` is replaced as a whole on success
    and left untouched on failure. `where` names the recipe file in error messages."""
    work_dir = Path(work_dir)
    work_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=work_dir.parent, prefix=f".{work_dir.name}.partial-"))
    tree = staging / "tree"
    try:
        got = _fetch(source, tree, submodules, where)
        extras = fetch_extra_sources(tree, extra_sources, where=where)
        applied, skipped = apply_patches(tree, patches, platform=platform, cuda=cuda)
        _move_into_place(tree, work_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    desc = got.description
    if applied:
        desc += f" + {len(applied)} patch(es)"
    return SourceResult(
        work_dir=work_dir, kind=got.kind, pin=got.pin, description=desc, commit=got.commit,
        sha256=got.sha256, submodules=got.submodules, extra_sources=extras,
        patches=applied, skipped_patches=skipped, exclude=got.exclude, source_date_epoch=got.date_epoch,
    )


def _fetch(source: Source, tree: Path, submodules: bool, where: str) -> Fetched:
    # The loader set the fields of the source's kind (git: url and ref; sdist: sha256 and one of
    # url, pypi; path: the folder resolved against the recipe's): the casts only tell mypy so.
    if source.kind == "git":
        return fetch_git(cast(str, source.url), cast(str, source.ref), tree, commit=source.commit,
                         submodules=submodules, exclude=source.exclude, where=where)
    if source.kind == "sdist":
        return fetch_sdist(tree, sha256=cast(str, source.sha256), url=source.url, pypi=source.pypi, where=where)
    return copy_path(cast(Path, source.path), tree, written=cast(str, source.path_text), where=where)


def _move_into_place(tree: Path, work_dir: Path) -> None:
    if work_dir.exists() or work_dir.is_symlink():
        if os.path.ismount(work_dir):
            # A mount point (e.g. a runner's volume) cannot be renamed over: refill it.
            for child in work_dir.iterdir():
                _remove(child)
            for child in tree.iterdir():
                shutil.move(str(child), work_dir / child.name)
            return
        _remove(work_dir)
    os.replace(tree, work_dir)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def fetch_extra_sources(work_dir: Path, items: Sequence[ExtraSource], *, where: str = "recipe") -> tuple[Any, ...]:
    """Place each extra source at its `dest` in the fetched tree: an archive (cached by its sha256
    and checked before use, extracted without its single top folder; any other file is copied
    as is) or a pinned git tree (through the main source's mirror and checkout, same cache, same
    `exclude` handling, at exactly `commit`). A `dest` the tree already has, or reaches through a
    link leading out of it, is refused."""
    done: list[tuple[str, ...]] = []   # (dest, url, commit) of a git tree, (dest, sha256) of an archive
    root = Path(work_dir).resolve()
    for i, item in enumerate(items):
        key = f"extra_sources[{i}]"
        target = Path(work_dir) / item.dest
        if target.is_symlink() or (target.exists() and (not target.is_dir() or any(target.iterdir()))):
            raise BadInput(where, f"{key}.dest", item.dest, "already exists in the source tree")
        if not _stays_inside(target, root):
            raise BadInput(where, f"{key}.dest", item.dest,
                           "leads outside the source tree through a link in it (or a link loop)")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            target.rmdir()
        if item.commit is not None:
            mirror = ensure_mirror(item.url)
            sha = resolve_ref(mirror, item.url, item.commit, where, f"{key}.commit")
            checkout(mirror, item.url, sha, target, False, prefix="", where=where, exclude=item.exclude,
                     exclude_key=f"{key}.{gitsparse.KEY}")
            done.append((item.dest, item.url, sha))
            continue
        sha256 = cast(str, item.sha256)   # an archive always carries one (the loader's rule)
        cached = download(item.url, sources_cache() / "extra" / sha256 / archive_name(item.url), sha256, where,
                          f"{key}.sha256")
        if cached.name.lower().endswith(ARCHIVE_SUFFIXES):
            extract_archive(cached, target, strip_top=True)
        else:
            shutil.copyfile(cached, target)
        done.append((item.dest, sha256))
    return tuple(done)


def _stays_inside(target: Path, root: Path) -> bool:
    """The loader allows only relative dests without '..'; a link the fetched tree holds can still lead out."""
    try:
        return target.parent.resolve().is_relative_to(root)
    except (OSError, RuntimeError):   # a link loop (RuntimeError before Python 3.13)
        return False
