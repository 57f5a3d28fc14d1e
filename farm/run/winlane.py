"""The Windows lane's set-up in the generated workflows (design.md §11.7): what a `windows-2022` job
runs before `farm build <cell>-win`, for the cell's CUDA line.

- The CUDA toolkit of exactly that line, from NVIDIA's network installer run silently (`-s`) with
  the subpackages a torch extension compiles and links against: nvcc (and, from 13.0 on, its crt
  headers and nvvm, split out of it), the runtime, CCCL (`thrust`), and the libraries whose headers
  torch's ATen/cuda headers include (cublas, cusparse, cusolver) or extensions use (curand, cufft,
  nvrtc, nvjitlink, nvtx), each with its `_dev` part. It lands where NVIDIA's installer always puts
  it, the folder farm.build.windows.find_cuda_toolkit looks in.
- CUDA_PATH, CUDA_PATH_V<major>_<minor> and CUDA_HOME exported for the later steps, its bin on PATH.
- MSVC: nothing to install. windows-2022 carries Visual Studio 2022 with the x64 C++ tools, and the
  build step finds it itself, as on any Windows host (`find_msvc`: vswhere, then what vcvars64.bat
  sets), so no third-party action sets up a developer prompt. One step runs that same lookup early,
  so a runner image without the C++ tools fails before the toolkit download.

The installers are pinned per line in `INSTALLERS`, one table: the line's last update, whose
version the build record shows (nvcc reports it).
"""

from __future__ import annotations

from pathlib import PureWindowsPath

from farm.build.toolkit import cuda_line
from farm.build.windows import DEFAULT_CUDA_ROOT
from farm.errors import BadInput
from farm.versions import vtuple

# CUDA line -> the toolkit release whose Windows network installer the lane runs. The URLs follow
# NVIDIA's download archive (developer.nvidia.com/cuda-toolkit-archive, "Windows / x86_64 /
# exe (network)"): compute/cuda/<release>/network_installers/cuda_<release>_windows_network.exe.
INSTALLERS = {
    "12.4": "12.4.1",
    "12.6": "12.6.3",
    "12.8": "12.8.1",
    "12.9": "12.9.1",
    "13.0": "13.0.2",
    "13.2": "13.2.0",
}
DOWNLOAD_BASE = "https://developer.download.nvidia.com/compute/cuda"
# Subpackages, without their _<major>.<minor> suffix. The _dev parts carry headers and import libraries.
SUBPACKAGES = ("nvcc", "cudart", "thrust", "cublas", "cublas_dev", "cusparse", "cusparse_dev", "cusolver",
               "cusolver_dev", "curand", "curand_dev", "cufft", "cufft_dev", "nvrtc", "nvrtc_dev", "nvjitlink",
               "nvtx", "visual_studio_integration")
# From CUDA 13.0 the installer ships nvcc's crt headers (host_config.h) and nvvm (cicc) on their own:
# without them nvcc cannot compile a .cu file.
SUBPACKAGES_13 = ("crt", "nvvm")


def installer_url(cuda: str) -> str:
    release = _release(cuda)
    return f"{DOWNLOAD_BASE}/{release}/network_installers/cuda_{release}_windows_network.exe"


def _release(cuda: str) -> str:
    line = cuda_line(cuda, "farm ci github")
    if line not in INSTALLERS:
        raise BadInput("farm/run/winlane.py", "INSTALLERS", line,
                       f"no Windows installer pinned for CUDA {line} (pinned: {', '.join(INSTALLERS)})")
    return INSTALLERS[line]


def subpackages(cuda: str) -> list[str]:
    """The installer's -s arguments for this line: `nvcc_13.0 cudart_13.0 ...`."""
    line = cuda_line(cuda, "farm ci github")
    names = SUBPACKAGES + (SUBPACKAGES_13 if vtuple(line)[0] >= 13 else ())
    return [f"{name}_{line}" for name in names]


def toolkit_home(cuda: str) -> str:
    """Where NVIDIA's installer puts the line: the folder find_cuda_toolkit tries last, by default."""
    return str(PureWindowsPath(DEFAULT_CUDA_ROOT) / f"v{cuda_line(cuda, 'farm ci github')}")


# PowerShell: download, run silently (-n: no reboot), fail by name when nvcc.exe is not there after.
_INSTALL = """$ErrorActionPreference = 'Stop'
$installer = Join-Path $env:RUNNER_TEMP 'cuda_windows_network.exe'
curl.exe --fail --location --silent --show-error --retry 5 --retry-delay 10 --output $installer $env:CUDA_INSTALLER_URL
if ($LASTEXITCODE -ne 0) { throw "download failed: $env:CUDA_INSTALLER_URL" }
$arguments = @('-s') + $env:CUDA_SUBPACKAGES.Split(' ') + @('-n')
$proc = Start-Process -FilePath $installer -ArgumentList $arguments -Wait -PassThru -NoNewWindow
if ($proc.ExitCode -ne 0) { throw "the CUDA installer exited $($proc.ExitCode)" }
$nvcc = Join-Path $env:CUDA_TOOLKIT_HOME 'bin\\nvcc.exe'
if (-not (Test-Path $nvcc)) { throw "the CUDA installer left no $nvcc" }"""

_EXPORT = """$ErrorActionPreference = 'Stop'
"CUDA_PATH=$env:CUDA_TOOLKIT_HOME" | Out-File -FilePath $env:GITHUB_ENV -Encoding utf8 -Append
"$env:CUDA_PATH_VARIABLE=$env:CUDA_TOOLKIT_HOME" | Out-File -FilePath $env:GITHUB_ENV -Encoding utf8 -Append
"CUDA_HOME=$env:CUDA_TOOLKIT_HOME" | Out-File -FilePath $env:GITHUB_ENV -Encoding utf8 -Append
(Join-Path $env:CUDA_TOOLKIT_HOME 'bin') | Out-File -FilePath $env:GITHUB_PATH -Encoding utf8 -Append
& (Join-Path $env:CUDA_TOOLKIT_HOME 'bin\\nvcc.exe') --version"""

_MSVC = ("python -c \"from farm.build.windows import find_msvc; m = find_msvc(); "
         "print('MSVC', m.tools_version, 'at', m.installation or 'a developer prompt')\"")


def windows_setup_steps(cuda: str) -> list[dict]:
    """The steps a windows-2022 build job runs, after the farm is installed, for cells of CUDA line `cuda`."""
    line = cuda_line(cuda, "farm ci github")
    home = toolkit_home(line)
    major, minor = line.split(".")
    return [
        {"name": f"Install the CUDA {line} toolkit ({_release(line)}, NVIDIA's network installer)",
         "shell": "pwsh",
         "env": {"CUDA_INSTALLER_URL": installer_url(line), "CUDA_SUBPACKAGES": " ".join(subpackages(line)),
                 "CUDA_TOOLKIT_HOME": home},
         "run": _INSTALL},
        {"name": f"Export CUDA_PATH, CUDA_PATH_V{major}_{minor} and CUDA_HOME",
         "shell": "pwsh",
         "env": {"CUDA_TOOLKIT_HOME": home, "CUDA_PATH_VARIABLE": f"CUDA_PATH_V{major}_{minor}"},
         "run": _EXPORT},
        # No action sets up MSVC: the build finds it itself (vswhere + vcvars64.bat); this runs that lookup now.
        {"name": "Find MSVC as the build will (vswhere, vcvars64.bat)", "run": _MSVC},
    ]

