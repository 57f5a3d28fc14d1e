"""A recipe's timeout catches a hung build, not a slow one (design.md §6.4): the compile is killed when it
makes no progress for the limit; lock waits and the other steps do not count; emulated cells get x9.

Real processes throughout: a PEP 517 backend of the test's own that prints ninja's `[n/N]` lines and
sleeps, run by the compile step's frontend, and one `farm build --runner host` of a recipe built on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from farmcli import PROJECT

from farm.build.compile import compile_wheel
from farm.errors import BadInput, CompileStalled

# build_wheel prints `[i/N] ...` lines PAUSE seconds apart, then sleeps HANG seconds, then writes its wheel.
BACKEND = '''
import os, time, zipfile

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    for i in range(1, STEPS + 1):
        print(f"[{i}/5] nvcc -c csrc/k{i}.cu -o k{i}.o", flush=True)
        time.sleep(PAUSE)
    time.sleep(HANG)
    name = "stall_probe-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        z.writestr("stall_probe/__init__.py", "")
        z.writestr("stall_probe-0.1.0.dist-info/METADATA", "Metadata-Version: 2.1\\nName: stall_probe\\nVersion: 0.1.0\\n")
        z.writestr("stall_probe-0.1.0.dist-info/WHEEL",
                   "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        z.writestr("stall_probe-0.1.0.dist-info/RECORD", "")
    return name
'''


def source(folder: Path, steps: int, pause: float, hang: float) -> Path:
    src = folder / "stall_probe"
    (src / "backend").mkdir(parents=True)
    (src / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "stallbackend"\n'
                                        'backend-path = ["backend"]\n')
    (src / "backend" / "stallbackend.py").write_text(
        f"STEPS, PAUSE, HANG = {steps}, {pause}, {hang}\n" + BACKEND)
    return src


def test_a_compile_that_keeps_making_progress_is_never_killed(tmp_path):
    """Five objects 0.8 s apart: 4 s in all, twice the 2 s limit, and never 2 s without a line."""
    src = source(tmp_path, steps=5, pause=0.8, hang=0)
    t0 = time.monotonic()
    wheel = compile_wheel(src, sys.executable, {"PATH": os.environ["PATH"]}, tmp_path / "out", tmp_path / "c.log",
                          stall=2.0)
    assert wheel is not None and wheel.name == "stall_probe-0.1.0-py3-none-any.whl"
    assert time.monotonic() - t0 > 4.0   # it ran past the limit, as a whole, and lived


def test_a_compile_with_no_progress_for_the_limit_is_killed(tmp_path):
    src = source(tmp_path, steps=2, pause=0, hang=300)
    t0 = time.monotonic()
    with pytest.raises(CompileStalled):
        compile_wheel(src, sys.executable, {"PATH": os.environ["PATH"]}, tmp_path / "out", tmp_path / "c.log",
                      stall=1.5)
    assert time.monotonic() - t0 < 30
    assert "# killed after" in (tmp_path / "c.log").read_text()
    assert not list((tmp_path / "out").glob("*.whl"))


def test_the_limit_is_the_recipes_timeout_times_the_emulation_factor(monkeypatch):
    from farm.build.stall import stall_limit
    from farm.recipes.reader import load_recipes
    from farm.runners.emulation import EMULATION_FACTOR

    monkeypatch.delenv("FARM_STALL_MINUTES", raising=False)
    recipe = load_recipes()["cc_torch"]
    native = stall_limit(recipe, "linux")
    assert native is not None and native.seconds == recipe.timeout * 60
    assert native.why == f"recipes/cc_torch.yml timeout: {recipe.timeout}"
    emulated = stall_limit(recipe, "linux_aarch64")   # this host is x86_64: the aarch64 lane runs under QEMU
    assert emulated is not None and emulated.seconds == recipe.timeout * 60 * EMULATION_FACTOR
    assert emulated.why == f"recipes/cc_torch.yml timeout: {recipe.timeout}, x{EMULATION_FACTOR} emulated"
    monkeypatch.setenv("FARM_STALL_MINUTES", "0.5")
    assert stall_limit(recipe, "linux").seconds == 30 and stall_limit(recipe, "linux").why == "FARM_STALL_MINUTES=0.5"
    for bad in ("0", "-5", "nan", "inf", "soon"):
        monkeypatch.setenv("FARM_STALL_MINUTES", bad)
        with pytest.raises(BadInput):
            stall_limit(recipe, "linux")


LIMIT_MINUTES = 0.04   # 2.4 s


def recipe_folder(tmp_path: Path, name: str, src: Path, extra: str = "") -> Path:
    """A recipes folder holding one recipe `name` built from `src` (timeout 1 min: the old wall budget)."""
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / f"{name}.yml").write_text(
        f"name: {name}\nsource:\n  path: {src}\nversion: '0.1.0'\nlinks_torch: true\nplatforms: [linux]\n"
        f"min_torch: '2.13'\ntimeout: 1\n{extra}")
    return recipes


def build_command(cell: str, recipes: Path, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """`farm build <cell>` on the host runner, out to tmp_path/out, with the test's small limit."""
    argv = [sys.executable, "-m", "farm", "build", cell, "--runner", "host", "--no-publish", "--no-compiler-cache",
            "--out", str(tmp_path / "out")]
    return argv, {**os.environ, "FARM_RECIPES": str(recipes), "FARM_STALL_MINUTES": str(LIMIT_MINUTES),
                  "FARM_WHEELHOUSE": str(tmp_path / "house")}


def _private_env_lock(recipes: Path, cell_id: str, cache: Path, monkeypatch) -> Path:
    """The lock of the base torch environment the cell's env step takes, in a cache folder of this test's own.

    The machine's environment is made ready first (a shared lease, as any build takes). `cache` then links every
    entry of the machine's cache except `envs`, where only that environment is linked: its lock file is the
    test's alone, so holding it exclusively waits for no other build's lease and blocks none of them."""
    from farm.build.environments import (
        EnvRequest,
        base_environment,
        base_key,
        download_environment,
        python_version,
    )
    from farm.cachebudget import lock_file
    from farm.recipes.plan import cell_plan
    from farm.runners.host import HostRunner
    from farm.settings import cache_dir

    monkeypatch.setenv("FARM_RECIPES", str(recipes))
    cell, _ = cell_plan(cell_id)
    runner = HostRunner()
    req = EnvRequest(cell.python, cell.torch_pin, cell.cuda, cell.platform, runner.describe()["glibc"])
    python = runner.python(cell.python)[0]
    download_environment(req)
    env = base_environment(req, python)
    shared = cache_dir()
    (cache / "envs").mkdir(parents=True)
    for entry in shared.iterdir():
        if entry.name not in ("envs", "work", "engine-cwd"):
            (cache / entry.name).symlink_to(entry)
    own = cache / "envs" / base_key(req, "host", python_version(Path(python)))
    own.symlink_to(env.path)
    return lock_file(own)


def _events(out: Path, step: str, kind: str) -> list[dict]:
    try:
        lines = (out / "progress.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [e for e in map(json.loads, lines) if e.get("step") == step and e.get("kind") == kind]


@pytest.mark.slow
def test_a_hung_build_is_killed_at_its_compile_naming_the_limit_and_a_lock_wait_does_not_count(tmp_path,
                                                                                               monkeypatch):
    """The env step waits on the environment's lock (held by this test, as by a build creating it)
    for three times the limit and goes on; the compile then prints two objects and hangs, and is killed
    after the limit with one line naming it, where it comes from and the progress reached."""
    from farm.cachebudget import flocked

    recipes = recipe_folder(tmp_path, "stall_probe", source(tmp_path, steps=2, pause=0, hang=600))
    cell = "stall_probe-cu130-torch2.13-py311"
    out = tmp_path / "out"
    cache = tmp_path / "cache"
    lock = _private_env_lock(recipes, cell, cache, monkeypatch)
    argv, env = build_command(cell, recipes, tmp_path)
    env.update(FARM_CACHE=str(cache), FARM_CACHE_BUDGET_GB="100000")   # never evict through the links
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with flocked(lock):
            held.set()
            release.wait(600)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(30), "could not take the environment's lock"
    proc = subprocess.Popen(argv, cwd=PROJECT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not _events(out, "env", "start") and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _events(out, "env", "start"), "the build never reached its env step"
        time.sleep(3 * LIMIT_MINUTES * 60)   # the wait itself is what is measured: three limits long
        assert proc.poll() is None, "the build ended while waiting on the lock"
        release.set()
        _, err = proc.communicate(timeout=600)
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 1 and len(lines) == 1, err
    assert (f"{cell}: compile: timed out: no progress for 2.4 s (limit from FARM_STALL_MINUTES={LIMIT_MINUTES}); "
            "last: 2/5 objects (csrc/k2.cu)") in lines[0], lines[0]
    (env_end,) = _events(out, "env", "end")
    assert env_end["seconds"] >= 3 * LIMIT_MINUTES * 60   # the lock wait, longer than the limit, did not count
    assert not list(out.rglob("*.whl"))


@pytest.mark.slow
def test_a_silent_pre_build_is_killed_naming_its_last_output(tmp_path):
    """pre_build runs the recipe's own commands too (a git clone, a download script): silent for the limit, it
    is killed with its last output line, where before it held the run until the wall budget."""
    recipes = recipe_folder(tmp_path, "stall_pre", source(tmp_path, steps=1, pause=0, hang=0),
                            "pre_build: |\n  echo fetching third_party\n  sleep 600\n")
    argv, env = build_command("stall_pre-cu130-torch2.13-py311", recipes, tmp_path)
    t0 = time.monotonic()
    res = subprocess.run(argv, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert (f"prebuild: timed out: no output for 2.4 s (limit from FARM_STALL_MINUTES={LIMIT_MINUTES}); "
            "last: fetching third_party") in lines[0], lines[0]
    assert time.monotonic() - t0 < 300
