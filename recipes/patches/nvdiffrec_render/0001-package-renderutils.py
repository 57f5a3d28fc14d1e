"""nvdiffrec_render (NVlabs/nvdiffrec a3e73909), farm patch script (all lanes: linux, windows, linux_aarch64).

Upstream has no `nvdiffrec_render` folder and no setup.py: render/renderutils compiles its CUDA
plugin on first use with torch.utils.cpp_extension.load, which needs nvcc on the user's machine
and clears TORCH_CUDA_ARCH_LIST to build for the local GPU only. This script makes the folder the
recipe builds, from the fetched tree (nothing upstream is copied into the farm):
- nvdiffrec_render/nvdiffrec_render/: renderutils' Python modules and c_src (its tests left out);
- ops.py's `_get_plugin()` returns the extension compiled ahead of time instead of JIT-compiling
  (the JIT loader stays, renamed `_get_plugin_jit`);
- nvdiffrec_render/setup.py: one CUDAExtension, `nvdiffrec_render._renderutils_plugin`, from the
  same sources and -DNVDR_TORCH define the JIT used. Its `-lcuda -lnvrtc` are left out: c_src
  calls neither the driver API nor NVRTC.
"""

import shutil
import sys
from pathlib import Path

SOURCES = ["mesh.cu", "loss.cu", "bsdf.cu", "normal.cu", "cubemap.cu", "common.cpp", "torch_bindings.cpp"]

SETUP = f'''\
# Written by the farm's patch script 0001-package-renderutils.py (see its header).
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="nvdiffrec_render",
    version="0.0.0",
    packages=["nvdiffrec_render"],
    ext_modules=[CUDAExtension(
        "nvdiffrec_render._renderutils_plugin",
        [f"nvdiffrec_render/c_src/{{name}}" for name in {SOURCES!r}],
        extra_compile_args={{"cxx": ["-DNVDR_TORCH"], "nvcc": ["-DNVDR_TORCH"]}},
    )],
    cmdclass={{"build_ext": BuildExtension}},
)
'''

AOT_LOADER = '''def _get_plugin():
    # farm: the plugin is compiled ahead of time by setup.py
    from . import _renderutils_plugin
    return _renderutils_plugin

def _get_plugin_jit():'''


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    if text.count(old) != 1:
        sys.exit(f"{path}: expected {old!r} exactly once, found it {text.count(old)} times")
    path.write_text(text.replace(old, new))


def main() -> None:
    source, out = Path("render/renderutils"), Path("nvdiffrec_render")
    if out.exists():
        sys.exit(f"{out} exists already: this tree is not the one the script was written for")
    missing = [name for name in SOURCES if not (source / "c_src" / name).is_file()]
    if missing:
        sys.exit(f"{source}/c_src lacks {', '.join(missing)}")
    shutil.copytree(source, out / "nvdiffrec_render", ignore=shutil.ignore_patterns("tests"))
    replace_once(out / "nvdiffrec_render" / "ops.py", "def _get_plugin():", AOT_LOADER)
    (out / "setup.py").write_text(SETUP)


if __name__ == "__main__":
    main()
