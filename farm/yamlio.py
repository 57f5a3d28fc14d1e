"""YAML reading with one-line errors, and atomic text writes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

from .errors import BadInput
from .paths import display

# libyaml's parser when PyYAML has it (its wheels do): ~5x faster on the recipes every process reads.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path) -> object:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(display(path), None, None, "file not found") from None
    try:
        return yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{display(path)}:{mark.line + 1}:{mark.column + 1}" if mark else display(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BadInput(where, None, None, f"YAML syntax error: {problem}") from None


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
