"""Where the farm reads its data and keeps its caches. Read once; overridable by environment."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def defaults_dir() -> Path:
    return Path(os.environ.get("FARM_DEFAULTS", PROJECT_ROOT / "defaults"))


def recipes_dir() -> Path:
    return Path(os.environ.get("FARM_RECIPES", PROJECT_ROOT / "recipes"))


def cache_dir() -> Path:
    """Heavy things that survive runs on one machine: toolkits, torch environments, images."""
    return Path(os.environ.get("FARM_CACHE", Path.home() / ".cache" / "farm"))


def wheelhouse_dir() -> Path:
    return Path(os.environ.get("FARM_WHEELHOUSE", PROJECT_ROOT / "wheelhouse"))


def display(path: Path | str) -> str:
    """A path as the user should read it in a message: relative to the project when inside it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(p)
