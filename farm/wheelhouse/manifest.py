"""The wheelhouse journal: `manifest.jsonl`, append-only, the source of truth (design.md §9.2).

One JSON object per line. `{"op": "add", ...}` records a published wheel (a
ManifestEntry); `{"op": "remove", "file": ...}` records a pruned one. Lines are
appended under an exclusive lock (flock on `.lock`, released by the kernel
when the holder dies), written with one write() and fsynced.

Framing: every line written carries its own checksum as its last key,
`{...,"~crc32":"1a2b3c4d"}`, the CRC-32 of the same line with that key left
out (`{...}`). The line stays plain JSON, so the whole journal still parses in
one json.loads. Lines without the key (written before framing, or by hand)
are read as they are: existing houses load unchanged, and `farm index recover`
rewrites the whole journal framed when asked. A line that fails its checksum,
is not UTF-8 or not JSON is damage: readers refuse in one line naming it.

A torn tail is the bytes after the last newline: an append whose writer died
mid-write. Readers ignore it. `farm index verify` reports it (exit 1); `farm
index recover` cuts it (saying so) and re-derives any wheel it described from
files/. A publish cuts it only when every file under files/ is accounted for
by the journal; otherwise (or when the journal is missing or empty while
files/ holds wheels) it refuses in one line, so a record is never dropped
silently.

Yanking is not journalled: it is a pure function of the journal (retention
keeps the last two wheels per cell, design.md §9.4), so pages and `packages.json`
derive it the same way every time.

A publish reads the journal per project through its index and cache (journalindex.py).
"""

from __future__ import annotations

import errno
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from farm import settings
from farm.errors import BadInput, FarmError
from farm.filelock import lock
from farm.settings import display

MANIFEST = "manifest.jsonl"
LOCK = ".lock"
CACHE = ".manifest.idx"
KEEP_PER_CELL = 2


@dataclass(frozen=True)
class ManifestEntry:
    """One published wheel: everything the index pages need, so they never open the wheel."""

    file: str                   # wheel file name as published
    project: str                # PEP 503-normalised; the folder under files/
    name: str                   # Name: as METADATA spells it
    version: str                # full version with local label
    build_tag: str | None
    python_tag: str
    abi_tag: str
    platform_tag: str
    cuda: str                   # '12.8'
    torch: str | None           # '2.8'; None for torch-free wheels (listed in every torch channel of the line)
    platform: str | None        # linux | windows | linux_aarch64; None for platform-independent wheels
    pythons: tuple[str, ...]    # Pythons served ('3.11',), or the row's Pythons for abi3 / py3-none
    size: int
    sha256: str
    metadata_sha256: str        # sha256 of files/<project>/<file>.metadata (PEP 658 / 714)
    requires_python: str | None
    cell: str                   # design.md §5.2 cell id (from the build record, else derived from the name)
    build_key: str | None = None
    arch_list: str | None = None
    published: str = ""         # UTC, ISO 8601
    host: str = ""
    extra: dict[str, Any] = field(default_factory=dict, hash=False)   # other build-record fields worth keeping (toolkit, image, ...)

    @property
    def channels_fixed(self) -> tuple[str, str] | None:
        """(cuda, torch) for torch-linked wheels; None when the channels depend on the house (torch-free)."""
        return (self.cuda, self.torch) if self.torch else None

    @property
    def label(self) -> str:
        cu = "cu" + self.cuda.replace(".", "")
        return f"{cu}torch{self.torch}" if self.torch else cu

    def to_json(self) -> str:
        d = {"op": "add", **asdict(self)}
        d["pythons"] = list(self.pythons)
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ManifestEntry:
        d = {k: v for k, v in d.items() if k in _ENTRY_FIELDS} if d.keys() - _ENTRY_FIELDS != {"op"} else dict(d)
        d.pop("op", None)
        d["pythons"] = tuple(d.get("pythons") or ())
        return cls(**d)


_ENTRY_FIELDS = {f.name for f in fields(ManifestEntry)}
_REQUIRED = {f.name for f in fields(ManifestEntry) if f.default is MISSING and f.default_factory is MISSING}


# ---------------------------------------------------------------- fault injection

_steps = 0


def step(name: str) -> None:
    """A point where a real crash could happen. FARM_WHEELHOUSE_FAULT_AT=N kills the process at the Nth.

    Used by the crash-safety test to stop publishing after every single write
    step, the same way SIGKILL would (no cleanup, no flush of Python buffers).
    FARM_WHEELHOUSE_STEPS=path appends each step's name there (to count them);
    FARM_WHEELHOUSE_STEP_FD=n writes one byte per step to that descriptor (a pipe a test
    reads to kill the process right after a chosen step, without polling).
    """
    global _steps
    _steps += 1
    log = settings.WHEELHOUSE_STEPS.get()
    if log:
        with open(log, "a") as fh:
            fh.write(f"{_steps} {name}\n")
    fd = settings.WHEELHOUSE_STEP_FD.get()
    if fd:
        os.write(int(fd), b".")
    at = settings.WHEELHOUSE_FAULT_AT.get()
    if at and int(at) == _steps:
        os._exit(137)


# ---------------------------------------------------------------- files

def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def house_folder(root: Path | str, create: bool = False) -> Path:
    """The wheelhouse folder, refused in one line when it is a file, or missing and not to be created.

    Only commands that publish create a house; the ones asked to read or
    repair one never make a folder.
    """
    root = Path(root)
    if root.is_dir():
        return root
    if root.exists() or root.is_symlink():
        raise BadInput(display(root), "--wheelhouse", None, "not a folder")
    if not create:
        raise BadInput(display(root), "--wheelhouse", None, "no such wheelhouse (nothing created)")
    parent = root.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise BadInput(display(root), "--wheelhouse", None, f"cannot be created: {display(parent)} is not a folder")
    return root


@contextmanager
def locked(root: Path, create: bool = False) -> Iterator[None]:
    """The wheelhouse's exclusive lock: journal appends and page writes happen inside it."""
    root = house_folder(root, create)
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)   # Windows: none
    try:
        lock(fd)
        yield
    finally:
        os.close(fd)  # closing drops the flock


# ---------------------------------------------------------------- framing

_MARK = b',"~crc32":"'
_FRAME = len(_MARK) + 8 + 2     # ,"~crc32":"XXXXXXXX"}


def frame(text: str) -> str:
    """One JSON object's text with its checksum as its last key (see the module docstring)."""
    if not (text.startswith("{") and text.endswith("}")) or text == "{}":
        raise ValueError("frame() takes a non-empty JSON object")
    return f'{text[:-1]},"~crc32":"{zlib.crc32(text.encode("utf-8")):08x}"}}'


def unframe(text: str) -> str:
    """A line as frame() took it: its checksum key left out (an unframed line comes back as it is)."""
    if text[-_FRAME:-10] == _MARK.decode() and text.endswith('"}'):
        return text[:-_FRAME] + "}"
    return text


def _intact(raw: bytes) -> bool:
    """A framed line's checksum matches (an unframed line has none to check)."""
    if raw[-_FRAME:-10] != _MARK or not raw.endswith(b'"}'):
        return True
    try:
        return zlib.crc32(b"}", zlib.crc32(memoryview(raw)[:-_FRAME])) == int(raw[-10:-2], 16)
    except ValueError:
        return False


@dataclass
class Scan:
    """What a read of journal bytes found: good records, damaged complete lines, and a torn tail."""

    records: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)   # (line number, text, record)
    starts: dict[int, int] = field(default_factory=dict)                # line number -> byte offset in the data
    bad: list[tuple[int, str]] = field(default_factory=list)             # (line number, problem)
    torn: int = 0            # bytes after the last newline (a torn append)
    torn_line: int = 0       # its line number
    end: int = 0             # bytes of complete lines (where a torn tail starts)
    lines: int = 0           # complete lines, blank ones included


def scan(data: bytes, first: int = 1) -> Scan:
    """Split journal bytes into records, damaged lines and a torn tail; never raises on content."""
    out = Scan()
    out.end = data.rfind(b"\n") + 1
    out.torn = len(data) - out.end
    raws = data[:out.end].split(b"\n")[:-1]
    out.lines = len(raws)
    out.torn_line = first + len(raws)
    try:   # decoding once is much faster than once per line; a line that is not UTF-8 is found below
        decoded = data[:out.end].decode("utf-8").split("\n")
    except UnicodeDecodeError:
        decoded = None
    texts: list[tuple[int, str]] = []
    pos = 0
    for i, raw in enumerate(raws):
        n, start = first + i, pos
        pos += len(raw) + 1
        if not raw or raw.isspace():
            continue
        if not _intact(raw):
            out.bad.append((n, "checksum mismatch (a damaged record)"))
            continue
        if decoded is not None:
            text = decoded[i]
        else:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                out.bad.append((n, "not UTF-8 (binary)"))
                continue
        texts.append((n, text))   # unframed lines: JSON decides below
        out.starts[n] = start
    try:  # one parse for many lines is several times faster than one per line
        parsed = json.loads("[" + ",".join(t for _, t in texts) + "]")
    except (json.JSONDecodeError, RecursionError):
        parsed = []
        for _, text in texts:
            try:
                parsed.append(json.loads(text))
            except (json.JSONDecodeError, RecursionError) as exc:
                parsed.append(exc)
    for (n, text), rec in zip(texts, parsed, strict=True):
        if isinstance(rec, Exception):
            out.bad.append((n, f"not JSON: {getattr(rec, 'msg', rec)}"))
        elif not isinstance(rec, dict) or rec.get("op") not in ("add", "remove") \
                or not isinstance(rec.get("project", ""), str) or not isinstance(rec.get("file"), str):
            out.bad.append((n, "not a manifest record (an object with op add or remove, file and project)"))
        else:
            out.records.append((n, text, rec))
    out.bad.sort()
    return out


def refuse_damage(path: Path, found: Scan) -> None:
    """Readers stop at damaged complete lines: one line naming the first, and the command that repairs."""
    if found.bad:
        n, problem = found.bad[0]
        more = f" ({len(found.bad) - 1} more damaged line(s))" if len(found.bad) > 1 else ""
        raise BadInput(f"{display(path)}:{n}", None, None,
                       f"{problem}{more}; `farm index recover` rebuilds the manifest from files/")


@dataclass
class Journal:
    """The parsed manifest: live entries in publish order, plus every file name ever removed."""

    entries: list[ManifestEntry]
    removed: dict[str, str]          # file -> when (for prune bookkeeping)
    exists: bool = True              # manifest.jsonl is there
    size: int = 0
    torn: int = 0                    # bytes of a torn tail (ignored)

    def live(self) -> list[ManifestEntry]:
        return self.entries

    def by_file(self) -> dict[str, ManifestEntry]:
        return {e.file: e for e in self.entries}


def live_entries(path: Path, records: Iterable[tuple[int, dict[str, Any] | None]]) -> tuple[dict[str, ManifestEntry], dict[str, str]]:
    """Apply (line number, record) pairs in journal order: live entries by file (publish order), removed files."""
    live: dict[str, ManifestEntry] = {}
    removed: dict[str, str] = {}
    for n, rec in records:
        if rec is None:
            continue
        op = rec.get("op") if isinstance(rec, dict) else None
        if op == "add":
            missing = _REQUIRED - rec.keys()
            if missing:
                raise BadInput(f"{display(path)}:{n}", sorted(missing)[0], None, "missing in a manifest record")
            try:
                entry = ManifestEntry.from_dict(rec)
            except TypeError as exc:
                raise BadInput(f"{display(path)}:{n}", None, None, f"not a manifest record: {exc}") from None
            live.pop(entry.file, None)
            live[entry.file] = entry
            removed.pop(entry.file, None)
        elif op == "remove":
            file = rec.get("file")
            if not isinstance(file, str):
                raise BadInput(f"{display(path)}:{n}", "file", file, "missing in a manifest remove record")
            live.pop(file, None)
            removed[file] = rec.get("at", "")
        else:
            raise BadInput(f"{display(path)}:{n}", "op", op, "unknown manifest record (expected add or remove)")
    return live, removed


def parse_checked(path: Path, lines: list[str], first: int = 1) -> list[tuple[int, dict[str, Any] | None]]:
    """Lines already checked by scan() (or this process's own): parse in one go."""
    records = json.loads("[" + ",".join(line or "null" for line in lines) + "]")
    return list(enumerate(records, first))


def read_journal(root: Path) -> Journal:
    """Parse all of manifest.jsonl. A torn tail is ignored (Journal.torn); a damaged line is BadInput."""
    path = Path(root) / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Journal([], {}, exists=False)
    except IsADirectoryError:
        raise BadInput(display(path), None, None, "not a file") from None
    found = scan(data)
    refuse_damage(path, found)
    live, removed = live_entries(path, ((n, rec) for n, _, rec in found.records))
    return Journal(list(live.values()), removed, size=len(data), torn=found.torn)


def append_records(root: Path, lines: Iterable[str]) -> list[str]:
    """Append records, framed (caller holds the lock). Cuts off a torn tail first; one write, then fsync.

    Returns the lines as written (framed).
    """
    framed = [frame(line) for line in lines]
    payload = "".join(line + "\n" for line in framed).encode("utf-8")
    if not payload:
        return []
    path = Path(root) / MANIFEST
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size:
            tail_start = max(0, size - 65536)
            tail = os.pread(fd, size - tail_start, tail_start)
            if not tail.endswith(b"\n"):
                cut = tail.rfind(b"\n")
                keep = tail_start + cut + 1 if cut >= 0 else (0 if tail_start == 0 else None)
                if keep is None:
                    raise FarmError(f"{display(path)}: last record longer than 64 KiB and torn; "
                                    "`farm index recover` repairs it")
                os.ftruncate(fd, keep)
        step("manifest: before append")
        fault = settings.WHEELHOUSE_FAULT_AT.get()
        if fault and int(fault) == _steps + 1:
            os.write(fd, payload[: max(1, len(payload) // 2)])  # a torn append, as a crash mid-write leaves it
        step("manifest: torn append")
        _write_all(fd, payload)
        os.fsync(fd)
        step("manifest: appended")
    finally:
        os.close(fd)
    return framed


def write_journal(root: Path, lines: Iterable[str]) -> None:
    """Replace the whole journal (caller holds the lock): framed lines to a temporary, fsync, rename."""
    path = Path(root) / MANIFEST
    tmp = path.with_name(f".{MANIFEST}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write("".join(frame(line) + "\n" for line in lines).encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    (Path(root) / CACHE).unlink(missing_ok=True)   # the journal index's cache (journalindex.py)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            raise
        view = view[n:]
