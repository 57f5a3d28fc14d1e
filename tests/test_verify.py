"""The verify gate (design.md §7) on real wheels: tiny CUDA extension modules compiled here with nvcc.

Each defect is built for real (a module linked against a fake libc10.so, an
absolute RPATH, a library nobody ships, a wheel tagged below the glibc its module
demands, a tampered file, twin modules that abort the process) and must fail the
check design.md §7 names for it, and only that check. The import check runs in a child
process with CUDA_VISIBLE_DEVICES=""; these wheels do not link torch, so none is
imported. End to end with the pipeline's farm_demo wheel: tests of the pipeline.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
from farmcli import run_farm
from hostile import assert_one_line_refusal, tree_state
from wheel_factory import (
    C10_BODY,
    C10_DECL,
    CUDA_DRIVER_BODY,
    CUDA_DRIVER_DECL,
    GENCODE_SETS,
    NOWHERE_BODY,
    NOWHERE_DECL,
    PY_TAG,
    TWIN_BODY,
    assert_folder_agrees_with_cuobjdump,
    ext_name,
    host_glibc,
    make_wheel,
    session_builder,
)

from farm.archlist import ArchList
from farm.build.verify.expectation import Expectation
from farm.build.verify.gate import CHECKS, verify_wheel
from farm.build.verify.importcheck import ImportChild, install_into
from farm.errors import GateCannotRun
from farm.recipes.model import AllowedMissing
from farm.recipes.model import Verify as VerifyKnobs
from farm.wheelhouse.wheelfile import wheel_file_problems

INIT = b"from . import _probe\n"


@pytest.fixture(scope="session")
def builder(tmp_path_factory):
    return session_builder(tmp_path_factory)


@pytest.fixture(scope="session")
def mod(builder):
    """name -> built module (.so), each -gencode set compiled once per session."""
    class Modules:
        def __getitem__(self, key):
            return builder.module("_probe", GENCODE_SETS[key])
    return Modules()


def expect(arch_list: str, **kw) -> Expectation:
    base = dict(name="probe", version="1.0", local_label="cu130", python_tag=PY_TAG, platform="linux",
                arch_list=ArchList.parse(arch_list), links_torch=False)
    return Expectation(**{**base, **kw})


def probe_wheel(tmp_path, so, *, extra: dict | None = None, **kw):
    files = {"probe/__init__.py": INIT, f"probe/{ext_name('_probe')}": so, **(extra or {})}
    return make_wheel(tmp_path, "probe", kw.pop("version", "1.0+cu130"), files, **kw)


def statuses(report) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


# ---------------------------------------------------------------- passes

def test_a_wheel_that_keeps_its_promise_passes_every_check(tmp_path, mod):
    here = "manylinux_{}_{}".format(*host_glibc())   # built on this host: within its own glibc's floor
    report = verify_wheel(probe_wheel(tmp_path, mod["8.0+8.9+PTX"]), expect("8.0 8.9+PTX", floor=here))
    assert [c.name for c in report.checks] == list(CHECKS)
    assert statuses(report) == dict.fromkeys(CHECKS, "pass"), report.lines()
    assert report.passed
    doc = json.loads(report.to_json())
    assert doc["passed"] and doc["failed"] == [] and doc["expectation"]["arch_list"] == "8.0 8.9+PTX"
    arches = report.check("arches").details
    assert arches["union"] == {"sass": ["sm_80", "sm_89"], "ptx": ["compute_89"]}
    assert report.check("import").details["modules"] == ["probe", "probe._probe"]


def test_arch_check_takes_the_union_of_modules_and_reports_each(tmp_path, builder):
    plain = builder.module("_probe", GENCODE_SETS["9.0"])
    specific = builder.module("_probe_sm90a", GENCODE_SETS["9.0a"])
    wheel = probe_wheel(tmp_path, plain, extra={f"probe/{ext_name('_probe_sm90a')}": specific})
    report = verify_wheel(wheel, expect("9.0 9.0a"))
    assert report.passed and statuses(report)["arches"] == "pass", report.lines()
    per_module = report.check("arches").details["modules"]
    assert per_module[f"probe/{ext_name('_probe')}"]["sass"] == ["sm_90"]
    assert per_module[f"probe/{ext_name('_probe_sm90a')}"]["sass"] == ["sm_90a"]


# ---------------------------------------------------------------- fails, each naming its check

def failed_only(report, check: str, *words: str) -> str:
    assert report.failed == [check], report.lines()
    message = report.check(check).message
    for w in words:
        assert w in message, message
    return message


def test_missing_sub_arch_fails_arches(tmp_path, mod):
    # sageattention's case: 8.0 built, 8.9 asked. A family-level check would let it through.
    report = verify_wheel(probe_wheel(tmp_path, mod["8.0"]), expect("8.0 8.9"))
    failed_only(report, "arches", "no SASS for sm_89")
    assert report.check("arches").details["missing"] == ["8.9"]
    assert statuses(report)["import"] == "skip"


def test_arch_specific_asked_and_plain_shipped_fails_arches(tmp_path, mod):
    report = verify_wheel(probe_wheel(tmp_path, mod["9.0"]), expect("9.0a"))
    failed_only(report, "arches", "no SASS for sm_90a", "only sm_90 shipped")


def test_ptx_token_without_ptx_fails_arches(tmp_path, mod):
    report = verify_wheel(probe_wheel(tmp_path, mod["8.0"]), expect("8.0+PTX"))
    failed_only(report, "arches", "no PTX for compute_80")


def test_torch_free_wheel_that_links_libc10_fails_torch_linkage(tmp_path, builder):
    libc10 = builder.fake_libc10()
    so = builder.module("_probe", GENCODE_SETS["8.0"], decl=C10_DECL, body=C10_BODY,
                        link=(f"-L{libc10.parent}", "-lc10"))
    wheel = probe_wheel(tmp_path, so)
    failed_only(verify_wheel(wheel, expect("8.0")), "torch_linkage", "libc10.so", "_ZN3c10")
    # The same wheel from a torch-linked recipe is fine: libc10 is torch's.
    linked = verify_wheel(wheel, expect("8.0", links_torch=True), skip_import=True)
    assert linked.passed, linked.lines()


def test_absolute_rpath_fails_elf(tmp_path, builder):
    so = builder.module("_probe", GENCODE_SETS["8.0"], link=("-Xlinker", "-rpath=/opt/farm/lib:$ORIGIN"))
    failed_only(verify_wheel(probe_wheel(tmp_path, so), expect("8.0")), "elf", "/opt/farm/lib")


def test_needed_library_nobody_provides_fails_elf(tmp_path, builder):
    lib = builder.nowhere_lib()
    so = builder.module("_probe", GENCODE_SETS["8.0"], decl=NOWHERE_DECL, body=NOWHERE_BODY,
                        link=(f"-L{lib.parent}", "-lfarm_nowhere"))
    failed_only(verify_wheel(probe_wheel(tmp_path / "a", so), expect("8.0")), "elf", "libfarm_nowhere.so")
    # Shipped in the wheel, or allowed by the recipe, it is provided.
    shipped = probe_wheel(tmp_path / "b", so, extra={"probe/libfarm_nowhere.so": lib})
    assert statuses(verify_wheel(shipped, expect("8.0"), skip_import=True))["elf"] == "pass"
    allowed = expect("8.0", knobs=VerifyKnobs(allowed_needed=("libfarm_nowhere*",)))
    assert statuses(verify_wheel(probe_wheel(tmp_path / "c", so), allowed, skip_import=True))["elf"] == "pass"


def test_glibc_demand_above_the_manylinux_tag_fails_elf(tmp_path, mod):
    # Built on this host (glibc 2.36, nvcc's runtime demands 2.34) but tagged for the production image.
    wheel = probe_wheel(tmp_path, mod["8.0"], tag=f"{PY_TAG}-{PY_TAG}-manylinux_2_28_x86_64")
    failed_only(verify_wheel(wheel, expect("8.0")), "elf", "GLIBC_2.34", "2.28")


def test_record_hash_mismatch_fails_the_file_check(tmp_path, mod):
    wheel = probe_wheel(tmp_path, mod["8.0"], tamper="probe/__init__.py")
    failed_only(verify_wheel(wheel, expect("8.0")), "file", "RECORD mismatch", "probe/__init__.py")


def test_a_wheel_writing_into_site_packages_shared_folders_passes_with_a_warning(tmp_path, mod):
    """llama.cpp's install rules put lib/ and include/ at a wheel's top level; torchao ships test/,
    which shadows the standard library's own `test` package."""
    wheel = probe_wheel(tmp_path, mod["8.0"], extra={"include/probe.h": b"int answer(void);\n",
                                                     "test/__init__.py": b"", "probe/include/probe.h": b""})
    report = verify_wheel(wheel, expect("8.0"), skip_import=True)
    assert report.passed and statuses(report)["file"] == "warn", report.lines()
    assert report.check("file").message == ("installs into site-packages' shared top-level include/, test/ "
                                            "(another wheel's files of the same name collide there)")


def test_metadata_version_different_from_the_file_name_fails_metadata(tmp_path, mod):
    wheel = probe_wheel(tmp_path, mod["8.0"], metadata_version="1.0")
    failed_only(verify_wheel(wheel, expect("8.0")), "metadata", "METADATA Version 1.0", "1.0+cu130")


def test_pure_wheel_where_binaries_are_required_fails_binaries(tmp_path):
    wheel = make_wheel(tmp_path, "probe", "1.0+cu130", {"probe/__init__.py": b"VALUE = 1\n"}, tag="py3-none-any")
    failed_only(verify_wheel(wheel, expect("8.0")), "binaries", "no compiled module")
    allowed = verify_wheel(wheel, expect("8.0", knobs=VerifyKnobs(allow_pure_python=True)))
    assert allowed.passed, allowed.lines()
    assert statuses(allowed)["import"] == "pass"


def test_requires_dist_naming_torch_fails_metadata(tmp_path, mod):
    wheel = probe_wheel(tmp_path, mod["8.0"], requires_dist=("numpy", "torch>=2.0"))
    failed_only(verify_wheel(wheel, expect("8.0")), "metadata", "torch family", "torch>=2.0")


def test_requires_dist_must_equal_the_recipes_when_set(tmp_path, mod):
    wheel = probe_wheel(tmp_path, mod["8.0"], requires_dist=("numpy",))
    failed_only(verify_wheel(wheel, expect("8.0", requires_dist=("numpy>=1.20",)), skip_import=True),
                "metadata", "missing ['numpy>=1.20']", "unexpected ['numpy']")
    assert verify_wheel(wheel, expect("8.0", requires_dist=("numpy",)), skip_import=True).passed
    # {VER:x} of a recipe whose version is known only after its build: matched as a pattern.
    sibling = probe_wheel(tmp_path / "s", mod["8.0"], requires_dist=("cumm==0.7.11+cu130",))
    assert verify_wheel(sibling, expect("8.0", requires_dist=("cumm==*+cu130",)), skip_import=True).passed


def test_filename_that_breaks_the_cells_promise_fails_filename(tmp_path, mod):
    wheel = probe_wheel(tmp_path, mod["8.0"], version="1.0+cu128")
    failed_only(verify_wheel(wheel, expect("8.0")), "filename", "+cu128", "+cu130")
    unrepaired = probe_wheel(tmp_path / "u", mod["8.0"], tag=f"{PY_TAG}-{PY_TAG}-linux_x86_64")
    failed_only(verify_wheel(unrepaired, expect("8.0")), "filename", "not a manylinux tag")


def test_a_compressed_platform_tag_set_matches_the_same_set_expected(tmp_path, mod):
    """auditwheel names a wheel that needs only glibc 2.5 manylinux1_x86_64.manylinux_2_5_x86_64: the cell
    expects that very set, in any order; a set with another member is still refused."""
    both = "manylinux1_x86_64.manylinux_2_5_x86_64"
    wheel = probe_wheel(tmp_path, mod["8.0"], tag=f"{PY_TAG}-{PY_TAG}-{both}")
    report = verify_wheel(wheel, expect("8.0", platform_tag=both), skip_import=True)
    assert next(c for c in report.checks if c.name == "filename").status == "pass", report.lines()
    reordered = "manylinux_2_5_x86_64.manylinux1_x86_64"
    assert next(c for c in verify_wheel(wheel, expect("8.0", platform_tag=reordered), skip_import=True).checks
                if c.name == "filename").status == "pass"
    other = next(c for c in verify_wheel(wheel, expect("8.0", platform_tag="manylinux_2_5_x86_64"),
                                         skip_import=True).checks if c.name == "filename")
    assert other.status == "fail" and "expected manylinux_2_5_x86_64" in other.message


@pytest.fixture(scope="session")
def twins(builder):
    return {side: builder.module(f"_ops_{side}", GENCODE_SETS["8.0"], body=TWIN_BODY) for side in ("cpu", "cuda")}


def twin_wheel(tmp_path, twins):
    files = {"twin/__init__.py": b"from . import _ops_cpu  # the package loads exactly one of its twins\n",
             f"twin/{ext_name('_ops_cpu')}": twins["cpu"], f"twin/{ext_name('_ops_cuda')}": twins["cuda"]}
    return make_wheel(tmp_path, "twin", "1.0+cu130", files)


def test_twin_modules_imported_directly_crash_the_import_check(tmp_path, twins):
    report = verify_wheel(twin_wheel(tmp_path, twins), expect("8.0", name="twin"))
    message = failed_only(report, "import", "SIGABRT", "twin._ops_cuda", "no_direct_import")
    assert "killed the child process" in message


def test_no_direct_import_prevents_the_twin_crash(tmp_path, twins):
    knobs = VerifyKnobs(no_direct_import=("*_cpu.*", "*_cuda.*"))
    report = verify_wheel(twin_wheel(tmp_path, twins), expect("8.0", name="twin", knobs=knobs))
    assert report.passed, report.lines()
    details = report.check("import").details
    assert details["modules"] == ["twin"]
    assert details["not_imported_directly"] == ["twin._ops_cpu", "twin._ops_cuda"]


# ---------------------------------------------------------------- warns, does not fail

def test_an_extra_arch_warns_and_passes(tmp_path, mod):
    report = verify_wheel(probe_wheel(tmp_path, mod["8.0+8.9+PTX"]), expect("8.0"))
    assert report.passed and report.warned == ["arches"], report.lines()
    assert "extra archs beyond the list: sm_89, compute_89" in report.check("arches").message


def test_a_compressed_ptx_entry_warns_and_passes(tmp_path, builder):
    so = builder.module("_probe", GENCODE_SETS["8.0+PTX"], compress=None)   # nvcc 13's default: zstd PTX
    report = verify_wheel(probe_wheel(tmp_path, so), expect("8.0+PTX"))
    assert report.passed and report.warned == ["arches"], report.lines()
    assert "compute_80 (zstd)" in report.check("arches").message


def test_waivers_print_their_reason(tmp_path, mod):
    wheel = probe_wheel(tmp_path, mod["8.0"])
    waiver = {"linux": AllowedMissing(ArchList.parse("8.9"), "upstream documents no 8.9 build")}
    waived = verify_wheel(wheel, expect("8.0 8.9", knobs=VerifyKnobs(allow_missing_archs=waiver)))
    assert waived.passed and waived.warned == ["arches"], waived.lines()
    assert "upstream documents no 8.9 build" in waived.check("arches").message
    # A waiver for another platform waives nothing here.
    other = {"linux_aarch64": AllowedMissing(ArchList.parse("8.9"), "no ARM build")}
    assert verify_wheel(wheel, expect("8.0 8.9", knobs=VerifyKnobs(allow_missing_archs=other))).failed == ["arches"]
    skipped = verify_wheel(wheel, expect("12.0", knobs=VerifyKnobs(skip_arch="kernels compiled by NVRTC")))
    assert skipped.passed and statuses(skipped)["arches"] == "skip"
    assert "kernels compiled by NVRTC" in skipped.check("arches").message


# ---------------------------------------------------------------- import details

def test_a_top_level_name_the_wheel_does_not_hold_is_reported_not_imported(tmp_path, mod):
    # cumm's case: setuptools lists an extension's first name component (`core_cc`, for the
    # extension cumm/core_cc) in top_level.txt although no such top-level module is shipped.
    wheel = probe_wheel(tmp_path / "ghost", mod["8.0"], top_level=("_ghost_cc", "probe"))
    report = verify_wheel(wheel, expect("8.0"))
    assert report.passed, report.lines()
    check = report.check("import")
    assert check.details["modules"] == ["probe", "probe._probe"]
    assert check.details["top_level_absent"] == ["_ghost_cc"] and "_ghost_cc" in check.message
    # A listed name the wheel does hold is still imported, and its failure still fails the check.
    broken = probe_wheel(tmp_path / "broken", mod["8.0"], top_level=("_ghost_cc", "probe"),
                         extra={"_ghost_cc.py": b"raise ImportError('a real top-level module that breaks')\n"})
    failed_only(verify_wheel(broken, expect("8.0")), "import", "_ghost_cc", "breaks")


def test_import_errors_fail_unless_a_device_error_is_expected(tmp_path, mod):
    raising = {"probe/__init__.py": b"raise RuntimeError('CUDA driver initialization failed: no device')\n"}
    wheel = probe_wheel(tmp_path, mod["8.0"], extra=raising)
    failed_only(verify_wheel(wheel, expect("8.0")), "import", "RuntimeError", "CUDA driver")
    for expected in (True, "driver initialization failed"):
        forgiven = verify_wheel(wheel, expect("8.0", knobs=VerifyKnobs(expect_device_error=expected)))
        assert forgiven.passed, forgiven.lines()
        assert "forgiven" in forgiven.check("import").message
    other = verify_wheel(wheel, expect("8.0", knobs=VerifyKnobs(expect_device_error="CUDA is not available")))
    assert other.failed == ["import"]


def test_an_import_the_wheels_requirements_do_not_bring_fails_as_in_a_users_fresh_venv(tmp_path, mod):
    """cumm's case: it imports pccm, which its build environment held but its Requires-Dist did not name,
    so the gate passed and `import cumm` failed in every user's venv. The gate's interpreter here is this
    project's venv, which holds PyYAML and requests (and requests' own urllib3)."""
    uses_yaml = {"probe/__init__.py": b"import yaml\n" + INIT}
    report = verify_wheel(probe_wheel(tmp_path / "undeclared", mod["8.0"], extra=uses_yaml), expect("8.0"))
    message = failed_only(report, "import", "No module named 'yaml'", "pyyaml", "requires_dist")
    assert "yaml" in report.check("import").details["hidden"], message
    declared = probe_wheel(tmp_path / "declared", mod["8.0"], extra=uses_yaml, requires_dist=("PyYAML>=5",))
    assert verify_wheel(declared, expect("8.0")).passed
    # A requirement whose marker excludes this interpreter brings nothing.
    never = probe_wheel(tmp_path / "marker", mod["8.0"], extra=uses_yaml,
                        requires_dist=('PyYAML; python_version < "3"',))
    failed_only(verify_wheel(never, expect("8.0")), "import", "No module named 'yaml'")
    # What a requirement brings in turn is reachable (requests -> urllib3); the standard library always is.
    transitive = {"probe/__init__.py": b"import json, urllib3\n" + INIT}
    via_requests = probe_wheel(tmp_path / "transitive", mod["8.0"], extra=transitive, requires_dist=("requests",))
    assert verify_wheel(via_requests, expect("8.0")).passed
    # An optional import behaves as on a machine without it: the fallback is taken.
    guarded = {"probe/__init__.py": b"try:\n    import yaml\nexcept ImportError:\n    yaml = None\n" + INIT}
    optional = verify_wheel(probe_wheel(tmp_path / "guarded", mod["8.0"], extra=guarded), expect("8.0"))
    assert optional.passed and optional.check("import").details["hidden"] == ["yaml"], optional.lines()
    assert "were hidden: yaml" in optional.check("import").message


def test_requirements_are_followed_through_markers_and_extras():
    from farm.build.verify.declared import Installed, reached

    def dist(name, *requires):
        return Installed(name, "1", requires, frozenset({name}))
    dists = {d.name: d for d in (
        dist("a", "b", 'c; extra == "fast"', 'd; sys_platform == "win32"'),
        dist("b"), dist("c", "e"), dist("d"), dist("e"), dist("unrelated"))}
    linux = {"sys_platform": "linux", "python_version": "3.12"}
    assert reached(["a"], dists, linux) == {"a", "b"}
    assert reached(["a[fast]"], dists, linux) == {"a", "b", "c", "e"}
    assert reached(["a"], dists, {**linux, "sys_platform": "win32"}) == {"a", "b", "d"}
    assert reached(["not-installed", "a; python_version < '3'"], dists, linux) == set()


RUNTIME_DECL = "extern int farm_runtime(void);"
RUNTIME_BODY = "if (farm_runtime() < 0) return NULL;"


def test_a_torch_free_wheel_finds_its_cuda_runtime_through_nvidias_wheel_beside_it(tmp_path, builder):
    """cumm's case: a torch-free wheel needing a CUDA runtime library that no torch loads first.
    The environment holds NVIDIA's runtime wheel as pip installs it (nvidia/cu13/lib + its RECORD);
    the library is a stand-in with a soname of its own (this host's loader cache knows the real
    libcudart.so.13, which would hide the failure)."""
    import shutil
    import subprocess

    from farm.build.repair import repair_wheel

    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", env], check=True)
    (site,) = env.glob("lib/python3*/site-packages")
    lib = builder.helper_lib("farm_runtime", "int farm_runtime(void) { return 13; }\n",
                             soname="libfarm_runtime.so.13")
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    shutil.copy(lib, site / "nvidia" / "cu13" / "lib" / "libfarm_runtime.so.13")
    record = site / "nvidia_farm_runtime-13.0.96.dist-info" / "RECORD"
    record.parent.mkdir()
    record.write_text("nvidia/cu13/lib/libfarm_runtime.so.13,,\n")
    so = builder.module("_probe", GENCODE_SETS["8.0"], decl=RUNTIME_DECL, body=RUNTIME_BODY,
                        link=(f"-L{lib.parent}", "-lfarm_runtime"))
    raw = probe_wheel(tmp_path / "raw", so)
    torch_free = expect("8.0", requires_dist=())

    # As built, the loader cannot find the library: the import check fails, as cumm's did.
    failed_only(verify_wheel(raw, torch_free, torch_env=env), "import", "libfarm_runtime.so.13")

    repaired = repair_wheel(raw, tmp_path / "out", torch_site_packages=[site], links_torch=False)
    assert repaired.nvidia_requires == ("nvidia-farm-runtime<14,>=13.0",)
    report = verify_wheel(repaired.wheel, torch_free, torch_env=env)
    assert report.passed, report.lines()
    elf = report.check("elf").details
    assert "$ORIGIN/../nvidia/cu13/lib" in json.dumps(elf), elf
    assert report.check("metadata").details["requires_dist"] == ["nvidia-farm-runtime<14,>=13.0"]
    # Only a torch-free wheel may carry requirements the recipe did not list; a torch-linked wheel's
    # NVIDIA libraries come from the user's torch.
    linked = verify_wheel(repaired.wheel, expect("8.0", requires_dist=(), links_torch=True), skip_import=True)
    assert "metadata" in linked.failed and "nvidia-farm-runtime" in linked.check("metadata").message
    # A torch-linked repair adds nothing.
    plain = repair_wheel(raw, tmp_path / "linked", torch_site_packages=[site])
    assert plain.nvidia_requires == () and "Requires-Dist" not in zipfile.ZipFile(plain.wheel).read(
        next(n for n in zipfile.ZipFile(plain.wheel).namelist() if n.endswith("METADATA"))).decode()


def test_the_import_check_sees_every_nvidia_folder_of_an_overlay_env(tmp_path, builder):
    """An overlay environment's `nvidia/` spans two site-packages (its own and its base's, through a
    .pth): the runtime library lives only in the second, so linking the first folder alone fails."""
    import shutil
    import subprocess

    from farm.build.repair import repair_wheel

    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", env], check=True)
    (site,) = env.glob("lib/python3*/site-packages")
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "lib" / "libunrelated.so.13").write_bytes(b"")
    base = tmp_path / "base-site"
    lib = builder.helper_lib("farm_runtime", "int farm_runtime(void) { return 13; }\n",
                             soname="libfarm_runtime.so.13")
    (base / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    shutil.copy(lib, base / "nvidia" / "cu13" / "lib" / "libfarm_runtime.so.13")
    (base / "nvidia_farm_runtime-13.0.96.dist-info").mkdir()
    (base / "nvidia_farm_runtime-13.0.96.dist-info" / "RECORD").write_text("nvidia/cu13/lib/libfarm_runtime.so.13,,\n")
    (site / "base.pth").write_text(f"{base}\n")
    so = builder.module("_probe", GENCODE_SETS["8.0"], decl=RUNTIME_DECL, body=RUNTIME_BODY,
                        link=(f"-L{lib.parent}", "-lfarm_runtime"))
    repaired = repair_wheel(probe_wheel(tmp_path / "raw", so), tmp_path / "out", torch_site_packages=[site, base],
                            links_torch=False)
    assert repaired.nvidia_requires == ("nvidia-farm-runtime<14,>=13.0",)
    report = verify_wheel(repaired.wheel, expect("8.0", requires_dist=()), torch_env=env)
    assert report.passed, report.lines()


def test_needs_driver_imports_with_a_libcuda_stub(tmp_path, builder):
    link_stub = builder.cuda_link_stub()
    so = builder.module("_probe", GENCODE_SETS["8.0"], decl=CUDA_DRIVER_DECL, body=CUDA_DRIVER_BODY,
                        link=(f"-L{link_stub.parent}", "-lcuda"))
    wheel = probe_wheel(tmp_path, so)
    without = verify_wheel(wheel, expect("8.0"))
    failed_only(without, "import", "libcuda.so.1")
    assert verify_wheel(wheel, expect("8.0", knobs=VerifyKnobs(needs_driver=True))).passed


def test_torch_linked_wheel_without_a_torch_env_cannot_be_judged(tmp_path, mod):
    with pytest.raises(GateCannotRun, match="torch environment"):
        verify_wheel(probe_wheel(tmp_path, mod["8.0"]), expect("8.0", links_torch=True))


# ---------------------------------------------------------------- the command

def test_farm_verify_exit_codes_and_report(tmp_path, mod):
    good = probe_wheel(tmp_path / "good", mod["8.0+8.9+PTX"])
    bad = probe_wheel(tmp_path / "bad", mod["8.0"])
    report = tmp_path / "report.json"
    common = ["--arch-list", "8.0 8.9+PTX", "--platform", "linux", "--cuda", "13.0",
              "--python", f"{sys.version_info[0]}.{sys.version_info[1]}"]
    ok = run_farm("verify", str(good), *common, "--report", str(report))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("PASS ") and json.loads(report.read_text())["passed"] is True
    failed = run_farm("verify", str(good), str(bad), *common, "--skip-import", "--report", str(report))
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "FAIL probe" in failed.stdout and "no SASS for sm_89" in failed.stdout
    doc = json.loads(report.read_text())
    assert [w["passed"] for w in doc["wheels"]] == [True, False]
    assert doc["wheels"][1]["failed"] == ["arches"]
    missing = run_farm("verify", str(tmp_path / "nope.whl"), *common)
    assert missing.returncode == 2 and "no such wheel file" in missing.stderr
    no_platform = run_farm("verify", str(good), "--arch-list", "8.0")
    assert no_platform.returncode == 2 and "--platform" in no_platform.stderr
    bad_list = run_farm("verify", str(good), "--arch-list", "8.0 sm_89", "--platform", "linux")
    assert bad_list.returncode == 2 and "sm_89" in bad_list.stderr
    assert len(bad_list.stderr.strip().splitlines()) == 1


def test_farm_verify_cell_takes_the_promise_from_the_plan(tmp_path, mod):
    # The farm_demo cell expects +cu130torch2.13 and its policy list; a probe wheel is not that.
    wheel = probe_wheel(tmp_path, mod["8.0"])
    result = run_farm("verify", str(wheel), "--cell", f"farm_demo-cu130-torch2.13-py{PY_TAG[2:]}", "--skip-import",
                      "--format", "json")
    assert result.returncode == 1, result.stdout + result.stderr
    doc = json.loads(result.stdout)["wheels"][0]
    assert doc["expectation"]["local_label"] == "cu130torch2.13" and doc["expectation"]["links_torch"] is True
    assert "filename" in doc["failed"] and "arches" in doc["failed"]
    unknown = run_farm("verify", str(wheel), "--cell", "no_such_package-cu130-py311")
    assert unknown.returncode == 2 and "no such cell" in unknown.stderr



# ---------------------------------------------------------------- against a real torch environment

@pytest.fixture(scope="session")
def torch_env():
    """The cell's base environment: PyPI's torch 2.13.0 for CUDA 13.0 (built once in the farm cache)."""
    from farm.build.environments import EnvRequest, base_environment, download_environment

    req = EnvRequest(python=f"{sys.version_info[0]}.{sys.version_info[1]}", torch_pin="2.13.0", cuda="13.0")
    download_environment(req)
    return base_environment(req, sys.executable).path


TORCH_OPS_INIT = b"""import torch
from . import _probe
torch.library.define("farm_probe::twice", "(Tensor x) -> Tensor")
torch.library.impl("farm_probe::twice", "CPU")(lambda x: x * 2)
"""


@pytest.mark.slow
def test_torch_linked_wheel_imports_after_torch_and_its_ops_are_checked(tmp_path, mod, torch_env):
    wheel = probe_wheel(tmp_path, mod["8.0+8.9+PTX"], version="1.0+cu130torch2.13",
                        extra={"probe/__init__.py": TORCH_OPS_INIT})
    promised = expect("8.0 8.9+PTX", local_label="cu130torch2.13", links_torch=True,
                      knobs=VerifyKnobs(expect_ops=("farm_probe::twice",)))
    report = verify_wheel(wheel, promised, torch_env=torch_env)
    assert report.passed and report.warned == [], report.lines()
    events = report.check("import").details["events"]
    assert [e["module"] for e in events if e["event"] == "ok"][0] == "torch"   # torch first
    missing_op = expect("8.0 8.9+PTX", local_label="cu130torch2.13", links_torch=True,
                        knobs=VerifyKnobs(expect_ops=("farm_probe::thrice",)))
    failed_only(verify_wheel(wheel, missing_op, torch_env=torch_env), "import", "farm_probe::thrice")


@pytest.mark.slow
def test_an_import_child_started_before_the_wheel_gives_the_same_verdict(tmp_path, mod, torch_env):
    """farm.build.steps starts the import check's child with the compile (torch imports beside it)."""
    wheel = probe_wheel(tmp_path, mod["8.0"], version="1.0+cu130torch2.13")
    promised = expect("8.0", local_label="cu130torch2.13", links_torch=True)
    early = ImportChild.for_environment(torch_env, import_torch=True)
    report = verify_wheel(wheel, promised, torch_env=torch_env, import_child=early)
    assert report.passed, report.lines()
    events = report.check("import").details["events"]
    assert [(e["event"], e["module"]) for e in events if e["event"] != "begin"] == [
        ("ok", "torch"), ("ok", "probe"), ("ok", "probe._probe"), ("done", "")]
    assert early.proc.returncode == 0 and not early.cwd.exists()
    # a child that does not fit the check (no torch imported first) is not used, and is closed
    unfit = ImportChild.for_environment(torch_env, import_torch=False)
    again = verify_wheel(wheel, promised, torch_env=torch_env, import_child=unfit)
    assert again.passed and again.check("import").details["events"][1] == {"event": "ok", "module": "torch"}
    assert unfit.proc.returncode is not None and not unfit.cwd.exists()
    # and a broken module still fails through an early child
    broken = probe_wheel(tmp_path / "broken", mod["8.0"], version="1.0+cu130torch2.13",
                         extra={"probe/__init__.py": b"raise ImportError('the probe is broken')\n"})
    failed_only(verify_wheel(broken, promised, torch_env=torch_env,
                             import_child=ImportChild.for_environment(torch_env, import_torch=True)),
                "import", "the probe is broken")


def test_install_into_spreads_the_data_folders_like_pip_target(tmp_path):
    files = {"pkg/__init__.py": b"", "pkg-1.0.data/purelib/extra_mod.py": b"X = 1\n",
             "pkg-1.0.data/scripts/pkg-tool": b"#!python\nprint('hi')\n"}
    wheel = make_wheel(tmp_path, "pkg", "1.0", files)
    target = tmp_path / "target"
    assert install_into(wheel, target, Path(sys.executable)) is None
    assert (target / "pkg" / "__init__.py").is_file() and (target / "extra_mod.py").read_text() == "X = 1\n"
    assert (target / "bin" / "pkg-tool").read_text().startswith(f"#!{sys.executable}")
    assert (target / "pkg-1.0.dist-info" / "INSTALLER").read_text() == "farm-verify\n"
    not_a_wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    not_a_wheel.write_bytes(b"not a zip")
    assert "BadZipFile" in install_into(not_a_wheel, tmp_path / "t2", Path(sys.executable))


@pytest.mark.slow
def test_every_module_the_gate_tests_built_reads_as_cuobjdump_lists_it(builder):
    # Last in this file on purpose: the libc10-linked, RPATH, twin, driver-stub... modules all exist now.
    assert assert_folder_agrees_with_cuobjdump(builder.root) >= 1


# ---------------------------------------------------------------- hostile wheels: the file check

def zip_entries(wheel: Path) -> list[list]:
    """[name, bytes, unix mode] of every member, in order: the material a hostile case edits."""
    with zipfile.ZipFile(wheel) as z:
        return [[i.filename, z.read(i), i.external_attr >> 16] for i in z.infolist()]


def rewrite(path: Path, entries: list[list], *, record: bool = True) -> Path:
    """Write `entries` as the zip `path`; record=True first rewrites RECORD to match them, so that
    the one defect a case plants is the only one."""
    if record:
        rec = next(e for e in entries if e[0].endswith(".dist-info/RECORD"))
        rows = [f"{n},{_record_hash(d)},{len(d)}\n" for n, d, _ in entries if n != rec[0]]
        rec[1] = ("".join(rows) + f"{rec[0]},,\n").encode()
    path.unlink(missing_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data, mode in entries:
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.create_system = 3  # Unix, so that the mode bits mean what they say
            info.external_attr = mode << 16
            z.writestr(info, data)
    return path


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _member(entries, suffix):
    return next(e for e in entries if e[0].endswith(suffix))


def _set_wheel_txt(text: str | bytes):
    """WHEEL replaced by `text`, where {tag} stands for the file name's tag."""
    def edit(entries, path):
        raw = text if isinstance(text, bytes) else text.encode()
        _member(entries, ".dist-info/WHEEL")[1] = raw.replace(b"{tag}", path.stem.split("-", 2)[2].encode())
        return rewrite(path, entries)
    return edit


def _add(name: str, data: bytes = b"X = 1\n", mode: int = stat.S_IFREG | 0o644):
    def edit(entries, path):
        return rewrite(path, entries + [[name, data, mode]])
    return edit


def _drop(suffix: str, *, record: bool = True):
    def edit(entries, path):
        return rewrite(path, [e for e in entries if not e[0].endswith(suffix)], record=record)
    return edit


def _record_edit(change):
    """RECORD written right, then `change(lines)` applied to its text lines."""
    def edit(entries, path):
        rewrite(path, entries)
        entries = zip_entries(path)
        rec = _member(entries, ".dist-info/RECORD")
        rec[1] = "".join(change(rec[1].decode().splitlines(keepends=True))).encode()
        return rewrite(path, entries, record=False)
    return edit


def _tamper_after_record(entries, path):
    rewrite(path, entries)
    entries = zip_entries(path)
    _member(entries, "probe/__init__.py")[1] += b"# changed after RECORD\n"
    return rewrite(path, entries, record=False)


def _duplicate(entries, path):
    init = _member(entries, "probe/__init__.py")
    with warnings.catch_warnings():  # zipfile warns about the twin it is asked to write
        warnings.simplefilter("ignore", UserWarning)
        return rewrite(path, entries + [[init[0], b"EVIL = 1\n", init[2]]])


def _second_dist_info(entries, path):
    meta = _member(entries, ".dist-info/METADATA")
    return rewrite(path, entries + [["other-1.0.dist-info/METADATA", meta[1], meta[2]]])


def _bad_crc(entries, path):
    rewrite(path, entries)
    raw = path.read_bytes()
    at = raw.index(b"from . import _probe")  # stored, so the member's bytes sit in the file as they are
    path.write_bytes(raw[:at] + b"FROM" + raw[at + 4:])
    return path


def _raw(data_of):
    def edit(entries, path):
        rewrite(path, entries)
        path.write_bytes(data_of(path.read_bytes()))
        return path
    return edit


WHEEL_OK = "Wheel-Version: 1.0\nGenerator: farm-tests\nRoot-Is-Purelib: false\nTag: {tag}\n"

# (id, edit(entries, path) -> path, what the one stderr line must say)
HOSTILE_WHEELS = [
    ("absolute-member", _add("/tmp/farm-hostile-abs.py"), "absolute member paths: /tmp/farm-hostile-abs.py"),
    ("drive-letter-member", _add("C:/farm-hostile.py"), "absolute member paths: C:/farm-hostile.py"),
    ("dotdot-member", _add("../../../tmp/x.py"), "member paths with '..': ../../../tmp/x.py"),
    ("dotdot-inside-member", _add("probe/../../x.py"), "member paths with '..': probe/../../x.py"),
    ("backslash-member", _add("probe\\evil.py"), "member paths with a backslash"),
    ("backslash-dotdot-member", _add("..\\..\\evil.py"), "member paths with '..'"),
    ("symlink-member", _add("probe/passwd", b"/etc/passwd", stat.S_IFLNK | 0o777), "symlink members: probe/passwd"),
    ("fifo-member", _add("probe/pipe", b"", stat.S_IFIFO | 0o644), "members that are not regular files: probe/pipe"),
    ("device-member", _add("probe/dev", b"", stat.S_IFCHR | 0o644), "members that are not regular files: probe/dev"),
    ("duplicate-member", _duplicate, "duplicate zip members: probe/__init__.py"),
    ("missing-WHEEL", _drop(".dist-info/WHEEL"), "WHEEL is missing"),
    ("WHEEL-not-headers", _set_wheel_txt("this is not a header\n"), "is not a list of 'Key: value' lines"),
    # A Content-Type header makes the parser read a MIME body: a list of parts, not text to strip.
    ("WHEEL-multipart", _set_wheel_txt("Content-Type: multipart/mixed; boundary=b\n" + WHEEL_OK + "\n--b\n\nx\n--b--\n"),
     "is not a list of 'Key: value' lines"),
    ("WHEEL-version-2", _set_wheel_txt(WHEEL_OK.replace("1.0", "2.0")), "Wheel-Version 2.0, expected one 1.x"),
    ("WHEEL-no-purelib", _set_wheel_txt("Wheel-Version: 1.0\nTag: {tag}\n"), "Root-Is-Purelib (none)"),
    ("WHEEL-purelib-maybe", _set_wheel_txt(WHEEL_OK.replace("false", "maybe")), "Root-Is-Purelib maybe"),
    ("WHEEL-no-tag", _set_wheel_txt("Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"), "no Tag line"),
    ("WHEEL-tag-mismatch", _set_wheel_txt(WHEEL_OK.replace("{tag}", "py3-none-any")), "differ from the file name"),
    ("WHEEL-tag-garbage", _set_wheel_txt(WHEEL_OK.replace("{tag}", "cp311")), "Tag 'cp311' is not python-abi-platform"),
    ("WHEEL-not-utf8", _set_wheel_txt(b"Wheel-Version: 1.0\xff\n"), "is not UTF-8"),
    ("RECORD-missing", _drop(".dist-info/RECORD", record=False), "RECORD is missing"),
    ("RECORD-misses-a-member", _record_edit(lambda ls: [ln for ln in ls if not ln.startswith("probe/__init__")]),
     "not in RECORD: probe/__init__.py"),
    ("RECORD-wrong-hash", _tamper_after_record, "RECORD mismatch: probe/__init__.py (hash differs)"),
    ("RECORD-wrong-size", _record_edit(lambda ls: [re.sub(r",\d+$", ",999999", ln.rstrip("\n")) + "\n"
                                                   if ln.startswith("probe/__init__") else ln for ln in ls]),
     "RECORD says 999999"),
    ("RECORD-md5", _record_edit(lambda ls: [re.sub(r",sha256=[^,]*,", ",md5=abc,", ln)
                                            if ln.startswith("probe/__init__") else ln for ln in ls]),
     "probe/__init__.py (hash md5=abc)"),
    ("RECORD-lists-a-ghost", _record_edit(lambda ls: ls + ["probe/ghost.py,sha256=AAAA,1\n"]),
     "in RECORD but not in the wheel: probe/ghost.py"),
    ("RECORD-two-fields", _record_edit(lambda ls: ls + ["probe/x.py,sha256=AAAA\n"]), "does not have 3 fields"),
    ("two-dist-info", _second_dist_info, "expected one .dist-info folder"),
    ("bad-crc", _bad_crc, "probe/__init__.py (unreadable: Bad CRC-32"),
    ("not-a-zip", _raw(lambda b: b"#!/bin/sh\necho this is no wheel\n"), "not a readable zip"),
    ("empty-file", _raw(lambda b: b""), "not a readable zip"),
    ("truncated", _raw(lambda b: b[: len(b) // 2]), "not a readable zip"),
]


@pytest.fixture(scope="module")
def sound_wheel(tmp_path_factory, mod):
    """A wheel that passes every check but import (--skip-import), to plant one defect in at a time."""
    return probe_wheel(tmp_path_factory.mktemp("sound"), mod["8.0"])


def verify_cli(wheel: Path, *extra: str):
    return run_farm("verify", str(wheel), "--arch-list", "8.0", "--platform", "linux", "--cuda", "13.0",
                    "--python", f"{sys.version_info[0]}.{sys.version_info[1]}", *extra, cwd=wheel.parent)


def test_the_sound_wheel_passes_the_file_check_and_the_gate(sound_wheel, tmp_path):
    assert wheel_file_problems(sound_wheel) == []
    again = rewrite(tmp_path / sound_wheel.name, zip_entries(sound_wheel))  # the corpus's own writer
    assert wheel_file_problems(again) == []
    res = verify_cli(again, "--skip-import")
    assert res.returncode == 0 and res.stderr == "", res.stdout + res.stderr
    assert "pass file: a sound zip" in res.stdout


@pytest.mark.parametrize("edit,needle", [c[1:] for c in HOSTILE_WHEELS], ids=[c[0] for c in HOSTILE_WHEELS])
def test_a_hostile_wheel_fails_the_file_check_in_one_line(sound_wheel, tmp_path, edit, needle):
    wheel = edit(zip_entries(sound_wheel), tmp_path / sound_wheel.name)
    problems = wheel_file_problems(wheel)
    assert problems and any(needle in p for p in problems), problems
    before = tree_state(tmp_path)
    res = verify_cli(wheel, "--skip-import")
    line = assert_one_line_refusal(res, 1, needle)
    assert line.startswith(f"farm: {wheel.name}: failed file"), line
    assert "FAIL " in res.stdout and "fail file:" in res.stdout
    assert tree_state(tmp_path) == before


def test_the_gate_never_installs_a_wheel_whose_member_climbs_out(sound_wheel, tmp_path):
    # Without --skip-import: a failed file check must keep the installer away from the wheel.
    escape = f"farm-escaped-{os.getpid()}-{tmp_path.name}.py"
    wheel = _add(f"../../../../../../../../tmp/{escape}", b"raise SystemExit('escaped')\n")(
        zip_entries(sound_wheel), tmp_path / sound_wheel.name)
    res = verify_cli(wheel)
    assert_one_line_refusal(res, 1, "member paths with '..'")
    assert "skip import: not run: file failed" in res.stdout
    assert not (Path("/tmp") / escape).exists()
