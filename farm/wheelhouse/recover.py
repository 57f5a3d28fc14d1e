"""`farm index recover`: rebuild the journal from what is on disk, then every page (design.md §9.5).

For a house whose journal is torn, damaged, missing or empty, or whose files/ holds files no record
accounts for. Under the lock:
1. the journal's readable records are kept in their order; damaged lines and a torn tail are dropped
   (and counted);
2. every wheel under files/<project>/ is hashed: a recorded one with its recorded sha256 keeps its
   record; one no record accounts for gets a record derived from the file itself (its name, METADATA,
   its own `.dist-info/farm_build.json` build record; `published` is the file's mtime), after the
   gate's file checks; a missing or wrong `.metadata` sidecar is rewritten from the wheel;
3. symlinks and other non-regular entries in a project folder are removed (the link, never its target),
   and so are sidecars whose wheel is gone; records whose wheel is gone are dropped;
4. the journal is replaced atomically, every line framed, and every page regenerated from it.
Before any change, recover refuses (BadInput, exit 2) while files/ or a project folder is not a real folder
it can list: what it cannot see is never taken for wheels that are gone. Every file is looked at before
anything is removed or written.
Nothing that is a wheel on disk is deleted. A recorded wheel whose bytes no longer match its record
stays recorded (with the recorded sha256) and is reported: republishing the good wheel replaces it.
"""

from __future__ import annotations

import json
import os
import stat
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from farm.errors import BadInput, shorten
from farm.recipes.buildrecord import BuildRecord
from farm.settings import display
from farm.wheelhouse.index import FILES, rebuild_pages
from farm.wheelhouse.maintain import file_sha256, files_not_a_folder, house_files, what_it_is
from farm.wheelhouse.manifest import (
    _REQUIRED,
    MANIFEST,
    ManifestEntry,
    house_folder,
    locked,
    scan,
    unframe,
    write_journal,
)
from farm.wheelhouse.names import BUILD_INFO_NAME, parse_wheel_name
from farm.wheelhouse.publish import _check_record, _entry, _Prepared, read_metadata


@dataclass
class RecoverResult:
    kept: int = 0
    added: list[str] = field(default_factory=list)       # wheels given a record from the file itself
    dropped: list[str] = field(default_factory=list)     # records whose wheel is gone
    removed: list[str] = field(default_factory=list)     # links / strays taken out of files/
    sidecars: list[str] = field(default_factory=list)    # .metadata rewritten from the wheel
    damaged: list[str] = field(default_factory=list)     # bytes differ from the record: republish the good wheel
    left: list[str] = field(default_factory=list)        # files recover cannot list (not a farm wheel, ...)
    bad_lines: int = 0                                    # damaged journal lines dropped
    torn: int = 0                                         # bytes of a torn tail cut
    pages: int = 0


def carried_record(path: Path) -> BuildRecord:
    """The build record a wheel carries in its own .dist-info/farm_build.json (empty when it has none, or when
    the file is not a readable farm wheel: listing it fails later, and says why). One it carries in another
    form than the build writes (design.md §4.5), or at odds with its label, is refused: BadInput naming the
    wheel, the key and the value."""
    from farm.wheelhouse.wheelfile import ZIP_READ_ERRORS
    try:
        wn = parse_wheel_name(path.name, str(path))
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(f".dist-info/{BUILD_INFO_NAME}")]
            data = zf.read(names[0]) if len(names) == 1 else None
    except (BadInput, *ZIP_READ_ERRORS):
        return BuildRecord({})
    if data is None:
        return BuildRecord({})
    where = f"{display(path)} {BUILD_INFO_NAME}"
    fix = "nothing changed; move the wheel away, or publish it with a good --record"
    try:
        rec = json.loads(data)
    except ValueError as exc:   # UnicodeDecodeError too
        raise BadInput(where, None, None, f"not JSON ({shorten(str(exc), 80)}); {fix}") from None
    try:
        return _check_record(where, wn, rec)
    except BadInput as exc:
        raise BadInput(exc.where, exc.key, exc.value, f"{exc.problem}; {fix}") from None


def _derive(path: Path, project: str, when: str, rec: BuildRecord) -> tuple[ManifestEntry, bytes]:
    """A record for a wheel file no record accounts for, from the file and the build record it carries
    (BadInput when it cannot be listed)."""
    from farm.wheelhouse.wheelfile import wheel_file_problems

    wn = parse_wheel_name(path.name, str(path))
    if wn.project != project:
        raise BadInput(str(path), None, None, f"a wheel of {wn.project!r} in the folder of {project!r}")
    problems = wheel_file_problems(path)
    if problems:
        raise BadInput(str(path), None, None, f"not a sound wheel file: {problems[0]}")
    metadata, name, requires = read_metadata(path, wn)
    st = path.stat()
    p = _Prepared(path, wn, metadata, requires, rec.with_(recovered=when), metadata_name=name,
                  sha256=file_sha256(path), size=st.st_size)
    mtime = datetime.fromtimestamp(st.st_mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return _entry(p, mtime, rec.host or "recovered"), metadata


def _write_sidecar(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _wheel_metadata(path: Path) -> bytes:
    with zipfile.ZipFile(path) as zf:
        inner = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        return zf.read(inner[0]) if len(inner) == 1 else b""


def _refuse_what_it_cannot_see(root: Path, live: dict[str, ManifestEntry]) -> None:
    """Refuse (BadInput, nothing changed) while files/ or a folder under it is not a real folder recover can
    list: a link, a file, a FIFO, missing while the journal lists wheels, unreadable. What recover cannot see
    is never taken for wheels that are gone (design.md §9.5); a person puts the real folder in its place."""
    fix = "recover cannot see the wheels there, nothing changed; put the real folder in its place"
    outside = files_not_a_folder(root)
    if outside:
        raise BadInput(display(root / FILES), None, None, f"{outside}, not a folder: {fix}")
    if live and not (root / FILES).exists():
        raise BadInput(display(root / FILES), None, None,
                       f"missing while the journal lists {len(live)} wheel(s): {fix} (or remove the journal)")
    for rel, path, st in house_files(root):   # BadInput when a folder cannot be listed
        if rel.count("/") == 1 and not stat.S_ISDIR(st.st_mode):
            kind = what_it_is(path, st)
            raise BadInput(display(path), None, None, f"{kind}, not a project folder: {fix}, or move it away")


def _sha256(path: Path) -> str:
    try:
        return file_sha256(path)
    except OSError as exc:
        raise BadInput(display(path), None, None,
                       f"cannot be read ({exc.strerror or exc}): recover changed nothing") from None


def recover(wheelhouse: Path | str) -> RecoverResult:
    root = house_folder(wheelhouse)
    result = RecoverResult()
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with locked(root):
        try:
            data = (root / MANIFEST).read_bytes()
        except FileNotFoundError:
            data = b""
        found = scan(data)
        result.bad_lines, result.torn = len(found.bad), found.torn
        live: dict[str, ManifestEntry] = {}
        removed: dict[str, str] = {}   # file -> its remove record's text (history for prune)
        for _, text, rec in found.records:
            file = rec["file"]
            if rec["op"] == "remove":
                live.pop(file, None)
                removed[file] = unframe(text)   # write_journal frames it again
                continue
            try:
                if _REQUIRED - rec.keys():
                    raise TypeError("fields missing")
                entry = ManifestEntry.from_dict(rec)
            except TypeError:
                result.bad_lines += 1   # its wheel, if on disk, gets a record from the file below
                continue
            live.pop(file, None)
            live[file] = entry
            removed.pop(file, None)
        _refuse_what_it_cannot_see(root, live)
        on_disk: set[str] = set()
        derived: list[tuple[float, str, ManifestEntry]] = []
        unlink: list[tuple[str, Path]] = []          # nothing is written before every file was looked at
        sidecars: list[tuple[str, Path, bytes]] = []
        listed = list(house_files(root))
        for rel, path, st in listed:
            mode = st.st_mode
            if rel.count("/") == 1:
                continue   # a real folder: _refuse_what_it_cannot_see refused anything else
            if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                unlink.append((rel, path))
                continue
            project, name = rel.split("/")[1:]
            if stat.S_ISDIR(mode):
                result.left.append(f"{rel}: a folder")
                continue
            if name.endswith(".metadata"):
                continue   # with its wheel, below
            e = live.get(name)
            if e is not None and e.project == project:
                on_disk.add(name)
                if _sha256(path) != e.sha256:
                    result.damaged.append(rel)
                    continue
                metadata = _wheel_metadata(path)
            else:
                carried = carried_record(path)   # a forged one: refused before anything is written
                try:
                    e, metadata = _derive(path, project, now, carried)
                except (BadInput, zipfile.BadZipFile, OSError) as exc:
                    result.left.append(f"{rel}: {exc}")
                    continue
                on_disk.add(name)
                derived.append((st.st_mtime, name, e))
                result.added.append(rel)
            sidecar = path.with_name(name + ".metadata")
            try:
                same = sidecar.read_bytes() == metadata
            except OSError:
                same = False
            if not same:
                sidecars.append((rel + ".metadata", sidecar, metadata))
        for file, e in list(live.items()):
            if file not in on_disk:
                del live[file]
                result.dropped.append(f"{FILES}/{e.project}/{file}")
                removed[file] = json.dumps({"op": "remove", "file": file, "project": e.project, "at": now,
                                            "reason": "recover: the wheel file is gone"}, sort_keys=True)
        for rel, path, st in listed:   # sidecars whose wheel is not listed
            if rel.endswith(".metadata") and stat.S_ISREG(st.st_mode) \
                    and path.name.removesuffix(".metadata") not in on_disk:
                unlink.append((rel, path))
        for rel, path in unlink:
            path.unlink()
            result.removed.append(rel)
        for rel, path, metadata in sidecars:
            _write_sidecar(path, metadata)
            result.sidecars.append(rel)
        result.kept = len(live)
        derived.sort(key=lambda t: (t[0], t[1]))
        for _, name, e in derived:
            live[name] = e
            removed.pop(name, None)
        write_journal(root, [*removed.values(), *(e.to_json() for e in live.values())])
        site, _ = rebuild_pages(root, allow_shrink=True)
        result.pages = len(site.kind)
    return result
