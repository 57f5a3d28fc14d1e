"""The journal's index (design.md §9): manifest.jsonl's lines grouped by project, with a Summary per project,
cached in `.manifest.idx`, so a publish reads only the projects it touches (see JournalIndex).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from farm.errors import BadInput
from farm.settings import display
from farm.wheelhouse.manifest import (
    CACHE,
    MANIFEST,
    ManifestEntry,
    live_entries,
    parse_checked,
    refuse_damage,
    scan,
)
from farm.wheelhouse.names import hyphen_name

CACHE_VERSION = 3   # 3: a Summary says what each channel serves (`served`)
CACHE_EVERY = 256   # journal lines read past the cache before it is rewritten


@dataclass(frozen=True)
class Summary:
    """What the rest of the house needs to know about one project without reading its entries."""

    linked: tuple[tuple[str, str], ...]   # (cuda, torch) of its torch-linked wheels
    free: tuple[str, ...]                 # CUDA lines of its torch-free wheels
    folders: tuple[str, ...]              # its folders in the comfy-env view
    # (cuda, torch or "" when torch-free, platform or "any", python, version) of every wheel: what the
    # channel pages and `farm serve` say each channel serves, without reading the project's entries
    served: tuple[tuple[str, str, str, str, str], ...] = ()

    @classmethod
    def of(cls, entries: Iterable[ManifestEntry]) -> Summary:
        entries = list(entries)
        return cls(tuple(sorted({(e.cuda, e.torch) for e in entries if e.torch})),
                   tuple(sorted({e.cuda for e in entries if not e.torch})),
                   tuple(sorted({f for e in entries for f in (hyphen_name(e.name), e.project)})),
                   tuple(sorted({(e.cuda, e.torch or "", e.platform or "any", py, e.version)
                                 for e in entries for py in e.pythons})))

    def to_list(self) -> list[Any]:
        return [[list(p) for p in self.linked], list(self.free), list(self.folders), [list(s) for s in self.served]]

    @classmethod
    def from_list(cls, data: list[Any]) -> Summary:
        linked, free, folders, served = data
        pairs = tuple((str(c), str(t)) for c, t in linked)
        rows = tuple(tuple(row) for row in served)
        if not all(isinstance(x, str) for x in (*free, *folders, *(v for r in rows for v in r))) or \
                any(len(r) != 5 for r in rows):
            raise ValueError("not a summary")
        return cls(pairs, tuple(free), tuple(folders), rows)


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
        self.ino: int | None = None
        self.head = b""
        self.unsaved = 0
        self.cache_bad = False      # a cache file was there but unusable: rewrite it at the next save
        self.torn = 0               # bytes of a torn tail past the last complete line
        self.size = 0
        self.exists = False
        self._entries: dict[str, list[ManifestEntry]] = {}
        self._fd: int | None = None
        self._parsed: dict[int, dict[str, Any] | None] = {}   # line number -> record, for lines parsed while loading

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

    def _read_cache(self, ino: int, head: bytes, fh: BinaryIO) -> JournalIndex | None:
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
            parsed = {n: rec for (n, _), (_, rec) in zip(todo, parse_checked(path, [t for _, t in todo]), strict=True)}
            live, _ = live_entries(path, ((n, parsed[n] if n in parsed else self._parsed[n]) for n, _ in rows))
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
