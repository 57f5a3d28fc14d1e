"""The compile step's PEP 517 frontend: the backend a source declares, its build_wheel hook only (pip
would also run the metadata hook, which for torch extensions runs setup.py and imports torch twice)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from farm.compile import CompileFailed, compile_wheel

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
    from farm.images import pyenv_prefixes

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
