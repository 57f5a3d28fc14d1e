"""The manylinux floor of a cell and the gate's `floor` check (design.md §7.8).

The modules are real: compiled here with this machine's gcc 12 against Debian 12's glibc 2.36, as the
farm's Debian 12 builder compiles, and read back with binutils' readelf beside the gate's own reading.
The floor is judged by auditwheel's policy table of versioned symbols, never by the wheel's tag text.
"""

from __future__ import annotations

import json
import subprocess
import sysconfig
from pathlib import Path

import pytest
from farmcli import run_farm
from hostile import assert_one_line_refusal
from wheel_factory import PY_TAG, ext_name, make_wheel, run, torch_cuda_wheel

from farm.build.verify.expectation import Expectation
from farm.build.verify.gate import verify_wheel
from farm.errors import BadInput
from farm.floor import Floor, cell_floor, setting_floor, symbol_versions
from farm.recipes.buildrecord import check_build_record

CELL = "farm_demo-cu130-torch2.13-py311"
INIT = r"""
#include <Python.h>
static struct PyModuleDef farm_def = {PyModuleDef_HEAD_INIT, "%(name)s", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_%(name)s(void) { return PyModule_Create(&farm_def); }
"""
# pthread_once lives in libc itself since glibc 2.34: a module calling it needs GLIBC_2.34.
NEEDS_GLIBC_2_34 = r"""
#include <pthread.h>
static pthread_once_t once = PTHREAD_ONCE_INIT;
static void nothing(void) {}
int farm_once(void) { return pthread_once(&once, nothing); }
"""
# gcc 12's libstdc++ gave std::condition_variable::wait a new symbol version, GLIBCXX_3.4.30.
NEEDS_GLIBCXX_3_4_30 = r"""
#include <condition_variable>
#include <mutex>
std::mutex farm_m;
std::condition_variable farm_cv;
bool farm_ready;
extern "C" void farm_wait(void) { std::unique_lock<std::mutex> lock(farm_m); while (!farm_ready) farm_cv.wait(lock); }
"""


def module(folder: Path, source: str, *, cxx: bool = False) -> Path:
    """An importable extension module `_probe` holding `source`, compiled by this host's gcc/g++."""
    folder.mkdir(parents=True, exist_ok=True)
    init, body = folder / "init.c", folder / ("body.cpp" if cxx else "body.c")
    init.write_text(INIT % {"name": "_probe"})
    body.write_text(source)
    objects = []
    for src, compiler in ((init, "gcc"), (body, "g++" if cxx else "gcc")):
        obj = src.with_suffix(".o")
        run([compiler, "-c", "-fPIC", "-O1", f"-I{sysconfig.get_paths()['include']}", "-o", obj, src])
        objects.append(obj)
    out = folder / ext_name("_probe")
    run(["g++" if cxx else "gcc", "-shared", "-o", out, *objects])
    return out


def readelf_needs(so: Path) -> str:
    """binutils' view of the versions a file needs (the reference the gate's reading is checked with)."""
    return subprocess.run(["readelf", "-V", str(so)], capture_output=True, text=True, check=True).stdout


def probe_wheel(folder: Path, so: Path | None, *, links_torch: bool, platform_tag: str = "manylinux_2_34_x86_64"):
    files: dict[str, bytes | Path] = {"probe/__init__.py": b""}
    if so is not None:
        files[f"probe/{so.name}"] = so
    label = "cu130torch2.13" if links_torch else "cu130"
    tag = f"{PY_TAG}-{PY_TAG}-{platform_tag}" if so is not None else "py3-none-any"
    return make_wheel(folder, "probe", f"1.0+{label}", files, tag=tag)


def floor_check(wheel: Path, floor: str | None, *, links_torch: bool, platform: str = "linux"):
    exp = Expectation(name="probe", version="1.0", local_label="cu130torch2.13" if links_torch else "cu130",
                      python_tag=None, platform=platform, arch_list=None, links_torch=links_torch, floor=floor)
    return verify_wheel(wheel, exp, skip_import=True).check("floor")


@pytest.fixture(scope="module")
def glibc_module(tmp_path_factory):
    so = module(tmp_path_factory.mktemp("glibc"), NEEDS_GLIBC_2_34)
    assert "GLIBC_2.34" in readelf_needs(so)
    return so


@pytest.fixture(scope="module")
def glibcxx_module(tmp_path_factory):
    so = module(tmp_path_factory.mktemp("glibcxx"), NEEDS_GLIBCXX_3_4_30, cxx=True)
    needs = readelf_needs(so)
    assert "GLIBCXX_3.4.30" in needs and "GLIBC_2.3" not in needs   # nothing else above 2_31 in it
    return so


# ---------------------------------------------------------------- the gate's check

@pytest.mark.parametrize("links_torch", [True, False], ids=["torch-linked", "torch-free"])
def test_a_module_built_here_fails_a_floor_of_manylinux_2_31_naming_the_symbol_the_file_and_the_floor(
        tmp_path, glibc_module, links_torch):
    wheel = probe_wheel(tmp_path, glibc_module, links_torch=links_torch)
    check = floor_check(wheel, "manylinux_2_31", links_torch=links_torch)
    assert check.status == "fail"
    assert check.message == (f"probe/{glibc_module.name} needs GLIBC_2.34, above manylinux_2_31 "
                             "(allows GLIBC <= 2.31)")
    assert check.details["above"] == {f"probe/{glibc_module.name}": ["GLIBC_2.34"]}
    # the same wheel within a floor that allows what it needs
    assert floor_check(wheel, "manylinux_2_34", links_torch=links_torch).status == "pass"


def test_the_symbols_decide_not_the_tag_text(tmp_path, glibc_module):
    # tagged manylinux_2_31 (a false promise): the floor check reads the symbols and fails it all the same
    wheel = probe_wheel(tmp_path, glibc_module, links_torch=False, platform_tag="manylinux_2_31_x86_64")
    check = floor_check(wheel, "manylinux_2_31", links_torch=False)
    assert check.status == "fail" and "needs GLIBC_2.34" in check.message


def test_a_module_needing_gcc_12s_libstdcxx_fails_the_same_way(tmp_path, glibcxx_module):
    wheel = probe_wheel(tmp_path, glibcxx_module, links_torch=True)
    check = floor_check(wheel, "manylinux_2_31", links_torch=True)
    assert check.status == "fail"
    assert check.message == (f"probe/{glibcxx_module.name} needs GLIBCXX_3.4.30, above manylinux_2_31 "
                             "(allows GLIBCXX <= 3.4.28)")
    # auditwheel's manylinux_2_35 is the first policy with gcc 12's libstdc++
    assert "3.4.30" not in symbol_versions("manylinux_2_34", "linux")["GLIBCXX"]
    assert floor_check(wheel, "manylinux_2_34", links_torch=True).status == "fail"
    assert floor_check(wheel, "manylinux_2_35", links_torch=True).status == "pass"


@pytest.mark.parametrize("links_torch", [True, False], ids=["torch-linked", "torch-free"])
def test_a_pure_wheel_has_nothing_above_any_floor(tmp_path, links_torch):
    wheel = probe_wheel(tmp_path, None, links_torch=links_torch)
    check = floor_check(wheel, "manylinux_2_17", links_torch=links_torch)
    assert (check.status, check.message) == ("pass", "no ELF file: nothing above manylinux_2_17")


def test_no_floor_given_is_a_skip_and_windows_is_not_judged(tmp_path, glibc_module):
    wheel = probe_wheel(tmp_path, glibc_module, links_torch=False)
    assert floor_check(wheel, None, links_torch=False).status == "skip"
    assert floor_check(wheel, "manylinux_2_31", links_torch=False, platform="windows").status == "skip"


def test_farm_verify_takes_a_floor_and_refuses_one_that_is_not(tmp_path, glibc_module):
    wheel = probe_wheel(tmp_path, glibc_module, links_torch=False)
    args = ["verify", str(wheel), "--arch-list", "8.0", "--platform", "linux", "--cuda", "13.0", "--skip-import"]
    res = run_farm(*args, "--floor", "manylinux_2_31")
    assert res.returncode == 1, res.stderr
    assert "fail floor: probe/" in res.stdout and "needs GLIBC_2.34, above manylinux_2_31" in res.stdout
    assert_one_line_refusal(run_farm(*args, "--floor", "manylinux_2_30"), needle="--floor: 'manylinux_2_30'")


# ---------------------------------------------------------------- the floor in force

def test_the_floor_is_the_torch_wheels_tag_and_the_setting_may_only_raise_it(monkeypatch):
    torch_wheel = torch_cuda_wheel()   # the file the farm downloads for the cell
    assert torch_wheel.name.endswith("-manylinux_2_28_x86_64.whl")
    monkeypatch.delenv("FARM_MANYLINUX_FLOOR", raising=False)
    assert cell_floor(torch_wheel, "linux", {}) == Floor("manylinux_2_28", "manylinux_2_28", "torch")
    assert cell_floor(torch_wheel, "linux", {}).text() == "manylinux_2_28 (torch's)"
    aarch64 = Path("torch-2.13.0-cp312-cp312-manylinux_2_28_aarch64.whl")
    assert cell_floor(aarch64, "linux_aarch64", {}).tag == "manylinux_2_28"
    # the policy names another floor for a platform
    assert cell_floor(torch_wheel, "linux", {"linux": "manylinux_2_31"}).text() == \
        "manylinux_2_31 (torch's manylinux_2_28 not reached: +3 minor, policy)"

    monkeypatch.setenv("FARM_MANYLINUX_FLOOR", "manylinux_2_34")
    raised = cell_floor(torch_wheel, "linux", {})
    assert raised == Floor("manylinux_2_34", "manylinux_2_28", "FARM_MANYLINUX_FLOOR")
    assert raised.text() == "manylinux_2_34 (torch's manylinux_2_28 not reached: +6 minor, FARM_MANYLINUX_FLOOR)"
    assert check_build_record("build.json", {"floor": raised.record()})["floor"]["torch"] == "manylinux_2_28"

    monkeypatch.setenv("FARM_MANYLINUX_FLOOR", "manylinux_2_17")
    with pytest.raises(BadInput, match="FARM_MANYLINUX_FLOOR: 'manylinux_2_17': may only raise the floor, and "
                                       r"linux's is manylinux_2_28 \(torch\)"):
        cell_floor(torch_wheel, "linux", {})


@pytest.mark.parametrize("value", ["manylinux_2_34_x86_64", "manylinux2014", "manylinux_2_30", "2.31", "banana"])
def test_a_setting_that_is_no_floor_is_refused(monkeypatch, value):
    monkeypatch.setenv("FARM_MANYLINUX_FLOOR", value)
    with pytest.raises(BadInput, match="FARM_MANYLINUX_FLOOR: .*expected a manylinux_X_Y tag auditwheel has a "
                                       r"policy for \(manylinux_2_17, .*manylinux_2_28, manylinux_2_31"):
        setting_floor()


def test_farm_build_refuses_a_bad_setting_in_one_line_before_any_work(tmp_path):
    out = tmp_path / "out"
    res = run_farm("build", CELL, "--runner", "host", "--out", str(out), env={"FARM_MANYLINUX_FLOOR": "2.31"})
    assert_one_line_refusal(res, needle="FARM_MANYLINUX_FLOOR: '2.31': expected a manylinux_X_Y tag")
    assert not out.exists()


def test_farm_build_refuses_a_setting_that_would_lower_the_torch_floor(tmp_path):
    out = tmp_path / "out"
    res = run_farm("build", CELL, "--runner", "host", "--force", "--no-publish", "--out", str(out),
                   env={"FARM_MANYLINUX_FLOOR": "manylinux_2_17", "FARM_WHEELHOUSE": str(tmp_path / "house")},
                   timeout=1200)
    assert_one_line_refusal(res, needle="FARM_MANYLINUX_FLOOR: 'manylinux_2_17': may only raise the floor")
    assert not list(out.rglob("*.whl"))
    steps = json.loads((out / "steps.json").read_text()) if (out / "steps.json").exists() else {}
    assert "compile" not in steps   # refused once torch's tag was known, before anything compiled


def test_a_policy_floor_that_is_no_floor_is_refused(tmp_path):
    from farmcli import copy_defaults

    defaults = copy_defaults(tmp_path)
    policy = defaults / "python_cuda_torch_os_policy.yml"
    policy.write_text(policy.read_text().replace("manylinux_floor: {}", "manylinux_floor: {windows: manylinux_2_28}"))
    res = run_farm("plan", "--package", "farm_demo", env={"FARM_DEFAULTS": str(defaults)})
    assert_one_line_refusal(res, needle="manylinux_floor[windows]: 'windows': a manylinux floor is for linux or "
                                        "linux_aarch64")


# ---------------------------------------------------------------- a real build on this machine's builder

@pytest.mark.slow
def test_the_demo_built_here_fails_a_cell_whose_floor_is_manylinux_2_31_and_its_record_says_so(tmp_path):
    """The issue's case: torch's floor manylinux_2_28, raised to 2_31 for a builder that reaches it; this
    machine's Debian 12 does not, so the gate fails the wheel, and the failed record keeps the floor."""
    from farmcli import PROJECT

    recipes = tmp_path / "recipes"   # farm_demo alone, so that --record writes here, not into the checkout
    (recipes / "records").mkdir(parents=True)
    demo = (PROJECT / "recipes" / "farm_demo.yml").read_text()
    (recipes / "farm_demo.yml").write_text(demo.replace("path: ../examples/farm-demo",
                                                        f"path: {PROJECT / 'examples' / 'farm-demo'}"))
    out = tmp_path / "out"
    res = run_farm("build", CELL, "--runner", "host", "--force", "--no-publish", "--record", "--out", str(out),
                   env={"FARM_MANYLINUX_FLOOR": "manylinux_2_31", "FARM_RECIPES": str(recipes),
                        "FARM_WHEELHOUSE": str(tmp_path / "house")}, timeout=3600)
    line = assert_one_line_refusal(res, code=1)   # the CLI shortens a long line in its middle
    assert "verify failed: floor: farm_demo/_C.cpython-311-x86_64-linux-gnu.so" in line and \
        "manylinux_2_31 (allows GLIBC <= 2.31)" in line
    report = json.loads((out / "verify.json").read_text())
    floor = next(c for c in report["checks"] if c["name"] == "floor")
    # GLIBC_2.32, as the issue measured; auditwheel has no policy between 2_31 and 2_34, hence the tag below
    assert (floor["status"], floor["message"]) == ("fail", "farm_demo/_C.cpython-311-x86_64-linux-gnu.so needs "
                                                           "GLIBC_2.32, above manylinux_2_31 (allows GLIBC <= 2.31)")
    assert not list(out.glob("wheel/*.whl"))   # the gate's verdict: no wheel to publish
    record = json.loads((recipes / "records" / "farm_demo.json").read_text())
    assert record["tier"] == "failed" and record["gate"].startswith("fail: floor")
    assert record["floor"] == {"tag": "manylinux_2_31", "torch": "manylinux_2_28", "source": "FARM_MANYLINUX_FLOOR",
                               "text": "manylinux_2_31 (torch's manylinux_2_28 not reached: +3 minor, "
                                       "FARM_MANYLINUX_FLOOR)"}
    assert record["tag"] == "manylinux_2_34_x86_64"   # what the wheel reached, above the floor
