"""Build step 1, source (SPEC 8.1): fetch, verify, copy to a per-cell work dir, patch.

Three kinds of source, each cached by its pin under cache_dir()/sources:

- git:   a bare mirror per URL (sources/git/), fetched without blobs (a
         partial clone); the ref (full SHA or tag) is resolved to a commit, which
         must equal the recipe's `commit` when one is given; the blobs a checkout
         needs are fetched into the mirror per commit, leaving out the paths the
         recipe's `exclude` names (farm/build/gitsparse.py), so a file upstream lacks is
         never asked for; submodules are fetched from their own mirrors and recorded.
- sdist: the archive per sha256 (sources/sdist/<sha256>/); a PyPI
         `name==version` is resolved to its sdist URL through PyPI's JSON API.
         The sha256 is checked before anything is extracted, and members with
         absolute paths, `..`, links leading outside, or device files refuse
         the whole archive.
- path:  a local folder, copied (no cache); its content digest is the pin.

The work dir is assembled in a temporary sibling and renamed into place only
when fetching, extra sources and patches all succeeded: a failure leaves no
half-made work dir. Functions take plain values (the recipe's mappings and
strings), not a Recipe, so any caller can use them.
"""

from __future__ import annotations

import hashlib
import html
import os
import posixpath
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import urljoin

import requests
from filelock import FileLock
from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from farm.build import gitsparse
from farm.errors import BadInput, FarmError, shorten
from farm.paths import PROJECT_ROOT, cache_dir, display, recipes_dir
from farm.versions import vtuple

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
BRANCH_LIKE = {"HEAD", "main", "master", "develop", "dev", "trunk"}
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar", ".zip")
# Left out of a local path copy and its digest: artefacts of earlier in-place builds.
_PATH_IGNORED_ANYWHERE = ("__pycache__", "*.egg-info", ".git", "*.pyc")
_PATH_IGNORED_TOP = ("build", "dist", ".eggs")
_HTTP_TIMEOUT = (15, 300)


class SourceError(FarmError):
    """Fetching or preparing a source failed (network, unsafe archive, git, patch)."""


class UnsafeArchive(SourceError):
    """An archive member would land outside the extraction folder."""


class PatchFailed(SourceError):
    """A recipe patch did not apply."""


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
        """The semantic inputs for the build key (SPEC 7.4): no paths, no descriptions."""
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


# ----------------------------------------------------------------- entry point


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


def sources_cache() -> Path:
    return cache_dir() / "sources"


# ------------------------------------------------------------------------- git


def _git(args: Sequence[str], cwd: Path | None = None, check: bool = True,
         input: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C", GIT_ASKPASS="true")
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    # Local mirrors are cloned over the file transport, which git refuses for submodules by default.
    cmd = ["git", "-c", "protocol.file.allow=always", "-c", "advice.detachedHead=false", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, input=input)
    if check and proc.returncode != 0:
        raise SourceError(f"git {' '.join(args[:2])} failed: {_last_error_line(proc.stderr)}")
    return proc


def _last_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("fatal:", "error:")):
            return ln
    return lines[-1] if lines else "no output"


_UPLOAD_PACK = "git -c uploadpack.allowFilter=true -c uploadpack.allowAnySHA1InWant=true upload-pack"


def _upload_pack(repo: Path) -> list[str]:
    """A repository on this machine (a path, or a URL insteadOf maps to one) answers through a
    local upload-pack, which refuses filters and single-blob wants unless told; forges allow
    both and an ssh forge would refuse a changed command, so remote URLs get nothing."""
    url = _git(["ls-remote", "--get-url", "origin"], cwd=repo, check=False).stdout.strip()
    remote = re.match(r"^[a-z][a-z0-9+.-]*://", url) and not url.startswith("file://")
    if remote or re.match(r"^[^/]+@[^/:]+:", url):
        return []
    return ["--upload-pack", _UPLOAD_PACK]


def _mirror_path(url: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", url.rstrip("/").rsplit("/", 1)[-1])[:40] or "repo"
    return sources_cache() / "git" / f"{slug}-{hashlib.sha256(url.encode()).hexdigest()[:16]}.git"


def _ensure_mirror(url: str) -> Path:
    """A bare mirror of `url` in the cache (cloned once; fetched on demand by the callers)."""
    mirror = _mirror_path(url)
    mirror.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(mirror) + ".lock"):
        if not (mirror / "HEAD").exists():
            tmp = Path(tempfile.mkdtemp(dir=mirror.parent, prefix=".clone-"))
            try:
                # Branches and tags only: a --mirror would also drag in every refs/pull/* of a forge.
                bare = tmp / "m.git"
                _git(["init", "--quiet", "--bare", str(bare)])
                _git(["remote", "add", "origin", url], cwd=bare)
                _git(["config", "remote.origin.fetch", "+refs/heads/*:refs/heads/*"], cwd=bare)
                _git(["config", "--add", "remote.origin.fetch", "+refs/tags/*:refs/tags/*"], cwd=bare)
                # Commits and trees only: blobs come per checkout (_fill_blobs), so a blob
                # upstream lacks fails only a checkout that needs it, naming its path.
                proc = _git(["fetch", "--quiet", "--filter=blob:none", *_upload_pack(bare), "origin"],
                            cwd=bare, check=False)
                if proc.returncode != 0:
                    raise SourceError(f"cannot fetch {url}: {_last_error_line(proc.stderr)}")
                os.replace(bare, mirror)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return mirror


def _fetch_mirror(mirror: Path, url: str, sha: str | None = None) -> None:
    """Update the mirror; with `sha`, also fetch that commit and pin it under refs/farm/."""
    with FileLock(str(mirror) + ".lock"):
        _git(["fetch", "--quiet", "--force", *_upload_pack(mirror), "origin"], cwd=mirror, check=False)
        if sha and not _has_commit(mirror, sha):
            _git(["fetch", "--quiet", *_upload_pack(mirror), "origin", sha], cwd=mirror, check=False)
        if sha and _has_commit(mirror, sha):
            # Keeps a commit no branch or tag reaches available to clones of the mirror.
            _git(["update-ref", f"refs/farm/{sha}", sha], cwd=mirror)


def _has_commit(repo: Path, sha: str) -> bool:
    return _git(["cat-file", "-e", f"{sha}^{{commit}}"], cwd=repo, check=False).returncode == 0


def _rev(repo: Path, ref: str) -> str | None:
    proc = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=repo, check=False)
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def _resolve_ref(mirror: Path, url: str, ref: str, where: str, key: str = "source.git.ref") -> str:
    """A full SHA or a tag -> the commit it names; branches are refused (they move)."""
    if FULL_SHA.match(ref):
        if not _has_commit(mirror, ref):
            _fetch_mirror(mirror, url, ref)
        if not _has_commit(mirror, ref):
            raise BadInput(where, key, ref, f"no such commit in {url}")
        return ref
    if ref in BRANCH_LIKE:
        raise BadInput(where, key, ref, "a branch moves: pin a tag (with its commit) or a full commit SHA")
    sha = _rev(mirror, f"refs/tags/{ref}")
    if sha is None:
        _fetch_mirror(mirror, url)
        sha = _rev(mirror, f"refs/tags/{ref}")
    if sha is None:
        if _rev(mirror, f"refs/heads/{ref}"):
            raise BadInput(where, "source.git.ref", ref,
                           "is a branch, which moves: pin a tag (with its commit) or a full commit SHA")
        raise BadInput(where, "source.git.ref", ref, f"no such tag or full commit SHA in {url}")
    return sha


@dataclass(frozen=True)
class _Fetched:
    kind: str
    pin: str
    description: str
    commit: str | None = None
    sha256: str | None = None
    submodules: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    exclude: tuple[str, ...] = ()


def _read_exclude(value: object, where: str, key: str = f"source.git.{gitsparse.KEY}") -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise BadInput(where, key, value, "expected a list of path patterns (git sparse-checkout syntax)")
    for i, pattern in enumerate(value):
        problem = gitsparse.pattern_problem(pattern)
        if problem:
            raise BadInput(where, f"{key}[{i}]", pattern, problem)
    return tuple(value)


def fetch_git(
    url: str, ref: str, dest: Path, *, commit: str | None = None, submodules: bool = False,
    exclude: Sequence[str] | None = None, where: str = "recipe",
) -> _Fetched:
    """Clone `url` at `ref` into `dest` (must not exist) through the cache; check `commit` when given.

    `exclude`: sparse-checkout patterns of paths the build never reads (farm/build/gitsparse.py); a
    pattern under a submodule's path applies inside that submodule."""
    if not url or not isinstance(url, str):
        raise BadInput(where, "source.git.url", url, "expected a repository URL")
    if not ref or not isinstance(ref, str):
        raise BadInput(where, "source.git.ref", ref, "expected a tag or a full commit SHA")
    if commit is not None and (not isinstance(commit, str) or not FULL_SHA.match(commit)):
        raise BadInput(where, "source.git.commit", commit, "expected a full 40-hex commit SHA")
    patterns = _read_exclude(exclude, where)
    mirror = _ensure_mirror(url)
    sha = _resolve_ref(mirror, url, ref, where)
    if commit is not None and sha != commit:
        # The cache may hold an old tag: look upstream once before blaming the recipe.
        _fetch_mirror(mirror, url)
        sha = _resolve_ref(mirror, url, ref, where)
        if sha != commit:
            raise BadInput(where, "source.git.commit", commit, f"ref {ref!r} of {url} resolves to {sha}, not {commit}")
    subs = _checkout(mirror, url, sha, Path(dest), submodules, prefix="", where=where, exclude=patterns)
    shown = ref if ref == sha else f"{ref} ({sha[:12]})"
    desc = f"git {url} @ {shown}" + (f" with {len(subs)} submodule(s)" if subs else "")
    if patterns:
        desc += f" without {', '.join(patterns)}"
    return _Fetched("git", sha, desc, commit=sha, submodules=tuple(sorted(subs)), exclude=patterns)


def _checkout(mirror: Path, url: str, sha: str, dest: Path, submodules: bool, prefix: str, where: str,
              exclude: tuple[str, ...] = (), exclude_key: str = f"source.git.{gitsparse.KEY}") -> list:
    if not _rev(mirror, f"refs/farm/{sha}"):
        with FileLock(str(mirror) + ".lock"):
            _git(["update-ref", f"refs/farm/{sha}", sha], cwd=mirror)
    own = tuple(p for p in exclude if not _under_gitlink(p, mirror, sha))
    _clone_with_blobs(mirror, url, sha, dest, own, prefix, where, exclude_key)
    if own:
        # Non-cone sparse checkout: git never reads an excluded blob (gitsparse.sparse_spec).
        (dest / ".git" / "info").mkdir(exist_ok=True)
        (dest / ".git" / "info" / "sparse-checkout").write_text(gitsparse.sparse_spec(own))
        _git(["config", "core.sparseCheckout", "true"], cwd=dest)
        _git(["config", "core.sparseCheckoutCone", "false"], cwd=dest)
    _git(["checkout", "--quiet", "--detach", sha], cwd=dest)
    # Build scripts that read the remote see the real upstream, not the cache.
    _git(["remote", "set-url", "origin", url], cwd=dest)
    if not submodules:
        return []
    return _checkout_submodules(dest, url, prefix, where, exclude)


def _under_gitlink(pattern: str, repo: Path, sha: str) -> bool:
    """True when `pattern` names a path inside a submodule of `sha` (it is that submodule's to apply)."""
    head = pattern.lstrip("/").split("/")
    for n in range(1, len(head)):
        listing = _git(["ls-tree", sha, "--", "/".join(head[:n])], cwd=repo, check=False).stdout.split()
        if len(listing) >= 3 and listing[1] == "commit":
            return bool("/".join(head[n:]).strip("/"))   # the gitlink itself is the top repo's
        if not listing or listing[1] != "tree":
            return False
    return False


def _clone_with_blobs(mirror: Path, url: str, sha: str, dest: Path, exclude: tuple[str, ...],
                      prefix: str, where: str, exclude_key: str) -> None:
    """A no-checkout clone of the mirror that holds every blob the checkout of `sha` reads.

    The mirror is blobless (or older and complete): the blobs `sha` needs, minus the excluded
    paths, are fetched into it once per commit; the clone is remade when that brought any."""
    _git(["clone", "--quiet", "--no-checkout", str(mirror), str(dest)])
    if not _has_commit(dest, sha):
        _git(["fetch", "--quiet", "origin", f"refs/farm/{sha}"], cwd=dest)
    wanted = _wanted_blobs(dest, sha, exclude)
    absent = _absent(dest, wanted)
    if not absent:
        return
    unavailable = _fill_blobs(mirror, url, absent)
    shutil.rmtree(dest)
    _git(["clone", "--quiet", "--no-checkout", str(mirror), str(dest)])
    absent = _absent(dest, wanted)
    if absent:
        paths = sorted(p for oid in (unavailable & absent or absent) for p in wanted[oid])
        shown = ", ".join(paths[:6]) + (f" and {len(paths) - 6} more" if len(paths) > 6 else "")
        folders = sorted({"/" + p.rsplit("/", 1)[0] + "/" if "/" in p else "/" + p for p in paths})
        hint = ", ".join(f"'{prefix}{f.lstrip('/') if prefix else f}'" for f in folders[:4])
        raise SourceError(shorten(
            f"{where}: {url} @ {sha[:12]}: {len(paths)} file(s) of the checkout are missing upstream "
            f"({shown}): if the build never reads them, list them under {exclude_key} "
            f"(e.g. {hint})", 600))


def _wanted_blobs(repo: Path, sha: str, exclude: tuple[str, ...]) -> dict[str, list[str]]:
    """oid -> paths of the blobs a checkout of `sha` reads: all of them but the excluded paths."""
    wanted: dict[str, list[str]] = {}
    for entry in _git(["ls-tree", "-r", "-z", sha], cwd=repo).stdout.split("\0"):
        meta, _, path = entry.partition("\t")
        parts = meta.split()
        if len(parts) == 3 and parts[1] == "blob":
            wanted.setdefault(parts[2], []).append(path)
    if exclude:
        # git's own matcher decides (gitignore rules = the sparse-checkout's), so what is left
        # out here is exactly what the sparse checkout will not read.
        with tempfile.NamedTemporaryFile("w", suffix=".exclude") as spec:
            spec.write("".join(f"{p}\n" for p in exclude))
            spec.flush()
            paths = "".join(f"{p}\0" for ps in wanted.values() for p in ps)
            proc = _git(["-c", f"core.excludesFile={spec.name}", "check-ignore", "--no-index", "-z", "--stdin"],
                        cwd=repo, check=False, input=paths)
            if proc.returncode not in (0, 1):
                raise SourceError(f"git check-ignore failed: {_last_error_line(proc.stderr)}")
        dropped = set(proc.stdout.split("\0"))
        wanted = {oid: kept for oid, ps in wanted.items() if (kept := [p for p in ps if p not in dropped])}
    return wanted


def _absent(repo: Path, oids: Iterable[str]) -> set[str]:
    """The objects `repo` lacks (the clone is not a partial one, so nothing is fetched to answer)."""
    proc = _git(["cat-file", "--batch-check=%(objectname)"], cwd=repo, input="".join(f"{o}\n" for o in oids))
    return {ln.split()[0] for ln in proc.stdout.splitlines() if ln.endswith(" missing")}


def _fill_blobs(mirror: Path, url: str, oids: set[str]) -> set[str]:
    """Fetch `oids` into the mirror; returns those upstream does not have. A local upload-pack stops
    at the first unreadable object and names it, so each is set aside and the rest asked again."""
    unavailable: set[str] = set()
    remaining = set(oids)
    with FileLock(str(mirror) + ".lock"):
        while remaining:
            proc = _git(["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--recurse-submodules=no",
                         "--filter=blob:none", *_upload_pack(mirror), "--stdin", "origin"], cwd=mirror,
                        check=False, input="".join(f"{o}\n" for o in sorted(remaining)))
            if proc.returncode == 0:
                break
            named = set(re.findall(r"\b[0-9a-f]{40}\b", proc.stderr)) & remaining
            if not named:
                unavailable |= remaining   # upstream says no without naming one: all stay absent
                break
            unavailable |= named
            remaining -= named
    return unavailable


def _checkout_submodules(repo: Path, super_url: str, prefix: str, where: str,
                         exclude: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    if not (repo / ".gitmodules").is_file():
        return []
    proc = _git(["config", "-f", ".gitmodules", "--get-regexp", r"^submodule\..*\.(path|url)$"], cwd=repo, check=False)
    table: dict[str, dict[str, str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        name, _, attr = key[len("submodule."):].rpartition(".")
        table.setdefault(name, {})[attr] = value
    found: list[tuple[str, str]] = []
    for _name, entry in sorted(table.items()):
        path, sub_url = entry.get("path"), entry.get("url")
        if not path or not sub_url:
            continue
        listing = _git(["ls-tree", "HEAD", "--", path], cwd=repo).stdout.split()
        if len(listing) < 3 or listing[1] != "commit":
            continue  # declared in .gitmodules but not a gitlink at this commit
        sub_sha = listing[2]
        sub_url = _resolve_submodule_url(super_url, sub_url)
        shown = f"{prefix}{path}"
        mirror = _ensure_mirror(sub_url)
        if not _has_commit(mirror, sub_sha):
            _fetch_mirror(mirror, sub_url, sub_sha)
        if not _has_commit(mirror, sub_sha):
            raise SourceError(f"submodule {shown}: commit {sub_sha} not found in {sub_url}")
        target = repo / path
        if target.exists():
            shutil.rmtree(target)
        found.append((shown, sub_sha))
        inside = tuple("/" + p.lstrip("/")[len(path) + 1:] for p in exclude if p.lstrip("/").startswith(f"{path}/"))
        found += _checkout(mirror, sub_url, sub_sha, target, True, prefix=f"{shown}/", where=where,
                           exclude=inside)
    return found


def _resolve_submodule_url(super_url: str, sub_url: str) -> str:
    """Relative submodule URLs (./x, ../x) are relative to the superproject's URL, as git does."""
    if not sub_url.startswith(("./", "../")):
        return sub_url
    m = re.match(r"^([a-z][a-z0-9+.-]*://[^/]*)(/.*)?$", super_url)
    if m:
        head, tail = m.group(1), m.group(2) or "/"
        return head + posixpath.normpath(posixpath.join(tail, sub_url))
    return posixpath.normpath(posixpath.join(super_url, sub_url))


# ----------------------------------------------------------------------- sdist


def pypi_index() -> str:
    """PyPI's base URL (a setting: FARM_PYPI_URL)."""
    return os.environ.get("FARM_PYPI_URL", "https://pypi.org").rstrip("/")


def resolve_pypi_sdist(requirement: str, where: str = "recipe") -> str:
    """'name==version' -> the URL of that release's sdist, from PyPI's simple index (PEP 691 JSON,
    or PEP 503 HTML when a plain mirror answers): the interface every PyPI mirror and proxy serves."""
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)\s*", str(requirement))
    if not m:
        raise BadInput(where, "source.sdist.pypi", requirement, "expected name==version")
    name, version = m.groups()
    page = f"{pypi_index()}/simple/{canonicalize_name(name)}/"
    try:
        resp = requests.get(page, timeout=_HTTP_TIMEOUT,
                            headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    except requests.RequestException as exc:
        raise SourceError(f"cannot reach {page}: {type(exc).__name__}") from None
    if resp.status_code == 404:
        raise BadInput(where, "source.sdist.pypi", requirement, "no such project on PyPI")
    if resp.status_code != 200:
        raise SourceError(f"{page}: HTTP {resp.status_code}")
    if "json" in resp.headers.get("Content-Type", ""):
        try:
            links = [(f["filename"], f["url"]) for f in resp.json()["files"]]
        except (ValueError, KeyError, TypeError):
            raise SourceError(f"{page}: not a PEP 691 project page") from None
    else:
        links = [(html.unescape(text).strip(), html.unescape(href))
                 for href, text in re.findall(r'<a\s[^>]*href="([^"]*)"[^>]*>([^<]*)</a>', resp.text)]
    sdists = []
    for filename, url in links:
        try:
            _, file_version = parse_sdist_filename(filename)
        except (InvalidSdistFilename, InvalidVersion):
            continue
        if file_version == Version(version):
            sdists.append((not filename.endswith(".tar.gz"), urljoin(resp.url, url.split("#", 1)[0])))
    if not sdists:
        raise BadInput(where, "source.sdist.pypi", requirement, "no such release with an sdist on PyPI")
    return min(sdists)[1]


def _download(url: str, dest: Path, sha256: str, where: str, key: str) -> Path:
    """Fetch `url` to `dest` unless already cached there; the sha256 is checked before the rename."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest.parent) + ".lock"):
        if dest.is_file():
            return dest
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".download-")
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out:
                if url.startswith("file://") or "://" not in url:
                    with open(url.removeprefix("file://"), "rb") as src:
                        for chunk in iter(lambda: src.read(1 << 20), b""):
                            digest.update(chunk)
                            out.write(chunk)
                else:
                    try:
                        with requests.get(url, stream=True, timeout=_HTTP_TIMEOUT) as resp:
                            if resp.status_code != 200:
                                raise SourceError(f"cannot download {url}: HTTP {resp.status_code}")
                            for chunk in resp.iter_content(1 << 20):
                                digest.update(chunk)
                                out.write(chunk)
                    except requests.RequestException as exc:
                        raise SourceError(f"cannot download {url}: {type(exc).__name__}") from None
            if digest.hexdigest() != sha256:
                raise BadInput(where, key, sha256, f"{url} has sha256 {digest.hexdigest()}")
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return dest


def _check_sha256(value: object, where: str, key: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise BadInput(where, key, value, "expected a sha256 (64 hex digits)")
    return value.lower()


def _archive_name(url: str) -> str:
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name) or "download"


def fetch_sdist(
    dest: Path, *, sha256: str, url: str | None = None, pypi: str | None = None, where: str = "recipe",
) -> _Fetched:
    """Download (or reuse by sha256) an sdist and extract it into `dest` without its top folder."""
    sha256 = _check_sha256(sha256, where, "source.sdist.sha256")
    if bool(url) == bool(pypi):
        raise BadInput(where, "source.sdist", url or pypi, "give exactly one of url, pypi (name==version)")
    slot = sources_cache() / "sdist" / sha256
    cached = [p for p in slot.iterdir() if not p.name.startswith(".")] if slot.is_dir() else []
    if cached:
        archive = cached[0]
    else:
        real_url = url or resolve_pypi_sdist(pypi, where)
        archive = _download(real_url, slot / _archive_name(real_url), sha256, where, "source.sdist.sha256")
    extract_archive(archive, Path(dest), strip_top=True)
    shown = pypi or url
    return _Fetched("sdist", sha256, f"sdist {shown} (sha256 {sha256[:12]})", sha256=sha256)


def _unsafe_name(name: str) -> str | None:
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "absolute path"
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        return "'..' in path"
    return None


def _link_escapes(member: str, target: str, hard: bool) -> bool:
    if target.startswith("/") or re.match(r"^[A-Za-z]:", target):
        return True
    base = "" if hard else posixpath.dirname(member)
    resolved = posixpath.normpath(posixpath.join(base, target))
    return resolved == ".." or resolved.startswith("../") or resolved.startswith("/")


def extract_archive(archive: Path, dest: Path, *, strip_top: bool) -> None:
    """Extract a tar or zip archive into `dest` (must not exist), refusing unsafe members.

    With `strip_top`, a single top-level folder (`name-version/` in sdists) is removed.
    """
    archive = Path(archive)
    tmp = Path(tempfile.mkdtemp(dir=Path(dest).parent, prefix=".extract-"))
    try:
        if zipfile.is_zipfile(archive):
            _extract_zip(archive, tmp)
        else:
            try:
                tf = tarfile.open(archive)
            except tarfile.TarError:
                raise SourceError(f"{archive.name}: not a tar or zip archive") from None
            with tf:
                _extract_tar(tf, archive.name, tmp)
        entries = list(tmp.iterdir())
        root = entries[0] if strip_top and len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink() else tmp
        if root is tmp:
            os.replace(tmp, dest)
        else:
            os.replace(root, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _extract_tar(tf: tarfile.TarFile, label: str, into: Path) -> None:
    members = tf.getmembers()
    for m in members:
        problem = _unsafe_name(m.name)
        if problem is None and (m.issym() or m.islnk()) and _link_escapes(m.name, m.linkname, hard=m.islnk()):
            problem = f"link to {m.linkname!r} leads outside"
        if problem is None and not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            problem = "device or special file"
        if problem:
            raise UnsafeArchive(f"{label}: refusing member {m.name!r}: {problem}")
    if hasattr(tarfile, "data_filter"):
        # The 'data' filter re-checks all of the above and drops setuid bits and ownership.
        tf.extractall(into, members=members, filter="data")
    else:
        tf.extractall(into, members=members)


def _extract_zip(archive: Path, into: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            problem = _unsafe_name(info.filename)
            if problem is None and stat.S_ISLNK(info.external_attr >> 16):
                target = zf.read(info).decode("utf-8", "replace")
                if _link_escapes(info.filename, target, hard=False):
                    problem = f"link to {target!r} leads outside"
            if problem:
                raise UnsafeArchive(f"{archive.name}: refusing member {info.filename!r}: {problem}")
        for info in zf.infolist():
            path = Path(zf.extract(info, into))
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                path.chmod(mode | 0o600)


# ------------------------------------------------------------------------ path


def _path_ignore(top: Path):
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


def copy_path(path: object, dest: Path, *, base_dir: Path | None = None, where: str = "recipe") -> _Fetched:
    """Copy a local source folder into `dest`; the pin is its content digest."""
    if not isinstance(path, str) or not path:
        raise BadInput(where, "source.path", path, "expected a folder path")
    src = Path(path)
    if not src.is_absolute():
        src = Path(base_dir or PROJECT_ROOT) / src
    if not src.is_dir():
        raise BadInput(where, "source.path", path, f"no such folder ({display(src)})")
    digest = tree_digest(src)
    shutil.copytree(src, dest, symlinks=True, ignore=_path_ignore(src))
    return _Fetched("path", digest, f"path {display(src)} (content {digest[:12]})")


# --------------------------------------------------------------- extra sources


def _inside(root: Path, rel: object, where: str, key: str) -> Path:
    if not isinstance(rel, str) or not rel or _unsafe_name(rel):
        raise BadInput(where, key, rel, "expected a relative path inside the source tree")
    return root / rel


def fetch_extra_sources(work_dir: Path, items: Iterable[Mapping], *, where: str = "recipe") -> tuple:
    """Each item is an archive `{url, sha256, dest}` or a pinned git tree `{git, commit, dest, exclude?}`.

    Archives are cached by their sha256 and checked before use, then extracted into `dest`
    (single top folder removed); other files are written to `dest`. A git tree goes through the
    main source's mirror and checkout (same cache, same `exclude` handling) at exactly `commit`."""
    done = []
    for i, item in enumerate(items or ()):
        key = f"extra_sources[{i}]"
        is_git = isinstance(item, Mapping) and "git" in item
        if not isinstance(item, Mapping) or not (item.get("git") if is_git else item.get("url")):
            raise BadInput(where, key, item, "expected {url, sha256, dest} or {git, commit, dest, exclude?}")
        if is_git:
            url, commit = item["git"], item.get("commit")
            if not isinstance(url, str):
                raise BadInput(where, f"{key}.git", url, "expected a repository URL")
            if not isinstance(commit, str) or not FULL_SHA.match(commit):
                # A tag could be moved upstream; only a commit names the tree for good.
                raise BadInput(where, f"{key}.commit", commit, "expected a full 40-hex commit SHA (no tag)")
            patterns = _read_exclude(item.get(gitsparse.KEY), where, f"{key}.{gitsparse.KEY}")
        else:
            url = item["url"]
            sha256 = _check_sha256(item.get("sha256"), where, f"{key}.sha256")
        target = _inside(Path(work_dir), item.get("dest"), where, f"{key}.dest")
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise BadInput(where, f"{key}.dest", item.get("dest"), "already exists in the source tree")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            target.rmdir()
        if is_git:
            mirror = _ensure_mirror(url)
            sha = _resolve_ref(mirror, url, commit, where, f"{key}.commit")
            _checkout(mirror, url, sha, target, False, prefix="", where=where, exclude=patterns,
                      exclude_key=f"{key}.{gitsparse.KEY}")
            done.append((str(item["dest"]), url, sha))
            continue
        cached = _download(url, sources_cache() / "extra" / sha256 / _archive_name(url), sha256, where, f"{key}.sha256")
        if cached.name.lower().endswith(ARCHIVE_SUFFIXES):
            extract_archive(cached, target, strip_top=True)
        else:
            shutil.copyfile(cached, target)
        done.append((str(item["dest"]), sha256))
    return tuple(done)


# --------------------------------------------------------------------- patches


def when_matches(when: Mapping | None, platform: str, cuda: str) -> bool:
    """`when: {platform, cuda}`: each a value or a list; cuda also accepts '>=12.8'-style bounds."""
    if not when:
        return True
    plats = when.get("platform")
    if plats is not None:
        plats = [plats] if isinstance(plats, str) else list(plats)
        if platform not in plats:
            return False
    cudas = when.get("cuda")
    if cudas is not None:
        cudas = [str(cudas)] if isinstance(cudas, (str, int, float)) else [str(c) for c in cudas]
        if not any(_cuda_matches(c, cuda) for c in cudas):
            return False
    return True


def _cuda_matches(cond: str, cuda: str) -> bool:
    m = re.fullmatch(r"\s*(>=|<=|==|!=|>|<)?\s*(\d+(?:\.\d+)*)\s*", cond)
    if not m:
        raise ValueError(cond)
    op, ver = m.group(1) or "==", vtuple(m.group(2))
    have = vtuple(cuda)[: len(ver)] if op == "==" else vtuple(cuda)
    return {
        "==": have == ver, "!=": have != ver, ">=": have >= ver,
        "<=": have <= ver, ">": have > ver, "<": have < ver,
    }[op]


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
        path = _inside(Path(patches_dir), rel, where, f"{key}.file")
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
    proc = subprocess.run(
        ["git", "apply", "--whitespace=nowarn", str(patch.resolve())],
        cwd=tree, env=env, capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise PatchFailed(f"patch {rel} does not apply: {_last_error_line(proc.stderr)}")


def _run_patch_script(script: Path, tree: Path, rel: str) -> None:
    """A patch script runs once in a fresh tree, without network where this process can make
    a network namespace (root with unshare), with the tree as its working directory."""
    cmd = [sys.executable, str(script.resolve())]
    if os.geteuid() == 0 and shutil.which("unshare"):
        cmd = ["unshare", "--net", "--", *cmd]
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PatchFailed(f"patch script {rel} failed (exit {proc.returncode}): {_last_error_line(proc.stderr)}")

