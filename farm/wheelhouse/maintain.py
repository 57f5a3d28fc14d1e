"""Whole-house operations: rebuild the pages, verify the bytes, prune yanked wheels, read build keys.

Commands that only read or repair a house (verify, rebuild, prune, recover) refuse a folder that is
missing or a file and never create one; only publishing makes a house.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from urllib.parse import unquote, urljoin

from farm.errors import BadInput, FarmError, shorten
from farm.settings import default_wheelhouse, display
from farm.wheelhouse.index import (
    COMPAT,
    FILES,
    PUT_BACK,
    SIMPLE,
    Config,
    House,
    Site,
    existing_page_keys,
    expected_files,
    rebuild_pages,
    update,
)
from farm.wheelhouse.journalindex import cache_problem
from farm.wheelhouse.manifest import (
    MANIFEST,
    ManifestEntry,
    append_records,
    house_folder,
    live_entries,
    locked,
    read_journal,
    scan,
    step,
)

_HREF = re.compile(rb'<a [^>]*href="([^"]*)"')


@dataclass
class RebuildResult:
    pages: int
    wheels: int
    missing: list[str] = field(default_factory=list)   # journal entries whose file is gone (only with allow_shrink)


def rebuild(wheelhouse: Path | str, allow_shrink: bool = False) -> RebuildResult:
    """Regenerate every page from the journal. Stats wheels, never opens one.

    Refuses (ShrinkRefused, nothing written) when any project page or channel
    would list fewer wheels than the pages on disk do, unless allow_shrink.
    """
    root = house_folder(wheelhouse)
    with locked(root):
        site, missing = rebuild_pages(root, allow_shrink)
    return RebuildResult(pages=len(site.kind), wheels=len(site.house.entries), missing=missing)


def built_keys(wheelhouse: Path | str | None = None) -> set[str]:
    """Build keys of the wheels the house serves (not yanked, not pruned): `farm plan --missing` skips these cells.

    A house that does not exist yet has none. Default house: $FARM_WHEELHOUSE, else ./wheelhouse.
    """
    root = default_wheelhouse(wheelhouse)
    if root.exists():
        house_folder(root)   # a file given as the house is refused, not read as an empty one
    journal = read_journal(root)
    house = House.derive(journal.entries, Config.load(root))
    return {e.build_key for e in house.entries if e.build_key and e.file not in house.yanked}


def file_sha256(path: Path) -> str:
    """sha256 of a regular file, read in 1 MiB chunks; a symlink is refused (OSError), never followed."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def files_not_a_folder(root: Path) -> str | None:
    """What files/ is when it is there but not a real folder ("a symlink to X", "a file", ...), else None.
    Nothing may go inside such a files/: a link would lead every read and write out of the house."""
    try:
        st = (root / FILES).lstat()
    except FileNotFoundError:
        return None
    return None if stat.S_ISDIR(st.st_mode) else what_it_is(root / FILES, st)


def what_it_is(path: Path, st: os.stat_result) -> str:
    """An entry in words: "a folder", "a symlink to X", "a file", "not a regular file"."""
    kind = _kind(st)
    return f"a symlink to {os.readlink(path)}" if kind == "a symlink" else kind or "a file"


def _listing(folder: Path) -> list[os.DirEntry[str]]:
    """A folder's entries by name; a folder that is there but cannot be listed is refused (BadInput), never
    read as an empty one (design.md §9.5)."""
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda d: d.name)
    except OSError as exc:
        raise BadInput(display(folder), None, None,
                       f"cannot be listed ({exc.strerror or exc}); nothing changed") from None


def house_files(root: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(path relative to the house, path, lstat) of every entry under files/ (two levels), temporaries
    (dot-names, a crashed publish's leftovers: prune removes them) left out. Never follows a link, files/
    itself included (then there are none); a folder it cannot list is refused (BadInput)."""
    top = root / FILES
    if files_not_a_folder(root) or not top.exists():
        return
    for d in _listing(top):
        if d.name.startswith("."):
            continue
        st = d.stat(follow_symlinks=False)
        yield f"{FILES}/{d.name}", Path(d.path), st
        if not stat.S_ISDIR(st.st_mode):
            continue
        for f in _listing(Path(d.path)):
            if not f.name.startswith("."):
                yield f"{FILES}/{d.name}/{f.name}", Path(f.path), f.stat(follow_symlinks=False)


def unaccounted(root: Path, names: set[str]) -> list[str]:
    """Entries under files/ that no journal record (by wheel file name) accounts for."""
    out = []
    for rel, _, st in house_files(root):
        depth2 = rel.count("/") == 2
        if depth2 and rel.rsplit("/", 1)[1].removesuffix(".metadata") in names:
            continue
        if depth2 or not stat.S_ISDIR(st.st_mode):
            out.append(rel)
    return out


def _kind(st: os.stat_result) -> str | None:
    """None for a regular file, else what it is instead."""
    if stat.S_ISREG(st.st_mode):
        return None
    return "a symlink" if stat.S_ISLNK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"


def verify(wheelhouse: Path | str) -> list[str]:
    """Check the whole house; one line per problem (empty: all good).

    The journal (missing, empty, torn tail, damaged lines), every wheel and sidecar re-hashed against
    it, everything under files/ (symlinks and other non-regular files, orphans no record accounts for),
    every page and packages.json against what the journal gives, the journal cache, and every link of
    every page. Reads every wheel body; index pages never do, this is the separate check design.md §9.5 asks
    for. A symlink is reported, never followed.
    """
    root = house_folder(wheelhouse)
    path = root / MANIFEST
    problems: list[str] = []
    fix = "`farm index recover` rebuilds it from files/"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = None
        problems.append(f"{MANIFEST}: missing; {fix}")
    except OSError as exc:
        data = None
        problems.append(f"{MANIFEST}: unreadable ({exc.strerror}); {fix}")
    if data == b"":
        problems.append(f"{MANIFEST}: empty; {fix}")
    found = scan(data or b"")
    problems += [f"{MANIFEST}:{n}: {problem}; {fix}" for n, problem in found.bad]
    if found.torn:
        problems.append(f"{MANIFEST}:{found.torn_line}: torn last record ({found.torn} bytes without a newline); "
                        "`farm index recover` cuts it and re-adds its wheel from files/")
    try:
        live, _ = live_entries(path, ((n, rec) for n, _, rec in found.records))
    except BadInput as exc:
        problems.append(f"{exc}; {fix}")
        live = {}
    entries = list(live.values())
    cache = cache_problem(root)
    if cache:
        problems.append(cache)
    hashes: dict[Path, str] = {}
    outside = files_not_a_folder(root)
    if outside:
        problems.append(f"{FILES}: {outside}, not a folder; {PUT_BACK} (recover refuses while it is there)")
    for e in entries if not outside else ():
        wheel = root / FILES / e.project / e.file
        sidecar = wheel.with_name(e.file + ".metadata")
        rel = f"{FILES}/{e.project}/{e.file}"
        try:
            st = wheel.lstat()
            if _kind(st):
                continue  # reported with everything else under files/ below
            got = hashes[wheel.resolve()] = file_sha256(wheel)
        except FileNotFoundError:
            problems.append(f"{rel}: in the manifest but missing; republish the wheel")
            continue
        except OSError as exc:   # not seen is not gone
            problems.append(f"{rel}: cannot be read ({exc.strerror or exc})")
            continue
        if got != e.sha256:
            problems.append(f"{rel}: sha256 {got} but the manifest says {e.sha256}; republish the good wheel")
        if st.st_size != e.size:
            problems.append(f"{rel}: {st.st_size} bytes but the manifest says {e.size}")
        try:
            if _kind(sidecar.lstat()):
                continue
        except OSError:
            problems.append(f"{rel}.metadata: missing; `farm index recover` writes it from the wheel")
            continue
        side = sidecar.read_bytes()
        if hashlib.sha256(side).hexdigest() != e.metadata_sha256:
            problems.append(f"{rel}.metadata: sha256 differs from the manifest's metadata_sha256")
        # the gate's wheel module costs ~50 ms to import: only here
        from farm.wheelhouse.wheelfile import ZIP_READ_ERRORS
        try:
            with zipfile.ZipFile(wheel) as zf:
                inner = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
                if len(inner) != 1 or zf.read(inner[0]) != side:
                    problems.append(f"{rel}.metadata: not byte-identical to the wheel's METADATA")
        except zipfile.BadZipFile:
            problems.append(f"{rel}: not a zip archive")
        except ZIP_READ_ERRORS as exc:   # a damaged deflate stream, a truncated member, ...
            problems.append(f"{rel}: its METADATA cannot be read ({type(exc).__name__}: {shorten(str(exc))})")
    accounted = {f"{FILES}/{e.project}/{e.file}{x}" for e in entries for x in ("", ".metadata")}
    try:
        listed = list(house_files(root))
    except BadInput as exc:
        problems.append(str(exc))
        listed = []
    for rel, entry, st in listed:
        kind = _kind(st)
        if rel.count("/") == 1:
            if kind != "a folder":
                problems.append(f"{rel}: {what_it_is(entry, st)}, not a project folder; {PUT_BACK} or move it away "
                                "(recover refuses while it is there)")
            continue
        if kind:
            target = f" to {os.readlink(entry)}" if kind == "a symlink" else ""
            problems.append(f"{rel}: {kind}{target}, not a regular file; `farm index recover` removes it")
        elif rel not in accounted:
            problems.append(f"{rel}: no manifest record accounts for it (an orphan); {_orphan_remedy(rel, root)}")
    problems += _page_problems(root, entries)
    problems += check_links(root, hashes)
    return problems


def _orphan_remedy(rel: str, root: Path) -> str:
    """What repairs an unaccounted file: recover adds a wheel (and rewrites its sidecar); anything else is
    not the farm's to guess about."""
    if rel.endswith(".whl") or (rel.endswith(".whl.metadata") and (root / rel[: -len(".metadata")]).is_file()):
        return "`farm index recover` adds it"
    return "not a wheel or a wheel's sidecar: `farm index recover` leaves it, remove it by hand"


def _page_problems(root: Path, entries: Iterable[ManifestEntry]) -> list[str]:
    """Every page and packages file the journal gives exists with those bytes; no page it does not give."""
    try:
        site = Site(House.derive(entries, Config.load(root)))
    except BadInput as exc:
        return [str(exc)]
    expected = expected_files(root, site)
    problems = []
    for rel, data in sorted(expected.items()):
        page = root / rel
        try:
            if page.is_symlink() or page.read_bytes() != data:
                problems.append(f"{rel}: differs from what the manifest gives; `farm index rebuild` rewrites it")
        except FileNotFoundError:
            problems.append(f"{rel}: missing; `farm index rebuild` writes it")
    for key in sorted(set(existing_page_keys(root)) - set(site.kind)):
        problems.append(f"{key}/index.html: a page the manifest does not give; `farm index rebuild` removes it")
    return problems


def check_links(root: Path, hashes: dict[Path, str] | None = None) -> list[str]:
    """Every href of every index page resolves to a file under the house; a #sha256= matches its bytes."""
    hashes = {} if hashes is None else hashes
    problems = []
    pages = [*root.glob(f"{SIMPLE}/**/index.html"), *root.glob("cu*/torch*/**/index.html"),
             *root.glob(f"{COMPAT}/**/index.html")]
    for page in pages:
        base = "/" + page.relative_to(root).as_posix()
        for raw in _HREF.findall(page.read_bytes()):
            href = raw.decode("utf-8").replace("&amp;", "&")
            if href.startswith(("http://", "https://")):
                continue  # an external file base URL: not checkable offline
            url, _, fragment = href.partition("#")
            target = root / unquote(urljoin(base, url)).lstrip("/")
            if url.endswith("/"):
                if not (target / "index.html").is_file():
                    problems.append(f"{page.relative_to(root)}: link {href} has no page")
                continue
            if not target.is_file():
                problems.append(f"{page.relative_to(root)}: link {href} resolves to nothing")
                continue
            if fragment.startswith("sha256="):
                key = target.resolve()
                if key not in hashes:
                    hashes[key] = file_sha256(target)
                if hashes[key] != fragment[7:]:
                    problems.append(f"{page.relative_to(root)}: {target.name} does not have the advertised sha256")
    return problems


def parse_date(text: str, where: str = "--before") -> datetime:
    try:
        d = date.fromisoformat(text)
        return datetime(d.year, d.month, d.day, tzinfo=timezone.utc)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(where, None, text, "expected a date like 2026-05-01 or 2026-05-01T12:00:00Z") from None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def _published(entry_published: str) -> datetime | None:
    try:
        return datetime.fromisoformat(entry_published.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass
class PruneResult:
    removed: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)


def prune(wheelhouse: Path | str, before: datetime | str) -> PruneResult:
    """Delete yanked wheels published before `before`, and leftovers of crashed publishes older than it.

    Journal first, then pages, then the files: at no point does a page link a deleted file.
    """
    root = house_folder(wheelhouse)
    cutoff = parse_date(before) if isinstance(before, str) else before
    result = PruneResult()
    with locked(root):
        problems = verify(root)
        if problems:
            raise FarmError(f"{display(root)}: prune refused while `farm index verify` finds {len(problems)} "
                            f"problem(s), first: {shorten(problems[0])}; nothing deleted")
        journal = read_journal(root)
        config = Config.load(root)
        house = House.derive(journal.entries, config)
        doomed = [e for e in house.entries if e.file in house.yanked
                  and (_published(e.published) or cutoff) < cutoff]
        if doomed:
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            append_records(root, (json.dumps({"op": "remove", "file": e.file, "project": e.project, "at": now,
                                               "reason": f"pruned: yanked and published before {cutoff.isoformat()}"},
                                              sort_keys=True) for e in doomed))
            gone = {e.file for e in doomed}
            after = Site(House.derive([e for e in journal.entries if e.file not in gone], config))
            update(root, Site(house), after)
            for e in doomed:
                folder = root / FILES / e.project
                (folder / e.file).unlink(missing_ok=True)
                (folder / (e.file + ".metadata")).unlink(missing_ok=True)
                step(f"pruned {e.file}")
                result.removed.append(e.file)
        # Temporaries of publishes that died before their rename. A wheel no record names is never
        # deleted here: verify reports it and `farm index recover` adds it back to the journal.
        limit = min(cutoff.timestamp(), time.time() - 3600)
        for folder in (root / FILES).glob("*") if not files_not_a_folder(root) else ():
            if folder.is_symlink() or not folder.is_dir():
                continue
            for path in folder.glob(".*.tmp"):
                if not path.is_symlink() and path.is_file() and path.stat().st_mtime < limit:
                    path.unlink(missing_ok=True)
                    result.orphans.append(f"{folder.name}/{path.name}")
    return result
