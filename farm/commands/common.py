"""Argument helpers shared by command groups."""

from __future__ import annotations

import difflib
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from farm.errors import BadInput, shorten
from farm.platforms import PLATFORMS
from farm.policy import Defaults
from farm.recipes.model import path_problem
from farm.versions import vtuple


def did_you_mean(value: str, known) -> str:
    """' (did you mean 'x'?)' for the closest known value, else ''."""
    known = [str(k) for k in known]
    typed = str(value).replace("O", "0").replace("o", "0")   # '13.O': a letter for a digit
    near = [typed] if typed in known else difflib.get_close_matches(str(value), known, n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def unknown(option: str, value: str, what: str, known, show_known: bool = True) -> BadInput:
    """The one-line refusal of a value no table knows: the nearest known one, else the short list of them."""
    hint = did_you_mean(value, known)
    if not hint and show_known:
        hint = f" (known: {', '.join(known)})"
    return BadInput("command line", option, value, f"unknown {what}{hint}")


def platform_value(text: str) -> str:
    """argparse `type` of --platform: one line with a did-you-mean instead of argparse's usage block
    (the CLI turns a BadInput raised while parsing into its one line too)."""
    if text not in PLATFORMS:
        raise unknown("--platform", text, "platform", PLATFORMS)
    return text


def add_platform(parser, required: bool = False, default: str | None = None) -> None:
    parser.add_argument("--platform", type=platform_value, metavar="{" + ",".join(PLATFORMS) + "}",
                        required=required, default=default)


def check_version(value: str | None, option: str) -> str | None:
    """A dotted version from the command line, or a one-line error naming the option."""
    if value is None:
        return None
    try:
        vtuple(value)
    except ValueError:
        raise BadInput("command line", option, value, "not a version like '12.8'") from None
    return value


def check_cuda(value: str | None, defaults: Defaults) -> str | None:
    if value is not None and value not in defaults.toolkits:
        raise unknown("--cuda", value, "CUDA line", sorted(defaults.toolkits, key=vtuple))
    return value


# ---------------------------------------------------------------- selections (plan, run, ci, arch, coverage, find)

@dataclass(frozen=True)
class Known:
    """The values a selection may name: a value outside these is a typo (exit 2), a value inside
    them that selects nothing is an empty answer (exit 0)."""

    packages: tuple[str, ...]
    cudas: tuple[str, ...]
    torches: tuple[str, ...]
    pythons: tuple[str, ...]

    @classmethod
    def of(cls, defaults: Defaults, recipes: dict | None = None, grid=None) -> Known:
        """CUDA lines from the toolkit table; torch minors and Pythons from the grid and every recipe's
        own combinations (which may name rows the grid lacks)."""
        from farm.matrix.grid import load_grid
        from farm.versions import minor_of

        grid = grid if grid is not None else load_grid(defaults.folder)
        torches = {r.torch for r in grid.rows}
        pythons = {py for r in grid.rows for py in r.pythons}
        for recipe in (recipes or {}).values():
            for combo in recipe.combinations:
                torches.add(minor_of(combo.torch))
                pythons.update(combo.pythons)
        return cls(tuple(sorted(recipes or ())), _ordered(defaults.toolkits), _ordered(torches), _ordered(pythons))

    def check(self, package=(), cuda=(), torch=(), python=()) -> None:
        """One line with a did-you-mean for the first value no table knows."""
        for value in package:
            if value not in self.packages:
                raise BadInput("command line", "--package", value,
                               f"no recipe {_recipe_file(value)}{did_you_mean(value, self.packages)}")
        for option, values, what, known in (("--cuda", cuda, "CUDA line", self.cudas),
                                            ("--torch", torch, "torch minor", self.torches),
                                            ("--python", python, "Python", self.pythons)):
            for value in values:
                if value not in known:
                    raise unknown(option, value, what, known)


def _recipe_file(name: str) -> str:
    """Where recipe `name` would be: in the recipes folder this command reads (--recipes, FARM_RECIPES)."""
    from farm import settings

    return f"{settings.display(settings.recipes_dir())}/{shorten(name, 40)}.yml"


def _ordered(values) -> tuple[str, ...]:
    return tuple(sorted(values, key=vtuple))


def check_selection(args, defaults: Defaults | None = None, recipes: dict | None = None, grid=None) -> Known:
    """Refuse every unknown --package/--cuda/--torch/--python of `args` (absent options are skipped;
    --platform is checked while parsing). The one validator behind plan, run, ci, arch, coverage, find."""
    from farm.policy import load_defaults

    def many(name):
        value = getattr(args, name, None)
        return () if value is None else (value,) if isinstance(value, str) else tuple(value)

    defaults = defaults or load_defaults()
    if recipes is None and (many("package") or many("torch") or many("python")):
        from farm.recipes.reader import load_recipes

        recipes = load_recipes(defaults=defaults)
    known = Known.of(defaults, recipes, grid)
    known.check(many("package"), many("cuda"), many("torch"), many("python"))
    return known


def empty_selection(args, noun: str = "cells") -> str:
    """The answer to a selection of known values that matches nothing: '0 cells: package x has no cells
    for CUDA 12.4, torch 2.5'."""
    def values(name):
        value = getattr(args, name, None)
        return [] if not value else [value] if isinstance(value, str) else list(value)

    packages = values("package")
    subject = f"package {', '.join(packages)}" if packages else "the farm"
    parts = [f"{label} {' or '.join(values(name))}" for name, label in
             (("cuda", "CUDA"), ("torch", "torch"), ("python", "Python"), ("platform", "platform"))
             if values(name)]
    shard = getattr(args, "shard", None)
    if shard:
        parts.append(f"shard {shard}")
    return f"0 {noun}: {subject} has no {noun} for {', '.join(parts) or 'this selection'}"


# ---------------------------------------------------------------- values named on the command line

# Every option's value is checked while the command line is parsed (an argparse `type` raising BadInput,
# which the CLI prints as its one line): a bad one is refused before anything is read, built or written.

def number_arg(option: str, low: float, high: float, what: str, *, whole: bool = False,
               low_open: bool = False) -> Callable[[str], float]:
    """The `type` of a numeric option: a finite number in [low, high] ((low, high] with `low_open`);
    nan, inf, 1e309 and negatives are refused with the range in the line (design.md §12)."""
    def parse(text: str) -> float:
        try:
            value: float = int(text) if whole else float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
            raise BadInput("command line", option, text, what)
        return value
    return parse


def mem_budget_value(text: str) -> float:
    """argparse `type` of --mem-budget: a positive number of GB, else one line naming the option."""
    return number_arg("--mem-budget", 0, 1e6, "must be a positive number of GB, e.g. 16", low_open=True)(text)


def add_mem_budget(parser, help: str) -> None:
    parser.add_argument("--mem-budget", type=mem_budget_value, metavar="GB", help=help)


def driver_value(text: str) -> int:
    """--driver: an NVIDIA driver branch, e.g. 575."""
    return int(number_arg("--driver", 1, 9999, "expected a driver branch like 575", whole=True)(text))


def minutes_arg(option: str, most: int = 24 * 60) -> Callable[[str], float]:
    """--for and the like: minutes of work, more than 0 and at most `most`."""
    return number_arg(option, 0, most, f"expected minutes > 0 and at most {most}", low_open=True)


def arch_token_arg(option: str) -> Callable[[str], str]:
    """--arch of a smoke build: one arch token (`8.6`, `12.0+PTX`); an empty one is no default."""
    def parse(text: str) -> str:
        from farm.archlist import parse_token

        parse_token(text, "command line", option)
        return text
    return parse


# ---------------------------------------------------------------- paths named on the command line

PATH_KINDS = ("input", "input_file", "input_dir", "maybe_dir", "output_file", "output_dir")


def path_arg(option: str, kind: str) -> Callable[[str], Path]:
    """The `type` of a path option, by what the command does with it (design.md §12):
    - input, input_file, input_dir: read only; it must exist (a typo is not "nothing there"), as a file
      or a folder when that is what is read;
    - maybe_dir: read only, and missing means empty (a CI plan job before anything is built); never created,
      and a folder when it exists;
    - output_file: written (atomically); it is not a folder, and its folder exists: nothing is created
      on the way;
    - output_dir: written into and created when missing (with its parents); nothing on the way is a file.
    Every kind: a path the system can take (no NUL, no part over 255 bytes, at most 4,096 bytes)."""
    if kind not in PATH_KINDS:
        raise ValueError(kind)

    def parse(text: str) -> Path:
        problem = path_problem(text)
        if problem:
            raise BadInput("command line", option, text, problem)
        path = Path(text)
        if kind == "maybe_dir" and path.exists() and not path.is_dir():
            raise BadInput("command line", option, text, "is a file, not a folder")
        if kind.startswith("input"):
            if not path.exists():
                raise BadInput("command line", option, text, "no such file or folder" if kind == "input"
                               else "no such folder" if kind == "input_dir" else "no such file")
            if kind == "input_dir" and not path.is_dir():
                raise BadInput("command line", option, text, "is a file, not a folder")
            if kind == "input_file" and path.is_dir():
                raise BadInput("command line", option, text, "is a folder, not a file")
        elif kind == "output_file":
            if path.is_dir():
                raise BadInput("command line", option, text, "is a directory; name a file in it")
            if not path.parent.is_dir():
                raise BadInput("command line", option, text, f"its folder {path.parent} does not exist")
        else:
            for p in (path, *path.parents):
                if p.exists():
                    if not p.is_dir():
                        raise BadInput("command line", option, text, f"{p} is a file, not a folder")
                    break
        return path
    return parse


def add_path(parser, *flags: str, kind: str, **kw) -> None:
    """An option (or positional) holding a path of `kind` (see path_arg), checked while parsing."""
    name = flags[0] if flags[0].startswith("-") else kw.get("metavar") or flags[0]
    parser.add_argument(*flags, type=path_arg(name, kind), **kw)


def add_recipes(parser) -> None:
    """--recipes DIR on a verb that reads recipes: a folder of <name>.yml beside patches/<name>/
    (design.md §4.6); the CLI makes it the FARM_RECIPES of the command."""
    add_path(parser, "--recipes", kind="input_dir", metavar="DIR",
             help="the recipes folder (default: $FARM_RECIPES, else the project's recipes/)")


def print_json(data) -> None:
    """JSON on stdout in one write; a list gets one compact item per line (the C encoder: 14k cells stay fast)."""
    if isinstance(data, list):
        text = "[\n" + ",\n".join(json.dumps(item, sort_keys=True) for item in data) + "\n]" if data else "[]"
    else:
        text = json.dumps(data, indent=2, sort_keys=True)
    sys.stdout.write(text + "\n")


def load_recipe_arch(name: str):
    """A recipe's arch overrides by name (recipes live in recipes/<name>.yml)."""
    from farm.recipes.reader import load_recipes  # recipes are optional for the policy-only commands

    recipes = load_recipes()
    if name not in recipes:
        raise BadInput("command line", "--package", name,
                       f"no recipe {_recipe_file(name)}{did_you_mean(name, recipes)}")
    return recipes[name]
