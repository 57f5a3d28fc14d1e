"""Typed access to the values of one recipe file (`Reader`: every failure is one BadInput line
naming file, key and value) and the readers of its nested values: sources, requirement lists,
combinations, env, patches, extra sources, system packages, expected_fail and the verify knobs.
"""

from __future__ import annotations

import datetime
import difflib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import NoReturn

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from farm import settings
from farm.archlist import ArchList, parse_token
from farm.errors import BadInput, shorten
from farm.platforms import ARM_LANE, PLATFORMS, X86_LANE
from farm.policy import Defaults, clamp, frozen, out_of_bounds
from farm.recipes import gitsparse
from farm.recipes.model import (
    CUDA_CONDITION,
    FULL_SHA,
    PLACEHOLDER,
    AllowedMissing,
    Combination,
    ExpectedFail,
    ExtraSource,
    Patch,
    Source,
    Verify,
    path_problem,
    placeholders_in,
    unsafe_name,
)

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
ENV_PLACEHOLDERS = ("ARCHS_TORCH", "ARCHS_CMAKE", "CUDA", "CUDA_HOME")
TORCH_FAMILY = ("torch", "torchvision", "torchaudio")
# Names that are branches (or moving pointers) in practice, whatever they look like.
FLOATING_REFS = ("main", "master", "head", "develop", "dev", "trunk", "latest", "stable", "nightly", "default")

# Validators: each used with fullmatch, never anchored with `$`, which also takes a trailing newline.
_SHORT_SHA = re.compile(r"[0-9a-f]{7,39}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# A tag names a release: an optional word prefix, then a dotted number, then optional suffixes.
# v1.2.3, 0.6, release-1.0, v1.5.0-aot, 2.0.0b0 pass; main, feature/x, v1, fix-bug do not.
_TAG = re.compile(r"(?:[A-Za-z][A-Za-z0-9_]*[-_]?)?\d+(?:\.\d+)+(?:[-._+]?[A-Za-z0-9]+)*")
# Lowercase PEP 508 names: start and end with a letter or digit (`pkg_` is no project name).
RECIPE_NAME = re.compile(r"[a-z0-9](?:[a-z0-9_]*[a-z0-9])?")
_ARCH_WORDS = re.compile(r"[;\s]+")   # how ArchList.parse splits a list
_MINOR = re.compile(r"\d+\.\d+")
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
_PATCH = re.compile(r"\d+\.\d+\.\d+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A package as apt and dnf name it (`libsparsehash-dev`, `sparsehash-devel`, `libfoo:amd64`): it goes
# into a shell line of the package layer's build (design.md §8.5), so nothing else passes.
_SYSTEM_PACKAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+:~-]*")
_URL = re.compile(r"(?:https?|git|ssh|file)://\S+|git@[\w.-]+:\S+")


class Reader:
    """Typed access to one recipe file's values; every failure is one BadInput line."""

    def __init__(self, path: Path, check_paths: bool = False):
        self.path = path
        self.where = settings.display(path)
        self.problems: list[BadInput] = []
        self.check_paths = check_paths      # a `path` source must exist on this machine

    def fail(self, key: str | None, value, problem: str) -> NoReturn:
        raise BadInput(self.where, key, value, problem)

    def part(self) -> Reader:
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
            self.fail(key, value, f"write it as a quoted string, e.g. '{shorten(str(value), 40)}'")
        if not isinstance(value, str):
            self.fail(key, value, f"expected a string, got {_kind(value)}")
        if not empty and not value.strip():
            self.fail(key, value, "must not be empty")
        if "\x00" in value:
            self.fail(key, value, "holds a NUL byte, which no file, argument or environment variable can")
        return value

    def relative_path(self, value, key: str) -> str:
        """A path inside the source tree (`subdir`, an extra source's `dest`): relative, no '..', and one
        the system takes (path_problem): refused here, not by an OSError when the build uses it."""
        text = self.string(value, key)
        problem = path_problem(text)
        if problem:
            self.fail(key, text, problem)
        if unsafe_name(text):
            self.fail(key, text, "must be a relative path inside the source tree")
        return text

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
        if not _MINOR.fullmatch(text):
            self.fail(key, text, "expected a torch minor like '2.8' (major.minor)")
        return text

    def sha256(self, value, key: str) -> str:
        text = self.string(value, key)
        if not _SHA256.fullmatch(text):
            self.fail(key, text, "expected 64 lowercase hex digits")
        return text


def read_arch_list(r: Reader, text, key: str) -> ArchList:
    arch_list = ArchList.parse(text, r.where, key)
    no_repeats(r, text, arch_list, key)
    return arch_list


def no_repeats(r: Reader, text: str, arch_list: ArchList, key: str) -> None:
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

def read_source(r: Reader, value, key: str) -> Source:
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
            r.fail(f"{key}.path", text, f"no such folder ({shorten(settings.display(target), 120)})"
                   if not os.path.exists(target) else f"not a folder ({shorten(settings.display(target), 120)})")
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
            if not FULL_SHA.fullmatch(commit):
                r.fail(f"{key}.git.commit", commit, "expected the full 40-hex commit SHA")
            if FULL_SHA.fullmatch(ref) and commit != ref:
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
    pin: Requirement | None
    try:
        pin = Requirement(pypi)
    except InvalidRequirement:
        pin = None
    specs = list(pin.specifier) if pin else []
    if not pin or len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        r.fail(f"{key}.sdist.pypi", pypi, "expected an exact pin like 'name==1.2.3'")
    if pin.extras or pin.marker:
        # One release's sdist: extras and markers choose nothing among its files.
        r.fail(f"{key}.sdist.pypi", pypi, "expected an exact pin like 'name==1.2.3' (no extras, no markers)")
    return Source("sdist", pypi=pypi, sha256=sha)


def _read_exclude(r: Reader, body: Mapping, ekey: str) -> tuple[str, ...]:
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


def _local_path(r: Reader, text: str, key: str, base: Path) -> Path:
    """`text` as a path on this machine: `~` expanded, relative to `base`, resolved; a path the
    system cannot take (too long, a NUL, an unknown user's ~) is one line too."""
    try:
        target = Path(text).expanduser()
        return (target if target.is_absolute() else base / target).resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        r.fail(key, text, f"not a usable path ({shorten(reason, 80)})")


def _read_url(r: Reader, value, key: str) -> str:
    url = r.string(value, key)
    if not _URL.fullmatch(url):
        r.fail(key, url, "expected a URL (https://, http://, git://, ssh://, file:// or git@host:path)")
    return url


def _read_ref(r: Reader, value, key: str) -> str:
    if isinstance(value, (int, float, datetime.date)) and not isinstance(value, bool):
        r.fail(key, value, f"write the ref as a quoted string, e.g. '{shorten(str(value), 40)}' "
                           f"(YAML reads it as {_kind(value)})")
    ref = r.string(value, key)
    if FULL_SHA.fullmatch(ref):
        return ref
    if ref.lower() in FLOATING_REFS or ref.lower().startswith(("refs/heads/", "origin/")):
        r.fail(key, ref, "a branch moves: pin a full 40-hex commit SHA or a release tag")
    if _SHORT_SHA.fullmatch(ref) and not _TAG.fullmatch(ref):
        r.fail(key, ref, "abbreviated commit: write the full 40-hex SHA")
    if re.fullmatch(r"[0-9a-fA-F]{40}", ref):
        r.fail(key, ref, "write the commit SHA in lowercase")
    if not _TAG.fullmatch(ref):
        r.fail(key, ref, "looks like a branch name: pin a full 40-hex commit SHA or a release tag like v1.2.3")
    return ref


def _read_requirement(r: Reader, text: str, key: str, *, placeholders: bool) -> Requirement:
    probe = text
    if placeholders:
        for name, arg in placeholders_in(text):
            shown = shorten("{" + name + (f":{arg}" if arg is not None else "") + "}", 60)
            if name == "LOCAL" and arg is None:
                probe = probe.replace(shown, "cu128torch2.8", 1)
            elif name in ("LOCAL", "VER") and arg:
                if not RECIPE_NAME.fullmatch(arg):
                    r.fail(key, text, f"{shown}: not a recipe name")
                probe = probe.replace(shown, "cu128" if name == "LOCAL" else "1.0", 1)
            else:
                r.fail(key, text, f"unknown placeholder {shown} (known: {{LOCAL}}, {{LOCAL:<recipe>}}, {{VER:<recipe>}})")
    try:
        req = Requirement(probe)
    except InvalidRequirement as exc:
        r.fail(key, text, f"not a valid requirement: {str(exc).splitlines()[0]}")
    if req.url:
        # A direct URL is fetched as it is whenever the build runs: no version pin, no hash (design.md §4.2).
        r.fail(key, text, "a direct URL (name @ url) is not pinned: name a version the index serves")
    squashed = canonicalize_name(req.name).replace("-", "")
    if squashed in TORCH_FAMILY:
        r.fail(key, text, "the torch family (torch, torchvision, torchaudio) is never listed: the cell's "
                          "channel decides which torch a wheel goes with")
    return req


def read_requirements(r: Reader, value, key: str, *, placeholders: bool) -> tuple[str, ...]:
    items = r.strings(value, key)
    for i, text in enumerate(items):
        _read_requirement(r, text, f"{key}[{i}]", placeholders=placeholders)
    return items


# ---------------------------------------------------------------- the rest of the keys

def read_platforms(r: Reader, value) -> tuple[str, ...]:
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


def read_combinations(r: Reader, value, defaults: Defaults) -> tuple[Combination, ...]:
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
        if not _PATCH.fullmatch(torch):
            r.fail(f"{key}.torch", torch, "own combinations name an exact torch patch, e.g. '2.8.0'")
        pythons = r.strings(row["pythons"], f"{key}.pythons")
        if not pythons:
            r.fail(f"{key}.pythons", [], "name at least one Python")
        for p in pythons:
            if p.endswith("t"):
                r.fail(f"{key}.pythons", p, "free-threaded Pythons are never targets")
            if not _MINOR.fullmatch(p):
                r.fail(f"{key}.pythons", p, "expected a Python like '3.12'")
        if (cuda, torch) in seen:
            r.fail(key, f"{cuda}/{torch}", "this (cuda, torch) row is listed twice")
        seen.add((cuda, torch))
        arch_list = None
        if row.get("arch_list") is not None:
            arch_list = read_arch_list(r, row["arch_list"], f"{key}.arch_list")
            clamp(arch_list, cuda, defaults.toolkits, r.where, f"{key}.arch_list")
        source = read_source(r, row["source"], f"{key}.source") if row.get("source") is not None else None
        out.append(Combination(cuda, torch, pythons, arch_list, source))
    return tuple(out)


def read_env(r: Reader, value) -> Mapping[str, str]:
    data = r.mapping(value, "env")
    out = {}
    for name, text in data.items():
        key = f"env.{name}"
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            r.fail(key, name, "not an environment variable name")
        text = r.string(text, key, empty=True)
        for body in PLACEHOLDER.findall(text):
            if body not in ENV_PLACEHOLDERS:
                r.fail(key, text, f"unknown placeholder {{{shorten(body, 40)}}} (known: "
                                  f"{', '.join('{' + p + '}' for p in ENV_PLACEHOLDERS)})")
        out[name] = text
    return frozen(out)


def read_patches(r: Reader, value, name: str, recipes_folder: Path) -> tuple[Patch, ...]:
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
            r.fail(f"{key}.file", file, f"no such file {settings.display(folder)}/{shorten(file, 80)}")
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
                for line in when["cuda"]:
                    if not CUDA_CONDITION.fullmatch(line):
                        r.fail(f"{key}.when.cuda", line, "expected a CUDA line like 12.8 or >=12.8")
        out.append(Patch(file, target, frozen(when)))
    return tuple(out)


def read_extra_sources(r: Reader, value) -> tuple[ExtraSource, ...]:
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
        dest = r.relative_path(item["dest"], f"{key}.dest")
        if not PurePosixPath(dest.replace("\\", "/")).parts:
            r.fail(f"{key}.dest", dest, "names the source tree itself: give a folder or file inside it")
        if not is_git:
            out.append(ExtraSource(_read_url(r, item["url"], f"{key}.url"),
                                   r.sha256(item["sha256"], f"{key}.sha256"), dest))
            continue
        url = _read_url(r, item["git"], f"{key}.git")
        commit = r.string(item["commit"], f"{key}.commit")
        if not FULL_SHA.fullmatch(commit):
            # A tag can be moved upstream and a short SHA can grow ambiguous: only a full commit stays.
            r.fail(f"{key}.commit", commit, "expected the full 40-hex commit SHA (no tag, no short SHA)")
        out.append(ExtraSource(url, None, dest, commit, _read_exclude(r, item, f"{key}.{gitsparse.KEY}")))
    return tuple(out)


def read_system_packages(r: Reader, value) -> Mapping[str, tuple[str, ...]]:
    data = r.mapping(value, "system_packages")
    r.known_keys(data, IMAGE_FAMILIES, "system_packages.")
    for fam in data:
        for i, name in enumerate(r.strings(data[fam], f"system_packages.{fam}")):
            if not _SYSTEM_PACKAGE.fullmatch(name):
                r.fail(f"system_packages.{fam}[{i}]", name, "expected one package name (letters, digits, . _ + : ~ -)")
    return frozen({fam: r.strings(data[fam], f"system_packages.{fam}") for fam in IMAGE_FAMILIES if fam in data})


def read_expected_fail(r: Reader, value) -> ExpectedFail:
    data = r.mapping(value, "expected_fail")
    r.known_keys(data, EXPECTED_FAIL_KEYS, "expected_fail.")
    for req in ("cells", "reason"):
        if req not in data:
            r.fail(f"expected_fail.{req}", None, "missing required key")
    until = None if data.get("until") is None else _read_date(r, data["until"], "expected_fail.until")
    return ExpectedFail(r.string_or_list(data["cells"], "expected_fail.cells"),
                        r.string(data["reason"], "expected_fail.reason"), until)


def _read_date(r: Reader, value, key: str) -> str:
    """A calendar day, as YAML reads `2025-06-30` or as a quoted '2025-06-30'; kept as that ISO text."""
    if isinstance(value, datetime.datetime):
        r.fail(key, value, "expected a day like 2025-06-30, not a time")
    if isinstance(value, datetime.date):
        return value.isoformat()
    text = r.string(value, key)
    if not _DAY.fullmatch(text):
        r.fail(key, text, "expected a date like 2025-06-30")
    try:
        return datetime.date.fromisoformat(text).isoformat()
    except ValueError as exc:
        r.fail(key, text, f"not a real date ({exc})")


def read_verify(r: Reader, value) -> Verify:
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
            allowed[where_key] = AllowedMissing(read_arch_list(r, entry["archs"], f"{key}.archs"), entry["reason"])
        kw["allow_missing_archs"] = frozen(allowed)
    return Verify(**kw)

