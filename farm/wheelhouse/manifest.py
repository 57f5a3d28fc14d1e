"""The wheelhouse journal: `manifest.jsonl`, append-only, the source of truth (SPEC 10).

One JSON object per line. `{"op": "add", ...}` records a published wheel (a
ManifestEntry); `{"op": "remove", "file": ...}` records a pruned one. Lines are
appended under an exclusive lock (flock on `.lock`, released by the kernel
when the holder dies), written with one write() and fsynced. A line without
its newline is a record whose writer died mid-append: readers ignore it and
the next appender cuts it off, so it never counts.

Yanking is not journalled: it is a pure function of the journal (retention
keeps the last two wheels per cell, SPEC 10), so pages and `packages.json`
derive it the same way every time.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pickle
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from ..errors import BadInput, FarmError
from ..paths import display
from .names import hyphen_name

MANIFEST = "manifest.jsonl"
LOCK = ".lock"
CACHE = ".manifest.idx"
CACHE_VERSION = 1
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
    FARM_WHEELHOUSE_STEPS=path appends each step's name there (to count them).
    """
    global _steps
    _steps += 1
    log = os.environ.get("FARM_WHEELHOUSE_STEPS")
    if log:
        with open(log, "a") as fh:
            fh.write(f"{_steps} {name}\n")
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


@contextmanager
def locked(root: Path) -> Iterator[None]:
    """The wheelhouse's exclusive lock: journal appends and page writes happen inside it."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


@dataclass
class Journal:
    """The parsed manifest: live entries in publish order, plus every file name ever removed."""

    entries: list[ManifestEntry]
    removed: dict[str, str]          # file -> when (for prune bookkeeping)

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
            entry = ManifestEntry.from_dict(rec)
            live.pop(entry.file, None)
            live[entry.file] = entry
            removed.pop(entry.file, None)
        elif op == "remove":
            live.pop(rec.get("file"), None)
            removed[rec.get("file")] = rec.get("at", "")
        else:
            raise BadInput(f"{display(path)}:{n}", "op", op, "unknown manifest record (expected add or remove)")
    return live, removed


def _complete_lines(data: bytes) -> list[str]:
    end = data.rfind(b"\n") + 1  # a torn last line (no newline) is not a record yet
    return data[:end].decode("utf-8").split("\n")[:-1]


def _parse_line(path: Path, i: int, line: str):
    if not line.strip():
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{display(path)}:{i}", None, line[:60], f"not JSON: {exc.msg}") from None


def _parse_all(path: Path, lines: list[str], first: int = 1) -> list[tuple[int, dict | None]]:
    try:  # one parse for many lines is several times faster than one per line
        records = json.loads("[" + ",".join(line or "null" for line in lines) + "]")
    except json.JSONDecodeError:
        records = [_parse_line(path, i, line) for i, line in enumerate(lines, first)]
    return list(enumerate(records, first))


def read_journal(root: Path) -> Journal:
    """Parse all of manifest.jsonl; a torn last line is ignored, any other bad line is BadInput."""
    path = Path(root) / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Journal([], {})
    live, removed = _live(path, _parse_all(path, _complete_lines(data)))
    return Journal(list(live.values()), removed)


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


class JournalIndex:
    """The journal's raw lines grouped by project, with a Summary per project.

    All journal semantics are per project (a file name fixes its project), so a
    publish parses only the lines of the projects it touches. The grouping is
    cached in `.manifest.idx` with the byte offset it covers; lines appended
    since are read on load. The cache is only an accelerator: if it does not
    match the journal (other file, other head, offset not at a line end) it
    is ignored and the journal parsed in full.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.lines: dict[str, list[tuple[int, str]]] = {}
        self.summaries: dict[str, Summary] = {}
        self.offset = 0
        self.count = 0
        self.ino = None
        self.head = b""
        self.unsaved = 0
        self._entries: dict[str, list[ManifestEntry]] = {}
        self._parsed: dict[int, dict | None] = {}   # line number -> record, for lines parsed while loading

    @classmethod
    def load(cls, root: Path) -> JournalIndex:
        idx = cls(root)
        path = idx.root / MANIFEST
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            return idx
        with fh:
            st = os.fstat(fh.fileno())
            head = fh.read(4096)
            cached = idx._read_cache(st.st_ino, head, fh)
            if cached is not None:
                idx = cached
            idx.ino, idx.head = st.st_ino, head
            fh.seek(idx.offset)
            tail = fh.read()
        lines = _complete_lines(tail)
        touched = set()
        for text, (n, rec) in zip(lines, _parse_all(path, lines, idx.count + 1), strict=True):
            idx.count += 1
            if rec is None:
                continue
            project = rec.get("project") if isinstance(rec, dict) else None
            if not isinstance(project, str):
                raise BadInput(f"{display(path)}:{n}", "project", project, "every manifest record names its project")
            idx.lines.setdefault(project, []).append((idx.count, text))
            idx._parsed[idx.count] = rec
            touched.add(project)
        idx.offset += sum(len(line.encode("utf-8")) + 1 for line in lines)
        idx.unsaved += len(lines)
        for project in touched:
            idx._entries.pop(project, None)
            idx.summaries[project] = Summary.of(idx.entries(project))
        idx._parsed.clear()
        return idx

    def _read_cache(self, ino: int, head: bytes, fh) -> JournalIndex | None:
        try:
            with open(self.root / CACHE, "rb") as c:
                data = pickle.load(c)
            if data.get("version") != CACHE_VERSION or data["ino"] != ino or data["head"] != head[:len(data["head"])]:
                return None
            if data["offset"]:
                fh.seek(data["offset"] - 1)
                if fh.read(1) != b"\n":
                    return None
        except Exception:  # a missing, torn or foreign cache is no error: parse the journal instead
            return None
        idx = JournalIndex(self.root)
        idx.lines, idx.summaries = data["lines"], data["summaries"]
        idx.offset, idx.count = data["offset"], data["count"]
        return idx

    def save(self, force: bool = False) -> None:
        """Rewrite the cache (caller holds the lock) when enough lines were read past it."""
        if not (force or self.unsaved >= CACHE_EVERY) or self.ino is None:
            return
        data = {"version": CACHE_VERSION, "ino": self.ino, "head": self.head[:4096], "offset": self.offset,
                "count": self.count, "lines": self.lines, "summaries": self.summaries}
        tmp = self.root / f"{CACHE}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(data, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, self.root / CACHE)
        self.unsaved = 0

    def projects(self) -> list[str]:
        return sorted(p for p, s in self.summaries.items() if s.folders)

    def entries(self, project: str) -> list[ManifestEntry]:
        """Live entries of one project, in publish order."""
        if project not in self._entries:
            path = self.root / MANIFEST
            rows = self.lines.get(project, [])
            todo = [(n, text) for n, text in rows if n not in self._parsed]
            parsed = {n: rec for (n, _), (_, rec) in zip(todo, _parse_all(path, [t for _, t in todo]), strict=True)}
            live, _ = _live(path, ((n, parsed[n] if n in parsed else self._parsed[n]) for n, _ in rows))
            self._entries[project] = list(live.values())
        return self._entries[project]

    def appended(self, lines: list[str]) -> None:
        """Account for records this process just appended (under the lock)."""
        for text in lines:
            self.count += 1
            project = json.loads(text)["project"]
            self.lines.setdefault(project, []).append((self.count, text))
            self._entries.pop(project, None)
            self.summaries[project] = Summary.of(self.entries(project))
            self.offset += len(text.encode("utf-8")) + 1
            self.unsaved += 1
        if self.ino is None:
            st = os.stat(self.root / MANIFEST)
            with open(self.root / MANIFEST, "rb") as fh:
                self.ino, self.head = st.st_ino, fh.read(4096)


def append_records(root: Path, lines: Iterable[str]) -> None:
    """Append records (caller holds the lock). Cuts off a torn tail first; one write, then fsync."""
    payload = "".join(line + "\n" for line in lines).encode("utf-8")
    if not payload:
        return
    path = Path(root) / MANIFEST
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size:
            tail_start = max(0, size - 65536)
            tail = os.pread(fd, size - tail_start, tail_start)
            if not tail.endswith(b"\n"):
                cut = tail.rfind(b"\n")
                keep = tail_start + cut + 1 if cut >= 0 else (0 if tail_start == 0 else None)
                if keep is None:
                    raise FarmError(f"{display(path)}: last record longer than 64 KiB and torn; repair by hand")
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
