"""The verify gate (SPEC 9): no wheel leaves the farm unless it carries exactly what its cell promised.

`verify_wheel(path, expectation)` runs the checks of SPEC 9 in order, cheapest
first, each named (`CHECKS`): first the wheel as a file (`wheel_file_problems`: zip, member
paths, WHEEL, RECORD), then each pass / warn / fail / skip with a message,
and returns a `Report` (JSON per wheel). A failed static check skips the import
check (importing a broken wheel proves nothing and may hang).

The expectation is built by the pipeline (from the cell, the recipe and the
label step's resolved requires_dist) or by `farm verify` (from --cell or from
--arch-list/--platform). `GateCannotRun` (exit 2) means the gate itself could
not judge, e.g. the wheel file is missing or no fitting interpreter exists.
"""

from __future__ import annotations

import base64
import csv
import email.parser
import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import parse_tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from farm.arch.archlist import ArchList
from farm.arch.fatbin import FatbinError, FatbinReport, read_fatbin
from farm.build.repair import origin_relative
from farm.errors import FarmError, shorten
from farm.platforms import from_wheel_platform_tag, lane, plat_glibc
from farm.recipes.recipe import Verify as VerifyKnobs
from farm.versions import cuda_tag
from farm.versions import python_tag as _pytag
from farm.yamlio import write_atomic

CHECKS = ("file", "filename", "metadata", "binaries", "elf", "torch_linkage", "arches", "import")
TORCH_FAMILY = frozenset({"torch", "torchvision", "torchaudio"})

# DT_NEEDED names every Linux wheel may use (SPEC 9.4): glibc's own libraries and the C++ runtime.
_SYSTEM_NEEDED = re.compile(
    r"^(?:lib(?:c|m|dl|pthread|rt|util|resolv|nsl|anl|crypt|BrokenLocale|mvec|thread_db)\.so\.\d+"
    r"|ld-linux[\w.-]*\.so\.\d+|ld64\.so\.\d+|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$")
# What a torch environment provides when none is given to look at: torch's own libraries and the
# CUDA runtime libraries of its nvidia-* wheels, plus the driver (libcuda). With a torch environment
# the gate lists the real sonames instead.
TORCH_PROVIDED_PATTERNS = (
    "libtorch*.so*", "libc10*.so*", "libshm.so*", "libcaffe2_nvrtc.so*", "libgomp*.so*",
    "libcudart.so.*", "libcublas.so.*", "libcublasLt.so.*", "libcufft.so.*", "libcufftw.so.*",
    "libcurand.so.*", "libcusolver.so.*", "libcusolverMg.so.*", "libcusparse.so.*", "libcusparseLt.so*",
    "libnvrtc.so.*", "libnvrtc-builtins.so.*", "libnvJitLink.so.*", "libcudnn*.so.*", "libnccl.so.*",
    "libnvToolsExt.so.*", "libnvtx3interop.so.*", "libcupti.so.*", "libcufile.so.*", "libnvshmem*.so*",
    "libnvperf_host.so*",
)
DRIVER_LIBS = ("libcuda.so.1", "libcuda.so")
_TORCH_LIB = re.compile(r"^lib(?:torch[\w-]*|c10[\w-]*)\.so")
# Mangled names in the at::, c10:: and torch:: namespaces (plain, const/volatile members, typeinfo/vtables).
_TORCH_SYMBOL = re.compile(r"^_Z(?:T[IVS])?N[KVRO]*(?:2at|3c10|5torch)\d")
_DRIVER_SYMBOL = re.compile(r"^cu[A-Z]\w*$")   # the driver API: cuInit, cuModuleLoadData, ...
DEVICE_ERROR = re.compile(r"(?i)cuda|gpu|device|driver|libcuda|nvml")
IMPORT_TIMEOUT = 300
# What reading a member of a damaged zip raises (bad CRC, truncated data, unknown compression, encryption).
ZIP_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, OSError)


class GateCannotRun(FarmError):
    """The gate could not judge the wheel (missing file, no interpreter, no torch env): exit 2."""

    exit_code = 2


# ---------------------------------------------------------------- expectation and report

@dataclass(frozen=True)
class Expectation:
    """What the cell promised. None means "not checked" (farm verify --arch-list knows less than a cell).

    version is the public version (1.2.3); the wheel must carry `version+local_label`.
    python_tag is the interpreter tag (cp311; abi3: the floor, cp39; py3-none: py3).
    platform is the farm's spelling (linux, windows, linux_aarch64); platform_tag, when the
    pipeline knows the image's tag, is checked exactly (manylinux_2_28_x86_64).
    """

    name: str | None
    version: str | None
    local_label: str | None
    python_tag: str | None
    platform: str
    arch_list: ArchList | None
    links_torch: bool
    requires_dist: tuple[str, ...] | None = None
    knobs: VerifyKnobs = field(default_factory=VerifyKnobs)
    platform_tag: str | None = None

    def as_dict(self) -> dict:
        return {
            "name": self.name, "version": self.version, "local_label": self.local_label,
            "python_tag": self.python_tag, "platform": self.platform, "platform_tag": self.platform_tag,
            "arch_list": None if self.arch_list is None else self.arch_list.torch(),
            "links_torch": self.links_torch,
            "requires_dist": None if self.requires_dist is None else list(self.requires_dist),
        }

    @classmethod
    def for_cell(cls, cell, *, knobs: VerifyKnobs | None = None, requires_dist: Iterable[str] | None = None,
                 version: str | None = None, platform_tag: str | None = None) -> Expectation:
        """From a farm.recipes.cells.Cell (and its recipe's verify knobs and resolved requires_dist)."""
        abi = getattr(cell, "wheel_abi", "cpython")
        py = {"py3-none": "py3", "pure": "py3"}.get(abi, f"cp{_pytag(cell.python)}")
        return cls(
            name=cell.recipe_name, version=version, local_label=cell.local_label, python_tag=py,
            platform=cell.platform, arch_list=None if abi == "pure" else cell.arch.arch_list,
            links_torch=cell.links_torch,
            requires_dist=None if requires_dist is None else tuple(requires_dist),
            knobs=knobs or VerifyKnobs(), platform_tag=platform_tag,
        )


@dataclass
class CheckResult:
    name: str
    status: str            # pass | warn | fail | skip
    message: str
    details: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "message": self.message, "details": self.details}


@dataclass
class Report:
    wheel: str
    expectation: Expectation
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.status == "fail"]

    @property
    def warned(self) -> list[str]:
        return [c.name for c in self.checks if c.status == "warn"]

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def as_dict(self) -> dict:
        return {"wheel": self.wheel, "passed": self.passed, "failed": self.failed, "warned": self.warned,
                "expectation": self.expectation.as_dict(), "checks": [c.as_dict() for c in self.checks]}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=False) + "\n"

    def write(self, path: Path) -> None:
        write_atomic(Path(path), self.to_json())

    def lines(self) -> list[str]:
        """Human-readable: a verdict line, then one line per check."""
        out = [f"{'PASS' if self.passed else 'FAIL'} {self.wheel}"]
        for c in self.checks:
            out.append(f"  {c.status:<4} {c.name}: {c.message}")
        return out


# ---------------------------------------------------------------- reading the wheel

@dataclass
class _Binary:
    member: str            # path inside the wheel
    path: Path             # extracted copy
    fmt: str               # ELF | PE
    elf: _ElfFacts | None = None


@dataclass
class _ElfFacts:
    machine: str
    needed: tuple[str, ...]
    soname: str | None
    rpaths: tuple[str, ...]        # RPATH and RUNPATH entries
    glibc: tuple[int, int] | None  # highest GLIBC_x.y demanded
    torch_symbols: tuple[str, ...]  # undefined at::/c10::/torch:: symbols (a few, for the message)
    driver_symbols: tuple[str, ...] = ()  # undefined cu* symbols (what a libcuda stub must define)


def _elf_facts(path: Path) -> _ElfFacts:
    with open(path, "rb") as f:
        elf = ELFFile(f)
        needed, rpaths, soname = [], [], None
        glibc: tuple[int, int] | None = None
        torch_syms: list[str] = []
        driver_syms: list[str] = []
        for sec in elf.iter_sections():
            if isinstance(sec, DynamicSection):
                for tag in sec.iter_tags():
                    if tag.entry.d_tag == "DT_NEEDED":
                        needed.append(tag.needed)
                    elif tag.entry.d_tag == "DT_RPATH":
                        rpaths += [p for p in tag.rpath.split(":") if p]
                    elif tag.entry.d_tag == "DT_RUNPATH":
                        rpaths += [p for p in tag.runpath.split(":") if p]
                    elif tag.entry.d_tag == "DT_SONAME":
                        soname = tag.soname
            elif isinstance(sec, GNUVerNeedSection):
                for _, auxes in sec.iter_versions():
                    for aux in auxes:
                        m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", aux.name)
                        if m:
                            v = (int(m.group(1)), int(m.group(2)))
                            glibc = v if glibc is None or v > glibc else glibc
        dynsym = elf.get_section_by_name(".dynsym")
        if dynsym is not None:
            for sym in dynsym.iter_symbols():
                if sym["st_shndx"] != "SHN_UNDEF":
                    continue
                if _TORCH_SYMBOL.match(sym.name):
                    torch_syms.append(sym.name)
                elif _DRIVER_SYMBOL.match(sym.name):
                    driver_syms.append(sym.name)
        return _ElfFacts(elf["e_machine"], tuple(needed), soname, tuple(rpaths), glibc, tuple(torch_syms),
                         tuple(driver_syms))


class _Wheel:
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
        self.name = self.version = None
        self.build = None
        self.tags = frozenset()
        self.filename_error: str | None = None
        try:
            name, version, build, tags = parse_wheel_filename(path.name)
            self.name, self.version, self.build, self.tags = name, version, build, tags
        except (InvalidWheelFilename, InvalidVersion) as exc:
            self.filename_error = str(exc)
        self._binaries: list[_Binary] | None = None

    @property
    def pure(self) -> bool:
        return bool(self.tags) and {t.platform for t in self.tags} == {"any"}

    def dist_info(self) -> list[str]:
        return sorted({m.split("/", 1)[0] for m in self.members
                       if "/" in m and m.split("/", 1)[0].endswith(".dist-info")})

    def read(self, member: str) -> bytes:
        assert self.zip is not None
        return self.zip.read(member)

    def binaries(self) -> list[_Binary]:
        """Every ELF or PE file of the wheel, extracted (shared objects, extension modules)."""
        if self._binaries is not None:
            return self._binaries
        out = []
        for i, member in enumerate(self.members if self.zip else ()):
            base = member.rsplit("/", 1)[-1]
            if not re.search(r"\.(so(\.\d+)*|pyd|dll)$", base):
                continue
            with self.zip.open(member) as src:
                head = src.read(4)
            fmt = "ELF" if head == b"\x7fELF" else "PE" if head[:2] == b"MZ" else None
            if fmt is None:
                continue
            dest = self.workdir / "bin" / str(i) / base
            dest.parent.mkdir(parents=True, exist_ok=True)
            with self.zip.open(member) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            out.append(_Binary(member, dest, fmt))
        self._binaries = out
        return out

    def elf_binaries(self) -> list[_Binary]:
        out = []
        for b in self.binaries():
            if b.fmt == "ELF":
                if b.elf is None:
                    b.elf = _elf_facts(b.path)
                out.append(b)
        return out


def _glibc_of_tag(platform_tag: str) -> tuple[int, int] | None:
    try:
        return plat_glibc(platform_tag)
    except ValueError:
        return None


# ---------------------------------------------------------------- the checks

def _result(name: str, problems: list[str], warnings: list[str], ok: str, details: dict | None = None,
            ) -> CheckResult:
    if problems:
        return CheckResult(name, "fail", "; ".join(problems + warnings), details or {})
    if warnings:
        return CheckResult(name, "warn", "; ".join(warnings), details or {})
    return CheckResult(name, "pass", ok, details or {})


def check_filename(w: _Wheel, exp: Expectation) -> CheckResult:
    if w.filename_error:
        return CheckResult("filename", "fail", f"not a valid wheel file name: {w.filename_error}")
    problems: list[str] = []
    if exp.name and canonicalize_name(exp.name) != w.name:
        problems.append(f"name {w.name!r}, expected {canonicalize_name(exp.name)!r}")
    local = w.version.local
    if exp.local_label is not None and local != exp.local_label.lower():
        problems.append(f"local label {('+' + local) if local else '(none)'}, expected +{exp.local_label}")
    if exp.version is not None and w.version.public != Version(exp.version).public:
        problems.append(f"version {w.version.public}, expected {exp.version}")
    interpreters = sorted({t.interpreter for t in w.tags})
    platforms = sorted({t.platform for t in w.tags})
    details = {"version": str(w.version), "build": list(w.build) if w.build else None,
               "interpreters": interpreters, "platforms": platforms}
    if w.pure:
        # A py3-none-any wheel: whether binaries were required is the binaries check's question.
        return _result("filename", problems, [], "pure wheel (platform any): the binaries check decides", details)
    if exp.python_tag and exp.python_tag not in interpreters:
        problems.append(f"Python tag {'.'.join(interpreters)}, expected {exp.python_tag}")
    for plat in platforms:
        farm_platform = from_wheel_platform_tag(plat)
        if farm_platform != exp.platform:
            problems.append(f"platform tag {plat} is not {exp.platform}")
        elif exp.platform != "windows" and _glibc_of_tag(plat) is None:
            problems.append(f"platform tag {plat} is not a manylinux tag (was the wheel repaired?)")
    # A compressed tag set (manylinux1_x86_64.manylinux_2_5_x86_64, what auditwheel gives a wheel needing
    # only glibc 2.5) is one promise: compare the sets, not one tag against the joined string.
    if exp.platform_tag and set(exp.platform_tag.split(".")) != set(platforms):
        problems.append(f"platform tag {'.'.join(platforms)}, expected {exp.platform_tag}")
    return _result("filename", problems, [], f"{w.path.name} matches", details)


def _few(items: list[str], n: int = 5) -> str:
    """At most n items of a list for a message (a hostile wheel may hold thousands)."""
    shown = ", ".join(shorten(i, 120) for i in items[:n])
    return shown + (f" ... ({len(items)} in all)" if len(items) > n else "")


def _member_problems(zf: zipfile.ZipFile) -> list[str]:
    """Member names and kinds an installer must not be handed: paths that leave the install
    folder, backslashes (a folder separator on Windows), links and other non-regular files, twins."""
    absolute, parent, backslash, links, special, counts = [], [], [], [], [], {}
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
            problems.append(f"{what}: {_few(found)}")
    dupes = sorted(m for m, n in counts.items() if n > 1)
    if dupes:
        problems.append(f"duplicate zip members: {_few(dupes)}")
    return problems


def _wheel_txt_problems(w: _Wheel, dist_info: str) -> list[str]:
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
    if msg.defects or msg.get_payload().strip():
        return [f"{name} is not a list of 'Key: value' lines"]
    problems = []
    versions = msg.get_all("Wheel-Version") or []
    if len(versions) != 1 or not re.fullmatch(r"1\.\d+", versions[0].strip()):
        problems.append(f"{name}: Wheel-Version {_few(versions) or '(none)'}, expected one 1.x")
    purelib = msg.get_all("Root-Is-Purelib") or []
    if len(purelib) != 1 or purelib[0].strip().lower() not in ("true", "false"):
        problems.append(f"{name}: Root-Is-Purelib {_few(purelib) or '(none)'}, expected true or false")
    lines = [t.strip() for t in msg.get_all("Tag") or []]
    tags: set = set()
    for line in lines:
        parts = line.split("-")
        if len(parts) != 3 or not all(parts):
            problems.append(f"{name}: Tag {shorten(line, 120)!r} is not python-abi-platform")
        else:
            tags |= parse_tag(line)
    if not lines:
        problems.append(f"{name}: no Tag line")
    elif w.tags and tags and tags != w.tags:
        problems.append(f"{name}: Tag lines {_few(sorted(map(str, tags)))} differ from the file name's "
                        f"{_few(sorted(map(str, w.tags)))}")
    return problems


def _record_problems(w: _Wheel, dist_info: str) -> list[str]:
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
        problems.append(f"not in RECORD: {_few(unlisted)}")
    missing = sorted(p for p in listed if p not in present)
    if missing:
        problems.append(f"in RECORD but not in the wheel: {_few(missing)}")
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
            with w.zip.open(member) as f:
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
        problems.append(f"RECORD mismatch: {_few(bad)}")
    return problems


def _file_problems(w: _Wheel) -> list[str]:
    """wheel_file_problems on a wheel already opened."""
    if w.zip is None:
        return [f"not a readable zip: {w.zip_error}"]
    problems = _member_problems(w.zip)
    dist_infos = w.dist_info()
    if len(dist_infos) != 1:
        return problems + [f"expected one .dist-info folder, found {_few(dist_infos) or 'none'}"]
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
    w = _Wheel(Path(path), Path(tempfile.gettempdir()))  # no binaries are extracted
    try:
        return _file_problems(w)
    finally:
        if w.zip is not None:
            w.zip.close()


def check_file(w: _Wheel, exp: Expectation) -> CheckResult:
    return _result("file", _file_problems(w), [], "a sound zip: member paths, WHEEL and RECORD check out")


def _requirement_key(text: str) -> str:
    try:
        return str(Requirement(text))
    except InvalidRequirement:
        return re.sub(r"\s+", "", text)


def _requires_diff(want: Iterable[str], have: Iterable[str]) -> tuple[list[str], list[str]]:
    """(expected but absent, present but unexpected); an expected entry with `*` is a pattern."""
    left = sorted(_requirement_key(r) for r in have)
    missing = []
    for w in sorted(want, key=lambda x: "*" in x):    # exact entries first, then patterns
        if "*" in w:
            pattern = re.sub(r"\s+", "", w)
            hit = next((h for h in left if fnmatch.fnmatchcase(re.sub(r"\s+", "", h), pattern)), None)
        else:
            key = _requirement_key(w)
            hit = key if key in left else None
        if hit is None:
            missing.append(w)
        else:
            left.remove(hit)
    return missing, left


def check_metadata(w: _Wheel, exp: Expectation) -> CheckResult:
    if w.zip_error:
        return CheckResult("metadata", "fail", f"not a readable zip: {w.zip_error}")
    dist_infos = w.dist_info()
    if len(dist_infos) != 1:
        return CheckResult("metadata", "fail", f"expected one .dist-info folder, found {dist_infos or 'none'}")
    dist_info = dist_infos[0]
    problems: list[str] = []
    meta_name = f"{dist_info}/METADATA"
    if meta_name not in w.members:
        return CheckResult("metadata", "fail", f"{meta_name} is missing")
    meta = email.parser.BytesParser().parsebytes(w.read(meta_name))
    version_text = meta.get("Version", "")
    requires = [str(r) for r in meta.get_all("Requires-Dist") or []]
    details = {"dist_info": dist_info, "metadata_version": version_text, "requires_dist": requires}
    if w.version is not None:
        try:
            if Version(version_text) != w.version:
                problems.append(f"METADATA Version {version_text}, file name says {w.version}")
        except InvalidVersion:
            problems.append(f"METADATA Version {version_text!r} is not a version")
        folder_name, _, folder_version = dist_info[: -len(".dist-info")].rpartition("-")
        try:
            if Version(folder_version) != w.version:
                problems.append(f"{dist_info} carries version {folder_version}, file name says {w.version}")
        except InvalidVersion:
            problems.append(f"{dist_info}: no version in the folder name")
        if canonicalize_name(folder_name) != w.name or canonicalize_name(meta.get("Name", "")) != w.name:
            problems.append(f"names differ: file {w.name}, folder {folder_name}, METADATA {meta.get('Name')}")
    torchy = []
    for r in requires:
        try:
            if canonicalize_name(Requirement(r).name) in TORCH_FAMILY:
                torchy.append(r)
        except InvalidRequirement:
            problems.append(f"Requires-Dist {r!r} does not parse")
    if torchy:
        problems.append(f"Requires-Dist names the torch family ({'; '.join(torchy)}): a resolver could pull "
                        f"torch from PyPI over the user's CUDA build")
    if exp.requires_dist is not None:
        miss, extra = _requires_diff(exp.requires_dist, requires)
        if miss or extra:
            problems.append("Requires-Dist differs from the recipe's requires_dist"
                            + (f"; missing {miss}" if miss else "") + (f"; unexpected {extra}" if extra else ""))
    return _result("metadata", problems, [], f"Version {version_text}, names agree, Requires-Dist as promised", details)


def check_binaries(w: _Wheel, exp: Expectation) -> CheckResult:
    bins = w.binaries()
    listed = [b.member for b in bins]
    if bins:
        return CheckResult("binaries", "pass", f"{len(bins)} compiled file(s)", {"files": listed})
    if exp.knobs.allow_pure_python:
        return CheckResult("binaries", "pass", "no compiled module; allowed (verify.allow_pure_python)")
    return CheckResult("binaries", "fail", "no compiled module in the wheel: a pure wheel where binaries are "
                                           "required (set verify.allow_pure_python if that is intended)")


def _torch_env_sonames(torch_env: _TorchEnv | None) -> set[str] | None:
    return None if torch_env is None else set(torch_env.sonames())


def check_elf(w: _Wheel, exp: Expectation, torch_env: _TorchEnv | None) -> CheckResult:
    if exp.platform == "windows":
        return CheckResult("elf", "skip", "not a Linux wheel")
    bins = w.elf_binaries()
    if not bins:
        return CheckResult("elf", "skip", "no ELF files")
    shipped = {b.member.rsplit("/", 1)[-1] for b in bins} | {b.elf.soname for b in bins if b.elf.soname}
    provided = _torch_env_sonames(torch_env)
    plats = [t.platform for t in w.tags]
    bounds = [g for g in (_glibc_of_tag(p) for p in plats) if g]
    bound = min(bounds) if bounds else None
    problems: list[str] = []
    details: dict = {"modules": {}, "glibc_bound": None if bound is None else _dotted(bound)}

    def allowed(lib: str) -> bool:
        if _SYSTEM_NEEDED.match(lib) or lib in shipped or lib in DRIVER_LIBS:
            return True
        if any(fnmatch.fnmatch(lib, p) for p in exp.knobs.allowed_needed):
            return True
        if provided is not None:
            return lib in provided
        return any(fnmatch.fnmatch(lib, p) for p in TORCH_PROVIDED_PATTERNS)

    for b in bins:
        e = b.elf
        details["modules"][b.member] = {"needed": list(e.needed), "rpath": list(e.rpaths),
                                        "glibc": None if e.glibc is None else _dotted(e.glibc)}
        unknown = [n for n in e.needed if not allowed(n)]
        if unknown:
            problems.append(f"{b.member} needs {', '.join(unknown)}, which nobody provides "
                            f"(not glibc, not torch's, not in the wheel, not in verify.allowed_needed)")
        absolute = [p for p in e.rpaths if not origin_relative(p)]
        if absolute:
            problems.append(f"{b.member} has RPATH/RUNPATH {':'.join(absolute)} (every entry must start with $ORIGIN)")
        if e.glibc and bound and e.glibc > bound:
            problems.append(f"{b.member} demands GLIBC_{e.glibc[0]}.{e.glibc[1]}, above the wheel's tag "
                            f"({'.'.join(plats)} allows {bound[0]}.{bound[1]})")
    demand = max((b.elf.glibc for b in bins if b.elf.glibc), default=None)
    ok = (f"{len(bins)} ELF file(s): DT_NEEDED provided, RPATHs relative"
          + (f", GLIBC {demand[0]}.{demand[1]} within the tag" if demand else ""))
    return _result("elf", problems, [], ok, details)


def check_torch_linkage(w: _Wheel, exp: Expectation) -> CheckResult:
    if exp.links_torch:
        return CheckResult("torch_linkage", "pass", "torch-linked recipe: links torch by design")
    if exp.platform == "windows":
        return CheckResult("torch_linkage", "skip", "not a Linux wheel")
    problems = []
    for b in w.elf_binaries():
        libs = [n for n in b.elf.needed if _TORCH_LIB.match(n)]
        if libs:
            problems.append(f"{b.member} needs {', '.join(libs)}")
        if b.elf.torch_symbols:
            syms = b.elf.torch_symbols
            problems.append(f"{b.member} has {len(syms)} undefined at::/c10::/torch:: symbol(s), e.g. {syms[0]}")
    if problems:
        problems[0] = "a torch-free recipe's wheel links torch: " + problems[0]
    return _result("torch_linkage", problems, [], "torch-free: no libtorch/libc10 and no at::/c10::/torch:: symbols")


def _fmt_sass(sm: int, variant: str) -> str:
    return f"sm_{sm}{variant}"


def _dotted(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


def check_arches(w: _Wheel, exp: Expectation) -> CheckResult:
    knobs = exp.knobs
    bins = w.binaries()
    if not bins:
        return CheckResult("arches", "skip", "no compiled files")
    if knobs.skip_arch:
        return CheckResult("arches", "skip", f"waived (verify.skip_arch): {knobs.skip_arch}")
    if exp.arch_list is None:
        return CheckResult("arches", "skip", "no arch list expected")
    modules: dict[str, FatbinReport] = {}
    for b in bins:
        try:
            modules[b.member] = read_fatbin(b.path)
        except FatbinError as exc:
            return CheckResult("arches", "fail", f"{b.member}: cannot read its fatbin: {exc}")
    sass: set[tuple[int, str]] = set()
    ptx: set[tuple[int, str]] = set()
    for r in modules.values():
        sass |= r.sass()
        ptx |= r.ptx()
    details = {"expected": exp.arch_list.torch(), "modules": {
        m: {"sass": sorted(_fmt_sass(*k) for k in r.sass()),
            "ptx": sorted(f"compute_{sm}{v}" for sm, v in r.ptx()),
            "compressed": sorted({f"{e.name} ({e.compression})" for e in r.compressed()}),
            "containers": r.containers, "entries": len(r.entries)}
        for m, r in modules.items() if r.entries}}
    details["union"] = {"sass": sorted(_fmt_sass(*k) for k in sass), "ptx": sorted(f"compute_{sm}{v}" for sm, v in ptx)}

    want_sass = exp.arch_list.sass()
    want_ptx = {(t.sm, "") for t in exp.arch_list if t.ptx}
    missing = [t for t in exp.arch_list if (t.sm, t.variant) not in sass]
    missing_ptx = [t for t in exp.arch_list if t.ptx and (t.sm, "") not in ptx]

    waiver = _missing_waiver(knobs, exp.platform)
    waived_tokens: list[str] = []
    if waiver is not None:
        allowed = {(t.sm, t.variant) for t in waiver.archs}
        waived_tokens = [str(t) for t in missing if (t.sm, t.variant) in allowed]
        waived_tokens += [f"{t.major}.{t.minor}+PTX" for t in missing_ptx if (t.sm, "") in allowed and t.ptx]
        missing = [t for t in missing if (t.sm, t.variant) not in allowed]
        missing_ptx = [t for t in missing_ptx if (t.sm, "") not in allowed]

    problems, warnings = [], []
    if not any(r.entries for r in modules.values()):
        problems.append("no module carries a CUDA fatbin")
    for t in missing:
        near = sorted(_fmt_sass(sm, v) for sm, v in sass if sm == t.sm)
        why = f" (only {', '.join(near)} shipped, which does not serve {t})" if near else ""
        problems.append(f"no SASS for {_fmt_sass(t.sm, t.variant)} ({t} asked){why}")
    for t in missing_ptx:
        problems.append(f"no PTX for compute_{t.sm} ({t.major}.{t.minor}+PTX asked)")
    extra_sass = sorted(sass - want_sass)
    extra_ptx = sorted(ptx - want_ptx)
    if extra_sass or extra_ptx:
        warnings.append("extra archs beyond the list: "
                        + ", ".join([_fmt_sass(*k) for k in extra_sass] + [f"compute_{sm}{v}" for sm, v in extra_ptx]))
    compressed = sorted({(m, e.name, e.compression) for m, r in modules.items() for e in r.compressed()})
    if compressed:
        names = sorted({f"{n} ({c})" for _, n, c in compressed})
        warnings.append(f"compressed fatbin entries, listed from their headers and not decompressed: "
                        f"{', '.join(names)} (a driver must be able to decompress them)")
    if waived_tokens:
        warnings.append(f"missing {' '.join(waived_tokens)} waived (verify.allow_missing_archs): {waiver.reason}")
    details["missing"] = [str(t) for t in missing] + [f"{t.major}.{t.minor}+PTX" for t in missing_ptx]
    details["waived"] = waived_tokens
    ok = f"every arch of {exp.arch_list.torch()} has SASS (and PTX where +PTX) over {len(modules)} module(s)"
    return _result("arches", problems, warnings, ok, details)


def _missing_waiver(knobs: VerifyKnobs, platform: str):
    table: Mapping = knobs.allow_missing_archs or {}
    return table.get(platform) or table.get(lane(platform))


# ---------------------------------------------------------------- the import check

@dataclass(frozen=True)
class _TorchEnv:
    """A Python environment holding the cell's torch (a venv or prefix, or its python executable)."""

    python: Path
    torch_dir: Path | None

    @staticmethod
    def python_of(where: Path) -> Path:
        """The interpreter of an environment (a venv or prefix), or `where` itself when it is one."""
        where = Path(where)
        if where.is_file():
            return where
        python = next((p for p in (where / "bin" / "python", where / "bin" / "python3",
                                   where / "Scripts" / "python.exe", where / "python.exe") if p.exists()), None)
        if python is None:
            raise GateCannotRun(f"{where}: no Python interpreter in this torch environment (bin/python)")
        return python

    @classmethod
    def locate(cls, where: Path) -> _TorchEnv:
        python = cls.python_of(where)
        probe = subprocess.run(
            [str(python), "-c", "import importlib.util as u; s = u.find_spec('torch'); "
                                "print(list(s.submodule_search_locations)[0] if s else '')"],
            capture_output=True, text=True, env=_child_env_base())
        if probe.returncode != 0:
            raise GateCannotRun(f"{python}: cannot run it: {probe.stderr.strip()[-200:]}")
        torch_dir = Path(probe.stdout.strip()) if probe.stdout.strip() else None
        return cls(python, torch_dir)

    def sonames(self) -> list[str]:
        """Every shared library torch and its nvidia-* wheels provide (SPEC 8.1 repair excludes the same)."""
        if self.torch_dir is None:
            return []
        roots = [self.torch_dir / "lib", self.torch_dir.parent / "nvidia"]
        names = []
        for root in roots:
            if root.is_dir():
                names += [p.name for p in root.rglob("*.so*") if p.is_file() or p.is_symlink()]
        return names


def _child_env_base() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _module_name(member: str) -> str | None:
    """Dotted module name of a compiled file in an importable place, else None."""
    member = re.sub(r"^[^/]+\.data/(?:purelib|platlib)/", "", member)
    parts = member.split("/")
    if not re.search(r"\.(so|pyd)$", parts[-1]):
        return None
    parts[-1] = parts[-1].split(".", 1)[0]
    if not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def _top_level(w: _Wheel) -> list[str]:
    dist_info = w.dist_info()
    if dist_info and f"{dist_info[0]}/top_level.txt" in w.members:
        names = w.read(f"{dist_info[0]}/top_level.txt").decode().split()
        return [n.replace("/", ".") for n in names if n]
    tops = set()
    for m in w.members:
        m = re.sub(r"^[^/]+\.data/(?:purelib|platlib)/", "", m)
        first = m.split("/", 1)[0]
        if first.endswith((".dist-info", ".data")):
            continue
        if "/" in m and first.isidentifier():
            tops.add(first)
        elif m.endswith(".py") and m[:-3].isidentifier():
            tops.add(m[:-3])
    return sorted(tops)


def _no_direct(member: str, module: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(member, p) or fnmatch.fnmatch(module, p) for p in patterns)


_CHILD = r"""
import importlib, json, os, sys
def say(**kw):
    sys.stdout.write("FARM-IMPORT " + json.dumps(kw) + "\n"); sys.stdout.flush()
def load(m):
    say(event="begin", module=m)
    try:
        importlib.import_module(m)
        say(event="ok", module=m)
        return True
    except BaseException as exc:
        say(event="error", module=m, error=f"{type(exc).__name__}: {exc}")
        return False
if json.loads(sys.argv[1])["torch"] and not load("torch"):
    sys.exit(3)
line = sys.stdin.readline()   # the plan arrives once the wheel is installed
if not line:
    sys.exit(0)
plan = json.loads(line)
sys.path.insert(0, plan["path"])
for m in plan["modules"]:
    load(m)
for op in plan["ops"]:
    ns, _, name = op.replace(".", "::", 1).partition("::")
    import torch
    try:
        getattr(getattr(torch.ops, ns), name)
        say(event="op", module=op, ok=True)
    except BaseException as exc:
        say(event="op", module=op, ok=False, error=f"{type(exc).__name__}: {exc}")
say(event="done", module="")
sys.stderr.flush()
# Everything is reported: skip the interpreter's teardown, which takes ~0.7 s once torch is loaded
# and checks nothing the gate asks. A crash during an import still shows (no "done", a signal).
os._exit(0)
"""


class ImportChild:
    """The import check's child process: the cell's interpreter, CUDA_VISIBLE_DEVICES='', an empty
    working folder; it imports torch first (torch-linked wheels only), then waits on stdin for the
    installed target and the modules to import.

    farm.build.steps starts it with the compile step, before the wheel exists, so torch's 2-3 s import
    runs beside the compile, label and repair instead of after them. The check is the same either
    way: a fresh process holding nothing but torch imports the wheel's modules.
    """

    @classmethod
    def for_environment(cls, where: Path, import_torch: bool) -> ImportChild:
        return cls(_TorchEnv.python_of(where), import_torch)

    def __init__(self, python: Path, import_torch: bool, library_path: Path | None = None):
        self.python, self.import_torch = Path(python), import_torch
        self.cwd = Path(tempfile.mkdtemp(prefix="farm-import-"))
        env = _child_env_base()
        env["CUDA_VISIBLE_DEVICES"] = ""
        if library_path is not None:   # read by the loader at start: it cannot be added later
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(library_path), env.get("LD_LIBRARY_PATH")]))
        self.proc = subprocess.Popen([str(self.python), "-c", _CHILD, json.dumps({"torch": import_torch})],
                                     cwd=self.cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def run(self, target: Path, modules: list[str], ops: list[str], timeout: float) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) once the child has imported `modules` from `target`."""
        plan = {"path": str(target), "modules": modules, "ops": ops}
        try:
            out, err = self.proc.communicate(json.dumps(plan) + "\n", timeout=timeout)
        finally:
            self.close()
        return self.proc.returncode, out, err

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        shutil.rmtree(self.cwd, ignore_errors=True)


def _python_version(python: Path) -> tuple[int, int]:
    out = subprocess.run([str(python), "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise GateCannotRun(f"{python}: cannot run it")
    a, b = out.stdout.split()
    return int(a), int(b)


def _fits(w: _Wheel, version: tuple[int, int]) -> bool:
    for t in w.tags:
        if t.interpreter.startswith("py"):
            return True
        m = re.fullmatch(r"cp(\d)(\d+)", t.interpreter)
        if m:
            tv = (int(m.group(1)), int(m.group(2)))
            if tv == version or (t.abi == "abi3" and tv <= version):
                return True
    return False


def libcuda_stub_dir(w: _Wheel) -> Path:
    """A folder with a libcuda.so.1 stub, for verify.needs_driver (there is no driver here).

    The toolkit's own stub when one is found (CUDA_HOME, /usr/local/cuda, then the farm's PyPI
    toolkits, which farm.build.toolkit gives one); else one made here by the same maker
    (farm.build.toolkit.build_libcuda_stub) from every driver function the wheel's modules use, each
    returning CUDA_ERROR_NO_DEVICE (100), so that loading resolves and any call reports no device.
    """
    from farm.build.toolkit import (
        ToolkitUnavailable,
        build_libcuda_stub,
        cached_toolkit_homes,
        find_libcuda_stub,
    )

    d = w.workdir / "libcuda-stub"
    d.mkdir(exist_ok=True)
    link = d / "libcuda.so.1"
    if link.exists():
        return d
    homes = [h for h in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda") if h]
    stub = find_libcuda_stub([*homes, *cached_toolkit_homes()])
    if stub is not None:
        link.symlink_to(stub)
        return d
    try:
        build_libcuda_stub(link, {s for b in w.elf_binaries() for s in b.elf.driver_symbols})
    except ToolkitUnavailable as exc:
        raise GateCannotRun(f"verify.needs_driver: no toolkit libcuda stub, and {exc}") from None
    return d


def install_into(wheel: Path, target: Path, python: Path) -> str | None:
    """Install `wheel` without its dependencies into the folder `target` (what `pip install --no-deps
    --target` does), with pypa's `installer`, the reference wheel installer, in this process: pip
    would cost a second interpreter and ~0.8 s per cell (it probes rustc and lsb_release for its
    user agent). None on success, else the reason."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.exceptions import InstallerError
    from installer.sources import WheelFile

    scheme = {"purelib": target, "platlib": target, "headers": target / "include", "scripts": target / "bin",
              "data": target}
    destination = SchemeDictionaryDestination({k: str(v) for k, v in scheme.items()}, interpreter=str(python),
                                              script_kind="win-amd64" if os.name == "nt" else "posix")
    try:
        with WheelFile.open(wheel) as source:
            install(source, destination, additional_metadata={"INSTALLER": b"farm-verify\n"})
    except (InstallerError, ValueError, OSError, zipfile.BadZipFile) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def check_import(w: _Wheel, exp: Expectation, torch_env: _TorchEnv | None, python: Path | None,
                 started: ImportChild | None = None) -> CheckResult:
    """SPEC 9.7. `started`: a child started earlier (see ImportChild), used when it fits this check."""
    knobs = exp.knobs
    if knobs.skip_import:
        reason = knobs.skip_import if isinstance(knobs.skip_import, str) else "verify.skip_import"
        return CheckResult("import", "skip", f"waived: {reason}")
    if exp.links_torch and torch_env is None:
        raise GateCannotRun("the import check of a torch-linked wheel needs the cell's torch environment "
                            "(--torch-env), or --skip-import")
    if torch_env is not None:
        python = torch_env.python
    python = Path(python or sys.executable)
    version = _python_version(python)
    if not _fits(w, version):
        raise GateCannotRun(f"{w.path.name} does not install on {python} (Python {version[0]}.{version[1]})")
    if exp.links_torch and torch_env.torch_dir is None:
        raise GateCannotRun(f"{python}: no torch in this environment")

    target = w.workdir / "target"
    installed = install_into(w.path, target, python)
    if installed:
        return CheckResult("import", "fail", f"installing the wheel into a target folder failed: {installed}")

    modules: list[str] = []
    for name in list(knobs.import_names or _top_level(w)) + list(knobs.extra_imports):
        if name not in modules:
            modules.append(name)
    skipped = []
    for b in w.binaries():
        mod = _module_name(b.member)
        if mod is None or mod in modules:
            continue
        if _no_direct(b.member, mod, knobs.no_direct_import):
            skipped.append(mod)
        else:
            modules.append(mod)

    stub = libcuda_stub_dir(w) if knobs.needs_driver else None
    child = started
    if child is None or child.python != python or child.import_torch != exp.links_torch or stub is not None:
        child = ImportChild(python, exp.links_torch, library_path=stub)
    ops = list(knobs.expect_ops)
    try:
        returncode, stdout, stderr = child.run(target, modules, ops, IMPORT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return CheckResult("import", "fail", f"imports did not finish in {IMPORT_TIMEOUT}s",
                           {"modules": modules})
    events = [json.loads(ln[len("FARM-IMPORT "):]) for ln in stdout.splitlines()
              if ln.startswith("FARM-IMPORT ")]
    details = {"python": str(python), "modules": modules, "not_imported_directly": skipped,
               "events": events, "stderr_tail": stderr.strip().splitlines()[-10:]}
    torch_error = next((e["error"] for e in events if e["module"] == "torch" and e["event"] == "error"), None)
    if torch_error:
        raise GateCannotRun(f"torch does not import in {python}: {torch_error}")
    problems, forgiven = [], []
    imported = [e["module"] for e in events if e["event"] == "ok"]
    for e in events:
        if e["event"] == "error":
            if _forgiven(knobs.expect_device_error, e["error"]):
                forgiven.append(f"{e['module']}: {e['error']}")
            else:
                problems.append(f"import {e['module']} failed: {e['error']}")
        elif e["event"] == "op" and not e["ok"]:
            problems.append(f"expected op {e['module']} is not registered: {e.get('error', '')}")
    if returncode < 0 or (returncode != 0 and not problems):
        begun = [e["module"] for e in events if e["event"] == "begin"]
        last = begun[-1] if begun else "(before any import)"
        try:
            sig = signal.Signals(-returncode).name
        except ValueError:
            sig = f"exit {returncode}"
        hint = (" (twin modules that register the same ops abort the process: list them in "
                "verify.no_direct_import)" if len(begun) > 1 else "")
        problems.append(f"importing {last} killed the child process ({sig}){hint}")
    details["forgiven"] = forgiven
    if forgiven and not problems:
        return CheckResult("import", "pass", f"imported {len(imported)} module(s); device errors forgiven "
                                             f"(verify.expect_device_error): {'; '.join(forgiven)}", details)
    ok = f"imported {', '.join(imported) or 'nothing'} with CUDA_VISIBLE_DEVICES=''" + (
        f"; not imported directly (verify.no_direct_import): {', '.join(skipped)}" if skipped else "")
    return _result("import", problems, [], ok, details)


def _forgiven(expect: bool | str, error: str) -> bool:
    if expect is True:
        return bool(DEVICE_ERROR.search(error))
    if isinstance(expect, str) and expect:
        return bool(re.search(expect, error)) or expect in error
    return False


# ---------------------------------------------------------------- the gate

def _static_checks(report: Report, w: _Wheel, exp: Expectation, env: _TorchEnv | None) -> None:
    """metadata .. arches, in order. A member that cannot be read (the file check names it) or an
    ELF file that does not parse fails the check that met it, never the gate."""
    runs = (("metadata", lambda: check_metadata(w, exp)), ("binaries", lambda: check_binaries(w, exp)),
            ("elf", lambda: check_elf(w, exp, env)), ("torch_linkage", lambda: check_torch_linkage(w, exp)),
            ("arches", lambda: check_arches(w, exp)))
    for name, run in runs:
        try:
            report.checks.append(run())
        except ELFError as exc:
            report.checks.append(CheckResult(name, "fail", f"unreadable ELF file: {exc}"))
        except ZIP_READ_ERRORS as exc:
            report.checks.append(CheckResult(name, "fail", f"a member cannot be read: {exc}"))


def verify_wheel(path: Path | str, expectation: Expectation, *, torch_env: Path | None = None,
                 skip_import: bool = False, python: Path | None = None,
                 import_child: ImportChild | None = None) -> Report:
    """Run every check of SPEC 9 on one wheel. Raises GateCannotRun when the gate cannot judge.

    torch_env: the cell's torch environment (a venv/prefix or its python); it supplies the
    interpreter of the import check and the exact sonames torch provides for the ELF check.
    python: the interpreter for torch-free wheels when no torch_env is given (default: this one).
    import_child: started before the wheel existed (farm.build.steps); closed here whether used or not.
    """
    try:
        return _verify_wheel(Path(path), expectation, torch_env, skip_import, python, import_child)
    finally:
        if import_child is not None:
            import_child.close()


def _verify_wheel(path: Path, expectation: Expectation, torch_env: Path | None, skip_import: bool,
                  python: Path | None, import_child: ImportChild | None) -> Report:
    if not path.is_file():
        raise GateCannotRun(f"{path}: no such wheel file")
    env = _TorchEnv.locate(torch_env) if torch_env is not None else None
    report = Report(path.name, expectation)
    with tempfile.TemporaryDirectory(prefix="farm-verify-") as tmp:
        w = _Wheel(path, Path(tmp))
        try:
            report.checks.append(check_file(w, expectation))
            report.checks.append(check_filename(w, expectation))
            if w.zip_error:
                for name in CHECKS[2:-1]:
                    report.checks.append(CheckResult(name, "skip", "the wheel is not a readable zip"))
            else:
                _static_checks(report, w, expectation, env)
            if skip_import:
                report.checks.append(CheckResult("import", "skip", "skipped (--skip-import)"))
            elif not report.passed:
                report.checks.append(CheckResult("import", "skip", f"not run: {', '.join(report.failed)} failed"))
            else:
                report.checks.append(check_import(w, expectation, env, python, import_child))
        finally:
            if w.zip is not None:
                w.zip.close()
    return report


def verify_cell_wheel(path: Path | str, cell, **kw) -> Report:
    """The pipeline's entry: the cell's own expectation (see Expectation.for_cell for the knobs)."""
    exp_kw = {k: kw.pop(k) for k in ("knobs", "requires_dist", "version", "platform_tag") if k in kw}
    return verify_wheel(path, Expectation.for_cell(cell, **exp_kw), **kw)


def lowest_glibc(path: Path | str) -> str | None:
    """The highest GLIBC_x.y any ELF file of a wheel demands (what its manylinux tag must allow)."""
    with tempfile.TemporaryDirectory(prefix="farm-verify-") as tmp:
        w = _Wheel(Path(path), Path(tmp))
        demand = max((b.elf.glibc for b in w.elf_binaries() if b.elf.glibc), default=None)
        if w.zip is not None:
            w.zip.close()
    return None if demand is None else _dotted(demand)


def record_problems(path: Path | str) -> list[str]:
    """The repair step's tests call the RECORD comparison by this name; it is part of the file check."""
    return wheel_file_problems(path)


# ---------------------------------------------------------------- cells (farm verify --cell)

def resolve_requires_dist(recipe, cell, recipes: Mapping) -> tuple[str, ...] | None:
    """The recipe's requires_dist for this cell: {LOCAL}, {LOCAL:x} and pinned {VER:x} filled in.

    A {VER:x} whose recipe pins no version is known only after x is built: it becomes `*`
    (any version) and the metadata check matches that entry as a pattern.
    """
    from farm.build.label import substitute_requires

    if recipe.requires_dist is None:
        return None
    labels = {name: cuda_tag(cell.cuda) + (f"torch{cell.torch}" if other.links_torch else "")
              for name, other in recipes.items()}
    versions = {name: other.version or "*" for name, other in recipes.items()}
    return tuple(substitute_requires(list(recipe.requires_dist), cell.local_label, versions, labels,
                                     where=str(getattr(recipe, "path", "recipe"))))


def cell_expectation(cell_id: str) -> Expectation:
    """What a cell of the plan promises (farm verify --cell): its label, tags, arch list and recipe knobs."""
    try:
        from farm.recipes.plan import cell_plan
    except ImportError as exc:
        raise GateCannotRun(f"--cell {cell_id}: the planner is not available ({exc}); "
                            f"use --arch-list and --platform") from None
    cell, plan = cell_plan(cell_id)
    recipe = plan.recipes.get(cell.recipe_name)
    if recipe is None:
        raise GateCannotRun(f"--cell {cell_id}: no recipe {cell.recipe_name}")
    return Expectation.for_cell(cell, knobs=recipe.verify, version=recipe.version,
                                requires_dist=resolve_requires_dist(recipe, cell, plan.recipes))
