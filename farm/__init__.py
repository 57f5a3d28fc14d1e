"""cuda-wheel farm: build, verify and serve CUDA Python wheels for every cell PyTorch publishes."""

__version__ = "0.1.0"
