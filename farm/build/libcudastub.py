"""The libcuda.so link stub: NVIDIA's toolkit wheels carry none, so `-lcuda` and CMake's
CUDA::cuda_driver need one made from `cuda.h`; the verify gate's fallback uses the same maker.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from farm import cachebudget
from farm.build.toolkit import arch_of
from farm.errors import ToolkitUnavailable
from farm.platforms import host_arch
from farm.process import last_line, run

# cuda.h: `CUresult CUDAAPI cuInit(unsigned int Flags);` and `#define cuCtxCreate cuCtxCreate_v4`
# or `#define cuMemcpyHtoD __CUDA_API_PTDS(cuMemcpyHtoD_v2)` (the per-thread-stream variant).
_DRIVER_DECL = re.compile(r"\bCUDAAPI\s+(cu\w+)\s*\(")
_DRIVER_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(cu\w+)[ \t]+(?:__CUDA_API_PT(DS|SZ)\([ \t]*)?(cu\w+)",
                            re.MULTILINE)
CUDA_ERROR_NO_DEVICE = 100
STUB_NAME, STUB_SONAME = "libcuda.so", "libcuda.so.1"


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
        run([cc, "-shared", "-fPIC", "-O0", "-g0", f"-Wl,-soname,{STUB_SONAME}", "-o", made, src],
            error=ToolkitUnavailable, what="making the libcuda link stub failed",
            explain=lambda stderr: last_line(stderr, limit=200))
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
