"""What the steps hand back (design.md §6): one frozen result per step, and the run's state, `<out>/steps.json`.

The spec (farm/build/spec.py) carries everything from the host to the steps; this module carries what
each step found back to the next step and to the host, typed the same way and serialised with the same
`to_plain`/`from_plain`. A step result is read through its fields, never by key: this module alone
knows the JSON form. steps.json keeps the form it always had: an object with one entry per step that
ran (`source`, `env`, ...), `timings` (seconds per step, env and toolkit added up over the phases) and
`failed` (the failing step's one line); a step that has not run has no entry.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from farm.build.source.prepare import SourceResult
from farm.build.spec import from_plain, to_plain
from farm.errors import BadSpec, StepFailed
from farm.policy import frozen

if TYPE_CHECKING:
    from farm.build.environments import TorchEnv
    from farm.build.repair import RepairResult
    from farm.build.toolkit import BuildToolkit

STATE_FILE = "steps.json"


@dataclass(frozen=True)
class EnvStep:
    """The env step: the torch environment the compile uses (its base, and the overlay of build_deps)."""

    base: Mapping[str, Any]              # farm.build.environments.TorchEnv.to_json()
    overlay: Mapping[str, Any] | None    # the same, when build_deps made an overlay
    torch: str
    torch_cuda: str
    torch_arch_list: str | None          # torch's own list, TORCH_CUDA_ARCH_LIST spelling

    @classmethod
    def of(cls, base: TorchEnv, overlay: TorchEnv) -> EnvStep:
        return cls(base=base.to_json(), overlay=overlay.to_json() if overlay is not base else None,
                   torch=base.torch_version, torch_cuda=base.torch_cuda, torch_arch_list=base.torch_arch_list)


@dataclass(frozen=True)
class ToolkitStep:
    """The toolkit step: the nvcc the compile uses (Linux: farm.build.toolkit.Toolkit; Windows: the installed
    one, farm.build.windows.WindowsToolkit, whose paths are Windows paths)."""

    home: str
    version: str
    line: str
    source: str                          # pypi | system | image
    arch: str
    gpu_codes: tuple[str, ...]
    gpu_archs: tuple[str, ...]
    components: tuple[str, ...]
    wheels: tuple[str, ...]              # pypi: the wheel files it was made of
    nvcc: str | None                     # Windows: nvcc.exe, which is not under home/bin by rule

    @classmethod
    def of(cls, toolkit: BuildToolkit) -> ToolkitStep:
        made = toolkit.to_json()
        return cls(home=str(made["home"]), version=made["version"], line=made["line"], source=made["source"],
                   arch=made["arch"], gpu_codes=tuple(made["gpu_codes"]), gpu_archs=tuple(made["gpu_archs"]),
                   components=tuple(made.get("components", ())), wheels=tuple(made.get("wheels", ())),
                   nvcc=str(made["nvcc"]) if made.get("nvcc") else None)

    def record(self) -> dict[str, str]:
        """What the build record says of the toolkit."""
        return {"version": self.version, "source": self.source, "home": self.home, "arch": self.arch}


@dataclass(frozen=True)
class PrebuildStep:
    ran: bool                            # False: the recipe has no pre_build
    exported: Mapping[str, str]          # what the script wrote to $FARM_ENV, for the compile


@dataclass(frozen=True)
class CompileStep:
    wheel: str | None                    # None: the flags tier stopped before a wheel
    flags: Mapping[str, Any] | None      # the flags tier: farm.build.compile.flags_report, plus `stopped`
    env: Mapping[str, str]               # every variable the compile got, but pip's
    compiler_cache: Mapping[str, Any]    # farm.build.ccache.resolve_in_step, plus the stats log's `stats`
    nvcc_pid_namespace: bool             # each nvcc call in a pid namespace of its own (design.md §6.5)
    peak_process_mb: int | None          # the largest single process it waited for (a cicc, usually)
    cpu_s: float | None                  # CPU seconds its processes took (user + system); None on Windows

    @property
    def flags_targets(self) -> tuple[list[str], list[str]]:
        """The flags tier's nvcc targets seen: (SASS, PTX), e.g. (['sm_80', 'sm_90'], ['compute_90'])."""
        flags = self.flags or {}
        return list(flags.get("sass") or []), list(flags.get("ptx") or [])

    @property
    def cache_active(self) -> bool:
        return bool(self.compiler_cache.get("active"))

    @property
    def cache_stats(self) -> Mapping[str, Any]:
        """The compiler cache's counts for this compile ({} without a cache)."""
        stats = self.compiler_cache.get("stats")
        return stats if isinstance(stats, Mapping) else {}


@dataclass(frozen=True)
class LabelStep:
    wheel: str


@dataclass(frozen=True)
class RepairStep:
    wheel: str
    plat_tag: str                        # the platform tag the wheel reached (design.md §7.8)
    repaired: bool
    plat: str | None
    grafted: tuple[str, ...]
    excluded_count: int
    reason: str
    dropped_rpaths: Mapping[str, Any]
    nvidia_requires: tuple[str, ...]

    @classmethod
    def of(cls, result: RepairResult) -> RepairStep:
        return cls(wheel=str(result.wheel), plat_tag=Path(result.wheel).name[:-len(".whl")].split("-")[-1],
                   repaired=result.repaired, plat=result.plat, grafted=result.grafted,
                   excluded_count=len(result.excluded), reason=result.reason,
                   dropped_rpaths=frozen(dict(result.dropped_rpaths)), nvidia_requires=result.nvidia_requires)


@dataclass(frozen=True)
class VerifyStep:
    wheel: str                           # the verified wheel, in <out>/wheel/
    report: str                          # verify.json
    warnings: tuple[str, ...]            # `check: message` of each warning


StepResult = SourceResult | EnvStep | ToolkitStep | PrebuildStep | CompileStep | LabelStep | RepairStep | VerifyStep
_STEPS: dict[str, type] = {"source": SourceResult, "env": EnvStep, "toolkit": ToolkitStep, "prebuild": PrebuildStep,
                           "compile": CompileStep, "label": LabelStep, "repair": RepairStep, "verify": VerifyStep}
_R = TypeVar("_R")


@dataclass(frozen=True)
class StepState:
    """Every step's result so far (None: not run), with the time each took and the failure, if any."""

    source: SourceResult | None = None
    env: EnvStep | None = None
    toolkit: ToolkitStep | None = None
    prebuild: PrebuildStep | None = None
    compile: CompileStep | None = None
    label: LabelStep | None = None
    repair: RepairStep | None = None
    verify: VerifyStep | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)

    def ran(self, phase: str, result: StepResult, seconds: float) -> StepState:
        """This state with `phase`'s result, its time added to what earlier phases of the run took."""
        if not isinstance(result, _STEPS[phase]):   # pragma: no cover - each step method returns its own type
            raise TypeError(f"the {phase} step returned a {type(result).__name__}")
        changed: dict[str, Any] = {phase: result}
        return dataclasses.replace(self, **changed,
                                   timings={**self.timings, phase: round(self.timings.get(phase, 0.0) + seconds, 2)})

    def failing(self, phase: str, error: str) -> StepState:
        return dataclasses.replace(self, failed={**self.failed, phase: error})

    @property
    def source_date_epoch(self) -> int | None:
        """The source's SOURCE_DATE_EPOCH (design.md §6.5), as the source step recorded it."""
        return self.source.source_date_epoch if self.source is not None else None

    def to_plain(self) -> dict[str, Any]:
        """Only the steps that ran, and `failed` only when one failed: the form steps.json always had."""
        return {name: to_plain(value) for name, value in ((f.name, getattr(self, f.name))
                                                          for f in dataclasses.fields(self))
                if value is not None and not (name == "failed" and not value)}

    @classmethod
    def from_plain(cls, data: object, where: str) -> StepState:
        if not isinstance(data, dict):
            raise BadSpec(f"{where}: expected an object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_STEPS) - {"timings", "failed"})
        if unknown:
            raise BadSpec(f"{where}: unknown {', '.join(unknown)}")
        steps = {name: from_plain(kind, data[name], f"{where}.{name}") for name, kind in _STEPS.items()
                 if data.get(name) is not None}
        return cls(**steps, timings=_floats(data.get("timings") or {}, f"{where}.timings"),
                   failed=_lines(data.get("failed") or {}, f"{where}.failed"))

    @classmethod
    def read(cls, out: Path) -> StepState:
        """`<out>/steps.json`; an empty state when no step has written it yet."""
        path = Path(out) / STATE_FILE
        if not path.is_file():
            return cls()
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise BadSpec(f"{path}: not JSON ({exc})") from None
        return cls.from_plain(data, str(path))

    def write(self, out: Path) -> None:
        tmp = Path(out) / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(self.to_plain(), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, Path(out) / STATE_FILE)


def need(result: _R | None, phase: str) -> _R:
    """`result`, which a later step (or the host) reads: a step that has not run is a StepFailed."""
    if result is None:
        raise StepFailed(f"the {phase} step has not run in this build")
    return result


def _floats(data: object, where: str) -> Mapping[str, float]:
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                              for v in data.values()):
        raise BadSpec(f"{where}: expected an object of seconds")
    return {str(k): float(v) for k, v in data.items()}


def _lines(data: object, where: str) -> Mapping[str, str]:
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise BadSpec(f"{where}: expected an object of one-line errors")
    return {str(k): v for k, v in data.items()}
