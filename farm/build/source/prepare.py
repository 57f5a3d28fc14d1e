"""Build step 1 for one cell (design.md §6): fetch the source, add the extra sources,
apply the patches, and put the tree in place as the cell's work dir.

The work dir is assembled in a temporary sibling and renamed into place only
when fetching, extra sources and patches all succeeded: a failure leaves no
half-made work dir. Functions take plain values (the recipe's mappings and
strings), not a Recipe, so any caller can use them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from farm.build import gitsparse
from farm.build.source.archive import ARCHIVE_SUFFIXES, archive_name, download, extract_archive, fetch_sdist
from farm.build.source.base import (
    check_sha256,
    inside,
    sources_cache,
)
from farm.build.source.git import FULL_SHA, checkout, ensure_mirror, fetch_git, read_exclude, resolve_ref
from farm.build.source.local import copy_path
from farm.build.source.patches import apply_patches
from farm.errors import BadInput
from farm.settings import recipes_dir


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

    def key_inputs(self) -> dict:
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

    def record(self) -> dict:
        """For the build record and farm_build.json."""
        out = self.key_inputs()
        out.update(
            description=self.description,
            commit=self.commit,
            sha256=self.sha256,
            skipped_patches=list(self.skipped_patches),
            work_dir=str(self.work_dir),
        )
        return out


def prepare_source(
    source: Mapping,
    work_dir: Path,
    *,
    name: str,
    platform: str,
    cuda: str,
    submodules: bool = False,
    extra_sources: Sequence[Mapping] = (),
    patches: Sequence[Mapping] = (),
    patches_dir: Path | None = None,
    base_dir: Path | None = None,
    where: str | None = None,
) -> SourceResult:
    """Step 1 for one cell: fetch `source` (the recipe's `source` mapping) into `work_dir`.

    `source` is `{git: {url, ref, commit?, exclude?}}`, `{sdist: {url | pypi, sha256}}` or
    `{path: DIR}` (relative to `base_dir`, default the project root).
    `extra_sources` are `[{url, sha256, dest} | {git, commit, dest, exclude?}]`; `patches` are `[{file, when?}]`
    under `patches_dir` (default recipes/patches/<name>/), selected for
    (`platform`, `cuda`). `work_dir` is replaced as a whole on success and left
    untouched on failure. `where` names the recipe file in error messages.
    """
    where = where or f"recipes/{name}.yml"
    work_dir = Path(work_dir)
    if not isinstance(source, Mapping) or len(source) != 1:
        raise BadInput(where, "source", source, "expected exactly one of git, sdist, path")
    (kind, spec), = source.items()
    patches_dir = Path(patches_dir) if patches_dir else recipes_dir() / "patches" / name

    work_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=work_dir.parent, prefix=f".{work_dir.name}.partial-"))
    tree = staging / "tree"
    try:
        if kind == "git":
            if not isinstance(spec, Mapping):
                raise BadInput(where, "source.git", spec, "expected {url, ref, commit?, exclude?}")
            got = fetch_git(
                spec.get("url"), spec.get("ref"), tree, commit=spec.get("commit"),
                submodules=submodules, exclude=spec.get(gitsparse.KEY), where=where,
            )
        elif kind == "sdist":
            if not isinstance(spec, Mapping):
                raise BadInput(where, "source.sdist", spec, "expected {url or pypi, sha256}")
            got = fetch_sdist(
                tree, sha256=spec.get("sha256"), url=spec.get("url"), pypi=spec.get("pypi"), where=where,
            )
        elif kind == "path":
            got = copy_path(spec, tree, base_dir=base_dir, where=where)
        else:
            raise BadInput(where, "source", kind, "expected one of git, sdist, path")

        extras = fetch_extra_sources(tree, extra_sources, where=where)
        applied, skipped = apply_patches(tree, patches, patches_dir, platform=platform, cuda=cuda, where=where)
        _move_into_place(tree, work_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    desc = got.description
    if applied:
        desc += f" + {len(applied)} patch(es)"
    return SourceResult(
        work_dir=work_dir, kind=got.kind, pin=got.pin, description=desc, commit=got.commit,
        sha256=got.sha256, submodules=got.submodules, extra_sources=extras,
        patches=applied, skipped_patches=skipped, exclude=got.exclude,
    )


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


def _pinned_git(item: Mapping, where: str, key: str) -> tuple[str, str]:
    """The repository URL and the commit of a git extra source."""
    url, commit = item["git"], item.get("commit")
    if not isinstance(url, str):
        raise BadInput(where, f"{key}.git", url, "expected a repository URL")
    if not isinstance(commit, str) or not FULL_SHA.match(commit):
        # A tag could be moved upstream; only a commit names the tree for good.
        raise BadInput(where, f"{key}.commit", commit, "expected a full 40-hex commit SHA (no tag)")
    return url, commit


def fetch_extra_sources(work_dir: Path, items: Iterable[Mapping], *, where: str = "recipe") -> tuple:
    """Each item is an archive `{url, sha256, dest}` or a pinned git tree `{git, commit, dest, exclude?}`.

    Archives are cached by their sha256 and checked before use, then extracted into `dest`
    (single top folder removed); other files are written to `dest`. A git tree goes through the
    main source's mirror and checkout (same cache, same `exclude` handling) at exactly `commit`."""
    done: list[tuple[str, ...]] = []   # (dest, url, commit) of a git tree, (dest, sha256) of an archive
    for i, item in enumerate(items or ()):
        key = f"extra_sources[{i}]"
        is_git = isinstance(item, Mapping) and "git" in item
        if not isinstance(item, Mapping) or not (item.get("git") if is_git else item.get("url")):
            raise BadInput(where, key, item, "expected {url, sha256, dest} or {git, commit, dest, exclude?}")
        if is_git:
            url, commit = _pinned_git(item, where, key)
            patterns = read_exclude(item.get(gitsparse.KEY), where, f"{key}.{gitsparse.KEY}")
        else:
            url = item["url"]
            sha256 = check_sha256(item.get("sha256"), where, f"{key}.sha256")
        target = inside(Path(work_dir), item.get("dest"), where, f"{key}.dest")
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise BadInput(where, f"{key}.dest", item.get("dest"), "already exists in the source tree")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            target.rmdir()
        if is_git:
            mirror = ensure_mirror(url)
            sha = resolve_ref(mirror, url, commit, where, f"{key}.commit")
            checkout(mirror, url, sha, target, False, prefix="", where=where, exclude=patterns,
                      exclude_key=f"{key}.{gitsparse.KEY}")
            done.append((str(item["dest"]), url, sha))
            continue
        cached = download(url, sources_cache() / "extra" / sha256 / archive_name(url), sha256, where, f"{key}.sha256")
        if cached.name.lower().endswith(ARCHIVE_SUFFIXES):
            extract_archive(cached, target, strip_top=True)
        else:
            shutil.copyfile(cached, target)
        done.append((str(item["dest"]), sha256))
    return tuple(done)
