"""Reading recipes (docs/design.md, design.md §4): one YAML file per package, validated into an immutable
`Recipe` (`load_recipe`), and the whole folder (`load_recipes`).

Every problem is one line naming the file, the key and the value (BadInput, exit 2). `load_recipe`
reads the file as a sequence of independent parts (`_PARTS`, mostly one per top-level key) and
reports every problem of the file. Checks that need more than one file (`{VER:x}` / `{LOCAL:x}` and
`build_requires_farm` naming another recipe) run in `load_recipes`, which knows every recipe name.
Arch lists are checked against the toolkit of every CUDA line the recipe builds
(`farm.recipes.lines.built_lines`), never narrowed.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from farm import settings
from farm.arch.resolve import ArchOverrides
from farm.errors import BadInput, RecipeProblems, shorten
from farm.platforms import ARM_LANE, X86_LANE
from farm.policy import PEAK_GB_PROBLEM, Defaults, frozen, load_defaults, positive_gb
from farm.recipes.lines import built_lines, current_grid, current_pcwm, generated_files
from farm.recipes.model import Recipe, placeholders_in
from farm.recipes.values import (
    RECIPE_NAME,
    Reader,
    no_repeats,
    read_combinations,
    read_env,
    read_expected_fail,
    read_extra_sources,
    read_patches,
    read_platforms,
    read_requirements,
    read_source,
    read_system_packages,
    read_verify,
)
from farm.versions import vtuple
from farm.yamlio import load_yaml, top_mapping

TOP_KEYS = (
    "name", "source", "version", "links_torch", "subdir", "submodules", "platforms", "min_torch",
    "max_torch", "combinations", "wheel_abi", "arch_fallback", "build_requires_farm", "extra_sources",
    "system_packages", "expected_fail", "needs_patch", "arch_list", "arch_list_by_cuda",
    "arch_list_aarch64", "arch_list_by_cuda_aarch64", "build_deps", "cuda_components", "env",
    "pre_build", "patches", "max_jobs", "nvcc_threads", "nvcc_flags", "requires_dist", "verify",
    "peak_gb_per_job", "timeout", "self_hosted", "allow_graft",
)
REQUIRED_KEYS = ("name", "source", "links_torch")
ARCH_KEYS = ("arch_list", "arch_list_by_cuda", "arch_list_aarch64", "arch_list_by_cuda_aarch64", "arch_fallback")
WHEEL_ABIS = ("cpython", "abi3", "py3-none", "pure")
# Toolkit parts a recipe may add to the image (names as NVIDIA's packages spell them, without prefixes).
CUDA_COMPONENTS = (
    "cublas", "cudart", "cufft", "cufile", "cupti", "curand", "cusolver", "cusparse", "nvjitlink",
    "nvjpeg", "npp", "nvml", "nvrtc", "nvtx", "cccl", "profiler_api", "cuobjdump", "nvdisasm",
)


# ---------------------------------------------------------------- one recipe

@dataclass
class _Draft:
    """One recipe file while it is read: its values, the policy, and the Recipe fields read so far."""

    r: Reader
    data: Mapping
    defaults: Defaults
    path: Path
    fields: dict
    name: str          # the file's stem while the `name` key itself is wrong (the patches folder uses it)


_Part = Callable[[_Draft], None]
_Value = Callable[[_Draft, Any, str], Any]


def _key(key: str, read: _Value, *, skip_null: bool = False) -> _Part:
    """The part that reads one top-level key into the field of that name when the file has it
    (`skip_null`: a key written with no value counts as absent)."""
    def part(d: _Draft) -> None:
        if key in d.data and not (skip_null and d.data[key] is None):
            d.fields[key] = read(d, d.data[key], key)
    return part


def _name(d: _Draft, value, key: str) -> str:
    given = d.r.string(value, key)
    if not RECIPE_NAME.fullmatch(given):
        d.r.fail(key, given, "use lowercase letters, digits and underscores, starting and ending with a "
                             "letter or digit (the name starts cell ids and wheels)")
    if given != d.path.stem:
        d.r.fail(key, given, f"must match the file name ({shorten(d.path.stem, 60)})")
    d.name = given
    return given


def _boolean(d: _Draft, value, key: str) -> bool:
    return d.r.boolean(value, key)


def _string(d: _Draft, value, key: str) -> str:
    return d.r.string(value, key)


def _strings(d: _Draft, value, key: str) -> tuple[str, ...]:
    return d.r.strings(value, key)


def _minor(d: _Draft, value, key: str) -> str:
    return d.r.minor(value, key)


def _bounded(d: _Draft, value, key: str) -> int | float:
    return d.r.bounded(value, key)


def _version(d: _Draft, value, key: str) -> str:
    version = d.r.string(value, key)
    try:
        parsed = Version(version)
    except InvalidVersion:
        d.r.fail(key, version, "not a PEP 440 version")
    if parsed.local:
        d.r.fail(key, version, "no local label: the farm adds +cuNNN[torchM.m] itself")
    return version


def _subdir(d: _Draft, value, key: str) -> str:
    return d.r.relative_path(value, key)


def _platforms(d: _Draft) -> None:
    d.fields["platforms"] = (read_platforms(d.r, d.data["platforms"]) if "platforms" in d.data
                             else tuple(d.defaults.grid_policy.platforms))


def _torch_range(d: _Draft) -> None:
    low, high = d.fields.get("min_torch"), d.fields.get("max_torch")
    if low and high and vtuple(low) > vtuple(high):
        d.r.fail("max_torch", high, f"is below min_torch {low}")


def _wheel_abi(d: _Draft, value, key: str) -> str:
    abi = d.r.string(value, key)
    if abi not in WHEEL_ABIS:
        near = difflib.get_close_matches(abi, WHEEL_ABIS, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        d.r.fail(key, abi, f"expected one of {', '.join(WHEEL_ABIS)}{hint}")
    return abi


def _arch(d: _Draft) -> None:
    """The arch lists and fallback (design.md §3.5) into `arch`; each written once, by supported CUDA line."""
    r, data, supported = d.r, d.data, d.defaults.grid_policy.supported_cudas
    arch = ArchOverrides.from_mapping({k: data[k] for k in ARCH_KEYS if k in data}, r.where)
    for key in ("arch_list", "arch_list_aarch64"):
        if getattr(arch, key) is not None:
            no_repeats(r, data[key], getattr(arch, key), key)
    for key in ("arch_list_by_cuda", "arch_list_by_cuda_aarch64"):
        for cuda, arch_list in getattr(arch, key).items():
            no_repeats(r, data[key][cuda], arch_list, f"{key}[{cuda}]")
    d.fields["arch"] = replace(arch, arch_list_by_cuda=frozen(arch.arch_list_by_cuda),
                               arch_list_by_cuda_aarch64=frozen(arch.arch_list_by_cuda_aarch64))
    for key in ("arch_list_by_cuda", "arch_list_by_cuda_aarch64"):
        for cuda in (data.get(key) or {}):
            if cuda not in supported:
                r.fail(f"{key}[{cuda}]", cuda, f"not a supported CUDA line ({', '.join(supported)})")
    d.fields["arch_fallback"] = data.get("arch_fallback")
    if d.fields.get("wheel_abi") == "pure" and any(data.get(k) for k in ARCH_KEYS[:4]):
        r.fail(next(k for k in ARCH_KEYS[:4] if data.get(k)), None,
               "a pure wheel carries no binaries: arch lists do not apply")


def _build_requires_farm(d: _Draft, value, key: str) -> tuple[str, ...]:
    deps = d.r.strings(value, key)
    if d.name in deps:
        d.r.fail(key, d.name, "a recipe cannot require its own wheels")
    return deps


def _cuda_components(d: _Draft, value, key: str) -> tuple[str, ...]:
    comps = d.r.strings(value, key)
    for c in comps:
        if c not in CUDA_COMPONENTS:
            near = difflib.get_close_matches(c, CUDA_COMPONENTS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f" (known: {', '.join(CUDA_COMPONENTS)})"
            d.r.fail(key, c, f"unknown toolkit component{hint}")
    return comps


def _peak_gb(d: _Draft, value, key: str) -> float:
    gb = positive_gb(value)
    if gb is None:
        d.r.fail(key, value, PEAK_GB_PROBLEM)
    return gb


# Every independent part of a recipe, in the order its problems are reported; a part reads one key
# (or, for platforms, the torch range and the arch keys, a few together).
_PARTS: tuple[_Part, ...] = (
    _key("name", _name),
    _key("source", lambda d, value, key: read_source(d.r, value, key)),
    _key("links_torch", _boolean),
    _key("version", _version, skip_null=True),
    _key("subdir", _subdir, skip_null=True),
    *(_key(key, _boolean) for key in ("submodules", "needs_patch", "self_hosted")),
    _platforms,
    *(_key(key, _minor, skip_null=True) for key in ("min_torch", "max_torch")),
    _torch_range,
    _key("combinations", lambda d, value, key: read_combinations(d.r, value, d.defaults)),
    _key("wheel_abi", _wheel_abi),
    _arch,
    _key("build_requires_farm", _build_requires_farm),
    _key("extra_sources", lambda d, value, key: read_extra_sources(d.r, value)),
    _key("system_packages", lambda d, value, key: read_system_packages(d.r, value)),
    _key("expected_fail", lambda d, value, key: read_expected_fail(d.r, value), skip_null=True),
    _key("build_deps", lambda d, value, key: read_requirements(d.r, value, key, placeholders=False)),
    _key("allow_graft", _strings),
    _key("cuda_components", _cuda_components),
    _key("env", lambda d, value, key: read_env(d.r, value)),
    _key("pre_build", _string, skip_null=True),
    _key("patches", lambda d, value, key: read_patches(d.r, value, d.name, d.path.parent)),
    *(_key(key, _bounded, skip_null=True) for key in ("max_jobs", "nvcc_threads", "timeout")),
    _key("peak_gb_per_job", _peak_gb, skip_null=True),
    _key("nvcc_flags", _string, skip_null=True),
    _key("requires_dist", lambda d, value, key: read_requirements(d.r, value, key, placeholders=True)),
    _key("verify", lambda d, value, key: read_verify(d.r, value), skip_null=True),
)


def load_recipe(path: Path | str, defaults: Defaults | None = None, names: Iterable[str] | None = None,
                grid=None, pcwm=None, check_paths: bool = False) -> Recipe:
    """One recipe file, validated. `names`: every recipe name, to check cross-references (None: skip).

    `grid` / `pcwm`: the derived grid and upstream matrix, to check package-wide arch lists against
    exactly the lines the recipe builds (None: every supported line, which is stricter).
    `check_paths`: a `path` source must exist on this machine (`farm recipes check`; planning and
    keying a cell never read the source, so they do not ask).

    Every independent part is checked even after one failed: RecipeProblems carries them all and
    reads as the first.
    """
    path = Path(path)
    defaults = defaults or load_defaults()
    r = Reader(path, check_paths)
    data = load_yaml(path)
    if data is None:
        r.fail(None, None, "empty recipe (needs at least name, source and links_torch)")
    data = top_mapping(data, r.where, "recipe")
    if not any(key in data for key in REQUIRED_KEYS):
        # Not a recipe at all (a link to some other file): its keys are not listed, nor its text.
        r.fail(None, None, f"not a recipe: none of {', '.join(REQUIRED_KEYS)} is in it")
    for key in data:
        with r.part():
            r.known_keys({key: None}, TOP_KEYS)
    for req in REQUIRED_KEYS:
        if req not in data:
            with r.part():
                r.fail(req, None, "missing required key")
    draft = _Draft(r, data, defaults, path, {"path": path.resolve()}, path.stem)
    for part in _PARTS:
        with r.part():
            part(draft)
    if r.problems:
        raise RecipeProblems(r.problems)

    recipe = Recipe(**draft.fields)
    if names is not None:
        check_references(recipe, names)
    _check_toolkits(recipe, defaults, grid, pcwm)
    return recipe


def check_references(recipe: Recipe, names: Iterable[str]) -> None:
    """`{VER:x}`, `{LOCAL:x}` and `build_requires_farm` must name recipes that exist."""
    names = set(names)
    where = settings.display(recipe.path)
    for i, req in enumerate(recipe.requires_dist or ()):
        for ph, arg in placeholders_in(req):
            if arg and arg not in names:
                near = difflib.get_close_matches(arg, names, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise BadInput(where, f"requires_dist[{i}]", req, f"{{{ph}:{shorten(arg, 60)}}} names no recipe{hint}")
    for dep in recipe.build_requires_farm:
        if dep not in names:
            near = difflib.get_close_matches(dep, names, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise BadInput(where, "build_requires_farm", dep, f"names no recipe{hint}")


def _check_toolkits(recipe: Recipe, defaults: Defaults, grid, pcwm) -> None:
    """Each lane's lists against the toolkits of the lines that lane builds (design.md §3.5: an error, never a drop)."""
    where = settings.display(recipe.path)
    built = built_lines(recipe, defaults, grid, pcwm)
    arch = recipe.arch
    # check_toolkits walks both lanes with one set of lines: give it one lane at a time.
    x86_only = replace(arch, arch_list_aarch64=None, arch_list_by_cuda_aarch64=frozen({}))
    arm_only = replace(arch, arch_list=None, arch_list_by_cuda=frozen({}))
    x86_only.check_toolkits(defaults, where, sorted(built[X86_LANE], key=vtuple))
    arm_only.check_toolkits(defaults, where, sorted(built[ARM_LANE], key=vtuple))


# ---------------------------------------------------------------- all recipes

_CACHE: dict[tuple, dict[str, Recipe]] = {}


def _fingerprint(folder: Path, defaults: Defaults) -> tuple:
    stamp: list[tuple[str, int, int] | tuple[str, None]] = []
    for f in [*sorted(folder.iterdir()), *sorted((folder / "patches").rglob("*"))]:
        try:
            st = f.stat()
        except OSError:             # a dangling link: reading it says so
            stamp.append((str(f), None))
            continue
        stamp.append((str(f), st.st_mtime_ns, st.st_size))
    generated = tuple(f.stat().st_mtime_ns if f.exists() else None for f in generated_files(defaults))
    return (str(folder), id(defaults), generated, tuple(stamp))


def recipe_files(folder: Path | str | None = None) -> list[Path]:
    """Every `<name>.yml` in the folder (a folder named so too: reading it says what it is), hidden
    files (editor locks like `.#x.yml`) aside."""
    folder = Path(folder or settings.recipes_dir())
    return sorted(f for f in folder.glob("*.yml") if not f.name.startswith("."))


def folder_problems(folder: Path) -> list[BadInput]:
    """A recipes folder that is not there is an error (a typo in --dir or FARM_RECIPES must not read
    as "no recipes"), and so is a `.yaml` file in it: the farm reads only `<name>.yml`, and a recipe
    it skipped without a word would never be built."""
    if not folder.is_dir():
        raise BadInput(settings.display(folder), None, None,
                       "not a folder" if folder.exists() else "no such recipes folder")
    return [BadInput(settings.display(f), None, None,
                     f"recipes are read only from <name>.yml files: rename it to {shorten(f.stem, 60)}.yml "
                     "or move it out of the recipes folder")
            for f in sorted(folder.iterdir())
            if f.suffix.lower() in (".yml", ".yaml") and f.suffix != ".yml" and not f.name.startswith(".")]


def collisions(recipes: Mapping[str, Recipe]) -> list[BadInput]:
    """Two recipes whose names normalise to one project (`a_b`, `a__b`: both `a-b`) would publish
    wheels pip cannot tell apart."""
    first: dict[str, Recipe] = {}
    out = []
    for name in sorted(recipes):
        project = canonicalize_name(name)
        other = first.setdefault(project, recipes[name])
        if other is not recipes[name]:
            out.append(BadInput(settings.display(recipes[name].path), "name", name,
                                f"the same project as {other.name!r} of {settings.display(other.path)} once "
                                f"normalised ({project!r}): their wheels would collide"))
    return out


def load_recipes(folder: Path | str | None = None, defaults: Defaults | None = None) -> dict[str, Recipe]:
    """Every recipes/<name>.yml, validated with cross-references; cached per folder and file mtimes.
    The first problem is raised (one line); `check_recipes` reports every one."""
    folder = Path(folder or settings.recipes_dir()).resolve()
    defaults = defaults or load_defaults()
    stray = folder_problems(folder)
    key = _fingerprint(folder, defaults)
    cached = _CACHE.get(key)
    if cached is not None:
        return dict(cached)
    if stray:
        raise stray[0]
    files = recipe_files(folder)
    names = [f.stem for f in files]
    grid, pcwm = current_grid(defaults), current_pcwm(defaults)
    recipes = {}
    for f in files:
        recipe = load_recipe(f, defaults, names, grid, pcwm)
        recipes[recipe.name] = recipe
    for problem in collisions(recipes):
        raise problem
    check_build_order(recipes)
    _CACHE.clear()
    _CACHE[key] = recipes
    return dict(recipes)


def check_build_order(recipes: Mapping[str, Recipe]) -> None:
    """`build_requires_farm` must not loop (the planner orders cells by it)."""
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            loop = trail[trail.index(name):] + [name]
            recipe = recipes[trail[-1]]
            raise BadInput(settings.display(recipe.path), "build_requires_farm", name,
                           f"build dependency loop: {shorten(' -> '.join(loop))}")
        state[name] = 1
        for dep in recipes[name].build_requires_farm:
            if dep in recipes:
                visit(dep, [*trail, name])
        state[name] = 2

    for name in sorted(recipes):
        visit(name, [])
