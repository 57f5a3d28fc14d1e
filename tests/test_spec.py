"""The step spec (farm/build/spec.py): the typed hand-off from `farm build` on the host to the steps.

Every recipe of the project goes through its JSON form and back unchanged; a spec the steps
cannot read is one line and exit 2, before any step starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from farm.build.spec import (
    SCHEMA,
    FarmWheel,
    StallLimit,
    StepPaths,
    StepSpec,
    Target,
    recipe_part,
    source_part,
)
from farm.errors import BadSpec
from farm.floor import Floor
from farm.recipes.plan import cell_plan
from farm.recipes.reader import load_recipes

CELL = "farm_demo-cu130-torch2.13-py311"


def spec_for(recipe, cell, **changes) -> StepSpec:
    fields = dict(
        schema=SCHEMA, cell=cell, recipe=recipe_part(recipe, requires_dist=recipe.requires_dist, max_jobs=2,
                                                     nvcc_threads=1),
        source=source_part(recipe), verify=recipe.verify, paths=StepPaths(Path("/farm/out"), Path("/farm/work")),
        python="/usr/bin/python3.11", target=Target("img123", "x86_64", "2.28", "manylinux_2_28_x86_64"),
        toolkit_source="pypi", plat=None, build_number=3, record={"cell": cell.id, "tier": "full"},
        farm_wheels=(FarmWheel("dep", Path("/farm/work/farm-wheels/dep.whl"), "a" * 64),),
        flags_stop_after_s=None, stall=None, compiler_cache_env={"CCACHE_DISABLE": "1"},
        floor=Floor("manylinux_2_34", "manylinux_2_28", "FARM_MANYLINUX_FLOOR"))
    fields.update(changes)
    return StepSpec(**fields)


def test_every_recipe_goes_through_the_json_form_unchanged():
    cell, _ = cell_plan(CELL)
    recipes = load_recipes()
    for recipe in recipes.values():
        spec = spec_for(recipe, cell)
        assert StepSpec.from_json(spec.to_json()) == spec, recipe.name
    # the typed fields the steps read, not strings to look up
    back = StepSpec.from_json(spec_for(recipes["farm_demo"], cell, flags_stop_after_s=600,
                                       stall=StallLimit(180.0, "recipes/farm_demo.yml timeout: 3")).to_json())
    assert back.cell.arch.arch_list == cell.arch.arch_list and back.cell.local_label == "cu130torch2.13"
    assert back.paths.out == Path("/farm/out") and back.flags_stop_after_s == 600.0
    assert back.stall == StallLimit(180.0, "recipes/farm_demo.yml timeout: 3")
    assert back.farm_wheels[0].file == Path("/farm/work/farm-wheels/dep.whl")
    assert back.floor == Floor("manylinux_2_34", "manylinux_2_28", "FARM_MANYLINUX_FLOOR")   # the gate's floor


def test_the_json_form_is_plain():
    cell, _ = cell_plan(CELL)
    data = json.loads(spec_for(load_recipes()["farm_demo"], cell).to_json())
    assert data["schema"] == SCHEMA
    assert data["cell"]["arch"]["arch_list"] == cell.arch.arch_list.torch()
    assert data["paths"] == {"out": "/farm/out", "work": "/farm/work"}


@pytest.mark.parametrize("edit, line", [
    (lambda d: d["cell"].update(colour="red"), "spec.cell: unknown colour"),
    (lambda d: d["recipe"].pop("max_jobs"), "spec.recipe: missing max_jobs"),
    (lambda d: d["target"].update(glibc=2.28), "spec.target.glibc: expected str, got float"),
    (lambda d: d["farm_wheels"][0].update(sha256=None), "spec.farm_wheels[0].sha256: expected str, got NoneType"),
    (lambda d: d["recipe"].update(max_jobs=True), "spec.recipe.max_jobs: expected int, got bool"),
    (lambda d: d["cell"]["arch"].update(arch_list="8.6 banana"), "build spec"),
    (lambda d: d.update(schema=SCHEMA + 1), f"spec: schema {SCHEMA + 1}, this farm reads schema {SCHEMA}"),
])
def test_a_spec_the_steps_cannot_read_is_one_line(edit, line):
    cell, _ = cell_plan(CELL)
    data = json.loads(spec_for(load_recipes()["farm_demo"], cell).to_json())
    edit(data)
    with pytest.raises(BadSpec) as caught:
        StepSpec.from_json(json.dumps(data))
    assert line in str(caught.value) and "\n" not in str(caught.value)


def test_the_steps_entrypoint_refuses_a_bad_spec_with_exit_2(tmp_path):
    bad = tmp_path / "spec.json"
    bad.write_text(json.dumps({"schema": SCHEMA, "cell": {}}))
    proc = subprocess.run([sys.executable, "-m", "farm.build.steps", "env", "--spec", str(bad)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("farm.build.steps: spec: missing ")
    assert not (tmp_path / "steps.json").exists()
