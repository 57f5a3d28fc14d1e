"""The static checks of the gate (design.md §7.2-7.6, §7.8): the file name, METADATA, that binaries exist,
the ELF files' DT_NEEDED / RPATH / GLIBC demand, their versioned symbols against the cell's floor, torch
linkage of a torch-free recipe, and the CUDA arches in the fatbins. Each takes the opened `Wheel` and the `Expectation` and returns one
`CheckResult`; none imports the wheel.
"""

from __future__ import annotations

import email.parser
import fnmatch
import re
from collections.abc import Iterable, Mapping
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from farm.arch.fatbin import FatbinReport, read_fatbin
from farm.archlist import ArchToken
from farm.build.label import TORCH_FAMILY
from farm.build.verify.expectation import CheckResult, Expectation
from farm.build.verify.torchenv import TorchEnv
from farm.errors import FatbinError
from farm.platforms import from_wheel_platform_tag, lane, origin_relative
from farm.recipes.model import AllowedMissing
from farm.recipes.model import Verify as VerifyKnobs
from farm.wheelhouse.wheelfile import Wheel, dotted, file_problems, glibc_of_tag, names_nvidia_wheel

# DT_NEEDED names every Linux wheel may use (design.md §7.4): glibc's own libraries and the C++ runtime.
_SYSTEM_NEEDED = re.compile(   # fullmatch
    r"(?:lib(?:c|m|dl|pthread|rt|util|resolv|nsl|anl|crypt|BrokenLocale|mvec|thread_db)\.so\.\d+"
    r"|ld-linux[\w.-]*\.so\.\d+|ld64\.so\.\d+|libstdc\+\+\.so\.6|libgcc_s\.so\.1)")
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


def check_filename(w: Wheel, exp: Expectation) -> CheckResult:
    if w.filename_error or w.version is None:   # the version is None exactly when the name did not parse
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
        return CheckResult.of("filename", problems, [], "pure wheel (platform any): the binaries check decides", details)
    if exp.python_tag and exp.python_tag not in interpreters:
        problems.append(f"Python tag {'.'.join(interpreters)}, expected {exp.python_tag}")
    for plat in platforms:
        farm_platform = from_wheel_platform_tag(plat)
        if farm_platform != exp.platform:
            problems.append(f"platform tag {plat} is not {exp.platform}")
        elif exp.platform != "windows" and glibc_of_tag(plat) is None:
            problems.append(f"platform tag {plat} is not a manylinux tag (was the wheel repaired?)")
    # A compressed tag set (manylinux1_x86_64.manylinux_2_5_x86_64, what auditwheel gives a wheel needing
    # only glibc 2.5) is one promise: compare the sets, not one tag against the joined string.
    if exp.platform_tag and set(exp.platform_tag.split(".")) != set(platforms):
        problems.append(f"platform tag {'.'.join(platforms)}, expected {exp.platform_tag}")
    return CheckResult.of("filename", problems, [], f"{w.path.name} matches", details)


# Folders a wheel's top level shares with every other wheel in site-packages: what one installs there,
# another of the same name overwrites and uninstalling either removes (llama.cpp's install rules put
# lib/ and include/ there before its recipe moved them). Not `build`: that is pypa's package.
SHARED_TOP_LEVEL = frozenset({"lib", "lib64", "include", "bin", "share", "etc", "src",
                              "test", "tests", "doc", "docs", "example", "examples", "benchmarks", "scripts"})


def shared_top_level_folders(members: Iterable[str]) -> list[str]:
    """The SHARED_TOP_LEVEL folders a wheel installs into (a .data folder's scripts/ etc. are pip's)."""
    return sorted({m.split("/", 1)[0] for m in members if "/" in m} & SHARED_TOP_LEVEL)


def check_file(w: Wheel, exp: Expectation) -> CheckResult:
    shared = shared_top_level_folders(w.members)
    warnings = [f"installs into site-packages' shared top-level {', '.join(f + '/' for f in shared)} "
                "(another wheel's files of the same name collide there)"] if shared else []
    return CheckResult.of("file", file_problems(w), warnings, "a sound zip: member paths, WHEEL and RECORD check out")


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


def check_metadata(w: Wheel, exp: Expectation) -> CheckResult:
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
        if not exp.links_torch:   # the repair step's requirements on NVIDIA's runtime wheels (design.md §6.6)
            extra = [r for r in extra if not names_nvidia_wheel(r)]
        if miss or extra:
            problems.append("Requires-Dist differs from the recipe's requires_dist"
                            + (f"; missing {miss}" if miss else "") + (f"; unexpected {extra}" if extra else ""))
    return CheckResult.of("metadata", problems, [], f"Version {version_text}, names agree, Requires-Dist as promised", details)


def check_binaries(w: Wheel, exp: Expectation) -> CheckResult:
    bins = w.binaries()
    listed = [b.member for b in bins]
    if bins:
        return CheckResult("binaries", "pass", f"{len(bins)} compiled file(s)", {"files": listed})
    if exp.knobs.allow_pure_python:
        return CheckResult("binaries", "pass", "no compiled module; allowed (verify.allow_pure_python)")
    return CheckResult("binaries", "fail", "no compiled module in the wheel: a pure wheel where binaries are "
                                           "required (set verify.allow_pure_python if that is intended)")


def _torch_env_sonames(torch_env: TorchEnv | None) -> set[str] | None:
    return None if torch_env is None else set(torch_env.sonames())


def check_elf(w: Wheel, exp: Expectation, torch_env: TorchEnv | None) -> CheckResult:
    if exp.platform == "windows":
        return CheckResult("elf", "skip", "not a Linux wheel")
    bins = w.elf_binaries()
    if not bins:
        return CheckResult("elf", "skip", "no ELF files")
    shipped = {b.member.rsplit("/", 1)[-1] for b in bins} | {b.elf.soname for b in bins if b.elf.soname}
    provided = _torch_env_sonames(torch_env)
    plats = [t.platform for t in w.tags]
    bounds = [g for g in (glibc_of_tag(p) for p in plats) if g]
    bound = min(bounds) if bounds else None
    problems: list[str] = []
    details: dict[str, Any] = {"modules": {}, "glibc_bound": None if bound is None else dotted(bound)}

    def allowed(lib: str) -> bool:
        if _SYSTEM_NEEDED.fullmatch(lib) or lib in shipped or lib in DRIVER_LIBS:
            return True
        if any(fnmatch.fnmatch(lib, p) for p in exp.knobs.allowed_needed):
            return True
        if provided is not None:
            return lib in provided
        return any(fnmatch.fnmatch(lib, p) for p in TORCH_PROVIDED_PATTERNS)

    for b in bins:
        e = b.elf
        details["modules"][b.member] = {"needed": list(e.needed), "rpath": list(e.rpaths),
                                        "glibc": None if e.glibc is None else dotted(e.glibc)}
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
    return CheckResult.of("elf", problems, [], ok, details)


def _version_key(number: str) -> tuple[int, ...]:
    return tuple(int(p) for p in number.split(".")) if re.fullmatch(r"\d+(?:\.\d+)*", number) else (-1,)


def check_floor(w: Wheel, exp: Expectation) -> CheckResult:
    """design.md §7.8: every versioned symbol an ELF file of the wheel needs (GLIBC_, GLIBCXX_, CXXABI_,
    GCC_, ... of .gnu.version_r) is one auditwheel's policy for the floor allows: the symbols decide,
    not the tag. A wheel with no ELF file has nothing above any floor."""
    if exp.platform == "windows":
        return CheckResult("floor", "skip", "not a Linux wheel")
    if exp.floor is None:
        return CheckResult("floor", "skip", "no floor given (farm verify --floor)")
    from farm.floor import highest, symbol_versions

    allowed = symbol_versions(exp.floor, exp.platform)
    bins = w.elf_binaries()
    problems: list[str] = []
    details: dict[str, Any] = {"floor": exp.floor, "above": {}}
    for b in bins:
        above: dict[str, set[str]] = {}   # prefix -> the versions it needs that the floor lacks
        for _, version in b.elf.version_needs:
            prefix, _, number = version.partition("_")
            if prefix in allowed and number not in allowed[prefix]:
                above.setdefault(prefix, set()).add(number)
        if not above:
            continue
        details["above"][b.member] = sorted(f"{p}_{n}" for p, ns in above.items() for n in ns)
        worst = [f"{p}_{max(above[p], key=_version_key)}" for p in sorted(above)]
        limits = [f"{p} <= {highest(allowed[p])}" for p in sorted(above)]
        problems.append(f"{b.member} needs {', '.join(worst)}, above {exp.floor} (allows {', '.join(limits)})")
    ok = f"{len(bins)} ELF file(s), no versioned symbol above {exp.floor}" if bins else \
        f"no ELF file: nothing above {exp.floor}"
    return CheckResult.of("floor", problems, [], ok, details)


def check_torch_linkage(w: Wheel, exp: Expectation) -> CheckResult:
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
    return CheckResult.of("torch_linkage", problems, [], "torch-free: no libtorch/libc10 and no at::/c10::/torch:: symbols")


def _fmt_sass(sm: int, variant: str) -> str:
    return f"sm_{sm}{variant}"


def check_arches(w: Wheel, exp: Expectation) -> CheckResult:
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

    waiver = missing_waiver(knobs, exp.platform)
    forgiven = forgiven_targets(waiver.archs) if waiver is not None else frozenset()
    waived_tokens = [str(t) for t in missing if _fmt_sass(t.sm, t.variant) in forgiven]
    waived_tokens += [f"{t.major}.{t.minor}+PTX" for t in missing_ptx if f"compute_{t.sm}" in forgiven]
    waived_tokens = list(dict.fromkeys(waived_tokens))   # a +PTX token whose SASS and PTX are both waived: once
    missing = [t for t in missing if _fmt_sass(t.sm, t.variant) not in forgiven]
    missing_ptx = [t for t in missing_ptx if f"compute_{t.sm}" not in forgiven]

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
    if waived_tokens and waiver is not None:   # tokens are waived by a waiver only
        warnings.append(f"missing {' '.join(waived_tokens)} waived (verify.allow_missing_archs): {waiver.reason}")
    details["missing"] = [str(t) for t in missing] + [f"{t.major}.{t.minor}+PTX" for t in missing_ptx]
    details["waived"] = waived_tokens
    ok = f"every arch of {exp.arch_list.torch()} has SASS (and PTX where +PTX) over {len(modules)} module(s)"
    return CheckResult.of("arches", problems, warnings, ok, details)


def missing_waiver(knobs: VerifyKnobs, platform: str) -> AllowedMissing | None:
    """The recipe's `verify.allow_missing_archs` entry for `platform` (or its lane), or None."""
    table: Mapping[str, Any] = knobs.allow_missing_archs or {}
    return table.get(platform) or table.get(lane(platform))


def forgiven_targets(archs: Iterable[ArchToken]) -> frozenset[str]:
    """The nvcc targets a waiver's tokens forgive when absent: each token's SASS (sm_90a for 9.0a) and,
    for a plain token, its PTX (compute_90). The one rule of the gate (check_arches) and the flags tier
    (farm.build.compile.flags_report)."""
    return frozenset({_fmt_sass(t.sm, t.variant) for t in archs} | {f"compute_{t.sm}" for t in archs if not t.variant})

