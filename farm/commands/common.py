"""Argument helpers shared by command groups."""

from __future__ import annotations

import difflib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from farm.errors import BadInput
from farm.platforms import PLATFORMS
from farm.policy import Defaults
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


def mem_budget_value(text: str) -> float:
    """argparse `type` of --mem-budget: a positive number of GB, else one line naming the option."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise BadInput("command line", "--mem-budget", text, "must be a positive number of GB, e.g. 16")
    return value


def add_mem_budget(parser, help: str) -> None:
    parser.add_argument("--mem-budget", type=mem_budget_value, metavar="GB", help=help)


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
                               f"no recipe recipes/{value}.yml{did_you_mean(value, self.packages)}")
        for option, values, what, known in (("--cuda", cuda, "CUDA line", self.cudas),
                                            ("--torch", torch, "torch minor", self.torches),
                                            ("--python", python, "Python", self.pythons)):
            for value in values:
                if value not in known:
                    raise unknown(option, value, what, known)


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


# ---------------------------------------------------------------- paths named on the command line

def output_file(path: Path | None, option: str) -> Path | None:
    """A file the command will write: its folder must exist (nothing is created for a typo) and the
    path must not be a folder."""
    if path is None:
        return None
    if path.is_dir():
        raise BadInput("command line", option, str(path), "is a directory; name a file in it")
    if not path.parent.is_dir():
        raise BadInput("command line", option, str(path), f"its folder {path.parent} does not exist")
    return path


def output_dir(path: Path | None, option: str) -> Path | None:
    """A folder the command will write into (created when missing): nothing on the way may be a file."""
    if path is None:
        return None
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise BadInput("command line", option, str(path), f"{p} is a file, not a folder")
            break
    return path


def input_dir(path: Path | None, option: str) -> Path | None:
    """A folder the command only reads: it may be missing (read as empty) but never a file."""
    if path is not None and path.exists() and not path.is_dir():
        raise BadInput("command line", option, str(path), "is a file, not a folder")
    return path


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
                       f"no recipe recipes/{name}.yml{did_you_mean(name, recipes)}")
    return recipes[name]
