"""Step 4 on the bundled demo: a real nvcc (NVIDIA's PyPI CUDA 13.0 wheels) compiles
examples/farm-demo against the real torch 2.13.0 (CUDA 13.0) base environment, on the host,
for exactly the requested arch list. The fatbin is read by farm.arch.fatbin and cross-checked
with NVIDIA's cuobjdump (PyPI nvidia-cuda-cuobjdump). No GPU: the import runs with none visible.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from wheel_builder import demo_extension

from farm.arch.fatbin import read_fatbin
from farm.archlist import ArchList
from farm.build import environments as E
from farm.build import provision as P
from farm.build.compile import compile_environment, compile_wheel
from farm.build.downloads import download
from farm.errors import CompileFailed
from farm.settings import PROJECT_ROOT, cache_dir

PY311 = Path("/root/.pyenv/versions/3.11.7/bin/python3.11")
REQ = E.EnvRequest(python="3.11", torch_pin="2.13.0", cuda="13.0")
ARCHS = "7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX"
DEMO = PROJECT_ROOT / "examples" / "farm-demo"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not PY311.exists(), reason="needs the host's pyenv Python 3.11.7")]


@pytest.fixture(scope="module")
def toolkit():
    return P.provision_toolkit("13.0", "x86_64", source="pypi")


@pytest.fixture(scope="module")
def torch_env():
    E.download_environment(REQ)
    return E.base_environment(REQ, PY311, target="host")


@pytest.fixture(scope="module")
def compile_env(toolkit, torch_env):
    arch_list = ArchList.parse(ARCHS)
    toolkit.require(arch_list)
    return compile_environment(arch_list=arch_list, toolkit=toolkit, torch_env=torch_env, max_jobs=2,
                               nvcc_threads=1)


@pytest.fixture(scope="module")
def demo_wheel(tmp_path_factory, torch_env, compile_env):
    work = tmp_path_factory.mktemp("demo")
    src = work / "src"
    shutil.copytree(DEMO, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    t0 = time.monotonic()
    wheel = compile_wheel(src, torch_env.python, compile_env, work / "out", work / "compile.log")
    print(f"\ndemo compile: {time.monotonic() - t0:.0f}s")
    return wheel, work


@pytest.fixture(scope="module")
def cuobjdump(tmp_path_factory):
    """NVIDIA's cuobjdump from PyPI (downloaded once into the shared cache)."""
    dl = download(["nvidia-cuda-cuobjdump>=13"], python="3.11", platform="linux", no_deps=True)
    whl = dl.file_for("nvidia-cuda-cuobjdump")
    dest = tmp_path_factory.mktemp("cuobjdump")
    with zipfile.ZipFile(whl) as z:
        name = next(n for n in z.namelist() if n.endswith("/bin/cuobjdump"))
        z.extract(name, dest)
    exe = dest / name
    exe.chmod(0o755)
    return exe


def test_compile_environment_says_everything(compile_env, toolkit, torch_env):
    ce = compile_env
    assert ce["TORCH_CUDA_ARCH_LIST"] == ARCHS
    assert ce["CUDAARCHS"] == ce["CMAKE_CUDA_ARCHITECTURES"] == "75-real;80-real;86-real;90;100-real;120"
    assert ce["MAX_JOBS"] == ce["CMAKE_BUILD_PARALLEL_LEVEL"] == "2"
    assert ce["NVCC_APPEND_FLAGS"].endswith("--threads=1")
    assert ce["FORCE_CUDA"] == "1" and ce["CFLAGS"] == ce["CXXFLAGS"] == "-g0"
    assert ce["CUDA_HOME"] == str(toolkit.home) and ce["CUDACXX"] == str(toolkit.nvcc)
    assert str(toolkit.lib_dir) in ce["LIBRARY_PATH"].split(":")
    assert any(p.endswith("nvidia/cu13/include") for p in ce["CPATH"].split(":"))
    assert ce["PATH"].split(":")[0] == str(torch_env.python.parent)
    assert not any(k in ce for k in ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "LD_LIBRARY_PATH"))
    with_flags = compile_environment(arch_list=ArchList.parse(ARCHS), toolkit=toolkit, nvcc_threads=4,
                                     nvcc_flags="-lineinfo --threads=8",
                                     recipe_env={"MY_ARCHS": "{ARCHS_CMAKE}", "CMAKE_ARGS": "-DX=${Y}"})
    assert with_flags["NVCC_APPEND_FLAGS"] == "-lineinfo --threads=8 --threads=4"   # ours last: it wins
    assert with_flags["MY_ARCHS"] == ce["CUDAARCHS"] and with_flags["CMAKE_ARGS"] == "-DX=${Y}"


def test_demo_wheel_has_exactly_the_requested_sass_and_ptx(demo_wheel, cuobjdump):
    wheel, work = demo_wheel
    so = demo_extension(wheel, work / "unpacked")
    report = read_fatbin(so)
    assert report.sass() == {(75, ""), (80, ""), (86, ""), (90, ""), (100, ""), (120, "")}
    assert report.ptx() == {(90, ""), (120, "")}
    # Cross-check with NVIDIA's own tool.
    elf = subprocess.run([str(cuobjdump), "--list-elf", str(so)], capture_output=True, text=True, check=True).stdout
    ptx = subprocess.run([str(cuobjdump), "--list-ptx", str(so)], capture_output=True, text=True, check=True).stdout
    assert set(re.findall(r"\.(sm_\d+[af]?)\.cubin", elf)) == {"sm_75", "sm_80", "sm_86", "sm_90", "sm_100",
                                                               "sm_120"}
    assert set(re.findall(r"\.(sm_\d+[af]?)\.ptx", ptx)) == {"sm_90", "sm_120"}


def test_demo_wheel_is_the_unlabelled_compile_output(demo_wheel):
    wheel, _ = demo_wheel
    assert wheel.name == "farm_demo-0.1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read("farm_demo-0.1.0.dist-info/METADATA").decode()
    assert "farm_demo/__init__.py" in names
    assert not [n for n in names if re.search(r"libcudart|libtorch|libc10", n)]
    assert set(re.findall(r"^Requires-Dist: (\S+)", meta, re.M)) == {"torch", "numpy"}


def test_demo_imports_against_its_torch_without_a_gpu(demo_wheel, torch_env):
    wheel, work = demo_wheel
    target = work / "site"
    subprocess.run([str(torch_env.python), "-m", "pip", "install", "--isolated", "--no-index", "--no-deps",
                    "--target", str(target), str(wheel)], check=True, capture_output=True)
    code = ("import torch, farm_demo\n"
            "assert farm_demo.__version__ == '0.1.0'\n"
            "try:\n"
            "    farm_demo.scale_shift(torch.ones(4), 2.0, 1.0)\n"
            "except RuntimeError as e:\n"
            "    print('refused:', e)\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(target), "CUDA_VISIBLE_DEVICES": "",
           "HOME": os.environ.get("HOME", "/root")}
    proc = subprocess.run([str(torch_env.python), "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused: x must be a CUDA tensor" in proc.stdout


def test_a_compile_error_fails_with_the_compiler_line_and_the_log(tmp_path, torch_env, compile_env):
    src = tmp_path / "src"
    shutil.copytree(DEMO, src, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    (src / "csrc" / "binding.cpp").write_text('#include <torch/extension.h>\nthis is not C++;\n')
    env = dict(compile_env, TORCH_CUDA_ARCH_LIST="8.0", MAX_JOBS="1")   # ninja starts with binding.cpp
    with pytest.raises(CompileFailed) as err:
        compile_wheel(src, torch_env.python, env, tmp_path / "out", tmp_path / "compile.log")
    msg = str(err.value)
    assert "\n" not in msg and "error" in msg and str(tmp_path / "compile.log") in msg
    assert not list((tmp_path / "out").glob("*.whl"))


def test_the_demo_recipe_loads_in_the_spec_6_vocabulary():
    from farm.recipes.reader import load_recipe
    recipe = load_recipe(PROJECT_ROOT / "recipes" / "farm_demo.yml")
    assert recipe.name == "farm_demo" and recipe.links_torch is True
    assert [str(r) for r in recipe.requires_dist] == ["numpy"]
    assert cache_dir().is_dir()
