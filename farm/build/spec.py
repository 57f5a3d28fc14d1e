"""The step spec: everything `python -m farm.build.steps` needs, typed, handed over as one JSON file.

farm/build/cell.py builds a `StepSpec` once on the host, from the loaded `Recipe` (already
validated by the recipe loader) and the planned `Cell`, with every path as the step will see
it. The steps read its typed fields and nothing else: no recipe YAML, no raw dicts, no second
validation. The JSON form is plain (dataclass fields by name, tuples as lists, paths and arch
lists as strings) and carries SCHEMA; an unknown or missing key, or a value of the wrong type,
is a one-line `BadSpec`.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.archlist import ArchList
from farm.errors import BadInput, BadSpec
from farm.floor import Floor
from farm.policy import frozen
from farm.recipes.cells import Cell
from farm.recipes.model import ExtraSource, Patch, Recipe, Source, Verify

# Bumped whenever a field changes meaning; a step refuses a spec of another schema.
SCHEMA = 4


@dataclass(frozen=True)
class RecipePart:
    """What the steps need of the recipe besides its source and verify knobs."""

    name: str
    version: str | None
    where: str                       # the recipe file, as error messages name it
    subdir: str | None
    build_deps: tuple[str, ...]
    cuda_components: tuple[str, ...]
    env: Mapping[str, str]
    pre_build: str | None
    nvcc_flags: str
    allow_graft: tuple[str, ...]
    requires_dist: tuple[str, ...] | None   # resolved for the cell; None: keep the wheel's own
    max_jobs: int                    # the recipe's, or the clamp `farm run` decided (design.md §11.2)
    nvcc_threads: int


@dataclass(frozen=True)
class SourcePart:
    """The source step's inputs, as the recipe loader made them (host paths: a `path` source's folder and
    each patch's file are resolved against the recipe's folder, and the source step always runs on the host)."""

    source: Source
    submodules: bool
    extra_sources: tuple[ExtraSource, ...]
    patches: tuple[Patch, ...]


@dataclass(frozen=True)
class Target:
    """What the steps build for: the runner's image (or the host)."""

    id: str
    arch: str                        # x86_64 | aarch64
    glibc: str
    plat_floor: str | None           # the image's manylinux tag; None on the host


@dataclass(frozen=True)
class StepPaths:
    out: Path
    work: Path


@dataclass(frozen=True)
class FarmWheel:
    """A build_requires_farm wheel staged in the work dir, and the sha256 its key names."""

    recipe: str
    file: Path
    sha256: str


@dataclass(frozen=True)
class StallLimit:
    """How long the compile (and pre_build) may go without progress before it is killed as hung, and
    where that limit comes from, for the message (design.md §6.4, farm/build/stall.py)."""

    seconds: float
    why: str                         # e.g. `recipes/x.yml timeout: 20, x9 emulated`


@dataclass(frozen=True)
class StepSpec:
    schema: int
    cell: Cell
    recipe: RecipePart
    source: SourcePart
    verify: Verify
    paths: StepPaths
    python: str                      # the cell's interpreter as the step sees it
    target: Target
    toolkit_source: str              # auto | pypi | system (FARM_TOOLKIT_SOURCE)
    plat: str | None                 # --plat, checked against the image on the host
    build_number: int | None
    record: dict[str, Any]                     # the build record's common part, written into the wheel's build info
    farm_wheels: tuple[FarmWheel, ...]
    flags_stop_after_s: float | None  # the flags tier: stop the compile after this long
    stall: StallLimit | None         # a compile or pre_build silent this long is hung: killed
    compiler_cache_env: Mapping[str, str]
    # The manylinux floor the gate holds the wheel to (design.md §7.8). None in the spec the source phase
    # reads, written before the torch wheel that decides it is downloaded, and for a Windows cell.
    floor: Floor | None

    def to_json(self) -> str:
        return json.dumps(to_plain(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StepSpec:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise BadSpec(f"spec: not JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else None
            raise BadSpec(f"spec: schema {found!r}, this farm reads schema {SCHEMA}")
        return from_plain(cls, data, "spec")

    def write(self, path: Path) -> Path:
        from farm.yamlio import write_atomic

        write_atomic(path, self.to_json())
        return path

    @classmethod
    def read(cls, path: Path) -> StepSpec:
        return cls.from_json(Path(path).read_text())


def recipe_part(recipe: Recipe, *, requires_dist: Iterable[str] | None, max_jobs: int, nvcc_threads: int) -> RecipePart:
    from farm import settings

    return RecipePart(
        name=recipe.name, version=recipe.version, where=settings.display(recipe.path), subdir=recipe.subdir,
        build_deps=tuple(recipe.build_deps), cuda_components=tuple(recipe.cuda_components), env=recipe.env,
        pre_build=recipe.pre_build, nvcc_flags=recipe.nvcc_flags or "", allow_graft=tuple(recipe.allow_graft),
        requires_dist=None if requires_dist is None else tuple(requires_dist), max_jobs=max_jobs,
        nvcc_threads=nvcc_threads)


def source_part(recipe: Recipe) -> SourcePart:
    return SourcePart(source=recipe.source, submodules=recipe.submodules, extra_sources=recipe.extra_sources,
                      patches=recipe.patches)


# ----- the JSON form ----------------------------------------------------------------


def to_plain(value: Any) -> Any:
    """Dataclasses as objects by field name, tuples as lists, paths and arch lists as strings."""
    if isinstance(value, ArchList):   # a dataclass too, written as torch writes it
        return value.torch()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [to_plain(v) for v in value]
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def from_plain(cls: type, data: Any, key: str) -> Any:
    """`data` (parsed JSON) as an instance of the dataclass `cls`, every key required and known."""
    if not isinstance(data, dict):
        raise BadSpec(f"{key}: expected an object, got {type(data).__name__}")
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    missing = [n for n in names if n not in data]
    if unknown or missing:
        parts = ([f"unknown {', '.join(unknown)}"] if unknown else []) + \
                ([f"missing {', '.join(missing)}"] if missing else [])
        raise BadSpec(f"{key}: {'; '.join(parts)}")
    return cls(**{n: _value(_HINTS[cls][n], data[n], f"{key}.{n}") for n in names})


def _value(hint: Any, value: Any, key: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _value(options[0], value, key)
        if all(a in (bool, str, int, float) for a in options):   # e.g. skip_import: bool | str
            return _value(type(value) if type(value) in options else options[0], value, key)
        raise BadSpec(f"{key}: no reading for {hint}")   # pragma: no cover - a field type this module lacks
    if origin is tuple:
        if not isinstance(value, list):
            raise BadSpec(f"{key}: expected a list, got {type(value).__name__}")
        return tuple(_value(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict) or hint is dict:
        if not isinstance(value, dict):
            raise BadSpec(f"{key}: expected an object, got {type(value).__name__}")
        if not args:
            return value
        return frozen({k: _value(args[1], v, f"{key}.{k}") for k, v in value.items()})
    if hint is Any:
        return value
    if hint is ArchList:
        try:
            return ArchList.parse(_value(str, value, key), "build spec", key)
        except BadInput as exc:
            raise BadSpec(str(exc)) from None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):   # a hint is a class, never an instance
        return from_plain(hint, value, key)
    if hint is Path:
        return Path(_value(str, value, key))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise BadSpec(f"{key}: expected {hint.__name__}, got {type(value).__name__}")
    return value
