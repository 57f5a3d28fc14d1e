"""No path of the build host in what a wheel carries (design.md §6.4, §6.5).

One table names the folders a build reads from, each with the symbolic name that stands for it:

    farm-work     the cell's work folder (the source tree is farm-work/src)
    farm-env      the torch environment (and an overlay's base)
    farm-python   the Python installation the environment was made from (its include/pythonX.Y headers)
    farm-cuda     the CUDA toolkit
    farm-cache    the farm's cache folder (whatever else of it a build reads)
    farm-project  the farm's own checkout
    ~             the home folder (farm_build.json only: a shell would expand it in a flag)

The compile maps them in the binaries (`-ffile-prefix-map`, for gcc and through nvcc for the host
compiler: `__FILE__` of torch's and Python's headers, the source's own asserts); the label step maps
them in farm_build.json. The names hold no `$` and no space: the flags pass through ninja files and
/bin/sh, where `$` means something. The same names on both runners, so a container build and a host
build of one build key embed the same strings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from farm.build.environments import TorchEnv

# A token that starts an absolute POSIX path: a '/' at the start of a string or after a space, quote,
# bracket or '=' (never after a word character or ':', which a URL's or an arch provenance's '/' follows).
_ABSOLUTE = re.compile(r"""(?:^|(?<=[\s"'(\[=,]))/[^\s"'()\[\],]*""")
HOST = "<host>"   # what an absolute path outside every named folder becomes in farm_build.json: <host>/<its name>


def host_folders(*, work: Path | str | None = None, torch_env: TorchEnv | None = None, python_include: Iterable[Path | str] = (),
                 toolkit_home: PurePath | str | None = None, cache: Path | str | None = None,
                 project: Path | str | None = None, home: Path | str | None = None) -> list[tuple[str, str]]:
    """(folder, symbolic name) pairs, the most specific folder first (a work folder lies in the cache).

    `torch_env`: a farm.build.environments.TorchEnv (its path and an overlay's base);
    `python_include`: the header folders of the Python the environment was made from."""
    pairs: list[tuple[str, str]] = []

    def add(folder: PurePath | str | None, name: str) -> None:
        text = str(folder).rstrip("/") if folder else ""
        if text and text not in ("", "/") and not any(text == old for old, _ in pairs):
            pairs.append((text, name))

    add(work, "farm-work")
    if torch_env is not None:
        add(torch_env.path, "farm-env")
        add(torch_env.base, "farm-env")
    for folder in python_include:
        add(folder, f"farm-python/include/{Path(folder).name}")
    add(toolkit_home, "farm-cuda")
    add(cache, "farm-cache")
    add(project, "farm-project")
    add(home, "~")
    # the longest folder first: a more specific one must win over the folder that holds it
    return sorted(pairs, key=lambda p: -len(p[0]))


def python_include_dirs(env_path: Path | str) -> list[Path]:
    """The `include/python*` folders of the Python a venv was made from (pyvenv.cfg's `home` is its bin):
    where Python.h and object.h come from, through torch's `-I`."""
    cfg = Path(env_path) / "pyvenv.cfg"
    try:
        lines = cfg.read_text().splitlines()
    except OSError:
        return []
    home = next((ln.split("=", 1)[1].strip() for ln in lines if ln.split("=", 1)[0].strip() == "home"), "")
    if not home:
        return []
    return sorted(p for p in (Path(home).parent / "include").glob("python3*") if p.is_dir())


def prefix_map_flags(folders: Sequence[tuple[str, str]]) -> list[str]:
    """`-ffile-prefix-map=<folder>=<name>` per folder that can travel as one flag (no space, '=' or '$').

    gcc tries the maps last given first: the list goes out most general first, so the most specific
    folder (the work folder inside the cache) wins."""
    usable = [(old, new) for old, new in folders if not re.search(r"[\s=$\"'\\]", old)]
    return [f"-ffile-prefix-map={old}={new}" for old, new in reversed(usable)]


def nvcc_prefix_map_flags(flags: Sequence[str]) -> list[str]:
    """The same maps for nvcc's host compiler (`-Xcompiler <flag>`, one per flag: a comma in a folder
    would split a joined list)."""
    return [f"-Xcompiler={flag}" for flag in flags if "," not in flag]


def portable(value: Any, folders: Sequence[tuple[str, str]]) -> Any:
    """`value` (JSON-like) with every absolute path in its strings made symbolic: a path inside a named
    folder becomes `<name>/<rest>`, any other `<host>/<its last name>`. Keys are kept."""
    if isinstance(value, Mapping):
        return {k: portable(v, folders) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, folders) for v in value]
    if isinstance(value, str):
        return _ABSOLUTE.sub(lambda m: _symbolic(m.group(0), folders), value)
    return value


def _symbolic(path: str, folders: Sequence[tuple[str, str]]) -> str:
    for old, new in folders:
        if path == old or path.startswith(old + "/"):
            return new + path[len(old):]
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return f"{HOST}/{name}" if name else HOST


def host_paths_in(value: object, needles: Iterable[str] = (), where: str = "") -> list[str]:
    """Where `value` (JSON-like) still holds a host path: `key.path: text` for each string that starts
    with '/', holds an absolute path token, or contains one of `needles` (the home or cache folder)."""
    wanted = [n for n in needles if n]
    found: list[str] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            found += host_paths_in(v, wanted, f"{where}.{k}" if where else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found += host_paths_in(v, wanted, f"{where}[{i}]")
    elif isinstance(value, str):
        if value.startswith("/") or _ABSOLUTE.search(value) or any(n in value for n in wanted):
            found.append(f"{where}: {value}")
    return found


def home_folder() -> str:
    return os.path.expanduser("~")
