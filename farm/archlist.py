"""Arch tokens and arch lists (design.md §3.1): parsing, normalisation, rendering.

Tokens: `X.Y` (SASS for sm_XY), `X.Y+PTX` (SASS plus PTX for compute_XY),
`X.Ya` (arch-specific), `X.Yf` (family-specific). Anything else is an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from farm.errors import BadInput

_TOKEN = re.compile(r"(\d{1,2})\.(\d)([af]?)(\+PTX)?")   # fullmatch: `$` takes a trailing newline


@dataclass(frozen=True, order=True)
class ArchToken:
    major: int
    minor: int
    variant: str = ""  # "", "a" or "f"
    ptx: bool = False

    @property
    def cc(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def sm(self) -> int:
        """sm number as nvcc spells it: 8.9 -> 89, 12.0 -> 120."""
        return self.major * 10 + self.minor

    @property
    def plain(self) -> bool:
        return self.variant == ""

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.variant}{'+PTX' if self.ptx else ''}"

    def cmake(self) -> str:
        """CMAKE_CUDA_ARCHITECTURES spelling: 75-real, 90 (SASS+PTX), 90a-real."""
        return f"{self.sm}{self.variant}" + ("" if self.ptx else "-real")


def parse_token(text: str, where: str = "<arch list>", key: str | None = None) -> ArchToken:
    m = _TOKEN.fullmatch(text)
    if not m or (m.group(3) and m.group(4)):
        raise BadInput(where, key, text, "not an arch token (expected X.Y, X.Y+PTX, X.Ya or X.Yf)")
    return ArchToken(int(m.group(1)), int(m.group(2)), m.group(3), bool(m.group(4)))


@dataclass(frozen=True)
class ArchList:
    """An ordered, duplicate-free list of tokens, sorted numerically."""

    tokens: tuple[ArchToken, ...]

    @classmethod
    def parse(cls, text: str, where: str = "<arch list>", key: str | None = None) -> ArchList:
        if not isinstance(text, str):
            raise BadInput(where, key, text, "an arch list must be a string like '8.0;9.0+PTX'")
        words = [w for w in re.split(r"[;\s]+", text.strip()) if w]
        if not words:
            raise BadInput(where, key, text, "empty arch list")
        return cls.of(parse_token(w, where, key) for w in words)

    @classmethod
    def of(cls, tokens) -> ArchList:
        """Merge duplicates (PTX wins) and sort numerically (12.0 after 9.0)."""
        merged: dict[tuple[int, int, str], bool] = {}
        for t in tokens:
            k = (t.major, t.minor, t.variant)
            merged[k] = merged.get(k, False) or t.ptx
        return cls(tuple(ArchToken(*k, ptx=p) for k, p in sorted(merged.items())))

    def plus(self, extra) -> ArchList:
        return ArchList.of((*self.tokens, *extra))

    def normalised(self) -> ArchList:
        """The numerically highest plain token gets +PTX unless a token carries PTX at or above it."""
        plain = [t for t in self.tokens if t.plain]
        if not plain:
            return self
        top = max(plain, key=lambda t: t.cc)
        if any(t.ptx and t.cc >= top.cc for t in self.tokens):
            return self
        return ArchList.of(ArchToken(t.major, t.minor, t.variant, t.ptx or t is top) for t in self.tokens)

    def sass(self) -> set[tuple[int, str]]:
        """(sm, variant) pairs that must have SASS."""
        return {(t.sm, t.variant) for t in self.tokens}

    def ptx(self) -> set[int]:
        return {t.sm for t in self.tokens if t.ptx}

    def lowest(self) -> ArchToken:
        return min(self.tokens, key=lambda t: t.cc)

    def torch(self) -> str:
        """TORCH_CUDA_ARCH_LIST value (spaces)."""
        return " ".join(str(t) for t in self.tokens)

    def cmake(self) -> str:
        """CUDAARCHS / CMAKE_CUDA_ARCHITECTURES value."""
        return ";".join(t.cmake() for t in self.tokens)

    def __str__(self) -> str:
        return self.torch()

    def __iter__(self):
        return iter(self.tokens)
