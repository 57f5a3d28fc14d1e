"""Argument helpers shared by command groups."""

from __future__ import annotations

import json
import sys

from ..errors import BadInput
from ..platforms import PLATFORMS
from ..policy import Defaults
from ..versions import vtuple


def add_platform(parser, required: bool = False, default: str | None = None) -> None:
    parser.add_argument("--platform", choices=PLATFORMS, required=required, default=default)


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
    check_version(value, "--cuda")
    if value is not None and value not in defaults.toolkits:
        known = ", ".join(sorted(defaults.toolkits, key=vtuple))
        raise BadInput("command line", "--cuda", value, f"unknown CUDA line (known: {known})")
    return value


def print_json(data) -> None:
    """JSON on stdout in one write; a list gets one compact item per line (the C encoder: 14k cells stay fast)."""
    if isinstance(data, list):
        text = "[\n" + ",\n".join(json.dumps(item, sort_keys=True) for item in data) + "\n]" if data else "[]"
    else:
        text = json.dumps(data, indent=2, sort_keys=True)
    sys.stdout.write(text + "\n")


def load_recipe_arch(name: str):
    """A recipe's arch overrides by name (recipes live in recipes/<name>.yml)."""
    from ..recipes import load_recipes  # recipes are optional for the policy-only commands

    recipes = load_recipes()
    if name not in recipes:
        import difflib

        near = difflib.get_close_matches(name, recipes, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise BadInput("command line", "--package", name, f"no recipe recipes/{name}.yml{hint}")
    return recipes[name]
