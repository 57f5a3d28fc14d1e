"""Recipes (SPEC 6): one YAML file per package, validated into an immutable `Recipe`.

Every problem is one line naming the file, the key and the value (BadInput,
exit 2). Checks that need more than one file (`{VER:x}` / `{LOCAL:x}` and
`build_requires_farm` naming another recipe) run in `load_recipes`, which
knows every recipe name. Arch lists are checked against the toolkit of every
CUDA line the recipe builds (`built_lines`), never narrowed.
"""

from __future__ import annotations

import datetime
import difflib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from farm import paths
from farm.arch.archlist import ArchList, parse_token
from farm.arch.resolve import ArchOverrides, Hazard, fallback_hazards
from farm.build import gitsparse
from farm.errors import BadInput, FarmError, shorten
from farm.platforms import ARM_LANE, PLATFORMS, X86_LANE, lane
from farm.policy import PEAK_GB_PROBLEM, Defaults, clamp, load_defaults, out_of_bounds, positive_gb
from farm.versions import vtuple
from farm.yamlio import load_yaml

# ---------------------------------------------------------------- vocabulary

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
SOURCE_KINDS = ("git", "sdist", "path")
GIT_KEYS = ("url", "ref", "commit", gitsparse.KEY)
SDIST_KEYS = ("url", "pypi", "sha256")
COMBINATION_KEYS = ("cuda", "torch", "pythons", "arch_list", "source")
EXTRA_SOURCE_KEYS = ("url", "sha256", "dest")
EXTRA_GIT_KEYS = ("git", "commit", "dest", gitsparse.KEY)
EXPECTED_FAIL_KEYS = ("cells", "reason", "until")
PATCH_KEYS = ("file", "when")
PATCH_WHEN_KEYS = ("platform", "cuda")
IMAGE_FAMILIES = ("dnf", "apt")
VERIFY_KEYS = (
    "import_names", "extra_imports", "no_direct_import", "skip_import", "needs_driver",
    "expect_device_error", "expect_ops", "allowed_needed", "skip_arch", "allow_missing_archs",
    "allow_pure_python",
)
ALLOW_MISSING_KEYS = ("archs", "reason")
# Toolkit parts a recipe may add to the image (names as NVIDIA's packages spell them, without prefixes).
CUDA_COMPONENTS = (
    "cublas", "cudart", "cufft", "cufile", "cupti", "curand", "cusolver", "cusparse", "nvjitlink",
    "nvjpeg", "npp", "nvml", "nvrtc", "nvtx", "cccl", "profiler_api", "cuobjdump", "nvdisasm",
)
ENV_PLACEHOLDERS = ("ARCHS_TORCH", "ARCHS_CMAKE", "CUDA", "CUDA_HOME")
TORCH_FAMILY = ("torch", "torchvision", "torchaudio")
# Names that are branches (or moving pointers) in practice, whatever they look like.
FLOATING_REFS = ("main", "master", "head", "develop", "dev", "trunk", "latest", "stable", "nightly", "default")

_SHA = re.compile(r"^[0-9a-f]{40}$")
_SHORT_SHA = re.compile(r"^[0-9a-f]{7,39}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# A tag names a release: an optional word prefix, then a dotted number, then optional suffixes.
# v1.2.3, 0.6, release-1.0, v1.5.0-aot, 2.0.0b0 pass; main, feature/x, v1, fix-bug do not.
_TAG = re.compile(r"^(?:[A-Za-z][A-Za-z0-9_]*[-_]?)?\d+(?:\.\d+)+(?:[-._+]?[A-Za-z0-9]+)*$")
# Lowercase PEP 508 names: start and end with a letter or digit (`pkg_` is no project name).
_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9_]*[a-z0-9])?$")
_ARCH_WORDS = re.compile(r"[;\s]+")   # how ArchList.parse splits a list
_MINOR = re.compile(r"^\d+\.\d+$")
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_PATCH = re.compile(r"^\d+\.\d+\.\d+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_URL = re.compile(r"^(https?|git|ssh|file)://\S+$|^git@[\w.-]+:\S+$")


def frozen(d: Mapping) -> Mapping:
    return MappingProxyType(dict(d))


# ---------------------------------------------------------------- typed pieces

@dataclass(frozen=True)
class Source:
    """Where the code comes from: exactly one of git, sdist, path."""

    kind: str                      # git | sdist | path
    url: str | None = None         # git, sdist
    ref: str | None = None         # git: full SHA or tag
    commit: str | None = None      # git: the SHA a tag resolved to (only when known)
    pypi: str | None = None        # sdist: "name==version"
    sha256: str | None = None      # sdist
    path: Path | None = None       # path: absolute, resolved against the recipe's folder
    path_text: str | None = None   # path: as written (the build key uses this, not the machine's path)
    exclude: tuple[str, ...] = ()  # git: paths the build never reads, left out of the checkout

    @property
    def pinned_commit(self) -> str | None:
        """The commit SHA this source is known to be at, before fetching (None for an unresolved tag)."""
        if self.kind != "git":
            return None
        return self.ref if _SHA.match(self.ref or "") else self.commit

    def plain(self) -> dict:
        if self.kind == "git":
            return {"git": _drop_empty({"url": self.url, "ref": self.ref, "commit": self.commit,
                                        gitsparse.KEY: list(self.exclude)})}
        if self.kind == "sdist":
            return {"sdist": _drop_empty({"url": self.url, "pypi": self.pypi, "sha256": self.sha256})}
        return {"path": self.path_text}


@dataclass(frozen=True)
class Combination:
    """One own row: an exact torch patch, its Pythons, and optionally its own list and source."""

    cuda: str
    torch: str                     # exact patch, e.g. '2.8.0'
    pythons: tuple[str, ...]
    arch_list: ArchList | None = None
    source: Source | None = None

    @property
    def torch_minor(self) -> str:
        return ".".join(self.torch.split(".")[:2])


@dataclass(frozen=True)
class ExtraSource:
    """An archive `{url, sha256, dest}`, or a pinned git tree `{git, commit, dest, exclude?}`
    (then `url` is the repository and `sha256` is None)."""

    url: str
    sha256: str | None
    dest: str
    commit: str | None = None      # git form: the full commit SHA (never a tag)
    exclude: tuple[str, ...] = ()  # git form: paths left out of its checkout

    def plain(self) -> dict:
        """As written in the recipe (the build key's form; an archive's is unchanged by the git form)."""
        if self.commit is None:
            return {"url": self.url, "sha256": self.sha256, "dest": self.dest}
        return _drop_empty({"git": self.url, "commit": self.commit, "dest": self.dest,
                            gitsparse.KEY: list(self.exclude)})


@dataclass(frozen=True)
class ExpectedFail:
    cells: tuple[str, ...]         # fnmatch patterns over cell ids
    reason: str
    until: str | None = None


@dataclass(frozen=True)
class Patch:
    file: str                      # under recipes/patches/<name>/
    path: Path
    when: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: frozen({}))  # platform / cuda

    @property
    def is_script(self) -> bool:
        """A Python patch_script (run without network) rather than a diff for `git apply`."""
        return self.file.endswith(".py")

    def applies(self, platform: str, cuda: str) -> bool:
        return all(value in self.when.get(key, (value,)) for key, value in (("platform", platform), ("cuda", cuda)))


@dataclass(frozen=True)
class AllowedMissing:
    archs: ArchList
    reason: str


@dataclass(frozen=True)
class Verify:
    """Knobs of the verify gate (SPEC 9). Not build-relevant."""

    import_names: tuple[str, ...] = ()
    extra_imports: tuple[str, ...] = ()
    no_direct_import: tuple[str, ...] = ()
    skip_import: bool | str = False
    needs_driver: bool = False
    expect_device_error: bool | str = False
    expect_ops: tuple[str, ...] = ()
    allowed_needed: tuple[str, ...] = ()
    skip_arch: str | None = None                                 # the reason
    allow_missing_archs: Mapping[str, AllowedMissing] = field(default_factory=lambda: frozen({}))
    allow_pure_python: bool = False


@dataclass(frozen=True)
class Recipe:
    """One package, validated. Immutable: tuples and read-only mappings only."""

    name: str
    path: Path
    source: Source
    links_torch: bool
    arch: ArchOverrides
    version: str | None = None
    subdir: str | None = None
    submodules: bool = False
    platforms: tuple[str, ...] = PLATFORMS
    min_torch: str | None = None
    max_torch: str | None = None
    combinations: tuple[Combination, ...] = ()
    wheel_abi: str = "cpython"
    arch_fallback: str | None = None
    build_requires_farm: tuple[str, ...] = ()
    extra_sources: tuple[ExtraSource, ...] = ()
    system_packages: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: frozen({}))
    expected_fail: ExpectedFail | None = None
    needs_patch: bool = False
    build_deps: tuple[str, ...] = ()
    cuda_components: tuple[str, ...] = ()
    allow_graft: tuple[str, ...] = ()      # sonames (fnmatch) auditwheel may copy in (SPEC 8.1 step 6)
    env: Mapping[str, str] = field(default_factory=lambda: frozen({}))
    pre_build: str | None = None
    patches: tuple[Patch, ...] = ()
    max_jobs: int | None = None            # None: the policy default
    nvcc_threads: int | None = None        # None: the policy default
    nvcc_flags: str | None = None
    requires_dist: tuple[str, ...] | None = None   # None: keep the wheel's own metadata
    verify: Verify = field(default_factory=Verify)
    # Scheduling hints (SPEC 8.4, 8.6), not build inputs: they never change a build key.
    peak_gb_per_job: float | None = None   # None: the policy default (memory admission)
    timeout: int | None = None             # minutes one cell may take (farm build, CI timeout-minutes)
    self_hosted: bool = False              # huge builds: CI routes them to a self-hosted runner label

    # -- arch fields, as SPEC 6 names them (parsed into `arch`)
    @property
    def arch_list(self) -> ArchList | None:
        return self.arch.arch_list

    @property
    def arch_list_by_cuda(self) -> Mapping[str, ArchList]:
        return self.arch.arch_list_by_cuda

    @property
    def arch_list_aarch64(self) -> ArchList | None:
        return self.arch.arch_list_aarch64

    @property
    def arch_list_by_cuda_aarch64(self) -> Mapping[str, ArchList]:
        return self.arch.arch_list_by_cuda_aarch64

    @property
    def source_path(self) -> Path | None:
        """The local source folder of a `path` source (None for git and sdist)."""
        return self.source.path if self.source.kind == "path" else None

    @property
    def collapses_python(self) -> bool:
        """abi3, py3-none and pure wheels: one cell per (CUDA, torch, platform), listed for every Python."""
        return self.wheel_abi != "cpython"

    def references(self) -> frozenset[str]:
        """Recipes named by `{VER:x}` / `{LOCAL:x}` in requires_dist (their build key reaches this one)."""
        return frozenset(arg for req in self.requires_dist or () for _, arg in _placeholders(req) if arg)

    def parallelism(self, defaults: Defaults) -> tuple[int, int]:
        """(max_jobs, nvcc_threads): the recipe's values, else the policy defaults, else 1."""
        policy = defaults.grid_policy.defaults
        return (self.max_jobs or int(policy.get("max_jobs", 1)),
                self.nvcc_threads or int(policy.get("nvcc_threads", 1)))

    def peak_gb(self, defaults: Defaults) -> float:
        """Peak GB of one compile job (memory admission, SPEC 8.4): the recipe's, else the policy's, else 8."""
        return self.peak_gb_per_job or defaults.grid_policy.defaults["peak_gb_per_job"]

    def build_relevant(self) -> dict:
        """The keys that feed the build key (SPEC 7.4): everything but `verify` (comments never get here).

        Plain JSON-able data; keys at their default value are left out, so writing a default
        explicitly does not change the key.
        """
        a = self.arch
        data = {
            "name": self.name,
            "source": self.source.plain(),
            "version": self.version,
            "links_torch": self.links_torch,
            "subdir": self.subdir,
            "submodules": self.submodules,
            "platforms": list(self.platforms),
            "min_torch": self.min_torch,
            "max_torch": self.max_torch,
            "combinations": [_drop_empty({
                "cuda": c.cuda, "torch": c.torch, "pythons": list(c.pythons),
                "arch_list": c.arch_list and c.arch_list.torch(),
                "source": c.source and c.source.plain()}) for c in self.combinations],
            "wheel_abi": None if self.wheel_abi == "cpython" else self.wheel_abi,
            "arch_fallback": self.arch_fallback,
            "build_requires_farm": list(self.build_requires_farm),
            "extra_sources": [e.plain() for e in self.extra_sources],
            "system_packages": {k: list(v) for k, v in self.system_packages.items()},
            "expected_fail": self.expected_fail and _drop_empty({
                "cells": list(self.expected_fail.cells), "reason": self.expected_fail.reason,
                "until": self.expected_fail.until}),
            "needs_patch": self.needs_patch,
            "arch_list": a.arch_list and a.arch_list.torch(),
            "arch_list_by_cuda": {k: v.torch() for k, v in a.arch_list_by_cuda.items()},
            "arch_list_aarch64": a.arch_list_aarch64 and a.arch_list_aarch64.torch(),
            "arch_list_by_cuda_aarch64": {k: v.torch() for k, v in a.arch_list_by_cuda_aarch64.items()},
            "build_deps": list(self.build_deps),
            "cuda_components": list(self.cuda_components),
            "allow_graft": list(self.allow_graft),
            "env": dict(self.env),
            "pre_build": self.pre_build,
            "patches": [_drop_empty({"file": p.file, "when": {k: list(v) for k, v in p.when.items()}})
                        for p in self.patches],
            "max_jobs": self.max_jobs,
            "nvcc_threads": self.nvcc_threads,
            "nvcc_flags": self.nvcc_flags,
            "requires_dist": None if self.requires_dist is None else list(self.requires_dist),
        }
        if self.platforms == PLATFORMS:
            data["platforms"] = None
        return _drop_empty(data)


def _drop_empty(d: dict) -> dict:
    return {k: v for k, v in d.items() if v not in (None, False, [], {}, "")}


# ---------------------------------------------------------------- the reader

class RecipeProblems(BadInput):
    """Every problem found in one recipe file. It reads as the first one (the one line a command
    that loads recipes prints); `farm recipes check` prints each of `problems`."""

    def __init__(self, problems: Iterable[BadInput]):
        self.problems = tuple(problems)
        first = self.problems[0]
        super().__init__(first.where, first.key, first.value, first.problem)


class _Reader:
    """Typed access to one recipe file's values; every failure is one BadInput line."""

    def __init__(self, path: Path, check_paths: bool = False):
        self.path = path
        self.where = paths.display(path)
        self.problems: list[BadInput] = []
        self.check_paths = check_paths      # a `path` source must exist on this machine

    def fail(self, key: str | None, value, problem: str):
        raise BadInput(self.where, key, value, problem)

    def part(self) -> _Reader:
        """`with r.part():` checks one independent part of the recipe: a problem in it is recorded
        and the next part is still checked, so one run reports every problem of the file."""
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if isinstance(exc, BadInput):
            self.problems.append(exc)
            return True
        return False

    def known_keys(self, data: Mapping, allowed: Iterable[str], prefix: str = "") -> None:
        allowed = tuple(allowed)
        for key in data:
            if key in allowed:
                continue
            if not isinstance(key, str):
                self.fail(f"{prefix}{key}", None, "keys must be strings")
            near = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]!r}?" if near else f"; known keys: {', '.join(allowed)}"
            self.fail(f"{prefix}{key}", None, f"unknown key{hint}")

    def mapping(self, value, key: str) -> Mapping:
        if not isinstance(value, Mapping):
            self.fail(key, value, f"expected a mapping, got {_kind(value)}")
        return value

    def string(self, value, key: str, *, empty: bool = False) -> str:
        # YAML reads 0.6 as a number and 2024-05-01 as a date: the fix is quoting.
        if isinstance(value, (int, float, datetime.date)) and not isinstance(value, bool):
            self.fail(key, value, f"write it as a quoted string, e.g. '{shorten(value, 40)}'")
        if not isinstance(value, str):
            self.fail(key, value, f"expected a string, got {_kind(value)}")
        if not empty and not value.strip():
            self.fail(key, value, "must not be empty")
        return value

    def boolean(self, value, key: str) -> bool:
        if not isinstance(value, bool):
            self.fail(key, value, f"expected true or false, got {_kind(value)}")
        return value

    def bounded(self, value, key: str, *, whole: bool = True) -> int | float:
        """A number within the range policy.LIMITS gives `key` (the range is in the message)."""
        if whole and (not isinstance(value, int) or isinstance(value, bool)):
            self.fail(key, value, f"expected a whole number, got {_kind(value)}")
        problem = out_of_bounds(key, value)
        if problem:
            self.fail(key, value, problem)
        return value

    def strings(self, value, key: str) -> tuple[str, ...]:
        if isinstance(value, str) or not isinstance(value, list):
            self.fail(key, value, f"expected a list of strings, got {_kind(value)}")
        return tuple(self.string(v, f"{key}[{i}]") for i, v in enumerate(value))

    def string_or_list(self, value, key: str) -> tuple[str, ...]:
        return (self.string(value, key),) if isinstance(value, str) else self.strings(value, key)

    def minor(self, value, key: str) -> str:
        text = self.string(value, key)
        if not _MINOR.match(text):
            self.fail(key, text, "expected a torch minor like '2.8' (major.minor)")
        return text

    def sha256(self, value, key: str) -> str:
        text = self.string(value, key)
        if not _SHA256.match(text):
            self.fail(key, text, "expected 64 lowercase hex digits")
        return text


def _arch_list(r: _Reader, text, key: str) -> ArchList:
    arch_list = ArchList.parse(text, r.where, key)
    _no_repeats(r, text, arch_list, key)
    return arch_list


def _no_repeats(r: _Reader, text: str, arch_list: ArchList, key: str) -> None:
    """ArchList.parse merges a token written twice; a recipe may not write one twice (`8.0 8.0+PTX`
    is a typo or a doubt, never an intent)."""
    words = [w for w in _ARCH_WORDS.split(text.strip()) if w]
    if len(words) == len(arch_list.tokens):
        return
    seen: dict[tuple, str] = {}
    for word in words:
        token = parse_token(word, r.where, key)
        same = (token.major, token.minor, token.variant)
        if same in seen:
            r.fail(key, text, f"{seen[same]} and {word} name the same arch: write it once")
        seen[same] = word


def _kind(value) -> str:
    if value is None:
        return "nothing"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "a mapping", datetime.date: "a date"}.get(type(value), type(value).__name__)


# ---------------------------------------------------------------- sources

def _read_source(r: _Reader, value, key: str) -> Source:
    data = r.mapping(value, key)
    kinds = [k for k in SOURCE_KINDS if k in data]
    r.known_keys(data, SOURCE_KINDS, f"{key}.")
    if len(kinds) != 1:
        found = ", ".join(kinds) if kinds else "none"
        r.fail(key, None, f"needs exactly one of git, sdist, path (found: {found})")
    kind = kinds[0]
    body = data[kind]
    if kind == "path":
        text = r.string(body, f"{key}.path")
        # Relative paths belong to the recipe file, not to wherever the farm happens to run.
        target = _local_path(r, text, f"{key}.path", r.path.parent)
        if r.check_paths and not os.path.isdir(target):
            r.fail(f"{key}.path", text, f"no such folder ({shorten(paths.display(target), 120)})"
                   if not os.path.exists(target) else f"not a folder ({shorten(paths.display(target), 120)})")
        return Source("path", path=target, path_text=text)
    body = r.mapping(body, f"{key}.{kind}")
    if kind == "git":
        r.known_keys(body, GIT_KEYS, f"{key}.git.")
        for req in ("url", "ref"):
            if req not in body:
                r.fail(f"{key}.git.{req}", None, "missing required key")
        url = _read_url(r, body["url"], f"{key}.git.url")
        ref = _read_ref(r, body["ref"], f"{key}.git.ref")
        commit = None
        if body.get("commit") is not None:
            commit = r.string(body["commit"], f"{key}.git.commit")
            if not _SHA.match(commit):
                r.fail(f"{key}.git.commit", commit, "expected the full 40-hex commit SHA")
            if _SHA.match(ref) and commit != ref:
                r.fail(f"{key}.git.commit", commit, f"differs from ref {ref} (a SHA ref needs no commit)")
        exclude = _read_exclude(r, body, f"{key}.git.{gitsparse.KEY}")
        return Source("git", url=url, ref=ref, commit=commit, exclude=exclude)
    r.known_keys(body, SDIST_KEYS, f"{key}.sdist.")
    where_from = [k for k in ("url", "pypi") if k in body]
    if len(where_from) != 1:
        r.fail(f"{key}.sdist", None, "needs exactly one of url or pypi (name==version)")
    if "sha256" not in body:
        r.fail(f"{key}.sdist.sha256", None, "missing: an sdist source must carry its sha256")
    sha = r.sha256(body["sha256"], f"{key}.sdist.sha256")
    if "url" in body:
        return Source("sdist", url=_read_url(r, body["url"], f"{key}.sdist.url"), sha256=sha)
    pypi = r.string(body["pypi"], f"{key}.sdist.pypi")
    try:
        req = Requirement(pypi)
    except InvalidRequirement:
        req = None
    specs = list(req.specifier) if req else []
    if not req or len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        r.fail(f"{key}.sdist.pypi", pypi, "expected an exact pin like 'name==1.2.3'")
    return Source("sdist", pypi=pypi, sha256=sha)


def _read_exclude(r: _Reader, body: Mapping, ekey: str) -> tuple[str, ...]:
    """`exclude` of a git tree (the source or an extra source): git sparse-checkout patterns."""
    if gitsparse.KEY not in body:
        return ()
    if not isinstance(body[gitsparse.KEY], list) or not body[gitsparse.KEY]:
        r.fail(ekey, body[gitsparse.KEY], "expected a non-empty list of path patterns (git sparse-checkout syntax)")
    exclude = r.strings(body[gitsparse.KEY], ekey)
    for i, pattern in enumerate(exclude):
        problem = gitsparse.pattern_problem(pattern)
        if problem:
            r.fail(f"{ekey}[{i}]", pattern, problem)
    return exclude


def _local_path(r: _Reader, text: str, key: str, base: Path) -> Path:
    """`text` as a path on this machine: `~` expanded, relative to `base`, resolved; a path the
    system cannot take (too long, a NUL, an unknown user's ~) is one line too."""
    try:
        target = Path(text).expanduser()
        return (target if target.is_absolute() else base / target).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        r.fail(key, text, f"not a usable path ({shorten(reason, 80)})")


def _read_url(r: _Reader, value, key: str) -> str:
    url = r.string(value, key)
    if not _URL.match(url):
        r.fail(key, url, "expected a URL (https://, http://, git://, ssh://, file:// or git@host:path)")
    return url


def _read_ref(r: _Reader, value, key: str) -> str:
    if isinstance(value, (int, float, datetime.date)) and not isinstance(value, bool):
        r.fail(key, value, f"write the ref as a quoted string, e.g. '{shorten(value, 40)}' "
                           f"(YAML reads it as {_kind(value)})")
    ref = r.string(value, key)
    if _SHA.match(ref):
        return ref
    if ref.lower() in FLOATING_REFS or ref.lower().startswith(("refs/heads/", "origin/")):
        r.fail(key, ref, "a branch moves: pin a full 40-hex commit SHA or a release tag")
    if _SHORT_SHA.match(ref) and not _TAG.match(ref):
        r.fail(key, ref, "abbreviated commit: write the full 40-hex SHA")
    if re.fullmatch(r"[0-9a-fA-F]{40}", ref):
        r.fail(key, ref, "write the commit SHA in lowercase")
    if not _TAG.match(ref):
        r.fail(key, ref, "looks like a branch name: pin a full 40-hex commit SHA or a release tag like v1.2.3")
    return ref


# ---------------------------------------------------------------- requirement lists

def _placeholders(text: str) -> list[tuple[str, str | None]]:
    out = []
    for body in _PLACEHOLDER.findall(text):
        name, _, arg = body.partition(":")
        out.append((name, arg if _ else None))
    return out


def _read_requirement(r: _Reader, text: str, key: str, *, placeholders: bool) -> Requirement:
    probe = text
    if placeholders:
        for name, arg in _placeholders(text):
            shown = shorten("{" + name + (f":{arg}" if arg is not None else "") + "}", 60)
            if name == "LOCAL" and arg is None:
                probe = probe.replace(shown, "cu128torch2.8", 1)
            elif name in ("LOCAL", "VER") and arg:
                if not _NAME.match(arg):
                    r.fail(key, text, f"{shown}: not a recipe name")
                probe = probe.replace(shown, "cu128" if name == "LOCAL" else "1.0", 1)
            else:
                r.fail(key, text, f"unknown placeholder {shown} (known: {{LOCAL}}, {{LOCAL:<recipe>}}, {{VER:<recipe>}})")
    try:
        req = Requirement(probe)
    except InvalidRequirement as exc:
        r.fail(key, text, f"not a valid requirement: {str(exc).splitlines()[0]}")
    squashed = canonicalize_name(req.name).replace("-", "")
    if squashed in TORCH_FAMILY:
        r.fail(key, text, "the torch family (torch, torchvision, torchaudio) is never listed: the cell's "
                          "channel decides which torch a wheel goes with")
    return req


def _read_requirements(r: _Reader, value, key: str, *, placeholders: bool) -> tuple[str, ...]:
    items = r.strings(value, key)
    for i, text in enumerate(items):
        _read_requirement(r, text, f"{key}[{i}]", placeholders=placeholders)
    return items


# ---------------------------------------------------------------- the rest of the keys

def _read_platforms(r: _Reader, value) -> tuple[str, ...]:
    items = r.strings(value, "platforms")
    if not items:
        r.fail("platforms", [], "name at least one platform")
    for p in items:
        if p not in PLATFORMS:
            near = difflib.get_close_matches(p, PLATFORMS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            r.fail("platforms", p, f"unknown platform (expected {', '.join(PLATFORMS)}){hint}")
    if len(set(items)) != len(items):
        r.fail("platforms", list(items), "a platform is listed twice")
    return tuple(p for p in PLATFORMS if p in items)


def _read_combinations(r: _Reader, value, defaults: Defaults) -> tuple[Combination, ...]:
    if not isinstance(value, list) or not value:
        r.fail("combinations", value, "expected a non-empty list of {cuda, torch, pythons} rows")
    out, seen = [], set()
    for i, row in enumerate(value):
        key = f"combinations[{i}]"
        row = r.mapping(row, key)
        r.known_keys(row, COMBINATION_KEYS, f"{key}.")
        for req in ("cuda", "torch", "pythons"):
            if req not in row:
                r.fail(f"{key}.{req}", None, "missing required key")
        cuda = r.string(row["cuda"], f"{key}.cuda")
        if cuda not in defaults.grid_policy.supported_cudas:
            r.fail(f"{key}.cuda", cuda, f"not a supported CUDA line ({', '.join(defaults.grid_policy.supported_cudas)})")
        torch = r.string(row["torch"], f"{key}.torch")
        if not _PATCH.match(torch):
            r.fail(f"{key}.torch", torch, "own combinations name an exact torch patch, e.g. '2.8.0'")
        pythons = r.strings(row["pythons"], f"{key}.pythons")
        if not pythons:
            r.fail(f"{key}.pythons", [], "name at least one Python")
        for p in pythons:
            if p.endswith("t"):
                r.fail(f"{key}.pythons", p, "free-threaded Pythons are never targets")
            if not _MINOR.match(p):
                r.fail(f"{key}.pythons", p, "expected a Python like '3.12'")
        if (cuda, torch) in seen:
            r.fail(key, f"{cuda}/{torch}", "this (cuda, torch) row is listed twice")
        seen.add((cuda, torch))
        arch_list = None
        if row.get("arch_list") is not None:
            arch_list = _arch_list(r, row["arch_list"], f"{key}.arch_list")
            clamp(arch_list, cuda, defaults.toolkits, r.where, f"{key}.arch_list")
        source = _read_source(r, row["source"], f"{key}.source") if row.get("source") is not None else None
        out.append(Combination(cuda, torch, pythons, arch_list, source))
    return tuple(out)


def _read_env(r: _Reader, value) -> Mapping[str, str]:
    data = r.mapping(value, "env")
    out = {}
    for name, text in data.items():
        key = f"env.{name}"
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            r.fail(key, name, "not an environment variable name")
        text = r.string(text, key, empty=True)
        for body in _PLACEHOLDER.findall(text):
            if body not in ENV_PLACEHOLDERS:
                r.fail(key, text, f"unknown placeholder {{{shorten(body, 40)}}} (known: "
                                  f"{', '.join('{' + p + '}' for p in ENV_PLACEHOLDERS)})")
        out[name] = text
    return frozen(out)


def _read_patches(r: _Reader, value, name: str, recipes_folder: Path) -> tuple[Patch, ...]:
    if not isinstance(value, list):
        r.fail("patches", value, "expected a list of {file, when?}")
    out = []
    for i, item in enumerate(value):
        key = f"patches[{i}]"
        if isinstance(item, str):
            item = {"file": item}
        item = r.mapping(item, key)
        r.known_keys(item, PATCH_KEYS, f"{key}.")
        if "file" not in item:
            r.fail(f"{key}.file", None, "missing required key")
        file = r.string(item["file"], f"{key}.file")
        folder = (recipes_folder / "patches" / name).resolve()
        target = _local_path(r, file, f"{key}.file", folder)
        if folder not in target.parents:
            r.fail(f"{key}.file", file, f"must be a file under recipes/patches/{name}/")
        if not os.path.isfile(target):
            r.fail(f"{key}.file", file, f"no such file {paths.display(folder)}/{shorten(file, 80)}")
        if not file.endswith((".patch", ".diff", ".py")):
            r.fail(f"{key}.file", file, "expected a .patch/.diff (git apply) or a .py patch_script")
        when = {}
        if item.get("when") is not None:
            cond = r.mapping(item["when"], f"{key}.when")
            r.known_keys(cond, PATCH_WHEN_KEYS, f"{key}.when.")
            if "platform" in cond:
                when["platform"] = r.string_or_list(cond["platform"], f"{key}.when.platform")
                for p in when["platform"]:
                    if p not in PLATFORMS:
                        r.fail(f"{key}.when.platform", p, f"unknown platform (expected {', '.join(PLATFORMS)})")
            if "cuda" in cond:
                when["cuda"] = r.string_or_list(cond["cuda"], f"{key}.when.cuda")
        out.append(Patch(file, target, frozen(when)))
    return tuple(out)


def _read_extra_sources(r: _Reader, value) -> tuple[ExtraSource, ...]:
    if not isinstance(value, list):
        r.fail("extra_sources", value, "expected a list of {url, sha256, dest} or {git, commit, dest}")
    out = []
    for i, item in enumerate(value):
        key = f"extra_sources[{i}]"
        item = r.mapping(item, key)
        is_git = "git" in item
        if is_git and "url" in item:
            r.fail(f"{key}.url", item["url"], "give either url (an archive) or git (a repository), not both")
        keys = EXTRA_GIT_KEYS if is_git else EXTRA_SOURCE_KEYS
        r.known_keys(item, keys, f"{key}.")
        for req in keys:
            if req not in item and req != gitsparse.KEY:
                r.fail(f"{key}.{req}", None, "missing required key")
        dest = r.string(item["dest"], f"{key}.dest")
        if Path(dest).is_absolute() or ".." in Path(dest).parts:
            r.fail(f"{key}.dest", dest, "must be a relative path inside the source tree")
        if not is_git:
            out.append(ExtraSource(_read_url(r, item["url"], f"{key}.url"),
                                   r.sha256(item["sha256"], f"{key}.sha256"), dest))
            continue
        url = _read_url(r, item["git"], f"{key}.git")
        commit = r.string(item["commit"], f"{key}.commit")
        if not _SHA.match(commit):
            # A tag can be moved upstream and a short SHA can grow ambiguous: only a full commit stays.
            r.fail(f"{key}.commit", commit, "expected the full 40-hex commit SHA (no tag, no short SHA)")
        out.append(ExtraSource(url, None, dest, commit, _read_exclude(r, item, f"{key}.{gitsparse.KEY}")))
    return tuple(out)


def _read_system_packages(r: _Reader, value) -> Mapping[str, tuple[str, ...]]:
    data = r.mapping(value, "system_packages")
    r.known_keys(data, IMAGE_FAMILIES, "system_packages.")
    return frozen({fam: r.strings(data[fam], f"system_packages.{fam}") for fam in IMAGE_FAMILIES if fam in data})


def _read_expected_fail(r: _Reader, value) -> ExpectedFail:
    data = r.mapping(value, "expected_fail")
    r.known_keys(data, EXPECTED_FAIL_KEYS, "expected_fail.")
    for req in ("cells", "reason"):
        if req not in data:
            r.fail(f"expected_fail.{req}", None, "missing required key")
    until = None if data.get("until") is None else _read_date(r, data["until"], "expected_fail.until")
    return ExpectedFail(r.string_or_list(data["cells"], "expected_fail.cells"),
                        r.string(data["reason"], "expected_fail.reason"), until)


def _read_date(r: _Reader, value, key: str) -> str:
    """A calendar day, as YAML reads `2025-06-30` or as a quoted '2025-06-30'; kept as that ISO text."""
    if isinstance(value, datetime.datetime):
        r.fail(key, value, "expected a day like 2025-06-30, not a time")
    if isinstance(value, datetime.date):
        return value.isoformat()
    text = r.string(value, key)
    if not _DAY.match(text):
        r.fail(key, text, "expected a date like 2025-06-30")
    try:
        return datetime.date.fromisoformat(text).isoformat()
    except ValueError as exc:
        r.fail(key, text, f"not a real date ({exc})")


def _read_verify(r: _Reader, value) -> Verify:
    data = r.mapping(value, "verify")
    r.known_keys(data, VERIFY_KEYS, "verify.")
    kw: dict = {}
    for key in ("import_names", "extra_imports", "no_direct_import", "expect_ops", "allowed_needed"):
        if key in data:
            kw[key] = r.strings(data[key], f"verify.{key}")
    for key in ("needs_driver", "allow_pure_python"):
        if key in data:
            kw[key] = r.boolean(data[key], f"verify.{key}")
    for key in ("skip_import", "expect_device_error"):     # true, or a reason / message pattern
        if key in data:
            v = data[key]
            kw[key] = v if isinstance(v, bool) else r.string(v, f"verify.{key}")
    if "skip_arch" in data:
        v = data["skip_arch"]
        if not isinstance(v, str) or not v.strip():
            r.fail("verify.skip_arch", v, "give the reason as a string (e.g. kernels compiled at run time by NVRTC)")
        kw["skip_arch"] = v
    if "allow_missing_archs" in data:
        table = r.mapping(data["allow_missing_archs"], "verify.allow_missing_archs")
        allowed = {}
        for where_key, entry in table.items():
            key = f"verify.allow_missing_archs.{where_key}"
            if where_key not in (*PLATFORMS, X86_LANE, ARM_LANE):
                r.fail(key, where_key, f"expected a platform ({', '.join(PLATFORMS)}) or lane ({X86_LANE}, {ARM_LANE})")
            entry = r.mapping(entry, key)
            r.known_keys(entry, ALLOW_MISSING_KEYS, f"{key}.")
            if not isinstance(entry.get("reason"), str) or not entry["reason"].strip():
                r.fail(f"{key}.reason", entry.get("reason"), "a missing arch needs its reason")
            if "archs" not in entry:
                r.fail(f"{key}.archs", None, "missing required key")
            allowed[where_key] = AllowedMissing(_arch_list(r, entry["archs"], f"{key}.archs"), entry["reason"])
        kw["allow_missing_archs"] = frozen(allowed)
    return Verify(**kw)


# ---------------------------------------------------------------- one recipe

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
    r = _Reader(path, check_paths)
    data = load_yaml(path)
    if data is None:
        r.fail(None, None, "empty recipe (needs at least name, source and links_torch)")
    data = r.mapping(data, "(top)")
    for key in data:
        with r.part():
            r.known_keys({key: None}, TOP_KEYS)
    for req in REQUIRED_KEYS:
        if req not in data:
            with r.part():
                r.fail(req, None, "missing required key")
    kw: dict = {"path": path.resolve()}
    name = path.stem      # what the other parts use while the name itself is wrong
    with r.part():
        if "name" in data:
            given = r.string(data["name"], "name")
            if not _NAME.match(given):
                r.fail("name", given, "use lowercase letters, digits and underscores, starting and ending with a "
                                      "letter or digit (the name starts cell ids and wheels)")
            if given != path.stem:
                r.fail("name", given, f"must match the file name ({shorten(path.stem, 60)})")
            kw["name"] = name = given
    with r.part():
        if "source" in data:
            kw["source"] = _read_source(r, data["source"], "source")
    with r.part():
        if "links_torch" in data:
            kw["links_torch"] = r.boolean(data["links_torch"], "links_torch")

    with r.part():
        if data.get("version") is not None:
            version = r.string(data["version"], "version")
            try:
                parsed = Version(version)
            except InvalidVersion:
                r.fail("version", version, "not a PEP 440 version")
            if parsed.local:
                r.fail("version", version, "no local label: the farm adds +cuNNN[torchM.m] itself")
            kw["version"] = version
    with r.part():
        if data.get("subdir") is not None:
            subdir = r.string(data["subdir"], "subdir")
            if Path(subdir).is_absolute() or ".." in Path(subdir).parts:
                r.fail("subdir", subdir, "must be a relative path inside the source tree")
            kw["subdir"] = subdir
    for key in ("submodules", "needs_patch", "self_hosted"):
        with r.part():
            if key in data:
                kw[key] = r.boolean(data[key], key)
    with r.part():
        kw["platforms"] = (_read_platforms(r, data["platforms"]) if "platforms" in data
                           else tuple(defaults.grid_policy.platforms))
    for key in ("min_torch", "max_torch"):
        with r.part():
            if data.get(key) is not None:
                kw[key] = r.minor(data[key], key)
    with r.part():
        if kw.get("min_torch") and kw.get("max_torch") and vtuple(kw["min_torch"]) > vtuple(kw["max_torch"]):
            r.fail("max_torch", kw["max_torch"], f"is below min_torch {kw['min_torch']}")
    with r.part():
        if "combinations" in data:
            kw["combinations"] = _read_combinations(r, data["combinations"], defaults)
    with r.part():
        if "wheel_abi" in data:
            abi = r.string(data["wheel_abi"], "wheel_abi")
            if abi not in WHEEL_ABIS:
                near = difflib.get_close_matches(abi, WHEEL_ABIS, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                r.fail("wheel_abi", abi, f"expected one of {', '.join(WHEEL_ABIS)}{hint}")
            kw["wheel_abi"] = abi

    with r.part():
        arch = ArchOverrides.from_mapping({k: data[k] for k in ARCH_KEYS if k in data}, r.where)
        for key in ("arch_list", "arch_list_aarch64"):
            if getattr(arch, key) is not None:
                _no_repeats(r, data[key], getattr(arch, key), key)
        for key in ("arch_list_by_cuda", "arch_list_by_cuda_aarch64"):
            for cuda, arch_list in getattr(arch, key).items():
                _no_repeats(r, data[key][cuda], arch_list, f"{key}[{cuda}]")
        kw["arch"] = replace(arch, arch_list_by_cuda=frozen(arch.arch_list_by_cuda),
                             arch_list_by_cuda_aarch64=frozen(arch.arch_list_by_cuda_aarch64))
        for key in ("arch_list_by_cuda", "arch_list_by_cuda_aarch64"):
            for cuda in (data.get(key) or {}):
                if cuda not in defaults.grid_policy.supported_cudas:
                    r.fail(f"{key}[{cuda}]", cuda,
                           f"not a supported CUDA line ({', '.join(defaults.grid_policy.supported_cudas)})")
        kw["arch_fallback"] = data.get("arch_fallback")
        if kw.get("wheel_abi") == "pure" and any(data.get(k) for k in ARCH_KEYS[:4]):
            r.fail(next(k for k in ARCH_KEYS[:4] if data.get(k)), None,
                   "a pure wheel carries no binaries: arch lists do not apply")

    with r.part():
        if "build_requires_farm" in data:
            deps = r.strings(data["build_requires_farm"], "build_requires_farm")
            if name in deps:
                r.fail("build_requires_farm", name, "a recipe cannot require its own wheels")
            kw["build_requires_farm"] = deps
    with r.part():
        if "extra_sources" in data:
            kw["extra_sources"] = _read_extra_sources(r, data["extra_sources"])
    with r.part():
        if "system_packages" in data:
            kw["system_packages"] = _read_system_packages(r, data["system_packages"])
    with r.part():
        if data.get("expected_fail") is not None:
            kw["expected_fail"] = _read_expected_fail(r, data["expected_fail"])
    with r.part():
        if "build_deps" in data:
            kw["build_deps"] = _read_requirements(r, data["build_deps"], "build_deps", placeholders=False)
    with r.part():
        if "allow_graft" in data:
            kw["allow_graft"] = r.strings(data["allow_graft"], "allow_graft")
    with r.part():
        if "cuda_components" in data:
            comps = r.strings(data["cuda_components"], "cuda_components")
            for c in comps:
                if c not in CUDA_COMPONENTS:
                    near = difflib.get_close_matches(c, CUDA_COMPONENTS, n=1)
                    hint = f"; did you mean {near[0]!r}?" if near else f" (known: {', '.join(CUDA_COMPONENTS)})"
                    r.fail("cuda_components", c, f"unknown toolkit component{hint}")
            kw["cuda_components"] = comps
    with r.part():
        if "env" in data:
            kw["env"] = _read_env(r, data["env"])
    with r.part():
        if data.get("pre_build") is not None:
            kw["pre_build"] = r.string(data["pre_build"], "pre_build")
    with r.part():
        if "patches" in data:
            kw["patches"] = _read_patches(r, data["patches"], name, path.parent)
    for key in ("max_jobs", "nvcc_threads", "timeout"):
        with r.part():
            if data.get(key) is not None:
                kw[key] = r.bounded(data[key], key)
    with r.part():
        if data.get("peak_gb_per_job") is not None:
            kw["peak_gb_per_job"] = positive_gb(data["peak_gb_per_job"])
            if kw["peak_gb_per_job"] is None:
                r.fail("peak_gb_per_job", data["peak_gb_per_job"], PEAK_GB_PROBLEM)
    with r.part():
        if data.get("nvcc_flags") is not None:
            kw["nvcc_flags"] = r.string(data["nvcc_flags"], "nvcc_flags")
    with r.part():
        if "requires_dist" in data:
            kw["requires_dist"] = _read_requirements(r, data["requires_dist"], "requires_dist", placeholders=True)
    with r.part():
        if data.get("verify") is not None:
            kw["verify"] = _read_verify(r, data["verify"])
    if r.problems:
        raise RecipeProblems(r.problems)

    recipe = Recipe(**kw)
    if names is not None:
        check_references(recipe, names)
    _check_toolkits(recipe, defaults, grid, pcwm)
    return recipe


def check_references(recipe: Recipe, names: Iterable[str]) -> None:
    """`{VER:x}`, `{LOCAL:x}` and `build_requires_farm` must name recipes that exist."""
    names = set(names)
    where = paths.display(recipe.path)
    for i, req in enumerate(recipe.requires_dist or ()):
        for ph, arg in _placeholders(req):
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
    """Each lane's lists against the toolkits of the lines that lane builds (SPEC 4.6: an error, never a drop)."""
    where = paths.display(recipe.path)
    built = built_lines(recipe, defaults, grid, pcwm)
    arch = recipe.arch
    # check_toolkits walks both lanes with one set of lines: give it one lane at a time.
    x86_only = replace(arch, arch_list_aarch64=None, arch_list_by_cuda_aarch64=frozen({}))
    arm_only = replace(arch, arch_list=None, arch_list_by_cuda=frozen({}))
    x86_only.check_toolkits(defaults, where, sorted(built[X86_LANE], key=vtuple))
    arm_only.check_toolkits(defaults, where, sorted(built[ARM_LANE], key=vtuple))


# ---------------------------------------------------------------- lines a recipe builds

def built_lines(recipe: Recipe, defaults: Defaults, grid=None, pcwm=None) -> dict[str, set[str]]:
    """CUDA lines the recipe builds, per lane: {'x86': {...}, 'aarch64': {...}}.

    Own combinations if any (ARM only where the PCWM has that exact torch for the line, when a PCWM
    is given); else the grid rows filtered by min/max_torch and the recipe's platforms. ARM only
    where arch_policy_aarch64 has the line. Without a grid: every supported line.
    """
    plats = set(recipe.platforms)
    x86_plats = [p for p in ("linux", "windows") if p in plats]
    arm = "linux_aarch64" in plats
    arm_rows = defaults.arch_policy.aarch64
    out: dict[str, set[str]] = {X86_LANE: set(), ARM_LANE: set()}
    if recipe.combinations:
        for c in recipe.combinations:
            for p in recipe.platforms:
                if lane(p) == ARM_LANE and c.cuda not in arm_rows:
                    continue
                if pcwm is not None and not any(pcwm.has(c.cuda, c.torch, py, p) for py in c.pythons):
                    continue
                out[lane(p)].add(c.cuda)
        return out
    if grid is None:
        lines = set(defaults.grid_policy.supported_cudas)
        out[X86_LANE] = lines if x86_plats else set()
        out[ARM_LANE] = {c for c in lines if c in arm_rows} if arm else set()
        return out
    for row in grid.rows:
        if recipe.min_torch and vtuple(row.torch) < vtuple(recipe.min_torch):
            continue
        if recipe.max_torch and vtuple(row.torch) > vtuple(recipe.max_torch):
            continue
        if any(_pin(row, p) for p in x86_plats):
            out[X86_LANE].add(row.cuda)
        if arm and row.cuda in arm_rows and _pin(row, "linux_aarch64"):
            out[ARM_LANE].add(row.cuda)
    return out


def _pin(row, platform: str) -> str | None:
    pin = getattr(row, "pin", None)
    return pin(platform) if callable(pin) else row.pins.get(platform)


def _grid_module():
    try:
        from farm.matrix import grid as grid_module
    except ImportError:
        return None
    return grid_module


def current_grid(defaults: Defaults):
    """The derived grid, or None while farm/matrix/grid.py or defaults/grid.generated.yml does not exist yet."""
    g = _grid_module()
    if g is None or not (defaults.folder / g.GRID_FILE).exists():
        return None
    return g.load_grid(defaults.folder)


def current_pcwm(defaults: Defaults):
    """The scraped upstream matrix, or None while it does not exist yet."""
    g = _grid_module()
    if g is None or not (defaults.folder / g.PCWM_FILE).exists():
        return None
    return g.load_pcwm(defaults.folder)


def _generated_files(defaults: Defaults) -> list[Path]:
    g = _grid_module()
    if g is None:
        return []
    return [defaults.folder / g.GRID_FILE, defaults.folder / g.PCWM_FILE]


# ---------------------------------------------------------------- all recipes

_CACHE: dict[tuple, dict[str, Recipe]] = {}


def _fingerprint(folder: Path, defaults: Defaults) -> tuple:
    stamp = []
    for f in [*sorted(folder.iterdir()), *sorted((folder / "patches").rglob("*"))]:
        try:
            st = f.stat()
        except OSError:             # a dangling link: reading it says so
            stamp.append((str(f), None))
            continue
        stamp.append((str(f), st.st_mtime_ns, st.st_size))
    generated = tuple(f.stat().st_mtime_ns if f.exists() else None for f in _generated_files(defaults))
    return (str(folder), id(defaults), generated, tuple(stamp))


def recipe_files(folder: Path | str | None = None) -> list[Path]:
    """Every `<name>.yml` in the folder (a folder named so too: reading it says what it is), hidden
    files (editor locks like `.#x.yml`) aside."""
    folder = Path(folder or paths.recipes_dir())
    return sorted(f for f in folder.glob("*.yml") if not f.name.startswith("."))


def _folder_problems(folder: Path) -> list[BadInput]:
    """A recipes folder that is not there is an error (a typo in --dir or FARM_RECIPES must not read
    as "no recipes"), and so is a `.yaml` file in it: the farm reads only `<name>.yml`, and a recipe
    it skipped without a word would never be built."""
    if not folder.is_dir():
        raise BadInput(paths.display(folder), None, None,
                       "not a folder" if folder.exists() else "no such recipes folder")
    return [BadInput(paths.display(f), None, None,
                     f"recipes are read only from <name>.yml files: rename it to {shorten(f.stem, 60)}.yml "
                     "or move it out of the recipes folder")
            for f in sorted(folder.iterdir())
            if f.suffix.lower() in (".yml", ".yaml") and f.suffix != ".yml" and not f.name.startswith(".")]


def _collisions(recipes: Mapping[str, Recipe]) -> list[BadInput]:
    """Two recipes whose names normalise to one project (`a_b`, `a__b`: both `a-b`) would publish
    wheels pip cannot tell apart."""
    first: dict[str, Recipe] = {}
    out = []
    for name in sorted(recipes):
        project = canonicalize_name(name)
        other = first.setdefault(project, recipes[name])
        if other is not recipes[name]:
            out.append(BadInput(paths.display(recipes[name].path), "name", name,
                                f"the same project as {other.name!r} of {paths.display(other.path)} once "
                                f"normalised ({project!r}): their wheels would collide"))
    return out


def load_recipes(folder: Path | str | None = None, defaults: Defaults | None = None) -> dict[str, Recipe]:
    """Every recipes/<name>.yml, validated with cross-references; cached per folder and file mtimes.
    The first problem is raised (one line); `check_recipes` reports every one."""
    folder = Path(folder or paths.recipes_dir()).resolve()
    defaults = defaults or load_defaults()
    stray = _folder_problems(folder)
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
    for problem in _collisions(recipes):
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
            raise BadInput(paths.display(recipe.path), "build_requires_farm", name,
                           f"build dependency loop: {shorten(' -> '.join(loop))}")
        state[name] = 1
        for dep in recipes[name].build_requires_farm:
            if dep in recipes:
                visit(dep, [*trail, name])
        state[name] = 2

    for name in sorted(recipes):
        visit(name, [])


# ---------------------------------------------------------------- `farm recipes check`

def recipe_hazards(recipe: Recipe, defaults: Defaults, grid=None, pcwm=None) -> list[Hazard]:
    """Fallback hazards (SPEC 4.6) of one recipe over the lines it builds, per lane."""
    return fallback_hazards(recipe.name, recipe.arch, built_lines(recipe, defaults, grid, pcwm), defaults)


@dataclass(frozen=True)
class CheckReport:
    folder: Path
    recipes: Mapping[str, Recipe]            # the valid ones
    errors: tuple[BadInput, ...]             # every problem, one line each, in file order
    invalid: tuple[str, ...]                 # the files (as shown) with at least one problem
    hazards: tuple[Hazard, ...]
    used_grid: bool


def check_recipes(folder: Path | str | None = None, defaults: Defaults | None = None) -> CheckReport:
    """Validate every recipe file on its own (so one bad file does not hide the others), report every
    problem of each, and collect hazards. Unlike loading, a `path` source must exist here."""
    folder = Path(folder or paths.recipes_dir()).resolve()
    defaults = defaults or load_defaults()
    errors: list[BadInput] = _folder_problems(folder)
    invalid = [e.where for e in errors]
    files = recipe_files(folder)
    names = [f.stem for f in files]
    grid, pcwm = current_grid(defaults), current_pcwm(defaults)
    recipes = {}
    for f in files:
        try:
            recipes[f.stem] = load_recipe(f, defaults, names, grid, pcwm, check_paths=True)
            continue
        except RecipeProblems as exc:
            errors.extend(exc.problems)
        except FarmError as exc:
            errors.append(exc)
        except Exception as exc:   # noqa: BLE001 - a checker reports every file: a bug in one is one line too
            errors.append(BadInput(paths.display(f), None, None,
                                   f"could not be checked ({type(exc).__name__}: {shorten(exc, 100)}): a farm bug"))
        invalid.append(paths.display(f))
    for problem in _collisions(recipes):
        errors.append(problem)
        invalid.append(paths.display(recipes.pop(problem.value).path))
    try:
        check_build_order(recipes)
    except BadInput as exc:
        errors.append(exc)
        invalid.append(exc.where)
    hazards = [h for name in sorted(recipes) for h in recipe_hazards(recipes[name], defaults, grid, pcwm)]
    return CheckReport(folder, frozen(recipes), tuple(errors), tuple(dict.fromkeys(invalid)), tuple(hazards),
                       grid is not None)


def verify_from_mapping(data, where: str) -> Verify:
    """The gate's knobs from a plain mapping (what a build spec carries into a container)."""
    return _read_verify(_Reader(Path(where)), data or {})
