"""The CUDA lines a recipe builds, per lane (`built_lines`), from its own combinations or the
derived grid, and the grid and upstream matrix as the recipe checks read them."""

from __future__ import annotations

from pathlib import Path

from farm.platforms import ARM_LANE, X86_LANE, lane
from farm.policy import Defaults
from farm.recipes.model import Recipe
from farm.versions import vtuple


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


def generated_files(defaults: Defaults) -> list[Path]:
    g = _grid_module()
    if g is None:
        return []
    return [defaults.folder / g.GRID_FILE, defaults.folder / g.PCWM_FILE]

