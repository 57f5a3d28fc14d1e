"""One cell from source to a repaired, verified wheel (design.md §6), with real nvcc, podman and auditwheel.

The two end-to-end builds (container and host) compile the bundled farm_demo
extension for the cu130 / torch 2.13 / Python 3.11 cell; every failure case
below fails before or at the compile and must leave no wheel.
"""

from __future__ import annotations

import email.parser
import hashlib
import http.server
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest
from farmcli import PROJECT, run_farm
from owned import containers_mounting, own_processes, owner_env
from wheel_builder import demo_extension

from farm.arch.fatbin import read_fatbin
from farm.build.hostpaths import host_paths_in
from farm.build.label import read_wheel_metadata
from farm.build.wheeldiff import host_strings
from farm.platforms import plat_glibc
from farm.settings import cache_dir

CELL = "farm_demo-cu130-torch2.13-py311"
EXPECTED_SASS = {75, 80, 86, 90, 100, 120}
EXPECTED_PTX = {90, 120}


def check_demo_wheel(wheel: Path, plat_tag: str) -> None:
    assert wheel.name == f"farm_demo-0.1.0+cu130torch2.13-cp311-cp311-{plat_tag}.whl"
    meta = email.parser.Parser().parsestr(read_wheel_metadata(wheel)[0])
    assert meta.get_all("Version") == ["0.1.0+cu130torch2.13"]
    assert meta.get_all("Requires-Dist") == ["numpy"]
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    report = read_fatbin(demo_extension(wheel, wheel.parent / "extracted"))
    assert {e.sm for e in report.entries if e.kind == "SASS" and not e.variant} == EXPECTED_SASS
    assert {e.sm for e in report.entries if e.kind == "PTX"} == EXPECTED_PTX
    assert not any(e.variant for e in report.entries)
    bundled = [n for n in names if ".libs/" in n or "libcudart" in n or "libtorch" in n or "libc10" in n]
    assert bundled == []
    check_no_host_path(wheel)


def check_no_host_path(wheel: Path) -> None:
    """Neither the wheel's farm_build.json nor its binaries name a folder of the build host (design.md
    §6.4, §6.5): the home and cache folders, the cell's work dir, the Python the build ran (its prefix,
    or an image's /usr/include/python3.X), the container's mount points."""
    python = Path(json.loads((wheel.parent.parent / "spec-host.json").read_text())["python"])
    prefix = Path(os.path.realpath(python)).parent.parent
    needles = [os.path.expanduser("~"), str(cache_dir()), str(cache_dir() / "work" / CELL), "/farm/work",
               "/farm/cache", "/farm/project", str(prefix / "include") if str(prefix) == "/usr" else str(prefix)]
    with zipfile.ZipFile(wheel) as zf:
        (info_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/farm_build.json")]
        assert host_paths_in(json.loads(zf.read(info_name)), needles) == []
        binaries = [n for n in zf.namelist() if ".so" in Path(n).name]
        assert binaries and {n: host_strings(zf.read(n), needles) for n in binaries} == {n: [] for n in binaries}


def check_floor_recorded(record: dict, wheel: Path) -> None:
    """The floor the gate held the wheel to, in its build record and in the wheel's own farm_build.json: this
    machine's Debian 12 builder cannot reach torch's manylinux_2_28, and tests/conftest.py raises the floor
    to manylinux_2_34 as the Makefile does (design.md §7.8)."""
    raised = {"tag": "manylinux_2_34", "torch": "manylinux_2_28", "source": "FARM_MANYLINUX_FLOOR",
              "text": "manylinux_2_34 (torch's manylinux_2_28 not reached: +6 minor, FARM_MANYLINUX_FLOOR)"}
    assert record["floor"] == raised and record["tag"] == wheel.name[: -len(".whl")].split("-")[-1]
    with zipfile.ZipFile(wheel) as zf:
        carried = json.loads(zf.read("farm_demo-0.1.0+cu130torch2.13.dist-info/farm_build.json"))
    assert carried["floor"] == raised


def farm_build(*args, env=None, timeout=3600):
    return run_farm("build", *args, env=env, timeout=timeout)


def build_demo_cell(runner: str, out: Path) -> tuple[dict, Path]:
    """`farm build` of the demo cell on `runner` (forced, not published, an empty wheelhouse of its own so
    no earlier build of the cell gives it a build number): its build record and its one wheel."""
    res = farm_build(CELL, "--runner", runner, "--no-publish", "--force", "--out", str(out),
                     env={"FARM_WHEELHOUSE": str(out.parent / "empty-wheelhouse")})
    assert res.returncode == 0, res.stderr + res.stdout
    wheels = list((out / "wheel").glob("*.whl"))
    assert len(wheels) == 1
    return json.loads((out / "build.json").read_text()), wheels[0]


@pytest.mark.slow
@pytest.mark.container
def test_container_build_of_the_demo_cell(tmp_path):
    from farm.runners.images import load_image

    record, wheel = build_demo_cell("container", tmp_path / "out")
    image = load_image("x86_64")
    assert record["runner"] == "container" and record["image"] == image.id
    assert record["image_tag"] == image.plat
    check_demo_wheel(wheel, image.plat)
    check_floor_recorded(record, wheel)
    # The image's bullseye toolchain (design.md §8.3): installable wherever torch's manylinux_2_28 wheel is.
    # The symbols decide, not the tag: the gate's floor check, held to torch's floor, reads every ELF file's
    # versioned needs (`auditwheel show` would not do: it counts the excluded libcudart against the wheel).
    assert plat_glibc(image.plat) <= (2, 28), image.plat
    held = run_farm("verify", "--cell", CELL, "--floor", "manylinux_2_28", "--skip-import", "--format", "json",
                    str(wheel))
    assert held.returncode == 0, held.stderr + held.stdout
    (floor_check,) = [c for c in json.loads(held.stdout)["wheels"][0]["checks"] if c["name"] == "floor"]
    assert floor_check["status"] == "pass" and floor_check["details"]["floor"] == "manylinux_2_28", floor_check
    assert record["arch_list"] == "7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX"
    assert record["network"] == "none"
    assert set(record["steps"]) >= {"source", "env", "toolkit", "compile", "label", "repair", "verify"}


@pytest.mark.slow
def test_host_build_of_the_demo_cell(tmp_path):
    record, wheel = build_demo_cell("host", tmp_path / "out")
    assert record["runner"] == "host"
    check_demo_wheel(wheel, record["image_tag"])
    check_floor_recorded(record, wheel)
    assert record["network"] == ("namespace" if os.geteuid() == 0 else "open")


@pytest.mark.container
def test_plat_below_the_image_glibc_is_refused_with_one_line(tmp_path):
    out = tmp_path / "out"
    res = farm_build(CELL, "--runner", "container", "--plat", "manylinux_2_17_x86_64", "--out", str(out))
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "manylinux_2_17" in res.stderr and "glibc" in res.stderr
    assert not out.exists() or not list(out.rglob("*.whl"))


@pytest.mark.slow
@pytest.mark.container
def test_sigterm_to_farm_build_removes_its_container(tmp_path):
    """`kill` of a container build (a CI job's timeout does the same): the farm ends with 143 and its
    container goes with it, instead of compiling on with every core."""
    import signal
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "farm", "build", CELL, "--runner", "container", "--force",
                             "--no-publish", "--no-compiler-cache", "--out", str(out)], cwd=PROJECT,
                            env={**os.environ, "FARM_WHEELHOUSE": str(tmp_path / "house")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not containers_mounting(tmp_path) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        assert proc.poll() is None and containers_mounting(tmp_path), "the build never started its container"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and err.strip().splitlines()[-1:] == ["farm: terminated"], err[-2000:]
    assert containers_mounting(tmp_path) == []


# ---------------------------------------------------------------- failure cases: one line, no wheel

def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A local git repo of the demo, tarballs (good and evil) on a loopback HTTP server."""
    root = tmp_path_factory.mktemp("sources")
    repo = root / "repo"
    shutil.copytree(PROJECT / "examples" / "farm-demo", repo)
    git("init", "-q", "-b", "trunk", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "one", cwd=repo)
    git("tag", "v0.1.0", cwd=repo)
    first = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    (repo / "NOTE").write_text("two\n")
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "two", cwd=repo)
    second = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()

    www = root / "www"
    www.mkdir()
    good = io.BytesIO()
    with tarfile.open(fileobj=good, mode="w:gz") as tf:
        tf.add(PROJECT / "examples" / "farm-demo", arcname="farm_demo-0.1.0")
    (www / "good.tar.gz").write_bytes(good.getvalue())
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w:gz") as tf:
        data = b"owned\n"
        info = tarfile.TarInfo("farm_demo-0.1.0/../../escaped.txt")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    (www / "evil.tar.gz").write_bytes(evil.getvalue())

    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(www), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"repo": repo, "first": first, "second": second, "url": f"http://127.0.0.1:{server.server_port}",
           "good_sha": hashlib.sha256((www / "good.tar.gz").read_bytes()).hexdigest(),
           "evil_sha": hashlib.sha256((www / "evil.tar.gz").read_bytes()).hexdigest()}
    server.shutdown()


def recipe_text(name: str, source: str, extra: str = "") -> str:
    return (f"name: {name}\nsource:\n{source}\nversion: '0.1.0'\nlinks_torch: true\nplatforms: [linux]\n"
            f"min_torch: '2.13'\nrequires_dist: [numpy]\n{extra}")


@pytest.fixture()
def recipes(tmp_path):
    folder = tmp_path / "recipes"
    folder.mkdir()
    demo = (PROJECT / "recipes" / "farm_demo.yml").read_text()
    demo = demo.replace("path: ../examples/farm-demo", f"path: {PROJECT / 'examples' / 'farm-demo'}")
    (folder / "farm_demo.yml").write_text(demo)
    return folder


def build_failing(folder: Path, cell: str, tmp_path: Path):
    out = tmp_path / "out"
    res = farm_build(cell, "--runner", "host", "--no-publish", "--out", str(out),
                     env={"FARM_RECIPES": str(folder)}, timeout=900)
    assert res.returncode != 0, res.stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert not list(tmp_path.rglob("*.whl"))
    return lines[0]


def test_sdist_with_a_wrong_sha256_fails(recipes, sources, tmp_path):
    (recipes / "bad_sha.yml").write_text(recipe_text(
        "bad_sha", f"  sdist:\n    url: {sources['url']}/good.tar.gz\n    sha256: '{'0' * 64}'"))
    line = build_failing(recipes, "bad_sha-cu130-torch2.13-py311", tmp_path)
    assert "sha256" in line and sources["good_sha"][:12] in line


def test_tarball_with_a_parent_member_is_refused(recipes, sources, tmp_path):
    (recipes / "evil_tar.yml").write_text(recipe_text(
        "evil_tar", f"  sdist:\n    url: {sources['url']}/evil.tar.gz\n    sha256: '{sources['evil_sha']}'"))
    line = build_failing(recipes, "evil_tar-cu130-torch2.13-py311", tmp_path)
    assert ".." in line
    assert not (tmp_path.parent / "escaped.txt").exists()


def test_git_ref_that_does_not_exist_fails(recipes, sources, tmp_path):
    (recipes / "no_ref.yml").write_text(recipe_text(
        "no_ref", f"  git:\n    url: file://{sources['repo']}\n    ref: v9.9.9"))
    line = build_failing(recipes, "no_ref-cu130-torch2.13-py311", tmp_path)
    assert "v9.9.9" in line


def test_tag_whose_commit_differs_from_the_recipe_fails(recipes, sources, tmp_path):
    (recipes / "moved_tag.yml").write_text(recipe_text(
        "moved_tag", f"  git:\n    url: file://{sources['repo']}\n    ref: v0.1.0\n    commit: '{sources['second']}'"))
    line = build_failing(recipes, "moved_tag-cu130-torch2.13-py311", tmp_path)
    assert sources["first"][:12] in line and sources["second"][:12] in line


def test_a_failing_patch_fails_naming_it(recipes, tmp_path):
    patches = recipes / "patches" / "bad_patch"
    patches.mkdir(parents=True)
    (patches / "0001-nope.patch").write_text(
        "--- a/setup.py\n+++ b/setup.py\n@@ -1,3 +1,3 @@\n-this line is not in setup.py\n+nor this one\n context\n")
    (recipes / "bad_patch.yml").write_text(recipe_text(
        "bad_patch", f"  path: {PROJECT / 'examples' / 'farm-demo'}", "patches:\n  - file: 0001-nope.patch\n"))
    line = build_failing(recipes, "bad_patch-cu130-torch2.13-py311", tmp_path)
    assert "0001-nope.patch" in line


# (A Windows cell refused on Linux: tests/test_windows.py.)


NETWORK_SETUP = '''
import socket
from setuptools import setup
try:
    socket.create_connection(("pypi.org", 443), timeout=10).close()
except OSError as exc:
    raise SystemExit(f"farm-test: network blocked during compile: {exc!r}")
print("farm-test: the network was reachable during compile")
setup(name="net_probe", version="0.1.0", py_modules=["net_probe"])
'''


@pytest.mark.parametrize("runner", [pytest.param("container", marks=pytest.mark.container), "host"])
def test_setup_py_opening_a_socket_fails_the_compile(recipes, tmp_path, runner):
    if runner == "host" and os.geteuid() != 0:
        pytest.skip("the host runner isolates the network only as root (else it records network: open)")
    src = tmp_path / "net_probe"
    src.mkdir()
    (src / "setup.py").write_text(NETWORK_SETUP)
    (src / "net_probe.py").write_text("")
    (recipes / "net_probe.yml").write_text(recipe_text("net_probe", f"  path: {src}").replace(
        "requires_dist: [numpy]\n", ""))
    out = tmp_path / "out"
    owner = owner_env()
    res = farm_build("net_probe-cu130-torch2.13-py311", "--runner", runner, "--no-publish", "--out", str(out),
                     env={"FARM_RECIPES": str(recipes), **owner}, timeout=1800)
    assert res.returncode == 1, res.stdout + res.stderr
    log = (out / "compile.log").read_text()
    assert "farm-test: network blocked during compile" in log
    assert "the network was reachable" not in log
    assert not list(out.rglob("*.whl"))
    assert not import_check_children(owner, tmp_path), "the import check's early child outlived the failed compile"


def import_check_children(owner: dict[str, str], folder: Path) -> list[str]:
    """Processes running farm.build.verify's import child (started with the compile step) that the test's own
    build started: on the host they carry the test's marker (owner_env()), in a container they see a mount from
    the test's folder. Another build's or test run's import child, beside this one, is never counted."""
    return own_processes(owner, folder, b"FARM-IMPORT ")


def test_import_check_children_counts_only_the_tests_own(tmp_path):
    """An import child of another build (no marker, no mount of ours) is running beside: it is not counted;
    one carrying the test's marker is."""
    owner = owner_env()
    argv = [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)", "FARM-IMPORT {}",
            "/cache/envs/cu130-torch2.13-py3.11.9/bin/python"]
    theirs = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    ours = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env={**os.environ, **owner})
    try:
        assert theirs.stdout.readline() == ours.stdout.readline() == "up\n"
        assert [int(p.split(":")[0]) for p in import_check_children(owner, tmp_path)] == [ours.pid]
        assert import_check_children(owner_env(), tmp_path) == []
    finally:
        for proc in (theirs, ours):
            proc.kill()
            proc.wait()
