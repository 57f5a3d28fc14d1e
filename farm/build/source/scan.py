"""The upstream hazard scan (design.md §4.7): read a package's fetched source for the traps the farm met
in its packages, and name each with file, line and the farm's own fix for it.

It reads the build scripts (every setup.py, CMakeLists.txt and *.cmake) and the C++/CUDA sources (.cu,
.cuh, .cpp, .cc, .h, .hpp), outside vendored folders (third_party/, cutlass/, ...: their build files are
rarely the package's build, and their headers would drown its own findings). Each rule is a line
pattern; the hits of one hazard class in one file are one hazard, located at its first line.

Against a recipe, a hazard is marked handled when one of its patches changes that line (a hunk's old
lines cover it, or a removed line reads the same), when its `env` sets a variable the file reads,
or when its `system_packages` names the package. This is a hint for a reader, not a proof.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from farm.recipes.model import Recipe

BUILD_NAMES = ("setup.py", "CMakeLists.txt")
BUILD_SUFFIXES = (".cmake",)
SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".h", ".hpp")
VENDORED = frozenset({"third_party", "thirdparty", "3rdparty", "external", "extern", "vendor", "cutlass", "pybind11",
                      "test", "tests", "docs", "examples", "benchmarks"})
MAX_FILE_BYTES = 2 << 20
UNLESS_WINDOW = 2   # a rule's `unless` looks this many lines either side (a condition split over lines)
_ROCM = re.compile(r"offload-arch|gcnArchName|\bhip\b|rocm", re.IGNORECASE)   # AMD's branch of a setup.py
_MESSAGE = re.compile(r"print\(|warn|please|raise|assert|error|message", re.IGNORECASE)   # words about a fetch

# The variables the farm exports for a cell's arch list (design.md §6.4): reading these is the point.
EXPORTED_ARCH_VARIABLES = frozenset({"TORCH_CUDA_ARCH_LIST", "CUDAARCHS", "CMAKE_CUDA_ARCHITECTURES"})

# What each hazard class's fix is, in the farm's own terms; patches named are real ones to copy.
FIX = {
    "gpu-probe": "patch it to take the targets from TORCH_CUDA_ARCH_LIST, which the farm always exports "
                 "(pattern: recipes/patches/fused_ssim/0001-honour-arch-list.patch)",
    "own-arch-list": "patch it to build exactly TORCH_CUDA_ARCH_LIST, '+PTX' as a compute_ target "
                     "(pattern: recipes/patches/sageattention/0001-honour-arch-list.patch); never narrow the list",
    "arch-specific": "declare the X.Ya token it builds in the recipe's arch list, and waive a plain arch it never "
                     "builds with verify.allow_missing_archs and a reason (natten, torchao)",
    "own-arch-variable": "set it from the cell's list in the recipe's env ('{ARCHS_TORCH}' or '{ARCHS_CMAKE}', in "
                         "the form it parses), or patch it to fall back to TORCH_CUDA_ARCH_LIST "
                         "(pattern: recipes/patches/natten/0001-arch-list-from-torch-cuda-arch-list.patch)",
    "arch-overwrite": "patch the assignment out so torch's BuildExtension builds the farm's list "
                      "(pattern: recipes/patches/pointnet2_ops/0001-honour-arch-list.patch)",
    "cmake-arch": "patch it to keep the CUDAARCHS / CMAKE_CUDA_ARCHITECTURES the farm exports "
                  "(pattern: recipes/patches/pyg_lib/0001-honour-cudaarchs.patch)",
    "download": "the compile step has no network: pin the tree as extra_sources (or submodules: true) and patch the "
                "fetch out (pattern: recipes/patches/sageattn3/0001-arch-list-from-env-and-pinned-cutlass.patch); "
                "a prebuilt-wheel download usually has an env switch to build instead (flash_attn's "
                "FLASH_ATTENTION_FORCE_BUILD)",
    "submodule": "submodules: true in the recipe: the source step fetches them at the pinned commit",
    "pkg_resources": "setuptools 81+ ships no pkg_resources: patch it to importlib.metadata / packaging "
                     "(pattern: recipes/patches/drtk/0001-importlib-metadata-instead-of-pkg_resources.patch)",
    "distutils": "distutils left the standard library in Python 3.12: setuptools' shim serves most imports; patch it "
                 "to setuptools / sysconfig where it does not, or the 3.12+ cells fail",
    "tensor-type": "torch 2.13's dispatch macros take only a ScalarType: patch .type() to .scalar_type() "
                   "(pattern: recipes/patches/torchsparse/0002-dispatch-on-scalar-type.patch)",
    "libcuda": "the toolkit step provides a libcuda.so stub to link against, and the import check then needs "
               "verify.needs_driver: true; or patch it to cudaGetDriverEntryPoint "
               "(pattern: recipes/patches/sageattention/0002-tensormap-without-libcuda.patch)",
    "home-write": "a build container's HOME may be read-only and the host runner's is root's: patch the write out, "
                  "or ship the file in the package (pattern: recipes/patches/flex_gemm/0001-ship-autotune-cache-no-home-write.patch)",
    "system-package": "name it under system_packages, both managers (the container runner installs them in a "
                      "cached layer; torchsparse does this)",
}


@dataclass(frozen=True)
class Rule:
    kind: str
    where: str                 # "python" (setup.py), "cmake", "source" (C++/CUDA)
    pattern: re.Pattern[str]
    summary: str               # may use {0}: the pattern's first group
    unless: re.Pattern[str] | None = None   # a hit near a line matching this is no hazard
    window: int = UNLESS_WINDOW        # lines either side `unless` looks at (0: the hit's own line)


def _rx(text: str) -> re.Pattern[str]:
    return re.compile(text)


RULES = (
    Rule("gpu-probe", "python", _rx(r"torch\.cuda\.(get_device_capability|get_device_properties|device_count|"
                                    r"current_device)\s*\("),
         "asks the build machine's GPU (torch.cuda.{0}): a build host has none", unless=_ROCM, window=0),
    Rule("gpu-probe", "python", _rx(r"torch\.cuda\.(is_available)\s*\("),
         "decides on torch.cuda.{0}(), false on a GPU-less build host",
         # FORCE_CUDA=1, which the farm sets, wins over it nearby; a ROCm-only test is not the CUDA build's
         unless=re.compile(r"FORCE_CUDA|version\.hip", re.IGNORECASE), window=5),
    Rule("gpu-probe", "python", _rx(r"(nvidia-smi)"), "runs {0}: a build host has no GPU"),
    Rule("arch-overwrite", "python", _rx(r"""environ\[\s*['"](TORCH_CUDA_ARCH_LIST)['"]\s*\]\s*=[^=]"""),
         "overwrites {0}: the farm's list is lost"),
    # Flags are strings in a setup.py: a quote before them tells a flag from prose (a docstring's "no -gencode").
    Rule("arch-specific", "python", _rx(r"""['"](?:-gencode|arch=compute_|code=sm_|-arch=sm_)\S*?(\d+a)\b"""),
         "builds the arch-specific target sm_{0} itself"),
    Rule("own-arch-list", "python", _rx(r"""['"](-gencode|arch=compute_|code=sm_|-arch=sm_)"""),
         "writes its own {0} flags instead of following TORCH_CUDA_ARCH_LIST"),
    Rule("own-arch-variable", "python", _rx(r"""(?:getenv|environ\.get|environ\[)\s*\(?\s*['"](\w*ARCH\w*)['"]"""),
         "reads its own arch variable {0}", unless=_ROCM, window=1),
    Rule("cmake-arch", "cmake", _rx(r"(set\s*\(\s*CMAKE_CUDA_ARCHITECTURES|CUDA_ARCHITECTURES\s+\S|-gencode)"),
         "sets its own CUDA architectures ({0})", unless=_rx(r"CUDAARCHS|NOT\s+DEFINED")),
    Rule("download", "python", _rx(r"(urlretrieve|urlopen|requests\.get|wget\s|curl\s|git\s+clone|['\"]clone['\"])"),
         "downloads during the build ({0})", unless=_MESSAGE, window=0),
    Rule("submodule", "python", _rx(r"(git\s+submodule|['\"]submodule['\"])"), "fetches submodules during the build",
         unless=_MESSAGE, window=0),
    Rule("download", "cmake", _rx(r"(FetchContent_Declare|ExternalProject_Add|file\s*\(\s*DOWNLOAD)"),
         "downloads during the build ({0})"),
    Rule("pkg_resources", "python", _rx(r"^\s*(import\s+pkg_resources|from\s+pkg_resources\s+import)"),
         "imports pkg_resources"),
    Rule("distutils", "python", _rx(r"^\s*(import\s+distutils|from\s+distutils[\w.]*\s+import)"), "imports distutils"),
    Rule("tensor-type", "source", _rx(r"DISPATCH\w*\s*\([^;]{0,160}?\b\w+(?:\.|->)(type)\(\)"),
         "dispatches on the removed Tensor.{0}()"),
    Rule("libcuda", "python", _rx(r"""(['"]-lcuda['"]|libraries\s*=\s*\[[^\]]*['"]cuda['"])"""),
         "links the driver library at build time ({0})"),
    Rule("libcuda", "cmake", _rx(r"(CUDA::cuda_driver|-lcuda\b|target_link_libraries\([^)]*\bcuda\b)"),
         "links the driver library at build time ({0})"),
    Rule("home-write", "python", _rx(r"""(expanduser\(\s*['"]~|Path\.home\(\)|environ\[\s*['"]HOME['"]|getenv\(\s*['"]HOME)"""),
         "writes under the builder's HOME ({0})"),
)

# Headers the builder images lack -> (apt package, dnf package). A header the tree carries itself is no need.
SYSTEM_HEADERS = (
    (("google/dense_hash_map", "google/sparse_hash_map", "sparsehash/"), "libsparsehash-dev", "sparsehash-devel"),
    (("boost/",), "libboost-dev", "boost-devel"),
    (("Eigen/", "eigen3/"), "libeigen3-dev", "eigen3-devel"),
    (("GL/glew.h",), "libglew-dev", "glew-devel"),
    (("GL/gl.h", "GL/glext.h"), "libgl-dev", "mesa-libGL-devel"),
    (("EGL/",), "libegl-dev", "mesa-libEGL-devel"),
    (("glm/",), "libglm-dev", "glm-devel"),
    (("openssl/",), "libssl-dev", "openssl-devel"),
    (("zlib.h",), "zlib1g-dev", "zlib-devel"),
    (("png.h",), "libpng-dev", "libpng-devel"),
    (("jpeglib.h",), "libjpeg-dev", "libjpeg-turbo-devel"),
    (("opencv2/",), "libopencv-dev", "opencv-devel"),
)
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')


@dataclass(frozen=True)
class Hazard:
    kind: str
    file: str                  # relative to the scanned tree's root, '/'-separated
    line: int
    lines: tuple[int, ...]     # every hit of the run
    text: str                  # the first hit's line, stripped
    summary: str
    fix: str
    handled: str = ""          # what in the recipe already deals with it
    package: str = ""          # system-package: the apt package it needs

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"

    def plain(self) -> dict[str, Any]:
        return {"kind": self.kind, "file": self.file, "line": self.line, "lines": list(self.lines),
                "text": self.text, "summary": self.summary, "fix": self.fix, "handled": self.handled,
                "package": self.package}


@dataclass
class ScanReport:
    hazards: list[Hazard]
    files_read: int
    skipped: list[str] = field(default_factory=list)   # vendored folders left out


def _kind_of(path: Path) -> str | None:
    if path.name == "setup.py":
        return "python"
    if path.name == "CMakeLists.txt" or path.suffix in BUILD_SUFFIXES:
        return "cmake"
    if path.suffix in SOURCE_SUFFIXES:
        return "source"
    return None


def _files(top: Path, skipped: list[str]) -> Iterator[Path]:
    for folder, dirs, names in os.walk(top):
        kept = []
        for d in sorted(dirs):
            if d in VENDORED or d.startswith("."):
                skipped.append(str(Path(folder, d).relative_to(top)))
            else:
                kept.append(d)
        dirs[:] = kept
        for name in sorted(names):
            path = Path(folder, name)
            if _kind_of(path) and path.is_file() and not path.is_symlink():
                yield path


def scan_tree(root: Path, subdir: str | None = None) -> ScanReport:
    """Every hazard in `root` (or its `subdir`, what the build reads), paths relative to `root`."""
    root = Path(root)
    top = root / subdir if subdir else root
    skipped: list[str] = []
    files = list(_files(top, skipped))
    present = {Path(folder, name).relative_to(top).as_posix()          # vendored headers count as present
               for folder, _, names in os.walk(top) for name in names}
    hazards: list[Hazard] = []
    for path in files:
        if path.stat().st_size > MAX_FILE_BYTES:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(root).as_posix()
        kind = _kind_of(path)
        hazards += _rule_hazards(rel, text, kind)
        if kind == "source":
            hazards += _header_hazards(rel, text, present)
    hazards.sort(key=lambda h: (h.file, h.line, h.kind))
    first: dict[str, Hazard] = {}   # one system-package hazard per package: its first include
    hazards = [h for h in hazards if h.kind != "system-package" or first.setdefault(h.package, h) is h]
    return ScanReport(hazards, len(files), skipped)


def _rule_hazards(rel: str, text: str, kind: str | None) -> list[Hazard]:
    lines = text.splitlines()
    starts = _line_starts(text)
    hits: dict[str, list[tuple[int, str, Rule]]] = {}
    taken: set[int] = set()   # a line one rule named is not named again by a broader one (arch-specific, then own list)
    for rule in RULES:
        if rule.where != kind:
            continue
        for number, value in _hits(rule, text, lines, starts):
            near = "\n".join(lines[max(0, number - 1 - rule.window):number + rule.window])
            if number in taken or (rule.unless and rule.unless.search(near)):
                continue
            if rule.kind == "own-arch-variable" and value in EXPORTED_ARCH_VARIABLES:
                continue   # reading the farm's own variables is the point
            taken.add(number)
            hits.setdefault(rule.kind, []).append((number, value, rule))
    out = []
    for hazard_kind, found in hits.items():
        found.sort(key=lambda h: h[0])
        first, value, rule = found[0]
        out.append(Hazard(hazard_kind, rel, first, tuple(n for n, _, _ in found), lines[first - 1].strip()[:160],
                          rule.summary.format(value), FIX[hazard_kind]))
    return out


def _hits(rule: Rule, text: str, lines: list[str], starts: list[int]) -> Iterator[tuple[int, str]]:
    """(line number, the pattern's first group) of each hit: per line in build scripts (a comment line
    builds nothing), over the whole text in sources (a dispatch macro's arguments span lines)."""
    if rule.where == "source":
        for found in rule.pattern.finditer(text):
            yield _line_of(starts, found.start(1)), found.group(1)
        return
    for number, line in enumerate(lines, 1):
        hit = None if line.lstrip().startswith("#") else rule.pattern.search(line)
        if hit:
            yield number, hit.group(1)


def _line_starts(text: str) -> list[int]:
    return [0] + [m.end() for m in re.finditer("\n", text)]


def _line_of(starts: list[int], offset: int) -> int:
    import bisect

    return bisect.bisect_right(starts, offset)


def _header_hazards(rel: str, text: str, present: set[str]) -> list[Hazard]:
    out = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        m = _INCLUDE.match(line)
        if not m:
            continue
        header = m.group(1)
        for prefixes, apt, dnf in SYSTEM_HEADERS:
            if apt in seen or not header.startswith(prefixes):
                continue
            if any(p == header or p.endswith("/" + header) for p in present):
                continue   # the tree carries it (a vendored copy)
            seen.add(apt)
            out.append(Hazard("system-package", rel, number, (number,), line.strip()[:160],
                              f"includes <{header}>, which the builder images lack (apt {apt}, dnf {dnf})",
                              FIX["system-package"] + f": system_packages: {{apt: [{apt}], dnf: [{dnf}]}}",
                              package=apt))
    return out


# ---------------------------------------------------------------- against a recipe's patches and keys

@dataclass(frozen=True)
class Hunk:
    file: str
    old_start: int
    old_count: int
    removed: tuple[str, ...]   # the '-' lines, stripped

    def covers(self, line: int) -> bool:
        return self.old_start <= line < self.old_start + max(self.old_count, 1)


_SWITCH = re.compile(r"BUILD|DOWNLOAD|OFFLINE|SKIP|FORCE")   # env names that turn a fetch off, by their words
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


def read_hunks(patch_text: str) -> list[Hunk]:
    """The hunks of a unified diff (git's form: paths after a/ and b/ from the checkout's root)."""
    hunks: list[Hunk] = []
    file = ""
    start = count = 0
    removed: list[str] = []
    in_hunk = False

    def close() -> None:
        if in_hunk:
            hunks.append(Hunk(file, start, count, tuple(removed)))

    for line in patch_text.splitlines():
        if line.startswith("--- "):
            close()
            in_hunk = False
            continue
        if line.startswith("+++ "):
            file = line[4:].strip().removeprefix("b/")
            continue
        m = _HUNK.match(line)
        if m:
            close()
            start, count = int(m.group(1)), int(m.group(2) or 1)
            removed, in_hunk = [], True
            continue
        if in_hunk and line.startswith("-"):
            removed.append(line[1:].strip())
    close()
    return hunks


def handled_by(hazards: Iterable[Hazard], recipe: Recipe, patches: Mapping[str, str], texts: Mapping[str, str]) -> list[Hazard]:
    """`hazards` with `handled` said where `recipe` already deals with them: `patches` maps a patch's file
    name to its text, `texts` a scanned file to its text (for the env variables it reads)."""
    hunks = {name: read_hunks(text) for name, text in patches.items() if not name.endswith(".py")}
    apt = set(recipe.system_packages.get("apt", ()))
    out = []
    for h in hazards:
        mine = {name: [k for k in found if k.file == h.file] for name, found in hunks.items()}
        # A patch that removes the very line first; else one whose hunk spans it (later patches' line
        # numbers are shifted by the earlier ones, so a span is only a hint).
        why = next((f"patch {name}" for name, found in mine.items() if any(h.text in k.removed for k in found)), "")
        why = why or next((f"patch {name}" for name, found in mine.items()
                           if any(k.covers(n) for k in found for n in h.lines)), "")
        variable = h.summary.rsplit(" ", 1)[-1]
        if why:
            pass
        elif h.kind == "system-package":
            header = re.search(r"<([^/>]+)", h.summary)
            if h.package in apt:
                why = f"system_packages names {h.package}"
            elif header and any(header.group(1).lower() in e.dest.lower() for e in recipe.extra_sources):
                why = "extra_sources place it: " + ", ".join(e.dest for e in recipe.extra_sources)
            elif recipe.submodules:   # a tree given without its submodules; the fetched source has them
                why = "submodules: true: a submodule may carry it"
        elif h.kind == "arch-specific" and recipe.verify.allow_missing_archs:
            why = "verify.allow_missing_archs waives the plain archs it never builds"
        elif h.kind == "own-arch-variable" and variable in recipe.env:
            why = f"env sets {variable}"
        elif h.kind == "submodule" and recipe.submodules:
            why = "submodules: true (fetched at the pinned commit before the build)"
        elif h.kind == "download":   # a switch that turns the download off, read by that file
            named = sorted(k for k in recipe.env if _SWITCH.search(k)
                           and re.search(rf"\b{re.escape(k)}\b", texts.get(h.file, "")))
            if named:
                why = f"env sets {', '.join(named)}, which {h.file} reads"
        out.append(replace(h, handled=why))
    return out


def scan_recipe(recipe: Recipe, source: Path | None = None) -> ScanReport:
    """The hazards of a recipe's upstream source: `source` (a checkout's root, as the recipe's patches
    see it), else the recipe's own source fetched through the build's source step, without its
    patches, into a temporary folder. Each hazard says what in the recipe already handles it."""
    import shutil
    import tempfile

    from farm import settings

    scratch = None
    try:
        if source is None:
            from farm.build.source.prepare import prepare_source

            scratch = Path(tempfile.mkdtemp(prefix="farm-scan-"))
            source = scratch / "tree"
            prepare_source(recipe.source, source, platform="linux", cuda="", submodules=recipe.submodules,
                           where=settings.display(recipe.path))
        report = scan_tree(source, recipe.subdir)
        texts = {h.file: (source / h.file).read_text(encoding="utf-8", errors="replace") for h in report.hazards}
        patches = {p.file: p.path.read_text(encoding="utf-8", errors="replace") for p in recipe.patches}
        report.hazards = handled_by(report.hazards, recipe, patches, texts)
        return report
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
