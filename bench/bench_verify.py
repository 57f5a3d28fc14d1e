"""The verify gate's arch check on torch's largest CUDA library, against cuobjdump on the same file.

Subject: `farm.arch.fatbin.read_fatbin` + the (kind, sm, variant) set, on the largest
libtorch_cuda*.so of PyPI's torch 2.13.0 (CUDA 13.0, x86_64). Baseline, same run:
`cuobjdump --list-elf --list-ptx` (PyPI's nvidia-cuda-cuobjdump 13.x) on that file.
Goal: the pure reader at least as fast (ratio <= 1).
"""

from __future__ import annotations

import subprocess

from farm.arch.fatbin import read_fatbin
from farm.arch.pam import extract_torch_libs

from .figures import Figure, median_time


def run() -> list[Figure]:
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
    return [Figure("verify: arch check of torch's largest CUDA library vs cuobjdump", value, baseline, goal=1.0,
                   note=f"{largest.name} {size:.0f} MB, {entries} fatbin entries")]
