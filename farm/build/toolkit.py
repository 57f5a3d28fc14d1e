"""The CUDA toolkit of a cell (SPEC 8.1 step 3).

Three sources, in this order for `source="auto"`:
- `image` / `system`: a toolkit already installed (/usr/local/cuda*, or
  FARM_CUDA_HOME) whose `nvcc --version` is on the cell's CUDA line; inside a
  container that is the image's toolkit;
- `pypi`: CUDA 13.x assembled from NVIDIA's wheels (the `cuda-toolkit`
  meta-package's extras pin consistent component versions) into
  cache_dir()/toolkits/<cuda>-<arch>[+components]/ with the layout torch's
  cpp_extension and CMake expect: bin/nvcc, nvvm/bin/cicc, include, lib and
  lib64 with libcudart.so -> libcudart.so.13, targets/<triple>/{include,lib}, and
  the libcuda link stub NVIDIA's wheels lack (lib/stubs/libcuda.so, see
  ensure_libcuda_stub). Built once under a lock, read-only afterwards.
PyPI has no nvcc for CUDA 12.x, so a 12.x cell needs an image or system toolkit.

The chosen nvcc is asked what it can emit (`--list-gpu-code`, `--list-gpu-arch`,
and a `--dryrun` probe for arch-/family-specific tokens); a token it cannot
emit fails the cell by name, never silently dropped.
"""

from __future__ import annotations

import email.parser
import json
import os
import platform as _pyplatform
import re
import shutil
import stat
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from farm.arch.archlist import ArchList, ArchToken
from farm.build.downloads import DownloadSet, Index, download, find_manifest
from farm.errors import BadInput, FarmError
from farm.paths import cache_dir
from farm.run import cachebudget
from farm.versions import vtuple

# cuda-toolkit extras every toolkit gets (the compiler, runtime, CCCL) ...
CORE_EXTRAS = ("nvcc", "crt", "nvvm", "cccl", "cudart")
# ... and the libraries whose HEADERS torch's ATen/cuda/CUDAContext.h includes.
# Their shared libraries come from the torch environment at run time, so they
# are unpacked headers-only unless a recipe names them in cuda_components.
TORCH_HEADER_EXTRAS = ("cublas", "cusparse", "cusolver")
# One header that shows a component is present in an installed toolkit.
COMPONENT_HEADER = {
    "cublas": "cublas_v2.h", "cusparse": "cusparse.h", "cusolver": "cusolverDn.h", "curand": "curand.h",
    "cufft": "cufft.h", "nvtx": "nvtx3/nvToolsExt.h", "nvrtc": "nvrtc.h", "cupti": "cupti.h",
    "nvjitlink": "nvJitLink.h", "npp": "npp.h", "nvjpeg": "nvjpeg.h", "cufile": "cufile.h",
    "nvml": "nvml.h", "cccl": ("cccl/cuda/std/version", "cuda/std/version"), "cudart": "cuda_runtime.h",
}
TARGET_TRIPLE = {"x86_64": "x86_64-linux", "aarch64": "sbsa-linux"}
SYSTEM_GLOBS = ("/usr/local/cuda", "/usr/local/cuda-*", "/opt/cuda", "/opt/cuda-*")
_RELEASE = re.compile(r"release (\d+\.\d+), V(\d+(?:\.\d+)+)")
# cuda.h: `CUresult CUDAAPI cuInit(unsigned int Flags);` and `#define cuCtxCreate cuCtxCreate_v4`
# or `#define cuMemcpyHtoD __CUDA_API_PTDS(cuMemcpyHtoD_v2)` (the per-thread-stream variant).
_DRIVER_DECL = re.compile(r"\bCUDAAPI\s+(cu\w+)\s*\(")
_DRIVER_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(cu\w+)[ \t]+(?:__CUDA_API_PT(DS|SZ)\([ \t]*)?(cu\w+)",
                            re.MULTILINE)
CUDA_ERROR_NO_DEVICE = 100
STUB_NAME, STUB_SONAME = "libcuda.so", "libcuda.so.1"


class ToolkitUnavailable(FarmError):
    exit_code = 1


class ToolkitCannotEmit(FarmError):
    exit_code = 1


def arch_of(platform_or_arch: str) -> str:
    """'linux' / 'x86_64' -> 'x86_64'; 'linux_aarch64' / 'aarch64' / 'arm64' -> 'aarch64'."""
    p = platform_or_arch
    if p in ("linux", "x86_64", "amd64"):
        return "x86_64"
    if p in ("linux_aarch64", "aarch64", "arm64", "sbsa"):
        return "aarch64"
    raise FarmError(f"no Linux CUDA toolkit for platform {p!r}")


def host_arch() -> str:
    return arch_of(_pyplatform.machine().lower())


def in_container() -> bool:
    """Set by the container runner: this machine may itself be a container, so no file probes."""
    return os.environ.get("FARM_IN_CONTAINER") == "1"


def _line(cuda: str) -> str:
    try:
        major, minor = vtuple(cuda)[:2]
    except ValueError:
        raise BadInput("cell", "cuda", cuda, "not a CUDA version like 13.0") from None
    return f"{major}.{minor}"


def normalise_components(components: Iterable[str]) -> tuple[str, ...]:
    out = []
    for c in components or ():
        name = str(c).strip().lower()
        if not re.fullmatch(r"[a-z0-9_]+", name):
            raise BadInput("recipe", "cuda_components", c, "not a CUDA component name (e.g. curand, cufft, nvtx)")
        if name not in out:
            out.append(name)
    return tuple(sorted(out))


@dataclass(frozen=True)
class Toolkit:
    home: Path                 # CUDA_HOME
    version: str               # nvcc's full version, '13.0.88'
    line: str                  # '13.0'
    source: str                # pypi | system | image
    arch: str                  # x86_64 | aarch64
    gpu_codes: tuple[str, ...]  # nvcc --list-gpu-code: sm_75 ...
    gpu_archs: tuple[str, ...]  # nvcc --list-gpu-arch: compute_75 ...
    components: tuple[str, ...] = ()
    wheels: tuple[str, ...] = field(default=(), compare=False)   # pypi: the wheel files it was made of

    @property
    def nvcc(self) -> Path:
        return self.home / "bin" / "nvcc"

    @property
    def lib_dir(self) -> Path:
        return self.home / "lib64" if (self.home / "lib64").is_dir() else self.home / "lib"

    def stub_dirs(self) -> list[Path]:
        found = [self.lib_dir / "stubs", self.home / "targets" / TARGET_TRIPLE[self.arch] / "lib" / "stubs"]
        seen, out = set(), []
        for d in found:
            if d.is_dir() and d.resolve() not in seen:
                seen.add(d.resolve())
                out.append(d)
        return out

    def env(self) -> dict[str, str]:
        """Variables that make every build system find exactly this toolkit."""
        return {"CUDA_HOME": str(self.home), "CUDA_PATH": str(self.home), "CUDA_ROOT": str(self.home),
                "CUDACXX": str(self.nvcc), "CUDA_NVCC_EXECUTABLE": str(self.nvcc)}

    def missing(self, arch_list: ArchList) -> list[str]:
        """The tokens of `arch_list` this nvcc cannot emit, spelled as nvcc would (sm_89a, compute_90)."""
        out = []
        for t in arch_list:
            sm = f"sm_{t.sm}"
            if sm not in self.gpu_codes:
                out.append(f"{sm}{t.variant}")
                continue
            if t.variant and not self._probe(t):
                out.append(f"{sm}{t.variant}")
            if t.ptx and f"compute_{t.sm}" not in self.gpu_archs:
                out.append(f"compute_{t.sm}")
        return out

    def _probe(self, t: ArchToken) -> bool:
        """Arch-/family-specific targets are not listed by --list-gpu-code: ask nvcc to plan one."""
        code = f"{t.sm}{t.variant}"
        proc = subprocess.run([str(self.nvcc), "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull,
                               f"-gencode=arch=compute_{code},code=sm_{code}"],
                              capture_output=True, text=True)
        return proc.returncode == 0

    def require(self, arch_list: ArchList, cell: str = "") -> None:
        """Fail, naming every missing arch, when this nvcc cannot emit the whole list."""
        if not self.gpu_codes:
            raise ToolkitUnavailable(
                f"CUDA {self.version} nvcc for {self.arch} at {self.home} cannot run on this {host_arch()} "
                f"machine, so its arch list is unchecked: check it where the build runs")
        gone = self.missing(arch_list)
        if gone:
            who = f"{cell}: " if cell else ""
            raise ToolkitCannotEmit(
                f"{who}CUDA {self.version} nvcc ({self.source}, {self.home}) cannot emit {' '.join(gone)} "
                f"for arch list '{arch_list.torch()}' (it emits: {' '.join(self.gpu_codes)})")

    def to_json(self) -> dict:
        d = asdict(self)
        d["home"] = str(self.home)
        return d

    @classmethod
    def from_json(cls, d: dict) -> Toolkit:
        d = dict(d)
        d["home"] = Path(d["home"])
        for k in ("gpu_codes", "gpu_archs", "components", "wheels"):
            d[k] = tuple(d.get(k, ()))
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


# ---------------------------------------------------------------- the libcuda link stub

def driver_api_names(cuda_h: Path) -> list[str]:
    """Every driver API function `cuda.h` declares, plus the names its #defines turn them into
    (cuCtxCreate -> cuCtxCreate_v4; cuMemcpyHtoD -> cuMemcpyHtoD_v2 and its _ptds twin): what
    code compiled against that header links to."""
    text = cuda_h.read_text(errors="replace")
    declared = set(_DRIVER_DECL.findall(text))
    names = set(declared)
    for name, per_thread, target in _DRIVER_DEFINE.findall(text):
        if name in declared or target in declared:
            names |= {name, target} | ({f"{target}_pt{per_thread.lower()}"} if per_thread else set())
    return sorted(names)


def find_libcuda_stub(homes: Iterable[Path | str]) -> Path | None:
    """The first libcuda.so link stub under one of these toolkit prefixes."""
    for home in homes:
        home = Path(home)
        for cand in (home / "lib64" / "stubs" / STUB_NAME, home / "lib" / "stubs" / STUB_NAME,
                     *sorted(home.glob(f"targets/*/lib/stubs/{STUB_NAME}"))):
            if cand.is_file():
                return cand
    return None


def cached_toolkit_homes(arch: str | None = None, root: Path | None = None) -> list[Path]:
    """The complete PyPI toolkits in the cache for `arch` (default: this machine's)."""
    arch = arch_of(arch) if arch else host_arch()
    folder = (root or cache_dir()) / "toolkits"
    return sorted(p for p in folder.glob(f"*-{arch}*") if cachebudget.read_marker(p) is not None)


def build_libcuda_stub(out: Path, names: Iterable[str]) -> Path:
    """Write a libcuda.so stub to `out` atomically: SONAME libcuda.so.1, each of `names` a
    function returning CUDA_ERROR_NO_DEVICE, so a link resolves and any call says no device.
    The one stub maker: the toolkit's (names from cuda.h) and the verify gate's fallback use it."""
    names = sorted(set(names)) or ["cuInit"]
    cc = shutil.which(os.environ.get("CC") or "cc")
    if cc is None:
        raise ToolkitUnavailable("no C compiler (cc, or $CC) to make the libcuda link stub with")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".libcuda-stub-", dir=out.parent) as tmp:
        src, made = Path(tmp) / "libcuda_stub.c", Path(tmp) / STUB_NAME
        src.write_text("/* farm: a link stub; every call reports CUDA_ERROR_NO_DEVICE */\n" + "".join(
            f"int {n}(void) {{ return {CUDA_ERROR_NO_DEVICE}; }}\n" for n in names))
        proc = subprocess.run([cc, "-shared", "-fPIC", "-O0", "-g0", f"-Wl,-soname,{STUB_SONAME}", "-o",
                               str(made), str(src)], capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise ToolkitUnavailable(f"making the libcuda link stub failed: {tail[:200]}")
        with open(made, "rb") as fh:
            os.fsync(fh.fileno())
        made.chmod(0o555)
        os.replace(made, out)
    return out


def ensure_libcuda_stub(home: Path, arch: str) -> Path | None:
    """`<home>/lib/stubs/libcuda.so` (lib64 and targets/<triple>/lib lead there too) when the
    toolkit has no stub: NVIDIA's wheels carry none, so `-lcuda` and CMake's CUDA::cuda_driver
    fail without it. Made on this machine's arch only (the C compiler's); the caller holds the
    entry's exclusive lock (a new entry), or its lease and stub_lock (an older one). Never
    shipped: repair excludes libcuda.so* from every wheel."""
    found = find_libcuda_stub([home])
    if found is not None or arch_of(arch) != host_arch():
        return found
    cuda_h = home / "include" / "cuda.h"
    if not cuda_h.is_file():
        return None
    lib = home / "lib"
    locked = [d for d in (lib, lib / "stubs") if d.is_dir() and not os.access(d, os.W_OK)]
    for d in locked:          # a complete entry is read-only: open it for this one file
        d.chmod(d.stat().st_mode | stat.S_IWUSR)
    try:
        build_libcuda_stub(lib / "stubs" / STUB_NAME, driver_api_names(cuda_h))
        return find_libcuda_stub([home])         # as stub_dirs() names it (lib64/stubs)
    finally:
        for d in [*locked, lib / "stubs"]:
            if d.is_dir():
                d.chmod(stat.S_IMODE(d.stat().st_mode) & ~0o222)


def stub_cached_toolkit(home: Path, arch: str) -> Path | None:
    """An entry built before the toolkit carried its stub gets one. The caller holds the entry's
    lease (a shared lock: it is not evicted meanwhile); the entry's exclusive lock would wait for
    every build using the toolkit, so the makers take the entry's own stub lock instead, and the
    file appears by one rename, complete, for the builds already reading the toolkit."""
    if find_libcuda_stub([home]) is not None or arch_of(arch) != host_arch():
        return find_libcuda_stub([home])
    with cachebudget.flocked(stub_lock(home)):
        if cachebudget.read_marker(home) is None:
            return None
        return ensure_libcuda_stub(home, arch)


def stub_lock(home: Path) -> Path:
    return cachebudget.lock_file(home).with_suffix(".stub.lock")


# ---------------------------------------------------------------- asking an nvcc

def nvcc_version(nvcc: Path) -> tuple[str, str] | None:
    """(line, full version) from `nvcc --version`, or None when it does not run."""
    try:
        proc = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = _RELEASE.search(proc.stdout)
    return (m.group(1), m.group(2)) if proc.returncode == 0 and m else None


def _nvcc_list(nvcc: Path, flag: str) -> tuple[str, ...]:
    proc = subprocess.run([str(nvcc), flag], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise ToolkitUnavailable(f"{nvcc} {flag} failed: {(proc.stderr or proc.stdout).strip()[:200]}")
    return tuple(proc.stdout.split())


def _inspect(home: Path, source: str, arch: str, components: tuple[str, ...], wheels=()) -> Toolkit:
    nvcc = home / "bin" / "nvcc"
    ver = nvcc_version(nvcc)
    if ver is None:
        raise ToolkitUnavailable(f"{nvcc} does not run (`nvcc --version` failed)")
    return Toolkit(home=home, version=ver[1], line=ver[0], source=source, arch=arch,
                   gpu_codes=_nvcc_list(nvcc, "--list-gpu-code"), gpu_archs=_nvcc_list(nvcc, "--list-gpu-arch"),
                   components=components, wheels=tuple(wheels))


# ---------------------------------------------------------------- installed toolkits

def system_candidates() -> list[Path]:
    found: list[Path] = []
    env_home = os.environ.get("FARM_CUDA_HOME")
    paths = [Path(env_home)] if env_home else []
    for pattern in SYSTEM_GLOBS:
        paths += sorted(Path("/").glob(pattern.lstrip("/")))
    for p in paths:
        if (p / "bin" / "nvcc").exists():
            real = p.resolve()
            if real not in [f.resolve() for f in found]:
                found.append(p)
    return found


def _has_component(home: Path, component: str) -> bool:
    headers = COMPONENT_HEADER.get(component)
    if headers is None:
        return True        # nothing known to look for
    return any((home / "include" / h).exists() for h in ((headers,) if isinstance(headers, str) else headers))


def find_system_toolkit(cuda: str, components: tuple[str, ...] = ()) -> tuple[Toolkit | None, list[str]]:
    """An installed toolkit on this CUDA line that has the components; plus why others were passed over."""
    line = _line(cuda)
    passed: list[str] = []
    for home in system_candidates():
        ver = nvcc_version(home / "bin" / "nvcc")
        if ver is None:
            passed.append(f"{home}: nvcc does not run")
            continue
        if ver[0] != line:
            passed.append(f"{home}: CUDA {ver[1]}")
            continue
        lacking = [c for c in components if not _has_component(home, c)]
        if lacking:
            passed.append(f"{home}: CUDA {ver[1]} without {', '.join(lacking)}")
            continue
        return _inspect(home, "image" if in_container() else "system", host_arch(), components), passed
    return None, passed


# ---------------------------------------------------------------- PyPI toolkits

def toolkit_requirement(cuda: str, components: tuple[str, ...] = ()) -> str:
    """`cuda-toolkit[nvcc,...]==13.0.*`: the meta-package pins every component of the line consistently."""
    extras = sorted(set(CORE_EXTRAS) | set(TORCH_HEADER_EXTRAS) | set(components))
    return f"cuda-toolkit[{','.join(extras)}]=={_line(cuda)}.*"


def _require_pypi_line(cuda: str) -> None:
    line = _line(cuda)
    if vtuple(line)[0] < 13:
        raise ToolkitUnavailable(
            f"CUDA {line}: no toolkit on this machine (no /usr/local/cuda* with nvcc {line}) and PyPI has no "
            f"nvcc for CUDA 12.x (nvidia-cuda-nvcc-cu12 ships no nvcc binary): build this cell in an image "
            f"with CUDA {line}, or install CUDA {line} under /usr/local/cuda-{line}")


def download_toolkit_wheels(cuda: str, platform: str = "linux", components: Iterable[str] = (), *,
                            log=None, root: Path | None = None) -> DownloadSet:
    """Host side: fetch the toolkit wheels for `platform` into the shared downloads cache (network)."""
    _require_pypi_line(cuda)
    comps = normalise_components(components)
    plat = "linux_aarch64" if arch_of(platform) == "aarch64" else "linux"
    # The wheels are py3-none-manylinux: any Python tag resolves them the same way.
    return download([toolkit_requirement(cuda, comps)], python="3.11", platform=plat, glibc="2.28",
                    index=Index(), log=log, root=root)


def _cached_toolkit_wheels(cuda, platform, comps, root) -> DownloadSet | None:
    plat = "linux_aarch64" if arch_of(platform) == "aarch64" else "linux"
    return find_manifest([toolkit_requirement(cuda, comps)], python="3.11", platform=plat, glibc="2.28",
                         index=Index(), root=root)


def _wheel_metadata(whl: Path) -> email.message.Message:
    with zipfile.ZipFile(whl) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(z.read(name).decode("utf-8"))


def _project(whl: Path) -> str:
    return whl.name.split("-")[0].lower().replace("_", "-")


def _extra_projects(meta_wheel: Path) -> dict[str, set[str]]:
    """cuda-toolkit's METADATA: extra -> the projects it pulls in."""
    out: dict[str, set[str]] = {}
    meta = _wheel_metadata(meta_wheel)
    for extra in meta.get_all("Provides-Extra") or []:
        out.setdefault(extra, set())
    for req in meta.get_all("Requires-Dist") or []:
        m = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", req)
        if m:
            proj = re.match(r"[A-Za-z0-9_.\-]+", req).group(0).lower().replace("_", "-")
            out.setdefault(m.group(1), set()).add(proj)
    return out


def _extract(whl: Path, dest: Path, headers_only: bool) -> list[str]:
    """Unpack nvidia/cu<N>/... of one wheel into dest/ (modes kept); dist-info goes to dest/dist-info/."""
    written = []
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            name = info.filename
            m = re.match(r"nvidia/cu\d+/(.+)", name)
            if m:
                rel = m.group(1)
                if headers_only and not rel.startswith("include/"):
                    continue
            elif ".dist-info/" in name:
                rel = "dist-info/" + name
            else:
                continue
            if name.endswith("/"):
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(target, mode if mode else 0o644)
            written.append(rel)
    return written


def _finish_layout(home: Path, arch: str) -> None:
    """lib64, unversioned .so links (libcudart.so -> libcudart.so.13), targets/<triple>/."""
    lib = home / "lib"
    lib.mkdir(exist_ok=True)
    if not (home / "lib64").exists():
        (home / "lib64").symlink_to("lib")
    for so in sorted(lib.glob("lib*.so.*")):
        m = re.match(r"(lib.+?\.so)\.\d+$", so.name)
        if m and not (lib / m.group(1)).exists():
            (lib / m.group(1)).symlink_to(so.name)
    triple = home / "targets" / TARGET_TRIPLE[arch]
    triple.mkdir(parents=True, exist_ok=True)
    for name, to in (("include", "../../include"), ("lib", "../../lib"), ("lib64", "../../lib")):
        if not (triple / name).exists():
            (triple / name).symlink_to(to)
    nvcc = home / "bin" / "nvcc"
    if not nvcc.exists():
        raise ToolkitUnavailable(f"the toolkit wheels left no bin/nvcc in {home}")
    for exe in [*(home / "bin").iterdir(), *(home / "nvvm" / "bin").glob("*")]:
        if exe.is_file() and exe.suffix not in (".profile", ".stub"):
            exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _build_prefix(home: Path, wheels: DownloadSet, arch: str, comps: tuple[str, ...]) -> dict:
    meta_wheel = wheels.file_for("cuda-toolkit")
    if meta_wheel is None:
        raise ToolkitUnavailable("the toolkit download has no cuda-toolkit meta-package wheel")
    extras = _extra_projects(meta_wheel)
    unknown = [c for c in comps if c not in extras]
    if unknown:
        known = ", ".join(sorted(e for e in extras if e != "all"))
        raise BadInput("recipe", "cuda_components", unknown[0],
                       f"not a component of {meta_wheel.name.split('-')[1]} (known: {known})")
    full = set().union(*(extras.get(e, set()) for e in (*CORE_EXTRAS, *comps)))
    t0 = time.monotonic()
    for whl in wheels.files:
        proj = _project(whl)
        if proj == "cuda-toolkit":
            continue
        _extract(whl, home, headers_only=proj not in full)
    _finish_layout(home, arch)
    ensure_libcuda_stub(home, arch)      # under acquire()'s exclusive lock, before the marker
    names = [w.name for w in wheels.files]
    if arch == host_arch():
        tk = _inspect(home, "pypi", arch, comps, wheels=names)
    else:
        # A foreign-arch nvcc runs only under emulation: record what the wheels say and ask
        # the real nvcc when the toolkit is used on its own arch (see provision_pypi_toolkit).
        nvcc_whl = wheels.file_for("nvidia-cuda-nvcc")
        version = nvcc_whl.name.split("-")[1] if nvcc_whl else "unknown"
        tk = Toolkit(home=home, version=version, line=".".join(version.split(".")[:2]), source="pypi",
                     arch=arch, gpu_codes=(), gpu_archs=(), components=comps, wheels=tuple(names))
    return {"toolkit": tk.to_json(), "unpack_seconds": round(time.monotonic() - t0, 1)}


def toolkit_dir(cuda: str, arch: str, comps: tuple[str, ...], root: Path | None = None) -> Path:
    name = f"{_line(cuda)}-{arch}" + ("".join(f"+{c}" for c in comps) if comps else "")
    return (root or cache_dir()) / "toolkits" / name


def provision_pypi_toolkit(cuda: str, arch: str = "x86_64", components: Iterable[str] = (), *,
                           allow_download: bool = True, log=None, root: Path | None = None) -> Toolkit:
    """The cached PyPI-wheel toolkit of `cuda` for `arch`, assembling it once (under a lock) when missing.

    The returned Toolkit's prefix stays leased (shared lock) for this process, so the cache
    budget never evicts it mid-build.
    """
    log = log or (lambda _m: None)
    arch = arch_of(arch)
    comps = normalise_components(components)
    _require_pypi_line(cuda)
    home = toolkit_dir(cuda, arch, comps, root)

    def build(entry: Path) -> dict:
        wheels = _cached_toolkit_wheels(cuda, arch, comps, root)
        if wheels is None:
            if not allow_download:
                raise ToolkitUnavailable(
                    f"CUDA {_line(cuda)} {arch} toolkit wheels are not downloaded; run "
                    f"farm.build.toolkit.download_toolkit_wheels({_line(cuda)!r}, {arch!r}) on the host first")
            wheels = download_toolkit_wheels(cuda, arch, comps, log=log, root=root)
        log(f"toolkit: assembling CUDA {_line(cuda)} {arch} from {len(wheels.files)} wheels into {entry}")
        with cachebudget.downloads_in_use(root):
            return _build_prefix(entry, wheels, arch, comps)

    t0 = time.monotonic()
    lease = cachebudget.acquire(home, build)
    _LEASES.append(lease)
    stub_cached_toolkit(home, arch)
    # The prefix is relocatable: trust where it is now (a container may mount the cache elsewhere).
    tk = replace(Toolkit.from_json(lease.info["toolkit"]), home=home)
    if not tk.gpu_codes and arch == host_arch():
        tk = _inspect(home, "pypi", arch, comps, wheels=tk.wheels)
    if tk.line != _line(cuda):
        raise ToolkitUnavailable(f"{home} holds CUDA {tk.version}, not {_line(cuda)}")
    log(f"toolkit: CUDA {tk.version} {arch} (pypi) at {home} "
        f"({'built' if lease.built else 'cache hit'} in {time.monotonic() - t0:.1f}s)")
    if lease.built:
        cachebudget.enforce_budget(root, log=log)
    return tk


_LEASES: list[cachebudget.Lease] = []


def installed_toolkit(cuda: str, arch: str, components: Iterable[str] = (),
                      source: str = "auto") -> tuple[Toolkit | None, list[str]]:
    """The installed toolkit provision_toolkit would pick for `source` (None: it takes PyPI's wheels or
    fails), with why each candidate was passed over. The host asks this before the offline steps, so
    it downloads the wheels exactly when the step will need them."""
    if source not in ("auto", "system", "image") or arch_of(arch) != host_arch():
        return None, []
    return find_system_toolkit(_line(cuda), normalise_components(components))


def provision_toolkit(cuda: str, arch: str = "x86_64", components: Iterable[str] = (), *,
                      source: str | None = None, allow_download: bool = True, log=None,
                      root: Path | None = None) -> Toolkit:
    """The toolkit a cell compiles with.

    source: auto (default; FARM_TOOLKIT_SOURCE) = an installed toolkit on the line when this
    machine runs the cell's arch, else NVIDIA's PyPI wheels (13.x); `system`/`image` = installed
    only; `pypi` = wheels only. A 12.x line with no installed toolkit fails with one line.
    """
    source = source or os.environ.get("FARM_TOOLKIT_SOURCE", "auto")
    if source not in ("auto", "pypi", "system", "image"):
        raise BadInput("environment", "FARM_TOOLKIT_SOURCE", source, "expected auto, pypi, system or image")
    arch = arch_of(arch)
    comps = normalise_components(components)
    line = _line(cuda)
    tk, passed = installed_toolkit(line, arch, comps, source)
    if tk is not None:
        if log:
            log(f"toolkit: CUDA {tk.version} ({tk.source}) at {tk.home}")
        return tk
    if source in ("system", "image"):
        why = "; ".join(passed) or "no /usr/local/cuda* with an nvcc"
        raise ToolkitUnavailable(f"CUDA {line}: no installed toolkit on this line for {arch} ({why})")
    return provision_pypi_toolkit(line, arch, comps, allow_download=allow_download, log=log, root=root)


def toolkit_record(tk: Toolkit) -> str:
    """One line for logs and build records."""
    return f"CUDA {tk.version} ({tk.source}, {tk.arch}) at {tk.home}"


def dumps(tk: Toolkit) -> str:
    return json.dumps(tk.to_json(), indent=1, sort_keys=True)
