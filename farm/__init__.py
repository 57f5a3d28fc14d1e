"""cuda-wheel farm: build, verify and serve CUDA Python wheels for every cell PyTorch publishes."""

import sys

__version__ = "0.1.0"

# A cell runs several `python -m farm...` processes (the run's child, each step). Where
# PYTHONDONTWRITEBYTECODE is set, as on some build hosts, each of them would compile the package
# from source again (~0.2 s a process): the package's own bytecode is cached next to it anyway
# (in a read-only tree the write is skipped silently).
sys.dont_write_bytecode = False
