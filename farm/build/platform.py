"""The build platform seam: what differs between a Linux and a Windows cell inside the steps.

farm.build.steps picks one implementation by the cell's platform (`for_cell`) and calls it for
the toolkit, the compile environment and the repair; everything else (source, environment,
label, verify) is the same code for both. Linux (x86_64 and aarch64) is `LinuxPlatform`, below; Windows is
farm.build.windows.WindowsPlatform, which runs only on a Windows host (a `-win` cell is refused
elsewhere before any step starts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from farm.archlist import ArchList
from farm.build.repair import RepairResult
from farm.build.toolkit import BuildToolkit
from farm.errors import StepFailed

if TYPE_CHECKING:
    from farm.build.environments import TorchEnv
    from farm.build.windows import WindowsHost


class BuildPlatform(Protocol):
    name: str

    def toolkit(self, cuda: str, *, arch: str, components: Iterable[str], source: str | None,
                log: Callable[[str], None]) -> BuildToolkit:
        """The cell's CUDA toolkit, found or assembled offline (design.md §6.3)."""
        ...

    def compile_environment(self, *, arch_list: ArchList, toolkit: BuildToolkit, torch_env: TorchEnv | None, cuda: str,
                            max_jobs: int,
                            nvcc_threads: int, nvcc_flags: str, recipe_env: Mapping[str, str],
                            exported: Mapping[str, str], source_date_epoch: int | None,
                            host_folders: Sequence[tuple[str, str]]) -> dict[str, str]:
        """Every variable the compile step sets (design.md §6.4)."""
        ...

    def repair(self, wheel: Path, out_dir: Path, *, torch_env: TorchEnv | None, plat: str | None, floor_plat: str | None,
               allow_graft: Sequence[str], wheel_abi: str, links_torch: bool,
               source_date_epoch: int | None) -> RepairResult:
        """The wheel made installable on its platform (design.md §6.6)."""
        ...


class LinuxPlatform:
    """The image's host compiler (farm.runners.hostcompiler) + nvcc from the cell's toolkit; auditwheel repair
    against the image's manylinux floor."""

    def __init__(self, name: str = "linux"):
        self.name = name   # linux | linux_aarch64

    def toolkit(self, cuda: str, *, arch: str, components: Iterable[str], source: str | None,
                log: Callable[[str], None]) -> BuildToolkit:
        """An installed toolkit of the line, else NVIDIA's PyPI wheels the host downloaded (no network here)."""
        from farm.build.provision import provision_toolkit

        return provision_toolkit(cuda, arch, list(components), source=source, allow_download=False, log=log)

    def compile_environment(self, **kw: Any) -> dict[str, str]:
        from farm.build.compile import compile_environment
        from farm.runners import hostcompiler

        # The image's toolchain, when it has one, compiles and links (design.md §6.4, §8.3).
        return compile_environment(**kw, host_compiler=hostcompiler.step_env())

    def repair(self, wheel: Path, out_dir: Path, *, torch_env: TorchEnv | None, plat: str | None, floor_plat: str | None,
               allow_graft: Sequence[str], wheel_abi: str, links_torch: bool,
               source_date_epoch: int | None) -> RepairResult:
        from farm.build.repair import repair_wheel

        if torch_env is None:   # every phase that repairs starts with env
            raise StepFailed("the env step has not run in this phase")
        # torch's own libraries are never grafted: the overlay's site-packages and its base's.
        return repair_wheel(wheel, out_dir, torch_site_packages=torch_env.site_packages_roots(), plat=plat,
                            floor_plat=floor_plat, allow_graft=allow_graft, wheel_abi=wheel_abi,
                            platform=self.name, links_torch=links_torch, source_date_epoch=source_date_epoch)


def for_cell(platform: str, windows_host: WindowsHost | None = None) -> BuildPlatform:
    """The implementation for a cell's platform (farm.platforms: linux, linux_aarch64, windows).
    windows_host: the machine the Windows path asks (default this one; tests inject recorded tool output)."""
    from farm.build import windows

    if platform == windows.PLATFORM:
        return windows.WindowsPlatform(windows_host)
    return LinuxPlatform(platform)
