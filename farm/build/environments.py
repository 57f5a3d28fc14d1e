"""Python environments with the cell's exact torch (design.md §6.2).

Host side (network): `download_environment()` fetches torch==<pin> and its
closure for the TARGET Python and platform into cache_dir()/downloads, from
PyPI when PyPI's default torch of that minor is the cell's CUDA line
(defaults/pypi_torch.yml), else from the PyTorch channel under
FARM_TORCH_INDEX_URL. `download_build_deps()` does the same for a recipe's
build_deps.

Target side (container or host, no network): `base_environment()` makes the
immutable BASE venv per (target, Python, exact torch, CUDA, platform) with
`pip install --no-index` of exactly the downloaded files, checks
torch.__version__ and torch.version.cuda against the cell, records torch's
own arch list (PAM evidence) and marks it complete and read-only; built once
under a lock. `overlay_environment()` adds a recipe's build_deps in a venv
whose site-packages sees the base through a .pth (a `--system-site-packages`
venv made from a venv would see the interpreter's site-packages, not the
base's), with the base's pins as constraints and the resolved pins recorded;
then the cell's build_requires_farm wheels (staged by `farm build` from the
wheelhouse) with --no-deps, so the build and the import check can import them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm import cachebudget, settings
from farm.build.downloads import PYPI_SIMPLE, DownloadSet, Index, download, find_manifest, isolated_pip_env
from farm.errors import BadInput, EnvironmentFailed, IndexUnreachable, TorchMismatch
from farm.process import CompletedProcess, last_useful_lines, run
from farm.settings import cache_dir, defaults_dir, display
from farm.versions import cuda_tag, minor_of, vtuple
from farm.yamlio import load_yaml

if TYPE_CHECKING:
    from farm.recipes.cells import Cell

# Installed next to torch in every base: cpp_extension honours MAX_JOBS only with ninja.
BASE_PACKAGES = ("ninja",)
_PYPI_PLATFORM_KEY = {"linux": "linux_x86_64", "linux_aarch64": "linux_aarch64"}

_PROBE = r"""
import json, sys
import torch
try:
    flags = torch._C._cuda_getArchFlags()
except Exception as exc:  # a CPU build has no such function
    flags = None
print("FARM_PROBE " + json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
      "arch_flags": flags, "python": sys.version.split()[0], "torch_dir": torch.__path__[0]}))
"""


@dataclass(frozen=True)
class EnvRequest:
    """What a cell needs: Python line, exact torch, CUDA line, platform, the target's glibc."""

    python: str            # '3.11'
    torch_pin: str         # '2.13.0'
    cuda: str              # '13.0'
    platform: str = "linux"
    glibc: str = "2.28"    # the build target's glibc (image or host): which manylinux wheels fit

    @classmethod
    def for_cell(cls, cell: Cell, glibc: str = "2.28") -> EnvRequest:
        return cls(python=cell.python, torch_pin=cell.torch_pin, cuda=cell.cuda, platform=cell.platform,
                   glibc=glibc)


@dataclass(frozen=True)
class TorchEnv:
    path: Path
    python: Path                    # path/bin/python
    site_packages: Path
    python_version: str             # '3.11.7'
    torch_version: str              # '2.13.0'
    torch_cuda: str                 # '13.0'
    torch_arch_flags: str | None    # torch._C._cuda_getArchFlags(): 'sm_75 sm_80 ... compute_120'
    key: str
    pins: tuple[str, ...] = ()      # base: every package==version; overlay: the build_deps added
    base: Path | None = None        # overlay: the base it extends
    info: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def torch_arch_list(self) -> str | None:
        """torch's own arch list in TORCH_CUDA_ARCH_LIST spelling, e.g. '7.5 8.0 ... 12.0+PTX'."""
        return arch_flags_to_list(self.torch_arch_flags)

    def bin_dirs(self) -> list[Path]:
        """Where its console scripts are: an overlay's own, then its base's (ninja is installed in the base)."""
        return [Path(self.python).parent] + ([Path(self.base) / Path(self.python).parent.name] if self.base else [])

    def nvidia_include_dirs(self) -> list[Path]:
        """Headers the torch wheels' nvidia-* packages ship (cusparse.h, cublas_v2.h, ... for CUDA 13)."""
        return self._nvidia_dirs("include")

    def nvidia_lib_dirs(self) -> list[Path]:
        return self._nvidia_dirs("lib")

    def site_packages_roots(self) -> list[Path]:
        """This env's site-packages, then its base's (an overlay sees the base's through a .pth)."""
        return [self.site_packages] + ([_site_packages_of(self.base)] if self.base else [])

    def _nvidia_dirs(self, kind: str) -> list[Path]:
        """site-packages/nvidia/*/<kind> of this env, then of its base (an overlay's)."""
        return [p for root in self.site_packages_roots() for p in sorted((root / "nvidia").glob(f"*/{kind}"))
                if p.is_dir()]

    def torch_package_dir(self) -> Path | None:
        """site-packages/torch of this env or its base; None in an env without torch (a torch-free cell's)."""
        return next((root / "torch" for root in self.site_packages_roots() if (root / "torch" / "__init__.py").is_file()),
                    None)

    def torch_lib_dir(self) -> Path:
        for root in self.site_packages_roots():
            if (root / "torch" / "lib").is_dir():
                return root / "torch" / "lib"
        raise EnvironmentFailed(f"no torch/lib under {self.path}")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("path", "python", "site_packages", "base"):
            d[k] = None if d[k] is None else str(d[k])
        d.pop("info")
        d["torch_arch_list"] = self.torch_arch_list
        return d


def arch_flags_to_list(flags: str | None) -> str | None:
    """'sm_75 sm_80 sm_90 compute_90' -> '7.5 8.0 9.0+PTX' (sm_90a -> 9.0a)."""
    if not flags:
        return None
    sass, ptx = [], set()
    for word in re.split(r"[\s;,]+", flags.strip()):
        m = re.fullmatch(r"(sm|compute)_(\d+)([af]?)", word)
        if not m:
            continue
        n, v = int(m.group(2)), m.group(3)
        tok = (n // 10, n % 10, v)
        if m.group(1) == "sm":
            if tok not in sass:
                sass.append(tok)
        else:
            ptx.add(tok)
    toks = sorted(set(sass) | ptx)
    return " ".join(f"{a}.{b}{v}" + ("+PTX" if (a, b, v) in ptx else "") for a, b, v in toks)


def venv_python(env: Path) -> Path:
    """A venv's interpreter: bin/python, or Scripts\\python.exe where the venv was made on Windows."""
    return env / "Scripts" / "python.exe" if os.name == "nt" else env / "bin" / "python"


def _site_packages_of(env: Path) -> Path:
    # lib/python3.X/site-packages, or Lib\site-packages in a venv made on Windows
    found = sorted(env.glob("lib/python3*/site-packages")) or sorted(env.glob("Lib/site-packages"))
    if not found:
        raise EnvironmentFailed(f"{env} has no lib/python3.*/site-packages")
    return found[0]


# ---------------------------------------------------------------- where torch comes from

def torch_index(torch_pin: str, cuda: str, platform: str = "linux") -> Index:
    """PyPI when its default torch of this minor is built for `cuda` on `platform`, else the PyTorch channel."""
    path = defaults_dir() / "pypi_torch.yml"
    data = load_yaml(path) or {}
    if not isinstance(data, dict):
        raise BadInput(display(path), None, None, "expected a mapping of platform to {torch minor: CUDA line}")
    table = data.get(_PYPI_PLATFORM_KEY.get(platform, ""), {}) or {}
    local = torch_pin.split("+", 1)[1] if "+" in torch_pin else None
    if local is None and str(table.get(minor_of(torch_pin.split("+")[0]), "")) == cuda:
        return Index()
    base = settings.TORCH_INDEX_URL.value().rstrip("/")
    return Index(url=f"{base}/{cuda_tag(cuda)}", extra_url=PYPI_SIMPLE)


def _torch_requirement(req: EnvRequest) -> str:
    return f"torch=={req.torch_pin}"


def _download_for_cell(reqs: list[str], req: EnvRequest, index: Index, log: Callable[[str], None] | None,
                       root: Path | None, constraints: list[str] | None = None) -> DownloadSet:
    """download() for the cell's target; a PyTorch index that does not answer (download() asks it once)
    becomes the one line that says why the cell needs it."""
    try:
        return download(reqs, python=req.python, platform=req.platform, glibc=req.glibc,
                        constraints=constraints or (), index=index, log=log, root=root)
    except IndexUnreachable as exc:
        raise EnvironmentFailed(
            f"torch {req.torch_pin} for CUDA {req.cuda} on {req.platform} is not PyPI's default build, so it "
            f"comes from the PyTorch index (FARM_TORCH_INDEX_URL), and {exc}") from None


def download_environment(req: EnvRequest, *, log: Callable[[str], None] | None = None, root: Path | None = None) -> DownloadSet:
    """Host side: torch==<pin> + its closure + BASE_PACKAGES for the target Python/platform (cached)."""
    index = torch_index(req.torch_pin, req.cuda, req.platform)
    reqs = [_torch_requirement(req), *BASE_PACKAGES]
    hit = find_manifest(reqs, python=req.python, platform=req.platform, glibc=req.glibc, index=index, root=root)
    if hit is not None:
        return hit
    return _download_for_cell(reqs, req, index, log, root)


def for_target(requirements: Iterable[str] | None, req: EnvRequest) -> list[str]:
    """The requirements the target takes, sorted, markers decided for it (pip would decide them for the host's
    Python: `numpy==2.2.6; python_version < "3.11"` must download for a 3.10 cell from a 3.11 host)."""
    from packaging.requirements import Requirement

    from farm.platforms import marker_environment

    env = marker_environment(req.platform, req.python)
    kept = []
    for text in requirements or ():
        parsed = Requirement(str(text))
        if parsed.marker is not None:
            if not parsed.marker.evaluate(env):
                continue
            parsed.marker = None
        kept.append(str(parsed))
    return sorted(kept)


def download_build_deps(req: EnvRequest, build_deps: Iterable[str], *, log: Callable[[str], None] | None = None,
                        root: Path | None = None) -> DownloadSet | None:
    """Host side: a recipe's build_deps for the target, with torch held at the pin (None when none)."""
    deps = for_target(build_deps, req)
    if not deps:
        return None
    index = torch_index(req.torch_pin, req.cuda, req.platform)
    cons = [_torch_requirement(req)]
    hit = find_manifest(deps, python=req.python, platform=req.platform, glibc=req.glibc, constraints=cons,
                        index=index, root=root)
    if hit is not None:
        return hit
    return _download_for_cell(deps, req, index, log, root, constraints=cons)


# ---------------------------------------------------------------- target side

def _run(cmd: list[Any], log: Callable[[str], None] | None, what: str, env: dict[str, Any] | None = None,
         timeout: float = 3600) -> CompletedProcess[str]:
    # The step itself may run with the farm on PYTHONPATH (a container's read-only project mount);
    # the torch environment must never see it.
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTHONPATH"}
    proc = run(cmd, env=env, timeout=timeout)
    if log:
        log(f"$ {' '.join(str(c) for c in cmd)}  -> exit {proc.returncode}")
    if proc.returncode != 0:
        # pip says why on stderr ("ERROR: ..."), while its progress ("Processing ...") and resolver
        # chatter ("INFO: pip is looking at multiple versions ...") go to stdout, after it: either would
        # push the reason out of the tail.
        said = proc.stderr if "ERROR" in proc.stderr else proc.stderr + proc.stdout
        tail = last_useful_lines(said, 4, skip=lambda ln: "[notice]" in ln or ln.startswith("INFO: pip is looking"))
        raise EnvironmentFailed(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return proc


def python_version(python_exe: Path | str) -> str:
    proc = run([python_exe, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"])
    if proc.returncode != 0:
        raise EnvironmentFailed(f"{python_exe} does not run: {proc.stderr.strip()[:200]}")
    return proc.stdout.strip()


def probe_torch(python_exe: Path | str) -> dict[str, Any]:
    """Import torch with no GPU visible; return its version, CUDA line and compiled arch flags."""
    env = isolated_pip_env()
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = run([python_exe, "-c", _PROBE], env=env, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("FARM_PROBE "):
            return json.loads(line[len("FARM_PROBE "):])
    tail = last_useful_lines(proc.stderr, 2)
    raise EnvironmentFailed(f"`import torch` failed in {python_exe}: {' | '.join(tail)}")


def check_torch(found_version: str, found_cuda: str | None, torch_pin: str, cuda: str, where: str = "") -> None:
    """The installed torch must be exactly the pin and built for the cell's CUDA line."""
    public, _, local = found_version.partition("+")
    want_public, _, want_local = torch_pin.partition("+")
    ok_version = public == want_public and (local == want_local if want_local else local in ("", cuda_tag(cuda)))
    ok_cuda = found_cuda is not None and ".".join(str(found_cuda).split(".")[:2]) == cuda
    if not (ok_version and ok_cuda):
        at = f" in {where}" if where else ""
        raise TorchMismatch(f"torch mismatch{at}: installed torch {found_version} (CUDA {found_cuda or 'none'}), "
                            f"the cell wants torch {torch_pin} (CUDA {cuda})")


def _freeze(python_exe: Path, path: Path | None = None) -> list[str]:
    cmd = [python_exe, "-m", "pip", "list", "--format=json"]
    if path is not None:
        cmd += ["--path", path]
    proc = _run(cmd, None, "pip list", env=isolated_pip_env())
    return sorted(f"{p['name']}=={p['version']}" for p in json.loads(proc.stdout))


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", text)


# What an environment's folder holds beyond its pins; a change makes new folders (the old ones age out of
# the cache budget). 2: the headers carry one fixed time (stamp_headers).
ENV_FORMAT = 2

# gcc drops a `#pragma once` header whose size, whole-second mtime and bytes equal those of one it already
# included. torch's ATen/ops holds hundreds of identical small headers, and pip stamps every file with the
# second it wrote it: whether two twins share a second depended on the install's timing, so one TU
# preprocessed to different text in two envs of the same torch, and the compiler cache missed between
# sibling cells (fused_ssim's ssim.cu, design.md §6.2, §11.3). One time for every header of every env makes
# that choice the same everywhere.
HEADER_MTIME = 315532800   # 1980-01-01, the earliest time a wheel's zip can carry


def stamp_headers(site_packages: Path) -> int:
    """Give every file under an `include` folder of `site_packages` the mtime HEADER_MTIME; the count.
    Python files are left alone: their .pyc records their mtime and would go stale."""
    count = 0
    folders = sorted(p for p in site_packages.glob("**/include") if p.is_dir() and not p.is_symlink())
    for include in folders:
        if any(outer in include.parents for outer in folders):   # torch/include/torch/csrc/api/include
            continue
        for path in include.rglob("*"):
            if path.is_file() and not path.is_symlink() and path.suffix != ".py":
                os.utime(path, (HEADER_MTIME, HEADER_MTIME))
                count += 1
    return count


def base_key(req: EnvRequest, target: str, python_full: str) -> str:
    return _safe(f"{target}-py{python_full}-torch{req.torch_pin}-{cuda_tag(req.cuda)}-{req.platform}"
                 f"-v{ENV_FORMAT}")


def base_environment(req: EnvRequest, python_exe: Path | str, *, target: str = "host",
                     downloads: DownloadSet | None = None, log: Callable[[str], None] | None = None,
                     root: Path | None = None) -> TorchEnv:
    """The complete, read-only base venv for `req`, built (offline) on first use under a lock.

    target: who runs it ('host', or the image id): part of the key, so a host env is never
    used inside an image or the other way round.
    """
    log = log or (lambda _m: None)
    root = root or cache_dir()
    python_exe = Path(python_exe)
    full = python_version(python_exe)
    if vtuple(full)[:2] != vtuple(req.python)[:2]:
        raise EnvironmentFailed(f"{python_exe} is Python {full}, the cell wants {req.python}")
    key = base_key(req, target, full)
    entry = root / "envs" / key

    def build(path: Path) -> dict[str, Any]:
        dl = downloads or find_manifest([_torch_requirement(req), *BASE_PACKAGES], python=req.python,
                                        platform=req.platform, glibc=req.glibc,
                                        index=torch_index(req.torch_pin, req.cuda, req.platform), root=root)
        if dl is None:
            raise EnvironmentFailed(f"torch {req.torch_pin} for Python {req.python} {req.platform} is not "
                                    f"downloaded; run farm.build.environments.download_environment on the host first")
        t0 = time.monotonic()
        py = venv_python(path)
        # room first, for this install and the others under way: evicting afterwards filled a shared disk
        with cachebudget.room_for(path, cachebudget.unpacked_size(dl.files), root, log=log, keep=dl.files):
            _run([python_exe, "-m", "venv", path], log, f"creating the venv {path}")
            with cachebudget.downloads_in_use(root):
                cachebudget.touch(dl.files)
                _run([py, "-m", "pip", "install", "--isolated", "--no-index", "--no-deps",
                      "--no-warn-script-location", "--disable-pip-version-check", *dl.files], log,
                     f"installing torch {req.torch_pin} into {path}", env=isolated_pip_env())
        stamp_headers(_site_packages_of(path))
        probe = probe_torch(py)
        check_torch(probe["torch"], probe["cuda"], req.torch_pin, req.cuda, where=str(path))
        _run([py, "-m", "pip", "check"], log, f"pip check in {path}", env=isolated_pip_env())
        return {"kind": "base", "request": asdict(req), "target": target, "python_version": full,
                "probe": probe, "pins": _freeze(py), "files": [f.name for f in dl.files],
                "build_seconds": round(time.monotonic() - t0, 1)}

    t0 = time.monotonic()
    lease = cachebudget.acquire(entry, build)
    _LEASES.append(lease)
    info = lease.info
    probe = info["probe"]
    check_torch(probe["torch"], probe["cuda"], req.torch_pin, req.cuda, where=str(entry))
    log(f"environment: base {key} ({'built' if lease.built else 'cache hit'} in {time.monotonic() - t0:.1f}s)")
    if lease.built:
        cachebudget.enforce_budget(root, log=log)
    return TorchEnv(path=entry, python=venv_python(entry), site_packages=_site_packages_of(entry),
                    python_version=full, torch_version=probe["torch"], torch_cuda=probe["cuda"],
                    torch_arch_flags=probe.get("arch_flags"), key=key, pins=tuple(info["pins"]), info=info)


def overlay_environment(base: TorchEnv, build_deps: Iterable[str], *, downloads: DownloadSet | None = None,
                        req: EnvRequest | None = None, farm_wheels: Iterable[tuple[Path, str]] = (),
                        log: Callable[[str], None] | None = None,
                        root: Path | None = None) -> TorchEnv:
    """`base` plus a recipe's build_deps, then its build_requires_farm wheels ((file, sha256) pairs, installed
    with --no-deps: their own requirements are the build env's business), cached per base, deps and wheel
    sha256s; `base` itself when there are neither."""
    deps = for_target(build_deps, req) if req is not None else sorted(str(d) for d in build_deps or ())
    farm_wheels = sorted((Path(f), sha) for f, sha in farm_wheels)
    if not deps and not farm_wheels:
        return base
    log = log or (lambda _m: None)
    root = root or cache_dir()
    # Without farm wheels the digest is the deps' alone, so the overlays already built stay valid.
    keyed = deps if not farm_wheels else {"build_deps": deps, "farm_wheels": sorted(sha for _, sha in farm_wheels),
                                          "nvidia_beside": True}
    digest = hashlib.sha256(json.dumps(keyed).encode()).hexdigest()[:12]
    key = f"{base.key}-deps-{digest}"
    entry = root / "overlays" / key

    def build(path: Path) -> dict[str, Any]:
        dl = downloads
        if dl is None and req is not None and deps:
            dl = find_manifest(deps, python=req.python, platform=req.platform, glibc=req.glibc,
                               constraints=[_torch_requirement(req)],
                               index=torch_index(req.torch_pin, req.cuda, req.platform), root=root)
        if dl is None and deps:
            raise EnvironmentFailed(f"build_deps {deps} are not downloaded; run "
                                    f"farm.build.environments.download_build_deps on the host first")
        _check_farm_wheels(farm_wheels)
        # `venv` run from the base's python makes a venv of the base's interpreter (sys._base_executable)
        _run([base.python, "-m", "venv", "--without-pip", path], log, f"creating the overlay venv {path}")
        site = _site_packages_of(path)
        (site / "_farm_base.pth").write_text(str(base.site_packages) + "\n")
        base_nvidia = Path(base.site_packages) / "nvidia"
        if farm_wheels and base_nvidia.is_dir():
            # NVIDIA's runtime wheels beside the farm wheels, as in a user's one site-packages: a
            # torch-free farm wheel (cumm) finds libcudart through $ORIGIN/../nvidia/... (design.md §6.6)
            (site / "nvidia").symlink_to(base_nvidia, target_is_directory=True)
        if deps and dl is not None:   # dl is None only without deps (checked above)
            with tempfile.TemporaryDirectory(prefix="farm-overlay-") as tmp:
                links = Path(tmp) / "wheels"
                links.mkdir()
                for f in dl.files:                      # only this request's files: no stray versions
                    (links / f.name).symlink_to(f)
                cons = Path(tmp) / "base-pins.txt"
                cons.write_text("\n".join(base.pins) + "\n")
                with cachebudget.downloads_in_use(root):
                    _run([venv_python(path), "-m", "pip", "install", "--isolated", "--no-index",
                          "--find-links", links, "-c", cons, "--no-warn-script-location", *deps], log,
                         f"installing build_deps {deps} into {path}", env=isolated_pip_env())
        if farm_wheels:
            _run([venv_python(path), "-m", "pip", "install", "--isolated", "--no-index", "--no-deps",
                  "--no-warn-script-location", "--disable-pip-version-check", *(f for f, _ in farm_wheels)], log,
                 f"installing the build_requires_farm wheels {[f.name for f, _ in farm_wheels]} into {path}",
                 env=isolated_pip_env())
        stamp_headers(site)
        added = _freeze(venv_python(path), site)
        probe = probe_torch(venv_python(path))
        if probe["torch"] != base.torch_version:
            raise TorchMismatch(f"build_deps {deps} replaced torch {base.torch_version} with {probe['torch']}")
        return {"kind": "overlay", "base": str(base.path), "build_deps": deps, "pins": added,
                "farm_wheels": [{"file": f.name, "sha256": sha} for f, sha in farm_wheels]}

    t0 = time.monotonic()
    lease = cachebudget.acquire(entry, build)
    _LEASES.append(lease)
    log(f"environment: overlay {key} ({'built' if lease.built else 'cache hit'} in {time.monotonic() - t0:.1f}s)")
    return TorchEnv(path=entry, python=venv_python(entry), site_packages=_site_packages_of(entry),
                    python_version=base.python_version, torch_version=base.torch_version,
                    torch_cuda=base.torch_cuda, torch_arch_flags=base.torch_arch_flags, key=key,
                    pins=tuple(lease.info["pins"]), base=base.path, info=lease.info)


def _check_farm_wheels(farm_wheels: list[tuple[Path, str]]) -> None:
    """Each staged wheel must be there with the bytes its manifest entry (and so the build key) names."""
    from farm.wheelhouse.maintain import file_sha256

    for f, sha in farm_wheels:
        try:
            found = file_sha256(f)
        except OSError as exc:
            raise EnvironmentFailed(f"build_requires_farm wheel {f}: {exc.strerror or exc}") from None
        if found != sha:
            raise EnvironmentFailed(f"build_requires_farm wheel {f.name}: sha256 {found[:12]}, "
                                    f"the build key names {sha[:12]}")


_LEASES: list[cachebudget.Lease] = []
