"""The pure-Python fatbin reader against modules nvcc builds here, a real aarch64 object and torch's own library.

The reference is cuobjdump (PyPI's nvidia-cuda-cuobjdump 13.x, installed into the
farm cache): as sets, and as counts of entries. cuobjdump drops the `f` of family
SASS (it prints sm_100 for an sm_100f cubin), so our entries are compared the way it
spells them; the reader itself keeps the `f`.
"""

from __future__ import annotations

import shutil
import struct
from collections import Counter

import pytest
from elftools.elf.elffile import ELFFile
from wheel_factory import (
    GENCODE_SETS,
    as_cuobjdump_sees,
    assert_folder_agrees_with_cuobjdump,
    cuobjdump_entries,
    fatbin_file,
    object_with_fatbin,
    ptx,
    sass,
    session_builder,
    torch_cuda_wheel,
)

from farm.arch.fatbin import read_fatbin
from farm.arch.pam import extract_torch_libs
from farm.errors import FatbinError


@pytest.fixture(scope="session")
def builder(tmp_path_factory):
    return session_builder(tmp_path_factory)


@pytest.fixture(scope="session")
def modules(builder):
    """One module per -gencode set the gate's tests use, plus nvcc's default compression."""
    built = {key: builder.module("_probe", gencodes) for key, gencodes in GENCODE_SETS.items()}
    built["8.0+PTX default compression"] = builder.module("_probe", GENCODE_SETS["8.0+PTX"], compress=None)
    built["8.0+PTX fast compression"] = builder.module("_probe", GENCODE_SETS["8.0+PTX"], compress="speed")
    return built


def test_reads_plain_arch_specific_and_family_entries(modules):
    report = read_fatbin(modules["a+f"])
    assert report.machine == "EM_X86_64"
    assert report.keys() == {("SASS", 80, ""), ("SASS", 90, "a"), ("SASS", 100, "f"),
                             ("PTX", 90, ""), ("PTX", 120, "f")}
    assert {e.name for e in report.entries} == {"sm_80", "sm_90a", "sm_100f", "compute_90", "compute_120f"}
    assert report.compressed() == ()


def test_plain_sass_is_not_mistaken_for_arch_specific(modules):
    assert read_fatbin(modules["9.0"]).sass() == {(90, "")}
    assert read_fatbin(modules["9.0a"]).sass() == {(90, "a")}


@pytest.mark.parametrize("which, method", [("8.0+PTX default compression", "zstd"),
                                           ("8.0+PTX fast compression", "fast")])
def test_compressed_entries_are_listed_from_their_headers(modules, which, method):
    # nvcc 13 compresses PTX by default (zstd); --compress-mode=speed uses the fast method.
    report = read_fatbin(modules[which])
    assert report.ptx() == {(80, "")}
    assert {(e.kind, e.compression) for e in report.entries if e.kind == "PTX"} == {("PTX", method)}
    assert all(e.compression is None for e in report.entries if e.kind == "SASS")


def test_uncompressed_build_has_no_compressed_entry(modules):
    assert read_fatbin(modules["8.0+PTX"]).compressed() == ()


def test_shared_object_without_fatbin_has_no_entries(builder):
    report = read_fatbin(builder.fake_libc10())
    assert report.entries == () and report.containers == 0


def test_a_file_that_is_no_object_is_a_one_line_error(tmp_path):
    junk = tmp_path / "junk.so"
    junk.write_text("not a shared object\n")
    with pytest.raises(FatbinError, match="neither an ELF nor a PE file"):
        read_fatbin(junk)
    with pytest.raises(FatbinError, match="No such file"):
        read_fatbin(tmp_path / "missing.so")


def test_a_container_running_past_its_section_is_an_error(modules, tmp_path):
    broken = tmp_path / "broken.so"
    shutil.copy(modules["8.0"], broken)
    with open(broken, "rb") as f:
        offset = ELFFile(f).get_section_by_name(".nv_fatbin")["sh_offset"]
    with open(broken, "r+b") as f:
        f.seek(offset + 8)          # the container's u64 payload size
        f.write(struct.pack("<Q", 1 << 40))
    with pytest.raises(FatbinError, match="runs past the section end"):
        read_fatbin(broken)


@pytest.mark.slow
def test_agrees_with_cuobjdump_on_every_module_the_tests_build(modules, builder):
    # Every .so in the session's module folder so far (tests/test_verify.py repeats this at its end).
    assert assert_folder_agrees_with_cuobjdump(builder.root) >= len(modules)


@pytest.mark.slow
def test_reads_a_real_aarch64_shared_object(tmp_path):
    fatbin = fatbin_file((sass("80"), sass("90a"), ptx("90")), tmp_path / "k.fatbin")
    arm = object_with_fatbin(fatbin, tmp_path / "libarm.so", "aarch64-linux-gnu")
    report = read_fatbin(arm)
    assert report.machine == "EM_AARCH64"
    assert report.keys() == {("SASS", 80, ""), ("SASS", 90, "a"), ("PTX", 90, "")}
    assert as_cuobjdump_sees(report.entries) == cuobjdump_entries(arm)


@pytest.mark.slow
def test_reads_a_windows_dll(tmp_path):
    # cuobjdump for Linux does not read PE files: the reference is the -gencode set nvcc was given.
    fatbin = fatbin_file((sass("80"), sass("90a"), ptx("90")), tmp_path / "k.fatbin")
    dll = object_with_fatbin(fatbin, tmp_path / "probe.dll", "x86_64-windows-gnu")
    report = read_fatbin(dll)
    assert report.machine == "PE:0x8664"
    assert report.keys() == {("SASS", 80, ""), ("SASS", 90, "a"), ("PTX", 90, "")}


@pytest.fixture(scope="session")
def torch_libs():
    """libtorch_cuda*.so of PyPI's torch 2.13.0 (CUDA 13.0), extracted once into the farm cache."""
    return extract_torch_libs(torch_cuda_wheel()) / "torch" / "lib"


@pytest.mark.slow
def test_largest_torch_library_agrees_with_cuobjdump(torch_libs):
    largest = max(torch_libs.glob("libtorch_cuda*.so"), key=lambda p: p.stat().st_size)
    ours = read_fatbin(largest)
    theirs = cuobjdump_entries(largest)
    assert len(ours.entries) == sum(theirs.values()) > 1000
    assert as_cuobjdump_sees(ours.entries) == theirs
    assert set(as_cuobjdump_sees(ours.entries)) == set(theirs)
    # The reader keeps what cuobjdump drops: torch's family-specific kernels are sm_103f.
    assert ("SASS", 103, "f") in ours.keys()
    assert Counter(e.compression for e in ours.entries) == Counter({"zstd": len(ours.entries)})
