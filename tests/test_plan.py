"""Cells, ids, counts, shards, build keys and the nox sessions (design.md §5)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from farmcli import PROJECT, run_farm

from farm.build.buildkey import BuildContext, KeyMaker
from farm.errors import BadInput
from farm.matrix.grid import load_grid
from farm.policy import load_defaults
from farm.recipes.plan import cell_plan, full_plan, in_shard, shard_of
from farm.recipes.reader import load_recipes


@pytest.fixture(scope="module")
def plan():
    return full_plan()


@pytest.fixture(scope="module")
def ids(plan):
    return {c.id for c in plan.cells}


def test_named_sessions_exist(ids):
    for cell in ("sageattention-cu128-torch2.8-py312", "cc_torch-cu130-torch2.10-py312-aarch64",
                 "flash_attn-cu126-torch2.8-py311-win", "cc_torch-cu129-torch2.9-py312-win"):
        assert cell in ids


def test_no_phantom_no_cu124_arm_no_t_python_no_below_min_torch(plan, ids):
    grid = load_grid()
    for cell in plan.cells:
        if cell.links_torch:
            assert not grid.is_phantom(cell.cuda, cell.torch, cell.python, cell.platform), cell.id
        assert not (cell.cuda == "12.4" and cell.platform == "linux_aarch64"), cell.id
        assert "t" not in cell.python, cell.id
    assert "cc_torch-cu129-torch2.10-py312-win" not in ids        # cu129 windows after 2.9: phantom
    assert not any(i.startswith("natten-") and "-torch2.4-" in i for i in ids)   # natten min_torch 2.5
    assert not any(i.startswith("gsplat_maskgaussian-") and i.endswith("-aarch64") for i in ids)


def test_torch_free_cells_one_per_line_python_platform(plan, ids):
    spconv = [c for c in plan.cells if c.recipe_name == "spconv"]
    assert "spconv-cu128-py312" in ids
    keys = Counter((c.cuda, c.python, c.platform) for c in spconv)
    assert set(keys.values()) == {1}
    cu129_win = [c for c in spconv if c.cuda == "12.9" and c.platform == "windows"]
    assert cu129_win and {c.torch_pin for c in cu129_win} == {"2.9.0"}   # newest cu129 torch with Windows wheels
    for name in ("cumm", "llama_cpp_python"):
        assert all("-torch" not in c.id for c in plan.cells if c.recipe_name == name)


def test_abi3_has_one_cell_per_cuda_torch_platform(plan):
    torchao = [c for c in plan.cells if c.recipe_name == "torchao"]
    assert torchao
    assert set(Counter((c.cuda, c.torch, c.platform) for c in torchao).values()) == {1}


def test_cc_torch_counts(plan):
    counts = Counter(c.platform for c in plan.cells if c.recipe_name == "cc_torch")
    assert counts == {"linux": 139, "windows": 114, "linux_aarch64": 116}


# Written by hand from a reviewed run, not recomputed: any change to the planner shows here.
# nvdiffrast 0.4.0 compiles a per-Python extension (990d596): a default per-torch package since.
EXPECTED_SUMMARY = {
    "cc_torch": (139, 114, 116), "cumm": (33, 29, 29), "gsplat_maskgaussian": (139, 114, 0),
    "llama_cpp_python": (6, 6, 5), "natten": (136, 111, 116), "nunchaku": (136, 111, 116),
    "nvdiffrast": (139, 114, 116), "sageattn3": (57, 47, 53), "spconv": (33, 29, 29), "torchao": (12, 9, 12),
    "vllm": (10, 0, 0), "sageattention": (139, 114, 116), "farm_demo": (139, 114, 116),
}


def test_summary_table_counts():
    out = run_farm("plan", "--format", "table", "--summary")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: tuple(int(x) for x in line.split()[1:4]) for line in out.stdout.splitlines()[1:]}
    for name, counts in EXPECTED_SUMMARY.items():
        assert rows[name] == counts, name
    assert rows["total"] == (5566, 4560, 4536)


def test_shards_partition_the_plan(plan):
    cells = plan.cells
    parts = [in_shard(cells, (i, 8)) for i in range(1, 9)]
    assert sum(len(p) for p in parts) == len(cells)
    assert set().union(*({c.id for c in p} for p in parts)) == {c.id for c in cells}
    assert all(p for p in parts)


def test_adding_a_recipe_moves_no_cell_to_another_shard(tmp_path, plan):
    folder = tmp_path / "recipes"
    shutil.copytree(PROJECT / "recipes", folder)
    text = (folder / "cc_torch.yml").read_text().replace("name: cc_torch", "name: cc_torch_twin")
    (folder / "cc_torch_twin.yml").write_text(text)
    shutil.copytree(folder / "patches" / "cc_torch", folder / "patches" / "cc_torch_twin")   # its farm patch
    bigger = full_plan(recipes=load_recipes(folder))
    before = {c.id: shard_of(c.id, 8) for c in plan.cells}
    after = {c.id: shard_of(c.id, 8) for c in bigger.cells}
    assert len(after) == len(before) + 369
    assert all(after[i] == s for i, s in before.items())


# ---------------------------------------------------------------- build keys

def keys_for(recipes_folder: Path, defaults_folder: Path | None = None) -> dict[str, str]:
    defaults = load_defaults(defaults_folder) if defaults_folder else load_defaults()
    recipes = load_recipes(recipes_folder, defaults=defaults)
    plan = full_plan(defaults=defaults, recipes=recipes)
    maker = KeyMaker(defaults, recipes)
    return {c.id: maker.key(c) for c in plan.cells}


@pytest.fixture(scope="module")
def base_keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("base") / "recipes"
    shutil.copytree(PROJECT / "recipes", folder)
    return folder, keys_for(folder)


def edited_copy(tmp_path, base_folder, name, old, new):
    folder = tmp_path / "recipes"
    shutil.copytree(base_folder, folder)
    path = folder / f"{name}.yml"
    text = path.read_text()
    assert old in text, (name, old)
    path.write_text(text.replace(old, new, 1))
    return folder


def changed(before, after):
    assert before.keys() == after.keys()
    return {i for i in before if before[i] != after[i]}


def test_recipe_change_reopens_that_recipe_and_its_referrers(tmp_path, base_keys):
    folder, before = base_keys
    after = keys_for(edited_copy(tmp_path, folder, "cumesh", "links_torch: true", "links_torch: true\nmax_jobs: 1"))
    packages = {i.split("-cu")[0] for i in changed(before, after)}
    assert packages == {"cumesh", "o_voxel"}     # o_voxel requires cumesh=={VER:cumesh}+{LOCAL}


def test_verify_knob_or_comment_reopens_nothing(tmp_path, base_keys):
    folder, before = base_keys
    after = keys_for(edited_copy(tmp_path, folder, "farm_demo", "verify:", "# a new comment\nverify:\n  skip_import: true"))
    assert changed(before, after) == set()


def test_policy_row_change_reopens_exactly_its_cells(tmp_path, base_keys):
    folder, before = base_keys
    defaults = tmp_path / "defaults"
    shutil.copytree(PROJECT / "defaults", defaults)
    policy = defaults / "arch_policy.yml"
    policy.write_text(policy.read_text().replace('"13.2": "7.5;8.0;8.6;9.0+PTX;10.0;12.0+PTX"',
                                                 '"13.2": "7.5;8.0;8.6;8.9;9.0+PTX;10.0;12.0+PTX"', 1))
    after = keys_for(folder, defaults)
    reopened = changed(before, after)
    plan = full_plan(defaults=load_defaults(defaults), recipes=load_recipes(folder))
    uses_row = {c.id for c in plan.cells if c.arch.provenance == "arch_policy[13.2]"}
    assert reopened == uses_row and uses_row


# ---------------------------------------------------------------- nox

def nox(*args):
    env = {**os.environ, "FARM_CACHE": os.environ.get("FARM_CACHE", str(Path.home() / ".cache" / "farm"))}
    out = subprocess.run([sys.executable, "-m", "nox", *args], cwd=PROJECT, capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.slow
def test_nox_json_ids_equal_plan_ids(ids):
    listed = json.loads(nox("-l", "--json"))
    names = {s["session"] for s in listed if s["session"].startswith("build-")}
    assert names == {f"build-{i}" for i in ids}


@pytest.mark.slow
def test_nox_tags_and_keywords_select(plan):
    cu130 = {line.split()[1] for line in nox("-l", "-t", "cu130").splitlines() if line.startswith("* build-")}
    assert cu130 == {f"build-{c.id}" for c in plan.cells if c.cuda == "13.0"}
    arm = {line.split()[1] for line in nox("-l", "-k", "aarch64").splitlines() if line.startswith("* build-")}
    assert arm == {f"build-{c.id}" for c in plan.cells if c.platform == "linux_aarch64"}


def test_one_cells_plan_derives_only_its_recipes_cells_and_keys_it_as_the_full_plan():
    full = full_plan()
    wanted = next(c for c in full.cells if c.recipe_name == "torch_scatter")
    cell, plan = cell_plan(wanted.id)
    assert cell == wanted and set(plan.recipes) == set(full.recipes)
    assert {c.recipe_name for c in plan.cells} == {"torch_scatter"}
    assert len(plan.cells) == sum(1 for c in full.cells if c.recipe_name == "torch_scatter")
    ctx = BuildContext(runner="host", image="host", plat_tag="")
    assert KeyMaker(plan.defaults, plan.recipes).key(cell, ctx) == KeyMaker(full.defaults, full.recipes).key(wanted, ctx)
    with pytest.raises(BadInput, match="did you mean"):
        cell_plan(wanted.id.replace("torch_scatter", "torch_scater"))
