"""Provisioning a cell's CUDA toolkit (design.md §6.3): an installed one on the cell's line when
this machine runs the cell's arch, else CUDA 13.x assembled from NVIDIA's PyPI wheels into the cache
(see farm/build/toolkit.py for the layout), once, under a lock, leased while a build uses it.
"""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import stat
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from farm import cachebudget, settings
from farm.build.downloads import DownloadSet, Index, download, find_manifest
from farm.build.libcudastub import ensure_libcuda_stub, stub_cached_toolkit
from farm.build.toolkit import (
    CORE_EXTRAS,
    TARGET_TRIPLE,
    TORCH_HEADER_EXTRAS,
    Toolkit,
    arch_of,
    cuda_line,
    find_system_toolkit,
    inspect_toolkit,
    normalise_components,
)
from farm.errors import BadInput, ToolkitUnavailable
from farm.platforms import host_arch
from farm.settings import cache_dir
from farm.versions import vtuple


def toolkit_requirement(cuda: str, components: tuple[str, ...] = ()) -> str:
    """`cuda-toolkit[nvcc,...]==13.0.*`: the meta-package pins every component of the line consistently."""
    extras = sorted(set(CORE_EXTRAS) | set(TORCH_HEADER_EXTRAS) | set(components))
    return f"cuda-toolkit[{','.join(extras)}]=={cuda_line(cuda)}.*"


def _require_pypi_line(cuda: str) -> None:
    line = cuda_line(cuda)
    if vtuple(line)[0] < 13:
        raise ToolkitUnavailable(
            f"CUDA {line}: no toolkit on this machine (no /usr/local/cuda* with nvcc {line}) and PyPI has no "
            f"nvcc for CUDA 12.x (nvidia-cuda-nvcc-cu12 ships no nvcc binary): build this cell in an image "
            f"with CUDA {line}, or install CUDA {line} under /usr/local/cuda-{line}")


def download_toolkit_wheels(cuda: str, platform: str = "linux", components: Iterable[str] = (), *,
                            log: Callable[[str], None] | None = None, root: Path | None = None) -> DownloadSet:
    """Host side: fetch the toolkit wheels for `platform` into the shared downloads cache (network)."""
    _require_pypi_line(cuda)
    comps = normalise_components(components)
    plat = "linux_aarch64" if arch_of(platform) == "aarch64" else "linux"
    # The wheels are py3-none-manylinux: any Python tag resolves them the same way.
    return download([toolkit_requirement(cuda, comps)], python="3.11", platform=plat, glibc="2.28",
                    index=Index(), log=log, root=root)


def _cached_toolkit_wheels(cuda: str, platform: str, comps: tuple[str, ...], root: Path | None) -> DownloadSet | None:
    plat = "linux_aarch64" if arch_of(platform) == "aarch64" else "linux"
    return find_manifest([toolkit_requirement(cuda, comps)], python="3.11", platform=plat, glibc="2.28",
                         index=Index(), root=root)


def _wheel_metadata(whl: Path) -> email.message.Message:
    with zipfile.ZipFile(whl) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(z.read(name).decode("utf-8"))


def _project(whl: Path) -> str:
    return whl.name.split("-")[0].lower().replace("_", "-")


def _extra_projects(meta_wheel: Path) -> dict[str, set[str]]:
    """cuda-toolkit's METADATA: extra -> the projects it pulls in."""
    out: dict[str, set[str]] = {}
    meta = _wheel_metadata(meta_wheel)
    for extra in meta.get_all("Provides-Extra") or []:
        out.setdefault(extra, set())
    for req in meta.get_all("Requires-Dist") or []:
        m = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", req)
        if m:
            name = re.match(r"[A-Za-z0-9_.\-]+", req)
            if name:   # a Requires-Dist always starts with its project name
                out.setdefault(m.group(1), set()).add(name.group(0).lower().replace("_", "-"))
    return out


def _extract(whl: Path, dest: Path, headers_only: bool) -> list[str]:
    """Unpack nvidia/cu<N>/... of one wheel into dest/ (modes kept); dist-info goes to dest/dist-info/."""
    written = []
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            name = info.filename
            m = re.match(r"nvidia/cu\d+/(.+)", name)
            if m:
                rel = m.group(1)
                if headers_only and not rel.startswith("include/"):
                    continue
            elif ".dist-info/" in name:
                rel = "dist-info/" + name
            else:
                continue
            if name.endswith("/"):
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(target, mode if mode else 0o644)
            written.append(rel)
    return written


def _finish_layout(home: Path, arch: str) -> None:
    """lib64, unversioned .so links (libcudart.so -> libcudart.so.13, libnvrtc-builtins.so ->
    libnvrtc-builtins.so.13.0: a link line's `-lnvrtc-builtins` finds only the unversioned name), targets/<triple>/."""
    lib = home / "lib"
    lib.mkdir(exist_ok=True)
    if not (home / "lib64").exists():
        (home / "lib64").symlink_to("lib")
    for so in sorted(lib.glob("lib*.so.*")):
        m = re.match(r"(lib.+?\.so)(?:\.\d+)+$", so.name)
        if m and not (lib / m.group(1)).exists():
            (lib / m.group(1)).symlink_to(so.name)
    triple = home / "targets" / TARGET_TRIPLE[arch]
    triple.mkdir(parents=True, exist_ok=True)
    for name, to in (("include", "../../include"), ("lib", "../../lib"), ("lib64", "../../lib")):
        if not (triple / name).exists():
            (triple / name).symlink_to(to)
    nvcc = home / "bin" / "nvcc"
    if not nvcc.exists():
        raise ToolkitUnavailable(f"the toolkit wheels left no bin/nvcc in {home}")
    for exe in [*(home / "bin").iterdir(), *(home / "nvvm" / "bin").glob("*")]:
        if exe.is_file() and exe.suffix not in (".profile", ".stub"):
            exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _build_prefix(home: Path, wheels: DownloadSet, arch: str, comps: tuple[str, ...]) -> dict[str, Any]:
    meta_wheel = wheels.file_for("cuda-toolkit")
    if meta_wheel is None:
        raise ToolkitUnavailable("the toolkit download has no cuda-toolkit meta-package wheel")
    extras = _extra_projects(meta_wheel)
    unknown = [c for c in comps if c not in extras]
    if unknown:
        known = ", ".join(sorted(e for e in extras if e != "all"))
        raise BadInput("recipe", "cuda_components", unknown[0],
                       f"not a component of {meta_wheel.name.split('-')[1]} (known: {known})")
    full = set().union(*(extras.get(e, set()) for e in (*CORE_EXTRAS, *comps)))
    t0 = time.monotonic()
    for whl in wheels.files:
        proj = _project(whl)
        if proj == "cuda-toolkit":
            continue
        _extract(whl, home, headers_only=proj not in full)
    _finish_layout(home, arch)
    ensure_libcuda_stub(home, arch)      # under acquire()'s exclusive lock, before the marker
    names = [w.name for w in wheels.files]
    if arch == host_arch():
        tk = inspect_toolkit(home, "pypi", arch, comps, wheels=names)
    else:
        # A foreign-arch nvcc runs only under emulation: record what the wheels say and ask
        # the real nvcc when the toolkit is used on its own arch (see provision_pypi_toolkit).
        nvcc_whl = wheels.file_for("nvidia-cuda-nvcc")
        version = nvcc_whl.name.split("-")[1] if nvcc_whl else "unknown"
        tk = Toolkit(home=home, version=version, line=".".join(version.split(".")[:2]), source="pypi",
                     arch=arch, gpu_codes=(), gpu_archs=(), components=comps, wheels=tuple(names))
    return {"toolkit": tk.to_json(), "unpack_seconds": round(time.monotonic() - t0, 1)}


def cached_toolkit_homes(arch: str | None = None, root: Path | None = None) -> list[Path]:
    """The complete PyPI toolkits in the cache for `arch` (default: this machine's)."""
    arch = arch_of(arch) if arch else host_arch()
    folder = (root or cache_dir()) / "toolkits"
    return sorted(p for p in folder.glob(f"*-{arch}*") if cachebudget.read_marker(p) is not None)


def toolkit_dir(cuda: str, arch: str, comps: tuple[str, ...], root: Path | None = None) -> Path:
    name = f"{cuda_line(cuda)}-{arch}" + ("".join(f"+{c}" for c in comps) if comps else "")
    return (root or cache_dir()) / "toolkits" / name


def provision_pypi_toolkit(cuda: str, arch: str = "x86_64", components: Iterable[str] = (), *,
                           allow_download: bool = True, log: Callable[[str], None] | None = None,
                           root: Path | None = None) -> Toolkit:
    """The cached PyPI-wheel toolkit of `cuda` for `arch`, assembling it once (under a lock) when missing.

    The returned Toolkit's prefix stays leased (shared lock) for this process, so the cache
    budget never evicts it mid-build.
    """
    log = log or (lambda _m: None)
    arch = arch_of(arch)
    comps = normalise_components(components)
    _require_pypi_line(cuda)
    home = toolkit_dir(cuda, arch, comps, root)

    def build(entry: Path) -> dict[str, Any]:
        wheels = _cached_toolkit_wheels(cuda, arch, comps, root)
        if wheels is None:
            if not allow_download:
                raise ToolkitUnavailable(
                    f"CUDA {cuda_line(cuda)} {arch} toolkit wheels are not downloaded; run "
                    f"farm.build.provision.download_toolkit_wheels({cuda_line(cuda)!r}, {arch!r}) on the host first")
            wheels = download_toolkit_wheels(cuda, arch, comps, log=log, root=root)
        log(f"toolkit: assembling CUDA {cuda_line(cuda)} {arch} from {len(wheels.files)} wheels into {entry}")
        with cachebudget.downloads_in_use(root):
            return _build_prefix(entry, wheels, arch, comps)

    t0 = time.monotonic()
    lease = cachebudget.acquire(home, build)
    _LEASES.append(lease)
    stub_cached_toolkit(home, arch)
    # The prefix is relocatable: trust where it is now (a container may mount the cache elsewhere).
    tk = replace(Toolkit.from_json(lease.info["toolkit"]), home=home)
    if not tk.gpu_codes and arch == host_arch():
        tk = inspect_toolkit(home, "pypi", arch, comps, wheels=tk.wheels)
    if tk.line != cuda_line(cuda):
        raise ToolkitUnavailable(f"{home} holds CUDA {tk.version}, not {cuda_line(cuda)}")
    log(f"toolkit: CUDA {tk.version} {arch} (pypi) at {home} "
        f"({'built' if lease.built else 'cache hit'} in {time.monotonic() - t0:.1f}s)")
    if lease.built:
        cachebudget.enforce_budget(root, log=log)
    return tk


_LEASES: list[cachebudget.Lease] = []


def installed_toolkit(cuda: str, arch: str, components: Iterable[str] = (),
                      source: str = "auto") -> tuple[Toolkit | None, list[str]]:
    """The installed toolkit provision_toolkit would pick for `source` (None: it takes PyPI's wheels or
    fails), with why each candidate was passed over. The host asks this before the offline steps, so
    it downloads the wheels exactly when the step will need them."""
    if source not in ("auto", "system", "image") or arch_of(arch) != host_arch():
        return None, []
    return find_system_toolkit(cuda_line(cuda), normalise_components(components))


def source_asked(given: str | None = None) -> str | None:
    """The toolkit source asked for: `given`, else FARM_TOOLKIT_SOURCE, checked; None when neither.
    The one place the setting is read: the host's build and the step's provisioning agree on it."""
    source = given or settings.TOOLKIT_SOURCE.get()
    if source is not None and source not in ("auto", "pypi", "system", "image"):
        raise BadInput("environment", settings.TOOLKIT_SOURCE.name, source, "expected auto, pypi, system or image")
    return source


def provision_toolkit(cuda: str, arch: str = "x86_64", components: Iterable[str] = (), *,
                      source: str | None = None, allow_download: bool = True, log: Callable[[str], None] | None = None,
                      root: Path | None = None) -> Toolkit:
    """The toolkit a cell compiles with.

    source: auto (default; FARM_TOOLKIT_SOURCE) = an installed toolkit on the line when this
    machine runs the cell's arch, else NVIDIA's PyPI wheels (13.x); `system`/`image` = installed
    only; `pypi` = wheels only. A 12.x line with no installed toolkit fails with one line.
    """
    source = source_asked(source) or "auto"
    arch = arch_of(arch)
    comps = normalise_components(components)
    line = cuda_line(cuda)
    tk, passed = installed_toolkit(line, arch, comps, source)
    if tk is not None:
        if log:
            log(f"toolkit: CUDA {tk.version} ({tk.source}) at {tk.home}")
        return tk
    if source in ("system", "image"):
        why = "; ".join(passed) or "no /usr/local/cuda* with an nvcc"
        raise ToolkitUnavailable(f"CUDA {line}: no installed toolkit on this line for {arch} ({why})")
    return provision_pypi_toolkit(line, arch, comps, allow_download=allow_download, log=log, root=root)
