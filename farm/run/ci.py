"""GitHub Actions: rows of cells chunked under GitHub's limits (design.md §11.5), the plan jobs' outputs,
and the hooks the workflows call (the generator itself is farm/run/ciworkflow.py).

A row is one (recipe, CUDA line, torch, platform) of the plan: the cells that differ only by Python.
CI builds a row in ONE job, its Python siblings in sequence, so the first one fills the compiler
cache (ccache group `cu130-torch2.13`, farm/build/ccache.py) and the others start warm
(`farm ci row`, farm/run/cirow.py). The full grid is about a fifth as many rows as cells.

- `plan_<g>` jobs recompute, on the runner, which rows of their chunks have a cell missing from the
  wheelhouse (`farm ci outputs`, the `farm plan --missing` rule) and emit one output per chunk: a
  JSON list of row ids. A plan job carries as many chunks as keep its outputs under GitHub's 1 MB
  per job even when every row is missing.
- one `build_<lane>_<cuda>_<n>` job per (lane, CUDA line, chunk): a matrix of at most 256 row ids.
  A chunk holds one CUDA line, so the lane's set-up steps (toolkit, image) are the same for all its
  rows. `timeout-minutes` is the longest row's sum of its siblings' timeouts plus the set-up, capped
  at GitHub's 360 min on hosted runners; inside that cap `farm ci row` starts a sibling only while
  the time left can hold it and leaves the rest for the next run (the plan job lists the row again).
  Recipes marked `self_hosted` go to a self-hosted label, capped at GitHub's 5 days there.

The chunk layout is fingerprinted (`layout_digest`); a plan job whose checkout plans differently
from the generated workflow fails and asks for `farm ci github` to be rerun.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from farm.build.ccache import group_name
from farm.platforms import lane
from farm.recipes.cells import Cell, row_id
from farm.run.winlane import windows_setup_steps
from farm.versions import cuda_tag, vtuple

if TYPE_CHECKING:
    from farm.recipes.plan import Plan

MAX_JOBS_PER_MATRIX = 256
MAX_OUTPUT_BYTES = 1_000_000
PLAN_OUTPUT_BUDGET = 900_000        # bytes of outputs per plan job (GitHub: 1 MB per job)
LANE_NAMES = {"linux": "x86", "windows": "windows", "linux_aarch64": "arm64"}
IMAGE_ARCH = {"x86": "x86_64", "arm64": "aarch64"}   # the Linux lanes' builder images
RUNS_ON = {"x86": "ubuntu-24.04", "arm64": "ubuntu-24.04-arm", "windows": "windows-2022"}
SELF_HOSTED_LABELS = {"x86": ["self-hosted", "linux", "x64", "farm-huge"],
                      "arm64": ["self-hosted", "linux", "arm64", "farm-huge"],
                      "windows": ["self-hosted", "windows", "x64", "farm-huge"]}
DEFAULT_TIMEOUT_MIN = 120
HOSTED_MAX_TIMEOUT_MIN = 360        # GitHub-hosted jobs stop at 6 h
SELF_HOSTED_MAX_TIMEOUT_MIN = 7200  # and self-hosted ones at 5 days
SETUP_MIN = 20                      # a row job's set-up: engine, image load, Pythons, torch downloads
AFTER_ROW_MIN = 10                  # kept after the row step: upload the staging folder, save the caches


def lane_of(cell: Cell) -> str:
    """GitHub lanes: x86 Linux, arm64 Linux and Windows run on different runners."""
    return LANE_NAMES[cell.platform] if lane(cell.platform) == "aarch64" or cell.platform == "windows" else "x86"


def github_matrix(cells: list[Cell], max_jobs: int = MAX_JOBS_PER_MATRIX) -> dict:
    """{"chunks": [{"lane", "chunk", "cells": [ids]}]}: `farm plan --format github`, one job per cell."""
    chunks = []
    by_lane: dict[str, list[str]] = {}
    for cell in cells:
        by_lane.setdefault(lane_of(cell), []).append(cell.id)
    for lane_name in sorted(by_lane):
        for i, ids in enumerate(_split(by_lane[lane_name], max_jobs)):
            chunks.append({"lane": lane_name, "chunk": i + 1, "cells": ids})
    return {"chunks": chunks}


def _split(ids: list[str], max_jobs: int) -> list[list[str]]:
    size = max_jobs
    # a chunk's JSON must stay far below the 1 MB output limit as well
    while size > 1 and len(json.dumps(ids[:size])) > MAX_OUTPUT_BYTES // 4:
        size //= 2
    return [ids[i:i + size] for i in range(0, len(ids), size)]


# ---------------------------------------------------------------- rows

@dataclass(frozen=True)
class Row:
    id: str
    recipe: str
    cuda: str
    platform: str
    cells: tuple[Cell, ...]     # the Python siblings, lowest Python first: the one that fills the cache

    @property
    def cache_group(self) -> str:
        """The compiler cache group its siblings share (farm/build/ccache.py)."""
        first = self.cells[0]
        return group_name(first.cuda, first.torch, first.links_torch)


def rows_of(cells: list[Cell]) -> list[Row]:
    """The rows of `cells`, in the order their first cell comes."""
    by_id: dict[str, list[Cell]] = {}
    for cell in cells:
        by_id.setdefault(row_id(cell), []).append(cell)
    return [Row(rid, group[0].recipe_name, group[0].cuda, group[0].platform,
                tuple(sorted(group, key=lambda c: vtuple(c.python))))
            for rid, group in by_id.items()]


def row_minutes(plan: Plan, row: Row) -> int:
    """What a row job may need: its siblings' timeouts (the recipe's, else the default) and the set-up."""
    each = plan.recipes[row.recipe].timeout or DEFAULT_TIMEOUT_MIN
    return int(each * len(row.cells)) + SETUP_MIN + AFTER_ROW_MIN


# ---------------------------------------------------------------- chunks with runners and timeouts

@dataclass(frozen=True)
class Chunk:
    lane: str            # x86 | arm64 | windows, with -selfhosted for huge recipes
    cuda: str            # the CUDA line of every row in it
    index: int           # 1-based within (lane, CUDA line)
    rows: tuple[str, ...]
    timeout_minutes: int
    runs_on: str | list[str]   # a label, or a list of self-hosted labels

    @property
    def base_lane(self) -> str:
        return self.lane.removesuffix("-selfhosted")

    @property
    def name(self) -> str:
        """Output and job-name part: x86_cu130_1, arm64_selfhosted_cu128_2."""
        return f"{self.lane.replace('-', '_')}_{cuda_tag(self.cuda)}_{self.index}"


def ci_cells(plan: Plan, cells: list[Cell]) -> tuple[list[Cell], dict[str, list[str]]]:
    """The cells CI builds: all selected ones except recipes that need a patch nobody wrote (not buildable
    anywhere yet). Returns (cells, {recipe: ids left out})."""
    keep: list[Cell] = []
    left: dict[str, list[str]] = {}
    for cell in cells:
        if plan.recipes[cell.recipe_name].needs_patch:
            left.setdefault(cell.recipe_name, []).append(cell.id)
        else:
            keep.append(cell)
    return keep, left


def chunks_for(plan: Plan, cells: list[Cell], max_jobs: int = MAX_JOBS_PER_MATRIX) -> list[Chunk]:
    """Rows grouped by (lane, self-hosted, CUDA line), at most `max_jobs` rows per chunk."""
    groups: dict[tuple[str, bool, tuple[int, ...]], list[Row]] = {}
    for row in rows_of(cells):
        recipe = plan.recipes[row.recipe]
        groups.setdefault((lane_of(row.cells[0]), bool(recipe.self_hosted), vtuple(row.cuda)), []).append(row)
    out = []
    for base, self_hosted, _ in sorted(groups):
        group = groups[(base, self_hosted, _)]
        lane_key = base + ("-selfhosted" if self_hosted else "")
        minutes_of = {r.id: row_minutes(plan, r) for r in group}
        for i, ids in enumerate(_split([r.id for r in group], max_jobs)):
            minutes = min(max(minutes_of[x] for x in ids),
                          SELF_HOSTED_MAX_TIMEOUT_MIN if self_hosted else HOSTED_MAX_TIMEOUT_MIN)
            out.append(Chunk(lane_key, group[0].cuda, i + 1, tuple(ids), minutes,
                             list(SELF_HOSTED_LABELS[base]) if self_hosted else RUNS_ON[base]))
    return out


def layout_digest(chunks: list[Chunk]) -> str:
    h = hashlib.sha256()
    for ch in chunks:
        h.update(f"{ch.name}:{ch.timeout_minutes}:{','.join(ch.rows)}\n".encode())
    return h.hexdigest()[:16]


def output_line(name: str, ids: list[str]) -> str:
    return f"{name}={json.dumps(ids, separators=(',', ':'))}"


def plan_groups(chunks: list[Chunk], budget: int = PLAN_OUTPUT_BUDGET) -> list[list[Chunk]]:
    """Chunks per plan job, so that a plan job's outputs (every row missing) stay under the budget."""
    groups: list[list[Chunk]] = []
    size = budget + 1
    for ch in chunks:
        need = len(output_line(ch.name, list(ch.rows))) + 1
        if size + need > budget:
            groups.append([])
            size = 0
        groups[-1].append(ch)
        size += need
    return groups


def ci_layout(plan: Plan, cells: list[Cell]) -> tuple[list[Chunk], dict[str, list[str]]]:
    """(chunks, left out) of the selected cells: what `farm ci github` writes and a plan job checks."""
    keep, left = ci_cells(plan, cells)
    return chunks_for(plan, keep), left


def missing_outputs(plan: Plan, cells: list[Cell], group: int, layout: str, wheelhouse) -> list[str]:
    """The `name=[row ids]` output lines of plan job `group`: per chunk, its rows with a cell not yet in the
    wheelhouse."""
    from farm.errors import BadInput
    from farm.run.selection import missing_cells

    keep, _ = ci_cells(plan, cells)
    chunks = chunks_for(plan, keep)
    if layout_digest(chunks) != layout:
        raise BadInput("farm ci outputs", "--layout", layout,
                       f"this checkout plans chunks {layout_digest(chunks)}: the workflows are stale, "
                       "rerun `farm ci github`")
    groups = plan_groups(chunks)
    if not 1 <= group <= len(groups):
        raise BadInput("farm ci outputs", "--group", group, f"expected 1..{len(groups)}")
    rows = {r.id: r for r in rows_of(keep)}
    wanted = [c for ch in groups[group - 1] for rid in ch.rows for c in rows[rid].cells]
    missing = {row_id(c) for c in missing_cells(plan, wanted, wheelhouse)}   # keyed as `farm build` here keys them
    return [output_line(ch.name, [r for r in ch.rows if r in missing]) for ch in groups[group - 1]]


# ---------------------------------------------------------------- lane hooks

def windows_lane_steps(cuda: str) -> list[dict]:
    """The GitHub steps that prepare a Windows runner for CUDA line `cuda` (toolkit, MSVC): the Windows
    lane's own (farm/run/winlane.py). A chunk holds one CUDA line, so its job needs no per-row guard."""
    return windows_setup_steps(cuda)
