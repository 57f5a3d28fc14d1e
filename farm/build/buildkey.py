"""Build keys (design.md §5.4): a hash of the SEMANTIC inputs of one wheel.

Keyed: the resolved source pin, the recipe's build-relevant keys and patch
contents (not `verify`, not comments), the resolved arch list, the exact
torch and label, the toolkit, the build context (runner class, image with
its compiler, target platform tag), the pinned build deps, Python, the
build epoch, the build-relevant keys of recipes referenced through
{VER:x} / {LOCAL:x}, and the sha256 of each build_requires_farm wheel.
Recorded but not keyed: image digest, farm version.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.platforms import cell_arch
from farm.policy import Defaults
from farm.recipes.cells import Cell

if TYPE_CHECKING:
    from farm.build.farmdeps import FarmWheel
    from farm.recipes.model import Recipe
    from farm.wheelhouse.manifest import ManifestEntry

_TREE_SKIP = {".git", "build", "dist", "__pycache__", ".eggs"}


@dataclass(frozen=True)
class BuildContext:
    """Where a wheel is built, as far as it changes the bytes."""

    runner: str         # container | host | windows
    image: str          # builder image key (farm.runners.images.builder_key: carries the compiler), or 'host'
    plat_tag: str       # a requested platform tag (--plat); "" for the image's own
    compiler: str = ""  # FARM_HOST_COMPILER when not the default: the image's own gcc, not its toolchain

    def as_dict(self) -> dict[str, str]:
        # Without a compiler choice the dict, and so every key made before the choice existed, is unchanged.
        chosen = {"compiler": self.compiler} if self.compiler else {}
        return {"runner": self.runner, "image": self.image, "plat_tag": self.plat_tag, **chosen}


def context_for(platform: str, runner: str, plat: str | None = None) -> BuildContext:
    """The context `farm build` keys a cell with on `runner`, from declared inputs only.

    Nothing is built or probed, so a fresh machine (a CI plan job without images) keys cells exactly
    as the build that made them: a container's builder key hashes everything the image and its
    recorded platform tag come from, so only an explicit `--plat` request enters the key.
    """
    if platform == "windows":
        return BuildContext("windows", "msvc", "win_amd64")
    if runner == "host":
        return BuildContext("host", "host", plat or "")
    from farm.runners import hostcompiler
    from farm.runners.images import base_ref, builder_key

    arch = cell_arch(platform)
    chosen = hostcompiler.choice()   # the same image builds other bytes with its own gcc (design.md §6.4)
    return BuildContext("container", builder_key(arch, base_ref(arch)), plat or "",
                        "" if chosen == hostcompiler.CHOICES[0] else chosen)


def digest(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def tree_digest(folder: Path) -> str:
    """Content hash of a local source tree (path sources), skipping VCS and build output."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _TREE_SKIP and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(root, name)
            h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


class KeyMaker:
    """Computes build keys for many cells, hashing each recipe's inputs once."""

    def __init__(self, defaults: Defaults, recipes: dict[str, Recipe], wheelhouse: Path | None = None):
        self.defaults = defaults
        self.recipes = recipes
        self._recipe_digest: dict[str, str] = {}
        self.epoch = defaults.grid_policy.whole_default("build_epoch", 1)
        self.wheelhouse = wheelhouse     # where build_requires_farm wheels are looked up (default: as built_keys)
        self._entries: dict[str, list[ManifestEntry]] | None = None     # the house's live entries per project, read once

    def farm_wheels(self, cell: Cell) -> list[FarmWheel]:
        """The cell's build_requires_farm wheels in the wheelhouse (farm/build/farmdeps.py); the journal is read once."""
        from farm.build.farmdeps import by_project, farm_wheels

        if not self.recipes[cell.recipe_name].build_requires_farm:
            return []
        if self._entries is None:
            from farm.settings import default_wheelhouse
            from farm.wheelhouse import read_journal

            self._entries = by_project(read_journal(default_wheelhouse(self.wheelhouse)).entries)
        return farm_wheels(cell, self.recipes, self._entries)

    def recipe_digest(self, name: str) -> str:
        """The recipe's build-relevant keys, patch contents, local source tree, and referenced recipes."""
        if name not in self._recipe_digest:
            self._recipe_digest[name] = ""   # guards against reference cycles
            recipe = self.recipes[name]
            relevant = recipe.build_relevant()
            patches = [self._patch_digest(recipe, p) for p in relevant.get("patches") or ()]
            source = relevant.get("source") or {}
            tree = tree_digest(recipe.source_path) if recipe.source_path else None
            refs = sorted(set(recipe.references()) - {name})
            self._recipe_digest[name] = digest({
                "recipe": relevant, "patches": patches, "source": source, "tree": tree,
                "references": {r: self.recipe_digest(r) for r in refs if r in self.recipes},
            })
        return self._recipe_digest[name]

    @staticmethod
    def _patch_digest(recipe: Recipe, patch: object) -> str:
        file = patch.get("file") if isinstance(patch, dict) else getattr(patch, "file", patch)
        path = Path(recipe.path).parent / "patches" / recipe.name / str(file)
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else f"missing:{file}"

    def key(self, cell: Cell, context: BuildContext | None = None) -> str:
        context = context or context_for(cell.platform, "container")
        inputs: dict[str, Any] = {
            "recipe": self.recipe_digest(cell.recipe_name),
            "arch": cell.arch.arch_list.torch(),
            "torch": cell.torch_pin, "label": cell.local_label,
            "cuda": cell.cuda, "toolkit": self.defaults.toolkits[cell.cuda].version,
            "python": cell.python, "wheel_abi": cell.wheel_abi, "platform": cell.platform,
            "context": context.as_dict(), "epoch": self.epoch,
        }
        wheels = self.farm_wheels(cell)
        if wheels:   # only then: the keys of cells without build_requires_farm stay as they were
            from farm.build.farmdeps import key_input

            inputs["farm_wheels"] = key_input(wheels)
        return digest(inputs)
