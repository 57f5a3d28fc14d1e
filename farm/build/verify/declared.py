"""What a wheel may import from the environment the gate imports it in (design.md §7.7).

The cell's environment holds the build's own requirements besides torch (pccm for cumm, numpy,
setuptools, ...). A user's fresh venv holds only what the wheel's Requires-Dist brings (and the
channel's torch): an import of anything else works in the gate and fails for the user. So the import
check hides every top-level name of a distribution the wheel's requirements do not reach: the child
raises ModuleNotFoundError for it, as the user's Python would, and a guarded optional import still
takes its fallback.

Reached means followed through the environment's own metadata (extras and markers evaluated for the
child's interpreter), starting from the wheel's Requires-Dist and, for a torch-linked wheel, the
torch family, which the label step strips from Requires-Dist because the user installs it from the
channel. A name some reached distribution, the wheel itself or the standard library also provides
stays visible.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from farm.build.label import TORCH_FAMILY
from farm.build.verify.torchenv import child_env_base
from farm.errors import GateCannotRun
from farm.process import run

# What the child's interpreter is: its version, the folders it imports from, its standard library's
# names (3.10 on) and the values PEP 508 markers are evaluated against: those of the child itself, as
# packaging's default_environment() computes them, written out since the child need not have packaging
# (farm.platforms.marker_environment is another thing: a cell's target, guessed on the host).
_PROBE = r"""
import json, os, platform, sys
impl = sys.implementation
v = impl.version
impl_version = f"{v.major}.{v.minor}.{v.micro}" + ("" if v.releaselevel == "final" else v.releaselevel[0] + str(v.serial))
print(json.dumps({
    "version": list(sys.version_info[:2]),
    "path": [p for p in sys.path if p and os.path.isdir(p)],
    "stdlib": sorted(getattr(sys, "stdlib_module_names", ())),
    "markers": {
        "implementation_name": impl.name, "implementation_version": impl_version, "os_name": os.name,
        "platform_machine": platform.machine(), "platform_release": platform.release(),
        "platform_system": platform.system(), "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform,
    },
}))
"""


@dataclass(frozen=True)
class Interpreter:
    """The import check's interpreter, as its own probe reports it."""

    python: Path
    version: tuple[int, int]
    path: tuple[str, ...]
    stdlib: frozenset[str]
    markers: dict[str, str]

    @classmethod
    def probe(cls, python: Path) -> Interpreter:
        out = run([python, "-c", _PROBE], env=child_env_base())
        if out.returncode != 0:
            raise GateCannotRun(f"{python}: cannot run it: {out.stderr.strip()[-200:]}")
        found = json.loads(out.stdout)
        return cls(Path(python), (found["version"][0], found["version"][1]), tuple(found["path"]),
                   frozenset(found["stdlib"]), found["markers"])


@dataclass(frozen=True)
class Installed:
    """One distribution of the environment: its requirements and the top-level names it provides."""

    name: str   # canonical
    version: str
    requires: tuple[str, ...]
    names: frozenset[str]


def installed_distributions(path: Iterable[str]) -> dict[str, Installed]:
    """Every distribution on `path`, by canonical name; the first one found wins, as import's does."""
    out: dict[str, Installed] = {}
    for dist in importlib.metadata.distributions(path=list(path)):
        name = dist.metadata["Name"]
        key = canonicalize_name(name) if name else ""
        if not key or key in out:
            continue
        out[key] = Installed(key, dist.version, tuple(dist.requires or ()), frozenset(_top_level_names(dist)))
    return out


def _top_level_names(dist: importlib.metadata.Distribution) -> set[str]:
    """top_level.txt when the backend wrote one, else the first parts of the installed files."""
    listed = dist.read_text("top_level.txt")
    if listed:
        return {n.split("/")[0] for n in listed.split() if n.split("/")[0].isidentifier()}
    names = set()
    for f in dist.files or ():
        first = f.parts[0] if f.parts else ""
        if first.endswith((".dist-info", ".data", ".egg-info")) or first in ("..", "__pycache__"):
            continue
        if len(f.parts) == 1:
            if not first.endswith((".py", ".so", ".pyd")):
                continue   # .pth files, scripts' leftovers
            first = first.split(".", 1)[0]
        if first.isidentifier():
            names.add(first)
    return names


def reached(requires: Iterable[str], dists: dict[str, Installed], markers: dict[str, str]) -> set[str]:
    """The canonical names of the installed distributions `requires` brings, transitively, the way a
    resolver would for this interpreter: markers evaluated, a dependency's extras followed."""
    seen: set[tuple[str, str]] = set()
    out: set[str] = set()
    todo = [(text, "") for text in requires]
    while todo:
        text, extra = todo.pop()
        try:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({**markers, "extra": extra}):
                continue
        except (InvalidRequirement, InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
            continue
        name = canonicalize_name(req.name)
        if name not in dists:
            continue
        out.add(name)
        for wanted in ("", *sorted(req.extras)):
            if (name, wanted) not in seen:
                seen.add((name, wanted))
                todo += [(r, wanted) for r in dists[name].requires]
    return out


def hidden_names(requires: Iterable[str], own_names: Iterable[str], links_torch: bool,
                 interpreter: Interpreter) -> dict[str, str]:
    """Top-level name -> 'distribution version' for every name the import check hides."""
    dists = installed_distributions(interpreter.path)
    roots = list(requires) + (sorted(TORCH_FAMILY) if links_torch else [])
    allowed = reached(roots, dists, interpreter.markers)
    visible = set(own_names) | interpreter.stdlib
    for name in allowed:
        visible |= dists[name].names
    hidden: dict[str, str] = {}
    for dist in sorted(dists.values(), key=lambda d: d.name):
        if dist.name not in allowed:
            for name in sorted(dist.names - visible):
                hidden.setdefault(name, f"{dist.name} {dist.version}")
    return hidden
