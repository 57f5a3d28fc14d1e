"""`farm recipes new NAME`: a first recipe from an sdist on PyPI or a git tag, pinned by what fetching
finds, written atomically, checked like every recipe and scanned for upstream hazards (design.md §4.6).

An sdist is found through the simple index (farm/build/source/archive.py) and downloaded, never built:
`pip download` of a torch extension prepares its metadata, which runs setup.py and imports torch. Its
sha256 is the one the index gives, checked against the bytes; its version is PKG-INFO's. A git tag
is resolved to its full commit through the builds' own mirror cache (farm/build/source/git.py), so a
git `url.<mirror>.insteadOf` setting that serves the builds serves this too.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Any, NoReturn

from farm import settings
from farm.build.source.scan import Hazard, scan_tree
from farm.errors import BadInput
from farm.policy import Defaults
from farm.recipes.model import FULL_SHA
from farm.recipes.values import RECIPE_NAME, Reader, read_source

_PLACEHOLDER_SHA = "0" * 64   # lets the loader's own rules check a pin before its sha256 is known
_OPTIONS = {"source.sdist.pypi": "--sdist", "source.git.url": "--git", "source.git.ref": "--ref"}


class _CommandLine(Reader):
    """The recipe loader's value rules, speaking of command-line options instead of recipe keys."""

    def __init__(self) -> None:
        super().__init__(Path("command line"))
        self.where = "command line"

    def fail(self, key: str | None, value: Any, problem: str) -> NoReturn:
        raise BadInput("command line", _OPTIONS.get(key or "", key), value, problem)


@dataclass(frozen=True)
class Pinned:
    """What fetching found: the recipe's `source` mapping, the version PKG-INFO gives (sdists only),
    and the tree it fetched (for the scan)."""

    source: dict[str, Any]
    version: str | None
    tree: Path
    shown: str


@dataclass(frozen=True)
class Written:
    """What `farm recipes new` did: the file, the pin, the scan's findings, the cell to build first."""

    path: Path
    shown: str
    version: str | None
    hazards: list[Hazard]
    files_read: int
    valid: int            # valid recipes in the folder, the new one included
    first_cell: str


def new_recipe(name: str, folder: Path, *, sdist: str | None, git: str | None, ref: str | None,
               defaults: Defaults) -> Written:
    """Pin, fetch, scan, write `folder/<name>.yml` atomically and check the folder; a recipe the check
    refuses, or one that breaks the folder (a colliding name), is removed and its first problem raised."""
    from farm.recipes.checks import check_recipes
    from farm.recipes.status import status_cell_id
    from farm.yamlio import write_atomic

    target = check_name(name, folder)   # refused before anything is fetched
    before = {str(e) for e in check_recipes(folder, defaults=defaults).errors}
    with fetched(sdist, git, ref) as pinned:
        report = scan_tree(pinned.tree)
        write_atomic(target, render(name, pinned, defaults, report.hazards))
    checked = check_recipes(folder, defaults=defaults)
    made = [e for e in checked.errors if str(e) not in before]
    if made:
        target.unlink()
        raise made[0]
    return Written(target, pinned.shown, pinned.version, report.hazards, report.files_read, len(checked.recipes),
                   status_cell_id(checked.recipes[name]))


def check_name(name: str, folder: Path) -> Path:
    """The file `farm recipes new` would write; a bad or taken name is one line, exit 2."""
    if not RECIPE_NAME.fullmatch(name):
        raise BadInput("command line", "NAME", name, "use lowercase letters, digits and underscores, starting and "
                                                     "ending with a letter or digit (the name starts cell ids and wheels)")
    target = folder / f"{name}.yml"
    if target.exists() or target.is_symlink():
        raise BadInput("command line", "NAME", name, f"{settings.display(target)} exists: edit it, or choose another name")
    return target


@contextmanager
def fetched(sdist: str | None, git: str | None, ref: str | None) -> Iterator[Pinned]:
    """The pinned source, fetched into a temporary tree that is gone after the `with`."""
    if (sdist is None) == (git is None):
        raise BadInput("command line", "--sdist/--git", None, "give exactly one source: --sdist NAME==VERSION or --git URL --ref TAG")
    if git is not None and ref is None:
        raise BadInput("command line", "--ref", None, "--git needs --ref: a release tag or a full commit SHA")
    if git is None and ref is not None:
        raise BadInput("command line", "--ref", ref, "only --git takes a ref")
    scratch = Path(tempfile.mkdtemp(prefix="farm-new-"))
    try:
        tree = scratch / "tree"
        yield _pin_sdist(sdist, tree) if sdist is not None else _pin_git(str(git), str(ref), tree)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _pin_sdist(pin: str, tree: Path) -> Pinned:
    from farm.build.source.archive import fetch_sdist, find_pypi_sdist

    read_source(_CommandLine(), {"sdist": {"pypi": pin, "sha256": _PLACEHOLDER_SHA}}, "source")
    link = find_pypi_sdist(pin, "command line", "--sdist")
    if link.sha256 is None:
        raise BadInput("command line", "--sdist", pin, f"the index gives no sha256 for {link.filename}: "
                                                      "write the recipe with `sdist: {url, sha256}` by hand")
    # Downloaded into the builds' sdist cache, checked against the index's sha256: the first build reuses it.
    fetch_sdist(tree, sha256=link.sha256, url=link.url, where="command line")
    return Pinned({"sdist": {"pypi": pin, "sha256": link.sha256}}, _pkg_info_version(tree), tree,
                  f"sdist {link.filename} (sha256 {link.sha256})")


def _pkg_info_version(tree: Path) -> str | None:
    """The `Version:` of the sdist's PKG-INFO (core metadata), the version its wheel carries."""
    info = tree / "PKG-INFO"
    if not info.is_file():
        return None
    return HeaderParser().parsestr(info.read_text(encoding="utf-8", errors="replace")).get("Version")


def _pin_git(url: str, ref: str, tree: Path) -> Pinned:
    from farm.build.source.git import ensure_mirror, fetch_git, resolve_ref

    read_source(_CommandLine(), {"git": {"url": url, "ref": ref}}, "source")
    mirror = ensure_mirror(url)   # through git's own config: url.<mirror>.insteadOf reaches a mirror
    sha = resolve_ref(mirror, url, ref, "command line", "--ref")
    fetch_git(url, sha, tree, where="command line")
    body = {"url": url, "ref": ref} if FULL_SHA.fullmatch(ref) else {"url": url, "ref": ref, "commit": sha}
    return Pinned({"git": body}, None, tree, f"git {url} @ {ref} = {sha}")


def render(name: str, pinned: Pinned, defaults: Defaults, hazards: list[Hazard]) -> str:
    """The recipe's text: the pinned source, no arch keys (each cell takes the policy row of its line,
    listed as a comment so the owner sees it), and the scan's findings as comments to act on."""
    import yaml

    lines = [f"# {name}: written by `farm recipes new` from {pinned.shown}.",
             "# Read docs/adding-a-package.md before the first build; comments never change a build key."]
    lines += yaml.safe_dump({"name": name, "source": pinned.source}, sort_keys=False).splitlines()
    if pinned.version:
        lines += [f"version: {_quoted(pinned.version)}   # PKG-INFO's; the verify gate checks the wheel carries it"]
    lines += ["links_torch: true   # one wheel per (CUDA, torch minor, Python); false: a torch-free +cuNNN wheel",
              "# No arch keys: each cell builds the policy row of its CUDA line (defaults/arch_policy.yml):"]
    lines += [f"#   x86 {cuda}: {row}" for cuda, row in _rows(defaults.arch_policy.x86)]
    lines += [f"#   aarch64 {cuda}: {row}" for cuda, row in _rows(defaults.arch_policy.aarch64)]
    if hazards:
        lines += ["# Upstream hazard scan (`farm recipes scan`), each with the farm's fix:"]
        lines += [f"#   {h.location}: {h.summary}; fix: {h.fix}" for h in hazards]
    else:
        lines += ["# Upstream hazard scan: nothing found in setup.py, CMake files or the C++/CUDA sources."]
    return "\n".join(lines) + "\n"


def _rows(table: Mapping[str, object]) -> list[tuple[str, str]]:
    from farm.versions import vtuple

    return [(cuda, str(table[cuda])) for cuda in sorted(table, key=vtuple)]


def _quoted(version: str) -> str:
    """A version YAML would read as a number ('0.6') is quoted."""
    import yaml

    return version if isinstance(yaml.safe_load(version), str) else f"'{version}'"
