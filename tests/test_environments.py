"""Step 2, environments: host-side downloads for the target, an immutable base venv with the
cell's exact torch (checked), per-cell overlays for build_deps.

All real: pip against PyPI (downloads cached under farm.settings.cache_dir()), the real
torch 2.13.0 CUDA 13.0 wheel, and a venv from the host's pyenv Python 3.11.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from farm.build import downloads as D
from farm.build import environments as E
from farm.build.downloads import DownloadSet
from farm.errors import EnvironmentFailed, TorchMismatch

PY311 = Path("/root/.pyenv/versions/3.11.7/bin/python3.11")
REQ = E.EnvRequest(python="3.11", torch_pin="2.13.0", cuda="13.0", platform="linux")
CPU_TORCH = Path("/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")

needs_py311 = pytest.mark.skipif(not PY311.exists(), reason="needs the host's pyenv Python 3.11.7")


@pytest.fixture(scope="module")
def downloads():
    return E.download_environment(REQ)


@pytest.fixture(scope="module")
def base_env(downloads):
    return E.base_environment(REQ, PY311, target="host")


def test_platform_tags_spell_out_every_older_manylinux():
    tags = D.platform_tags("linux", "2.28")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_27_x86_64" in tags
    assert "manylinux_2_17_x86_64" in tags and tags[-1] == "manylinux2014_x86_64"
    assert not any(t.startswith("linux_") for t in tags)
    assert D.platform_tags("linux_aarch64", "2.34")[0] == "manylinux_2_34_aarch64"


def test_torch_comes_from_pypi_only_when_its_default_build_is_the_cells_line(monkeypatch):
    assert E.torch_index("2.13.0", "13.0", "linux").url == D.PYPI_SIMPLE
    monkeypatch.setenv("FARM_TORCH_INDEX_URL", "http://127.0.0.1:9/whl/")
    other = E.torch_index("2.13.0", "12.8", "linux")
    assert other.url == "http://127.0.0.1:9/whl/cu128" and other.extra_url == D.PYPI_SIMPLE
    assert E.torch_index("2.9.1", "13.0", "linux").url.endswith("/cu130")   # PyPI's 2.9 is 12.8
    assert E.torch_index("2.13.0+cu130", "13.0", "linux").url.endswith("/cu130")


def test_an_unreachable_torch_index_is_reported_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("FARM_TORCH_INDEX_URL", "http://127.0.0.1:9/whl")
    req = E.EnvRequest(python="3.11", torch_pin="2.13.0", cuda="12.8")
    with pytest.raises(EnvironmentFailed) as err:
        E.download_environment(req, root=tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "FARM_TORCH_INDEX_URL" in msg and "http://127.0.0.1:9/whl/cu128" in msg
    assert "unreachable" in msg


def test_an_index_that_answers_with_an_error_is_asked_once_per_download(monkeypatch, tmp_path):
    """A PyTorch index answering 503 on 127.0.0.1: the download asks it once (HEAD) and stops there, in one
    line naming the status, the index and the requirement, before pip runs."""
    import http.server
    import threading

    asked = []

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            asked.append(self.path)
            self.send_response(503)
            self.end_headers()
        do_GET = do_HEAD

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("FARM_TORCH_INDEX_URL", f"http://127.0.0.1:{server.server_port}/whl")
        req = E.EnvRequest(python="3.11", torch_pin="2.13.0", cuda="12.8")
        with pytest.raises(EnvironmentFailed) as err:
            E.download_environment(req, root=tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    msg = str(err.value)
    assert asked == ["/whl/cu128/"], asked
    assert "\n" not in msg and "HTTP 503" in msg and "torch==2.13.0" in msg and "FARM_TORCH_INDEX_URL" in msg


def test_a_project_with_only_an_sdist_is_built_into_a_pure_wheel_here_and_resolved_with_its_deps(tmp_path):
    # fvcore publishes no wheel at all; its dependencies (yacs, tabulate, ...) do
    got = D.download(["fvcore==0.1.5.post20221221"], python="3.12", platform="linux", glibc="2.36", root=tmp_path)
    names = [f.name for f in got.files]
    assert "fvcore-0.1.5.post20221221-py3-none-any.whl" in names
    assert any(n.startswith("yacs-") for n in names) and any(n.startswith("numpy-") and "cp312" in n for n in names)
    assert all(f.is_file() for f in got.files)   # the built wheel sits beside the downloaded ones
    assert json.loads(got.manifest.read_text())["built_from_sdist"] == ["fvcore==0.1.5.post20221221"]
    again = D.download(["fvcore==0.1.5.post20221221"], python="3.12", platform="linux", glibc="2.36", root=tmp_path)
    assert again.files == got.files   # from the manifest


def test_dependencies_whose_markers_hold_only_on_the_target_python_are_downloaded_too(tmp_path):
    # scikit-build-core needs tomli and exceptiongroup below Python 3.11; pip, running on this
    # interpreter, decides that marker for itself even with --python-version (llama_cpp_python's
    # py3.10 cell failed its offline install for want of them).
    older = D.download(["scikit-build-core==1.1.2"], python="3.10", platform="linux", root=tmp_path)
    names = [f.name for f in older.files]
    assert any(n.startswith("tomli-") for n in names) and any(n.startswith("exceptiongroup-") for n in names), names
    assert D.unmet_for_target(list(older.files), "3.10", "linux") == []
    # a manifest written before markers were decided for the target is not answered from
    stale = json.loads(older.manifest.read_text())
    assert stale.pop("markers_decided") is True
    stale["files"] = [n for n in stale["files"] if not n.startswith(("tomli-", "exceptiongroup-"))]
    older.manifest.write_text(json.dumps(stale))
    again = D.download(["scikit-build-core==1.1.2"], python="3.10", platform="linux", root=tmp_path)
    assert sorted(again.files) == sorted(older.files)
    # a manifest whose markers were decided is answered without opening its wheels again
    tomli = next(f for f in again.files if f.name.startswith("tomli-"))
    tomli.write_bytes(b"not a zip: reading it would raise")
    assert D.download(["scikit-build-core==1.1.2"], python="3.10", platform="linux", root=tmp_path).files == again.files
    newer = D.download(["scikit-build-core==1.1.2"], python="3.12", platform="linux", root=tmp_path)
    assert not any(f.name.startswith(("tomli-", "exceptiongroup-")) for f in newer.files)
    # the marker decision itself, for the target and not for this interpreter
    sbc = next(f for f in older.files if f.name.startswith("scikit_build_core-"))
    assert {r.split(">")[0].split("=")[0] for r in D.unmet_for_target([sbc], "3.10", "linux")} >= {"exceptiongroup",
                                                                                                  "tomli"}
    assert not any(r.startswith(("tomli", "exceptiongroup")) for r in D.unmet_for_target([sbc], "3.13", "linux"))


def test_only_a_pure_python_wheel_built_from_an_sdist_is_taken():
    assert D._pure("fvcore-0.1.5.post20221221-py3-none-any.whl")
    assert D._pure("six-1.17.0-py2.py3-none-any.whl")
    assert not D._pure("zstandard-0.25.0-cp311-cp311-linux_x86_64.whl")   # built for this host, not the target
    assert not D._pure("legacy-1.0-py2-none-any.whl")


@pytest.mark.slow
def test_downloads_are_for_the_target_and_never_twice(downloads):
    torch_whl = downloads.file_for("torch")
    assert torch_whl is not None and torch_whl.name == "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert downloads.file_for("nvidia-cuda-runtime") is not None      # CUDA 13.0 runtime wheels came along
    assert downloads.file_for("ninja") is not None
    assert not any("+cpu" in f.name for f in downloads.files)         # not this machine's CPU find-links
    t0 = time.monotonic()
    again = E.download_environment(REQ)
    assert time.monotonic() - t0 < 1.0 and again.files == downloads.files


@pytest.mark.slow
@needs_py311
def test_base_environment_has_the_exact_torch_and_records_its_arch_list(base_env):
    env = base_env
    assert env.torch_version.split("+")[0] == "2.13.0" and env.torch_cuda == "13.0"
    assert env.python_version.startswith("3.11.")
    # PAM evidence: torch's own compiled arch list, read without a GPU.
    assert env.torch_arch_flags and "sm_90" in env.torch_arch_flags.split()
    assert "9.0" in env.torch_arch_list.split()
    info = json.loads((env.path / ".farm-complete.json").read_text())
    assert info["probe"]["torch"] == env.torch_version and "torch==2.13.0" in info["pins"]
    # nvidia/cu13/include carries the cuSPARSE/cuBLAS/cuSOLVER headers torch's CUDA headers need.
    inc = [p for p in env.nvidia_include_dirs() if p.parent.name == "cu13"]
    assert inc and (inc[0] / "cusparse.h").is_file() and (inc[0] / "cublas_v2.h").is_file()
    # Immutable once complete.
    assert (env.site_packages / "torch" / "__init__.py").stat().st_mode & 0o222 == 0
    # Every header at one time, so gcc's `#pragma once` twins fold the same way in every env; no .py file.
    ops = env.site_packages / "torch" / "include" / "ATen" / "ops"
    assert {p.stat().st_mtime for p in list(ops.glob("*.h"))[:200]} == {E.HEADER_MTIME}
    assert (env.site_packages / "torch" / "__init__.py").stat().st_mtime != E.HEADER_MTIME


@pytest.mark.slow
@needs_py311
def test_second_base_environment_call_is_a_cache_hit(base_env):
    t0 = time.monotonic()
    again = E.base_environment(REQ, PY311, target="host")
    assert time.monotonic() - t0 < 3.0
    assert again.path == base_env.path and again.torch_version == base_env.torch_version


@pytest.mark.slow
@needs_py311
def test_requested_and_installed_torch_mismatch_fails_with_both_values(base_env):
    with pytest.raises(TorchMismatch) as err:
        E.check_torch(base_env.torch_version, base_env.torch_cuda, "2.13.0", "12.8", where=str(base_env.path))
    msg = str(err.value)
    assert base_env.torch_version in msg and "CUDA 13.0" in msg and "CUDA 12.8" in msg and "2.13.0" in msg
    with pytest.raises(TorchMismatch):
        E.check_torch("2.13.0+cu130", "13.0", "2.13.1", "13.0")
    E.check_torch("2.8.0+cu128", "12.8", "2.8.0", "12.8")


@pytest.mark.slow
@needs_py311
@pytest.mark.skipif(not CPU_TORCH.exists(), reason="needs this machine's CPU torch wheel")
def test_a_cpu_torch_in_the_base_fails_the_check_and_leaves_no_complete_env(downloads, tmp_path):
    # The real trap on this machine: pip's find-links offer a CPU torch 2.13.0 for `torch==2.13.0`.
    pure = [f for f in downloads.files if f.name.endswith("-none-any.whl") and "cuda_toolkit" not in f.name]
    fake = DownloadSet(("torch==2.13.0",), (CPU_TORCH, *pure), downloads.manifest)
    with pytest.raises(TorchMismatch) as err:
        E.base_environment(REQ, PY311, target="cpu-trap", downloads=fake, root=tmp_path)
    msg = str(err.value)
    assert "2.13.0+cpu" in msg and "CUDA none" in msg and "CUDA 13.0" in msg
    assert not list((tmp_path / "envs").glob("*/.farm-complete.json"))
    assert not [p for p in (tmp_path / "envs").iterdir() if not p.name.startswith(".")]


@pytest.mark.slow
@needs_py311
def test_overlay_adds_build_deps_over_the_read_only_base_with_pins_recorded(base_env):
    dl = E.download_build_deps(REQ, ["pybind11"])
    overlay = E.overlay_environment(base_env, ["pybind11"], downloads=dl, req=REQ)
    assert overlay.base == base_env.path and overlay.path != base_env.path
    assert any(p.startswith("pybind11==") for p in overlay.pins)
    assert not any(p.startswith("torch==") for p in overlay.pins)          # torch stays in the base
    assert not (overlay.site_packages / "torch").exists()
    out = os.popen(f"{overlay.python} -c 'import pybind11, torch; print(torch.__file__)'").read()
    assert str(base_env.site_packages) in out
    assert E.overlay_environment(base_env, [], req=REQ) is base_env
    # the base's console scripts stay on the compile's PATH (cumm's build runs `ninja` itself)
    assert overlay.bin_dirs() == [overlay.python.parent, base_env.path / "bin"]
    assert (base_env.path / "bin" / "ninja").exists() and not (overlay.python.parent / "ninja").exists()
    t0 = time.monotonic()
    E.overlay_environment(base_env, ["pybind11"], req=REQ)
    assert time.monotonic() - t0 < 2.0


def test_build_deps_markers_are_decided_for_the_target_not_the_host():
    # this host's pip runs on 3.11; the cell is 3.12: pip alone would take the first line
    on_312 = E.EnvRequest(python="3.12", torch_pin="2.13.0", cuda="13.0", platform="linux")
    deps = ['six==1.16.0; python_version < "3.12"', 'six==1.17.0; python_version >= "3.12"',
            'pywin32==311; sys_platform == "win32"']
    assert E.for_target(deps, on_312) == ["six==1.17.0"]
    win_310 = E.EnvRequest(python="3.10", torch_pin="2.13.0", cuda="13.0", platform="windows")
    assert E.for_target(deps, win_310) == ["pywin32==311", "six==1.16.0"]
    arm = E.EnvRequest(python="3.13", torch_pin="2.13.0", cuda="13.0", platform="linux_aarch64")
    assert E.for_target(['a; platform_machine == "aarch64"', 'b; platform_machine == "x86_64"'], arm) == ["a"]
    got = E.download_build_deps(on_312, deps)
    assert got is not None and [f.name for f in got.files] == ["six-1.17.0-py2.py3-none-any.whl"]


@needs_py311
def test_overlay_installs_build_requires_farm_wheels_without_their_deps_keyed_by_sha256(base_env, tmp_path):
    """The cell's build_requires_farm wheels go into its overlay with --no-deps (their requirement here is on
    no index at all), after build_deps; a wheel whose bytes are not the keyed ones is refused."""
    import subprocess

    from wheelhouse_fixtures import make_wheel

    from farm.wheelhouse.maintain import file_sha256

    def dep_wheel(folder: Path, answer: int) -> tuple[Path, str]:
        wheel = make_wheel(folder, name="farm_dep", version="0.1.0+cu130torch2.13",
                           tags="cp311-cp311-manylinux_2_34_x86_64", payload=f"ANSWER = {answer}\n",
                           metadata_extra="Requires-Dist: farm-test-not-on-any-index\n")
        return wheel, file_sha256(wheel)

    root = tmp_path / "cache"
    first = dep_wheel(tmp_path / "a", 41)
    overlay = E.overlay_environment(base_env, [], farm_wheels=[first], req=REQ, root=root)
    assert overlay.base == base_env.path and overlay.path.parent == root / "overlays"
    assert any(p.replace("-", "_") == "farm_dep==0.1.0+cu130torch2.13" for p in overlay.pins)
    assert overlay.info["farm_wheels"] == [{"file": first[0].name, "sha256": first[1]}]
    out = subprocess.run([str(overlay.python), "-c", "import farm_dep, torch; print(farm_dep.ANSWER, torch.__file__)"],
                         capture_output=True, text=True, env=D.isolated_pip_env())
    assert out.returncode == 0, out.stderr
    answer, torch_file = out.stdout.split()
    assert answer == "41" and torch_file.startswith(str(base_env.site_packages))
    base_sees = subprocess.run([str(base_env.python), "-c", "import farm_dep"], capture_output=True, text=True)
    assert base_sees.returncode != 0                                      # the base stays as it was
    # NVIDIA's runtime wheels sit beside the farm wheels, where a torch-free one's RPATH looks for them
    beside = overlay.site_packages / "nvidia"
    assert beside.is_symlink() and beside.resolve() == (base_env.site_packages / "nvidia").resolve()
    assert (beside / "cu13" / "lib" / "libcudart.so.13").is_file()

    second = dep_wheel(tmp_path / "b", 42)                                # a rebuilt dependency: its own overlay
    assert E.overlay_environment(base_env, [], farm_wheels=[second], req=REQ, root=root).path != overlay.path
    assert E.overlay_environment(base_env, [], farm_wheels=[first], req=REQ, root=root).path == overlay.path

    with pytest.raises(EnvironmentFailed) as err:                       # bytes that are not the keyed ones
        E.overlay_environment(base_env, [], farm_wheels=[(second[0], "0" * 64)], req=REQ, root=root)
    assert second[0].name in str(err.value) and second[1][:12] in str(err.value)
    left = sorted(p.name for p in (root / "overlays").iterdir() if p.is_dir())
    assert len(left) == 2 and overlay.path.name in left                   # the refused one left nothing behind


def test_a_failed_install_names_pips_error_not_its_resolver_chatter():
    script = ("import sys; print('ERROR: Cannot install numpy==2.2.6 because these package versions have "
              "conflicting dependencies.', file=sys.stderr); "
              "[print(f'INFO: pip is looking at multiple versions of {n} to determine which version is compatible "
              "with other requirements. This could take a while.') for n in ('numpy', 'cmake', 'ninja', 'tomli')]; "
              "[print(f'Processing /tmp/wheels/{n}-1.0-py3-none-any.whl') for n in 'abcdef']; "
              "sys.exit(1)")
    with pytest.raises(EnvironmentFailed) as err:
        E._run([sys.executable, "-c", script], None, "installing build_deps")
    message = str(err.value)
    assert "ERROR: Cannot install numpy==2.2.6" in message and "INFO:" not in message and "Processing" not in message


def test_a_download_never_evicts_the_files_it_returns_however_tight_the_budget(tmp_path, monkeypatch):
    # CI flake: with the disk below FARM_CACHE_RESERVE_GB the budget shrank under the cache's own
    # size and the budget pass after a download removed the wheels that download was returning.
    older = tmp_path / "downloads" / "older-1.0-py3-none-any.whl"
    older.parent.mkdir(parents=True)
    older.write_bytes(b"x" * 4096)
    os.utime(older, (1, 1))
    monkeypatch.setenv("FARM_CACHE_BUDGET_GB", "0.000001")   # about a kilobyte: everything is over it
    got = D.download(["six==1.16.0"], python="3.12", platform="linux", no_deps=True, root=tmp_path)
    assert [f.name for f in got.files] == ["six-1.16.0-py2.py3-none-any.whl"]
    assert all(f.is_file() for f in got.files)
    assert not older.exists()        # what no caller holds still goes, oldest first


def test_a_download_waits_while_another_build_downloads_into_the_shared_folder(tmp_path):
    # CI flake: the demo cell's test failed in its downloads step while a rebuild beside it downloaded
    # the same CUDA wheels into the shared folder. pip takes a file it finds there for one already
    # downloaded, so it read (or deleted as a bad hash) a wheel the other pip was still copying in.
    import threading

    from farm.cachebudget import flocked

    said: list[str] = []
    waiting = threading.Event()

    def log(line: str) -> None:
        said.append(line)
        if "waiting" in line:
            waiting.set()

    got: list[D.DownloadSet] = []
    with flocked(tmp_path / "downloads" / ".pip-writer.lock"):   # another build's pip is at work
        second = threading.Thread(target=lambda: got.append(
            D.download(["six==1.16.0"], python="3.12", platform="linux", no_deps=True, root=tmp_path, log=log)))
        second.start()
        assert waiting.wait(60), said
        assert not any(" pip download " in line for line in said), said   # no pip of its own meanwhile
    second.join(120)
    assert not second.is_alive() and [f.name for f in got[0].files] == ["six-1.16.0-py2.py3-none-any.whl"]
    assert any(" pip download " in line for line in said), said


def test_stamped_headers_preprocess_to_the_same_text_in_every_env_whatever_second_pip_wrote_them(tmp_path):
    """gcc drops a `#pragma once` header whose size, whole-second mtime and bytes equal one it already
    included. torch's ATen/ops has hundreds of such twins, so two envs of one torch, installed a few
    seconds apart, preprocessed fused_ssim's ssim.cu to different text and the compiler cache missed.
    Real g++; two envs whose twins pip happened to write in one second, and across a second boundary."""
    import subprocess

    twin = "#pragma once\nnamespace at { namespace native { } }\n"
    envs = []
    for name, seconds in (("one-second", (100.2, 100.7)), ("two-seconds", (100.9, 101.1))):
        site = tmp_path / name / "site-packages"
        ops = site / "torch" / "include" / "ATen" / "ops"
        ops.mkdir(parents=True)
        for header, when in zip(("a_native.h", "b_native.h"), seconds, strict=True):
            (ops / header).write_text(twin)
            os.utime(ops / header, (when, when))
        (site / "torch" / "include" / "ATen" / "NativeFunctions.h").write_text(
            '#include <ATen/ops/a_native.h>\n#include <ATen/ops/b_native.h>\n')
        (site / "torch" / "__init__.py").write_text("")
        os.utime(site / "torch" / "__init__.py", (100, 100))
        envs.append(site)
    (tmp_path / "op.cpp").write_text("#include <ATen/NativeFunctions.h>\nint op;\n")

    def preprocessed(site: Path) -> str:
        return subprocess.run(["g++", "-E", "-P", "-I", str(site / "torch" / "include"), "op.cpp"], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout

    assert [preprocessed(e).count("namespace at") for e in envs] == [1, 2]   # what the install's timing chose
    assert [E.stamp_headers(e) for e in envs] == [3, 3]
    assert preprocessed(envs[0]) == preprocessed(envs[1])
    assert (envs[1] / "torch" / "include" / "ATen" / "ops" / "b_native.h").stat().st_mtime == E.HEADER_MTIME
    assert (envs[1] / "torch" / "__init__.py").stat().st_mtime == 100   # a .pyc would go stale
