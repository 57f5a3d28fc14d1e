"""A git source: a bare mirror per URL (sources/git/), fetched without blobs (a partial clone); the
ref (full SHA or tag) is resolved to a commit, which must equal the recipe's `commit` when one is
given; the blobs a checkout needs are fetched into the mirror per commit, leaving out the paths the
recipe's `exclude` names (farm/recipes/gitsparse.py), so a file upstream lacks is never asked for;
submodules are fetched from their own mirrors and recorded.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock

from farm.build.source.base import Fetched, git_error_line, sources_cache
from farm.errors import BadInput, SourceError, shorten
from farm.process import CompletedProcess, run
from farm.recipes import gitsparse
from farm.recipes.model import FULL_SHA


def _git(args: Sequence[str], cwd: Path | None = None, check: bool = True,
         input: str | None = None) -> CompletedProcess[str]:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C", GIT_ASKPASS="true")
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    # Local mirrors are cloned over the file transport, which git refuses for submodules by default.
    cmd = ["git", "-c", "protocol.file.allow=always", "-c", "advice.detachedHead=false", *args]
    return run(cmd, cwd=cwd, env=env, input=input, error=SourceError if check else None,
               what=f"git {' '.join(args[:2])} failed", explain=git_error_line)


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


def ensure_mirror(url: str) -> Path:
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
                    raise SourceError(f"cannot fetch {url}: {git_error_line(proc.stderr)}")
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


def resolve_ref(mirror: Path, url: str, ref: str, where: str, key: str = "source.git.ref") -> str:
    """A full SHA or a tag (the recipe loader refused anything else) -> the commit it names upstream."""
    if FULL_SHA.fullmatch(ref):
        if not _has_commit(mirror, ref):
            _fetch_mirror(mirror, url, ref)
        if not _has_commit(mirror, ref):
            raise BadInput(where, key, ref, f"no such commit in {url}")
        return ref
    sha = _rev(mirror, f"refs/tags/{ref}")
    if sha is None:
        _fetch_mirror(mirror, url)
        sha = _rev(mirror, f"refs/tags/{ref}")
    if sha is None:
        if _rev(mirror, f"refs/heads/{ref}"):
            # A name that reads like a release tag can still be a branch upstream.
            raise BadInput(where, key, ref,
                           "is a branch, which moves: pin a tag (with its commit) or a full commit SHA")
        raise BadInput(where, key, ref, f"no such tag or full commit SHA in {url}")
    return sha


def fetch_git(
    url: str, ref: str, dest: Path, *, commit: str | None = None, submodules: bool = False,
    exclude: tuple[str, ...] = (), where: str = "recipe",
) -> Fetched:
    """Clone `url` at `ref` into `dest` (must not exist) through the cache; when `commit` is given the
    ref must resolve to it. The values come from a loaded recipe's `Source` (checked there); what is
    checked here is what upstream holds.

    `exclude`: sparse-checkout patterns of paths the build never reads (farm/recipes/gitsparse.py); a
    pattern under a submodule's path applies inside that submodule."""
    mirror = ensure_mirror(url)
    sha = resolve_ref(mirror, url, ref, where)
    if commit is not None and sha != commit:
        # The cache may hold an old tag: look upstream once before blaming the recipe.
        _fetch_mirror(mirror, url)
        sha = resolve_ref(mirror, url, ref, where)
        if sha != commit:
            raise BadInput(where, "source.git.commit", commit, f"ref {ref!r} of {url} resolves to {sha}, not {commit}")
    subs = checkout(mirror, url, sha, Path(dest), submodules, prefix="", where=where, exclude=exclude)
    shown = ref if ref == sha else f"{ref} ({sha[:12]})"
    desc = f"git {url} @ {shown}" + (f" with {len(subs)} submodule(s)" if subs else "")
    if exclude:
        desc += f" without {', '.join(exclude)}"
    return Fetched("git", sha, desc, commit=sha, submodules=tuple(sorted(subs)), exclude=exclude,
                   date_epoch=commit_date(mirror, sha))


def commit_date(repo: Path, sha: str) -> int:
    """The committer date of `sha` (seconds since the epoch): the source's SOURCE_DATE_EPOCH (design.md §6.5).
    The committer date, not the author date: a rebase or cherry-pick moves it, as it changes the tree's history."""
    return int(_git(["show", "-s", "--format=%ct", sha], cwd=repo).stdout.strip())


def checkout(mirror: Path, url: str, sha: str, dest: Path, submodules: bool, prefix: str, where: str,
              exclude: tuple[str, ...] = (), exclude_key: str = f"source.git.{gitsparse.KEY}") -> list[Any]:
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
                raise SourceError(f"git check-ignore failed: {git_error_line(proc.stderr)}")
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
        mirror = ensure_mirror(sub_url)
        if not _has_commit(mirror, sub_sha):
            _fetch_mirror(mirror, sub_url, sub_sha)
        if not _has_commit(mirror, sub_sha):
            raise SourceError(f"submodule {shown}: commit {sub_sha} not found in {sub_url}")
        target = repo / path
        if target.exists():
            shutil.rmtree(target)
        found.append((shown, sub_sha))
        inside = tuple("/" + p.lstrip("/")[len(path) + 1:] for p in exclude if p.lstrip("/").startswith(f"{path}/"))
        found += checkout(mirror, sub_url, sub_sha, target, True, prefix=f"{shown}/", where=where,
                           exclude=inside)
    return found


def _resolve_submodule_url(super_url: str, sub_url: str) -> str:
    """Relative submodule URLs (./x, ../x) are relative to the superproject's URL, as git does."""
    if not sub_url.startswith(("./", "../")):
        return sub_url
    m = re.fullmatch(r"([a-z][a-z0-9+.-]*://[^/]*)(/.*)?", super_url)
    if m:
        head, tail = m.group(1), m.group(2) or "/"
        return head + posixpath.normpath(posixpath.join(tail, sub_url))
    return posixpath.normpath(posixpath.join(super_url, sub_url))
