"""The wheel as a file: `Wheel` opens it once (zip, parsed file name, binaries extracted on demand,
ELF facts), and `wheel_file_problems` says what is wrong with it before anything imports or unpacks
it (zip, member paths and kinds, WHEEL, RECORD).
"""

from __future__ import annotations

import base64
import csv
import email.parser
import hashlib
import io
import re
import shutil
import stat
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection, DynamicTag
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection
from elftools.elf.sections import SymbolTableSection
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, parse_tag
from packaging.utils import (
    BuildTag,
    InvalidWheelFilename,
    NormalizedName,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from farm.errors import shorten
from farm.platforms import plat_glibc

# What reading a member of a damaged zip raises (bad CRC, truncated data, unknown compression, encryption).
ZIP_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, OSError)
# Mangled names in the at::, c10:: and torch:: namespaces (plain, const/volatile members, typeinfo/vtables).
_TORCH_SYMBOL = re.compile(r"^_Z(?:T[IVS])?N[KVRO]*(?:2at|3c10|5torch)\d")
_DRIVER_SYMBOL = re.compile(r"cu[A-Z]\w*")   # fullmatch; the driver API: cuInit, cuModuleLoadData, ...


@dataclass(frozen=True)
class Binary:
    member: str            # path inside the wheel
    path: Path             # extracted copy
    fmt: str               # ELF | PE


@dataclass
class ElfFacts:
    machine: str
    needed: tuple[str, ...]
    soname: str | None
    rpaths: tuple[str, ...]        # RPATH and RUNPATH entries
    glibc: tuple[int, int] | None  # highest GLIBC_x.y demanded
    torch_symbols: tuple[str, ...]  # undefined at::/c10::/torch:: symbols (a few, for the message)
    driver_symbols: tuple[str, ...] = ()  # undefined cu* symbols (what a libcuda stub must define)
    # (library, version) of .gnu.version_r, as auditwheel reads them: ('libc.so.6', 'GLIBC_2.34'), ...
    version_needs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ElfBinary:
    """An ELF file of the wheel and what `_elf_facts` read of it."""

    member: str            # path inside the wheel
    path: Path             # extracted copy
    elf: ElfFacts


def _tag_text(tag: DynamicTag) -> str:
    """The string of a DT_NEEDED, DT_RPATH, DT_RUNPATH or DT_SONAME tag. pyelftools sets it as an
    attribute named after the tag (`needed`, `rpath`, ...) that its class does not declare."""
    return getattr(tag, tag.entry.d_tag[3:].lower())


def _elf_facts(path: Path) -> ElfFacts:
    with open(path, "rb") as f:
        elf = ELFFile(f)
        needed: list[str] = []
        rpaths: list[str] = []
        soname: str | None = None
        glibc: tuple[int, int] | None = None
        torch_syms: list[str] = []
        driver_syms: list[str] = []
        version_needs: list[tuple[str, str]] = []
        for sec in elf.iter_sections():
            if isinstance(sec, DynamicSection):
                for tag in sec.iter_tags():
                    if tag.entry.d_tag == "DT_NEEDED":
                        needed.append(_tag_text(tag))
                    elif tag.entry.d_tag in ("DT_RPATH", "DT_RUNPATH"):
                        rpaths += [p for p in _tag_text(tag).split(":") if p]
                    elif tag.entry.d_tag == "DT_SONAME":
                        soname = _tag_text(tag)
            elif isinstance(sec, GNUVerNeedSection):
                for verneed, auxes in sec.iter_versions():
                    library = verneed.name or ""
                    for aux in auxes:
                        # the dynamic loader's own versions say nothing of the system (auditwheel skips them too)
                        if not library.startswith("ld-linux") and library not in ("ld64.so.1", "ld64.so.2"):
                            version_needs.append((library, aux.name))
                        m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", aux.name)
                        if m:
                            v = (int(m.group(1)), int(m.group(2)))
                            glibc = v if glibc is None or v > glibc else glibc
        dynsym = elf.get_section_by_name(".dynsym")
        if dynsym is not None and not isinstance(dynsym, SymbolTableSection):
            raise ELFError(f".dynsym is a {dynsym['sh_type']} section, not a symbol table")
        if dynsym is not None:
            for sym in dynsym.iter_symbols():
                if sym["st_shndx"] != "SHN_UNDEF":
                    continue
                if _TORCH_SYMBOL.match(sym.name):
                    torch_syms.append(sym.name)
                elif _DRIVER_SYMBOL.fullmatch(sym.name):
                    driver_syms.append(sym.name)
        return ElfFacts(elf["e_machine"], tuple(needed), soname, tuple(rpaths), glibc, tuple(torch_syms),
                        tuple(driver_syms), tuple(version_needs))


def names_nvidia_wheel(requirement: str) -> bool:
    """Whether a Requires-Dist line names one of NVIDIA's runtime wheels (nvidia-cuda-runtime, ...)."""
    try:
        return canonicalize_name(Requirement(requirement).name).startswith("nvidia-")
    except InvalidRequirement:
        return False


class Wheel:
    """The wheel opened once: its zip, its parsed name, its binaries extracted to a temp dir."""

    def __init__(self, path: Path, workdir: Path):
        self.path = path
        self.workdir = workdir
        self.zip: zipfile.ZipFile | None = None
        self.members: list[str] = []
        self.zip_error: str | None = None
        try:
            self.zip = zipfile.ZipFile(path)
            self.members = [i.filename for i in self.zip.infolist() if not i.is_dir()]
        except (zipfile.BadZipFile, OSError) as exc:
            self.zip_error = str(exc)
        self.name: NormalizedName | None = None
        self.version: Version | None = None
        self.build: BuildTag | None = None
        self.tags: frozenset[Tag] = frozenset()
        self.filename_error: str | None = None
        try:
            name, version, build, tags = parse_wheel_filename(path.name)
            self.name, self.version, self.build, self.tags = name, version, build, tags
        except (InvalidWheelFilename, InvalidVersion) as exc:
            self.filename_error = str(exc)
        self._binaries: list[Binary] | None = None
        self._elf_binaries: list[ElfBinary] | None = None

    @property
    def pure(self) -> bool:
        return bool(self.tags) and {t.platform for t in self.tags} == {"any"}

    def dist_info(self) -> list[str]:
        return sorted({m.split("/", 1)[0] for m in self.members
                       if "/" in m and m.split("/", 1)[0].endswith(".dist-info")})

    def read(self, member: str) -> bytes:
        assert self.zip is not None
        return self.zip.read(member)

    def requires_dist(self) -> list[str]:
        """Its METADATA's Requires-Dist lines ([] without one .dist-info holding a METADATA)."""
        dist_info = self.dist_info()
        if len(dist_info) != 1 or f"{dist_info[0]}/METADATA" not in self.members:
            return []
        meta = email.parser.BytesParser().parsebytes(self.read(f"{dist_info[0]}/METADATA"))
        return [str(r) for r in meta.get_all("Requires-Dist") or []]

    def open(self, member: str) -> IO[bytes]:
        assert self.zip is not None
        return self.zip.open(member)

    def binaries(self) -> list[Binary]:
        """Every ELF or PE file of the wheel, extracted (shared objects, extension modules)."""
        if self._binaries is None:
            self._binaries = self._extract_binaries(self.zip) if self.zip is not None else []
        return self._binaries

    def _extract_binaries(self, zf: zipfile.ZipFile) -> list[Binary]:
        out = []
        for i, member in enumerate(self.members):
            base = member.rsplit("/", 1)[-1]
            if not re.search(r"\.(so(\.\d+)*|pyd|dll)$", base):
                continue
            with zf.open(member) as src:
                head = src.read(4)
            fmt = "ELF" if head == b"\x7fELF" else "PE" if head[:2] == b"MZ" else None
            if fmt is None:
                continue
            dest = self.workdir / "bin" / str(i) / base
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            out.append(Binary(member, dest, fmt))
        return out

    def elf_binaries(self) -> list[ElfBinary]:
        """The ELF files of binaries(), each read once."""
        if self._elf_binaries is None:
            self._elf_binaries = [ElfBinary(b.member, b.path, _elf_facts(b.path))
                                  for b in self.binaries() if b.fmt == "ELF"]
        return self._elf_binaries


def glibc_of_tag(platform_tag: str) -> tuple[int, int] | None:
    try:
        return plat_glibc(platform_tag)
    except ValueError:
        return None


def dotted(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def few(items: list[str], n: int = 5) -> str:
    """At most n items of a list for a message (a hostile wheel may hold thousands)."""
    shown = ", ".join(shorten(i, 120) for i in items[:n])
    return shown + (f" ... ({len(items)} in all)" if len(items) > n else "")


def _member_problems(zf: zipfile.ZipFile) -> list[str]:
    """Member names and kinds an installer must not be handed: paths that leave the install
    folder, backslashes (a folder separator on Windows), links and other non-regular files, twins."""
    absolute: list[str] = []
    parent: list[str] = []
    backslash: list[str] = []
    links: list[str] = []
    special: list[str] = []
    counts: dict[str, int] = {}
    for info in zf.infolist():
        name = info.filename
        counts[name] = counts.get(name, 0) + 1
        if "\\" in name:
            backslash.append(name)
        if name.startswith("/") or re.match(r"[A-Za-z]:", name):
            absolute.append(name)
        if ".." in name.replace("\\", "/").split("/"):
            parent.append(name)
        # The Unix mode sits in the high 16 bits of external_attr; 0 means "no mode recorded".
        mode = info.external_attr >> 16
        if stat.S_IFMT(mode):
            if stat.S_ISLNK(mode):
                links.append(name)
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                special.append(name)
    problems = []
    for found, what in ((absolute, "absolute member paths"), (parent, "member paths with '..'"),
                        (backslash, "member paths with a backslash"), (links, "symlink members"),
                        (special, "members that are not regular files")):
        if found:
            problems.append(f"{what}: {few(found)}")
    dupes = sorted(m for m, n in counts.items() if n > 1)
    if dupes:
        problems.append(f"duplicate zip members: {few(dupes)}")
    return problems


def _wheel_txt_problems(w: Wheel, dist_info: str) -> list[str]:
    """`.dist-info/WHEEL`: Wheel-Version 1.x, Root-Is-Purelib true|false, and Tag lines that
    are exactly the tags of the file name."""
    name = f"{dist_info}/WHEEL"
    if name not in w.members:
        return [f"{name} is missing"]
    try:
        text = w.read(name).decode("utf-8")
    except UnicodeDecodeError:
        return [f"{name} is not UTF-8"]
    msg = email.parser.Parser().parsestr(text)
    body = msg.get_payload()   # a list only when a Content-Type header says multipart
    if msg.defects or not isinstance(body, str) or body.strip():
        return [f"{name} is not a list of 'Key: value' lines"]
    problems = []
    versions = msg.get_all("Wheel-Version") or []
    if len(versions) != 1 or not re.fullmatch(r"1\.\d+", versions[0].strip()):
        problems.append(f"{name}: Wheel-Version {few(versions) or '(none)'}, expected one 1.x")
    purelib = msg.get_all("Root-Is-Purelib") or []
    if len(purelib) != 1 or purelib[0].strip().lower() not in ("true", "false"):
        problems.append(f"{name}: Root-Is-Purelib {few(purelib) or '(none)'}, expected true or false")
    lines = [t.strip() for t in msg.get_all("Tag") or []]
    tags: set[Tag] = set()
    for line in lines:
        parts = line.split("-")
        if len(parts) != 3 or not all(parts):
            problems.append(f"{name}: Tag {shorten(line, 120)!r} is not python-abi-platform")
        else:
            tags |= parse_tag(line)
    if not lines:
        problems.append(f"{name}: no Tag line")
    elif w.tags and tags and tags != w.tags:
        problems.append(f"{name}: Tag lines {few(sorted(map(str, tags)))} differ from the file name's "
                        f"{few(sorted(map(str, w.tags)))}")
    return problems


def _record_problems(w: Wheel, dist_info: str) -> list[str]:
    record_name = f"{dist_info}/RECORD"
    if record_name not in w.members:
        return [f"{record_name} is missing"]
    problems: list[str] = []
    listed: dict[str, tuple[str, str]] = {}
    try:
        for row in csv.reader(io.StringIO(w.read(record_name).decode("utf-8", "replace"))):
            if not row:
                continue
            if len(row) != 3:
                problems.append(f"RECORD row {shorten(repr(row), 120)} does not have 3 fields")
                continue
            listed[row[0]] = (row[1], row[2])
    except csv.Error as exc:
        return [f"{record_name} is not CSV: {exc}"]
    unsigned = {record_name, f"{dist_info}/RECORD.jws", f"{dist_info}/RECORD.p7s"}
    present = set(w.members)
    unlisted = sorted(m for m in present if m not in listed and m not in unsigned)
    if unlisted:
        problems.append(f"not in RECORD: {few(unlisted)}")
    missing = sorted(p for p in listed if p not in present)
    if missing:
        problems.append(f"in RECORD but not in the wheel: {few(missing)}")
    bad = []
    for member, (hash_field, size_field) in sorted(listed.items()):
        if member not in present or member in unsigned:
            continue
        algo, _, digest = hash_field.partition("=")
        if algo not in ("sha256", "sha384", "sha512") or not digest:
            bad.append(f"{member} (hash {hash_field or 'empty'})")
            continue
        h = hashlib.new(algo)
        size = 0
        try:
            with w.open(member) as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
                    size += len(chunk)
        except ZIP_READ_ERRORS as exc:
            bad.append(f"{member} (unreadable: {exc})")
            continue
        if base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode() != digest:
            bad.append(f"{member} (hash differs)")
        elif size_field and size_field != str(size):
            bad.append(f"{member} (size {size}, RECORD says {shorten(size_field, 40)})")
    if bad:
        problems.append(f"RECORD mismatch: {few(bad)}")
    return problems


def file_problems(w: Wheel) -> list[str]:
    """wheel_file_problems on a wheel already opened."""
    if w.zip is None:
        return [f"not a readable zip: {w.zip_error}"]
    problems = _member_problems(w.zip)
    dist_infos = w.dist_info()
    if len(dist_infos) != 1:
        return problems + [f"expected one .dist-info folder, found {few(dist_infos) or 'none'}"]
    try:
        return problems + _wheel_txt_problems(w, dist_infos[0]) + _record_problems(w, dist_infos[0])
    except ZIP_READ_ERRORS as exc:
        return problems + [f"a member cannot be read: {exc}"]


def wheel_file_problems(path: Path | str) -> list[str]:
    """What is wrong with a wheel as a FILE, before anything imports or unpacks it: the zip opens;
    no member path is absolute, has a '..' component or a backslash; no member is a symlink or
    another non-regular file; no name is there twice; one .dist-info with a well-formed WHEEL whose
    tags are the file name's; a RECORD that lists every member (but itself and its signatures)
    with the right sha256 and size. [] when the file is sound. Reads no ELF, imports nothing."""
    w = Wheel(Path(path), Path(tempfile.gettempdir()))  # no binaries are extracted
    try:
        return file_problems(w)
    finally:
        if w.zip is not None:
            w.zip.close()

