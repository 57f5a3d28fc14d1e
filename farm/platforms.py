"""The one mapping between platform spellings.

Policy and recipes say `linux`, `windows`, `linux_aarch64`; the PCWM says
`linux_x86_64` for x86 Linux because that is what it observed; wheels carry
platform tags. Lanes group platforms that share arch lists.
"""

from __future__ import annotations

import platform as _platform
import re
from pathlib import Path

PLATFORMS = ("linux", "windows", "linux_aarch64")
# What a person reads for each platform ("any": a platform-independent wheel).
LABELS = {"linux": "Linux x86_64", "windows": "Windows x86_64", "linux_aarch64": "Linux aarch64 (ARM)",
          "any": "any platform"}
X86_LANE = "x86"
ARM_LANE = "aarch64"

_FROM_PCWM = {"linux_x86_64": "linux", "windows": "windows", "linux_aarch64": "linux_aarch64"}
_TO_PCWM = {v: k for k, v in _FROM_PCWM.items()}
_CELL_SUFFIX = {"linux": "", "windows": "-win", "linux_aarch64": "-aarch64"}


def lane(platform: str) -> str:
    """x86 lane = linux and windows; ARM lane = linux_aarch64."""
    return ARM_LANE if platform == "linux_aarch64" else X86_LANE


def cell_arch(platform: str) -> str:
    """The machine a cell's platform builds for: linux_aarch64 -> aarch64, else x86_64."""
    return "aarch64" if platform == "linux_aarch64" else "x86_64"


def from_pcwm(pcwm_platform: str) -> str:
    return _FROM_PCWM[pcwm_platform]


def to_pcwm(platform: str) -> str:
    return _TO_PCWM[platform]


def cell_suffix(platform: str) -> str:
    """The cell id suffix: '' for linux, '-win', '-aarch64'."""
    return _CELL_SUFFIX[platform]


def from_wheel_platform_tag(tag: str) -> str | None:
    """A wheel's platform tag -> farm platform, or None when the farm does not target it."""
    if tag == "win_amd64":
        return "windows"
    if tag.endswith("aarch64"):
        return "linux_aarch64"
    if tag == "linux_x86_64" or (tag.startswith("manylinux") and tag.endswith("_x86_64")):
        return "linux"
    return None


def is_valid(platform: str) -> bool:
    return platform in PLATFORMS


_MANYLINUX_ALIASES = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_MANYLINUX = re.compile(r"(manylinux_(\d+)_(\d+)|manylinux1|manylinux2010|manylinux2014)"   # fullmatch
                        r"(?:_(x86_64|aarch64|i686|ppc64le|s390x|armv7l))?")


def plat_glibc(tag: str) -> tuple[int, int]:
    """The glibc a manylinux tag promises: 'manylinux_2_28[_x86_64]' or 'manylinux2014_x86_64' -> (2, 28).

    ValueError for anything else (linux_x86_64, win_amd64, ...).
    """
    m = _MANYLINUX.fullmatch(tag)
    if not m:
        raise ValueError(tag)
    if m.group(2):
        return int(m.group(2)), int(m.group(3))
    return _MANYLINUX_ALIASES[m.group(1)]


def origin_relative(rpath_entry: str) -> bool:
    """Whether an RPATH/RUNPATH entry points inside the installed wheel, the only kind a portable
    Linux wheel may carry: the gate checks it (farm.build.verify), the repair step enforces it."""
    return rpath_entry.startswith(("$ORIGIN", "${ORIGIN}"))


def host_arch() -> str:
    """This machine's CPU in the farm's spelling: x86_64 or aarch64 (Windows says AMD64, macOS arm64)."""
    m = _platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def host_platform() -> str:
    """The farm platform whose wheels this machine installs: linux, linux_aarch64 or windows."""
    if _platform.system() == "Windows":
        return "windows"
    return "linux_aarch64" if host_arch() == "aarch64" else "linux"


def meminfo_gb(field: str) -> float | None:
    """A /proc/meminfo field (MemTotal, MemAvailable) in GiB, or None where there is none (not Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / (1024 * 1024)
    except OSError:
        pass
    return None


def marker_environment(platform: str, python: str) -> dict[str, str]:
    """PEP 508 marker values of a cell's target (platform, Python 'X.Y'), for deciding on the host which of a
    recipe's requirements the target takes: pip evaluates markers for the Python it runs on, even when it
    downloads for another (`--python-version`). The patch level is unknown: taken as 0."""
    windows = platform == "windows"
    return {"python_version": python, "python_full_version": f"{python}.0", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "os_name": "nt" if windows else "posix",
            "sys_platform": "win32" if windows else "linux", "platform_system": "Windows" if windows else "Linux",
            "platform_machine": {"linux": "x86_64", "windows": "AMD64", "linux_aarch64": "aarch64"}[platform]}
