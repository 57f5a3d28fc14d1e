"""The libcuda link stub the toolkit step adds to NVIDIA's PyPI toolkit (issue 15): `-lcuda` and
CMake's CUDA::cuda_driver link against it; the verify gate's needs_driver uses the same stub.

Real parts: the real cuda.h of the provisioned CUDA 13 toolkit, the C compiler, nm, flock
held by another process."""

from __future__ import annotations

import ctypes
import fnmatch
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from farm import cachebudget
from farm.build import libcudastub as S
from farm.build import provision as P
from farm.build import repair
from farm.build import toolkit as T
from farm.build.verify.importcheck import libcuda_stub_dir
from farm.platforms import host_arch


@pytest.fixture(scope="module")
def pypi_toolkit(tmp_path_factory):
    """CUDA 13.0 assembled from NVIDIA's wheels (the shared download cache) the way provisioning
    does, into a private cache entry: the shared one may be leased by running builds."""
    wheels = P._cached_toolkit_wheels("13.0", "x86_64", (), None) or P.download_toolkit_wheels("13.0", "x86_64")
    home = P.toolkit_dir("13.0", "x86_64", (), tmp_path_factory.mktemp("cache"))
    with cachebudget.acquire(home, lambda entry: P._build_prefix(entry, wheels, "x86_64", ())) as lease:
        yield T.Toolkit.from_json({**lease.info["toolkit"], "home": str(home)})


def exported(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def soname(lib: Path) -> str:
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    return next(line.split("[")[1].rstrip("]") for line in out.splitlines() if "(SONAME)" in line)


@pytest.mark.slow
def test_the_pypi_toolkit_has_a_libcuda_stub_that_links_and_says_no_device(pypi_toolkit, tmp_path):
    tk = pypi_toolkit
    stub = tk.home / "lib64" / "stubs" / "libcuda.so"
    assert stub.is_file() and (tk.home / "lib" / "stubs" / "libcuda.so").is_file()
    assert stub.parent in tk.stub_dirs()
    assert soname(stub) == "libcuda.so.1"
    names = exported(stub)
    declared = S.driver_api_names(tk.home / "include" / "cuda.h")
    assert {"cuInit", "cuTensorMapEncodeTiled", "cuCtxCreate_v4", "cuMemcpyHtoD_v2"} <= names
    assert set(declared) <= names and len(declared) > 500
    # A shared library and a program linking -lcuda against the stub directory, as a build does.
    (tmp_path / "use.c").write_text(
        "int cuInit(unsigned int); int cuTensorMapEncodeTiled(void);\n"
        "int farm_probe(void) { return cuInit(0) + 0 * cuTensorMapEncodeTiled(); }\n"
        "int main(void) { return farm_probe() == 100 ? 0 : 1; }\n")
    for what, flags, out in (("shared lib", ["-shared", "-fPIC"], "libuse.so"), ("program", [], "use")):
        proc = subprocess.run(["cc", *flags, str(tmp_path / "use.c"), "-o", str(tmp_path / out),
                               f"-L{stub.parent}", "-lcuda"], capture_output=True, text=True)
        assert proc.returncode == 0, f"{what}: {proc.stderr}"
    needed = subprocess.run(["readelf", "-d", str(tmp_path / "libuse.so")], capture_output=True, text=True).stdout
    assert "[libcuda.so.1]" in needed
    # Every call reports CUDA_ERROR_NO_DEVICE.
    lib = ctypes.CDLL(str(stub))
    assert lib.cuInit(0) == 100 and lib.cuTensorMapEncodeTiled() == 100
    # The stub is never shipped: repair keeps libcuda out of every wheel.
    assert any(fnmatch.fnmatch("libcuda.so.1", pat) for pat in repair.DRIVER_AND_RUNTIME)


def test_driver_api_names_follow_the_headers_defines(tmp_path):
    header = tmp_path / "cuda.h"
    header.write_text(
        "#define cuCtxCreate cuCtxCreate_v4\n"
        "#define cuMemcpyHtoD __CUDA_API_PTDS(cuMemcpyHtoD_v2)\n"
        "#define cuLaunchKernel __CUDA_API_PTSZ(cuLaunchKernel)\n"
        "#define cuNotDeclared cuNotDeclared_v9\n"
        "CUresult CUDAAPI cuInit(unsigned int Flags);\n"
        "CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);\n"
        "CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);\n"
        "CUresult CUDAAPI\ncuLaunchKernel(CUfunction f);\n"
        "/* CUDAAPI in prose is not a declaration */ int cuda_helper(void);\n")
    assert S.driver_api_names(header) == sorted([
        "cuInit", "cuCtxCreate", "cuCtxCreate_v4", "cuMemcpyHtoD", "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds",
        "cuLaunchKernel", "cuLaunchKernel_ptsz"])


def fake_complete_toolkit(root: Path, header: Path) -> Path:
    """A complete, read-only toolkit cache entry (the layout's parts the stub needs) built as the
    farm builds one, without a stub: what a cache made before the stub existed holds."""
    home = P.toolkit_dir("13.0", host_arch(), (), root)

    def build(entry: Path) -> dict:
        (entry / "include").mkdir()
        shutil.copyfile(header, entry / "include" / "cuda.h")
        (entry / "lib").mkdir()
        (entry / "lib64").symlink_to("lib")
        return {"toolkit": {}}

    cachebudget.acquire(home, build).close()
    assert S.find_libcuda_stub([home]) is None
    return home


HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_SH if sys.argv[2] == "shared" else fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[3]))
"""


def hold(lock: Path, how: str, seconds: float) -> subprocess.Popen:
    """Another process holding `lock` (flock) for `seconds`."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), how, str(seconds)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_cached_toolkit_gets_its_stub_once_under_its_lock_while_builds_use_it(tmp_path):
    header = tmp_path / "cuda.h"
    header.write_text("CUresult CUDAAPI cuInit(unsigned int);\nCUresult CUDAAPI cuTensorMapEncodeTiled(void);\n")
    home = fake_complete_toolkit(tmp_path / "cache", header)
    # A build holds the toolkit (its lease, for hours) and another process is making the stub:
    # this one waits for the maker only, then finds the stub made (here: makes it).
    user = hold(cachebudget.lock_file(home), "shared", 60)
    maker = hold(S.stub_lock(home), "exclusive", 1.5)
    try:
        t0 = time.monotonic()
        stub = S.stub_cached_toolkit(home, host_arch())
        waited = time.monotonic() - t0
    finally:
        for p in (user, maker):
            p.kill()
            p.wait()
    assert 1.0 < waited < 30, waited
    assert stub == home / "lib64" / "stubs" / "libcuda.so" and S.find_libcuda_stub([home]) == stub
    assert soname(stub) == "libcuda.so.1" and exported(stub) >= {"cuInit", "cuTensorMapEncodeTiled"}
    assert sorted(p.name for p in stub.parent.iterdir()) == ["libcuda.so"]      # no temp files left
    assert (home / "lib").stat().st_mode & 0o222 == 0 and stub.parent.stat().st_mode & 0o222 == 0
    # Once: a second call keeps the same file.
    inode = stub.stat().st_ino
    assert S.stub_cached_toolkit(home, host_arch()) == stub and stub.stat().st_ino == inode


def test_two_processes_adding_the_stub_at_once_leave_one_whole_stub(tmp_path):
    header = tmp_path / "cuda.h"
    header.write_text("".join(f"CUresult CUDAAPI cuFn{i}(void);\n" for i in range(3000)))
    home = fake_complete_toolkit(tmp_path / "cache", header)
    code = "import sys; from farm.platforms import host_arch; from farm.build import libcudastub as S; S.stub_cached_toolkit(__import__('pathlib').Path(sys.argv[1]), host_arch())"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(home)], stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    stub = home / "lib" / "stubs" / "libcuda.so"
    assert sorted(p.name for p in stub.parent.iterdir()) == ["libcuda.so"]
    assert len(exported(stub)) == 3000


def test_verify_needs_driver_finds_the_toolkits_stub_first(tmp_path, monkeypatch):
    header = tmp_path / "cuda.h"
    header.write_text("CUresult CUDAAPI cuInit(unsigned int);\n")
    monkeypatch.setenv("FARM_CACHE", str(tmp_path / "cache"))
    home = fake_complete_toolkit(tmp_path / "cache", header)
    S.stub_cached_toolkit(home, host_arch())
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    if S.find_libcuda_stub([Path("/usr/local/cuda")]) is not None:
        pytest.skip("an installed /usr/local/cuda stub comes before the farm's toolkits")

    def not_read():
        raise AssertionError("the wheel's symbols were read: a second stub was made")

    wheel = types.SimpleNamespace(workdir=tmp_path / "w", elf_binaries=not_read)
    wheel.workdir.mkdir()
    d = libcuda_stub_dir(wheel)
    assert (d / "libcuda.so.1").resolve() == (home / "lib" / "stubs" / "libcuda.so").resolve()
