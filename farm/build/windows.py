"""Windows cells (design.md §6.8): the Windows host path, in this one module.

UNTESTED ON A WINDOWS HOST. The farm's machines are Linux; what runs here is the
refusal (a `-win` cell on any other host: one line, exit 2) and the steps' Windows
path driven through `WindowsHost` with recorded vswhere, vcvars `set` and nvcc output
(tests/test_winlane.py). The generated GitHub Actions workflow gives Windows cells a
`windows-2022` runner and installs the cell's CUDA toolkit there (farm/run/winlane.py).

On a Windows host a cell is built by the same steps (design.md §6); farm.build.steps
calls `WindowsPlatform` (farm.build.platform's seam) where Linux and Windows differ:
- toolkit: the installed CUDA toolkit of the cell's line (NVIDIA's installer sets
  `CUDA_PATH` and `CUDA_PATH_V<major>_<minor>`), never assembled from PyPI wheels;
- compiler: MSVC, found with `vswhere` and activated by capturing what
  `vcvars64.bat` sets (or taken as is from a developer prompt);
- compile environment: the Linux one adapted (see `adapt_compile_environment`);
- repair: none (a `win_amd64` wheel links the user's torch and CUDA DLLs, which
  delvewheel would have to exclude one by one; a later option), so the wheel keeps its tag.
"""
from __future__ import annotations

import os
import platform as _platform
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath
from typing import TYPE_CHECKING, Any

from farm import process
from farm.archlist import ArchList, ArchToken
from farm.build.toolkit import COMPONENT_HEADER, NVCC_RELEASE, normalise_components, unemittable
from farm.errors import NotBuildableHere, ToolkitCannotEmit, ToolkitUnavailable, WindowsToolchainMissing
from farm.versions import vtuple

if TYPE_CHECKING:
    from farm.build.repair import RepairResult
    from farm.recipes.cells import Cell

PLATFORM = "windows"
WHEEL_PLAT = "win_amd64"
# Visual Studio's locator; installed with every VS 2017+ (Build Tools included).
VSWHERE = r"%ProgramFiles(x86)%\Microsoft Visual Studio\Installer\vswhere.exe"
MSVC_COMPONENT = "Microsoft.VisualStudio.Component.VC.Tools.x86.x64"
DEFAULT_CUDA_ROOT = r"C:\Program Files\NVIDIA GPU Computing Toolkit\CUDA"
# gcc/Linux-only variables of the Linux compile environment: cl.exe rejects -g0 (D9002)
# and MSVC reads INCLUDE/LIB, not CPATH/LIBRARY_PATH.
_LINUX_ONLY = ("CFLAGS", "CXXFLAGS", "CPATH", "LIBRARY_PATH")
# What Windows' own Python and subprocesses need from the caller's environment.
_WINDOWS_PASS = ("SYSTEMROOT", "SYSTEMDRIVE", "WINDIR", "COMSPEC", "PATHEXT", "TEMP", "TMP", "USERPROFILE",
                 "APPDATA", "LOCALAPPDATA", "PROGRAMDATA", "PROGRAMFILES", "PROGRAMFILES(X86)",
                 "NUMBER_OF_PROCESSORS", "PROCESSOR_ARCHITECTURE")


def host_system() -> str:
    return _platform.system()


def is_windows_host(system: str | None = None) -> bool:
    return (system or host_system()) == "Windows"


def refusal(cell_id: str, cell_platform: str, system: str | None = None) -> str | None:
    """The one line `farm build` prints for a Windows cell on a non-Windows host; None when it may build."""
    system = system or host_system()
    if cell_platform != PLATFORM or is_windows_host(system):
        return None
    return (f"{cell_id}: a Windows cell builds only on a Windows host (MSVC + CUDA toolkit; "
            f"farm/build/windows.py, untested here); this host is {system or 'unknown'}")


def check_buildable_here(cell: Cell, system: str | None = None) -> None:
    """Raise farm.errors.NotBuildableHere (exit 2) for a Windows cell on a non-Windows host."""
    line = refusal(cell.id, cell.platform, system)
    if line:
        raise NotBuildableHere(line)


@dataclass(frozen=True)
class WindowsHost:
    """What the Windows path asks of the machine: its name, its variables, running a program, file tests.

    The steps use this machine's; the tests inject recorded vswhere / vcvars / nvcc output, since
    no Windows host is at hand."""

    system: str = field(default_factory=host_system)
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    run: Callable[..., Any] = process.run
    exists: Callable[[str], bool] = os.path.exists
    isdir: Callable[[str], bool] = os.path.isdir


# ----- MSVC ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Msvc:
    installation: str          # Visual Studio installation path ('' for a developer prompt)
    vcvars: str                # its vcvars64.bat ('' for a developer prompt)
    tools_version: str         # VCToolsVersion, e.g. 14.44.35207
    env: dict[str, Any] = field(default_factory=dict, compare=False)   # what the activated environment sets


def expand_windows_vars(text: str, environ: Mapping[str, str]) -> str:
    """%NAME% expansion with Windows' case-insensitive names; unknown names stay as written."""
    upper = {k.upper(): v for k, v in environ.items()}
    return re.sub(r"%([^%]+)%", lambda m: upper.get(m.group(1).upper(), m.group(0)), text)


def vswhere_command(vswhere: str) -> list[str]:
    """The newest Visual Studio (any product, Build Tools too) that has the x64 C++ tools."""
    return [vswhere, "-latest", "-products", "*", "-requires", MSVC_COMPONENT, "-property", "installationPath"]


def vcvars_path(installation: str) -> str:
    return str(PureWindowsPath(installation) / "VC" / "Auxiliary" / "Build" / "vcvars64.bat")


def vcvars_command(vcvars: str) -> str:
    """cmd running vcvars64 then `set`: the activated environment, one NAME=value per line.

    A string, not a list: Python would escape the inner quotes; with /s cmd strips only the outer pair.
    """
    return f'cmd.exe /d /s /c "call "{vcvars}" >nul && set"'


def parse_set_output(text: str) -> dict[str, str]:
    """`set` output -> variables. cmd's hidden per-drive entries (`=C:=C:\\...`) are left out."""
    env = {}
    for line in text.splitlines():
        if "=" not in line or line.startswith("="):
            continue
        name, _, value = line.partition("=")
        env[name] = value.rstrip("\r")
    return env


def _ci_get(environ: Mapping[str, str], name: str) -> str | None:
    for key, value in environ.items():
        if key.upper() == name.upper():
            return value
    return None


def find_msvc(environ: Mapping[str, str] | None = None, run: Callable[..., Any] = process.run,
              exists: Callable[[str], bool] = os.path.exists) -> Msvc:
    """MSVC for x64: the caller's developer prompt if it is one, else vswhere + vcvars64.bat."""
    environ = dict(os.environ if environ is None else environ)
    if _ci_get(environ, "VCINSTALLDIR") and _ci_get(environ, "VCToolsVersion"):
        return Msvc("", "", _ci_get(environ, "VCToolsVersion") or "", environ)
    vswhere = expand_windows_vars(VSWHERE, environ)
    if not exists(vswhere):
        raise WindowsToolchainMissing(f"no Visual Studio found ({vswhere} missing): install the Build Tools "
                                      f"with the component {MSVC_COMPONENT}")
    found = run(vswhere_command(vswhere))
    installation = (found.stdout or "").strip().splitlines()[:1]
    if found.returncode != 0 or not installation:
        raise WindowsToolchainMissing(f"vswhere found no Visual Studio with {MSVC_COMPONENT}")
    vcvars = vcvars_path(installation[0])
    if not exists(vcvars):
        raise WindowsToolchainMissing(f"{vcvars} missing (a Visual Studio without the C++ x64 tools?)")
    activated = run(vcvars_command(vcvars))
    env = parse_set_output(activated.stdout or "")
    if activated.returncode != 0 or not _ci_get(env, "VCToolsVersion"):
        raise WindowsToolchainMissing(f"{vcvars} did not activate MSVC (exit {activated.returncode})")
    return Msvc(installation[0], vcvars, _ci_get(env, "VCToolsVersion") or "", env)


# ----- the CUDA toolkit ----------------------------------------------------------------


def _line(cuda: str) -> tuple[int, int]:
    major, minor = vtuple(cuda)[:2]
    return major, minor


def cuda_home_candidates(cuda: str, environ: Mapping[str, str]) -> list[str]:
    """Where a toolkit of line `cuda` is, in order: CUDA_PATH_V13_0, CUDA_PATH (only when it
    names the same line), the installer's default folder."""
    major, minor = _line(cuda)
    out = []
    specific = _ci_get(environ, f"CUDA_PATH_V{major}_{minor}")
    if specific:
        out.append(specific)
    general = _ci_get(environ, "CUDA_PATH")
    if general and PureWindowsPath(general).name.lower() == f"v{major}.{minor}":
        out.append(general)
    out.append(str(PureWindowsPath(DEFAULT_CUDA_ROOT) / f"v{major}.{minor}"))
    seen, unique = set(), []
    for c in out:
        key = c.rstrip("\\/").lower()
        if key not in seen:
            seen.add(key)
            unique.append(c.rstrip("\\/"))
    return unique


def nvcc_release(version_text: str) -> str | None:
    """'release 13.0, V13.0.88' in `nvcc --version` -> '13.0' (the pattern farm.build.toolkit reads too)."""
    m = NVCC_RELEASE.search(version_text)
    return m.group(1) if m else None


@dataclass(frozen=True)
class WindowsToolkit:
    """An installed toolkit (farm.build.toolkit.BuildToolkit): Windows paths, kept as strings so that
    they read the same on any machine."""

    home: str
    line: str
    version: str = ""                     # nvcc's full version, 13.0.88
    gpu_codes: tuple[str, ...] = ()       # nvcc --list-gpu-code
    gpu_archs: tuple[str, ...] = ()       # nvcc --list-gpu-arch
    components: tuple[str, ...] = ()
    source: str = "system"
    arch: str = "x86_64"
    run: Callable[..., Any] = field(default=process.run, compare=False, repr=False)

    @property
    def nvcc(self) -> str:
        return str(PureWindowsPath(self.home) / "bin" / "nvcc.exe")

    @property
    def bin_dir(self) -> str:
        return str(PureWindowsPath(self.home) / "bin")

    def bin_dirs(self, exists: Callable[[str], bool] = os.path.isdir) -> list[str]:
        # bin\x64 as well, where a toolkit keeps its DLLs there.
        dirs = [self.bin_dir, str(PureWindowsPath(self.home) / "bin" / "x64")]
        return [d for d in dirs if exists(d)]

    @property
    def lib_dir(self) -> str:
        return str(PureWindowsPath(self.home) / "lib" / "x64")

    def stub_dirs(self) -> list[str]:
        return []   # MSVC links cuda.lib from lib\x64; the driver DLL is needed only at run time

    def env(self) -> dict[str, str]:
        return {"CUDA_HOME": self.home, "CUDA_PATH": self.home, "CUDA_ROOT": self.home, "CUDACXX": self.nvcc,
                "CUDA_NVCC_EXECUTABLE": self.nvcc}

    def _probe(self, t: ArchToken) -> bool:
        code = f"{t.sm}{t.variant}"
        proc = self.run([self.nvcc, "--dryrun", "-c", "-x", "cu", "NUL", "-o", "NUL",
                         f"-gencode=arch=compute_{code},code=sm_{code}"])
        return proc.returncode == 0

    def require(self, arch_list: ArchList, cell: str = "") -> None:
        """Fail, naming every missing arch, when this nvcc cannot emit the whole list."""
        if not self.gpu_codes:
            raise ToolkitUnavailable(f"{self.nvcc} --list-gpu-code listed nothing, so the arch list is unchecked")
        gone = unemittable(arch_list, self.gpu_codes, self.gpu_archs, self._probe)
        if gone:
            who = f"{cell}: " if cell else ""
            raise ToolkitCannotEmit(f"{who}CUDA {self.version} nvcc ({self.home}) cannot emit {' '.join(gone)} "
                                    f"for arch list '{arch_list.torch()}' (it emits: {' '.join(self.gpu_codes)})")

    def to_json(self) -> dict[str, Any]:
        return {"home": self.home, "version": self.version, "line": self.line, "source": self.source,
                "arch": self.arch, "gpu_codes": list(self.gpu_codes), "gpu_archs": list(self.gpu_archs),
                "components": list(self.components), "nvcc": self.nvcc}


def _words(run: Callable[..., Any], cmd: list[str]) -> tuple[str, ...]:
    proc = run(cmd)
    return tuple((proc.stdout or "").split()) if proc.returncode == 0 else ()


def find_cuda_toolkit(cuda: str, environ: Mapping[str, str] | None = None, run: Callable[..., Any] = process.run,
                      exists: Callable[[str], bool] = os.path.exists,
                      components: Iterable[str] = ()) -> WindowsToolkit:
    """The installed toolkit of the cell's line that has the recipe's `cuda_components`; its nvcc must
    report that line. Asks that nvcc what it emits, as the Linux toolkit step does (design.md §6.3)."""
    environ = os.environ if environ is None else environ
    want = "{}.{}".format(*_line(cuda))
    comps = normalise_components(components)
    tried = []
    for home in cuda_home_candidates(cuda, environ):
        tk = WindowsToolkit(home, want, run=run)
        if not exists(tk.nvcc):
            tried.append(home)
            continue
        found = NVCC_RELEASE.search(run([tk.nvcc, "--version"]).stdout or "")
        if not found or found.group(1) != want:
            tried.append(f"{home} (nvcc says {found.group(1) if found else '?'})")
            continue
        lacking = [c for c in comps if not _has_header(home, COMPONENT_HEADER.get(c), exists)]
        if lacking:
            tried.append(f"{home} (without {', '.join(lacking)})")
            continue
        return WindowsToolkit(home, want, found.group(2), _words(run, [tk.nvcc, "--list-gpu-code"]),
                              _words(run, [tk.nvcc, "--list-gpu-arch"]), comps, run=run)
    raise WindowsToolchainMissing(f"no CUDA {want} toolkit (tried {'; '.join(tried)}); install it or set "
                                  f"CUDA_PATH_V{want.replace('.', '_')}")


def _has_header(home: str, headers: str | Sequence[str] | None, exists: Callable[[str], bool]) -> bool:
    if headers is None:
        return True   # nothing known to look for
    names = (headers,) if isinstance(headers, str) else headers
    return any(exists(str(PureWindowsPath(home) / "include" / PureWindowsPath(h))) for h in names)


# ----- the compile environment -----------------------------------------------------------


def adapt_compile_environment(linux_env: Mapping[str, str], *, msvc: Msvc, toolkit: WindowsToolkit,
                              torch_bin_dirs: Sequence[str] = (), caller: Mapping[str, str] | None = None,
                              isdir: Callable[[str], bool] = os.path.isdir) -> dict[str, str]:
    """farm.build.compile.compile_environment()'s result, made right for Windows.

    Kept: the arch list variables, MAX_JOBS, NVCC_APPEND_FLAGS, FORCE_CUDA, the PIP_*
    isolation and the recipe's own variables. Changed: PATH (the torch env's Scripts and its base's, the
    toolkit's bin, then MSVC's), CUDA_* from the installed toolkit, the CPATH include
    folders moved into MSVC's INCLUDE and the toolkit's lib\\x64 into LIB. Dropped:
    gcc-only flags and paths. Added: DISTUTILS_USE_SDK=1, so setuptools uses the
    activated MSVC instead of searching for its own (torch's cpp_extension expects it).
    """
    caller = dict(os.environ if caller is None else caller)
    env = {k: v for k, v in linux_env.items() if k not in _LINUX_ONLY and k != "PATH"}
    for name in _WINDOWS_PASS:
        value = _ci_get(caller, name)
        if value is not None:
            env[name] = value
    msvc_env = msvc.env or {}
    for name in ("INCLUDE", "LIB", "LIBPATH", "VCINSTALLDIR", "VCToolsInstallDir", "VCToolsVersion",
                 "VSINSTALLDIR", "WindowsSdkDir", "WindowsSDKVersion", "UCRTVersion", "UniversalCRTSdkDir",
                 "Platform", "VSCMD_ARG_TGT_ARCH"):
        value = _ci_get(msvc_env, name)
        if value is not None:
            env[name] = value
    includes = [p for p in (linux_env.get("CPATH") or "").split(os.pathsep) if p]
    env["INCLUDE"] = ";".join([*includes, *[p for p in env.get("INCLUDE", "").split(";") if p]])
    env["LIB"] = ";".join([toolkit.lib_dir, *[p for p in env.get("LIB", "").split(";") if p]])
    path = [*torch_bin_dirs, *toolkit.bin_dirs(isdir)]
    path += [p for p in (_ci_get(msvc_env, "PATH") or _ci_get(caller, "PATH") or "").split(";") if p]
    seen, ordered = set(), []
    for p in path:
        if p.lower() not in seen:
            seen.add(p.lower())
            ordered.append(p)
    env["PATH"] = ";".join(ordered)
    env.update(toolkit.env())
    env["DISTUTILS_USE_SDK"] = "1"
    return {k: v for k, v in env.items() if v != ""}


def repair_note() -> str:
    """What the build record says instead of a repair (design.md §6.6)."""
    return f"windows wheel: not repaired (tag {WHEEL_PLAT}; delvewheel is a later option)"


class WindowsPlatform:
    """farm.build.platform's implementation for a `windows` cell: what the steps call on a Windows host.

    `host` is this machine unless a test injects recorded tool output (see the module's docstring);
    on a host that is not Windows every method refuses in one line (NotBuildableHere, exit 2)."""

    name = PLATFORM

    def __init__(self, host: WindowsHost | None = None):
        self.host = host or WindowsHost()

    def _check_host(self, what: str) -> None:
        if not is_windows_host(self.host.system):
            raise NotBuildableHere(f"the {what} of a Windows cell runs only on a Windows host; this host is "
                                   f"{self.host.system or 'unknown'}")

    def toolkit(self, cuda: str, *, arch: str, components: Iterable[str], source: str | None,
                log: Callable[[str], None]) -> WindowsToolkit:
        """The installed toolkit of the line: NVIDIA's PyPI wheels assemble Linux toolkits only."""
        self._check_host("toolkit step")
        if source == "pypi":
            raise ToolkitUnavailable(f"CUDA {cuda}: FARM_TOOLKIT_SOURCE=pypi assembles Linux toolkits only; a "
                                     "Windows cell uses the toolkit NVIDIA's installer put on this host")
        if arch != "x86_64":
            raise NotBuildableHere(f"a Windows cell builds for x86_64 (win_amd64), not {arch}")
        tk = find_cuda_toolkit(cuda, self.host.environ, run=self.host.run, exists=self.host.exists,
                               components=components)
        log(f"toolkit: CUDA {tk.version} (installed) at {tk.home}")
        return tk

    def compile_environment(self, **kw: Any) -> dict[str, str]:
        from farm.build.compile import compile_environment

        self._check_host("compile step")
        toolkit = kw["toolkit"]
        if not isinstance(toolkit, WindowsToolkit):   # the toolkit step ran the Linux path: a farm bug
            raise ToolkitUnavailable(f"a Windows cell got a Linux toolkit ({toolkit.home})")
        torch_env = kw.get("torch_env")
        bin_dirs = [str(d) for d in torch_env.bin_dirs()] if torch_env is not None else []
        msvc = find_msvc(self.host.environ, run=self.host.run, exists=self.host.exists)
        # cl.exe has no -ffile-prefix-map (nvcc would hand it over from NVCC_APPEND_FLAGS): no folder maps here
        linux = compile_environment(**{**kw, "host_folders": ()}, base=self.host.environ)
        return adapt_compile_environment(linux, msvc=msvc, toolkit=toolkit, torch_bin_dirs=bin_dirs,
                                         caller=self.host.environ, isdir=self.host.isdir)

    def repair(self, wheel: Path, out_dir: Path, **_ignored: Any) -> RepairResult:
        from farm.build.repair import RepairResult

        return RepairResult(wheel, False, reason=repair_note())
