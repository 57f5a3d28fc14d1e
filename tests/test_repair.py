"""Step 6, repair: real auditwheel on real gcc-built extensions linking libraries of a fake torch
environment (a site-packages folder with torch/lib and nvidia/*/lib, made here: installing a real
torch is the environment step's business and too heavy for these tests)."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest
from wheel_builder import build_shared_lib, pack_ext_wheel

from farm.build.platform import for_cell
from farm.build.repair import (
    drop_build_rpaths,
    exclusions,
    host_plat,
    plat_glibc,
    repair_wheel,
    torch_env_sonames,
)
from farm.errors import BadInput, RepairError
from farm.wheelhouse.wheelfile import wheel_file_problems


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("env")
    sp = root / "lib" / "python3.11" / "site-packages"
    build_shared_lib(sp / "torch" / "lib", "c10")
    build_shared_lib(sp / "nvidia" / "cu13" / "lib", "cublas", soname="libcublas.so.13")
    (sp / "nvidia" / "cu13" / "include").mkdir(parents=True)
    (sp / "nvidia" / "cu13" / "include" / "libnotalib.so").write_text("headers folder, not a library\n")
    outside = root / "outside"
    build_shared_lib(outside, "outside")
    host_cuda = root / "host_cuda"  # what a build machine's /usr/local/cuda/lib64 would offer
    build_shared_lib(host_cuda, "cudart", soname="libcudart.so.13")
    return {"sp": sp, "torch_lib": sp / "torch" / "lib", "nv_lib": sp / "nvidia" / "cu13" / "lib",
            "outside": outside, "host_cuda": host_cuda}


def needed_and_rpath(wheel: Path, tmp: Path) -> tuple[list[str], str]:
    with zipfile.ZipFile(wheel) as z:
        (ext,) = [n for n in z.namelist() if n.startswith("demo/_ext")]
        z.extract(ext, tmp)
    out = subprocess.run(["readelf", "-d", str(tmp / ext)], capture_output=True, text=True, check=True).stdout
    needed = [ln.split("[", 1)[1].rstrip("]") for ln in out.splitlines() if "(NEEDED)" in ln]
    rpath = [ln.split("[", 1)[1].rstrip("]") for ln in out.splitlines() if "PATH)" in ln]
    return needed, rpath[0] if rpath else ""


def libs_folder(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return [n for n in z.namelist() if n.split("/")[0].endswith(".libs") and not n.endswith("/")]


def test_exclusions_are_every_soname_of_the_torch_environment_plus_driver_and_runtime(env):
    names = torch_env_sonames([env["sp"]])
    assert names == ["libc10.so", "libcublas.so", "libcublas.so.13"]  # file names and ELF sonames
    assert {"libcuda.so*", "libcudart.so*"} <= set(exclusions([env["sp"]]))


def test_libraries_of_the_torch_environment_stay_out_even_when_findable(env, tmp_path):
    # With an RPATH into the environment auditwheel could find and copy them: exclusion must stop it.
    wheel = pack_ext_wheel(tmp_path, link=[(env["torch_lib"], "c10", True), (env["nv_lib"], "cublas", True)])
    res = repair_wheel(wheel, tmp_path / "out", torch_site_packages=[env["sp"]])
    assert res.repaired and res.grafted == () and libs_folder(res.wheel) == []
    needed, rpath = needed_and_rpath(res.wheel, tmp_path / "x")
    assert "libc10.so" in needed and "libcublas.so.13" in needed
    # the build machine's folders do not travel with the wheel; RECORD still matches every member
    assert rpath == "" and sorted(res.record()["dropped_rpaths"]) == [
        n for n in zipfile.ZipFile(res.wheel).namelist() if n.startswith("demo/_ext")]
    assert set(next(iter(res.dropped_rpaths.values()))) == {str(env["torch_lib"]), str(env["nv_lib"])}
    assert wheel_file_problems(res.wheel) == []
    assert res.wheel.parent == tmp_path / "out" and res.wheel.name.endswith(f"{res.plat}.whl")

    # the control: without the environment's exclusions, auditwheel grafts libc10 and the check refuses
    with pytest.raises(RepairError, match=r"grafted .*libc10\.so.*allow-list") as exc:
        repair_wheel(wheel, tmp_path / "control", torch_site_packages=[])
    assert "\n" not in str(exc.value)
    assert not list((tmp_path / "control").glob("*.whl"))


def test_the_host_cuda_runtime_is_never_vendored(env, tmp_path):
    wheel = pack_ext_wheel(tmp_path, link=[(env["host_cuda"], "cudart", True)])
    res = repair_wheel(wheel, tmp_path / "out")
    assert res.grafted == () and libs_folder(res.wheel) == []
    assert "libcudart.so.13" in needed_and_rpath(res.wheel, tmp_path / "x")[0]


def test_an_outside_library_is_grafted_and_then_refused_unless_allowed(env, tmp_path):
    wheel = pack_ext_wheel(tmp_path, link=[(env["torch_lib"], "c10", False), (env["outside"], "outside", True)])
    with pytest.raises(RepairError, match=r"liboutside\.so \(from .*outside/liboutside\.so\).*allow-list"):
        repair_wheel(wheel, tmp_path / "out", torch_site_packages=[env["sp"]])
    assert [p.name for p in (tmp_path / "out").iterdir()] == []  # no wheel, no scratch left

    res = repair_wheel(wheel, tmp_path / "ok", torch_site_packages=[env["sp"]], allow_graft=["liboutside.so*"])
    assert res.grafted == ("liboutside.so",)
    grafted = libs_folder(res.wheel)
    assert len(grafted) == 1 and grafted[0].startswith("demo_ext.libs/liboutside-")
    needed, rpath = needed_and_rpath(res.wheel, tmp_path / "x")
    assert "libc10.so" in needed and all(e.startswith("$ORIGIN") for e in rpath.split(":")), rpath
    assert wheel_file_problems(res.wheel) == []


def test_a_wheel_whose_rpaths_are_all_relative_is_left_byte_identical(tmp_path):
    wheel = pack_ext_wheel(tmp_path, rpath="$ORIGIN/../demo_ext.libs")
    assert needed_and_rpath(wheel, tmp_path / "x")[1] == "$ORIGIN/../demo_ext.libs"
    before = wheel.read_bytes()
    assert drop_build_rpaths(wheel) == {} and wheel.read_bytes() == before


PTHREAD = """
#include <pthread.h>
void *farm_needs_glibc_2_34 = (void *)&pthread_create;
"""


def test_host_runner_gets_the_lowest_tag_the_symbols_allow(tmp_path):
    # pthread_create moved into libc in glibc 2.34: this is why a Debian 12 base gives 2_34 at best.
    wheel = pack_ext_wheel(tmp_path, extra_c=PTHREAD)
    res = repair_wheel(wheel, tmp_path / "out")
    assert res.plat == "manylinux_2_34_x86_64" and res.wheel.name.endswith("-manylinux_2_34_x86_64.whl")
    plain = pack_ext_wheel(tmp_path / "plain")
    assert plat_glibc(repair_wheel(plain, tmp_path / "out2").plat) < (2, 34)


def test_a_plat_older_than_the_symbols_allow_is_refused(tmp_path):
    wheel = pack_ext_wheel(tmp_path, extra_c=PTHREAD)
    with pytest.raises(BadInput, match=r"manylinux_2_28.*need manylinux_2_34") as exc:
        repair_wheel(wheel, tmp_path / "out", plat="manylinux_2_28")
    assert "\n" not in str(exc.value) and not list((tmp_path / "out").glob("*.whl"))


def test_a_plat_older_than_the_image_is_refused_and_the_image_tag_is_the_default(tmp_path):
    wheel = pack_ext_wheel(tmp_path)  # symbols alone would allow an old tag
    debian12 = "manylinux_2_34_x86_64"  # what the Debian 12 base image records
    with pytest.raises(BadInput, match=r"--plat: 'manylinux_2_28': older than the build image's glibc") as exc:
        repair_wheel(wheel, tmp_path / "out", plat="manylinux_2_28", floor_plat=debian12)
    assert debian12 in str(exc.value) and "\n" not in str(exc.value)
    res = repair_wheel(wheel, tmp_path / "out", floor_plat=debian12)
    assert res.plat == debian12 and res.wheel.name.endswith("-cp311-cp311-manylinux_2_34_x86_64.whl")
    # asking for exactly the image's tag (or newer, up to this host) is fine
    assert repair_wheel(wheel, tmp_path / "out3", plat=host_plat(), floor_plat=debian12).plat == host_plat()


GLIBC_2_35 = """
#define _GNU_SOURCE
#include <dlfcn.h>
void *farm_needs_glibc_2_35 = (void *)&_dl_find_object;
"""


def test_a_wheel_needing_a_newer_glibc_than_the_image_tag_gets_the_tag_it_needs(tmp_path):
    # The image's tag is a floor (what its toolchain gives plain C++), not a ceiling: drtk calls a
    # glibc 2.35 function, which the Debian 12 image (glibc 2.36) links, so its wheel is 2_35.
    wheel = pack_ext_wheel(tmp_path, extra_c=GLIBC_2_35)
    debian12 = "manylinux_2_34_x86_64"
    res = repair_wheel(wheel, tmp_path / "out", floor_plat=debian12)
    assert res.plat == "manylinux_2_35_x86_64" and res.wheel.name.endswith("-manylinux_2_35_x86_64.whl")
    assert "raised to manylinux_2_35_x86_64" in res.reason and res.record()["reason"] == res.reason
    # An explicit request is never raised: it is refused in one line, nothing written.
    with pytest.raises(BadInput, match=r"--plat: 'manylinux_2_34_x86_64'.*need manylinux_2_35") as exc:
        repair_wheel(wheel, tmp_path / "out2", plat=debian12, floor_plat=debian12)
    assert "\n" not in str(exc.value) and not list((tmp_path / "out2").glob("*.whl"))


def test_pure_wheels_are_not_repaired_and_windows_wheels_go_to_their_platform(tmp_path):
    pure = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(pure, "w") as z:
        z.writestr("demo/__init__.py", "")
    res = repair_wheel(pure, tmp_path / "out", wheel_abi="pure")
    assert not res.repaired and res.wheel == pure and "pure" in res.reason
    # A Windows wheel cannot be built here; its name is enough. auditwheel's repair refuses it in one
    # line, and the build platform seam passes it through untouched with the Windows note.
    win = tmp_path / "demo-1.0-cp311-cp311-win_amd64.whl"
    win.write_bytes(pure.read_bytes())
    with pytest.raises(RepairError, match="Windows wheel is not repaired by auditwheel") as exc:
        repair_wheel(win, tmp_path / "out", platform="windows")
    assert "\n" not in str(exc.value)
    res = for_cell("windows").repair(win, tmp_path / "out", torch_env=None, plat=None, floor_plat=None,
                                     allow_graft=(), wheel_abi="cpython")
    assert not res.repaired and res.wheel == win and "windows" in res.reason
    assert not (tmp_path / "out").exists()
