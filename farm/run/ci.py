"""GitHub Actions: matrices of cell ids chunked under GitHub's limits (design.md §5.3), and the workflows
`farm ci github` writes (issue 8: scale-out on an existing engine).

`farm-build.yml`:
- `plan_<g>` jobs recompute, on the runner, which cells of their chunks are missing from the
  wheelhouse (`farm ci outputs`, the `farm plan --missing` rule) and emit one output per chunk: a
  JSON list of cell ids. A plan job carries as many chunks as keep its outputs under GitHub's
  1 MB per job even when every cell is missing.
- one `build_<lane>_<n>` job per (lane, chunk): a matrix of at most 256 cell ids, `timeout-minutes`
  from the chunk's recipes, x86 / arm64 / Windows runners per lane, and a self-hosted label for
  recipes marked `self_hosted` (huge builds, design.md §11.5). Each matrix job runs exactly
  `farm build <cell>` and then `farm publish` into its host's staging folder, uploaded as an artifact.
- one `index` job merges every staging folder into the wheelhouse (`farm index merge`) under a
  `concurrency` group, so two runs never write the index at once.

`farm-matrix-refresh.yml`: on a schedule, `farm matrix scrape` + `derive`, regenerate these
workflows, and open a pull request when the grid (or the workflows) changed.

The chunk layout is fingerprinted (`layout_digest`); a plan job whose checkout plans differently
from the generated workflow fails and asks for `farm ci github` to be rerun.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from farm.platforms import lane
from farm.recipes.cells import Cell
from farm.run.winlane import windows_job_steps

if TYPE_CHECKING:
    from farm.recipes.plan import Plan

MAX_JOBS_PER_MATRIX = 256
MAX_OUTPUT_BYTES = 1_000_000
PLAN_OUTPUT_BUDGET = 900_000        # bytes of outputs per plan job (GitHub: 1 MB per job)
LANE_NAMES = {"linux": "x86", "windows": "windows", "linux_aarch64": "arm64"}
RUNS_ON = {"x86": "ubuntu-24.04", "arm64": "ubuntu-24.04-arm", "windows": "windows-2022"}
SELF_HOSTED_LABELS = {"x86": ["self-hosted", "linux", "x64", "farm-huge"],
                      "arm64": ["self-hosted", "linux", "arm64", "farm-huge"],
                      "windows": ["self-hosted", "windows", "x64", "farm-huge"]}
DEFAULT_TIMEOUT_MIN = 120
HOSTED_MAX_TIMEOUT_MIN = 360        # GitHub-hosted jobs stop at 6 h
PYTHON = "3.12"
BUILD_WORKFLOW = "farm-build.yml"
REFRESH_WORKFLOW = "farm-matrix-refresh.yml"
CONCURRENCY_GROUP = "farm-wheelhouse"


def lane_of(cell: Cell) -> str:
    """GitHub lanes: x86 Linux, arm64 Linux and Windows run on different runners."""
    return LANE_NAMES[cell.platform] if lane(cell.platform) == "aarch64" or cell.platform == "windows" else "x86"


def github_matrix(cells: list[Cell], max_jobs: int = MAX_JOBS_PER_MATRIX) -> dict:
    """{"chunks": [{"lane", "chunk", "cells": [ids]}]}: one workflow job per (lane, chunk)."""
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


# ---------------------------------------------------------------- chunks with runners and timeouts

@dataclass(frozen=True)
class Chunk:
    lane: str            # x86 | arm64 | windows, with -selfhosted for huge recipes
    index: int           # 1-based within the lane
    cells: tuple[str, ...]
    timeout_minutes: int
    runs_on: str | list[str]   # a label, or a list of self-hosted labels

    @property
    def name(self) -> str:
        """Output and job-name part: x86_1, arm64_selfhosted_2."""
        return f"{self.lane.replace('-', '_')}_{self.index}"


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
    by_lane: dict[tuple[str, bool], list[Cell]] = {}
    for cell in cells:
        recipe = plan.recipes[cell.recipe_name]
        by_lane.setdefault((lane_of(cell), bool(recipe.self_hosted)), []).append(cell)
    out = []
    for base, self_hosted in sorted(by_lane):
        hosted = not self_hosted
        lane_key = base + ("-selfhosted" if self_hosted else "")
        group = by_lane[(base, self_hosted)]
        timeout_of = {c.id: plan.recipes[c.recipe_name].timeout or DEFAULT_TIMEOUT_MIN for c in group}
        for i, ids in enumerate(_split([c.id for c in group], max_jobs)):
            minutes = max(timeout_of[x] for x in ids)
            if hosted:
                minutes = min(minutes, HOSTED_MAX_TIMEOUT_MIN)
            out.append(Chunk(lane_key, i + 1, tuple(ids), minutes,
                             RUNS_ON[base] if hosted else list(SELF_HOSTED_LABELS[base])))
    return out


def layout_digest(chunks: list[Chunk]) -> str:
    h = hashlib.sha256()
    for ch in chunks:
        h.update(f"{ch.name}:{','.join(ch.cells)}\n".encode())
    return h.hexdigest()[:16]


def output_line(name: str, ids: list[str]) -> str:
    return f"{name}={json.dumps(ids, separators=(',', ':'))}"


def plan_groups(chunks: list[Chunk], budget: int = PLAN_OUTPUT_BUDGET) -> list[list[Chunk]]:
    """Chunks per plan job, so that a plan job's outputs (every cell missing) stay under the budget."""
    groups: list[list[Chunk]] = []
    size = budget + 1
    for ch in chunks:
        need = len(output_line(ch.name, list(ch.cells))) + 1
        if size + need > budget:
            groups.append([])
            size = 0
        groups[-1].append(ch)
        size += need
    return groups


# ---------------------------------------------------------------- workflows

def _setup_steps() -> list[dict]:
    return [
        {"uses": "actions/checkout@v5"},
        {"uses": "actions/setup-python@v6", "with": {"python-version": PYTHON}},
        {"name": "Install the farm", "run": "python -m pip install -e ."},
    ]


def _filter_args(filters, shard) -> list[str]:
    args = []
    for name in ("package", "cuda", "torch", "python", "platform"):
        for value in getattr(filters, name):
            args += [f"--{name}", value]
    if shard:
        args += ["--shard", f"{shard[0]}/{shard[1]}"]
    return args


def build_workflow(chunks: list[Chunk], filters, shard=None) -> dict:
    digest = layout_digest(chunks)
    selection = shlex.join(_filter_args(filters, shard))
    jobs: dict = {}
    groups = plan_groups(chunks)
    build_ids = []
    for g, group in enumerate(groups, 1):
        plan_id = f"plan_{g}"
        jobs[plan_id] = {
            "name": f"plan {g}/{len(groups)}",
            "runs-on": RUNS_ON["x86"],
            "timeout-minutes": 20,
            "outputs": {ch.name: f"${{{{ steps.missing.outputs.{ch.name} }}}}" for ch in group},
            "steps": _setup_steps() + [
                {"name": "Fetch the wheelhouse manifest",
                 "env": {"FARM_WHEELHOUSE_URL": "${{ vars.FARM_WHEELHOUSE_URL }}"},
                 "run": ("mkdir -p wheelhouse\n"
                         "if [ -n \"$FARM_WHEELHOUSE_URL\" ]; then\n"
                         "  curl -fsSL \"$FARM_WHEELHOUSE_URL/manifest.jsonl\" -o wheelhouse/manifest.jsonl || "
                         "echo \"no manifest yet: every cell is missing\"\n"
                         "fi")},
                {"name": "Cells of these chunks missing from the wheelhouse", "id": "missing",
                 "run": (f"farm ci outputs --group {g} --layout {digest} --wheelhouse wheelhouse"
                         + (f" {selection}" if selection else "") + " >> \"$GITHUB_OUTPUT\"")},
            ],
        }
        for ch in group:
            job_id = f"build_{ch.name}"
            build_ids.append(job_id)
            output = f"needs.{plan_id}.outputs.{ch.name}"
            jobs[job_id] = {
                "name": f"build {ch.lane} {ch.index}" + " (${{ matrix.cell }})",
                "needs": plan_id,
                "if": f"{output} != '[]' && {output} != ''",
                "runs-on": ch.runs_on,
                "timeout-minutes": ch.timeout_minutes,
                "strategy": {"fail-fast": False, "matrix": {"cell": f"${{{{ fromJSON({output}) }}}}"}},
                "env": {"CELL": "${{ matrix.cell }}"},
                "steps": _setup_steps() + (windows_job_steps(ch.cells) if ch.lane.startswith("windows") else []) + [
                    {"name": "farm build", "run": "farm build \"$CELL\" --no-publish --out \"build/$CELL\""},
                    {"name": "farm publish (this host's staging folder)",
                     "run": ("farm publish \"build/$CELL\"/wheel/*.whl --record \"build/$CELL/build.json\" "
                             "--wheelhouse \"staging/$CELL\"")},
                    {"uses": "actions/upload-artifact@v6",
                     "with": {"name": "staging-${{ matrix.cell }}", "path": "staging/${{ matrix.cell }}",
                              "if-no-files-found": "error", "retention-days": 7}},
                ],
            }
    jobs["index"] = {
        "name": "merge the staging folders into the wheelhouse",
        "needs": [f"plan_{g}" for g in range(1, len(groups) + 1)] + build_ids,
        "if": "${{ always() && !cancelled() }}",
        "runs-on": RUNS_ON["x86"],
        "timeout-minutes": 60,
        "concurrency": {"group": CONCURRENCY_GROUP, "cancel-in-progress": False},
        "steps": _setup_steps() + [
            {"name": "Fetch the wheelhouse", "env": {"FARM_WHEELHOUSE_PULL": "${{ vars.FARM_WHEELHOUSE_PULL }}"},
             "run": "mkdir -p wheelhouse\nif [ -n \"$FARM_WHEELHOUSE_PULL\" ]; then eval \"$FARM_WHEELHOUSE_PULL\"; fi"},
            {"uses": "actions/download-artifact@v7", "with": {"pattern": "staging-*", "path": "staging"}},
            {"name": "farm index merge",
             "run": ("shopt -s nullglob\n"
                     "set -- staging/*/\n"
                     "if [ $# -eq 0 ]; then echo \"nothing was built\"; exit 0; fi\n"
                     "farm index merge \"$@\" --wheelhouse wheelhouse")},
            {"name": "Push the wheelhouse", "env": {"FARM_WHEELHOUSE_PUSH": "${{ vars.FARM_WHEELHOUSE_PUSH }}"},
             "run": "if [ -n \"$FARM_WHEELHOUSE_PUSH\" ]; then eval \"$FARM_WHEELHOUSE_PUSH\"; fi"},
        ],
    }
    return {
        "name": "farm build",
        "on": {"workflow_dispatch": {},
               "push": {"branches": ["main"], "paths": ["recipes/**", "defaults/**", f".github/workflows/{BUILD_WORKFLOW}"]}},
        "permissions": {"contents": "read"},
        "defaults": {"run": {"shell": "bash"}},
        "env": {"FARM_CI_LAYOUT": digest, "PYTHONUNBUFFERED": "1"},
        "jobs": jobs,
    }


def refresh_workflow(filters, shard=None, out_dir: str = ".github/workflows") -> dict:
    selection = shlex.join(_filter_args(filters, shard))
    regenerate = f"farm ci github --out {shlex.quote(out_dir)}" + (f" {selection}" if selection else "")
    return {
        "name": "farm matrix refresh",
        "on": {"schedule": [{"cron": "17 5 * * *"}], "workflow_dispatch": {}},
        "permissions": {"contents": "write", "pull-requests": "write"},
        "concurrency": {"group": "farm-matrix-refresh", "cancel-in-progress": False},
        "jobs": {"refresh": {
            "runs-on": RUNS_ON["x86"],
            "timeout-minutes": 30,
            "steps": _setup_steps() + [
                {"name": "Scrape the upstream matrix", "run": "farm matrix scrape"},
                {"name": "Derive the grid", "run": "farm matrix derive"},
                {"name": "Regenerate the workflows", "run": regenerate},
                {"name": "Open a pull request when the grid changed",
                 "env": {"GH_TOKEN": "${{ github.token }}"},
                 "run": ("if git diff --quiet -- defaults .github/workflows; then\n"
                         "  echo \"the grid is unchanged\"; exit 0\n"
                         "fi\n"
                         "branch=\"farm/matrix-refresh-$(date -u +%Y%m%d)\"\n"
                         "git config user.name \"farm matrix refresh\"\n"
                         "git config user.email \"farm-matrix-refresh@users.noreply.github.com\"\n"
                         "git switch -c \"$branch\"\n"
                         "git add defaults .github/workflows\n"
                         "git commit -m \"matrix: refresh the grid from the upstream index\"\n"
                         "git push --force origin \"$branch\"\n"
                         "gh pr create --base main --head \"$branch\" --title \"matrix: refresh the grid\" "
                         "--body \"farm matrix scrape + derive found a changed grid; the build workflows are "
                         "regenerated.\" || gh pr edit \"$branch\" --body \"refreshed again\"")},
            ],
        }},
    }


def dump(workflow: dict) -> str:
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        style = "|" if "\n" in value else None   # scripts read as scripts
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, text)
    header = "# Generated by `farm ci github`; edit the generator (farm/run/ci.py), not this file.\n"
    return header + yaml.dump(workflow, Dumper=_Dumper, sort_keys=False, width=1000, default_flow_style=False)


def github_workflows(plan, cells: list[Cell], filters, shard=None, out_dir: str = ".github/workflows"
                     ) -> tuple[dict[str, str], list[Chunk], dict[str, list[str]]]:
    """({file name: YAML text}, chunks, left out) for the selected cells."""
    keep, left = ci_cells(plan, cells)
    chunks = chunks_for(plan, keep)
    files = {BUILD_WORKFLOW: dump(build_workflow(chunks, filters, shard)),
             REFRESH_WORKFLOW: dump(refresh_workflow(filters, shard, out_dir))}
    return files, chunks, left


def actionlint_config() -> str:
    """`.github/actionlint.yaml`: the self-hosted label huge recipes run on is ours, not a typo."""
    labels = sorted({label for labels in SELF_HOSTED_LABELS.values() for label in labels} - {"self-hosted"})
    return "# Generated by `farm ci github`.\nself-hosted-runner:\n  labels:\n" + \
        "".join(f"    - {label}\n" for label in labels)


def missing_outputs(plan, cells: list[Cell], group: int, layout: str, wheelhouse) -> list[str]:
    """The `name=[ids]` output lines of plan job `group`: per chunk, its cells not yet in the wheelhouse."""
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
    by_id = {c.id: c for c in keep}
    mine = [by_id[i] for ch in groups[group - 1] for i in ch.cells]
    missing = {c.id for c in missing_cells(plan, mine, wheelhouse)}   # keyed as `farm build` here keys them
    return [output_line(ch.name, [i for i in ch.cells if i in missing]) for ch in groups[group - 1]]
