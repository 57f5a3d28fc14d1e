"""The wheelhouse journal: `manifest.jsonl`, append-only, the source of truth (SPEC 10).

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
keeps the last two wheels per cell, SPEC 10), so pages and `packages.json`
derive it the same way every time.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from farm.errors import BadInput, FarmError
from farm.paths import display
from farm.wheelhouse.names import hyphen_name

MANIFEST = "manifest.jsonl"
LOCK = ".lock"
CACHE = ".manifest.idx"
CACHE_VERSION = 2
CACHE_EVERY = 256   # journal lines read past the cache before it is rewritten
KEEP_PER_CELL = 2


class PublishConflict(FarmError):
    """A file name already published with other bytes: new bytes never reuse an old name (SPEC 7.4)."""

    exit_code = 2


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
    cell: str                   # SPEC 7.2 cell id (from the build record, else derived from the name)
    build_key: str | None = None
    arch_list: str | None = None
    published: str = ""         # UTC, ISO 8601
    host: str = ""
    extra: dict = field(default_factory=dict, hash=False)   # other build-record fields worth keeping (toolkit, image, ...)

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
    def from_dict(cls, d: dict) -> ManifestEntry:
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
    log = os.environ.get("FARM_WHEELHOUSE_STEPS")
    if log:
        with open(log, "a") as fh:
            fh.write(f"{_steps} {name}\n")
    fd = os.environ.get("FARM_WHEELHOUSE_STEP_FD")
    if fd:
        os.write(int(fd), b".")
    at = os.environ.get("FARM_WHEELHOUSE_FAULT_AT")
    if at and int(at) == _steps:
        os._exit(137)


# ---------------------------------------------------------------- files

def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def house_folder(root, create: bool = False) -> Path:
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
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
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

    records: list[tuple[int, str, dict]] = field(default_factory=list)   # (line number, text, record)
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


def _live(path: Path, records: Iterable[tuple[int, dict | None]]) -> tuple[dict[str, ManifestEntry], dict[str, str]]:
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
            live.pop(rec.get("file"), None)
            removed[rec.get("file")] = rec.get("at", "")
        else:
            raise BadInput(f"{display(path)}:{n}", "op", op, "unknown manifest record (expected add or remove)")
    return live, removed


def _parse_all(path: Path, lines: list[str], first: int = 1) -> list[tuple[int, dict | None]]:
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
    live, removed = _live(path, ((n, rec) for n, _, rec in found.records))
    return Journal(list(live.values()), removed, size=len(data), torn=found.torn)


@dataclass(frozen=True)
class Summary:
    """What the rest of the house needs to know about one project without reading its entries."""

    linked: tuple[tuple[str, str], ...]   # (cuda, torch) of its torch-linked wheels
    free: tuple[str, ...]                 # CUDA lines of its torch-free wheels
    folders: tuple[str, ...]              # its folders in the comfy-env view

    @classmethod
    def of(cls, entries: Iterable[ManifestEntry]) -> Summary:
        entries = list(entries)
        return cls(tuple(sorted({(e.cuda, e.torch) for e in entries if e.torch})),
                   tuple(sorted({e.cuda for e in entries if not e.torch})),
                   tuple(sorted({f for e in entries for f in (hyphen_name(e.name), e.project)})))

    def to_list(self) -> list:
        return [[list(p) for p in self.linked], list(self.free), list(self.folders)]

    @classmethod
    def from_list(cls, data) -> Summary:
        linked, free, folders = data
        pairs = tuple((str(c), str(t)) for c, t in linked)
        if not all(isinstance(x, str) for x in (*free, *folders)):
            raise ValueError("not a summary")
        return cls(pairs, tuple(free), tuple(folders))


def _head_digest(head: bytes) -> str:
    return hashlib.sha256(head).hexdigest()


class JournalIndex:
    """The journal's raw lines grouped by project, with a Summary per project.

    All journal semantics are per project (a file name fixes its project), so a
    publish parses only the lines of the projects it touches. The grouping is
    cached as JSON in `.manifest.idx` (no format that can run code) with the
    byte offset it covers; lines appended since are read on load. The cache is
    only an accelerator: if it is unreadable, or does not match the journal
    (other file, other head, offset not at a line end), it is ignored, the
    journal parsed in full and the cache rewritten at the next save.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.lines: dict[str, list[int]] = {}   # project -> [line number, byte offset, length, ...] (flat)
        self._texts: dict[int, str] = {}                           # line number -> text, when in memory
        self.summaries: dict[str, Summary] = {}
        self.offset = 0
        self.count = 0
        self.ino = None
        self.head = b""
        self.unsaved = 0
        self.cache_bad = False      # a cache file was there but unusable: rewrite it at the next save
        self.torn = 0               # bytes of a torn tail past the last complete line
        self.size = 0
        self.exists = False
        self._entries: dict[str, list[ManifestEntry]] = {}
        self._fd: int | None = None
        self._parsed: dict[int, dict | None] = {}   # line number -> record, for lines parsed while loading

    @classmethod
    def load(cls, root: Path, summaries: bool = True) -> JournalIndex:
        """The index of the journal as it is now. `summaries=False`: only check it (state, damage)."""
        idx = cls(root)
        path = idx.root / MANIFEST
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            idx.cache_bad = (idx.root / CACHE).exists()
            return idx
        except IsADirectoryError:
            raise BadInput(display(path), None, None, "not a file") from None
        with fh:
            st = os.fstat(fh.fileno())
            head = fh.read(4096)
            cached = idx._read_cache(st.st_ino, head, fh)
            if cached is not None:
                idx = cached
            else:
                idx.cache_bad = (idx.root / CACHE).exists()
            idx.ino, idx.head = st.st_ino, head
            fh.seek(idx.offset)
            tail = fh.read()
        idx.exists = True
        found = scan(tail, idx.count + 1)
        refuse_damage(path, found)
        touched = set()
        for n, text, rec in found.records:
            project = rec.get("project")
            if not project:
                raise BadInput(f"{display(path)}:{n}", "project", project, "every manifest record names its project")
            idx.lines.setdefault(project, []).extend((n, idx.offset + found.starts[n], len(text.encode("utf-8"))))
            idx._texts[n] = text
            idx._parsed[n] = rec
            touched.add(project)
        idx.count += found.lines
        idx.offset += found.end
        idx.torn, idx.size = found.torn, idx.offset + found.torn
        idx.unsaved += found.lines
        for project in touched if summaries else ():
            idx._entries.pop(project, None)
            idx.summaries[project] = Summary.of(idx.entries(project))
        idx._parsed.clear()
        return idx

    def _read_cache(self, ino: int, head: bytes, fh) -> JournalIndex | None:
        try:
            with open(self.root / CACHE, "rb") as c:
                data = json.loads(c.read())
            if data.get("version") != CACHE_VERSION or data["ino"] != ino:
                return None
            n = data["head_len"]
            if not isinstance(n, int) or n > len(head) or _head_digest(head[:n]) != data["head"]:
                return None
            offset, count = data["offset"], data["count"]
            if not (isinstance(offset, int) and isinstance(count, int) and offset >= 0 and count >= 0):
                return None
            if offset:
                fh.seek(offset - 1)
                if fh.read(1) != b"\n":
                    return None
            lines = data["lines"]
            if not all(isinstance(rows, list) and len(rows) % 3 == 0 and set(map(type, rows)) <= {int}
                       for rows in lines.values()):
                return None
            summaries = {str(p): Summary.from_list(s) for p, s in data["summaries"].items()}
        except Exception:  # a missing, torn, garbage or foreign cache is no error: parse the journal instead
            return None
        idx = JournalIndex(self.root)
        idx.lines, idx.summaries = lines, summaries
        idx.offset, idx.count = offset, count
        return idx

    def save(self, force: bool = False) -> None:
        """Rewrite the cache (caller holds the lock) when enough lines were read past it."""
        if not (force or self.cache_bad or self.unsaved >= CACHE_EVERY) or self.ino is None:
            return
        head = self.head[:4096]
        data = {"version": CACHE_VERSION, "ino": self.ino, "head": _head_digest(head), "head_len": len(head),
                "offset": self.offset, "count": self.count, "lines": self.lines,
                "summaries": {p: s.to_list() for p, s in self.summaries.items()}}
        tmp = self.root / f".{CACHE}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, separators=(",", ":"))
        os.replace(tmp, self.root / CACHE)  # a cache need not survive a crash: no fsync
        self.unsaved = 0
        self.cache_bad = False

    def projects(self) -> list[str]:
        return sorted(p for p, s in self.summaries.items() if s.folders)

    def entries(self, project: str) -> list[ManifestEntry]:
        """Live entries of one project, in publish order."""
        if project not in self._entries:
            path = self.root / MANIFEST
            flat = self.lines.get(project, [])
            rows = [(n, self._text(n, start, length)) for n, start, length in
                    zip(flat[::3], flat[1::3], flat[2::3], strict=True)]
            todo = [(n, text) for n, text in rows if n not in self._parsed]
            parsed = {n: rec for (n, _), (_, rec) in zip(todo, _parse_all(path, [t for _, t in todo]), strict=True)}
            live, _ = _live(path, ((n, parsed[n] if n in parsed else self._parsed[n]) for n, _ in rows))
            self._entries[project] = list(live.values())
        return self._entries[project]

    def _text(self, n: int, start: int, length: int) -> str:
        """A journal line's text: in memory, else read at its offset (a line the cache covers)."""
        text = self._texts.get(n)
        if text is None:
            if self._fd is None:
                self._fd = os.open(self.root / MANIFEST, os.O_RDONLY)
            text = self._texts[n] = os.pread(self._fd, length, start).decode("utf-8")
        return text

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def appended(self, lines: list[str]) -> None:
        """Account for records this process just appended (under the lock), after a cut torn tail."""
        self.torn = 0
        for text in lines:
            self.count += 1
            project = json.loads(text)["project"]
            size = len(text.encode("utf-8"))
            self.lines.setdefault(project, []).extend((self.count, self.offset, size))
            self._texts[self.count] = text
            self._entries.pop(project, None)
            self.summaries[project] = Summary.of(self.entries(project))
            self.offset += size + 1
            self.unsaved += 1
        self.size = self.offset
        if self.ino is None:
            st = os.stat(self.root / MANIFEST)
            with open(self.root / MANIFEST, "rb") as fh:
                self.ino, self.head = st.st_ino, fh.read(4096)
        elif len(self.head) < 4096:
            with open(self.root / MANIFEST, "rb") as fh:
                self.head = fh.read(4096)


def cache_problem(root: Path) -> str | None:
    """A `.manifest.idx` that is there but no cache this farm wrote (garbage, another format), else None.
    Such a cache is only ignored and rewritten; `farm index verify` still names it."""
    path = Path(root) / CACHE
    try:
        data = json.loads(path.read_bytes())
        ok = isinstance(data, dict) and data.get("version") == CACHE_VERSION and \
            isinstance(data.get("lines"), dict) and isinstance(data.get("summaries"), dict)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError):
        ok = False
    return None if ok else f"{CACHE}: not a journal cache (ignored); the next publish or `farm index recover` rewrites it"


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
        fault = os.environ.get("FARM_WHEELHOUSE_FAULT_AT")
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
    (Path(root) / CACHE).unlink(missing_ok=True)


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
