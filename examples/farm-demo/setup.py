"""Build farm_demo._C from two .cu files and one C++ binding with torch's CUDAExtension.

The arch list comes from TORCH_CUDA_ARCH_LIST (the farm sets it); no -gencode here.
"""

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="farm_demo",
    version="0.1.0",
    description="A small torch CUDA extension: the cuda-wheel farm's demo and end-to-end subject",
    packages=find_packages(include=["farm_demo"]),
    ext_modules=[
        CUDAExtension(
            name="farm_demo._C",
            sources=["csrc/binding.cpp", "csrc/elementwise.cu", "csrc/reduce.cu"],
            extra_compile_args={"cxx": ["-O2"], "nvcc": ["-O2"]},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    install_requires=["torch", "numpy"],
    python_requires=">=3.9",
    zip_safe=False,
)
