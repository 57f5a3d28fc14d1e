"""The status cell of a recipe (farm/recipes/status.py `status_cell_id`): cu130 / torch 2.13 /
Python 3.12 / linux, or, for a recipe whose own rows stop before torch 2.13 on CUDA 13.0, its
newest CUDA 13.0 torch, so that the status table and `farm recipes block` name a cell the real
`farm plan --package` lists."""

from __future__ import annotations

import json

import pytest
from farmcli import run_farm

from farm.policy import load_defaults
from farm.recipes.reader import load_recipe
from farm.recipes.status import status_cell_id

HEAD = "name: {name}\nlinks_torch: {links}\nsource:\n  git:\n    url: https://github.com/example/{name}.git\n" \
       "    ref: v1.0.0\n"

# name -> (recipe body after the head, links_torch, the status cell it must get)
RECIPES = {
    "plain": ("", "true", "plain-cu130-torch2.13-py312"),
    "capped": ("max_torch: '2.12'\n", "true", "capped-cu130-torch2.12-py312"),
    "stops": ("combinations:\n"
              "- {cuda: '13.0', torch: '2.10.0', pythons: ['3.11', '3.12']}\n"
              "- {cuda: '13.0', torch: '2.11.0', pythons: ['3.11', '3.12', '3.13']}\n"
              "- {cuda: '12.9', torch: '2.13.0', pythons: ['3.12']}\n", "true", "stops-cu130-torch2.11-py312"),
    "nopy312": ("combinations:\n- {cuda: '13.0', torch: '2.11.0', pythons: ['3.11', '3.13']}\n", "true",
                "nopy312-cu130-torch2.11-py313"),
    "free": ("max_torch: '2.11'\n", "false", "free-cu130-py312"),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("recipes")
    for name, (body, links, _) in RECIPES.items():
        (out / f"{name}.yml").write_text(HEAD.format(name=name, links=links) + body)
    return out


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_status_cell_is_one_the_plan_lists(folder, name):
    expected = RECIPES[name][2]
    got = status_cell_id(load_recipe(folder / f"{name}.yml", load_defaults()))
    assert got == expected
    res = run_farm("plan", "--package", name, "--format", "json", env={"FARM_RECIPES": str(folder)}, timeout=120)
    assert res.returncode == 0, res.stderr
    ids = {c["id"] for c in json.loads(res.stdout)}
    assert got in ids, sorted(i for i in ids if "-cu130-" in i)
    # the fallback is taken only when the plan really lacks the usual cell
    usual = f"{name}-cu130-torch2.13-py312" if RECIPES[name][1] == "true" else f"{name}-cu130-py312"
    assert (usual in ids) == (got == usual)


def test_the_table_and_a_block_record_name_the_recipes_own_cell(folder, tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    env = {"FARM_RECIPES": str(folder)}
    res = run_farm("recipes", "block", "stops", "--why", "waiting for a patch", "--records", str(records),
                   env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads((records / "stops.json").read_text())["cell"] == "stops-cu130-torch2.11-py312"
    (records / "stops.json").unlink()
    out = tmp_path / "status.md"
    res = run_farm("recipes", "status", "--records", str(records), "--out", str(out), env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = {line.split(" | ")[0].strip("| "): line for line in out.read_text().splitlines() if line.startswith("| ")}
    assert "| nopy312-cu130-torch2.11-py313 |" in rows["nopy312"] and "not built yet" in rows["nopy312"]
    assert "| stops-cu130-torch2.11-py312 |" in rows["stops"]
    assert "| plain-cu130-torch2.13-py312 |" in rows["plain"]


@pytest.mark.parametrize("args, key", [(["--arch", "9.0a"], "--arch"), (["--tier", "flags", "--arch", "9.0a"], "--arch"),
                                       (["--tier", "smoke", "--for", "5"], "--for")])
def test_rebuild_refuses_a_knob_of_another_tier_before_building(folder, args, key):
    res = run_farm("recipes", "rebuild", "plain", *args, env={"FARM_RECIPES": str(folder)}, timeout=120)
    assert res.returncode == 2 and res.stdout == "", res
    (line,) = res.stderr.strip().splitlines()
    assert key in line and "farm recipes rebuild" in line
