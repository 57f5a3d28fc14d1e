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
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from ..errors import BadInput, FarmError
from ..paths import display

MANIFEST = "manifest.jsonl"
LOCK = ".lock"
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
        d = {k: v for k, v in d.items() if k in _ENTRY_FIELDS}
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


def read_journal(root: Path) -> Journal:
    """Parse manifest.jsonl; a torn last line (no newline) is ignored, any other bad line is BadInput."""
    path = Path(root) / MANIFEST
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return Journal([], {})
    end = data.rfind(b"\n") + 1
    text = data[:end].decode("utf-8")
    lines = text.split("\n")[:-1]
    try:  # one parse for the whole file is several times faster than one per line
        records = json.loads("[" + ",".join(line or "null" for line in lines) + "]")
    except json.JSONDecodeError:
        records = [_parse_line(path, i, line) for i, line in enumerate(lines, 1)]
    live: dict[str, ManifestEntry] = {}
    removed: dict[str, str] = {}
    for i, rec in enumerate(records, 1):
        if rec is None:
            continue
        op = rec.get("op") if isinstance(rec, dict) else None
        if op == "add":
            missing = _REQUIRED - rec.keys()
            if missing:
                raise BadInput(f"{display(path)}:{i}", sorted(missing)[0], None, "missing in a manifest record")
            entry = ManifestEntry.from_dict(rec)
            live.pop(entry.file, None)
            live[entry.file] = entry
            removed.pop(entry.file, None)
        elif op == "remove":
            live.pop(rec.get("file"), None)
            removed[rec.get("file")] = rec.get("at", "")
        else:
            raise BadInput(f"{display(path)}:{i}", "op", op, "unknown manifest record (expected add or remove)")
    return Journal(list(live.values()), removed)


def _parse_line(path: Path, i: int, line: str):
    if not line.strip():
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{display(path)}:{i}", None, line[:60], f"not JSON: {exc.msg}") from None


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
