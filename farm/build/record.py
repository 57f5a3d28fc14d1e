"""The build record (design.md §4.5), assembled here and nowhere else.

One build leaves up to four forms of the one record (`farm.recipes.buildrecord.BuildRecord`, whose
schema checks each): the common part the spec carries to the steps (`RecordFacts.common`), the wheel's
own `.dist-info/farm_build.json` (`in_wheel`), the build's `build/<cell>/build.json` (`built`, or `flags`
for a flags run), and with --record the recipe's record under recipes/records/ (`for_recipe`), written
for a failed build too. Each is made from
`RecordFacts`, what the host decided before the steps ran, and the steps' `StepState`.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm import __version__, settings
from farm.build.spec import StepSpec, to_plain
from farm.build.state import StepState, need
from farm.errors import FarmError, shorten
from farm.floor import Floor
from farm.recipes.buildrecord import BuildRecord
from farm.recipes.cells import Cell
from farm.recipes.status import record_date


@dataclass(frozen=True)
class RecordFacts:
    """What the host decided for one build that its record tells."""

    cell: Cell
    key: str
    runner: str                          # the runner's kind
    image: str                           # the target's id: the builder image, or `host`
    tier: str
    nvcc_threads: int
    farm_wheels: tuple[Mapping[str, Any], ...]   # the build_requires_farm wheels it was built against
    started: float                       # time.time() when `farm build` began
    floor: Floor | None = None           # known once the torch wheel is downloaded (design.md §7.8)

    def common(self) -> dict[str, Any]:
        """The part every form shares, and the spec carries into the wheel's own farm_build.json."""
        cell = self.cell
        part: dict[str, Any] = {
            "cell": cell.id, "build_key": self.key, "arch_list": cell.arch.arch_list.torch(),
            "arch_provenance": cell.arch.provenance, "torch": cell.torch_pin, "cuda": cell.cuda,
            "runner": self.runner, "image": self.image, "farm_version": __version__, "tier": self.tier,
            "nvcc_threads": self.nvcc_threads}
        if self.farm_wheels:   # keyed by their sha256; recorded so a dependent's wheel says what it was built against
            part["build_requires_farm"] = [dict(w) for w in self.farm_wheels]
        if self.floor is not None:
            part["floor"] = self.floor.record()
        return part

    def built(self, state: StepState, *, wheel: Path, build_number: int | None, described: Mapping[str, Any],
              network: str, log_path: Path, jobs: int, recipe_jobs: int, max_jobs_reason: str | None,
              cache_decision: Mapping[str, Any]) -> BuildRecord:
        """The record of a build that made and verified `wheel`."""
        verified, repair, compiled = need(state.verify, "verify"), need(state.repair, "repair"), \
            need(state.compile, "compile")
        return BuildRecord({
            **self.common(), "wheel": wheel.name, "build_number": build_number,
            "torch_measured_arch_list": need(state.env, "env").torch_arch_list,
            "toolkit": need(state.toolkit, "toolkit").record(),
            # `tag`: the platform tag reached, as every record names it (§7.8); `image_tag`, its older name, stays
            "tag": repair.plat_tag, "image_tag": repair.plat_tag,
            "runner_info": dict(described),
            "network": network, "steps": dict(state.timings),
            "source": state.source.record() if state.source else None, "grafted": list(repair.grafted),
            "verify_warnings": list(verified.warnings), "log": str(log_path),
            "dev_only": network == "open",
            "seconds": round(time.time() - self.started, 1),
            "max_jobs": jobs, "max_jobs_recipe": recipe_jobs,
            "max_jobs_clamp": max_jobs_reason,
            "compiler_cache": {**cache_decision, **to_plain(compiled.compiler_cache)},
            "peak_process_mb": compiled.peak_process_mb, "compile_cpu_s": compiled.cpu_s,
        })

    def flags(self, state: StepState, log_path: Path) -> BuildRecord:
        """A flags run's record: no wheel, the nvcc targets seen against the cell's list."""
        compiled = need(state.compile, "compile")
        return BuildRecord({
            **self.common(), "wheel": None, "flags": to_plain(need(compiled.flags, "compile (of the flags tier)")),
            "steps": dict(state.timings), "source": state.source.record() if state.source else None,
            "seconds": round(time.time() - self.started, 1), "peak_process_mb": compiled.peak_process_mb,
            "log": str(log_path)})


def in_wheel(common: Mapping[str, Any], state: StepState, folders: list[tuple[str, str]]) -> BuildRecord:
    """The record the label step writes into the wheel (`.dist-info/farm_build.json`, which `farm index
    recover` reads back): the common part, the steps' findings so far. It names no folder of the build
    host (design.md §6.5): the work dir is left out (the source step ran on the host, so it is the host's
    path even when the steps run in a container, and it says nothing to whoever installs the wheel), any
    other path made symbolic by `folders` (farm.build.hostpaths)."""
    from farm.build.hostpaths import portable
    from farm.wheelhouse.names import BUILD_INFO_NAME

    source = {k: v for k, v in state.source.record().items() if k != "work_dir"} if state.source else {}
    return BuildRecord(portable({**common, "torch_arch_list": state.env.torch_arch_list if state.env else None,
                                 "toolkit": state.toolkit.version if state.toolkit else None,
                                 "source": source or None}, folders), BUILD_INFO_NAME)


def for_recipe(recipe_name: str, cell: Cell, *, tier: str, tier_asked: str, out: Path, key: str, runner: str,
               started: float, build: BuildRecord | None = None, reason: str | None = None) -> BuildRecord:
    """The recipe's record of one build of `cell`, from its output folder (steps.json, verify.json) and the
    build's own record, when it made one."""
    from farm.recipes.buildoutput import arches_found, by_arch, first_error

    state = StepState.read(out)
    source = state.source.record() if state.source else {}
    work_src = state.source.work_dir if state.source else settings.work_dir(cell.id) / "src"
    report = _read_json(out / "verify.json")
    union = arches_found(report)
    wheel = build.wheel if build is not None else None
    wheel_path = out / "wheel" / wheel if wheel else None
    record: dict[str, Any] = {
        "recipe": recipe_name, "cell": cell.id, "tier": tier, "date": record_date(),
        # no description: a path source's names this machine's folder
        "source": {k: source.get(k) for k in ("kind", "commit", "sha256", "pin") if source.get(k)},
        "patches": [{"file": f, "sha256": h} for f, h in source.get("patches") or []],
        "arch_list": cell.arch.arch_list.torch(), "wall_s": round(time.time() - started, 1),
        "steps": dict(state.timings), "peak_mb": state.compile.peak_process_mb if state.compile else None,
        "compile_cpu_s": state.compile.cpu_s if state.compile else None, "runner": runner, "build_key": key, "farm_version": __version__,
    }
    # what the wall time was bought with: an estimate turns it into CPU-hours (design.md §5.5)
    runner_info = build.runner_info if build is not None else {}
    limits = runner_info.get("limits") or {}
    if layer := {k: v for k, v in runner_info.items() if k in ("layer_of", "system_packages")}:
        record["image_layer"] = {"ref": runner_info.get("image_ref"), **layer}   # design.md §8.5
    record["cores"] = max(1, int(limits.get("cpus") or os.cpu_count() or 1))
    if build is not None:   # a smoke build trades threads for jobs (farm.build.cell.smoke_parallelism)
        record.update({k: v for k, v in (("max_jobs", build.max_jobs), ("nvcc_threads", build.nvcc_threads)) if v})
    if tier_asked == "smoke" or tier == "smoke":
        record["smoke_of"] = cell.arch.provenance
    if report:
        record["gate"] = "pass" if report.get("passed") else "fail: " + ", ".join(report.get("failed") or [])
        record["gate_warnings"] = report.get("warned") or []
        record["sass"], record["ptx"] = by_arch(union["sass"]), by_arch(union["ptx"])
    stats = state.compile.cache_stats if state.compile else {}
    # a warm cache makes wall time and peak memory a rebuild's, not a compile's: say so
    record["compiler_cache"] = {"active": bool(state.compile and state.compile.cache_active),
                                "hits": stats.get("hits"), "misses": stats.get("misses")}
    if state.compile and state.compile.flags:
        record["flags"] = to_plain(state.compile.flags)
        record["sass"], record["ptx"] = state.compile.flags_targets
    if wheel_path is not None and wheel_path.is_file():
        record["wheel"], record["wheel_bytes"] = wheel, wheel_path.stat().st_size
    # the tag reached (a wheel the gate failed has one too) and the floor it was held to (design.md §7.8)
    if tag := (build.tag if build is not None else None) or (state.repair.plat_tag if state.repair else None):
        record["tag"] = tag
    if floor := (build.floor if build is not None else None) or _spec_floor(out):
        record["floor"] = dict(floor)
    if tier == "failed":
        record["tier_asked"] = tier_asked
        line = first_error(out / "compile.log") if "compile" in state.failed else None
        line = line or re.sub(r"\s*\(log: [^)]*\)$", "", reason or "")
        record["reason"] = shorten(_portable(line, work_src, out, settings.PROJECT_ROOT))
    return BuildRecord(record)


def asked_arch_list(out: Path) -> str | None:
    """The arch list a build was asked for, from its host spec (None before the spec was written)."""
    try:
        return StepSpec.read(out / "spec-host.json").cell.arch.arch_list.torch()
    except (OSError, FarmError):
        return None


def _spec_floor(out: Path) -> Mapping[str, Any] | None:
    """The floor a build that failed was held to, as its host spec names it (None: not known yet)."""
    try:
        floor = StepSpec.read(out / "spec-host.json").floor
    except (OSError, FarmError):
        return None
    return floor.record() if floor else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _portable(text: str, *prefixes: Path) -> str:
    """A line fit for a committed file: the machine's folders cut off (work dir, project, home)."""
    for prefix in prefixes:
        text = text.replace(str(prefix).rstrip("/") + "/", "")
    return text.replace(str(Path.home()), "~")
