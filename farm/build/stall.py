"""A recipe's `timeout` catches a hung build, not a slow one (design.md §6.4).

The limit is how long the compile (and a recipe's pre_build) may go without progress: nothing
new in its log, where ninja, CMake and the compilers print each finished object and every
warning. A build that keeps making progress is never killed however long it takes, and
nothing else counts: not the wait for a shared environment or toolkit another build is
making (a lock), not the downloads, not the other steps. Under QEMU every instruction is
translated, so an emulated cell's limit is the recipe's times EMULATION_FACTOR. When the
limit fires, the step's one line says so: the limit, where it comes from and the progress
reached (`compile: timed out: no progress for 20 min (limit from recipes/x.yml timeout: 20);
last: 70/95 objects (csrc/a.cu)`).
"""

from __future__ import annotations

import math

from farm import settings
from farm.build.compilelog import UNIT_PERCENT, Count
from farm.build.spec import StallLimit
from farm.errors import BadInput
from farm.recipes.model import Recipe
from farm.runners.emulation import EMULATION_FACTOR, is_emulated


def stall_limit(recipe: Recipe, platform: str) -> StallLimit | None:
    """The limit for a cell of `recipe` on `platform` (farm spelling): FARM_STALL_MINUTES, else the
    recipe's `timeout` (minutes), times EMULATION_FACTOR when the cell runs under emulation; None
    when neither is set (nothing is ever killed)."""
    raw = settings.STALL_MINUTES.get()
    if raw is not None and raw.strip():
        try:
            minutes = float(raw)
        except ValueError:
            minutes = math.nan
        if not math.isfinite(minutes) or minutes <= 0:
            raise BadInput("environment", settings.STALL_MINUTES.name, raw, "expected a positive number of minutes")
        why = f"{settings.STALL_MINUTES.name}={raw.strip()}"
    elif recipe.timeout:
        minutes, why = float(recipe.timeout), f"{settings.display(recipe.path)} timeout: {recipe.timeout}"
    else:
        return None
    if is_emulated(platform):
        minutes, why = minutes * EMULATION_FACTOR, f"{why}, x{EMULATION_FACTOR:g} emulated"
    return StallLimit(seconds=minutes * 60.0, why=why)


def duration(seconds: float) -> str:
    """`20 min`, `2.5 min`, `3 s`: a limit as a person reads it."""
    return f"{seconds / 60:.3g} min" if seconds >= 60 else f"{seconds:.3g} s"


def reached(count: Count) -> str:
    """How far a compile got: `70/95 objects (csrc/a.cu)`, `45%`, `12 objects`, or `no object finished`."""
    if count.total is not None:
        done = f"{count.done}%" if count.unit == UNIT_PERCENT else f"{count.done}/{count.total} {count.unit}"
    elif count.done:
        done = f"{count.done} {count.unit}"
    else:
        return "no object finished"
    return f"{done} ({count.current})" if count.current else done


def stalled_line(limit: StallLimit, last: str, what: str = "progress") -> str:
    """The one line of a step killed as hung."""
    return f"timed out: no {what} for {duration(limit.seconds)} (limit from {limit.why}); last: {last}"
