"""Step 3, the toolkit: CUDA 13 from NVIDIA's PyPI wheels, installed toolkits, and what nvcc can emit.

The PyPI toolkit is real (downloaded once into the shared cache, then a cache hit);
every nvcc here is the real one.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from farm.archlist import ArchList
from farm.build import provision as P
from farm.build import toolkit as T
from farm.errors import BadInput, ToolkitCannotEmit, ToolkitUnavailable


@pytest.fixture(scope="module")
def pypi_toolkit():
    return P.provision_toolkit("13.0", "x86_64", source="pypi")


@pytest.mark.slow
def test_pypi_toolkit_has_the_layout_torch_cpp_extension_expects(pypi_toolkit):
    tk = pypi_toolkit
    home = tk.home
    assert tk.source == "pypi" and tk.line == "13.0" and tk.version.startswith("13.0.")
    for rel in ("bin/nvcc", "bin/ptxas", "bin/fatbinary", "nvvm/bin/cicc", "nvvm/libdevice/libdevice.10.bc"):
        assert os.access(home / rel, os.X_OK if "bin/" in rel else os.R_OK), rel
    # The headers torch's ATen/cuda/CUDAContext.h pulls in, and the runtime/CCCL headers.
    for header in ("cuda_runtime.h", "crt/host_defines.h", "cusparse.h", "cublas_v2.h", "cusolverDn.h",
                   "cccl/cuda/std/version"):
        assert (home / "include" / header).is_file(), header
    lib = home / "lib64"
    assert (lib / "libcudart.so").is_symlink() and os.readlink(lib / "libcudart.so") == "libcudart.so.13"
    assert (lib / "libcudart.so").resolve().is_file()
    # cuBLAS & co. are headers-only by default: their libraries come from torch's environment.
    assert not list(lib.glob("libcublasLt.so*"))
    assert (home / "targets" / "x86_64-linux" / "include" / "cuda_runtime.h").is_file()
    # It is immutable once complete.
    assert not os.access(home / "bin" / "nvcc", os.W_OK) or os.geteuid() == 0
    assert (home / "bin" / "nvcc").stat().st_mode & 0o222 == 0


@pytest.mark.slow
def test_pypi_nvcc_compiles_and_reports_the_arches_it_can_emit(pypi_toolkit, tmp_path):
    tk = pypi_toolkit
    assert {"sm_75", "sm_90", "sm_100", "sm_120"} <= set(tk.gpu_codes)
    assert "sm_70" not in tk.gpu_codes           # CUDA 13 dropped Volta
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n")
    proc = subprocess.run([str(tk.nvcc), "-c", str(src), "-o", str(tmp_path / "k.o"), "-gencode",
                           "arch=compute_120,code=sm_120"], capture_output=True, text=True,
                          env={**os.environ, **tk.env()})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "k.o").stat().st_size > 0


@pytest.mark.slow
def test_second_provision_is_a_cache_hit(pypi_toolkit):
    t0 = time.monotonic()
    again = P.provision_toolkit("13.0", "x86_64", source="pypi")
    assert time.monotonic() - t0 < 2.0
    assert again.home == pypi_toolkit.home and again.version == pypi_toolkit.version


@pytest.mark.slow
def test_an_arch_the_nvcc_cannot_emit_fails_naming_every_missing_one(pypi_toolkit):
    tk = pypi_toolkit
    tk.require(ArchList.parse("7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX"))
    tk.require(ArchList.parse("9.0a 10.0f 12.0a"))        # arch-/family-specific, probed with --dryrun
    with pytest.raises(ToolkitCannotEmit) as err:
        tk.require(ArchList.parse("7.0 8.0 8.9a 10.1 12.0+PTX"), cell="demo-cu130-torch2.13-py311")
    msg = str(err.value)
    assert "\n" not in msg
    for gone in ("sm_70", "sm_89a", "sm_101"):
        assert gone in msg
    assert "sm_80 " not in msg.split("(it emits")[0]


def test_cuda_12_line_without_a_toolkit_fails_with_one_clear_line():
    tk, _ = T.find_system_toolkit("12.8")
    if tk is not None:
        pytest.skip(f"this machine has a CUDA 12.8 toolkit at {tk.home}")
    with pytest.raises(ToolkitUnavailable) as err:
        P.provision_toolkit("12.8", "x86_64")
    msg = str(err.value)
    assert "\n" not in msg and "CUDA 12.8" in msg and "PyPI has no nvcc for CUDA 12.x" in msg
    with pytest.raises(ToolkitUnavailable):
        P.download_toolkit_wheels("12.8", "linux")


def test_an_installed_toolkit_on_the_line_is_used_with_an_explicit_home():
    tk, passed = T.find_system_toolkit("13.0")
    if tk is None:
        pytest.skip(f"no installed CUDA 13.0 toolkit here ({passed})")
    chosen = P.provision_toolkit("13.0", "x86_64", source="system")
    assert chosen.source in ("system", "image") and chosen.line == "13.0"
    assert chosen.env()["CUDA_HOME"] == str(chosen.home) and chosen.nvcc.exists()
    with pytest.raises(ToolkitUnavailable) as err:
        P.provision_toolkit("13.2", "x86_64", source="system")
    assert "13.2" in str(err.value)


@pytest.mark.slow
def test_an_unknown_cuda_component_is_refused_by_name(pypi_toolkit, tmp_path):
    wheels = P._cached_toolkit_wheels("13.0", "x86_64", (), None)
    assert wheels is not None
    with pytest.raises(BadInput) as err:
        P._build_prefix(tmp_path / "tk", wheels, "x86_64", ("curandd",))
    assert "cuda_components" in str(err.value) and "curandd" in str(err.value) and "curand" in str(err.value)
    assert not (tmp_path / "tk").exists()


def test_the_layout_links_every_versioned_library_to_its_unversioned_name(tmp_path):
    from farm.build.provision import _finish_layout

    home = tmp_path / "tk"
    (home / "lib").mkdir(parents=True)
    (home / "bin").mkdir()
    (home / "bin" / "nvcc").write_text("")
    for name in ("libcudart.so.13", "libnvrtc.so.13", "libnvrtc-builtins.so.13.0", "libnvrtc-builtins.alt.so.13.0"):
        (home / "lib" / name).write_text("")
    _finish_layout(home, "x86_64")
    links = {p.name: p.readlink().name for p in (home / "lib").iterdir() if p.is_symlink()}
    # -lnvrtc-builtins (cumm's link line) finds only libnvrtc-builtins.so
    assert links == {"libcudart.so": "libcudart.so.13", "libnvrtc.so": "libnvrtc.so.13",
                     "libnvrtc-builtins.so": "libnvrtc-builtins.so.13.0",
                     "libnvrtc-builtins.alt.so": "libnvrtc-builtins.alt.so.13.0"}


def test_toolkit_requirement_pins_the_line_through_the_meta_package():
    req = P.toolkit_requirement("13.0", ("curand", "nvtx"))
    assert req.startswith("cuda-toolkit[") and req.endswith("]==13.0.*")
    extras = req[len("cuda-toolkit["):req.index("]")].split(",")
    assert {"nvcc", "crt", "nvvm", "cccl", "cudart", "cublas", "cusparse", "cusolver", "curand", "nvtx"} == set(extras)
    with pytest.raises(BadInput):
        T.normalise_components(["cu rand"])


@pytest.mark.slow
def test_the_pypi_prefix_works_where_the_cache_is_mounted(pypi_toolkit, tmp_path, monkeypatch):
    # A container sees the same cache under another path: the toolkit must answer from there.
    mounted = tmp_path / "mnt"
    mounted.symlink_to(pypi_toolkit.home.parent.parent)
    monkeypatch.setenv("FARM_CACHE", str(mounted))
    tk = P.provision_toolkit("13.0", "x86_64", source="pypi", allow_download=False)
    assert tk.home == mounted / "toolkits" / pypi_toolkit.home.name
    assert T.nvcc_version(tk.nvcc) == ("13.0", pypi_toolkit.version)
