"""The compile step's PEP 517 frontend: the backend a source declares, its build_wheel hook only (pip
would also run the metadata hook, which for torch extensions runs setup.py and imports torch twice)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from owned import processes_mentioning

from farm.build.compile import compile_wheel
from farm.errors import CompileFailed

BACKEND = '''
import os, zipfile

def _log(name):
    with open(os.path.join(os.path.dirname(__file__), "..", "calls.log"), "a") as fh:
        fh.write(name + "\\n")

def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _log("prepare_metadata_for_build_wheel")
    raise RuntimeError("the farm's frontend must not need this hook")

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _log("build_wheel")
    name = "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        z.writestr("demo/__init__.py", "")
        z.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\\nName: demo\\nVersion: 1.0\\n")
        z.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        z.writestr("demo-1.0.dist-info/RECORD", "")
    return name
'''


def source(tmp_path, backend: str = BACKEND):
    src = tmp_path / "src"
    (src / "backend").mkdir(parents=True)
    (src / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "farmtestbackend"\n'
                                        'backend-path = ["backend"]\n')
    (src / "backend" / "farmtestbackend.py").write_text(backend)
    return src


def test_the_declared_backend_builds_through_its_build_wheel_hook_only(tmp_path):
    src = source(tmp_path)
    wheel = compile_wheel(src, sys.executable, {"PATH": os.environ["PATH"]}, tmp_path / "out", tmp_path / "c.log")
    assert wheel == tmp_path / "out" / "demo-1.0-py3-none-any.whl" and wheel.is_file()
    assert (src / "calls.log").read_text().split() == ["build_wheel"]
    assert "PEP 517 build_wheel of farmtestbackend" in (tmp_path / "c.log").read_text()


def test_a_failing_backend_fails_the_step_with_its_error_and_the_log(tmp_path):
    src = source(tmp_path, BACKEND.replace('    _log("build_wheel")', '    raise ValueError("error: no nvcc for you")'))
    with pytest.raises(CompileFailed, match=r"error: no nvcc for you.*\(log: ") as exc:
        compile_wheel(src, sys.executable, {"PATH": os.environ["PATH"]}, tmp_path / "out", tmp_path / "c.log")
    assert "\n" not in str(exc.value) and not list((tmp_path / "out").glob("*.whl"))


def test_a_backend_path_outside_the_source_tree_is_refused(tmp_path):
    src = source(tmp_path)
    toml = src / "pyproject.toml"
    toml.write_text(toml.read_text().replace('backend-path = ["backend"]', 'backend-path = ["../elsewhere"]'))
    with pytest.raises(CompileFailed, match=r"backend-path .\.\./elsewhere. leaves the source tree"):
        compile_wheel(src, sys.executable, {"PATH": os.environ["PATH"]}, tmp_path / "out", tmp_path / "c.log")
    assert not (src / "calls.log").exists()


SETUP_PY = """from setuptools import setup
setup(name="plain", version="1.0", py_modules=["plain"])
"""


@pytest.mark.parametrize("version", ["3.10", "3.11"])
def test_a_setup_py_source_builds_with_each_python_the_farm_uses(tmp_path, version):
    # On 3.10 setuptools replaces distutils through a shim that importing pip switches off: the
    # frontend must import nothing but the backend (a pyenv Python with its bundled setuptools).
    from farm.runners.images import pyenv_prefixes

    base = next((p / "bin" / "python3" for p in pyenv_prefixes() if p.name.startswith(version + ".")), None)
    if base is None:
        pytest.skip(f"no pyenv Python {version} here")
    # a venv with a setuptools that builds wheels by itself (as torch environments have)
    subprocess.run([str(base), "-m", "venv", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "setuptools>=70.1"], check=True)
    src = tmp_path / "src"
    src.mkdir()
    (src / "setup.py").write_text(SETUP_PY)
    (src / "plain.py").write_text("")
    wheel = compile_wheel(src, python, {"PATH": os.environ["PATH"]}, tmp_path / "out", tmp_path / "c.log")
    assert wheel.name == "plain-1.0-py3-none-any.whl", (tmp_path / "c.log").read_text()[-2000:]


# ---------------------------------------------------------------- the flags tier's reading of nvcc calls

def test_nvcc_targets_reads_every_spelling_of_a_target():
    from farm.build.compile import nvcc_targets

    assert nvcc_targets(["-c", "a.cu", "-gencode=arch=compute_80,code=sm_80",
                         "-gencode", "arch=compute_90,code=[sm_90,compute_90]"]) == {"sm_80", "sm_90", "compute_90"}
    assert nvcc_targets(["-c", "a.cu", '--generate-code=arch=compute_120,code="sm_120,compute_120"']) == \
        {"sm_120", "compute_120"}
    assert nvcc_targets(["-c", "a.cu", "-arch=sm_86"]) == {"sm_86", "compute_86"}   # -arch=sm_XX: SASS and PTX
    assert nvcc_targets(["-c", "a.cu", "-arch", "compute_90a", "-code", "sm_90a"]) == {"sm_90a"}
    assert nvcc_targets(["-c", "a.cu", "-arch=native"]) == {"-arch=native"}
    assert nvcc_targets(["-c", "a.cu"]) == {"nvcc default"}
    assert nvcc_targets(["--version"]) == set()


def test_flags_report_names_what_is_missing_and_extra(tmp_path):
    from farm.archlist import ArchList
    from farm.build.compile import flags_report, flags_summary, read_nvcc_calls, record_nvcc_calls
    from farm.build.verify.checks import forgiven_targets

    # the wrapper itself, with a stand-in for nvcc that only says it ran
    real = tmp_path / "real-nvcc"
    real.write_text("#!/bin/sh\necho real nvcc ran \"$@\"\n")
    real.chmod(0o755)
    home = tmp_path / "toolkit"
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "include" / "cuda.h").write_text("")
    (home / "bin" / "ptxas").write_text("")
    real.rename(home / "bin" / "nvcc")
    real = home / "bin" / "nvcc"
    env = {"PATH": "/usr/bin:/bin", "CUDA_HOME": str(home)}
    calls = record_nvcc_calls(env, tmp_path / "rec", real)
    assert env["PYTORCH_NVCC"] == env["CUDACXX"] == str(tmp_path / "rec" / "bin" / "nvcc")
    shadow = Path(env["CUDA_HOME"])   # a build that runs $CUDA_HOME/bin/nvcc itself is recorded too
    assert shadow != home and (shadow / "include" / "cuda.h").is_file() and (shadow / "bin" / "ptxas").exists()
    done = subprocess.run([str(shadow / "bin" / "nvcc"), "-c", "c.cu", "-arch=sm_90"], capture_output=True, text=True)
    assert done.stdout.startswith("real nvcc ran")
    for argv in (["-c", "a b.cu", "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=compute_90"],
                 ["-c", "b.cu", "-gencode=arch=compute_89,code=sm_89"], ["--version"]):
        done = subprocess.run(["nvcc", *argv], env=env, capture_output=True, text=True, check=True)
        assert done.stdout.startswith("real nvcc ran")
    seen = read_nvcc_calls(calls)
    assert sorted(seen) == sorted([["-c", "a b.cu", "-gencode=arch=compute_80,code=sm_80",
                                    "-gencode=arch=compute_90,code=compute_90"],
                                   ["-c", "b.cu", "-gencode=arch=compute_89,code=sm_89"], ["--version"],
                                   ["-c", "c.cu", "-arch=sm_90"]])
    report = flags_report(seen, ArchList.parse("8.0 9.0+PTX 10.0"))
    assert report["invocations"] == 4 and report["compiling_invocations"] == 3
    assert (report["sass"], report["ptx"]) == (["sm_80", "sm_89", "sm_90"], ["compute_90"])
    assert not report["equal"] and report["missing"] == ["sm_100"] and report["extra"] == ["sm_89"]
    assert report["calls_differing"] == 3
    assert "missing sm_100; extra sm_89" in flags_summary(report)
    exact = flags_report([["-c", "x.cu", "-gencode=arch=compute_80,code=sm_80"]], ArchList.parse("8.0"))
    assert exact["equal"] and "equal to the cell's list 8.0" in flags_summary(exact)
    # what the recipe's verify.allow_missing_archs forgives is waived, as the gate would; nothing else is
    own_gencode = [["-c", "k.cu", "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_120,code=sm_120",
                    "-gencode=arch=compute_120,code=compute_120"]]
    forgiven = forgiven_targets(ArchList.parse("8.0 9.0"))
    waived = flags_report(own_gencode, ArchList.parse("8.0 9.0 9.0a 10.0 12.0+PTX"), forgiven=forgiven)
    assert waived["waived"] == ["sm_80", "sm_90"] and waived["missing"] == ["sm_100"] and not waived["equal"]
    assert "(missing sm_100; sm_80 sm_90 waived)" in flags_summary(waived)
    waived = flags_report(own_gencode, ArchList.parse("8.0 9.0 9.0a 12.0+PTX"), forgiven=forgiven)
    assert waived["equal"] and waived["calls_differing"] == 0
    assert "equal to the cell's list 8.0 9.0 9.0a 12.0+PTX with sm_80 sm_90 waived" in flags_summary(waived)
    # CMake's compiler check compiles with the list as given, before a project rewrites it: not the wheel's
    probe = ["-gencode=arch=compute_120,code=[compute_120,sm_120]", "-MT",
             "CMakeFiles/cmTC_96541.dir/CMakeCUDACompilerABI.cu.o", "-x", "cu", "-c", "/cmake/CMakeCUDACompilerABI.cu"]
    with_probe = flags_report(own_gencode + [probe], ArchList.parse("8.0 9.0 9.0a 12.0+PTX"),
                              [30.0, 1.0], objects_total=1, forgiven=forgiven)
    assert with_probe["equal"] and with_probe["compiling_invocations"] == 1 and with_probe["invocations"] == 2
    assert with_probe["finished"] == 1 and with_probe["cpu_s_per_object"] == 30.0
    ptx = flags_report([own_gencode[0][:4]], ArchList.parse("9.0a 12.0+PTX"),
                       forgiven=forgiven_targets(ArchList.parse("12.0")))
    assert ptx["equal"] and ptx["waived"] == ["compute_120"]


def test_the_wrapper_samples_the_cpu_of_finished_calls_and_prices_the_cell_from_them(tmp_path):
    from farm.archlist import ArchList
    from farm.build.compile import (
        flags_report,
        flags_summary,
        read_nvcc_calls,
        read_nvcc_cpu,
        record_nvcc_calls,
    )

    # a stand-in nvcc that burns about 0.4 CPU-seconds in a child (as nvcc's cicc and ptxas are), or,
    # for x.cu, waits to be killed as the flags tier's stop kills a running compile
    real = tmp_path / "nvcc"
    real.write_text('#!/bin/sh\ncase "$*" in *x.cu*) exec sleep 60;; esac\n'
                    f'{sys.executable} -c "import time\nt = time.process_time()\n'
                    'while time.process_time() - t < 0.4: pass"\n')
    real.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin"}
    calls = record_nvcc_calls(env, tmp_path / "rec", real)
    gencode = "-gencode=arch=compute_80,code=sm_80"
    for name in ("a.cu", "b.cu"):
        subprocess.run(["nvcc", "-c", name, gencode], env=env, check=True)
    subprocess.run(["nvcc", "--version"], env=env, check=True)   # finishes, but compiles nothing: not sampled
    killed = subprocess.Popen(["nvcc", "-c", "x.cu", gencode], env=env, start_new_session=True)
    deadline = time.monotonic() + 30   # killed once the wrapper has recorded the call, however slow the machine
    while ["-c", "x.cu", gencode] not in read_nvcc_calls(calls):
        assert time.monotonic() < deadline and killed.poll() is None, "the wrapper never recorded the call"
        time.sleep(0.01)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    cpu = read_nvcc_cpu(calls)
    assert len(cpu) == len(read_nvcc_calls(calls)) == 4
    assert cpu[-1] is None and all(c is not None and c >= 0.35 for c in cpu[:2]), cpu
    report = flags_report(read_nvcc_calls(calls), ArchList.parse("8.0"), cpu, objects_total=30)
    assert report["finished"] == 2 and report["objects_total"] == 30
    assert 0.35 <= report["cpu_s_per_object"] < 2
    assert report["cpu_h_estimate"] == round(report["cpu_s_per_object"] * 30 / 3600, 2)
    assert "2 of 30 objects finished at" in flags_summary(report)
    none = flags_report(read_nvcc_calls(calls)[-1:], ArchList.parse("8.0"), cpu[-1:], objects_total=30)
    assert none["finished"] == 0 and none["cpu_h_estimate"] is None
    assert "none of 30 objects finished before the stop" in flags_summary(none)


def test_the_cuda_objects_are_counted_from_the_builds_ninja_files(tmp_path):
    from farm.build.compile import nvcc_objects

    assert nvcc_objects(tmp_path) is None   # no build.ninja written yet
    torch_ext = tmp_path / "build" / "temp.linux-x86_64-cpython-312"
    torch_ext.mkdir(parents=True)
    (torch_ext / "build.ninja").write_text(
        "rule compile\n  command = c++ $in\nrule cuda_compile\n  command = nvcc $in\n"
        "build /w/b/binding.o: compile /w/csrc/binding.cpp\n"
        "build /w/b/a.o: cuda_compile /w/csrc/a.cu\n"
        "build /w/b/c$:d.o: cuda_compile /w/csrc/c$:d.cu\n")   # a colon in a path, escaped
    cmake = tmp_path / "_skbuild" / "tree"
    cmake.mkdir(parents=True)
    (cmake / "build.ninja").write_text(
        "build ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/acc.cu.o: CUDA_COMPILER__ggml-cuda_unscanned_Release "
        "/s/acc.cu || cmake_object_order_depends_target_ggml-cuda\n"
        "build ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o: C_COMPILER__ggml-base_unscanned_Release /s/ggml.c\n"
        "build bin/libggml-cuda.so: CUDA_SHARED_LIBRARY_LINKER__ggml-cuda_Release acc.cu.o\n")
    assert nvcc_objects(tmp_path) == 3
    # an extension built before into the same temp folder lost its build.ninja to the next one: the
    # recorded calls' absolute outputs still name its objects (a relative one is CMake's, counted above;
    # a configure probe's is no object of the wheel)
    calls = [["-c", "/w/csrc/a.cu", "-o", "/w/b/a.o"], ["-c", "/w/csrc/m.cu", "-o", "/w/b/m.o"],
             ["-c", "/s/acc.cu", "-o", "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/acc.cu.o"],
             ["-c", "/b/CMakeFiles/cmTC_1a2b.dir/CMakeCUDACompilerABI.cu", "-o=/b/CMakeFiles/cmTC_1a2b.dir/x.o"],
             ["--version"]]
    assert nvcc_objects(tmp_path, calls) == 4
    assert nvcc_objects(tmp_path / "none", calls[1:2]) == 1


def test_a_stopped_compile_leaves_no_process_of_its_group(tmp_path):
    from farm.build.compile import compile_wheel

    marker = f"farm-test-sleeper-{os.getpid()}-{time.time_ns()}"   # this test's alone
    src = source(tmp_path, BACKEND.replace(
        '    _log("build_wheel")', f'    import subprocess; subprocess.Popen(["sh", "-c", "sleep 300; : {marker}"]); '
                                  '_log("sleeper started"); subprocess.run(["sleep", "300"])'))
    wheel = compile_wheel(src, sys.executable, {"PATH": os.environ["PATH"]}, tmp_path / "out", tmp_path / "c.log",
                          stop_after=3)
    assert wheel is None and "# stopped after" in (tmp_path / "c.log").read_text()
    assert processes_mentioning(marker) == [], "a grandchild of the stopped compile is still running"


def test_torch_imported_through_the_work_folders_link_gives_two_pythons_one_header_path_and_one_object(tmp_path):
    """Two envs of one torch (their torch packages under paths naming their Python) imported through the
    cell's torch-site link (the work dir: one mount point for every cell in a container): torch's include
    folder, as a build asks torch for it, is the same path, and a TU including a torch header compiled for
    the second env is a ccache hit. Through the envs' own paths it is a miss."""
    from farm.build.compile import torch_at_one_path

    envs = []
    for python in ("3.11", "3.12"):
        torch_dir = tmp_path / f"env-py{python}" / f"lib/python{python}/site-packages/torch"
        (torch_dir / "include" / "torch").mkdir(parents=True)
        (torch_dir / "__init__.py").write_text("")
        (torch_dir / "include" / "torch" / "tensor.h").write_text("static inline int torch_dims(void) { return 4; }\n")
        envs.append(torch_dir)
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "op.c").write_text("#include <torch/tensor.h>\nint op(void) { return torch_dims(); }\n")
    ask = "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))"

    def include_of(pythonpath: str) -> str:
        """torch's include folder as a build gets it: from the torch it imports."""
        return subprocess.run([sys.executable, "-c", ask], env={**os.environ, "PYTHONPATH": pythonpath},
                              capture_output=True, text=True, check=True).stdout.strip()

    def compile_with(include: str, cache: Path) -> bool:
        """True: a ccache hit (direct or preprocessed)."""
        env = {**os.environ, "CCACHE_DIR": str(cache), "CCACHE_BASEDIR": str(work), "CCACHE_NOHASHDIR": "1",
               "CCACHE_STATSLOG": str(cache / "stats.log")}
        (cache / "stats.log").unlink(missing_ok=True)
        subprocess.run(["ccache", "gcc", "-I", include, "-c", "src/op.c", "-o", "op.o"], cwd=work, env=env, check=True)
        outcomes = (cache / "stats.log").read_text().splitlines()[1:]
        return "cache_miss" not in outcomes and any(o.endswith("cache_hit") for o in outcomes)

    hits, includes = [], []
    for e in envs:   # one cell after the other, each linking its own env
        includes.append(include_of(torch_at_one_path(e, work / "torch-site")))
        hits.append(compile_with(includes[-1], tmp_path / "linked"))
    assert includes == [str(work / "torch-site" / "torch" / "include")] * 2 and hits == [False, True]
    assert os.readlink(work / "torch-site" / "torch") == str(envs[1])   # the link now names the second env
    own = [include_of(str(e.parent)) for e in envs]
    assert own == [str(e / "include") for e in envs]
    assert [compile_with(i, tmp_path / "own") for i in own] == [False, False]


def test_headers_from_two_pythons_envs_share_one_ccache_object_through_the_linked_include_folder(tmp_path):
    """Two envs of one torch hold the same nvidia headers under paths naming their Python; compiled from the
    same source through the cell's linked include folder (one mount point for every cell in a container),
    the second compile is a ccache hit. Through the envs' own paths it is a miss: the preprocessor writes
    the header's path into the output ccache hashes."""
    from farm.build.compile import linked_includes

    envs = []
    for python in ("3.11", "3.12"):
        include = tmp_path / f"env-py{python}" / f"lib/python{python}/site-packages/nvidia/cu13/include"
        (include / "nvtx3").mkdir(parents=True)
        (include / "nvtx3" / "nvToolsExt.h").write_text("static inline int nvtx_version(void) { return 3; }\n")
        envs.append(str(include))
    work = tmp_path / "work"
    (work / "src").mkdir(parents=True)
    (work / "src" / "kernel.c").write_text('#include <nvtx3/nvToolsExt.h>\nint f(void) { return nvtx_version(); }\n')

    def compile_with(cpath: str, cache: Path) -> bool:
        """True: a ccache hit (direct or preprocessed)."""
        env = {**os.environ, "CPATH": cpath, "CCACHE_DIR": str(cache), "CCACHE_BASEDIR": str(work),
               "CCACHE_NOHASHDIR": "1", "CCACHE_STATSLOG": str(cache / "stats.log")}
        (cache / "stats.log").unlink(missing_ok=True)
        subprocess.run(["ccache", "gcc", "-c", "src/kernel.c", "-o", "kernel.o"], cwd=work, env=env, check=True)
        outcomes = (cache / "stats.log").read_text().splitlines()[1:]
        return "cache_miss" not in outcomes and any(o.endswith("cache_hit") for o in outcomes)

    linked = [compile_with(os.pathsep.join(linked_includes([e], work / "nvidia-include")), tmp_path / "linked")
              for e in envs]
    assert linked == [False, True]
    assert os.readlink(work / "nvidia-include" / "00-cu13") == envs[1]   # the link now names the second env
    direct = [compile_with(e, tmp_path / "direct") for e in envs]
    assert direct == [False, False]
