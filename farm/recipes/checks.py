"""`farm recipes check`: every recipe file validated on its own so one bad file does not hide the
others, every problem of each, the folder-wide ones (stray files, colliding names, build loops),
and the fallback hazards of the valid recipes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from farm import settings
from farm.arch.resolve import Hazard, fallback_hazards
from farm.errors import BadInput, FarmError, RecipeProblems, shorten
from farm.policy import Defaults, frozen, load_defaults
from farm.recipes.lines import built_lines, current_grid, current_pcwm
from farm.recipes.model import Recipe
from farm.recipes.reader import check_build_order, collisions, folder_problems, load_recipe, recipe_files


def recipe_hazards(recipe: Recipe, defaults: Defaults, grid=None, pcwm=None) -> list[Hazard]:
    """Fallback hazards (design.md §3.5) of one recipe over the lines it builds, per lane."""
    return fallback_hazards(recipe.name, recipe.arch, built_lines(recipe, defaults, grid, pcwm), defaults)


@dataclass(frozen=True)
class CheckReport:
    folder: Path
    recipes: Mapping[str, Recipe]            # the valid ones
    errors: tuple[FarmError, ...]            # every problem, one line each, in file order
    invalid: tuple[str, ...]                 # the files (as shown) with at least one problem
    hazards: tuple[Hazard, ...]
    used_grid: bool


def check_recipes(folder: Path | str | None = None, defaults: Defaults | None = None) -> CheckReport:
    """Validate every recipe file on its own (so one bad file does not hide the others), report every
    problem of each, and collect hazards. Unlike loading, a `path` source must exist here."""
    folder = Path(folder or settings.recipes_dir()).resolve()
    defaults = defaults or load_defaults()
    stray = folder_problems(folder)
    errors: list[FarmError] = list(stray)
    invalid = [e.where for e in stray]
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
            errors.append(BadInput(settings.display(f), None, None,
                                   f"could not be checked ({type(exc).__name__}: {shorten(str(exc), 100)}): a farm bug"))
        invalid.append(settings.display(f))
    for problem in collisions(recipes):
        errors.append(problem)
        invalid.append(settings.display(recipes.pop(str(problem.value)).path))   # the value: the second one's name
    try:
        check_build_order(recipes)
    except BadInput as exc:
        errors.append(exc)
        invalid.append(exc.where)
    hazards = [h for name in sorted(recipes) for h in recipe_hazards(recipes[name], defaults, grid, pcwm)]
    return CheckReport(folder, frozen(recipes), tuple(errors), tuple(dict.fromkeys(invalid)), tuple(hazards),
                       grid is not None)
