"""Every FARM_* environment variable the farm reads, declared once, and where the farm's files are.

Each `Setting` has its name, its default and one line of documentation; code
reads it through the setting (`settings.ENGINE.get()`) or through a typed
accessor below (`cache_dir()`), never through os.environ by name. The README's
"Settings" section is generated from this table: `python -m farm.settings --markdown`
(tests/test_layout.py checks that the two agree).

All settings are read at call time, never at import: tests set them per test or
per child process, and the container runner sets FARM_CACHE and FARM_IN_CONTAINER
in the environment of the step it starts. Parsing (a number, a choice) stays with
the code that uses the value, which names the setting in its error line.

Not settings: variables the farm sets for others to read (FARM_ENV for a recipe's
pre_build script, FARM_PROBE as an output marker, and FARM_WHEELHOUSE_URL,
FARM_WHEELHOUSE_PULL, FARM_WHEELHOUSE_PUSH and FARM_CI_LAYOUT of the generated CI workflow).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Setting:
    name: str
    default: str | None    # None: unset means what `shown` says
    doc: str
    shown: str = ""        # the default as the README shows it, when it is not a plain value

    def get(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The value in the environment now (os.environ unless given), else the default."""
        return (os.environ if environ is None else environ).get(self.name, self.default)

    def value(self, environ: Mapping[str, str] | None = None) -> str:
        """get() of a setting that has a default, so never None."""
        value = self.get(environ)
        if value is None:
            raise TypeError(f"{self.name} has no default; read it with get()")
        return value


SETTINGS: list[Setting] = []


def _declare(name: str, default: str | None, doc: str, shown: str = "") -> Setting:
    setting = Setting(name, default, doc, shown)
    SETTINGS.append(setting)
    return setting


# ---------------------------------------------------------------- where things are
CACHE = _declare("FARM_CACHE", None, "heavy things that survive runs: toolkits, torch environments, images",
                 "~/.cache/farm")
DEFAULTS = _declare("FARM_DEFAULTS", None, "the folder of the farm's policy files", "defaults/ in the project")
RECIPES = _declare("FARM_RECIPES", None, "the recipes folder (with patches/<name>/ and records/ in it); "
                   "--recipes DIR sets it for one command", "recipes/ in the project")
WHEELHOUSE = _declare("FARM_WHEELHOUSE", None, "the wheelhouse when --wheelhouse is not given",
                      "wheelhouse/ in the project (farm run, demo) or in the current folder (index commands)")
CCACHE_DIR = _declare("FARM_CCACHE_DIR", None, "replaces FARM_CACHE/ccache as the compiler cache (both runners; CI restores it)",
                      "FARM_CACHE/ccache")
CACHE_BUDGET_GB = _declare("FARM_CACHE_BUDGET_GB", None, "size of the cache in GB before old entries go (0 = unlimited)",
                           "80")
CACHE_RESERVE_GB = _declare("FARM_CACHE_RESERVE_GB", "10", "GB of disk the cache always leaves free")

# ---------------------------------------------------------------- toolkits, indexes, engines
CUDA_HOME = _declare("FARM_CUDA_HOME", None, "an installed CUDA toolkit to try before /usr/local/cuda*", "none")
TOOLKIT_SOURCE = _declare("FARM_TOOLKIT_SOURCE", None, "where a build's CUDA toolkit comes from: auto, pypi, system or image",
                          "pypi in a container, auto on the host")
IN_CONTAINER = _declare("FARM_IN_CONTAINER", None, "1 inside a build container (the container runner sets it)", "unset")
TORCH_INDEX_URL = _declare("FARM_TORCH_INDEX_URL", "https://download.pytorch.org/whl",
                           "PyTorch's wheel index (per-CUDA folders below it)")
PYPI_URL = _declare("FARM_PYPI_URL", "https://pypi.org", "PyPI's base URL, for sdists")
INDEX_URL = _declare("FARM_INDEX_URL", "http://127.0.0.1:8000/", "where the farm's own index is served")
DEBIAN_MIRROR = _declare("FARM_DEBIAN_MIRROR", "http://deb.debian.org/debian", "the Debian mirror for base images")
ENGINE = _declare("FARM_ENGINE", None, "the container engine: docker, podman or a path", "the first of docker, podman that answers")
CONTAINER_MEMORY = _declare("FARM_CONTAINER_MEMORY", None,
                            "memory limit of a build container, e.g. 16g (0: none)", "the host's memory less 2 GB")
HOST_COMPILER = _declare("FARM_HOST_COMPILER", "toolchain",
                         "a container build's host compiler: toolchain (the image's gcc 10 on a glibc 2.31 sysroot, "
                         "where it has one) or image (the image's own gcc; keyed apart, for comparisons)")
EMULATED_JOBS = _declare("FARM_EMULATED_JOBS", None, "emulated aarch64 cells built at once", "1")
MANYLINUX_FLOOR = _declare("FARM_MANYLINUX_FLOOR", None,
                           "raises every Linux cell's manylinux floor to this tag (e.g. manylinux_2_34) for a builder "
                           "that cannot reach torch's; never lowers it (design.md §7.8)", "torch's wheel's tag")
STALL_MINUTES = _declare("FARM_STALL_MINUTES", None,
                         "minutes a compile or pre_build may go without progress before it is killed, for every recipe "
                         "(x9 emulated)", "the recipe's timeout")

# ---------------------------------------------------------------- records, tests and benchmarks
RECORD = _declare("FARM_RECORD", None, "1: `farm build` writes the recipe's build record (as --record)", "unset")
START_MARK = _declare("FARM_START_MARK", None, "a file the CLI writes its start time to (benchmarks)", "unset")
WHEELHOUSE_FAULT_AT = _declare("FARM_WHEELHOUSE_FAULT_AT", None,
                               "N: a wheelhouse writer dies at its Nth crash point (crash tests)", "unset")
WHEELHOUSE_STEPS = _declare("FARM_WHEELHOUSE_STEPS", None, "a file each wheelhouse crash point appends its name to",
                            "unset")
WHEELHOUSE_STEP_FD = _declare("FARM_WHEELHOUSE_STEP_FD", None,
                              "a file descriptor each wheelhouse crash point writes one byte to", "unset")


# ---------------------------------------------------------------- typed accessors

def _path(setting: Setting, fallback: Path) -> Path:
    value = setting.get()
    return Path(value) if value is not None else fallback


def defaults_dir() -> Path:
    return _path(DEFAULTS, PROJECT_ROOT / "defaults")


def recipes_dir() -> Path:
    return _path(RECIPES, PROJECT_ROOT / "recipes")


def use_recipes_dir(folder: Path) -> None:
    """`--recipes DIR` is FARM_RECIPES for this command: exported (absolute, since a child may run
    elsewhere) so every reader below it and every child it starts (farm run's builds, a row's
    siblings) reads the same folder (design.md §4.6)."""
    os.environ[RECIPES.name] = str(Path(folder).resolve())


def cache_dir() -> Path:
    """Heavy things that survive runs on one machine: toolkits, torch environments, images."""
    return _path(CACHE, Path.home() / ".cache" / "farm")


def ccache_dir() -> Path:
    """cache_dir()/ccache, or FARM_CCACHE_DIR: a cache of its own (a cold one for benchmarks, the folder a CI
    job restores and saves); both runners use it, a container has it mounted at /farm/cache/ccache. Here,
    not in farm/build/ccache.py, because the runners that mount it sit above the build (design.md §1.1)."""
    own = CCACHE_DIR.get()
    return Path(own) if own else cache_dir() / "ccache"


def work_dir(cell_id: str) -> Path:
    """A cell's work folder on this machine, cache_dir()/work/<cell id>: its source tree and build tree,
    shared by every build of the cell here (one at a time, under work_dir(".locks")/<cell id>.lock)."""
    return cache_dir() / "work" / cell_id


def wheelhouse_dir() -> Path:
    """The project's wheelhouse (farm run, farm demo)."""
    return _path(WHEELHOUSE, PROJECT_ROOT / "wheelhouse")


def default_wheelhouse(given: str | os.PathLike | None = None) -> Path:
    """The index commands' wheelhouse: --wheelhouse, else $FARM_WHEELHOUSE (when not empty), else ./wheelhouse."""
    if given:
        return Path(given)
    value = WHEELHOUSE.get()
    return Path(value) if value else Path.cwd() / "wheelhouse"


def display(path: str | os.PathLike[str]) -> str:
    """A path as the user should read it in a message: relative to the project when inside it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(p)


def markdown() -> str:
    """The README's Settings table."""
    rows = ["| Variable | Default | What it sets |", "| --- | --- | --- |"]
    rows += [f"| `{s.name}` | {s.shown or f'`{s.default}`'} | {s.doc} |" for s in SETTINGS]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m farm.settings --markdown")
    sys.stdout.write(markdown())
