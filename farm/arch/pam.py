"""`farm pam measure`: torch's own arch list, read out of its libtorch_cuda*.so fatbins (design.md §3.8).

The result is written into `defaults/pam_measured.yml` (committed, like the
other facts the farm derives from upstream). `farm.policy.load_defaults()`
applies it over `defaults/torch_arch_matrix.yml`: a measured combo overrides the
table, so coverage verdicts follow what torch really ships.

Torch's list is what it compiled its kernels for: an arch counts when its SASS
(or PTX) is in at least half of the fatbin containers of libtorch_cuda*.so.
Archs that only a few kernels carry (sm_90a, sm_100a, ... for hand-tuned
kernels) are recorded as `partial`, not as part of the list: a device is not
served by torch because one of its kernels runs there.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from farm import settings
from farm.arch.fatbin import FatbinReport, read_fatbin
from farm.archlist import ArchList, ArchToken
from farm.cachebudget import flocked
from farm.errors import BadInput, FarmError
from farm.platforms import from_wheel_platform_tag
from farm.policy import PAM_MEASURED_FILE
from farm.versions import minor_of
from farm.yamlio import load_yaml, write_atomic

_LIB = re.compile(r"(?:lib)?torch_cuda[\w.-]*\.(?:so|dll)")   # fullmatch
_MACHINE_PLATFORM = {"EM_X86_64": "linux", "EM_AARCH64": "linux_aarch64", "PE:0x8664": "windows"}
_LANE_KEY = {"linux": "x86", "linux_aarch64": "aarch64"}
SHARE = 0.5   # an arch is torch's when at least this share of the containers carries it


@dataclass(frozen=True)
class Measurement:
    torch_version: str          # 2.13.0+cu130
    cuda: str                   # 13.0
    platform: str               # linux | linux_aarch64 | windows
    arch_list: ArchList
    partial: tuple[str, ...]    # archs only some kernels carry
    source: str                 # the wheel's file name, or the environment's path
    libraries: dict = field(default_factory=dict)   # library -> {containers, entries}

    @property
    def torch_minor(self) -> str:
        return minor_of(self.torch_version.split("+")[0])

    def as_dict(self) -> dict:
        return {"torch": self.torch_version, "cuda": self.cuda, "platform": self.platform,
                "arch_list": self.arch_list.torch(), "partial": list(self.partial), "source": self.source,
                "libraries": self.libraries}


def torch_arch_list(reports: list[FatbinReport]) -> tuple[ArchList, tuple[str, ...]]:
    """(torch's list, partial archs) from the fatbins of its CUDA libraries."""
    containers = sum(r.containers for r in reports)
    if not containers:
        raise FarmError("no CUDA fatbin in torch's libraries: not a CUDA build?")
    seen: Counter = Counter()
    for r in reports:
        per_container = {(e.container, e.kind, e.sm, e.variant) for e in r.entries if e.kind in ("SASS", "PTX")}
        seen.update((kind, sm, variant) for _, kind, sm, variant in per_container)
    main = {k for k, n in seen.items() if n >= SHARE * containers}
    sass = {(sm, v) for kind, sm, v in main if kind == "SASS"}
    ptx = {sm for kind, sm, v in main if kind == "PTX" and v == ""}
    tokens = [ArchToken(sm // 10, sm % 10, v, ptx=(v == "" and sm in ptx)) for sm, v in sass]
    # PTX without SASS of the same arch cannot be spelt as a token; keep it visible as partial.
    rest = {k for k in seen if k not in main} | {("PTX", sm, "") for sm in ptx if (sm, "") not in sass}
    partial = [_text(*k) for k in sorted(rest, key=lambda k: (k[1], k[2], k[0]))]
    if not tokens:
        raise FarmError("torch's fatbins carry no arch in most of their containers")
    return ArchList.of(tokens), tuple(partial)


def _text(kind: str, sm: int, variant: str) -> str:
    return f"{sm // 10}.{sm % 10}{variant}{'+PTX' if kind == 'PTX' else ''}"


def _version_py(text: str, where: str) -> tuple[str, str | None]:
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*(?:['\"]([^'\"]+)['\"]|None)", text, re.M)
    if not version:
        raise BadInput(where, "__version__", None, "no torch version in torch/version.py")
    return version.group(1), (cuda.group(1) if cuda else None)


def extract_torch_libs(wheel: Path, root: Path | None = None) -> Path:
    """torch/version.py and torch/lib/*torch_cuda* of a torch wheel, extracted once into the cache.

    Returns the folder that holds `torch/` (shaped like a partial site-packages).
    """
    wheel = Path(wheel)
    dest = (root or settings.cache_dir() / "torch-libs") / wheel.name.removesuffix(".whl")
    if (dest / ".complete").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with flocked(dest.parent / f".{dest.name}.lock"):
        if (dest / ".complete").exists():
            return dest
        try:
            zf = zipfile.ZipFile(wheel)
        except (zipfile.BadZipFile, OSError) as exc:
            raise BadInput(settings.display(wheel), None, None, f"not a readable wheel: {exc}") from None
        with zf:
            members = [m for m in zf.namelist() if m == "torch/version.py"
                       or (m.startswith("torch/lib/") and _LIB.fullmatch(m.rsplit("/", 1)[-1]))]
            if "torch/version.py" not in members:
                raise BadInput(settings.display(wheel), None, None, "not a torch wheel (no torch/version.py)")
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
            try:
                for m in members:
                    out = tmp / m
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(m) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 22)
                (tmp / ".complete").write_text(wheel.name + "\n")
                if dest.exists():
                    shutil.rmtree(dest)
                os.replace(tmp, dest)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    return dest


def _torch_dir(source: Path) -> Path:
    """The torch package folder of an environment (venv, prefix, site-packages or torch/ itself)."""
    candidates = [source, source / "torch"]
    candidates += sorted(source.glob("lib/python3*/site-packages/torch"))
    candidates += sorted(source.glob("Lib/site-packages/torch"))
    for c in candidates:
        if (c / "version.py").is_file() and (c / "lib").is_dir():
            return c
    raise BadInput(settings.display(source), None, None,
                   "neither a torch wheel nor an environment with torch (looked for torch/version.py and torch/lib)")


def measure(source: Path | str) -> Measurement:
    """Read torch's arch list out of a torch wheel or an environment holding torch."""
    source = Path(source)
    if not source.exists():
        raise BadInput("command line", "TORCH_WHEEL_OR_ENV", str(source), "no such file or folder")
    platform = None
    if source.is_file():
        tag = source.name.removesuffix(".whl").rsplit("-", 1)[-1]
        platform = from_wheel_platform_tag(tag.split(".")[0])
        torch_dir = extract_torch_libs(source) / "torch"
        label = source.name
    else:
        torch_dir = _torch_dir(source)
        label = str(source)
    where = f"{label}: torch/version.py"
    version, cuda = _version_py((torch_dir / "version.py").read_text(), where)
    if not cuda:
        raise BadInput(where, "cuda", None, f"torch {version} is not a CUDA build: nothing to measure")
    libs = sorted(p for p in (torch_dir / "lib").iterdir() if _LIB.fullmatch(p.name))
    if not libs:
        raise BadInput(settings.display(torch_dir / "lib"), None, None, f"torch {version} has no libtorch_cuda*")
    reports = [read_fatbin(p) for p in libs]
    if platform is None:
        platform = _MACHINE_PLATFORM.get(reports[0].machine)
        if platform is None:
            raise FarmError(f"{libs[0]}: unknown machine {reports[0].machine}")
    arch_list, partial = torch_arch_list(reports)
    return Measurement(version, cuda, platform, arch_list, partial, label,
                       {r.path.rsplit("/", 1)[-1]: {"containers": r.containers, "entries": len(r.entries)}
                        for r in reports})


HEADER = """\
# Written by `farm pam measure` (do not edit by hand): torch's own arch lists, read from the
# fatbins of its libtorch_cuda*.so. Each combo here overrides defaults/torch_arch_matrix.yml
# (design.md §3.8); `measured` says where each came from. Windows rows are per CUDA line, as in the table.
"""


def write_measurement(m: Measurement, path: Path | None = None) -> Path:
    """Merge one measurement into the measured file (atomically); returns its path."""
    path = Path(path or settings.defaults_dir() / PAM_MEASURED_FILE)
    loaded = load_yaml(path) if path.exists() else {}
    data = dict(cast("dict[str, Any]", loaded or {}))   # the file is this function's own: a mapping
    for key in ("x86", "aarch64", "windows"):
        data[key] = dict(data.get(key) or {})
    if m.platform == "windows":
        data["windows"][m.cuda] = m.arch_list.torch().replace(" ", ";")
    else:
        lane = data[_LANE_KEY[m.platform]]
        lane[m.torch_minor] = {**dict(lane.get(m.torch_minor) or {}), m.cuda: m.arch_list.torch().replace(" ", ";")}
    records = [r for r in (data.get("measured") or [])
               if not (isinstance(r, dict) and r.get("platform") == m.platform and r.get("cuda") == m.cuda
                       and minor_of(str(r.get("torch", "")).split("+")[0]) == m.torch_minor)]
    records.append(m.as_dict())
    data["measured"] = sorted(records, key=lambda r: (str(r.get("platform")), str(r.get("torch")), str(r.get("cuda"))))
    body = yaml.safe_dump({k: data[k] for k in ("x86", "aarch64", "windows", "measured")}, sort_keys=True,
                          default_flow_style=False, width=110)
    write_atomic(path, HEADER + body)
    return path
