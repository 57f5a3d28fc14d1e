"""Publishing wheels into the wheelhouse (design.md §9.3), crash-safe and concurrent-safe.

Order of writes, each one leaving an index whose every link resolves:
1. every wheel is validated first (name, label, METADATA, build record): a bad one stops all, nothing written;
2. each wheel is copied under a temporary dot-name in files/<project>/ while hashing, and fsynced
   (outside the lock: the slow part runs in parallel with other publishers);
3. under the exclusive lock: the `.metadata` sidecar (byte-identical to the wheel's METADATA) is written
   atomically, the wheel renamed into place, the folder fsynced, the journal record appended and fsynced;
4. still under the lock, only the pages whose listing changed are regenerated from the journal.
A crash before 3 leaves temporaries nothing links; between 3 and 4 the pages are stale but complete, and
publishing the same wheel again (a no-op on the journal) regenerates every page its arrival changes.

Validation includes the verify gate's file checks (`farm.wheelhouse.wheelfile.wheel_file_problems`: member paths, links,
WHEEL, RECORD hashes), not its import check. Publishing a wheel already recorded with the same sha256
re-hashes the copy in files/: a damaged, missing or replaced copy (or sidecar) is put back atomically.
On top of a torn, missing or empty journal a publish refuses while files/ holds a file the journal does
not account for (see manifest.py): `farm index recover` first.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.parser import BytesHeaderParser
from pathlib import Path

from packaging.version import InvalidVersion, Version

from farm.errors import BadInput, PublishConflict
from farm.recipes.buildrecord import BuildRecord
from farm.settings import display
from farm.versions import minor_of
from farm.wheelhouse.index import (
    FILES,
    PUT_BACK,
    Config,
    House,
    Site,
    channel_lines,
    drop_unlisted,
    existing_page_keys,
    pages_current,
    stamp_pages_format,
    unpaged,
    update,
)
from farm.wheelhouse.journalindex import JournalIndex, Summary
from farm.wheelhouse.maintain import file_sha256, files_not_a_folder, unaccounted
from farm.wheelhouse.manifest import (
    MANIFEST,
    ManifestEntry,
    append_records,
    fsync_dir,
    house_folder,
    locked,
    scan,
    step,
)
from farm.wheelhouse.names import WheelName, normalize, parse_wheel_name, served_pythons

CHUNK = 1 << 20
# Build-record fields with a place of their own in the entry; other short scalars go to `extra`.
_RECORD_KEYS = {"wheel", "cell", "build_key", "arch_list", "pythons"}


@dataclass
class PublishResult:
    published: list[ManifestEntry] = field(default_factory=list)   # new in the journal
    already: list[ManifestEntry] = field(default_factory=list)     # same bytes were already published
    pages: list[str] = field(default_factory=list)                 # page keys regenerated
    replaced: list[ManifestEntry] = field(default_factory=list)    # already published, but the copy on disk was damaged
    notes: list[str] = field(default_factory=list)                 # what was repaired on the way (a torn journal tail)


@dataclass
class _Prepared:
    source: Path
    name: WheelName
    metadata: bytes
    requires_python: str | None
    record: BuildRecord
    metadata_name: str = ""
    temp: Path | None = None
    sha256: str = ""
    size: int = 0


def _refuse_smoke(zf: zipfile.ZipFile, member: str, where: str) -> None:
    """A smoke build (`farm build --smoke`) carries one token of its cell's list: never published."""
    try:
        info = json.loads(zf.read(member))
    except (KeyError, ValueError):
        return
    if isinstance(info, dict) and info.get("tier") == "smoke":
        raise BadInput(where, "farm_build.json tier", "smoke",
                       f"a smoke build carries only {info.get('arch_list')} of its cell's list; publish a full build")


def read_metadata(wheel: Path, wn: WheelName) -> tuple[bytes, str, str | None]:
    """The wheel's METADATA bytes, Name and Requires-Python; Name and Version must agree with the file name."""
    where = display(wheel)
    try:
        with zipfile.ZipFile(wheel) as zf:
            candidates = [n for n in zf.namelist()
                          if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(candidates) != 1:
                raise BadInput(where, "METADATA", candidates or None,
                               "expected exactly one <name>-<version>.dist-info/METADATA")
            data = zf.read(candidates[0])
            _refuse_smoke(zf, candidates[0].replace("/METADATA", "/farm_build.json"), where)
    except (zipfile.BadZipFile, OSError) as exc:
        raise BadInput(where, None, None, f"not a readable wheel (zip) file: {exc}") from None
    headers = BytesHeaderParser().parsebytes(data)
    name, version = headers.get("Name"), headers.get("Version")
    if not name or normalize(name) != wn.project:
        raise BadInput(where, "METADATA Name", name, f"does not match the file name's project {wn.project!r}")
    try:
        same = Version(version or "") == Version(wn.version)
    except InvalidVersion:
        same = False
    if not same:
        raise BadInput(where, "METADATA Version", version, f"does not match the file name's version {wn.version!r}")
    requires = headers.get("Requires-Python")
    return data, name.strip(), (requires.strip() if requires else None)


def load_records(record: object, wheels: list[Path]) -> dict[str, BuildRecord]:
    """Build records per wheel file name.

    `record` is None, a dict, a list of dicts, or a path to a JSON file holding
    either. A single record without "wheel" applies to a single wheel only.
    """
    where = "build record"
    if isinstance(record, (str, os.PathLike)):
        where = display(record)
        try:
            record = json.loads(Path(record).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BadInput(where, None, None, "file not found") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadInput(where, None, None, f"not JSON: {exc}") from None
    if record is None:
        return {}
    items = record if isinstance(record, list) else [record]
    out: dict[str, BuildRecord] = {}
    for item in items:
        checked = BuildRecord(item, where)   # the form the build writes (design.md §4.5)
        file = checked.wheel
        if file is None:
            if len(wheels) != 1 or len(items) != 1:
                raise BadInput(where, "wheel", None, "name the wheel file each record belongs to when publishing several")
            file = wheels[0].name
        out[file] = checked
    unknown = set(out) - {w.name for w in wheels}
    if unknown:
        raise BadInput(where, "wheel", sorted(unknown)[0], "this record names no wheel being published")
    return out


def _check_record(where: str, wn: WheelName, data: object) -> BuildRecord:
    """`data` as a build record: the schema (design.md §4.5), and the wheel's label agrees with it."""
    rec = BuildRecord(data, where)
    if rec.cuda is not None and rec.cuda != wn.cuda:
        raise BadInput(where, "cuda", rec.cuda, f"the wheel's label says CUDA {wn.cuda}")
    if wn.torch and rec.torch is not None and minor_of(rec.torch) != wn.torch:
        raise BadInput(where, "torch", rec.torch, f"the wheel's label says torch {wn.torch}")
    return rec


def _prepare(wheel: Path, rec: BuildRecord) -> _Prepared:
    wn = parse_wheel_name(wheel.name, display(wheel))
    if not wheel.is_file():
        raise BadInput(display(wheel), None, None, "file not found")
    # the gate's file checks only; its import is ~0.1 s
    from farm.wheelhouse.wheelfile import wheel_file_problems

    problems = wheel_file_problems(wheel)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise BadInput(display(wheel), None, None, f"not a sound wheel file: {problems[0]}{more}")
    metadata, name, requires = read_metadata(wheel, wn)
    _check_record(f"build record of {wheel.name}", wn, rec)
    return _Prepared(wheel, wn, metadata, requires, rec, metadata_name=name)


def _stage(root: Path, p: _Prepared) -> None:
    """Copy under a temporary dot-name next to its final place, hashing on the way; fsync."""
    outside = files_not_a_folder(root)
    if outside:
        raise BadInput(display(root / FILES), None, None, f"not a real folder ({outside}); {PUT_BACK}; "
                                                          "nothing published")
    folder = root / FILES / p.name.project
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise BadInput(display(folder), None, None, f"not a real folder (a symlink or a file); {PUT_BACK}; "
                                                    "nothing published")
    folder.mkdir(parents=True, exist_ok=True)
    p.temp = folder / f".{p.name.file}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    digest = hashlib.sha256()
    size = 0
    with open(p.source, "rb") as src, open(p.temp, "xb") as dst:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            size += len(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    p.sha256, p.size = digest.hexdigest(), size
    step(f"staged {p.name.file}")


def _entry(p: _Prepared, now: str, host: str) -> ManifestEntry:
    wn, rec = p.name, p.record
    extra = {k: v for k, v in rec.items()
             if k not in _RECORD_KEYS and isinstance(v, (str, int, float, bool)) and len(str(v)) <= 200}
    return ManifestEntry(
        file=wn.file, project=wn.project, name=p.metadata_name, version=wn.version, build_tag=wn.build_tag,
        python_tag=wn.python_tag, abi_tag=wn.abi_tag, platform_tag=wn.platform_tag, cuda=wn.cuda,
        torch=wn.torch, platform=wn.platform,
        pythons=rec.pythons or served_pythons(wn, p.requires_python),
        size=p.size, sha256=p.sha256, metadata_sha256=hashlib.sha256(p.metadata).hexdigest(),
        requires_python=p.requires_python, cell=rec.cell or wn.cell_id(),
        build_key=rec.build_key, arch_list=rec.arch_list, published=now, host=host, extra=extra,
    )


def _place(root: Path, p: _Prepared) -> None:
    """Sidecar first (atomically), then the wheel: a listed wheel always has its sidecar."""
    folder = root / FILES / p.name.project
    sidecar = folder / f"{p.name.file}.metadata"
    tmp = folder / f".{sidecar.name}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(p.metadata)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, sidecar)
    step(f"sidecar {sidecar.name}")
    assert p.temp is not None, "a wheel is staged before it is put in place"
    os.replace(p.temp, folder / p.name.file)
    p.temp = None
    fsync_dir(folder)
    step(f"placed {p.name.file}")


def _intact_copy(folder: Path, old: ManifestEntry, metadata: bytes) -> bool:
    """The published wheel and its sidecar are regular files with the recorded bytes."""
    wheel, sidecar = folder / old.file, folder / f"{old.file}.metadata"
    try:
        if not (wheel.lstat().st_size == old.size and os.path.isfile(sidecar) and not sidecar.is_symlink()):
            return False
        if not wheel.is_file() or wheel.is_symlink() or sidecar.read_bytes() != metadata:
            return False
        return file_sha256(wheel) == old.sha256
    except OSError:
        return False


def _refuse_on_a_damaged_journal(root: Path, idx: JournalIndex, result: PublishResult) -> None:
    """A torn, missing or empty journal: go on only when every file in files/ is accounted for."""
    if idx.exists and idx.size and not idx.torn:
        return
    state = ("missing" if not idx.exists else "empty" if not idx.size
             else f"torn: its last record ({idx.torn} bytes) never completed")
    try:
        data = (root / MANIFEST).read_bytes()
    except FileNotFoundError:
        data = b""
    strays = unaccounted(root, {rec["file"] for _, _, rec in scan(data).records})
    if strays:
        more = f" (and {len(strays) - 1} more)" if len(strays) > 1 else ""
        raise BadInput(display(root / MANIFEST), None, None,
                       f"{state}, while {strays[0]}{more} is in no record; `farm index recover` rebuilds the "
                       "manifest from files/ first; nothing published")
    if idx.torn:
        result.notes.append(f"cut the torn last record of {MANIFEST} ({idx.torn} bytes); every file under "
                            f"{FILES}/ has a record")


def publish(wheels: Iterable[Path | str], wheelhouse: Path | str, record: object = None) -> PublishResult:
    """Publish wheel files into the wheelhouse. `record`: build record(s) (see load_records)."""
    root = house_folder(wheelhouse, create=True)
    paths = _distinct_wheels(wheels)
    records = load_records(record, paths)
    prepared = [_prepare(w, records.get(w.name) or BuildRecord({})) for w in paths]
    result = PublishResult()
    if root.is_dir():   # refuse a damaged journal before staging writes anything (again under the lock)
        try:
            _refuse_on_a_damaged_journal(root, JournalIndex.load(root, summaries=False), PublishResult())
        except BadInput:
            with locked(root):   # another writer may have been mid-append: judge again while it cannot be
                _refuse_on_a_damaged_journal(root, JournalIndex.load(root, summaries=False), PublishResult())
    try:
        for p in prepared:
            _stage(root, p)
        with locked(root, create=True):
            step("locked")
            idx = JournalIndex.load(root)
            _refuse_on_a_damaged_journal(root, idx, result)
            config = Config.load(root)
            projects = {p.name.project for p in prepared}
            fresh, repeat = _fresh_and_repeated(prepared, idx, projects)
            _restore_repeated(root, repeat, result)
            before = _Before.of(idx, projects, {old.file for _, old in repeat}, config)
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            host = socket.gethostname()
            new_entries = [_entry(p, now, host) for p in fresh]
            for p in fresh:
                _place(root, p)
            idx.appended(append_records(root, [e.to_json() for e in new_entries]))
            result.published = new_entries
            result.pages = _update_pages(root, idx, config, projects, before)
            idx.save()
            idx.close()
            step("pages written")
    finally:
        for p in prepared:
            if p.temp is not None:
                p.temp.unlink(missing_ok=True)
    return result


def _distinct_wheels(wheels: Iterable[Path | str]) -> list[Path]:
    paths = [Path(w) for w in wheels]
    seen: dict[str, Path] = {}
    for w in paths:
        if w.name in seen:
            raise BadInput(display(w), None, None, f"the same wheel name is given twice (also {display(seen[w.name])})")
        seen[w.name] = w
    return paths


def _fresh_and_repeated(prepared: list[_Prepared], idx: JournalIndex, projects: set[str]
                        ) -> tuple[list[_Prepared], list[tuple[_Prepared, ManifestEntry]]]:
    """The wheels the journal does not list yet, and those it lists with the same bytes (with their entry);
    the same file name with other bytes is a conflict."""
    live = {e.file: e for project in projects for e in idx.entries(project)}
    fresh, repeat = [], []
    for p in prepared:
        old = live.get(p.name.file)
        if old is None:
            fresh.append(p)
        elif old.sha256 != p.sha256:
            raise PublishConflict(
                f"{display(p.source)}: {p.name.file} is already published with other bytes "
                f"(sha256 {old.sha256[:12]}..., this one {p.sha256[:12]}...); a rebuild needs a higher build number")
        else:
            repeat.append((p, old))
    return fresh, repeat


def _restore_repeated(root: Path, repeat: list[tuple[_Prepared, ManifestEntry]], result: PublishResult) -> None:
    """Same bytes: restore what a crash or damage took; the journal is not touched."""
    for p, old in repeat:
        folder = root / FILES / old.project
        if not _intact_copy(folder, old, p.metadata):
            existed = os.path.lexists(folder / old.file)
            _place(root, p)
            if existed:
                result.replaced.append(old)
        result.already.append(old)


@dataclass
class _Before:
    """The house as the pages should have shown it before this publish.

    A crash may have come between an earlier journal append and its pages: the diff is taken against the
    house without the repeated wheels, so every page their arrival changes (a new channel's torch-free
    listings too) is regenerated; pages already right are skipped unwritten."""
    entries: dict[str, list[ManifestEntry]]   # the published projects, without the repeated wheels
    summaries: dict[str, Summary]
    lines: dict[str, list[str]]               # CUDA line -> torch minors with a channel

    @classmethod
    def of(cls, idx: JournalIndex, projects: set[str], repeated: set[str], config: Config) -> _Before:
        entries = {project: [e for e in idx.entries(project) if e.file not in repeated] for project in projects}
        summaries = dict(idx.summaries)
        summaries.update({project: Summary.of(es) for project, es in entries.items()})
        return cls(entries, summaries, channel_lines(summaries.values(), config))


def _update_pages(root: Path, idx: JournalIndex, config: Config, projects: set[str], before: _Before) -> list[str]:
    """Regenerate the pages whose listing changed between `before` and the journal now; their keys.
    Pages last rendered in an older format are all rendered again, once."""
    lines_after = channel_lines(idx.summaries.values(), config)

    def fragment_of(project: str) -> bytes:
        return Site(House.derive(idx.entries(project), config, lines_after)).fragments().get(project, b"[]")

    if not pages_current(root):
        # every page again, and the ones an older farm wrote that this format has no place for go
        on_disk = existing_page_keys(root)
        everything = Site(House.derive([e for q in idx.projects() for e in idx.entries(q)], config, lines_after),
                          idx.summaries)
        written = update(root, None, everything, projects=idx.projects(), fragment_of=fragment_of)
        drop_unlisted(root, everything, on_disk)
        stamp_pages_format(root)
        return written
    # A publisher killed between its journal append and its pages left projects the journal lists
    # but whose pages are missing: a root page this publish rewrites would link them. They arrive
    # now, in full, with the channels they open.
    healed = unpaged(root, idx.summaries, lines_after)
    for q in healed:
        before.entries[q] = []
        before.summaries.pop(q, None)
    if healed:
        before.lines = channel_lines(before.summaries.values(), config)
    # A new channel lists the torch-free wheels of its line: those projects' pages change too.
    moved = {c for c in before.lines.keys() | lines_after.keys() if before.lines.get(c) != lines_after.get(c)}
    affected = projects | set(healed) | {q for q, s in idx.summaries.items() if moved & set(s.free)}
    site_before = Site(House.derive([e for q in sorted(affected)
                                     for e in (before.entries[q] if q in before.entries else idx.entries(q))],
                                    config, before.lines), before.summaries)
    site_after = Site(House.derive([e for q in sorted(affected) for e in idx.entries(q)], config, lines_after),
                      idx.summaries)
    return update(root, site_before, site_after, projects=idx.projects(), fragment_of=fragment_of)
