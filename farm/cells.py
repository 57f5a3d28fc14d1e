"""Cells: one (package, CUDA, torch, Python, platform) build, one wheel (SPEC 7)."""

from __future__ import annotations

from dataclasses import dataclass

from .arches import Resolution


@dataclass(frozen=True)
class Cell:
    recipe_name: str
    cuda: str               # '13.0'
    torch: str              # torch minor of the channel, '2.13'
    torch_pin: str          # the exact torch the environment installs for this platform, '2.13.0'
    python: str             # '3.11' (abi3: the floor Python)
    platform: str           # linux | windows | linux_aarch64
    links_torch: bool
    arch: Resolution
    id: str

    @property
    def local_label(self) -> str:
        """+cu130torch2.13 for torch-linked wheels, +cu130 for torch-free ones (SPEC 8.1 label)."""
        cu = "cu" + self.cuda.replace(".", "")
        return f"{cu}torch{self.torch}" if self.links_torch else cu
