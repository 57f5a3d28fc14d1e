"""What a build is asked (design.md §6): one frozen `BuildRequest`, formed once at the edge.

Every caller of `farm.build.cell.build_cell` forms one with `BuildRequest.make`: `farm build`, `farm
run`'s child per cell, `farm ci row` and `farm demo`. The settings a build depends on are read there
and nowhere after, and the tier's rules are applied there, so the build reads one typed value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from farm import settings
from farm.build.provision import source_asked
from farm.errors import BadInput
from farm.floor import setting_floor

TIERS = ("full", "smoke", "flags")
DEFAULT_FLAGS_MINUTES = 10.0


def build_dir(cell_id: str, out: Path | None = None) -> Path:
    """Where a cell's build keeps its logs, state and wheel: `out`, else the project's build/<cell id>."""
    return Path(out or settings.PROJECT_ROOT / "build" / cell_id).resolve()   # steps run in the work dir


@dataclass(frozen=True)
class BuildRequest:
    """What a caller asks of `build_cell`, formed once at the edge (`BuildRequest.make`): the command's
    arguments with the settings read and the tier's rules applied. The build reads only this.

    max_jobs: the jobs the caller admitted (`farm run`), with the reason when it clamped them (recorded,
    never keyed); without it the build admits itself against `mem_budget_gb`, default MemAvailable
    (design.md §11.2). compiler_cache: ccache for the (CUDA, torch) group (farm/build/ccache.py; recorded).
    tier (see TIERS): `smoke` builds one token of the list (`arch`, default the lowest) and is never
    published; `flags` records nvcc's targets for `flags_minutes` and builds no wheel. record: write the
    recipe's build record (recipes/records/<name>.json) at the end, failed or not."""

    cell_id: str
    out: Path                         # the build folder (build_dir)
    wheelhouse: Path
    runner_kind: str | None = None    # None: container when an engine answers, else host
    force: bool = False
    publish: bool = True
    plat: str | None = None
    max_jobs: int | None = None
    max_jobs_reason: str | None = None
    mem_budget_gb: float | None = None
    compiler_cache: bool = True
    tier: str = "full"
    arch: str | None = None
    flags_minutes: float | None = None
    record: bool = False
    toolkit_source: str | None = None   # FARM_TOOLKIT_SOURCE, checked; None: the runner's own (_set_up)

    @classmethod
    def make(cls, cell_id: str, *, runner_kind: str | None = None, out: Path | None = None, force: bool = False,
             publish: bool = True, wheelhouse: Path | None = None, plat: str | None = None,
             max_jobs: int | None = None, max_jobs_reason: str | None = None, compiler_cache: bool = True,
             tier: str = "full", arch: str | None = None, flags_minutes: float | None = None,
             record: bool | None = None, mem_budget_gb: float | None = None) -> BuildRequest:
        """The request, checked: a tier this farm lacks, `arch` without --smoke, a FARM_MANYLINUX_FLOOR that
        is no floor or a FARM_TOOLKIT_SOURCE that is no source is one line before any work. record None: when
        FARM_RECORD=1."""
        if tier not in TIERS:
            raise BadInput("farm build", "tier", tier, f"expected one of {', '.join(TIERS)}")
        if arch is not None and tier != "smoke":
            raise BadInput("farm build", "--arch", arch, "only a --smoke build takes one token of the list")
        setting_floor()   # a FARM_MANYLINUX_FLOOR that is no floor: refused before any work (design.md §7.8)
        return cls(
            cell_id=cell_id, out=build_dir(cell_id, out), wheelhouse=Path(wheelhouse or settings.wheelhouse_dir()),
            runner_kind=runner_kind, force=force, publish=publish and tier == "full", plat=plat, max_jobs=max_jobs,
            max_jobs_reason=max_jobs_reason, mem_budget_gb=mem_budget_gb,
            # a cache hit would skip the very nvcc call the flags tier records
            compiler_cache=compiler_cache and tier != "flags", tier=tier, arch=arch,
            flags_minutes=(DEFAULT_FLAGS_MINUTES if flags_minutes is None else flags_minutes) if tier == "flags"
            else flags_minutes,
            record=settings.RECORD.get() == "1" if record is None else record,
            toolkit_source=source_asked())

    @property
    def flags_stop_after_s(self) -> float | None:
        """When the flags tier stops the compile; None for the other tiers."""
        if self.tier != "flags" or self.flags_minutes is None:
            return None
        return 60.0 * self.flags_minutes
