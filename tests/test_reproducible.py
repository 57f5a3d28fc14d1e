"""Wheel hygiene (design.md §6.4-§6.6): the source's date, deterministic zips, no host path in a wheel.

Real parts throughout: git repositories and sdists made here (served over HTTP on 127.0.0.1), gcc,
auditwheel, NVIDIA's nvcc (the PyPI toolkit the farm provisions) and ccache. The end-to-end check
of a built wheel (farm_build.json and the .so strings) is in test_build.py's check_demo_wheel; the
comparison of two real builds is `python -m bench reproducible`.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
from test_source import git, own_cache, prep, served  # noqa: F401 (fixtures: the sdist server, a cache of its own)
from wheel_builder import pack_ext_wheel

from farm.archlist import ArchList
from farm.build.ccache import cache_env, nvcc_namespace, read_stats_log, resolve_in_step
from farm.build.compile import compile_environment, nvcc_in_own_pid_namespace
from farm.build.hostpaths import (
    host_folders,
    host_paths_in,
    nvcc_prefix_map_flags,
    portable,
    prefix_map_flags,
    python_include_dirs,
)
from farm.build.label import label_wheel, zip_time
from farm.build.repair import repair_wheel
from farm.build.source.base import ZIP_EPOCH
from farm.build.wheeldiff import compare_wheels, host_strings

# ------------------------------------------------------------------ SOURCE_DATE_EPOCH of each kind of source


def dated_commit(repo: Path, files: dict[str, str], committed: int, authored: int) -> str:
    for rel, text in files.items():
        (repo / rel).write_text(text)
    env = {**os.environ, "GIT_COMMITTER_DATE": f"@{committed} +0000", "GIT_AUTHOR_DATE": f"@{authored} +0000"}
    for args in (["add", "-A"], ["commit", "-q", "-m", "change"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, env=env, check=True)
    return git(repo, "rev-parse", "HEAD")


def test_a_git_source_is_dated_by_its_pinned_commits_committer_date(tmp_path):
    repo = tmp_path / "up" / "demo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    first = dated_commit(repo, {"setup.py": "1\n"}, committed=1_700_000_000, authored=1_600_000_000)
    git(repo, "tag", "v1.0")
    dated_commit(repo, {"setup.py": "2\n"}, committed=1_710_000_000, authored=1_710_000_000)
    res = prep({"git": {"url": f"file://{repo}", "ref": "v1.0", "commit": first}}, tmp_path / "work")
    # the committer date of the pinned commit: not the author date, not a later commit, not the fetch time
    assert res.source_date_epoch == 1_700_000_000
    assert res.record()["source_date_epoch"] == 1_700_000_000


def sdist_bytes(members: list[tuple[str, int]], kind: str) -> bytes:
    buf = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buf, "w") as zf:
            for name, mtime in members:
                zf.writestr(zipfile.ZipInfo(name, time.gmtime(mtime)[:6]), "x = 1\n")
    else:
        with tarfile.open(fileobj=buf, mode="w:gz") as tf:
            for name, mtime in members:
                info = tarfile.TarInfo(name)
                info.size, info.mtime = 6, mtime
                tf.addfile(info, io.BytesIO(b"x = 1\n"))
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_an_sdist_is_dated_by_its_newest_member(served, tmp_path, kind):  # noqa: F811
    import hashlib

    root, base = served
    newest = 1_660_000_010   # even: a zip holds times in 2 s steps
    data = sdist_bytes([("demo-1.0/setup.py", 1_650_000_000), ("demo-1.0/demo/__init__.py", newest),
                        ("demo-1.0/PKG-INFO", 1_655_000_000)], kind)
    (root / f"demo-1.0.{kind}").write_bytes(data)
    res = prep({"sdist": {"url": f"{base}/demo-1.0.{kind}", "sha256": hashlib.sha256(data).hexdigest()}},
               tmp_path / "work")
    assert res.source_date_epoch == newest   # the archive's own times, never the extraction's


def test_an_sdist_whose_members_carry_no_date_gets_the_zip_epoch(served, tmp_path):  # noqa: F811
    import hashlib

    root, base = served
    data = sdist_bytes([("demo-1.0/setup.py", 0)], "tar.gz")
    (root / "demo-1.0.tar.gz").write_bytes(data)
    res = prep({"sdist": {"url": f"{base}/demo-1.0.tar.gz", "sha256": hashlib.sha256(data).hexdigest()}},
               tmp_path / "work")
    assert res.source_date_epoch == ZIP_EPOCH


def test_a_path_source_is_dated_1980_whatever_its_files_times(tmp_path):
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "setup.py").write_text("x\n")
    os.utime(folder / "setup.py", (1_700_000_000, 1_700_000_000))
    one = prep({"path": "pkg"}, tmp_path / "work")
    os.utime(folder / "setup.py")   # touched now: same content, so the same pin and the same date
    two = prep({"path": "pkg"}, tmp_path / "work2")
    assert one.pin == two.pin and one.source_date_epoch == two.source_date_epoch == ZIP_EPOCH
    assert time.gmtime(ZIP_EPOCH)[:6] == (1980, 1, 1, 0, 0, 0)


# ------------------------------------------------------------------ the zip layer: label and repair


def raw_wheel(path: Path, entries: list[tuple[str, bytes]], when: tuple) -> Path:
    """A compile's wheel as a backend may zip it: `entries` in the given order, each at time `when`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, when)
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return path


ENTRIES = [
    ("demo/zeta.py", b"z = 1\n"),
    ("demo-1.0.dist-info/WHEEL", b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n"),
    ("demo/__init__.py", b"a = 1\n"),
    ("demo-1.0.dist-info/METADATA", b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n"),
    ("demo-1.0.dist-info/RECORD", b""),
    ("demo/_ext.so", b"\x7fELF not really\n"),
]
WHEEL_NAME = "demo-1.0-cp311-cp311-linux_x86_64.whl"
EPOCH = 1_700_000_000


def label(raw: Path, out: Path, epoch: int | None) -> Path:
    return label_wheel(raw, out, local_label="cu130torch2.13", build_info={"cell": "c", "build_key": "k"},
                       source_date_epoch=epoch)


def test_two_labels_of_the_same_build_are_byte_identical_whatever_the_backend_zipped(tmp_path):
    # the same files, zipped by two compiles: another order, other times (a backend's "now")
    a = raw_wheel(tmp_path / "a" / WHEEL_NAME, ENTRIES, (2026, 12, 5, 10, 0, 0))
    b = raw_wheel(tmp_path / "b" / WHEEL_NAME, list(reversed(ENTRIES)), (2026, 12, 5, 11, 30, 8))
    la, lb = label(a, tmp_path / "la", EPOCH), label(b, tmp_path / "lb", EPOCH)
    assert la.read_bytes() == lb.read_bytes() and compare_wheels(la, lb) == []
    with zipfile.ZipFile(la) as zf:
        names = zf.namelist()
        assert {i.date_time for i in zf.infolist()} == {time.gmtime(EPOCH)[:6]}
    di = "demo-1.0+cu130torch2.13.dist-info"
    assert names == ["demo/__init__.py", "demo/_ext.so", "demo/zeta.py", f"{di}/METADATA", f"{di}/WHEEL",
                     f"{di}/farm_build.json", f"{di}/RECORD"]
    # the control: without the source's date the backend's times travel, and the two differ
    diffs = compare_wheels(label(a, tmp_path / "na", None), label(b, tmp_path / "nb", None))
    assert diffs and all(any(h.startswith("time") for h in d.how) for d in diffs)


def test_zip_time_is_utc_and_never_before_1980():
    assert zip_time(EPOCH) == time.gmtime(EPOCH)[:6] == (2023, 11, 14, 22, 13, 20)
    assert zip_time(0) == (1980, 1, 1, 0, 0, 0) and zip_time(None) is None


def test_two_repairs_with_the_source_date_are_byte_identical(tmp_path):
    wheel = pack_ext_wheel(tmp_path / "w")
    one = repair_wheel(wheel, tmp_path / "one", source_date_epoch=EPOCH).wheel
    time.sleep(2.1)   # a zip time has 2 s steps: without the date, the second repair's "now" would show
    two = repair_wheel(wheel, tmp_path / "two", source_date_epoch=EPOCH).wheel
    assert one.read_bytes() == two.read_bytes()
    with zipfile.ZipFile(one) as zf:
        assert {i.date_time for i in zf.infolist()} == {time.gmtime(EPOCH)[:6]}


# ------------------------------------------------------------------ no host path in farm_build.json


def test_a_build_record_made_portable_names_no_host_folder(tmp_path):
    home, cache = os.path.expanduser("~"), str(tmp_path / "cache")
    work = f"{cache}/work/farm_demo-cu130-torch2.13-py311"
    folders = host_folders(work=work, cache=cache, project="/farm/project", home=home)
    info = {"cell": "farm_demo-cu130-torch2.13-py311", "arch_provenance": "arch_exceptions[12.8/2.9] (x)",
            "source": {"description": f"git file://{tmp_path}/up.git @ v1 ({work}/src)", "url": "https://x.org/a/b",
                       "extra_sources": [["third_party/cutlass", f"{tmp_path}/cutlass.git", "ab" * 20]],
                       "patches": [["recipes/patches/demo/fix.patch", "cd" * 32]], "work": f"{work}/src"},
            "farm_wheels": [{"file": f"{cache}/wheels/dep-1.0.whl"}], "note": f"{home}/x"}
    assert host_paths_in(info, [home, cache])   # what the label step is given
    out = portable(info, folders)
    assert host_paths_in(out, [home, cache]) == []
    assert out["source"]["work"] == "farm-work/src" and out["farm_wheels"][0]["file"] == "farm-cache/wheels/dep-1.0.whl"
    assert out["source"]["extra_sources"][0][1] == "<host>/cutlass.git" and out["note"] == "~/x"
    assert out["source"]["url"] == "https://x.org/a/b" and out["arch_provenance"] == info["arch_provenance"]
    assert out["source"]["patches"] == info["source"]["patches"]


# ------------------------------------------------------------------ no host path in the binaries


@pytest.fixture(scope="module")
def toolkit():
    from farm.build.provision import provision_toolkit

    return provision_toolkit("13.0", "x86_64", source="pypi")


HEADER = 'static inline const char *where_included(void) { return __FILE__; }\n'
SOURCE = '#include "pyhead.h"\nconst char *where_compiled(void) {{ return __FILE__; }}\n{extra}'


@pytest.fixture()
def host_tree(tmp_path):
    """A work folder with a source, and a Python installation's include folder with a header it uses."""
    work, prefix = tmp_path / "cache" / "work" / "cell", tmp_path / "pyenv" / "3.12.1"
    (work / "src").mkdir(parents=True)
    (prefix / "include" / "python3.12").mkdir(parents=True)
    (prefix / "include" / "python3.12" / "pyhead.h").write_text(HEADER)
    (prefix / "bin").mkdir()
    env = tmp_path / "env"
    env.mkdir()
    (env / "pyvenv.cfg").write_text(f"home = {prefix / 'bin'}\nversion = 3.12.1\n")
    return work, prefix, env


def test_the_python_headers_are_found_from_the_environment(host_tree):
    _, prefix, env = host_tree
    assert python_include_dirs(env) == [prefix / "include" / "python3.12"]


def test_gcc_objects_name_no_host_folder(host_tree, toolkit, tmp_path):
    work, prefix, env = host_tree
    c = work / "src" / "a.c"
    c.write_text(SOURCE.format(extra="const char *both(void) { return where_included(); }\n"))
    folders = host_folders(work=work, python_include=python_include_dirs(env), cache=tmp_path / "cache")
    flags = compile_environment(arch_list=ArchList.parse("8.0"), toolkit=toolkit, host_folders=folders)["CFLAGS"]
    needles = [str(tmp_path), str(work), str(prefix)]
    bare = work / "bare.o"
    subprocess.run(["gcc", "-c", f"-I{prefix}/include/python3.12", str(c), "-o", str(bare)], check=True)
    assert host_strings(bare.read_bytes(), needles)   # the control: __FILE__ names both folders
    mapped = work / "mapped.o"
    subprocess.run(["gcc", "-c", *flags.split(), f"-I{prefix}/include/python3.12", str(c), "-o", str(mapped)],
                   check=True)
    assert host_strings(mapped.read_bytes(), needles) == []
    assert {"farm-work/src/a.c", "farm-python/include/python3.12/pyhead.h"} <= set(
        host_strings(mapped.read_bytes(), ["farm-"]))


def test_the_most_specific_folder_wins_and_odd_folders_are_left_out():
    flags = prefix_map_flags(host_folders(work="/c/work/x", cache="/c", toolkit_home="/opt/my cuda"))
    assert flags == ["-ffile-prefix-map=/c=farm-cache", "-ffile-prefix-map=/c/work/x=farm-work"]   # gcc: last wins


def test_nvcc_host_code_names_no_host_folder(host_tree, toolkit, tmp_path):
    work, prefix, env = host_tree
    cu = work / "src" / "k.cu"
    cu.write_text(SOURCE.format(extra="__global__ void k(int *p) { *p = 1; }\n"))
    folders = host_folders(work=work, python_include=python_include_dirs(env), toolkit_home=toolkit.home)
    compile_env = compile_environment(arch_list=ArchList.parse("8.0"), toolkit=toolkit, host_folders=folders)
    needles = [str(tmp_path), str(work), str(prefix)]
    cmd = [str(toolkit.nvcc), "-c", str(cu), f"-I{prefix}/include/python3.12", "-gencode", "arch=compute_80,code=sm_80"]
    for name, env_flags in (("bare.o", ""), ("mapped.o", compile_env["NVCC_APPEND_FLAGS"])):
        subprocess.run([*cmd, "-o", str(work / name)], check=True,
                       env={**os.environ, "PATH": compile_env["PATH"], "NVCC_APPEND_FLAGS": env_flags})
    assert host_strings((work / "bare.o").read_bytes(), needles)   # the control
    assert host_strings((work / "mapped.o").read_bytes(), needles) == []


# ------------------------------------------------------------------ ccache and nvcc's environment flags


KERNEL = "__global__ void k(int *p) { *p = VALUE; }\nint host_value() { return VALUE; }\n"


def test_a_change_of_nvcc_append_flags_is_never_served_the_old_object(toolkit, tmp_path):
    if shutil.which("ccache") is None:
        pytest.skip("needs ccache on PATH")
    (tmp_path / "k.cu").write_text(KERNEL)
    objects = []
    for value in (1, 2):
        env = {**os.environ, "PATH": f"{toolkit.bin_dir}:{os.environ['PATH']}",
               "NVCC_APPEND_FLAGS": f"-DVALUE={value} --threads=1",
               **cache_env(enabled=True, ccache_dir=str(tmp_path / "ccache"), basedir=str(tmp_path),
                           stats_log=str(tmp_path / f"stats-{value}.log"))}
        assert resolve_in_step(env, toolkit.nvcc, tmp_path)["active"]
        assert env["CCACHE_NAMESPACE"] == nvcc_namespace(env)["CCACHE_NAMESPACE"]
        out = tmp_path / f"k{value}.o"
        subprocess.run([*env["PYTORCH_NVCC"].split(), "-c", "k.cu", "-o", str(out), "-gencode",
                        "arch=compute_80,code=sm_80"], cwd=tmp_path, env=env, check=True)
        objects.append(out.read_bytes())
        assert read_stats_log(tmp_path / f"stats-{value}.log")["misses"] == 1   # the second is no (stale) hit
    assert objects[0] != objects[1]


def test_the_namespace_follows_both_nvcc_environment_flags():
    assert nvcc_namespace({}) == {}
    one = nvcc_namespace({"NVCC_APPEND_FLAGS": "-DA"})
    assert one != nvcc_namespace({"NVCC_APPEND_FLAGS": "-DB"}) != nvcc_namespace({"NVCC_PREPEND_FLAGS": "-DA"})
    assert one == nvcc_namespace({"NVCC_APPEND_FLAGS": "-DA", "OTHER": "x"})
    # prefix maps count as being there, not by the folders they map (those differ between sibling cells)
    py311 = "-Xcompiler=-ffile-prefix-map=/w/cell-py311=farm-work -Xcompiler=-ffile-prefix-map=/usr/include/" \
            "python3.11=farm-python/include/python3.11 --threads=1"
    py312 = "-Xcompiler=-ffile-prefix-map=/root/.pyenv/versions/3.12.1/include/python3.12=farm-python/include/" \
            "python3.12 -Xcompiler=-ffile-prefix-map=/w/cell-py312=farm-work --threads=1"
    mapped = nvcc_namespace({"NVCC_APPEND_FLAGS": py311})
    assert mapped == nvcc_namespace({"NVCC_APPEND_FLAGS": py312})
    assert mapped != nvcc_namespace({"NVCC_APPEND_FLAGS": "--threads=1"})   # an object without maps names host folders


def test_sibling_cells_share_cuda_objects_through_their_prefix_maps(toolkit, tmp_path):
    """Two cells that differ only by Python compile the same .cu in work folders of their own, each mapped to
    farm-work (design.md §11.3): the second is served the first's object, which names neither folder."""
    if shutil.which("ccache") is None:
        pytest.skip("needs ccache on PATH")
    stats = []
    for sibling in ("cell-py311", "cell-py312"):
        work = tmp_path / sibling
        work.mkdir()
        (work / "k.cu").write_text(KERNEL.replace("VALUE", "7"))
        headers = tmp_path / f"prefix-{sibling}" / "include" / f"python3.{sibling[-2:]}"   # each its own Python
        folders = host_folders(work=work, python_include=[headers], toolkit_home=toolkit.home)
        env = {**os.environ, "PATH": f"{toolkit.bin_dir}:{os.environ['PATH']}",
               "NVCC_APPEND_FLAGS": " ".join(nvcc_prefix_map_flags(prefix_map_flags(folders))),
               **cache_env(enabled=True, ccache_dir=str(tmp_path / "ccache"), basedir=str(work),
                           stats_log=str(work / "stats.log"))}
        assert resolve_in_step(env, toolkit.nvcc, work)["active"]
        subprocess.run([*env["PYTORCH_NVCC"].split(), "-c", "k.cu", "-o", "k.o", "-gencode",
                        "arch=compute_80,code=sm_80"], cwd=work, env=env, check=True)
        assert host_strings((work / "k.o").read_bytes(), [str(work)]) == []
        stats.append(read_stats_log(work / "stats.log"))
    assert stats[0]["misses"] == 1 and stats[1]["hits"] == 1, stats


def test_cxx_compiles_through_the_cache_for_every_torch_and_siblings_share_them(toolkit, tmp_path):
    """torch before 2.13 runs $CXX bare, so no C++ file of a torch 2.11 or 2.12 cell was looked up. The step
    puts $CXX through a script in the cell's work folder, named as the compiler (torch's compiler check
    reads the name), and turns torch 2.13's own wrapper off: a C++ file that two sibling cells compile in
    work folders of their own misses once and is then served."""
    if shutil.which("ccache") is None:
        pytest.skip("needs ccache on PATH")
    real = shutil.which("g++")
    stats, scripts = [], []
    for sibling in ("cell-py311", "cell-py312"):
        work = tmp_path / sibling
        work.mkdir()
        (work / "b.cpp").write_text("#include <string>\nint b() { return (int)std::string(\"ab\").size(); }\n")
        env = {**os.environ, "PATH": f"{toolkit.bin_dir}:{os.environ['PATH']}", "CXX": "g++",
               **cache_env(enabled=True, ccache_dir=str(tmp_path / "ccache"), basedir=str(work),
                           stats_log=str(work / "stats.log"))}
        found = resolve_in_step(env, toolkit.nvcc, work)
        assert found["active"] and found["cxx"] == env["CXX"] == str(work / "ccache-bin" / "g++")
        assert env["TORCH_NO_COMPILER_WRAPPER"] == "1" and "CMAKE_CXX_COMPILER_LAUNCHER" not in env
        assert real in Path(env["CXX"]).read_text()
        subprocess.run([env["CXX"], "-c", "b.cpp", "-o", "b.o"], cwd=work, env=env, check=True)
        # torch's compiler check (`-v`) and the link go through the script too: they compile nothing
        subprocess.run([env["CXX"], "-v"], cwd=work, env=env, check=True, capture_output=True)
        subprocess.run([env["CXX"], "-shared", "b.o", "-o", "b.so"], cwd=work, env=env, check=True)
        stats.append(read_stats_log(work / "stats.log"))
        assert list(stats[-1]["files"]) == ["b.cpp"], stats[-1]
        scripts.append(env["CXX"])
    assert stats[0]["misses"] == 1 and stats[1]["hits"] == 1, stats
    assert scripts[0] != scripts[1]   # a script per work folder, one object for both
    # the cache off: torch's wrapper is off too, and $CXX is left as it was
    off = {"PATH": os.environ["PATH"], "CXX": "g++", **cache_env(enabled=False)}
    assert resolve_in_step(off, toolkit.nvcc, tmp_path) == {"active": False} and off["CXX"] == "g++"


CMAKE_PROJECT = """cmake_minimum_required(VERSION 3.18)
project(farm_cached LANGUAGES C CXX CUDA)
add_library(farm_cached SHARED a.c b.cpp k.cu)
"""


def test_a_cmake_build_compiles_through_the_cache_and_a_rebuild_in_a_new_folder_hits(toolkit, tmp_path):
    """A CMake project (pyg_lib's shape) never reads PYTORCH_NVCC: the cache reaches its C, C++ and CUDA
    compiles through CMAKE_<LANG>_COMPILER_LAUNCHER. A second configure and build in a fresh build folder
    (a resumed cell) is served every object."""
    from farm.build.ccache import CMAKE_LAUNCHERS, ensure_ccache

    assert ensure_ccache(log=lambda _: None), "the farm installs ccache where it can"
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(CMAKE_PROJECT)
    (src / "a.c").write_text("int a(int x) { return x + 1; }\n")
    (src / "b.cpp").write_text("#include <string>\nint b() { return (int)std::string(\"abc\").size(); }\n")
    (src / "k.cu").write_text(KERNEL.replace("VALUE", "3"))
    stats = []
    for build in ("build-1", "build-2"):
        env = {**os.environ, "PATH": f"{toolkit.bin_dir}:{os.environ['PATH']}", "CUDACXX": str(toolkit.nvcc),
               **cache_env(enabled=True, ccache_dir=str(tmp_path / "ccache"), basedir=str(tmp_path),
                           stats_log=str(tmp_path / f"{build}.log"))}
        assert resolve_in_step(env, toolkit.nvcc, tmp_path / build)["active"]
        subprocess.run(["cmake", "-S", str(src), "-B", str(tmp_path / build), "-DCMAKE_CUDA_ARCHITECTURES=80"],
                       env=env, check=True, capture_output=True)
        subprocess.run(["cmake", "--build", str(tmp_path / build)], env=env, check=True, capture_output=True)
        stats.append(read_stats_log(tmp_path / f"{build}.log"))
    # CMake's own compiler checks go through it too; the project's three files are the ones that count
    outcomes = [{Path(f).name: o for f, o in build["files"].items() if Path(f).parent.name == "src"} for build in stats]
    assert outcomes == [dict.fromkeys(["a.c", "b.cpp", "k.cu"], "miss"), dict.fromkeys(["a.c", "b.cpp", "k.cu"], "hit")]
    # without ccache in the runner the launchers go with the rest of the cache's settings
    bare = {"PATH": "/nonexistent", **cache_env(enabled=True, ccache_dir=str(tmp_path / "ccache"))}
    assert resolve_in_step(bare, toolkit.nvcc, tmp_path) == {"active": False, "why": "no ccache on the runner's PATH"}
    assert not set(CMAKE_LAUNCHERS) & set(bare)


def test_nvcc_in_a_pid_namespace_of_its_own_names_its_intermediate_file_the_same_every_time(toolkit, tmp_path):
    (tmp_path / "k.cu").write_text(KERNEL)
    env: dict[str, str] = {}
    if not nvcc_in_own_pid_namespace(env, toolkit.nvcc):
        pytest.skip("no pid namespace can be made here (not root, or in a container: it has its own)")
    compile_ = ["-c", "k.cu", "-DVALUE=1", "-gencode", "arch=compute_80,code=sm_80", "-o"]
    path = {**os.environ, "PATH": f"{toolkit.bin_dir}:{os.environ['PATH']}"}
    for name, nvcc in (("a.o", env["PYTORCH_NVCC"]), ("b.o", env["PYTORCH_NVCC"]), ("bare.o", str(toolkit.nvcc))):
        subprocess.run([*nvcc.split(), *compile_, name], cwd=tmp_path, env=path, check=True)
    named = {n: host_strings((tmp_path / n).read_bytes(), ["tmpxft_"]) for n in ("a.o", "b.o", "bare.o")}
    assert named["a.o"] == named["b.o"] == ["tmpxft_00000001_00000000-6_k.cudafe1.cpp"]
    assert (tmp_path / "a.o").read_bytes() == (tmp_path / "b.o").read_bytes()
    assert named["bare.o"] != named["a.o"]   # the control: nvcc's own pid, a new one every call


# ------------------------------------------------------------------ saying what differs


def shared_object(folder: Path, helper: str) -> bytes:
    """A tiny .so whose one local function is named `helper` (the .strtab differs, nothing that runs)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "m.c").write_text(f"static int {helper}(void) {{ return 1; }}\nint api(void) {{ return {helper}(); }}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(folder / "m.so"), str(folder / "m.c")], check=True)
    return (folder / "m.so").read_bytes()


def test_two_wheels_are_compared_per_entry_and_per_elf_section(tmp_path):
    one = shared_object(tmp_path / "1", "tmpxft_0001f_helper")
    two = shared_object(tmp_path / "2", "tmpxft_0002a_helper")
    a = raw_wheel(tmp_path / "a.whl", [("demo/m.so", one), ("demo/x.py", b"1")], (2020, 1, 1, 0, 0, 0))
    b = raw_wheel(tmp_path / "b.whl", [("demo/m.so", two), ("demo/x.py", b"1")], (2020, 1, 1, 0, 0, 2))
    (so, py) = compare_wheels(a, b)
    assert so.name == "demo/m.so" and "bytes" in so.how and py.how == ["time (2020, 1, 1, 0, 0, 0) vs (2020, 1, 1, 0, 0, 2)"]
    assert ".strtab" in so.sections
    assert so.sections[".strtab"]["only_a"] == ["tmpxft_0001f_helper"]
    assert so.sections[".strtab"]["only_b"] == ["tmpxft_0002a_helper"]
    assert any("only in b: tmpxft_0002a_helper" in line for line in so.lines())
    assert compare_wheels(a, a) == []
    assert json.dumps(so.sections)   # the bench prints and keeps it
