"""Where the wheelhouse is when the command line does not say."""

from __future__ import annotations

import os
from pathlib import Path


def default_wheelhouse(given: str | os.PathLike | None = None) -> Path:
    """--wheelhouse, else $FARM_WHEELHOUSE, else ./wheelhouse."""
    if given:
        return Path(given)
    env = os.environ.get("FARM_WHEELHOUSE")
    return Path(env) if env else Path.cwd() / "wheelhouse"
