"""The host compiler of a build (design.md §6.4): the one place that points setuptools, torch's
cpp_extension, nvcc and CMake at it.

A Debian builder image carries a toolchain (design.md §8.3): wrappers in /opt/farm-toolchain/bin that run
bullseye's gcc 10 with `--sysroot` at bullseye's glibc 2.31 and libstdc++, and the image's own
binutils. What the extension links then needs no symbol version newer than bullseye has, whatever
the image's own glibc is. The image names it in its facts file, which the step reads here.

The variables, and who reads them:
- CC, CXX: setuptools (compiling and, for LDSHARED following CC, linking), torch's cpp_extension
  (which also gives nvcc `-ccbin $CC`), CMake's C and C++ compilers;
- CUDAHOSTCXX: CMake's CUDA host compiler (CMAKE_CUDA_HOST_COMPILER);
- NVCC_CCBIN: nvcc's own default host compiler, for a build that calls nvcc by itself.
A recipe's `env` still overrides any of them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from farm import settings
from farm.errors import BadInput

IMAGE_FACTS = Path("/etc/farm-image.json")   # written by docker/install-deps.sh
CHOICES = ("toolchain", "image")


def choice(environ: Mapping[str, str] | None = None) -> str:
    """FARM_HOST_COMPILER: `toolchain` (the image's sysroot toolchain, when it has one) or `image`
    (the image's own gcc: the builder as it was before, for comparisons); refused in one line else."""
    value = (settings.HOST_COMPILER.value(environ) or "").strip()
    if value not in CHOICES:
        raise BadInput("environment", settings.HOST_COMPILER.name, value, f"must be one of {', '.join(CHOICES)}")
    return value


def image_toolchain(facts: Path = IMAGE_FACTS) -> dict[str, Any] | None:
    """The toolchain the image's facts file names ({bin, sysroot, gcc, glibc}), None when there is none
    (a manylinux image, whose own gcc already is the old one; the host runner)."""
    try:
        found = json.loads(facts.read_text()).get("toolchain")
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and found.get("bin") else None


def compiler_env(toolchain: Mapping[str, str] | None, chosen: str = "toolchain") -> dict[str, str]:
    """The variables that make every compiler driver of a build the toolchain's (empty without one, or
    when the image's own gcc is chosen)."""
    if not toolchain or chosen != "toolchain":
        return {}
    folder = Path(toolchain["bin"])
    cc, cxx = str(folder / "gcc"), str(folder / "g++")
    return {"CC": cc, "CXX": cxx, "CUDAHOSTCXX": cxx, "NVCC_CCBIN": str(folder)}


def step_env(environ: Mapping[str, str] | None = None, facts: Path = IMAGE_FACTS) -> dict[str, str]:
    """What the compile step adds for the host compiler, in the runner it runs in."""
    return compiler_env(image_toolchain(facts), choice(environ))
