"""A pure-Python reader of the CUDA fatbins inside a shared object (design.md §3.10).

Only headers are read, never payloads: a compressed entry is listed from its
header and not decompressed, so the reader costs the same on a 20 kB test
module and on torch's 470 MB libtorch_cuda.so. `cuobjdump` is not needed.

Layout (little-endian), learnt from the binaries nvcc 13 writes:

- the `.nv_fatbin` section (ELF; `__nv_relfatbin` for relocatable device code,
  `.nv_fatb` in PE files) holds one or more containers, 8-byte aligned, with
  zero padding between them;
- container header, 16 bytes: u32 magic 0xBA55ED50, u16 version, u16 header
  size, u64 payload size; the payload is a run of entries;
- entry header (>= 64 bytes): u16 kind (1 PTX, 2 ELF/SASS, others are
  listed as `other`), u16 version, u32 header size, u64 payload size,
  u32 compressed size, u32, u16 minor, u16 major (ISA version), u32 sm,
  u32 name offset, u32 name length, u64 flags, u64, u64 uncompressed size.
  Flags: 0x2000 compressed (fast mode), 0x8000 compressed (zstd),
  0x100000 arch-specific (`sm_90a`), 0x200000 family-specific (`sm_100f`).
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from farm.errors import FatbinError

MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")  # 64 bytes

KIND_PTX, KIND_ELF = 1, 2
FLAG_COMPRESSED_FAST = 0x2000
FLAG_COMPRESSED_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000

# Sections that carry fatbin containers, by object format.
ELF_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
PE_SECTIONS = (".nv_fatb",)


@dataclass(frozen=True)
class FatbinEntry:
    kind: str               # "SASS" | "PTX" | "other"
    sm: int                 # 90 for sm_90 / compute_90, 120 for sm_120
    variant: str            # "" | "a" | "f"
    compression: str | None  # None | "zstd" | "fast"
    section: str
    container: int          # index of the container in the file, 0-based
    offset: int             # file offset of the entry header
    size: int               # payload bytes as stored
    raw_kind: int = 0
    flags: int = 0

    @property
    def key(self) -> tuple[str, int, str]:
        """(kind, sm, variant): what the arch check compares."""
        return (self.kind, self.sm, self.variant)

    @property
    def name(self) -> str:
        """sm_90a for SASS, compute_90 for PTX (cuobjdump's spelling, with the `f` kept)."""
        prefix = "compute" if self.kind == "PTX" else "sm"
        return f"{prefix}_{self.sm}{self.variant}"


@dataclass(frozen=True)
class FatbinReport:
    """Every fatbin entry of one shared object."""

    path: str
    machine: str            # EM_X86_64, EM_AARCH64, PE:0x8664, ...
    containers: int
    entries: tuple[FatbinEntry, ...]

    def keys(self, kind: str | None = None) -> set[tuple[str, int, str]]:
        return {e.key for e in self.entries if kind is None or e.kind == kind}

    def sass(self) -> set[tuple[int, str]]:
        """(sm, variant) pairs with SASS."""
        return {(e.sm, e.variant) for e in self.entries if e.kind == "SASS"}

    def ptx(self) -> set[tuple[int, str]]:
        return {(e.sm, e.variant) for e in self.entries if e.kind == "PTX"}

    def names(self, kind: str) -> list[str]:
        """The entries of `kind` by cuobjdump's spelling, each once, by sm: ['sm_75', 'sm_90a', ...]."""
        return [e.name for e in sorted({e.name: e for e in self.entries if e.kind == kind}.values(),
                                       key=lambda e: (e.sm, e.variant))]

    def compressed(self) -> tuple[FatbinEntry, ...]:
        return tuple(e for e in self.entries if e.compression)

    def counts(self) -> Counter:
        return Counter(e.key for e in self.entries)


def _sections(f, path: Path) -> tuple[str, list[tuple[str, int, int]]]:
    """(machine, [(section name, file offset, size)]) of the fatbin sections, ELF or PE."""
    head = f.read(4)
    f.seek(0)
    if head == b"\x7fELF":
        try:
            elf = ELFFile(f)
            found = [(s.name, s["sh_offset"], s["sh_size"]) for s in elf.iter_sections()
                     if s.name in ELF_SECTIONS and s["sh_type"] != "SHT_NOBITS"]
            return elf["e_machine"], found
        except ELFError as exc:
            raise FatbinError(f"{path}: unreadable ELF: {exc}") from None
    if head[:2] == b"MZ":
        return _pe_sections(f, path)
    raise FatbinError(f"{path}: neither an ELF nor a PE file")


def _pe_sections(f, path: Path) -> tuple[str, list[tuple[str, int, int]]]:
    data = f.read(4096)
    try:
        (pe,) = struct.unpack_from("<I", data, 0x3C)
        f.seek(pe)
        hdr = f.read(24)
        if hdr[:4] != b"PE\0\0":
            raise FatbinError(f"{path}: MZ file without a PE header")
        machine, nsections, _, symtab, nsyms, opt_size = struct.unpack_from("<HHIIIH", hdr, 4)
        f.seek(pe + 24 + opt_size)
        table = f.read(40 * nsections)
        found = []
        for i in range(nsections):
            raw_name, _, _, raw_size, raw_ptr = struct.unpack_from("<8sIIII", table, 40 * i)
            name = raw_name.rstrip(b"\0").decode("latin-1")
            if name.startswith("/") and symtab:  # long name in the COFF string table
                f.seek(symtab + 18 * nsyms + int(name[1:]))
                name = f.read(256).split(b"\0", 1)[0].decode("latin-1")
            if name in PE_SECTIONS + ELF_SECTIONS:
                found.append((name, raw_ptr, raw_size))
        return f"PE:{machine:#x}", found
    except struct.error:
        raise FatbinError(f"{path}: truncated PE header") from None


def _variant(flags: int) -> str:
    if flags & FLAG_ARCH_SPECIFIC:
        return "a"
    if flags & FLAG_FAMILY:
        return "f"
    return ""


def _compression(flags: int) -> str | None:
    if flags & FLAG_COMPRESSED_ZSTD:
        return "zstd"
    if flags & FLAG_COMPRESSED_FAST:
        return "fast"
    return None


def _entries(buf, path: Path, section: str, start: int, size: int, first_container: int):
    """Walk the containers of one section; yields entries, returns the container count."""
    end = start + size
    pos, container = start, first_container
    while pos + _CONTAINER.size <= end:
        magic, _, header_size, payload = _CONTAINER.unpack_from(buf, pos)
        if magic != MAGIC:
            # Padding between containers: skip to the next magic, if any.
            nxt = buf.find(_MAGIC_BYTES, pos + 1, end)
            if nxt < 0:
                break
            pos = nxt
            continue
        p, stop = pos + header_size, pos + header_size + payload
        if stop > end:
            raise FatbinError(f"{path}: {section}: container at {pos:#x} runs past the section end")
        while p + _ENTRY.size <= stop:
            (kind, _, ehs, esize, _, _, _, _, sm, _, _, flags, _, _) = _ENTRY.unpack_from(buf, p)
            if ehs < _ENTRY.size or p + ehs + esize > stop:
                raise FatbinError(f"{path}: {section}: corrupt entry header at {p:#x}")
            yield FatbinEntry(
                kind={KIND_PTX: "PTX", KIND_ELF: "SASS"}.get(kind, "other"),
                sm=sm, variant=_variant(flags), compression=_compression(flags),
                section=section, container=container, offset=p, size=esize,
                raw_kind=kind, flags=flags,
            )
            p += ehs + esize
        container += 1
        pos = stop
    return container - first_container


def read_fatbin(path: str | Path) -> FatbinReport:
    """Every fatbin entry of one shared object (ELF of any machine, or PE). No fatbin: no entries."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise FatbinError(f"{path}: {exc.strerror}") from None
    with f:
        machine, sections = _sections(f, path)
        if not sections:
            return FatbinReport(str(path), machine, 0, ())
        file_size = path.stat().st_size
        entries: list[FatbinEntry] = []
        containers = 0
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            for name, offset, size in sections:
                if offset + size > file_size:
                    raise FatbinError(f"{path}: {name} runs past the end of the file")
                gen = _entries(buf, path, name, offset, size, containers)
                while True:
                    try:
                        entries.append(next(gen))
                    except StopIteration as stop:
                        containers += stop.value or 0
                        break
        return FatbinReport(str(path), machine, containers, tuple(entries))


def union(reports: Iterable[FatbinReport]) -> set[tuple[str, int, str]]:
    """(kind, sm, variant) over several modules."""
    out: set[tuple[str, int, str]] = set()
    for r in reports:
        out |= r.keys()
    return out
