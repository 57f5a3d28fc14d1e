"""The old-userland check (design.md §9.9): wheels installed with real pip, from the wheelhouse served
by `farm serve`'s server on 127.0.0.1, into a venv of a real Debian bullseye container (glibc 2.31) whose
CPython was compiled there, then imported as the gate imports them.

A wheel compiled on this bookworm host (its `pthread_create` binds GLIBC_2.34) is refused by pip when
tagged manylinux_2_34, and dies with `GLIBC_2.34 not found` when tagged linux_x86_64 and so installed;
the same source compiled inside the bullseye container installs and imports.

Slow on a cold machine (debootstrap and a CPython build, ~5 min); then cached under cache_dir()/images.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
from wheelhouse_fixtures import make_wheel, run_farm, served

from farm import settings
from farm.build import downloads
from farm.build.downloads import find_manifest
from farm.build.environments import torch_index
from farm.errors import BadInput, IndexUnreachable
from farm.recipes.model import Verify as VerifyKnobs
from farm.run.oldland import _knobs, check_oldland, fetch_requirements
from farm.runners import images, oldland
from farm.runners.engine import Engine, Mount, ensure_engine
from farm.wheelhouse import publish

pytestmark = [pytest.mark.slow, pytest.mark.container]

# A thread started and joined: on glibc >= 2.34 pthread_create is libc's, at GLIBC_2.34.
EXT_C = r"""
#include <Python.h>
#include <pthread.h>
static void *echo(void *p) { return p; }
static PyObject *answer(PyObject *self, PyObject *args) {
    pthread_t t; void *out = NULL;
    if (pthread_create(&t, NULL, echo, (void *)42L) != 0) return PyErr_Format(PyExc_OSError, "pthread_create");
    pthread_join(t, &out);
    return PyLong_FromLong((long)out);
}
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit__ext(void) { return PyModule_Create(&mod); }
"""
GCC = ["gcc", "-shared", "-fPIC", "-O1", "-pthread"]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return ensure_engine()


@pytest.fixture(scope="module")
def userland(engine) -> oldland.Oldland:
    return oldland.ensure_oldland(engine, quiet=True)


def glibc_needed(so: Path) -> list[str]:
    out = subprocess.run(["readelf", "-V", "--wide", str(so)], capture_output=True, text=True, check=True).stdout
    return sorted(set(re.findall(r"GLIBC_(2\.\d+)", out)), key=lambda v: tuple(map(int, v.split("."))))


@pytest.fixture(scope="module")
def extensions(tmp_path_factory, engine, userland) -> dict[str, Path]:
    """The one C source compiled twice: by this host's gcc, and by gcc inside the bullseye container."""
    folder = tmp_path_factory.mktemp("oldland-ext")
    (folder / "ext.c").write_text(EXT_C)
    assert sys.version_info[:2] == (3, 11), "the userland's CPython is 3.11: the host build must match it"
    host = folder / "host_ext.so"
    subprocess.run([*GCC, f"-I{sysconfig.get_paths()['include']}", "-o", str(host), str(folder / "ext.c")], check=True)
    # ...and one that calls the driver API: it needs libcuda.so.1, as a CUDA extension linked with -lcuda does
    (folder / "cuda_ext.c").write_text(EXT_C.replace("static PyObject *answer", "int cuInit(unsigned int);\n"
                                                     "static PyObject *answer")
                                       .replace("PyInit__ext(void) {", "PyInit__ext(void) { cuInit(0);"))
    (folder / "libcuda.c").write_text("int cuInit(unsigned int flags) { return 100; }\n")
    py = "-I/opt/python/3.11/include/python3.11"
    inside = (f"gcc -shared -fPIC -O1 -pthread {py} -o /x/old_ext.so /x/ext.c && "
              "gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o /x/libcuda.so /x/libcuda.c && "
              f"gcc -shared -fPIC -O1 -pthread {py} -o /x/cuda_ext.so /x/cuda_ext.c -L/x -lcuda")
    engine.output(userland.ref, ["sh", "-c", inside], mounts=[Mount(folder, "/x")], network=False)
    return {"host": host, "old": folder / "old_ext.so", "cuda": folder / "cuda_ext.so"}


def test_the_host_build_needs_a_newer_glibc_than_bullseye_and_the_bullseye_build_does_not(extensions):
    host, old = glibc_needed(extensions["host"]), glibc_needed(extensions["old"])
    assert tuple(map(int, host[-1].split("."))) > (2, 31), host
    assert tuple(map(int, old[-1].split("."))) <= (2, 31), old


def test_the_userlands_cpython_runs_on_glibc_2_31_with_ssl_ctypes_and_venv(engine, userland):
    python = userland.python("3.11")
    out = engine.output(userland.ref, [python, "-c", "import ssl, zlib, ctypes, venv, ensurepip, platform; "
                                                     "print(platform.libc_ver()[1], ssl.OPENSSL_VERSION)"],
                        network=False)
    assert out.split()[0] == "2.31", out


def test_a_second_call_finds_the_image_and_builds_nothing(engine, userland, monkeypatch):
    def must_not(*_a, **_kw):
        raise AssertionError("the cached userland was built again")

    monkeypatch.setattr(images, "_debootstrap", must_not)
    monkeypatch.setattr(oldland, "_build_cpython", must_not)
    monkeypatch.setattr(Engine, "build", must_not)
    assert oldland.ensure_oldland(engine, quiet=True) == userland


def test_host_built_wheels_fail_in_bullseye_and_a_bullseye_built_one_installs_and_imports(tmp_path, extensions,
                                                                                          userland):
    wheels = tmp_path / "in"
    host_so, old_so = extensions["host"].read_bytes(), extensions["old"].read_bytes()
    publish([
        # what the bookworm builder publishes today: pip on glibc 2.31 refuses the tag
        make_wheel(wheels, "oldland_refused", "0.1.0+cu130", tags="cp311-cp311-manylinux_2_34_x86_64", so=host_so),
        # the same binary under a tag pip takes: the loader refuses it
        make_wheel(wheels, "oldland_forced", "0.1.0+cu130", tags="cp311-cp311-linux_x86_64", so=host_so),
        make_wheel(wheels, "oldland_ok", "0.1.0+cu130", tags="cp311-cp311-manylinux_2_31_x86_64", so=old_so),
        # no CPython 3.12 in the userland unless one is given
        make_wheel(wheels, "oldland_py312", "0.1.0+cu130", tags="cp312-cp312-manylinux_2_28_x86_64"),
    ], tmp_path / "wh")
    out = tmp_path / "oldland.json"
    proc = run_farm("check-oldland", "--wheelhouse", tmp_path / "wh", "--out", out, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["glibc"] == "2.31" and doc["image"] == userland.ref
    assert doc["index_url"].startswith("http://127.0.0.1:")
    got = {r["file"].split("-")[0]: r for r in doc["results"]}
    assert got["oldland_ok"]["result"] == "pass", got["oldland_ok"]
    refused = got["oldland_refused"]
    assert refused["result"] == "fail"
    assert refused["reason"] == ("ERROR: oldland_refused-0.1.0+cu130-cp311-cp311-manylinux_2_34_x86_64.whl "
                                 "is not a supported wheel on this platform."), refused
    assert "GLIBC_2.34' not found" in refused["forced_import"], refused
    forced = got["oldland_forced"]
    assert forced["result"] == "fail" and "GLIBC_2.34' not found" in forced["reason"], forced
    assert forced["reason"].startswith("import oldland_forced._ext failed: ImportError")
    skipped = got["oldland_py312"]
    assert skipped["result"] == "skip" and "no CPython 3.12" in skipped["reason"]
    assert "1 installed and imported, 2 failed, 1 skipped" in proc.stdout


def test_a_wheel_the_house_does_not_hold_is_refused_in_one_line_and_nothing_is_written(tmp_path):
    publish([make_wheel(tmp_path / "in", "oldland_ok", "0.1.0+cu130", tags="py3-none-any")], tmp_path / "wh")
    out = tmp_path / "oldland.json"
    proc = run_farm("check-oldland", "--wheelhouse", tmp_path / "wh", "--wheel", "nope-1-py3-none-any.whl",
                    "--out", out, check=False)
    assert proc.returncode == 2
    assert "nope-1-py3-none-any.whl" in proc.stderr and "no such live wheel" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_a_cpython_source_must_be_a_python_org_tarball(tmp_path):
    bad = tmp_path / "cpython.tar.xz"
    bad.write_bytes(b"")
    with pytest.raises(BadInput, match="Python-X.Y.Z.tar.xz"):
        oldland.local_source(bad)
    good = tmp_path / "Python-3.12.8.tar.xz"
    good.write_bytes(b"x")
    src = oldland.local_source(good)
    assert (src.version, src.minor, src.path) == ("3.12.8", "3.12", str(good))


def test_a_dsc_checksum_is_read_for_the_named_file_only():
    dsc = ("Format: 3.0 (quilt)\nChecksums-Sha256:\n aaa 10 python3.11_3.11.2.orig.tar.gz\n"
           " bbb 20 python3.11_3.11.2-6.debian.tar.xz\nFiles:\n ccc 10 python3.11_3.11.2.orig.tar.gz\n")
    assert oldland._dsc_sha256(dsc, "python3.11_3.11.2.orig.tar.gz") == "aaa"
    assert oldland._dsc_sha256(dsc, "python3.11_3.11.2.orig.tar.xz") is None


def test_one_wheel_from_a_given_index_url(tmp_path, extensions, userland):
    wheels = tmp_path / "in"
    publish([make_wheel(wheels, "oldland_ok", "0.1.0+cu130", tags="cp311-cp311-manylinux_2_31_x86_64",
                        so=extensions["old"].read_bytes()),
             make_wheel(wheels, "oldland_other", "0.1.0+cu130", tags="py3-none-any")], tmp_path / "wh")
    out = tmp_path / "one.json"
    with served(tmp_path / "wh", tmp_path / "access.log") as base:
        proc = run_farm("check-oldland", "--wheelhouse", tmp_path / "wh", "--index-url", f"{base}/simple/",
                        "--wheel", "oldland_ok-0.1.0+cu130-cp311-cp311-manylinux_2_31_x86_64.whl", "--out", out)
    doc = json.loads(out.read_text())
    assert doc["index_url"] == f"{base}/simple/"
    assert [(r["file"].split("-")[0], r["result"]) for r in doc["results"]] == [("oldland_ok", "pass")], proc.stdout
    assert "/simple/oldland-ok/" in (tmp_path / "access.log").read_text()   # pip asked the given index


def check_one_wheel(tmp_path: Path, name: str, version: str, requires: str, payload: str,
                    cache: Path | None = None) -> tuple[dict, str]:
    """Publish one cp311 wheel that requires `requires` and imports it, run check-oldland on it (taking
    downloads from `cache`, the shared cache unless given): its result and the log of the step that
    installed what it requires (torch.log for torch, else pip.log)."""
    publish([make_wheel(tmp_path / "in", name, version, tags="cp311-cp311-manylinux_2_28_x86_64", payload=payload,
                        metadata_extra=f"Requires-Dist: {requires}\n")], tmp_path / "wh")
    lines: list[str] = []
    (result,) = check_oldland(tmp_path / "wh", tmp_path / "one.json", log=lines.append, cache=cache)
    assert result.result == "pass", (result, lines)
    step = "torch.log" if requires.startswith("torch") else "pip.log"
    return asdict(result), (tmp_path / "one-logs" / result.file / step).read_text()


def test_a_torch_linked_wheel_is_installed_beside_its_cells_torch_from_the_downloads_folder(tmp_path, userland):
    """torch 2.13 (manylinux_2_28) and its CUDA wheels install offline in bullseye and import (no GPU);
    the wheel's module imports torch itself. A few minutes: torch's wheels are unpacked in the container.
    The check downloads that torch itself (for the userland's Python and glibc): it does not rely on an
    earlier build having left one in the shared folder."""
    # A downloads folder of the test's own, holding links to the shared folder's wheels but none of its
    # manifests: pip finds the files already there (no 3.6 GB download), and the manifest exists only
    # if the check itself downloaded torch for the userland.
    cache = tmp_path / "cache"
    (cache / "downloads").mkdir(parents=True)
    for wheel in (settings.cache_dir() / "downloads").glob("*.whl"):
        with contextlib.suppress(OSError):
            os.link(wheel, cache / "downloads" / wheel.name)
    result, torch_log = check_one_wheel(tmp_path, "oldland_torchy", "0.1.0+cu130torch2.13", "torch==2.13.*",
                                        "import torch\nDEVICES = torch.cuda.device_count()\n", cache=cache)
    assert result["torch"] == "2.13"
    assert re.search(r"Successfully installed .*torch-2\.13\.\d", torch_log)
    # the host's own download for the userland (glibc 2.31), not a build environment's (glibc 2.28)
    assert find_manifest(["torch==2.13.*"], python="3.11", platform="linux", glibc=userland.glibc,
                         root=cache) is not None


def test_a_wheels_own_dependencies_install_from_what_the_host_downloads_for_the_userland(tmp_path, userland):
    """farm_demo needs numpy, which the container cannot take from PyPI: the host downloads what a wheel
    requires (for the userland's Python and glibc) into the folder the container's pip finds links in."""
    cache = tmp_path / "cache"   # a downloads folder of its own: the shared one may hold idna already
    _, pip_log = check_one_wheel(tmp_path, "oldland_needy", "0.1.0+cu130", "idna==3.4",
                                 "import idna\nASCII = idna.encode('bücher.example')\n", cache=cache)
    assert re.search(r"Successfully installed .*idna-3\.4", pip_log), pip_log
    assert list((cache / "downloads").glob("idna-3.4-*.whl")), "the host did not download idna into its folder"


def test_a_wheel_needing_the_driver_imports_with_the_libcuda_stub_when_its_recipe_says_so(tmp_path, extensions,
                                                                                         userland):
    wheels, so = tmp_path / "in", extensions["cuda"].read_bytes()
    publish([make_wheel(wheels, "oldland_driver", "0.1.0+cu130", tags="cp311-cp311-manylinux_2_31_x86_64", so=so),
             make_wheel(wheels, "oldland_nodriver", "0.1.0+cu130", tags="cp311-cp311-manylinux_2_31_x86_64", so=so)],
            tmp_path / "wh")
    recipes = {"oldland_driver": SimpleNamespace(verify=VerifyKnobs(needs_driver=True))}
    results = check_oldland(tmp_path / "wh", tmp_path / "driver.json", recipes=recipes, log=lambda _line: None)
    got = {r.file.split("-")[0]: r for r in results}
    assert got["oldland_driver"].result == "pass", got["oldland_driver"]
    # the same wheel without verify.needs_driver: no stub, and the loader finds no libcuda.so.1
    assert got["oldland_nodriver"].result == "fail"
    assert "libcuda.so.1: cannot open shared object file" in got["oldland_nodriver"].reason


def test_a_cell_derived_from_a_file_name_finds_its_recipes_knobs():
    entry = SimpleNamespace(cell="farm-demo-cu130-torch2.13-py311")
    knobs = VerifyKnobs(import_names=("farm_demo",))
    assert _knobs(entry, {"farm_demo": SimpleNamespace(verify=knobs)}) is knobs
    assert _knobs(entry, {"other": SimpleNamespace(verify=knobs)}) == VerifyKnobs()


def test_a_given_python_org_tarball_with_the_same_bytes_makes_the_same_userland(tmp_path, engine, userland,
                                                                                monkeypatch):
    """--cpython-source takes a minor's place by its bytes: the same tarball as Debian's gives the same
    key, so the cached image serves (a 3.12 tarball would add /opt/python/3.12 the same way)."""
    debian = oldland.fetch_source(oldland.DEBIAN_SOURCES["3.11"])
    given = tmp_path / "Python-3.11.2.tar.gz"
    given.write_bytes(debian.read_bytes())
    monkeypatch.setattr(oldland, "_build_cpython", lambda *_a, **_kw: pytest.fail("built again"))
    assert oldland.ensure_oldland(engine, [oldland.local_source(given)], quiet=True) == userland


def test_a_torch_from_an_unreachable_index_is_taken_from_the_downloads_folder_or_named_as_out_of_reach(
        tmp_path, monkeypatch):
    """A cu126 cell's torch comes from the PyTorch index (PyPI's torch 2.8 is cu128), unreachable here (a closed port on 127.0.0.1
    stands for it): with nothing in the downloads folder the wheel is out of reach, said in one line that
    names the index; once the folder holds that torch for the userland's target, nothing is fetched."""
    monkeypatch.setenv("FARM_TORCH_INDEX_URL", "http://127.0.0.1:9/whl")
    entry = SimpleNamespace(torch="2.8", cuda="12.6")
    wheel = make_wheel(tmp_path / "in", "oldland_far", "0.1.0+cu126torch2.8")
    cache = tmp_path / "cache"
    with pytest.raises(IndexUnreachable, match=r"http://127\.0\.0\.1:9/whl/cu126 is unreachable .*torch==2\.8\.\*"):
        fetch_requirements(wheel, entry, "3.11", "2.31", frozenset(), cache)

    seeded = make_wheel(cache / "downloads", "torch", "2.8.0+cu126", tags="cp311-cp311-manylinux_2_28_x86_64")
    key = downloads._manifest_key(["torch==2.8.*"], [], "3.11", "linux", "2.31", torch_index("2.8", "12.6"))
    (cache / "downloads" / downloads.MANIFESTS).mkdir(parents=True)
    (cache / "downloads" / downloads.MANIFESTS / f"{key}.json").write_text(json.dumps(
        {"requirements": ["torch==2.8.*"], "files": [seeded.name], "markers_decided": True}))
    fetch_requirements(wheel, entry, "3.11", "2.31", frozenset(), cache)   # no error: the folder answers
