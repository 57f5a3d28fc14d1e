"""Windows cells on this (Linux) host: the refusal for real, the Windows module's pure parts.

No Windows host is at hand: `find_msvc` / `find_cuda_toolkit` are driven with a fake
`run` / `exists` carrying recorded vswhere, vcvars `set` and nvcc output, and the
Windows build platform the steps call gets those fakes' results. Those are the only
fakes here, and they stand for what cannot run on Linux (cmd.exe, vswhere.exe, nvcc.exe).
"""

from __future__ import annotations

import platform
from pathlib import Path
from types import SimpleNamespace

import pytest
from farmcli import run_farm

from farm.archlist import ArchList
from farm.build import windows
from farm.build.compile import compile_environment
from farm.build.toolkit import Toolkit
from farm.errors import WindowsToolchainMissing

WIN_CELL = "farm_demo-cu130-torch2.13-py311-win"


def test_farm_build_of_a_windows_cell_on_linux_exits_2_with_one_line_and_no_wheel(tmp_path):
    out, house = tmp_path / "out", tmp_path / "house"
    p = run_farm("build", WIN_CELL, "--out", str(out), "--wheelhouse", str(house))
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert WIN_CELL in lines[0] and "Windows host" in lines[0] and platform.system() in lines[0]
    assert not out.exists() and not house.exists()
    assert not list((Path(__file__).parent.parent / "build" / WIN_CELL).glob("**/*.whl"))


def test_nox_build_session_of_a_windows_cell_refuses_too(tmp_path):
    # `nox -s build-<cell>` is `farm build <cell>`: the same one line, a failing session, no wheel.
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "nox", "-s", f"build-{WIN_CELL}"], capture_output=True, text=True,
                       cwd=Path(__file__).parent.parent, timeout=300)
    assert p.returncode != 0
    assert "a Windows cell builds only on a Windows host" in p.stdout + p.stderr
    assert not list((Path(__file__).parent.parent / "build" / WIN_CELL).glob("**/*.whl"))


def test_refusal_only_for_windows_cells_off_windows():
    assert windows.refusal(WIN_CELL, "windows", system="Linux").startswith(f"{WIN_CELL}: a Windows cell")
    assert "Darwin" in windows.refusal(WIN_CELL, "windows", system="Darwin")
    assert windows.refusal(WIN_CELL, "windows", system="Windows") is None
    assert windows.refusal("farm_demo-cu130-torch2.13-py311", "linux", system="Linux") is None
    assert windows.refusal("farm_demo-cu130-torch2.13-py311-aarch64", "linux_aarch64", system="Linux") is None


def test_check_buildable_here_raises_the_builds_exit_2_error():
    from farm.errors import NotBuildableHere

    cell = SimpleNamespace(id=WIN_CELL, platform="windows")
    with pytest.raises(NotBuildableHere) as err:
        windows.check_buildable_here(cell, system="Linux")
    assert err.value.exit_code == 2
    windows.check_buildable_here(cell, system="Windows")  # no error on a Windows host


# ----- MSVC -----------------------------------------------------------------------------------

VS = r"C:\Program Files\Microsoft Visual Studio\2022\BuildTools"
# What `cmd /c "call vcvars64.bat >nul && set"` prints (trimmed), CRLF and cmd's hidden drive entries included.
SET_OUTPUT = (
    "=C:=C:\\build\r\n"
    "ALLUSERSPROFILE=C:\\ProgramData\r\n"
    "INCLUDE=C:\\VS\\VC\\Tools\\MSVC\\14.44.35207\\include;C:\\Kits\\10\\include\\10.0.26100.0\\ucrt\r\n"
    "LIB=C:\\VS\\VC\\Tools\\MSVC\\14.44.35207\\lib\\x64;C:\\Kits\\10\\lib\\10.0.26100.0\\ucrt\\x64\r\n"
    "Path=C:\\VS\\VC\\Tools\\MSVC\\14.44.35207\\bin\\HostX64\\x64;C:\\Windows\\system32\r\n"
    "VCINSTALLDIR=C:\\VS\\VC\\\r\n"
    "VCToolsVersion=14.44.35207\r\n"
    "WindowsSdkDir=C:\\Kits\\10\\\r\n"
    "EQUALS=a=b\r\n"
)


def test_parse_set_output_reads_variables_and_skips_drive_entries():
    env = windows.parse_set_output(SET_OUTPUT)
    assert env["VCToolsVersion"] == "14.44.35207"
    assert env["EQUALS"] == "a=b"
    assert not any(k.startswith("=") or k == "" for k in env)
    assert all(not v.endswith("\r") for v in env.values())


def test_vswhere_and_vcvars_paths():
    environ = {"PROGRAMFILES(X86)": r"C:\Program Files (x86)"}
    assert windows.expand_windows_vars(windows.VSWHERE, environ) == \
        r"C:\Program Files (x86)\Microsoft Visual Studio\Installer\vswhere.exe"
    assert windows.expand_windows_vars("%NOPE%\\x", environ) == "%NOPE%\\x"
    cmd = windows.vswhere_command("vswhere.exe")
    assert cmd[cmd.index("-requires") + 1] == windows.MSVC_COMPONENT and "installationPath" in cmd
    assert windows.vcvars_path(VS) == VS + r"\VC\Auxiliary\Build\vcvars64.bat"
    assert windows.vcvars_command("C:\\a b\\vcvars64.bat") == 'cmd.exe /d /s /c "call "C:\\a b\\vcvars64.bat" >nul && set"'


class FakeWindows:
    """Stands in for vswhere.exe, cmd.exe and nvcc.exe (no Windows here)."""

    def __init__(self, files, nvcc_release="13.0"):
        self.files, self.nvcc_release, self.calls = set(files), nvcc_release, []

    def exists(self, path):
        return path in self.files

    def run(self, cmd, **kw):
        self.calls.append(cmd)
        if isinstance(cmd, list) and cmd[0].endswith("vswhere.exe"):
            return SimpleNamespace(returncode=0, stdout=VS + "\r\n")
        if isinstance(cmd, str) and cmd.startswith("cmd.exe"):
            return SimpleNamespace(returncode=0, stdout=SET_OUTPUT)
        if isinstance(cmd, list) and cmd[0].endswith("nvcc.exe"):
            return SimpleNamespace(returncode=0, stdout=f"Cuda compilation tools, release {self.nvcc_release}, "
                                                        f"V{self.nvcc_release}.88\n")
        raise AssertionError(cmd)


def test_find_msvc_through_vswhere_and_vcvars():
    vswhere = r"C:\PF86\Microsoft Visual Studio\Installer\vswhere.exe"
    fake = FakeWindows({vswhere, windows.vcvars_path(VS)})
    msvc = windows.find_msvc({"ProgramFiles(x86)": r"C:\PF86"}, run=fake.run, exists=fake.exists)
    assert msvc.installation == VS and msvc.tools_version == "14.44.35207"
    assert msvc.env["INCLUDE"].startswith("C:\\VS\\VC")


def test_find_msvc_takes_a_developer_prompt_as_is():
    fake = FakeWindows(set())
    environ = {"VCINSTALLDIR": "C:\\VS\\VC\\", "VCToolsVersion": "14.38.33130", "INCLUDE": "x"}
    msvc = windows.find_msvc(environ, run=fake.run, exists=fake.exists)
    assert msvc.tools_version == "14.38.33130" and fake.calls == []


def test_find_msvc_without_visual_studio_says_what_to_install():
    with pytest.raises(WindowsToolchainMissing, match=windows.MSVC_COMPONENT):
        windows.find_msvc({"ProgramFiles(x86)": "C:\\PF86"}, run=FakeWindows(set()).run,
                          exists=FakeWindows(set()).exists)


# ----- CUDA toolkit ------------------------------------------------------------------------


def test_cuda_home_candidates_prefer_the_line_specific_variable_and_ignore_another_lines_cuda_path():
    environ = {"CUDA_PATH_V13_0": "D:\\cuda130\\", "CUDA_PATH": "C:\\Program Files\\NVIDIA GPU Computing Toolkit\\CUDA\\v12.8"}
    assert windows.cuda_home_candidates("13.0", environ) == [
        "D:\\cuda130", windows.DEFAULT_CUDA_ROOT + "\\v13.0"]
    environ = {"cuda_path": windows.DEFAULT_CUDA_ROOT + "\\v12.8"}
    assert windows.cuda_home_candidates("12.8", environ) == [windows.DEFAULT_CUDA_ROOT + "\\v12.8"]


def test_find_cuda_toolkit_checks_nvcc_reports_the_cells_line():
    home = windows.DEFAULT_CUDA_ROOT + "\\v13.0"
    good = FakeWindows({home + "\\bin\\nvcc.exe"})
    tk = windows.find_cuda_toolkit("13.0", {}, run=good.run, exists=good.exists)
    assert tk.home == home and tk.nvcc == home + "\\bin\\nvcc.exe" and tk.lib_dir == home + "\\lib\\x64"
    wrong = FakeWindows({home + "\\bin\\nvcc.exe"}, nvcc_release="12.9")
    with pytest.raises(WindowsToolchainMissing, match="nvcc says 12.9"):
        windows.find_cuda_toolkit("13.0", {}, run=wrong.run, exists=wrong.exists)


# ----- compile environment and repair --------------------------------------------------------


def test_windows_compile_environment_keeps_the_arch_list_and_drops_gcc_only_settings(tmp_path):
    arch = ArchList.parse("7.5 8.0 8.6 9.0 10.0 12.0+PTX", "test", "arch_list")
    linux_tk = Toolkit(tmp_path / "cuda", "13.0.88", "13.0", "system", "x86_64", ("sm_75",), ("compute_75",))
    torch_env = SimpleNamespace(python=str(tmp_path / "venv" / "bin" / "python"), path=tmp_path / "venv",
                                nvidia_include_dirs=lambda: [tmp_path / "nv" / "include"],
                                bin_dirs=lambda: [tmp_path / "venv" / "bin"])
    linux = compile_environment(arch_list=arch, toolkit=linux_tk, torch_env=torch_env, max_jobs=2,
                                recipe_env={"MY_FLAG": "{ARCHS_CMAKE}"}, base={"HOME": "/root"})
    msvc = windows.Msvc(VS, windows.vcvars_path(VS), "14.44.35207", windows.parse_set_output(SET_OUTPUT))
    tk = windows.WindowsToolkit(windows.DEFAULT_CUDA_ROOT + "\\v13.0", "13.0")
    env = windows.adapt_compile_environment(linux, msvc=msvc, toolkit=tk, torch_bin_dirs=["C:\\venv\\Scripts"],
                                            caller={"SystemRoot": "C:\\Windows", "TEMP": "C:\\T"})
    for same in ("TORCH_CUDA_ARCH_LIST", "CUDAARCHS", "MAX_JOBS", "NVCC_APPEND_FLAGS", "FORCE_CUDA", "MY_FLAG",
                 "PIP_NO_INDEX"):
        assert env[same] == linux[same], same
    assert env["TORCH_CUDA_ARCH_LIST"] == "7.5 8.0 8.6 9.0 10.0 12.0+PTX"
    for gone in ("CFLAGS", "CXXFLAGS", "CPATH", "LIBRARY_PATH"):
        assert gone not in env
    assert env["CUDA_HOME"] == env["CUDA_PATH"] == tk.home and env["CUDACXX"].endswith("\\bin\\nvcc.exe")
    assert env["INCLUDE"].split(";")[0] == str(tmp_path / "nv" / "include")
    assert env["LIB"].split(";")[0] == tk.home + "\\lib\\x64" and "ucrt\\x64" in env["LIB"]
    assert env["PATH"].split(";")[0] == "C:\\venv\\Scripts" and "HostX64\\x64" in env["PATH"]
    assert ":" + "/usr/bin" not in env["PATH"]
    assert env["DISTUTILS_USE_SDK"] == "1" and env["SYSTEMROOT"] == "C:\\Windows"


def test_the_windows_repair_note_names_the_tag():
    # The repair itself is the platform seam's (test_windows_platform_leaves_the_wheel_unrepaired);
    # auditwheel's repair_wheel refuses a win_* wheel (test_repair.py).
    assert "not repaired" in windows.repair_note() and windows.WHEEL_PLAT in windows.repair_note()


# ----- the platform seam the steps call --------------------------------------------------------


def test_the_steps_pick_the_windows_platform_for_a_windows_cell_only():
    from farm.build.platform import LinuxPlatform, for_cell

    assert isinstance(for_cell("windows"), windows.WindowsPlatform)
    assert isinstance(for_cell("linux"), LinuxPlatform) and for_cell("linux_aarch64").name == "linux_aarch64"


def test_windows_platform_compile_environment_adapts_the_linux_one(tmp_path):
    """What farm.build.steps gets on a Windows host, through a WindowsHost answering with the recorded
    vswhere / vcvars / nvcc output (FakeWindows: nothing here runs vswhere or nvcc.exe)."""
    home = windows.DEFAULT_CUDA_ROOT + "\\v13.0"
    vswhere = r"C:\PF86\Microsoft Visual Studio\Installer\vswhere.exe"
    fake = FakeWindows({vswhere, windows.vcvars_path(VS), home + "\\bin\\nvcc.exe"})
    host = windows.WindowsHost(system="Windows", environ={"ProgramFiles(x86)": r"C:\PF86"}, run=fake.run,
                               exists=fake.exists, isdir=lambda _p: False)
    platform_ = windows.WindowsPlatform(host)
    tk = platform_.toolkit("13.0", arch="x86_64", components=(), source="auto", log=lambda _m: None)
    assert tk.home == home
    arch = ArchList.parse("7.5 12.0+PTX", "test", "arch_list")
    torch_env = SimpleNamespace(python=str(tmp_path / "venv" / "Scripts" / "python.exe"), path=Path("C:/venv"),
                                nvidia_include_dirs=lambda: [],
                                bin_dirs=lambda: [tmp_path / "venv" / "Scripts", tmp_path / "base" / "Scripts"])
    env = platform_.compile_environment(
        arch_list=arch, toolkit=tk, torch_env=torch_env, cuda="13.0", max_jobs=2, nvcc_threads=1,
        nvcc_flags="", recipe_env={}, exported={})
    assert env["TORCH_CUDA_ARCH_LIST"] == "7.5 12.0+PTX" and env["CUDA_HOME"] == tk.home
    # an overlay's Scripts first, then its base's (where ninja is installed)
    assert env["PATH"].split(";")[:2] == [str(tmp_path / "venv" / "Scripts"), str(tmp_path / "base" / "Scripts")]
    assert env["DISTUTILS_USE_SDK"] == "1" and "CFLAGS" not in env


def test_windows_platform_leaves_the_wheel_unrepaired(tmp_path):
    wheel = tmp_path / "farm_demo-0.1.0+cu130torch2.13-cp311-cp311-win_amd64.whl"
    wheel.write_bytes(b"")
    result = windows.WindowsPlatform().repair(wheel, tmp_path / "repaired", torch_env=None, plat=None,
                                              floor_plat=None, allow_graft=(), wheel_abi="cpython")
    assert result.wheel == wheel and not result.repaired and result.reason == windows.repair_note()
