"""Two parts of the verify gate, each against the tool a person would use for the same question.

1. The arch check. Subject: `farm.arch.fatbin.read_fatbin` + the (kind, sm, variant) set, on the largest
   libtorch_cuda*.so of PyPI's torch 2.13.0 (CUDA 13.0, x86_64). Baseline, same run:
   `cuobjdump --list-elf --list-ptx` (PyPI's nvidia-cuda-cuobjdump 13.x) on that file.
   Goal: the pure reader at least as fast (ratio <= 1).
2. What the import check hides (design.md §7.7): `hidden_names` over the project's own venv, every
   distribution's metadata read and a wheel's Requires-Dist followed through it. Baseline, same run:
   `pip check` in that venv, which reads the same metadata to check every requirement (its figure
   includes pip's start-up, which a gate that shelled out to it would pay too). Goal: ratio <= 1.
"""

from __future__ import annotations

import subprocess
import sys

from farm.arch.fatbin import read_fatbin
from farm.arch.pam import extract_torch_libs
from farm.build.verify.declared import Interpreter, hidden_names

from .figures import Figure, median_time


def run() -> list[Figure]:
    return [_arch_check(), _hidden_names()]


def _hidden_names() -> Figure:
    interpreter = Interpreter.probe(sys.executable)   # the gate probes once per cell, outside this figure
    requires = ["requests", "pytest", "pyyaml"]

    def ours():
        return hidden_names(requires, ["farm"], False, interpreter)

    def theirs():
        subprocess.run([sys.executable, "-m", "pip", "check"], check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    hidden = len(ours())
    value = median_time(ours, repeat=5)
    baseline = median_time(theirs, repeat=3)
    return Figure("verify: names the import check hides, the venv's metadata vs pip check", value, baseline, goal=1.0,
                  note=f"{hidden} names hidden from a wheel requiring {', '.join(requires)}")


def _arch_check() -> Figure:
    from tests.wheel_factory import cuobjdump, torch_cuda_wheel

    libs = extract_torch_libs(torch_cuda_wheel()) / "torch" / "lib"
    largest = max(libs.glob("libtorch_cuda*.so"), key=lambda p: p.stat().st_size)
    tool = cuobjdump()

    def ours():
        return read_fatbin(largest).keys()

    def theirs():
        subprocess.run([str(tool), "--list-elf", "--list-ptx", str(largest)], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    entries = len(read_fatbin(largest).entries)   # also warms the page cache for both
    value = median_time(ours, repeat=5)
    baseline = median_time(theirs, repeat=3)
    size = largest.stat().st_size / 1e6
    return Figure("verify: arch check of torch's largest CUDA library vs cuobjdump", value, baseline, goal=1.0,
                  note=f"{largest.name} {size:.0f} MB, {entries} fatbin entries")
