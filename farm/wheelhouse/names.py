"""Reading what a farm wheel's file name says: project, version, local label, tags.

A farm wheel carries its cell in its local version label: `+cu128torch2.8`
for torch-linked wheels, `+cu128` for torch-free ones (design.md §6.5).
Anything else is refused with one line naming the file.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from farm.errors import BadInput
from farm.platforms import cell_suffix, from_wheel_platform_tag
from farm.versions import cuda_from_tag, cuda_tag

# The build record a farm wheel carries in its .dist-info (design.md §4.5): label writes it, recover reads it.
BUILD_INFO_NAME = "farm_build.json"
_LABEL = re.compile(r"(cu\d{2,})(?:torch(\d+)\.(\d+))?")
_CPYTHON = re.compile(r"cp(\d)(\d+)")
_PYFLOOR = re.compile(r">=\s*(\d+)\.(\d+)")

# The newest CPython an abi3 / py3-none wheel is listed for in the comfy-env view
# when its build record does not name the row's Pythons.
PYTHON_CEILING = (3, 15)
PYTHON_FLOOR = (3, 10)  # python_min of the owned grid policy


def normalize(name: str) -> str:
    """PEP 503 project name: lower case, runs of -_. become one '-'."""
    return canonicalize_name(name)


def hyphen_name(name: str) -> str:
    """The spelling comfy-env asks for: lower case, '_' -> '-' (dots kept)."""
    return name.lower().replace("_", "-")


@dataclass(frozen=True)
class WheelName:
    file: str
    name: str            # distribution name as spelled in the file name
    project: str         # PEP 503-normalised
    version: str         # full version with local label
    public_version: str
    build_tag: str | None
    python_tag: str      # e.g. cp311, cp39, py3 (may be dotted: py2.py3)
    abi_tag: str         # cp311, abi3, none
    platform_tag: str    # manylinux_2_28_x86_64, win_amd64, any, ...
    cuda: str            # '12.8'
    torch: str | None    # '2.8', None for torch-free wheels

    @property
    def label(self) -> str:
        cu = "cu" + self.cuda.replace(".", "")
        return f"{cu}torch{self.torch}" if self.torch else cu

    @property
    def platform(self) -> str | None:
        """linux | windows | linux_aarch64, or None for a platform-independent wheel."""
        return from_wheel_platform_tag(self.platform_tag)

    @property
    def python_floor(self) -> tuple[int, int] | None:
        """cp311 -> (3, 11); abi3 cp39 -> (3, 9); py3 -> None (unknown from the name)."""
        m = _CPYTHON.fullmatch(self.python_tag.split(".")[0])
        return (int(m.group(1)), int(m.group(2))) if m else None

    @property
    def version_specific(self) -> bool:
        """True for cpXY-cpXY wheels: one Python only. abi3 and py3-none serve every Python above a floor."""
        return self.abi_tag not in ("abi3", "none")

    def cell_id(self) -> str:
        """design.md §5.2 cell id derived from the file name (used when no build record names the cell)."""
        floor = self.python_floor
        py = f"py{floor[0]}{floor[1]}" if floor else "py3"
        torch = f"-torch{self.torch}" if self.torch else ""
        cu = "cu" + self.cuda.replace(".", "")
        suffix = cell_suffix(self.platform) if self.platform else ""
        return f"{self.project}-{cu}{torch}-{py}{suffix}"


def parse_wheel_name(file: str, where: str | None = None) -> WheelName:
    """Parse a farm wheel file name or raise BadInput (one line naming the file)."""
    where = where or file
    try:
        name, version, build, tags = parse_wheel_filename(file)
    except InvalidWheelFilename as exc:
        raise BadInput(where, "file name", file,
                       f"not a wheel file name (name-version[-build]-python-abi-platform.whl): {exc}") from None
    local = version.local
    m = _LABEL.fullmatch(local or "")
    if not m:
        raise BadInput(where, "local version label", local or "",
                       "a farm wheel carries +cuNNNtorchM.m or +cuNNN (e.g. 0.1.0+cu128torch2.8)")
    cuda = cuda_from_tag(m.group(1))
    torch = f"{int(m.group(2))}.{int(m.group(3))}" if m.group(2) else None
    # The file's own tag triple (compressed sets like py2.py3 kept as written).
    stem = file[: -len(".whl")]
    python_tag, abi_tag, platform_tag = stem.rsplit("-", 3)[-3:]
    if len({t.platform for t in tags}) != 1:
        raise BadInput(where, "platform tag", platform_tag, "a farm wheel has exactly one platform tag")
    build_tag = f"{build[0]}{build[1]}" if build else None
    raw_name = stem.split("-", 1)[0]
    return WheelName(file=file, name=raw_name, project=normalize(name), version=str(version),
                     public_version=version.public, build_tag=build_tag, python_tag=python_tag,
                     abi_tag=abi_tag, platform_tag=platform_tag, cuda=cuda, torch=torch)


def served_pythons(wheel: WheelName, requires_python: str | None) -> tuple[str, ...]:
    """The Pythons a wheel is listed for in views that match on cpXY (comfy-env).

    cpXY-cpXY: that Python. abi3 / py3-none: from its floor (the tag, else
    Requires-Python's `>=`, else the farm's python_min) up to PYTHON_CEILING.
    """
    floor = wheel.python_floor
    if floor and wheel.version_specific:
        return (f"{floor[0]}.{floor[1]}",)
    if floor is None:
        m = _PYFLOOR.search(requires_python or "")
        floor = (int(m.group(1)), int(m.group(2))) if m else PYTHON_FLOOR
    floor = max(floor, PYTHON_FLOOR) if floor[0] == 3 else PYTHON_FLOOR
    return tuple(f"3.{minor}" for minor in range(floor[1], PYTHON_CEILING[1] + 1))


@functools.lru_cache(maxsize=1024)
def channel_root(cuda: str, torch: str) -> str:
    """A channel's folder in the house: `cu130/torch2.13` (design.md §9.1)."""
    return f"{cuda_tag(cuda)}/torch{torch}"
