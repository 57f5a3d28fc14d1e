"""Build tiers, build records and the status table (README "Build tiers and the recipe status table").

The smoke and flags builds run the real `farm build` on the host runner against the bundled demo
(real nvcc, real torch); the table and the refusals need no compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from farmcli import PROJECT, run_farm
from hostile import assert_one_line_refusal, tree_state
from owned import own_processes, owner_env
from wheel_builder import demo_extension

from farm.arch.fatbin import read_fatbin

CELL = "farm_demo-cu130-torch2.13-py311"
DEMO_LIST = "7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX"
ALL_SASS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


@pytest.fixture()
def recipes(tmp_path):
    """A recipes folder holding the demo (its path source made absolute); records go to its records/."""
    folder = tmp_path / "recipes"
    folder.mkdir()
    demo = (PROJECT / "recipes" / "farm_demo.yml").read_text()
    (folder / "farm_demo.yml").write_text(
        demo.replace("path: ../examples/farm-demo", f"path: {PROJECT / 'examples' / 'farm-demo'}"))
    return folder


def build(recipes: Path, out: Path, *args, timeout=1800, owner: dict[str, str] | None = None):
    return run_farm("build", *args, "--runner", "host", "--no-publish", "--out", str(out), env={
        "FARM_RECIPES": str(recipes), "FARM_WHEELHOUSE": str(out.parent / "wheelhouse"), **(owner or {})},
        timeout=timeout)


# ---------------------------------------------------------------- smoke

@pytest.mark.slow
def test_smoke_build_carries_one_token_is_marked_and_publish_refuses_it(recipes, tmp_path):
    out = tmp_path / "out"
    # farm_demo asks 2 jobs x 3 GB; a 4 GB budget admits one (a lone `farm build` admits itself too)
    res = build(recipes, out, CELL, "--smoke", "--arch", "12.0+PTX", "--record", "--mem-budget", "4")
    assert res.returncode == 0, res.stderr + res.stdout
    assert "memory admission: 2 jobs x 3 GB exceed the 4.0 GB free of the budget; clamped to 1" in res.stdout
    [wheel] = list((out / "wheel").glob("*.whl"))
    report = read_fatbin(demo_extension(wheel, tmp_path / "unpacked"))
    assert report.sass() == {(120, "")} and report.ptx() == {(120, "")}   # the +PTX token kept its PTX
    with zipfile.ZipFile(wheel) as zf:
        info = json.loads(zf.read("farm_demo-0.1.0+cu130torch2.13.dist-info/farm_build.json"))
    assert info["tier"] == "smoke" and info["arch_list"] == "12.0+PTX"
    build_json = json.loads((out / "build.json").read_text())

    # its key is not the full cell's: the arch list is in the key
    from farm.build.buildkey import KeyMaker, context_for
    from farm.recipes.plan import cell_plan

    os.environ["FARM_RECIPES"] = str(recipes)
    try:
        cell, plan = cell_plan(CELL)
        full_key = KeyMaker(plan.defaults, plan.recipes).key(cell, context_for(cell.platform, "host"))
    finally:
        del os.environ["FARM_RECIPES"]
    assert cell.arch.arch_list.torch() == DEMO_LIST and build_json["build_key"] != full_key

    record = json.loads((recipes / "records" / "farm_demo.json").read_text())
    assert record["tier"] == "smoke" and record["cell"] == CELL and record["arch_list"] == "12.0+PTX"
    # the same record is its cell's (design.md §4.5): the per-cell status counts it
    assert json.loads((recipes / "records" / "farm_demo" / f"{CELL}.json").read_text()) == record
    assert (record["sass"], record["ptx"], record["gate"]) == (["sm_120"], ["compute_120"], "pass")
    assert record["wheel"] == wheel.name and record["wheel_bytes"] == wheel.stat().st_size
    assert record["peak_mb"] > 100 and record["steps"]["compile"] > 0 and record["wall_s"] > record["steps"]["compile"]
    assert record["build_key"] == build_json["build_key"] and str(PROJECT) not in json.dumps(record)
    # what the wall time was bought with (design.md §5.5): this host's cores, the build's max_jobs
    assert record["cores"] == os.cpu_count() and record["max_jobs"] == build_json["max_jobs"] == 1
    assert build_json["max_jobs_recipe"] == 2 and "clamped to 1" in build_json["max_jobs_clamp"]
    assert record["nvcc_threads"] == build_json["nvcc_threads"] == 1   # one token: nvcc has one codegen to run

    house = tmp_path / "house"
    house.mkdir()
    before = tree_state(house)
    refused = run_farm("publish", str(wheel), "--wheelhouse", str(house))
    assert_one_line_refusal(refused, 2, "smoke")
    assert tree_state(house) == before


# ---------------------------------------------------------------- flags

@pytest.mark.parametrize("jobs,threads,tokens,want", [
    (1, 4, "8.0", (4, 1)),          # the threads one token cannot use become jobs
    (1, 4, "12.0+PTX", (4, 1)),     # a +PTX token is still one virtual arch
    (2, 1, "7.5", (2, 1)),          # no threads to trade
    (3, 2, "9.0a", (6, 1)),
])
def test_a_smoke_build_keeps_the_recipes_codegens_at_once(jobs, threads, tokens, want):
    from farm.archlist import ArchList
    from farm.build.cell import smoke_parallelism

    assert smoke_parallelism(jobs, threads, ArchList.parse(tokens)) == want


@pytest.mark.slow
def test_flags_tier_on_the_demo_records_exactly_the_list(recipes, tmp_path):
    out = tmp_path / "out"
    owner = owner_env()
    res = build(recipes, out, CELL, "--flags-only", "--for", "0.75", "--record", owner=owner)
    assert res.returncode == 0, res.stderr + res.stdout
    assert f"flags verified, not built: {' '.join(ALL_SASS)} compute_90 compute_120" in res.stdout
    assert not list(out.rglob("*.whl"))
    record = json.loads((recipes / "records" / "farm_demo.json").read_text())
    flags = record["flags"]
    assert record["tier"] == "flags" and flags["equal"] and flags["missing"] == flags["extra"] == []
    assert flags["sass"] == ALL_SASS and flags["ptx"] == ["compute_90", "compute_120"]
    assert flags["compiling_invocations"] >= 1 and flags["calls_differing"] == 0
    assert flags["objects_total"] == 2   # the two .cu files of build.ninja (the binding is no CUDA object)
    assert flags["finished"] <= flags["compiling_invocations"]   # a call the stop killed is no sample
    # only the compilers of this test's build (its marker): another build's nvcc may run beside it
    assert not own_processes(owner, tmp_path, b"nvcc", b"cicc", b"ninja"), "a compile process outlived the flags run's stop"


HARDCODED_SETUP = '''
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(name="hardcoded", version="0.1.0", packages=["hardcoded"],
      ext_modules=[CUDAExtension("hardcoded._C", ["k.cu"],
                                 extra_compile_args={"cxx": [], "nvcc": ["-gencode=arch=compute_89,code=sm_89"]})],
      cmdclass={"build_ext": BuildExtension})
'''
KERNEL = '''
#include <torch/extension.h>
__global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}
'''


@pytest.mark.slow
def test_flags_tier_reports_a_hardcoded_gencode_as_a_difference(recipes, tmp_path):
    src = tmp_path / "hardcoded"
    (src / "hardcoded").mkdir(parents=True)
    (src / "hardcoded" / "__init__.py").write_text("")
    (src / "setup.py").write_text(HARDCODED_SETUP)
    (src / "k.cu").write_text(KERNEL)
    # the waiver forgives two of the missing tokens, as the gate would: they are waived, not missing
    (recipes / "hardcoded.yml").write_text(
        f"name: hardcoded\nsource:\n  path: {src}\nversion: '0.1.0'\nlinks_torch: true\nplatforms: [linux]\n"
        "min_torch: '2.13'\nverify:\n  allow_missing_archs:\n    x86: {archs: '7.5 8.0', reason: test}\n")
    out = tmp_path / "out"
    res = build(recipes, out, "hardcoded-cu130-torch2.13-py311", "--flags-only", "--for", "1", "--record")
    assert res.returncode == 0, res.stderr + res.stdout
    # torch's CUDAExtension drops TORCH_CUDA_ARCH_LIST once a source names its own -gencode: the whole
    # list goes missing, which is what the flags tier is there to catch.
    missing = ["sm_86", "compute_90", "sm_90", "sm_100", "compute_120", "sm_120"]
    assert (f"flags verified, not built: sm_89 across 1 nvcc invocation(s): differs from the cell's list "
            f"{DEMO_LIST} (missing {' '.join(missing)}; extra sm_89; sm_75 sm_80 waived)") in res.stdout
    flags = json.loads((recipes / "records" / "hardcoded.json").read_text())["flags"]
    assert not flags["equal"] and flags["extra"] == ["sm_89"] and flags["missing"] == missing
    assert flags["waived"] == ["sm_75", "sm_80"]
    assert flags["calls_differing"] == flags["compiling_invocations"] == 1
    assert flags["objects_total"] == 1
    if not flags["stopped"]:   # the one object finished inside the minute: its CPU time is the sample
        assert flags["finished"] == 1 and flags["cpu_s_per_object"] > 0 and flags["cpu_h_estimate"] is not None

    table = run_farm("recipes", "status", "--out", str(tmp_path / "status.md"), env={"FARM_RECIPES": str(recipes)})
    assert table.returncode == 0, table.stderr
    row = next(ln for ln in (tmp_path / "status.md").read_text().splitlines() if ln.startswith("| hardcoded "))
    assert "| flags |" in row and "flags differ: missing sm_86" in row and "; extra sm_89; sm_75 sm_80 waived |" in row


@pytest.mark.slow
def test_a_failed_build_records_its_first_compiler_error(recipes, tmp_path):
    src = tmp_path / "broken"
    (src / "hardcoded").mkdir(parents=True)
    (src / "hardcoded" / "__init__.py").write_text("")
    (src / "setup.py").write_text(HARDCODED_SETUP.replace('"-gencode=arch=compute_89,code=sm_89"', ""))
    (src / "k.cu").write_text(KERNEL.replace("x[threadIdx.x] *= 2.0f;", "undeclared_thing(x);"))
    (recipes / "hardcoded.yml").write_text(
        f"name: hardcoded\nsource:\n  path: {src}\nversion: '0.1.0'\nlinks_torch: true\nplatforms: [linux]\n"
        "min_torch: '2.13'\n")
    res = build(recipes, tmp_path / "out", "hardcoded-cu130-torch2.13-py311", "--smoke", "--record")
    assert res.returncode == 1 and not list(tmp_path.rglob("*.whl"))
    record = json.loads((recipes / "records" / "hardcoded.json").read_text())
    assert (record["tier"], record["tier_asked"], record["cell"]) == ("failed", "smoke", "hardcoded-cu130-torch2.13-py311")
    assert "error" in record["reason"] and "undeclared_thing" in record["reason"], record["reason"]
    assert "k.cu(3): error" in record["reason"] and str(tmp_path) not in json.dumps(record)
    assert record["steps"]["source"] >= 0 and "compile" not in record["steps"]


# ---------------------------------------------------------------- the status table

def _record(folder: Path, name: str, **fields) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"recipe": name, **fields}))


RAISED = "manylinux_2_34 (torch's manylinux_2_28 not reached: +6 minor, FARM_MANYLINUX_FLOOR)"


def test_status_table_from_records_every_recipe_and_column(tmp_path):
    from farm.recipes.reader import load_recipes
    from farm.recipes.status import COLUMNS

    names = sorted(load_recipes())
    records = tmp_path / "records"
    _record(records, "farm_demo", tier="full", cell=CELL, date="2026-12-01T10:00:00Z", wall_s=153.2,
            peak_mb=2150, wheel_bytes=2_345_678, sass=ALL_SASS, ptx=["compute_90", "compute_120"], gate="pass",
            source={"kind": "path"}, patches=[], compiler_cache={"active": True, "hits": 1, "misses": 3},
            tag="manylinux_2_34_x86_64", floor={"tag": "manylinux_2_34", "torch": "manylinux_2_28",
                                                "source": "FARM_MANYLINUX_FLOOR", "text": RAISED})
    # recorded before tags and floors were: the tag from its wheel's file name, the floor unknown
    _record(records, "cubvh", tier="full", cell="cubvh-cu130-torch2.13-py312", date="2026-12-01T11:00:00Z",
            wheel="cubvh-0.1.0+cu130torch2.13-cp312-cp312-manylinux_2_35_x86_64.whl", source={"kind": "path"})
    _record(records, "diso", tier="failed", tier_asked="smoke", cell="diso-cu130-torch2.13-py312",
            date="2026-12-02T09:00:00Z", reason="csrc/x.cu(3): error: identifier \"foo\" is undefined",
            source={"kind": "sdist", "sha256": "ab" * 32}, patches=[{"file": "0001-fix.patch", "sha256": "cd" * 32}])
    _record(records, "flash_attn", tier="flags", cell="flash_attn-cu130-torch2.13-py312", date="2026-12-03T10:00:00Z",
            source={"kind": "path"},
            flags={"equal": True, "compiling_invocations": 2, "waived": ["sm_80"], "finished": 2,
                   "objects_total": 30, "cpu_s_per_object": 640.0, "cpu_h_estimate": 5.33})
    blocked = run_farm("recipes", "block", "natten", "--why", "  needs 40 GB per job\tand 6 h  ",
                       "--records", str(records))
    assert blocked.returncode == 0, blocked.stderr
    out = tmp_path / "docs" / "recipe-status.md"
    out.parent.mkdir()   # an output file's folder must exist: status creates nothing on the way
    res = run_farm("recipes", "status", "--records", str(records), "--out", str(out))
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.startswith("| recipe "))
    assert [c.strip() for c in header.strip("|").split("|")] == list(COLUMNS)
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")]
            for ln in lines if ln.startswith("| ") and ln is not header}
    assert sorted(rows) == names and len(names) >= 45
    demo = dict(zip(COLUMNS, rows["farm_demo"], strict=True))
    assert (demo["tier"], demo["cell"], demo["wall"], demo["peak mem"], demo["wheel"]) == \
        ("full", CELL, "2.6 min (1 ccache hit)", "2.1 GB", "2.3 MB")   # a warm build says so
    assert demo["SASS"] == " ".join(ALL_SASS) and demo["PTX"] == "compute_90 compute_120"
    assert (demo["gate"], demo["date"]) == ("pass", "2026-12-01")
    assert (demo["tag"], demo["floor"]) == ("manylinux_2_34", RAISED)   # design.md §7.8
    cubvh = dict(zip(COLUMNS, rows["cubvh"], strict=True))
    assert (cubvh["tag"], cubvh["floor"]) == ("manylinux_2_35", "-")
    diso = dict(zip(COLUMNS, rows["diso"], strict=True))
    assert diso["tier"] == "failed (asked smoke)" and diso["reason"].startswith("csrc/x.cu(3): error")
    assert diso["source pin"] == "sha256 " + "ab" * 6 and diso["patches"] == "0001-fix.patch"
    # a flags row carries the build's own words: what was waived, and what the stop left to sample
    assert dict(zip(COLUMNS, rows["flash_attn"], strict=True))["gate"] == (
        "flags equal the list (sm_80 waived; 2 nvcc calls; 2 of 30 objects finished at 640 CPU-s each: "
        "~5.33 CPU-h for the cell)")
    natten = dict(zip(COLUMNS, rows["natten"], strict=True))
    assert natten["tier"] == "blocked" and natten["reason"] == "needs 40 GB per job and 6 h"
    assert natten["cell"] == "natten-cu130-torch2.13-py312"
    not_built = [n for n, r in rows.items() if r[3] == "not built yet"]
    assert len(not_built) == len(names) - 5
    assert f"{len(names)} recipes: 1 blocked, 1 failed, 1 flags, 2 full, {len(names) - 5} not built yet." in text
    # the printed table carries the same rows, the reason at the end of its line
    assert any(ln.startswith("natten ") and ln.endswith("-- needs 40 GB per job and 6 h")
               for ln in res.stdout.splitlines())


def test_the_committed_status_page_is_what_the_records_generate(tmp_path):
    """Every row built from a committed record reads as the records say (recipes' pins and patches move
    under other hands meanwhile: a not-built row only has to exist)."""
    from farm.recipes.reader import load_recipes

    out = tmp_path / "recipe-status.md"
    res = run_farm("recipes", "status", "--out", str(out))
    assert res.returncode == 0, res.stderr

    def rows(text: str) -> dict[str, str]:
        return {ln.split("|")[1].strip(): ln for ln in text.splitlines() if ln.startswith("| ")}

    fresh, committed = rows(out.read_text()), rows((PROJECT / "docs" / "recipe-status.md").read_text())
    recorded = {p.stem for p in (PROJECT / "recipes" / "records").glob("*.json")}
    assert set(committed) == set(fresh) == set(load_recipes()) | {"recipe"}, "run `farm recipes status`"
    stale = [name for name in recorded & set(fresh) if committed[name] != fresh[name]]
    assert not stale, f"docs/recipe-status.md differs from the records of {stale}: run `farm recipes status`"


# ---------------------------------------------------------------- malformed input: one line, nothing written

BAD_RECORDS = {
    "not-json": ("farm_demo", "{not json", "not a JSON build record"),
    "a-list": ("farm_demo", "[1, 2]", "a build record is a JSON object"),
    "other-recipe": ("farm_demo", json.dumps({"recipe": "diso", "tier": "full", "cell": CELL, "date": "d"}),
                     "'diso'"),
    "unknown-tier": ("farm_demo", json.dumps({"recipe": "farm_demo", "tier": "great", "cell": CELL, "date": "d"}),
                     "tier: 'great'"),
    "blocked-without-reason": ("diso", json.dumps({"recipe": "diso", "tier": "blocked", "cell": "c", "date": "d"}),
                               "reason"),
    "negative-wall": ("farm_demo", json.dumps({"recipe": "farm_demo", "tier": "full", "cell": CELL, "date": "d",
                                               "wall_s": -3}), "wall_s: -3"),
    "zero-cores": ("farm_demo", json.dumps({"recipe": "farm_demo", "tier": "full", "cell": CELL, "date": "d",
                                            "cores": 0}), "cores: 0"),
    "threads-a-word": ("farm_demo", json.dumps({"recipe": "farm_demo", "tier": "smoke", "cell": CELL, "date": "d",
                                                "nvcc_threads": "4"}), "nvcc_threads: '4'"),
    "floor-a-word": ("farm_demo", json.dumps({"recipe": "farm_demo", "tier": "full", "cell": CELL, "date": "d",
                                              "floor": "manylinux_2_28"}), "floor: 'manylinux_2_28'"),
    "sass-not-a-list": ("farm_demo", json.dumps({"recipe": "farm_demo", "tier": "full", "cell": CELL, "date": "d",
                                                 "sass": "sm_80"}), "sass: 'sm_80'"),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_a_bad_record_is_refused_before_the_table_is_written(tmp_path, case):
    name, text, needle = BAD_RECORDS[case]
    records = tmp_path / "records"
    records.mkdir()
    (records / f"{name}.json").write_text(text)
    before = tree_state(tmp_path)
    res = run_farm("recipes", "status", "--records", str(records), "--out", str(tmp_path / "status.md"))
    line = assert_one_line_refusal(res, 2, needle)
    assert f"{name}.json" in line
    assert tree_state(tmp_path) == before


@pytest.mark.parametrize("args,needle", [
    (["recipes", "block", "no_such_recipe", "--why", "x"], "no_such_recipe"),
    (["recipes", "block", "diso", "--why", "   "], "--why"),
    (["recipes", "block", "diso", "--why", "two\nlines"], "--why"),
    (["build", CELL, "--for", "5"], "only --flags-only"),
    (["build", CELL, "--flags-only", "--for", "0"], "--for: '0'"),
    (["build", CELL, "--flags-only", "--for", "nan"], "--for: 'nan'"),
    (["build", CELL, "--smoke", "--arch", "8.9"], "not a token of"),
    (["build", CELL, "--smoke", "--arch", "sm_eighty"], "--arch"),
    (["build", CELL, "--arch", "8.0"], "only a --smoke build"),
    (["build", CELL, "--mem-budget", "0"], "--mem-budget: '0'"),
    (["build", CELL, "--mem-budget", "nan"], "--mem-budget: 'nan'"),
    (["build", CELL, "--mem-budget", "lots"], "--mem-budget: 'lots'"),
])
def test_bad_tier_and_record_arguments_are_refused_in_one_line(tmp_path, args, needle):
    records = tmp_path / "records"
    out = tmp_path / "out"
    extra = ["--records", str(records)] if args[1] == "block" else ["--out", str(out), "--runner", "host"]
    res = run_farm(*args, *extra)
    assert_one_line_refusal(res, 2, needle)
    assert not records.exists() and not out.exists()


# ---------------------------------------------------------------- a CUDA 12.x cell without its toolkit

def _cu12_recipes(tmp_path) -> Path:
    """A recipe with no needs_patch whose git source is never reachable: only a refusal may answer."""
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "cu12probe.yml").write_text(
        "name: cu12probe\nsource:\n  git:\n    url: https://127.0.0.1:9/unreachable.git\n"
        f"    ref: '{'a' * 40}'\nversion: '0.1.0'\nlinks_torch: true\nplatforms: [linux]\n")
    return folder


@pytest.mark.parametrize("runner", ["host", "container", "nox"])
def test_a_cu128_cell_without_a_cuda_12_8_toolkit_is_refused_before_any_download(tmp_path, runner):
    from farm.build.toolkit import find_system_toolkit

    if find_system_toolkit("12.8")[0] is not None:
        pytest.skip("a CUDA 12.8 toolkit is installed here")
    cell = "cu12probe-cu128-torch2.8-py312"
    env = {"FARM_RECIPES": str(_cu12_recipes(tmp_path)), "FARM_CACHE": str(tmp_path / "cache"),
           "FARM_WHEELHOUSE": str(tmp_path / "house")}
    if runner == "nox":   # the session runs `farm build` with the default runner
        res = subprocess.run([str(PROJECT / ".venv" / "bin" / "nox"), "-s", f"build-{cell}"], cwd=PROJECT,
                             env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    else:
        res = run_farm("build", cell, "--runner", runner, "--out", str(tmp_path / "out"), env=env)
    line = assert_one_line_refusal(res, 2, "needs the CUDA 12.8 toolkit")
    assert "patch" not in line
    cached = {p for p in tree_state(tmp_path / "cache") if not p.startswith(("engine-cwd", "images", "plan"))}   # no download, no source
    assert cached == set(), f"written before the refusal: {sorted(cached)}"
    assert not (tmp_path / "out").exists() and not (tmp_path / "house").exists()
