"""`build_requires_farm` (design.md §4.4, issue 15): a cell builds against the farm's own wheel of another recipe.

A tiny local package `farm_dep` (a wheel made here, published into a temp wheelhouse with `farm publish`)
and a dependent recipe `farm_needs_dep` whose setup.py imports farm_dep at build time and whose module
imports it at import time. One real host-runner build (a plain C extension: seconds of compile on the
cached cu130 / torch 2.13 / Python 3.11 environment); every other case refuses or keys without building.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from farmcli import run_farm
from hostile import assert_one_line_refusal, tree_state
from wheelhouse_fixtures import make_wheel

CELL = "farm_needs_dep-cu130-torch2.13-py311"
DEP_CELL = "farm_dep-cu130-torch2.13-py311"
DEP_WHEEL_TAGS = "cp311-cp311-manylinux_2_34_x86_64"

SETUP = '''
import farm_dep   # build time: only the cell's overlay environment has it (build_requires_farm)
from setuptools import Extension, setup

with open("farm_needs_dep/_built_with.py", "w") as fh:
    fh.write(f"DEP_ANSWER = {farm_dep.ANSWER}\\n")
setup(name="farm_needs_dep", version="0.1.0", packages=["farm_needs_dep"],
      ext_modules=[Extension("farm_needs_dep._ext", ["ext.c"])])
'''
DEP_SETUP = '''
from setuptools import Extension, setup
setup(name="farm_dep", version="0.1.0", packages=["farm_dep"], ext_modules=[Extension("farm_dep._ext", ["ext.c"])])
'''
# getrandom() is GLIBC_2.25: the lowest tag repair finds is the single manylinux_2_25 (an extension that
# needs no newer glibc than 2.5 gets the two-tag set manylinux1.manylinux_2_5, which publish refuses).
EXT_C = '''#include <Python.h>
#include <sys/random.h>
static PyObject *noise(PyObject *self, PyObject *args) {
    unsigned char b = 0;
    return PyLong_FromLong(getrandom(&b, 1, 0));
}
static PyMethodDef methods[] = {{"noise", noise, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit__ext(void) { return PyModule_Create(&mod); }
'''
INIT = "import farm_dep   # import time: the import check must see it too\nfrom ._built_with import DEP_ANSWER\n"
SKIP_ARCH = "  skip_arch: a plain C extension, no CUDA code\n"
COMBOS = "combinations:\n  - {cuda: '13.0', torch: '2.13.0', pythons: ['3.11', '3.12']}\n"


def write_recipes(root: Path, dep_links_torch: bool = True) -> Path:
    """farm_dep and farm_needs_dep (its source a real folder) in a recipes folder of their own."""
    src = root / "needs-dep-src"
    (src / "farm_needs_dep").mkdir(parents=True, exist_ok=True)
    (src / "setup.py").write_text(SETUP)
    (src / "ext.c").write_text(EXT_C)
    (src / "farm_needs_dep" / "__init__.py").write_text(INIT)
    dep_src = root / "dep-src"
    (dep_src / "farm_dep").mkdir(parents=True, exist_ok=True)
    (dep_src / "setup.py").write_text(DEP_SETUP)
    (dep_src / "ext.c").write_text(EXT_C)
    (dep_src / "farm_dep" / "__init__.py").write_text("ANSWER = 41\nfrom ._ext import noise\n")
    recipes = root / "recipes"
    recipes.mkdir(exist_ok=True)
    (recipes / "farm_dep.yml").write_text(
        f"name: farm_dep\nsource:\n  path: {dep_src}\nversion: '0.1.0'\nlinks_torch: {str(dep_links_torch).lower()}\n"
        f"platforms: [linux]\n{COMBOS}max_jobs: 1\nverify:\n  import_names: [farm_dep]\n{SKIP_ARCH}")
    (recipes / "farm_needs_dep.yml").write_text(
        f"name: farm_needs_dep\nsource:\n  path: {src}\nversion: '0.1.0'\nlinks_torch: true\nplatforms: [linux]\n"
        f"{COMBOS}build_requires_farm: [farm_dep]\nmax_jobs: 1\n"
        # farm_needs_dep imports farm_dep at run time, so its wheel must say so (the gate imports it as
        # a user's fresh venv would, design.md §7.7)
        f"requires_dist: [farm_dep]\n"
        f"verify:\n  import_names: [farm_needs_dep]\n{SKIP_ARCH}")
    return recipes


def publish_dep(house: Path, folder: Path, answer: int = 41, tags: str = DEP_WHEEL_TAGS, build: str | None = None,
                label: str = "cu130torch2.13", record: dict | None = None) -> Path:
    """A farm_dep wheel (module farm_dep, ANSWER = answer) published into `house` by the real CLI."""
    wheel = make_wheel(folder, name="farm_dep", version=f"0.1.0+{label}", tags=tags, build=build,
                       payload=f"ANSWER = {answer}\n",
                       metadata_extra="Requires-Dist: farm-test-not-on-any-index\n")   # --no-deps or it fails
    args = ["publish", str(wheel), "--wheelhouse", str(house)]
    if record is not None:
        path = folder / f"{wheel.name}.record.json"
        path.write_text(json.dumps(record))
        args += ["--record", str(path)]
    res = run_farm(*args)
    assert res.returncode == 0, res.stderr
    return wheel


def entries(house: Path) -> list:
    from farm.wheelhouse import read_journal

    return read_journal(house).entries


def keys_of(house: Path, monkeypatch, recipes: Path, *cells: str) -> list[str]:
    """Build keys as `farm build --runner host` computes them against `house`."""
    from farm.build.buildkey import KeyMaker, context_for
    from farm.recipes.plan import cell_plan

    monkeypatch.setenv("FARM_RECIPES", str(recipes))
    out = []
    for cell_id in cells:
        cell, plan = cell_plan(cell_id)
        out.append(KeyMaker(plan.defaults, plan.recipes, wheelhouse=house).key(cell, context_for(cell.platform, "host")))
    return out


# ---------------------------------------------------------------- refused before any work

@pytest.mark.parametrize("house_holds", ["nothing", "another Python's wheel", "another torch's wheel"])
def test_a_missing_dependency_wheel_is_refused_in_one_line_before_any_work(tmp_path, house_holds):
    recipes = write_recipes(tmp_path)
    house, out = tmp_path / "house", tmp_path / "out"
    house.mkdir()
    if house_holds == "another Python's wheel":
        publish_dep(house, tmp_path / "w", tags="cp312-cp312-manylinux_2_34_x86_64")
    elif house_holds == "another torch's wheel":
        publish_dep(house, tmp_path / "w", label="cu130torch2.12")
    before = tree_state(house)
    res = run_farm("build", CELL, "--runner", "host", "--out", str(out), "--wheelhouse", str(house),
                   env={"FARM_RECIPES": str(recipes)})
    line = assert_one_line_refusal(
        res, 2, f"{CELL}: needs farm_dep's wheel for cu130/torch2.13/py3.11/linux in {house}: "
                f"build it first (farm build {DEP_CELL})")
    assert line.startswith("farm: ")
    assert tree_state(house) == before and not out.exists()


def test_a_torch_free_dependency_is_looked_up_by_its_cuda_line_wheel(tmp_path, monkeypatch):
    from farm.build.farmdeps import farm_wheels
    from farm.recipes.plan import cell_plan

    recipes = write_recipes(tmp_path, dep_links_torch=False)
    house = tmp_path / "house"
    publish_dep(house, tmp_path / "a", label="cu130torch2.13")          # a torch-linked build: not it
    publish_dep(house, tmp_path / "b", label="cu130", tags="cp312-cp312-manylinux_2_34_x86_64")   # other Python
    monkeypatch.setenv("FARM_RECIPES", str(recipes))
    cell, plan = cell_plan(CELL)
    [missing] = farm_wheels(cell, plan.recipes, entries(house))
    assert missing.entry is None and missing.cell == "farm_dep-cu130-py311" and missing.coords == "cu130/py3.11/linux"
    publish_dep(house, tmp_path / "c", label="cu130")
    publish_dep(house, tmp_path / "d", label="cu130", build="1", answer=42)   # a rebuild: the newest wins
    [found] = farm_wheels(cell, plan.recipes, entries(house))
    assert found.entry.file == "farm_dep-0.1.0+cu130-1-cp311-cp311-manylinux_2_34_x86_64.whl"
    assert found.sha256 == next(e.sha256 for e in entries(house) if e.file == found.entry.file)


# ---------------------------------------------------------------- keys

def test_the_build_key_follows_the_dependency_wheel_and_only_the_dependents(tmp_path, monkeypatch):
    recipes = write_recipes(tmp_path)
    house = tmp_path / "house"
    publish_dep(house, tmp_path / "a")
    first, dep_first = keys_of(house, monkeypatch, recipes, CELL, DEP_CELL)
    assert keys_of(house, monkeypatch, recipes, CELL) == [first]                  # stable
    publish_dep(house, tmp_path / "other", tags="cp312-cp312-manylinux_2_34_x86_64", answer=7)
    assert keys_of(house, monkeypatch, recipes, CELL) == [first]                  # another Python's wheel: same
    publish_dep(house, tmp_path / "b", build="1", answer=42)                      # the dependency rebuilt
    second, dep_second = keys_of(house, monkeypatch, recipes, CELL, DEP_CELL)
    assert second != first
    assert dep_second == dep_first                    # a cell without build_requires_farm keys as before


def test_a_run_reopens_the_dependents_of_a_dependency_it_rebuilds(tmp_path, monkeypatch):
    """Both cells published with their current keys: nothing to do. The dependency's recipe changes: the
    run rebuilds it and, after it, the dependent, although the dependent's key (keyed with the wheel the
    house holds now) is served."""
    recipes = write_recipes(tmp_path)
    house = tmp_path / "house"
    [dep_key] = keys_of(house, monkeypatch, recipes, DEP_CELL)
    publish_dep(house, tmp_path / "a", record={"cell": DEP_CELL, "build_key": dep_key})
    [key] = keys_of(house, monkeypatch, recipes, CELL)
    mine = make_wheel(tmp_path / "mine", name="farm_needs_dep", version="0.1.0+cu130torch2.13", tags=DEP_WHEEL_TAGS)
    (tmp_path / "mine.json").write_text(json.dumps({"cell": CELL, "build_key": key}))
    assert run_farm("publish", str(mine), "--wheelhouse", str(house), "--record", str(tmp_path / "mine.json")).returncode == 0

    def would_build() -> list[str]:
        res = run_farm("run", "--plain", "--dry-run", "--runner", "host", "--package", "farm_needs_dep",
                       "--python", "3.11", "--wheelhouse", str(house), env={"FARM_RECIPES": str(recipes)})
        assert res.returncode == 0, res.stderr
        return [ln.split()[4] for ln in res.stdout.splitlines() if ln.startswith("[farm run] would build")]

    assert would_build() == []
    with open(recipes / "farm_dep.yml", "a") as fh:   # the dependency's recipe changes: its key does
        fh.write("env:\n  FARM_TEST_CHANGED: '1'\n")
    assert keys_of(house, monkeypatch, recipes, CELL) == [key]   # its wheel is still the one keyed
    assert would_build() == [DEP_CELL, CELL]


# ---------------------------------------------------------------- the real builds

@pytest.mark.slow
def test_a_run_builds_the_dependency_then_the_dependent_against_its_published_wheel(tmp_path):
    """One `farm run` on the host runner, an empty wheelhouse: farm_dep is pulled in and published first,
    then farm_needs_dep is keyed and built against that wheel: its setup.py and its import check import
    it. Two plain C files: seconds of compile on the cached cu130 / torch 2.13 / Python 3.11 environment."""
    recipes = write_recipes(tmp_path)
    house, build = tmp_path / "house", tmp_path / "build"
    env = {"FARM_RECIPES": str(recipes)}
    args = ("run", "--plain", "--runner", "host", "--package", "farm_needs_dep", "--cuda", "13.0", "--torch", "2.13",
            "--python", "3.11", "--platform", "linux", "--jobs", "2", "--wheelhouse", str(house),
            "--build-dir", str(build))
    res = run_farm(*args, env=env, timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr

    cells = {c["id"]: c for c in json.loads((house / "runs" / "latest.json").read_text())["cells"]}
    assert (cells[DEP_CELL]["status"], cells[CELL]["status"]) == ("built", "built")
    assert cells[DEP_CELL]["pulled_in"] and cells[DEP_CELL]["finished"] <= cells[CELL]["started"]
    [dep] = [e for e in entries(house) if e.cell == DEP_CELL]
    [mine] = [e for e in entries(house) if e.cell == CELL]
    out = build / CELL
    record = json.loads((out / "build.json").read_text())
    assert record["build_requires_farm"] == [{"recipe": "farm_dep", "cell": DEP_CELL, "file": dep.file,
                                              "sha256": dep.sha256, "build_key": dep.build_key}]
    assert mine.build_key == record["build_key"] == cells[CELL]["build_key"]   # keyed after farm_dep published
    with zipfile.ZipFile(house / "files" / mine.project / mine.file) as zf:
        assert zf.read("farm_needs_dep/_built_with.py") == b"DEP_ANSWER = 41\n"   # setup.py imported farm_dep
        info = json.loads(zf.read("farm_needs_dep-0.1.0+cu130torch2.13.dist-info/farm_build.json"))
    assert info["build_requires_farm"][0]["sha256"] == dep.sha256
    report = json.loads((out / "verify.json").read_text())
    [imp] = [c for c in report["checks"] if c["name"] == "import"]
    assert imp["status"] == "pass", imp
    assert {"farm_needs_dep", "farm_needs_dep._ext"} <= set(imp["details"]["modules"])
    env_state = json.loads((out / "steps.json").read_text())["env"]
    assert any(p.replace("-", "_") == "farm_dep==0.1.0+cu130torch2.13" for p in env_state["overlay"]["pins"])
    base_python = Path(env_state["base"]["python"])   # what the build would have had without the overlay
    assert subprocess.run([str(base_python), "-c", "import farm_dep"], capture_output=True).returncode != 0

    again = run_farm(*args, env=env)   # the dependent's key, with farm_dep's wheel in it, is served
    assert again.returncode == 0, again.stderr
    assert "1 cell: 1 already in the wheelhouse (not rebuilt)" in again.stdout, again.stdout
    assert [e.file for e in entries(house)] == [dep.file, mine.file]
