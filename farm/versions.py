"""Version spellings used across the farm: CUDA lines, torch minors, Pythons, cuNNN tags."""

from __future__ import annotations

import re

_DOTTED = re.compile(r"\d+(\.\d+)*")   # fullmatch


def vtuple(text: str) -> tuple[int, ...]:
    """'12.8' -> (12, 8); '2.13.1' -> (2, 13, 1). Raises ValueError on anything else."""
    if not _DOTTED.fullmatch(str(text)):
        raise ValueError(f"not a dotted version: {text!r}")
    return tuple(int(p) for p in str(text).split("."))


def minor_of(version: str) -> str:
    """'2.13.1' -> '2.13'."""
    return ".".join(str(version).split(".")[:2])


def cuda_tag(cuda: str) -> str:
    """'12.8' -> 'cu128'; '13.0' -> 'cu130'."""
    major, minor = vtuple(cuda)[:2]
    return f"cu{major}{minor}"


def cuda_from_tag(tag: str) -> str:
    """'cu128' -> '12.8' (all digits but the last, then the last)."""
    m = re.fullmatch(r"cu(\d{2,})", tag)
    if not m:
        raise ValueError(f"not a cuNNN tag: {tag!r}")
    digits = m.group(1)
    return f"{int(digits[:-1])}.{digits[-1]}"


def python_tag(python: str) -> str:
    """'3.12' -> '312'."""
    major, minor = vtuple(python)[:2]
    return f"{major}{minor}"


def python_from_tag(tag: str) -> str:
    """'cp312' or '312' -> '3.12'."""
    digits = tag[2:] if tag.startswith("cp") else tag
    return f"{digits[0]}.{digits[1:]}"
