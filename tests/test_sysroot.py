"""The builder image's host compiler (design.md §6.4, §8.3): bullseye's gcc 10 on a glibc 2.31 sysroot
inside the bookworm image, reaching manylinux_2_31 or lower; and the one place that hands it to
setuptools, torch, nvcc and CMake (farm/runners/hostcompiler.py).

The container tests compile real code with the image's wrappers and a real nvcc (NVIDIA's PyPI CUDA
13.0 wheels) and read the symbol versions the shared objects need with pyelftools.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from farm.archlist import ArchList
from farm.build.buildkey import context_for
from farm.build.compile import compile_environment
from farm.errors import BadInput
from farm.platforms import host_arch, plat_glibc
from farm.runners import hostcompiler, images
from farm.runners.engine import Mount, ensure_engine

TOOLCHAIN = {"bin": "/opt/farm-toolchain/bin", "sysroot": "/opt/farm-sysroot", "gcc": "10.2.1", "glibc": "2.31"}
GLIBC_2_31, GLIBCXX_3_4_28 = (2, 31), (3, 4, 28)


def needed_versions(so: Path) -> dict[str, tuple[int, ...]]:
    """The highest version of each versioned dependency (GLIBC, GLIBCXX, CXXABI, GCC) an ELF file needs."""
    top: dict[str, tuple[int, ...]] = {}
    with open(so, "rb") as fh:
        for section in ELFFile(fh).iter_sections():
            if section.name != ".gnu.version_r":
                continue
            for _, auxes in section.iter_versions():
                for aux in auxes:
                    m = re.fullmatch(r"([A-Z]+)_(\d+(?:\.\d+)*)", aux.name)
                    if m:
                        v = tuple(int(x) for x in m.group(2).split("."))
                        top[m.group(1)] = max(top.get(m.group(1), v), v)
    return top


def exported_symbols(so: Path) -> set[str]:
    """The names an ELF file defines in its dynamic symbol table."""
    with open(so, "rb") as fh:
        return {s.name for s in ELFFile(fh).get_section_by_name(".dynsym").iter_symbols()
                if s["st_shndx"] != "SHN_UNDEF"}


# ----- no engine needed ---------------------------------------------------------------


def test_absolute_links_in_the_sysroot_become_relative_and_stay_inside_it(tmp_path):
    root = tmp_path / "farm-sysroot"
    (root / "lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "lib/x86_64-linux-gnu/ld-2.31.so").write_text("loader")
    (root / "lib64").mkdir()
    (root / "lib64/ld-linux-x86-64.so.2").symlink_to("/lib/x86_64-linux-gnu/ld-2.31.so")
    (root / "lib/x86_64-linux-gnu/ld.so").symlink_to("ld-2.31.so")            # relative already: kept
    (root / "libdir").symlink_to("/lib/x86_64-linux-gnu")                      # a link to a folder too

    assert images.relative_links(root) == 2
    loader = root / "lib64/ld-linux-x86-64.so.2"
    assert os.readlink(loader) == "../lib/x86_64-linux-gnu/ld-2.31.so"
    assert loader.read_text() == "loader"          # resolves inside the root, wherever it is mounted
    assert os.readlink(root / "lib/x86_64-linux-gnu/ld.so") == "ld-2.31.so"
    assert os.readlink(root / "libdir") == "lib/x86_64-linux-gnu"


def test_the_toolchain_is_every_compiler_driver_of_a_build(tmp_path):
    facts = tmp_path / "farm-image.json"
    facts.write_text(json.dumps({"glibc": "2.36", "toolchain": TOOLCHAIN}))
    env = hostcompiler.step_env({}, facts)
    assert env == {"CC": "/opt/farm-toolchain/bin/gcc", "CXX": "/opt/farm-toolchain/bin/g++",
                   "CUDAHOSTCXX": "/opt/farm-toolchain/bin/g++", "NVCC_CCBIN": "/opt/farm-toolchain/bin"}
    # the image's own gcc on request, and nothing where the image names no toolchain (manylinux, host)
    assert hostcompiler.step_env({"FARM_HOST_COMPILER": "image"}, facts) == {}
    facts.write_text(json.dumps({"glibc": "2.28"}))
    assert hostcompiler.step_env({}, facts) == {}
    assert hostcompiler.step_env({}, tmp_path / "absent.json") == {}


def test_a_bad_host_compiler_setting_is_refused_in_one_line(tmp_path):
    with pytest.raises(BadInput) as exc:
        hostcompiler.choice({"FARM_HOST_COMPILER": "clang"})
    assert str(exc.value) == "environment: FARM_HOST_COMPILER: 'clang': must be one of toolchain, image"
    assert exc.value.exit_code == 2


def test_compile_environment_takes_the_toolchain_over_the_caller_and_the_recipe_over_both(tmp_path):
    class Toolkit:   # only what compile_environment reads
        line, bin_dir, lib_dir, home = "13.0", tmp_path / "bin", tmp_path / "lib", tmp_path

        def stub_dirs(self):
            return []

        def env(self):
            return {"CUDA_HOME": str(tmp_path)}

    tc = hostcompiler.compiler_env(TOOLCHAIN)
    env = compile_environment(arch_list=ArchList.parse("8.0"), toolkit=Toolkit(), base={"CC": "gcc-12"},
                              host_compiler=tc, recipe_env={"CUDAHOSTCXX": "/usr/bin/g++"})
    assert env["CC"] == tc["CC"] and env["CXX"] == tc["CXX"] and env["NVCC_CCBIN"] == tc["NVCC_CCBIN"]
    assert env["CUDAHOSTCXX"] == "/usr/bin/g++"


def test_the_image_compiler_is_keyed_apart_and_the_default_key_is_unchanged(monkeypatch):
    monkeypatch.delenv("FARM_HOST_COMPILER", raising=False)
    default = context_for("linux", "container")
    assert "compiler" not in default.as_dict()   # keys made before the choice existed stay valid
    monkeypatch.setenv("FARM_HOST_COMPILER", "image")
    own = context_for("linux", "container")
    assert own.as_dict() == {**default.as_dict(), "compiler": "image"}


def test_the_sysroot_enters_the_base_and_builder_keys(monkeypatch):
    base, builder = images.base_ref("x86_64"), images.builder_key("x86_64", images.base_ref("x86_64"))
    assert base.startswith(images.debian_ref("x86_64") + "-bullseye-")
    monkeypatch.setattr(images, "SYSROOT_PACKAGES", (*images.SYSROOT_PACKAGES, "libgomp1"))
    assert images.base_ref("x86_64") != base
    assert images.builder_key("x86_64", images.base_ref("x86_64")) != builder


def test_the_floor_files_enter_the_builder_key(monkeypatch, tmp_path):
    builder = images.builder_key("x86_64", images.base_ref("x86_64"))
    edited = tmp_path / "glibc-floor.h"
    edited.write_bytes(images.LIBM_FLOOR.read_bytes() + b"/* edited */\n")
    monkeypatch.setattr(images, "LIBM_FLOOR", edited)
    assert images.builder_key("x86_64", images.base_ref("x86_64")) != builder


# ----- the real image ------------------------------------------------------------------

# pthread_key_create moved into libc in glibc 2.34 (GLIBC_2.34 there, GLIBC_2.2.5 in bullseye's
# libpthread): bound against the image's own libc, it gives the demo's manylinux_2_34 back.
CPP = r"""
#include <mutex>
#include <pthread.h>
#include <string>
#include <thread>
#include <vector>
#include <Python.h>
static std::once_flag once;
extern "C" int farm_join(int n) {
    std::vector<std::string> parts;
    pthread_key_t key;
    if (pthread_key_create(&key, nullptr) != 0) return -1;
    std::call_once(once, [] {});
    std::thread t([&] { for (int i = 0; i < n; ++i) parts.push_back(std::to_string(i)); });
    t.join();
    std::string all;
    for (auto &p : parts) all += p;
    return (int)all.size() + (Py_IsInitialized() ? 1 : 0);
}
"""

CU = r"""
#include <string>
#include <vector>
__global__ void scale(float *x, float a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }
std::vector<std::string> names() { return {"scale"}; }
void launch(float *x, int n) { scale<<<(n + 255) / 256, 256>>>(x, 2.0f, n); }
"""


@pytest.fixture(scope="module")
def image():
    return images.ensure_builder(host_arch(), ensure_engine(), quiet=True)


@pytest.mark.slow
@pytest.mark.container
def test_the_image_records_its_toolchain_and_a_tag_of_manylinux_2_31_or_lower(image):
    assert image.toolchain["bin"] == "/opt/farm-toolchain/bin" and image.toolchain["glibc"] == "2.31"
    assert image.toolchain["gcc"].startswith("10.")
    assert plat_glibc(image.plat) <= GLIBC_2_31   # the probe, compiled by the toolchain, says so
    assert image.describe()["toolchain"] == image.toolchain


@pytest.mark.slow
@pytest.mark.container
def test_the_toolchain_compiles_cpp_and_cuda_that_need_nothing_past_glibc_2_31(image, tmp_path):
    """g++ (with the image's Python headers) and nvcc -ccbin the wrapper folder, as a build uses them."""
    from farm.build.provision import provision_toolkit

    toolkit = provision_toolkit("13.0", host_arch(), source="pypi")
    (tmp_path / "ext.cpp").write_text(CPP)
    (tmp_path / "kernel.cu").write_text(CU)
    tc = image.toolchain["bin"]
    script = " && ".join([
        # -L/usr/lib/<triplet>: what Debian's Python hands setuptools; the image's own libc.so there must not
        # win over the sysroot's (std::call_once would bind pthread_once@GLIBC_2.34)
        f"{tc}/g++ -std=c++20 -O2 -shared -fPIC -pthread -I/usr/include/python3.11 -L/usr/lib/$({tc}/gcc "
        "-dumpmachine) -o /t/ext.so /t/ext.cpp",
        # compiled by nvcc, linked by the C++ driver: how torch's ninja builds an extension
        f"{toolkit.nvcc} -ccbin {tc} -std=c++20 -gencode arch=compute_80,code=sm_80 -Xcompiler -fPIC "
        "-c -o /t/kernel.o /t/kernel.cu",
        f"{tc}/g++ -shared -o /t/kernel.so /t/kernel.o",
    ])
    engine = ensure_engine()
    engine.output(image.ref, ["sh", "-c", script], network=False,
                  mounts=[Mount(tmp_path, "/t"), Mount(toolkit.home, str(toolkit.home), read_only=True)])
    for so in (tmp_path / "ext.so", tmp_path / "kernel.so"):
        need = needed_versions(so)
        assert need["GLIBC"] <= GLIBC_2_31, (so.name, need)
        assert need.get("GLIBCXX", (3, 4)) <= GLIBCXX_3_4_28, (so.name, need)
    # the C++ file really bound libstdc++ (std::thread, std::string): the check above read something
    assert "GLIBCXX" in needed_versions(tmp_path / "ext.so")


# gcc 9 and 10 defined these in the headers and exported them from libstdc++ at GLIBCXX_3.4.26: at -O0
# every caller binds the library's copy (cumm's core_cc bound the first one and missed torch's floor).
FLOOR_CPP = r"""
#include <sstream>
#include <string>
#include <string_view>
extern "C" int farm_floor(int x) {
    std::stringstream io; std::ostringstream out; std::istringstream in; std::stringbuf buf;
    std::string s = "abc"; char *p = s.data(); std::string_view view = s; std::string copy(view);
    io << x * 2; out << nullptr << p << copy << io.str();
    return (int)out.str().size();
}
"""


@pytest.mark.slow
@pytest.mark.container
@pytest.mark.parametrize("abi", [1, 0], ids=["cxx11-abi", "old-abi"])
def test_members_gcc_9_and_10_added_to_libstdcxx_are_linked_locally_below_torchs_floor(image, tmp_path, abi):
    """The toolchain links its floor shim (docker/libstdcxx-floor.cpp) ahead of libstdc++: the same code
    linked by the sysroot's bare g++ needs GLIBCXX_3.4.26, through the wrapper no more than 3.4.24
    (manylinux_2_28), exports none of the shim's code, and runs."""
    (tmp_path / "floor.cpp").write_text(FLOOR_CPP)
    tc, sysroot = image.toolchain["bin"], image.toolchain["sysroot"]
    flags = f"-std=c++17 -O0 -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI={abi} /t/floor.cpp"
    bare = f"$(ls {sysroot}/usr/bin/g++-[0-9]* | head -n 1) --sysroot={sysroot}"
    probe = 'import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).farm_floor(21))'
    # A build that names libstdc++ itself (setup.py's extra_link_args=["-lstdc++"], ahead of the shim
    # were the shim only appended) gets the same floor.
    out = ensure_engine().output(image.ref, ["sh", "-c", " && ".join([
        f"{bare} {flags} -o /t/bare.so", f"{tc}/g++ {flags} -o /t/floor.so",
        f"{tc}/g++ -std=c++17 -O0 -shared -fPIC -D_GLIBCXX_USE_CXX11_ABI={abi} -lstdc++ /t/floor.cpp -lstdc++ "
        "-o /t/explicit.so", f"python3 -c '{probe}' /t/floor.so"])], network=False, mounts=[Mount(tmp_path, "/t")])
    assert needed_versions(tmp_path / "bare.so")["GLIBCXX"] == (3, 4, 26)   # what the shim has to undo
    assert needed_versions(tmp_path / "floor.so")["GLIBCXX"] <= (3, 4, 24)
    assert needed_versions(tmp_path / "explicit.so")["GLIBCXX"] <= (3, 4, 24)
    # the shim's members stay inside the extension: it exports nothing the bare link did not
    shim_members = {"_ZNSt7__cxx1118basic_stringstreamIcSt11char_traitsIcESaIcEEC1Ev",
                    "_ZNSt18basic_stringstreamIcSt11char_traitsIcESaIcEEC1Ev"}
    assert not exported_symbols(tmp_path / "floor.so") - exported_symbols(tmp_path / "bare.so")
    assert not shim_members & exported_symbols(tmp_path / "floor.so")
    assert out.split()[-1] == "15"   # "nullptr" + "abc" + "abc" + "42"


def bound_versions(so: Path) -> dict[str, str]:
    """The version each undefined dynamic symbol of an ELF file is bound at ("exp" -> "GLIBC_2.29")."""
    with open(so, "rb") as fh:
        elf = ELFFile(fh)
        names = {aux["vna_other"]: aux.name
                 for _, auxes in elf.get_section_by_name(".gnu.version_r").iter_versions() for aux in auxes}
        versym = elf.get_section_by_name(".gnu.version")
        return {sym.name: names.get(versym.get_symbol(i)["ndx"], "")
                for i, sym in enumerate(elf.get_section_by_name(".dynsym").iter_symbols())
                if sym.name and sym["st_shndx"] == "SHN_UNDEF"}


LIBM_FUNCTIONS = ("exp", "exp2", "log", "log2", "pow", "expf", "exp2f", "logf", "log2f", "powf")
LIBM_C = r"""
#include <math.h>
#ifdef __cplusplus
extern "C"
#endif
double farm_libm(double x) {
    float f = (float)x;
    return exp(x) + exp2(x) + log(x) + log2(x) + pow(x, x) + expf(f) + exp2f(f) + logf(f) + log2f(f) + powf(f, f);
}
"""
LIBM_CU = r"""
#include <math.h>
__global__ void scale(float *x) { x[threadIdx.x] = expf(x[threadIdx.x]); }
extern "C" double farm_host(double x) { return exp(x) + log(x) + powf((float)x, 1.5f); }
"""


@pytest.mark.slow
@pytest.mark.container
def test_libm_calls_bind_their_first_glibc_versions_through_the_toolchain(image, tmp_path):
    """glibc 2.27 and 2.29 re-versioned exp, log, pow and kin: the sysroot's bare gcc binds those versions
    (above torch's manylinux_2_28; pyg_lib's METIS code did), the toolchain's wrappers bind the first ones
    (docker/glibc-floor.h) for C, C++ and nvcc's host code alike, and the results are the same."""
    from farm.build.provision import provision_toolkit

    toolkit = provision_toolkit("13.0", host_arch(), source="pypi")
    (tmp_path / "libm.c").write_text(LIBM_C)
    (tmp_path / "host.cu").write_text(LIBM_CU)
    tc, sysroot = image.toolchain["bin"], image.toolchain["sysroot"]
    bare = f"$(ls {sysroot}/usr/bin/gcc-[0-9]* | head -n 1) --sysroot={sysroot}"
    probe = 'import ctypes, sys; f = ctypes.CDLL(sys.argv[1]).farm_libm; f.restype = ctypes.c_double; print(repr(f(ctypes.c_double(3.0))))'
    out = ensure_engine().output(image.ref, ["sh", "-c", " && ".join([
        f"{bare} -O2 -shared -fPIC /t/libm.c -o /t/bare.so -lm",
        f"{tc}/gcc -O2 -shared -fPIC /t/libm.c -o /t/c.so -lm",                     # compile and link at once
        f"{tc}/g++ -O2 -fPIC -x c++ -c /t/libm.c -o /t/cxx.o", f"{tc}/g++ -shared /t/cxx.o -o /t/cxx.so",
        f"{toolkit.nvcc} -ccbin {tc} -gencode arch=compute_80,code=sm_80 -Xcompiler -fPIC -c /t/host.cu -o /t/host.o",
        f"{tc}/g++ -shared /t/host.o -o /t/cu.so",
        f"{tc}/gcc -E /t/libm.c > /t/libm.i",
        f"python3 -c '{probe}' /t/bare.so", f"python3 -c '{probe}' /t/c.so", f"python3 -c '{probe}' /t/cxx.so"])],
        network=False, mounts=[Mount(tmp_path, "/t"), Mount(toolkit.home, str(toolkit.home), read_only=True)])
    first = "GLIBC_2.2.5" if host_arch() == "x86_64" else "GLIBC_2.17"
    bare_versions = bound_versions(tmp_path / "bare.so")
    assert bare_versions["exp"] == "GLIBC_2.29" and bare_versions["expf"] == "GLIBC_2.27"   # what the header undoes
    for so in ("c.so", "cxx.so"):
        versions = bound_versions(tmp_path / so)
        assert {versions[name] for name in LIBM_FUNCTIONS} == {first}, (so, versions)
        assert needed_versions(tmp_path / so)["GLIBC"] < (2, 27), so
    host = bound_versions(tmp_path / "cu.so")
    assert {host["exp"], host["log"], host["powf"]} == {first}, host
    assert "symver" not in (tmp_path / "libm.i").read_text()   # preprocessing alone leaves the header out
    results = out.split()[-3:]
    assert len(set(results)) == 1 and float(results[0]) > 40, results   # the same numbers, old versions or new
