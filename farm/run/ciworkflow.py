"""The workflows `farm ci github` writes (design.md §11.5): `farm-build.yml` and `farm-matrix-refresh.yml`.

`farm-build.yml`, per run:
- `plan_<g>`: per chunk, the rows with a missing cell (farm/run/ci.py), as job outputs.
- `images_<arch>`: the builder image of each Linux lane built once (or restored from the Actions cache,
  keyed by what the image is made from) and uploaded as an artifact, `podman save` format. When the
  wheelhouse's config.json names an `image_registry`, there is no images job: the row jobs pull it.
- `build_<lane>_<cuda>_<n>`: one matrix job per row. Linux jobs set up the engine (scripts/setup-engine.sh,
  what `make setup-engine` runs), put the row's Pythons where the image probe finds them, load the
  builder image, restore the row's compiler cache and the lane's toolkit, run `farm ci row` (every sibling
  published on its own into `staging/<row>`), save the compiler cache whatever the outcome, and upload
  the staging folder. Windows jobs get the lane's own set-up steps (`ci.windows_lane_steps`).
- `index`: merges every staging folder into the wheelhouse, one run at a time.

The farm runs as root on Linux runners (as on a build host): debootstrap, the engine's storage the image
is loaded into, and the host runner's network namespace need it; `as_root` is a no-op when already root.
"""

from __future__ import annotations

import shlex

from farm.run.ci import (
    AFTER_ROW_MIN,
    IMAGE_ARCH,
    RUNS_ON,
    SELF_HOSTED_LABELS,
    SETUP_MIN,
    Chunk,
    layout_digest,
    plan_groups,
    windows_lane_steps,
)
from farm.versions import cuda_tag

PYTHON = "3.12"
BUILD_WORKFLOW = "farm-build.yml"
REFRESH_WORKFLOW = "farm-matrix-refresh.yml"
CONCURRENCY_GROUP = "farm-wheelhouse"
CCACHE_PATH = "${{ runner.temp }}/ccache"
CACHE_FOLDER = "${{ runner.temp }}/farm-cache"
IMAGE_PATH = "${{ runner.temp }}/image"
AS_ROOT = 'as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -E env "PATH=$PATH" "$@"; fi; }\n'

# What the Actions cache (10 GB per repository, least recently used evicted) carries between runs:
CACHE_NOTE = """\
# Caches carried between runs (GitHub: 10 GB per repository, least recently used entries evicted):
# - the compiler cache of each row (ccache, one folder per (CUDA, torch) group): restored from the newest
#   entry of the row (restore-keys), so a rerun after a recipe or policy change starts warm; saved after
#   every row job, failed or not. A row's cache is tens to hundreds of MB.
# - the CUDA toolkit of each (lane, CUDA line) from PyPI: a few hundred MB, shared by every row job.
# - the builder image of each Linux lane (the `podman save` archive, ~600 MB), keyed by what it is made from.
# Not cached: torch environments and downloads. One Python's environment with its nvidia wheels is ~3.6 GB,
# so a row of four or five would fill the repository's 10 GB alone and evict the caches above; each row job
# downloads its torch wheels from PyPI instead (about a minute per Python on a hosted runner).
"""


def _setup_steps() -> list[dict]:
    return [
        {"uses": "actions/checkout@v5"},
        {"uses": "actions/setup-python@v6", "with": {"python-version": PYTHON}},
        {"name": "Install the farm", "run": "python -m pip install -e ."},
    ]


def _engine_step() -> dict:
    return {"name": "Set up the engine (podman, debootstrap, qemu: make setup-engine)",
            "run": AS_ROOT + "as_root sh scripts/setup-engine.sh"}


def _folders_step() -> dict:
    """The farm's cache folder and the compiler cache's, in the runner's temp folder (a job-level env cannot
    name it): the paths the cache steps restore and save."""
    return {"name": "The farm's cache folders (FARM_CACHE, FARM_CCACHE_DIR)",
            "run": ("echo \"FARM_CACHE=$RUNNER_TEMP/farm-cache\" >> \"$GITHUB_ENV\"\n"
                    "echo \"FARM_CCACHE_DIR=$RUNNER_TEMP/ccache\" >> \"$GITHUB_ENV\"")}


def _fetch_manifest_step() -> dict:
    return {"name": "Fetch the wheelhouse manifest",
            "env": {"FARM_WHEELHOUSE_URL": "${{ vars.FARM_WHEELHOUSE_URL }}"},
            "run": ("mkdir -p wheelhouse\n"
                    "if [ -n \"$FARM_WHEELHOUSE_URL\" ]; then\n"
                    "  curl -fsSL \"$FARM_WHEELHOUSE_URL/manifest.jsonl\" -o wheelhouse/manifest.jsonl || "
                    "echo \"no manifest yet: every cell is missing\"\n"
                    "fi")}


def _filter_args(filters, shard) -> list[str]:
    args = []
    for name in ("package", "cuda", "torch", "python", "platform"):
        for value in getattr(filters, name):
            args += [f"--{name}", value]
    if shard:
        args += ["--shard", f"{shard[0]}/{shard[1]}"]
    return args


def _pythons_step(selection: str) -> dict:
    """The row's Pythons where the builder image's probe looks for host Pythons (PYENV_ROOT/versions/3.X.Y,
    farm/runners/images.py): python-build-standalone builds from uv, which need only glibc 2.17 and so run
    inside the image. A Python already there (a self-hosted runner, this machine) is kept."""
    return {"name": "The row's Pythons, where the builder image can mount them",
            "run": ("PYENV_ROOT=\"${PYENV_ROOT:-$HOME/.pyenv}\"\n"
                    "echo \"PYENV_ROOT=$PYENV_ROOT\" >> \"$GITHUB_ENV\"\n"
                    f"for v in $(farm ci row \"$ROW\" --pythons{selection}); do\n"
                    "  if ls -d \"$PYENV_ROOT/versions/$v\".* >/dev/null 2>&1; then continue; fi\n"
                    "  command -v uv >/dev/null || python -m pip install --quiet uv\n"
                    "  uv python install \"$v\" --install-dir \"$RUNNER_TEMP/pythons\"\n"
                    "  dir=$(ls -d \"$RUNNER_TEMP/pythons/cpython-$v\".*-linux-* | head -n 1)\n"
                    "  full=$(basename \"$dir\" | cut -d- -f2)\n"
                    "  mkdir -p \"$PYENV_ROOT/versions\" && ln -sfn \"$dir\" \"$PYENV_ROOT/versions/$full\"\n"
                    "done")}


def _image_steps(arch: str, registry: str | None) -> list[dict]:
    if registry:
        return [{"name": f"Pull the builder image ({arch}) from {registry}",
                 "run": AS_ROOT + f"as_root farm ci image load --arch {arch} --registry {shlex.quote(registry)}"}]
    return [
        {"uses": "actions/download-artifact@v7", "with": {"name": f"builder-{arch}", "path": IMAGE_PATH}},
        {"name": f"Load the builder image ({arch})",
         "run": AS_ROOT + f"as_root farm ci image load --arch {arch} --dir \"$RUNNER_TEMP/image\""},
    ]


def _cache_key(name: str) -> str:
    """A new entry per run (Actions cache entries are immutable); restore-keys find the newest."""
    return f"{name}-${{{{ github.run_id }}}}-${{{{ github.run_attempt }}}}"


def images_job(arch: str) -> dict:
    lane = next(k for k, v in IMAGE_ARCH.items() if v == arch)
    key = f"farm-builder-{arch}-${{{{ hashFiles('docker/**', 'farm/runners/images.py') }}}}"
    return {
        "name": f"builder image {arch}",
        "runs-on": RUNS_ON[lane],
        "timeout-minutes": 60,
        "steps": _setup_steps() + [
            _engine_step(),
            {"name": "Restore the image archive", "id": "image", "uses": "actions/cache@v5",
             "with": {"path": IMAGE_PATH, "key": key}},
            {"name": "Build the builder image (debootstrap base + docker/Dockerfile) and save it",
             "if": "steps.image.outputs.cache-hit != 'true'",
             "run": AS_ROOT + (f"as_root farm ci image save --arch {arch} --dir \"$RUNNER_TEMP/image\"\n"
                               "as_root chown -R \"$(id -u):$(id -g)\" \"$RUNNER_TEMP/image\"")},
            {"uses": "actions/upload-artifact@v6",
             "with": {"name": f"builder-{arch}", "path": IMAGE_PATH, "if-no-files-found": "error",
                      "retention-days": 1, "compression-level": 0}},
        ],
    }


def row_job(ch: Chunk, plan_id: str, registry: str | None, selection: str) -> dict:
    """One matrix job per row; `selection`: the workflow's filters (" --python 3.12 ..."), so that the row
    job builds the siblings its plan job counted."""
    output = f"needs.{plan_id}.outputs.{ch.name}"
    lane = ch.base_lane
    linux = lane in IMAGE_ARCH
    steps = _setup_steps() + [_folders_step()]
    if linux:
        steps += [_engine_step(), _pythons_step(selection)]
    else:
        steps += windows_lane_steps(ch.cuda)
    steps.append(_fetch_manifest_step())
    steps.append({"name": "Restore the row's compiler cache", "uses": "actions/cache/restore@v5",
                  "with": {"path": CCACHE_PATH, "key": _cache_key("ccache-${{ matrix.row }}"),
                           "restore-keys": "ccache-${{ matrix.row }}-"}})
    if linux:
        steps.append({"name": f"Restore the CUDA {ch.cuda} toolkit", "uses": "actions/cache@v5",
                      "with": {"path": f"{CACHE_FOLDER}/toolkits",
                               "key": f"toolkit-{lane}-{cuda_tag(ch.cuda)}-${{{{ hashFiles('defaults/cuda_toolkits.yml') }}}}"}})
        steps += _image_steps(IMAGE_ARCH[lane], registry)
    budget = max(ch.timeout_minutes - SETUP_MIN - AFTER_ROW_MIN, 1)
    row = (f"farm ci row \"$ROW\" --staging \"staging/$ROW\" --wheelhouse wheelhouse --out build "
           f"--budget-minutes {budget} --summary \"$GITHUB_STEP_SUMMARY\"{selection}")
    steps.append({"name": "farm ci row: the siblings in sequence, each published into staging/<row>",
                  "timeout-minutes": max(ch.timeout_minutes - AFTER_ROW_MIN, 1),
                  "run": AS_ROOT + "as_root " + row if linux else row})
    if linux:
        steps.append({"name": "Hand the caches and outputs back to the runner's user", "if": "${{ always() }}",
                      "run": AS_ROOT + ("mkdir -p \"$FARM_CCACHE_DIR\" \"$FARM_CACHE/toolkits\" staging build\n"
                                        "as_root chown -R \"$(id -u):$(id -g)\" \"$FARM_CCACHE_DIR\" "
                                        "\"$FARM_CACHE/toolkits\" staging build")})
    steps += [
        {"name": "Save the row's compiler cache (also when a sibling failed)", "if": "${{ always() }}",
         "uses": "actions/cache/save@v5",
         "with": {"path": CCACHE_PATH, "key": _cache_key("ccache-${{ matrix.row }}")}},
        {"uses": "actions/upload-artifact@v6", "if": "${{ !cancelled() }}",
         "with": {"name": "staging-${{ matrix.row }}", "path": "staging/${{ matrix.row }}",
                  "if-no-files-found": "warn", "retention-days": 7}},
    ]
    needs = [plan_id] + ([f"images_{IMAGE_ARCH[lane]}"] if linux and not registry else [])
    return {
        "name": f"build {ch.lane} {cuda_tag(ch.cuda)} {ch.index}" + " (${{ matrix.row }})",
        "needs": needs[0] if len(needs) == 1 else needs,
        "if": f"{output} != '[]' && {output} != ''",
        "runs-on": ch.runs_on,
        "timeout-minutes": ch.timeout_minutes,
        "strategy": {"fail-fast": False, "matrix": {"row": f"${{{{ fromJSON({output}) }}}}"}},
        "env": {"ROW": "${{ matrix.row }}"},
        "steps": steps,
    }


def build_workflow(chunks: list[Chunk], filters, shard=None, registry: str | None = None) -> dict:
    digest = layout_digest(chunks)
    selection = shlex.join(_filter_args(filters, shard))
    jobs: dict = {}
    groups = plan_groups(chunks)
    if not registry:
        for arch in sorted({IMAGE_ARCH[ch.base_lane] for ch in chunks if ch.base_lane in IMAGE_ARCH}):
            jobs[f"images_{arch}"] = images_job(arch)
    build_ids = []
    for g, group in enumerate(groups, 1):
        plan_id = f"plan_{g}"
        jobs[plan_id] = {
            "name": f"plan {g}/{len(groups)}",
            "runs-on": RUNS_ON["x86"],
            "timeout-minutes": 20,
            "outputs": {ch.name: f"${{{{ steps.missing.outputs.{ch.name} }}}}" for ch in group},
            "steps": _setup_steps() + [
                _fetch_manifest_step(),
                {"name": "Rows of these chunks with a cell missing from the wheelhouse", "id": "missing",
                 "run": (f"farm ci outputs --group {g} --layout {digest} --wheelhouse wheelhouse"
                         + (f" {selection}" if selection else "") + " >> \"$GITHUB_OUTPUT\"")},
            ],
        }
        for ch in group:
            build_ids.append(f"build_{ch.name}")
            jobs[f"build_{ch.name}"] = row_job(ch, plan_id, registry, f" {selection}" if selection else "")
    jobs["index"] = {
        "name": "merge the staging folders into the wheelhouse",
        "needs": [j for j in jobs if j.startswith("plan_")] + build_ids,
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


def dump(workflow: dict, note: str = "") -> str:
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):
        style = "|" if "\n" in value else None   # scripts read as scripts
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, text)
    header = "# Generated by `farm ci github`; edit the generator (farm/run/ciworkflow.py), not this file.\n" + note
    return header + yaml.dump(workflow, Dumper=_Dumper, sort_keys=False, width=1000, default_flow_style=False)


def github_workflows(plan, cells, filters, shard=None, out_dir: str = ".github/workflows",
                     registry: str | None = None) -> tuple[dict[str, str], list[Chunk], dict[str, list[str]]]:
    """({file name: YAML text}, chunks, left out) for the selected cells."""
    from farm.run.ci import ci_layout

    chunks, left = ci_layout(plan, cells)
    files = {BUILD_WORKFLOW: dump(build_workflow(chunks, filters, shard, registry), CACHE_NOTE),
             REFRESH_WORKFLOW: dump(refresh_workflow(filters, shard, out_dir))}
    return files, chunks, left


def actionlint_config() -> str:
    """`.github/actionlint.yaml`: the self-hosted label huge recipes run on is ours, not a typo."""
    labels = sorted({label for labels in SELF_HOSTED_LABELS.values() for label in labels} - {"self-hosted"})
    return "# Generated by `farm ci github`.\nself-hosted-runner:\n  labels:\n" + \
        "".join(f"    - {label}\n" for label in labels)
