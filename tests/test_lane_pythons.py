"""The Pythons a container lane has, said before any set-up, and the CPythons the farm builds for the
emulated aarch64 lane (design.md §8.4).

The quick tests run in `make test`: the lane's facts, `farm plan`'s and the nox sessions' per-cell
"cannot build here", `farm build` refusing such a cell before any image work, and the source
tarball's checksum against a real HTTP server on 127.0.0.1. The `arm`-marked test builds CPython
3.13 for real in the arm64 builder image under QEMU (long: `make test-arm`).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from farmcli import PROJECT, run_farm

from farm.errors import ImageError
from farm.platforms import host_arch
from farm.runners import cpython

EMULATED = "aarch64" if host_arch() == "x86_64" else "x86_64"
MISSING = "farm_demo-cu130-torch2.13-py312-aarch64"   # Debian's archive carries no CPython 3.12
BUILT_BY_FARM = "farm_demo-cu130-torch2.13-py313-aarch64"
DEBIANS = "farm_demo-cu130-torch2.13-py311-aarch64"


@pytest.fixture
def fresh_facts():
    cpython.lane_pythons.cache_clear()
    yield
    cpython.lane_pythons.cache_clear()


@pytest.mark.skipif(host_arch() != "x86_64", reason="the emulated lane here is aarch64 on an x86_64 host")
def test_the_emulated_lane_has_debians_python_and_the_ones_the_farm_builds(fresh_facts):
    have = cpython.lane_pythons("aarch64")
    assert have["3.11"].startswith("Debian bookworm")
    assert "3.13" in have and "trixie" in have["3.13"] and "3.12" not in have and "3.10" not in have
    assert cpython.buildable("aarch64", "3.13") and not cpython.buildable("aarch64", "3.12")
    assert not cpython.buildable("x86_64", "3.13")   # the host's own lane mounts the host's Pythons
    why = cpython.why_no_python("aarch64", "3.12")
    assert why and "no CPython 3.12" in why and "3.11, 3.13" in why and "\n" not in why
    assert cpython.why_no_python("aarch64", "3.13") is None


def test_the_hosts_lane_lists_its_pyenv_pythons(tmp_path, monkeypatch, fresh_facts):
    """A pyenv prefix is a folder with bin/python3: the host's lane counts it without running anything
    (an empty cache: no image record of this machine adds the Pythons it mounted)."""
    prefix = tmp_path / "versions" / "3.12.4" / "bin"
    prefix.mkdir(parents=True)
    (prefix / "python3").write_text("")
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setenv("FARM_CACHE", str(tmp_path / "cache"))
    have = cpython.lane_pythons(host_arch())
    assert have.get("3.12") == "this host's pyenv" and "3.11" in have
    assert "3.10" not in have and "not in the" in (cpython.why_no_python(host_arch(), "3.10") or "")


def test_plan_says_up_front_which_cells_cannot_build_here():
    """The reason comes from the lane's facts: no image is built or asked for it."""
    res = run_farm("plan", "--package", "farm_demo", "--cuda", "13.0", "--torch", "2.13", "--platform",
                   "linux_aarch64", "--format", "json")
    assert res.returncode == 0, res.stderr
    why = {c["id"]: c["cannot_build_here"] for c in json.loads(res.stdout)}
    assert why[DEBIANS] is None and why[BUILT_BY_FARM] is None
    assert "Python 3.12" in why[MISSING] and "no CPython 3.12" in why[MISSING]
    table = run_farm("plan", "--package", "farm_demo", "--cuda", "13.0", "--torch", "2.13", "--platform",
                     "linux_aarch64")
    line = next(ln for ln in table.stdout.splitlines() if ln.startswith(MISSING + " "))
    assert "cannot build here: Python 3.12" in line
    assert not any("cannot build here" in ln for ln in table.stdout.splitlines() if ln.startswith(DEBIANS + " "))
    assert table.stdout.rstrip().splitlines()[-1].startswith("6 cells, ") and "cannot build here" in \
        table.stdout.rstrip().splitlines()[-1]


def test_build_refuses_such_a_cell_before_any_image_work(tmp_path):
    """With an empty cache, any set-up would start a debootstrap: the refusal comes first, in one line."""
    cache = tmp_path / "cache"
    res = run_farm("build", MISSING, env={"FARM_CACHE": str(cache)}, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().count("\n") == 0
    assert f"{MISSING}: cannot build here: Python 3.12" in res.stderr
    assert not (cache / "images").exists() and not (cache / "tools").exists()


def test_nox_lists_the_reason_with_the_session():
    res = subprocess.run([str(Path(sys.executable).with_name("nox")), "-l"], cwd=PROJECT, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if f"build-{MISSING} " in ln)
    assert "(cannot build here: Python 3.12:" in line
    ok = next(ln for ln in res.stdout.splitlines() if f"build-{BUILT_BY_FARM} " in ln)
    assert "cannot build here" not in ok


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A Debian mirror on 127.0.0.1 serving one made-up orig tarball at its pool path."""
    root = tmp_path / "mirror"
    pool = root / "pool" / "main" / "p" / "python3.13"
    pool.mkdir(parents=True)
    body = b"not really a CPython tarball\n" * 100
    (pool / "python3.13_3.13.99.orig.tar.xz").write_bytes(body)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("FARM_DEBIAN_MIRROR", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("FARM_CACHE", str(tmp_path / "cache"))
    yield hashlib.sha256(body).hexdigest()
    server.shutdown()
    server.server_close()


def test_the_source_tarball_is_kept_only_when_its_checksum_is_the_dscs(mirror):
    bad = cpython.Source("3.13.99", "test", "0" * 64)
    with pytest.raises(ImageError, match=r"sha256 [0-9a-f]{64}, Debian's \.dsc says 0{64} \(nothing kept\)"):
        cpython.fetch_source(bad)
    assert not any(cpython.source_dir().iterdir())   # no part file, no tarball
    good = cpython.Source("3.13.99", "test", mirror)
    path = cpython.fetch_source(good)
    assert path == cpython.source_dir() / "python3.13_3.13.99.orig.tar.xz" and path.is_file()
    assert sorted(p.name for p in cpython.source_dir().iterdir()) == [path.name]
    gone = cpython.Source("3.13.98", "test", mirror)
    with pytest.raises(ImageError, match=r"cannot download CPython 3\.13\.98 from http://127\.0\.0\.1:\d+/pool/"):
        cpython.fetch_source(gone)


# ---------------------------------------------------------------- the real build (make test-arm)

@pytest.mark.arm
@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("FARM_TEST_ARM"), reason="the emulated ARM lane runs in make test-arm")
def test_cpython_313_built_in_the_arm64_image_runs_there_with_what_farm_steps_import():
    from farm.runners.container import ContainerRunner

    runner = ContainerRunner(arch="aarch64")
    path, mounts = runner.python("3.13")        # built once (QEMU, tens of minutes), then from the cache
    assert path == f"{cpython.PREFIX_ROOT}/3.13.5/bin/python3"
    [mount] = mounts
    assert mount.read_only and Path(mount.source, ".farm-ok").is_file()
    out = runner.engine.output(runner.image.ref, [path, "-c", "import platform, ssl, sqlite3, venv, sys; "
                                                  "print(platform.machine(), sys.version.split()[0])"],
                               mounts=mounts, network=False, arch="aarch64")
    assert out.split()[-2:] == ["aarch64", "3.13.5"]
    again = ContainerRunner(arch="aarch64").python("3.13")   # cached: the same prefix, nothing rebuilt
    assert again == (path, mounts)
