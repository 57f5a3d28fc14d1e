"""What a recipe is once read (docs/design.md, design.md §4): frozen dataclasses, tuples and read-only
mappings only. `farm.recipes.reader` makes them from the YAML files; nothing here reads a file."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from farm.arch.resolve import ArchOverrides
from farm.archlist import ArchList
from farm.platforms import PLATFORMS
from farm.policy import Defaults, frozen
from farm.recipes import gitsparse
from farm.versions import vtuple

FULL_SHA = re.compile(r"[0-9a-f]{40}")   # use with fullmatch: `$` would take a trailing newline
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")   # {LOCAL}, {LOCAL:x}, {VER:x}, {CUDA_HOME} ...


MAX_PATH_BYTES = 4096    # PATH_MAX on Linux
MAX_NAME_BYTES = 255     # one part of a path (NAME_MAX)


def path_problem(text: str) -> str | None:
    """Why `text` is no path the farm will hand to the system (a control character such as a NUL or a
    newline, a part over 255 bytes, over 4,096 bytes in all), or None. The one check behind recipe
    paths and command-line paths (design.md §12): such a value is refused where it is read, never
    left to raise an OSError where it is used."""
    bad = next((c for c in text if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        return f"a control character ({bad!r}) in a path"
    longest = max(len(part.encode("utf-8", "surrogateescape")) for part in text.replace("\\", "/").split("/"))
    if longest > MAX_NAME_BYTES:
        return f"a path part of {longest:,} bytes: at most {MAX_NAME_BYTES}"
    size = len(text.encode("utf-8", "surrogateescape"))
    if size > MAX_PATH_BYTES:
        return f"a path of {size:,} bytes: at most {MAX_PATH_BYTES:,}"
    return None


def unsafe_name(name: str) -> str | None:
    """Why `name` cannot be a path inside a tree (absolute, a drive, a '..' part), or None.
    Backslashes count as separators: a recipe or an archive may come from Windows."""
    if name.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", name):
        return "absolute path"
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        return "'..' in path"
    return None


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
        return self.ref if FULL_SHA.fullmatch(self.ref or "") else self.commit

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
        """`when: {platform, cuda}`: each a tuple of values (any may match); a cuda entry is a line
        ('12.8', or '12' for every 12.x) or a bound ('>=12.8', '<13'). The loader checked each entry."""
        plats = self.when.get("platform")
        if plats is not None and platform not in plats:
            return False
        cudas = self.when.get("cuda")
        return cudas is None or any(cuda_matches(c, cuda) for c in cudas)


CUDA_CONDITION = re.compile(r"\s*(>=|<=|==|!=|>|<)?\s*(\d+(?:\.\d+)*)\s*")


def cuda_matches(cond: str, cuda: str) -> bool:
    """One `when.cuda` entry against the cell's CUDA line; ValueError when it is neither a line nor a bound."""
    m = CUDA_CONDITION.fullmatch(cond)
    if not m:
        raise ValueError(cond)
    op, ver = m.group(1) or "==", vtuple(m.group(2))
    have = vtuple(cuda)[: len(ver)] if op == "==" else vtuple(cuda)
    return {
        "==": have == ver, "!=": have != ver, ">=": have >= ver,
        "<=": have <= ver, ">": have > ver, "<": have < ver,
    }[op]


@dataclass(frozen=True)
class AllowedMissing:
    archs: ArchList
    reason: str


@dataclass(frozen=True)
class Verify:
    """Knobs of the verify gate (design.md §7). Not build-relevant."""

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
    allow_graft: tuple[str, ...] = ()      # sonames (fnmatch) auditwheel may copy in (design.md §6.6)
    env: Mapping[str, str] = field(default_factory=lambda: frozen({}))
    pre_build: str | None = None
    patches: tuple[Patch, ...] = ()
    max_jobs: int | None = None            # None: the policy default
    nvcc_threads: int | None = None        # None: the policy default
    nvcc_flags: str | None = None
    requires_dist: tuple[str, ...] | None = None   # None: keep the wheel's own metadata
    verify: Verify = field(default_factory=Verify)
    # Scheduling hints (design.md §11.2, §11.5), not build inputs: they never change a build key.
    peak_gb_per_job: float | None = None   # None: the policy default (memory admission)
    timeout: int | None = None             # minutes a compile may go without progress (design.md §6.4); CI timeout-minutes
    self_hosted: bool = False              # huge builds: CI routes them to a self-hosted runner label

    # -- arch fields, as design.md §4 names them (parsed into `arch`)
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
        return frozenset(arg for req in self.requires_dist or () for _, arg in placeholders_in(req) if arg)

    def parallelism(self, defaults: Defaults) -> tuple[int, int]:
        """(max_jobs, nvcc_threads): the recipe's values, else the policy defaults, else 1."""
        policy = defaults.grid_policy
        return (self.max_jobs or policy.whole_default("max_jobs", 1),
                self.nvcc_threads or policy.whole_default("nvcc_threads", 1))

    def peak_gb(self, defaults: Defaults) -> float:
        """Peak GB of one compile job (memory admission, design.md §11.2): the recipe's, else the policy's, else 8."""
        return self.peak_gb_per_job or defaults.grid_policy.peak_gb_per_job

    def build_relevant(self) -> dict:
        """The keys that feed the build key (design.md §5.4): everything but `verify` (comments never get here).

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
            # A set: the package layer installs them in one command (design.md §8.5), so order is no input.
            "system_packages": {k: sorted(set(v)) for k, v in self.system_packages.items()},
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


def placeholders_in(text: str) -> list[tuple[str, str | None]]:
    """(name, argument) of each `{NAME}` / `{NAME:arg}` in a requirement (argument None without a colon)."""
    out = []
    for body in PLACEHOLDER.findall(text):
        name, _, arg = body.partition(":")
        out.append((name, arg if _ else None))
    return out

