"""The CUDA toolkit of a cell (design.md §6.3).

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
  farm/build/libcudastub.py). Built once under a lock, read-only afterwards
  (farm/build/provision.py).
PyPI has no nvcc for CUDA 12.x, so a 12.x cell needs an image or system toolkit.

The chosen nvcc is asked what it can emit (`--list-gpu-code`, `--list-gpu-arch`,
and a `--dryrun` probe for arch-/family-specific tokens); a token it cannot
emit fails the cell by name, never silently dropped.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePath
from typing import Any, Protocol

from farm import settings
from farm.archlist import ArchList, ArchToken
from farm.errors import BadInput, FarmError, ToolkitCannotEmit, ToolkitUnavailable
from farm.platforms import host_arch
from farm.process import TimeoutExpired, run
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
# What `nvcc --version` says of its line and version: 'release 13.0, V13.0.88'.
NVCC_RELEASE = re.compile(r"release (\d+\.\d+), V(\d+(?:\.\d+)+)")


def arch_of(platform_or_arch: str) -> str:
    """'linux' / 'x86_64' -> 'x86_64'; 'linux_aarch64' / 'aarch64' / 'arm64' -> 'aarch64'."""
    p = platform_or_arch
    if p in ("linux", "x86_64", "amd64"):
        return "x86_64"
    if p in ("linux_aarch64", "aarch64", "arm64", "sbsa"):
        return "aarch64"
    raise FarmError(f"no Linux CUDA toolkit for platform {p!r}")


def in_container() -> bool:
    """Set by the container runner: this machine may itself be a container, so no file probes."""
    return settings.IN_CONTAINER.get() == "1"


def cuda_line(cuda: str, where: str = "cell") -> str:
    """'13.0.2' -> '13.0'; anything else is one line naming `where`."""
    try:
        major, minor = vtuple(cuda)[:2]
    except ValueError:
        raise BadInput(where, "cuda", cuda, "not a CUDA version like 13.0") from None
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


class BuildToolkit(Protocol):
    """A cell's toolkit as the steps use it: `Toolkit` below (Linux), or farm.build.windows.WindowsToolkit
    (an installed Windows toolkit, whose paths are Windows paths whatever machine reads them)."""

    @property
    def home(self) -> PurePath | str: ...
    @property
    def line(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def nvcc(self) -> PurePath | str: ...
    @property
    def bin_dir(self) -> PurePath | str: ...
    @property
    def lib_dir(self) -> PurePath | str: ...
    def stub_dirs(self) -> Sequence[PurePath | str]: ...
    def env(self) -> dict[str, str]: ...
    def require(self, arch_list: ArchList, cell: str = "") -> None: ...
    def to_json(self) -> dict[str, Any]: ...


def unemittable(arch_list: ArchList, gpu_codes: Sequence[str], gpu_archs: Sequence[str],
                probe: Callable[[ArchToken], bool]) -> list[str]:
    """The tokens of `arch_list` an nvcc that lists these codes cannot emit, spelled as nvcc would (sm_89a,
    compute_90); `probe` asks it about an arch- or family-specific token, which --list-gpu-code leaves out."""
    out = []
    for t in arch_list:
        sm = f"sm_{t.sm}"
        if sm not in gpu_codes:
            out.append(f"{sm}{t.variant}")
            continue
        if t.variant and not probe(t):
            out.append(f"{sm}{t.variant}")
        if t.ptx and f"compute_{t.sm}" not in gpu_archs:
            out.append(f"compute_{t.sm}")
    return out


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
    def bin_dir(self) -> Path:
        return self.home / "bin"

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
        return unemittable(arch_list, self.gpu_codes, self.gpu_archs, self._probe)

    def _probe(self, t: ArchToken) -> bool:
        """Arch-/family-specific targets are not listed by --list-gpu-code: ask nvcc to plan one."""
        code = f"{t.sm}{t.variant}"
        proc = run([self.nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull,
                    f"-gencode=arch=compute_{code},code=sm_{code}"])
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

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["home"] = str(self.home)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Toolkit:
        d = dict(d)
        d["home"] = Path(d["home"])
        for k in ("gpu_codes", "gpu_archs", "components", "wheels"):
            d[k] = tuple(d.get(k, ()))
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


# ---------------------------------------------------------------- asking an nvcc

def nvcc_version(nvcc: Path) -> tuple[str, str] | None:
    """(line, full version) from `nvcc --version`, or None when it does not run."""
    try:
        proc = run([nvcc, "--version"], timeout=60)
    except (OSError, TimeoutExpired):
        return None
    m = NVCC_RELEASE.search(proc.stdout)
    return (m.group(1), m.group(2)) if proc.returncode == 0 and m else None


def _nvcc_list(nvcc: Path, flag: str) -> tuple[str, ...]:
    proc = run([nvcc, flag], timeout=60)
    if proc.returncode != 0:
        raise ToolkitUnavailable(f"{nvcc} {flag} failed: {(proc.stderr or proc.stdout).strip()[:200]}")
    return tuple(proc.stdout.split())


def inspect_toolkit(home: Path, source: str, arch: str, components: tuple[str, ...], wheels: Iterable[str] = ()) -> Toolkit:
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
    env_home = settings.CUDA_HOME.get()
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
    line = cuda_line(cuda)
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
        return inspect_toolkit(home, "image" if in_container() else "system", host_arch(), components), passed
    return None, passed


def toolkit_record(tk: Toolkit) -> str:
    """One line for logs and build records."""
    return f"CUDA {tk.version} ({tk.source}, {tk.arch}) at {tk.home}"


def dumps(tk: Toolkit) -> str:
    return json.dumps(tk.to_json(), indent=1, sort_keys=True)
