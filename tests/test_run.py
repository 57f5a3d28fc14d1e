"""`farm run` end to end (issue 8), with real builds of the bundled demo (cu130 / torch 2.13, real nvcc,
the default runner: podman when it answers), a deliberately broken copy of it, and the shared compiler
cache that keeps repeats fast.

One module-scoped wheelhouse serves the first-run / second-run tests; the interrupt test and the
memory tests use houses of their own but reuse the ccache group, the torch environments and the
toolkit from the shared cache, so after the first cold compile each build is seconds of compile.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from farmcli import PROJECT, run_farm
from owned import containers_mounting, processes_mentioning

from farm.runners.engine import default_limits, ensure_engine

DEMO = PROJECT / "examples" / "farm-demo"
PY311, PY312 = "farm_demo-cu130-torch2.13-py311", "farm_demo-cu130-torch2.13-py312"
BROKEN = "farm_broken-cu130-torch2.13-py311"
SELECT = ("--cuda", "13.0", "--torch", "2.13", "--python", "3.11", "--python", "3.12", "--platform", "linux")


def demo_recipe(folder: Path, extra: str = "") -> None:
    text = (PROJECT / "recipes" / "farm_demo.yml").read_text().replace("../examples/farm-demo", str(DEMO))
    (folder / "farm_demo.yml").write_text(text + extra)


def broken_recipe(folder: Path, source: Path, name: str = "farm_broken", extra: str = "") -> None:
    """A copy of farm_demo whose every source file starts with #error: the compile itself fails."""
    if not source.exists():
        shutil.copytree(DEMO, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        for f in (source / "csrc").glob("*.c*"):
            f.write_text('#error "farm test: this source is deliberately broken"\n' + f.read_text())
    (folder / f"{name}.yml").write_text(
        f"name: {name}\nsource:\n  path: {source}\nlinks_torch: true\nplatforms: [linux]\n"
        "combinations:\n  - {cuda: '13.0', torch: '2.13.0', pythons: ['3.11']}\n"
        "max_jobs: 2\npeak_gb_per_job: 2\nverify:\n  import_names: [farm_demo]\n" + extra)


def farm_run(env: dict, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    return run_farm("run", "--plain", *args, env=env, timeout=timeout)


def report(house: Path) -> dict:
    return json.loads((house / "runs" / "latest.json").read_text())


def cells_of(rep: dict) -> dict[str, dict]:
    return {c["id"]: c for c in rep["cells"]}


def manifest(house: Path) -> list[dict]:
    path = house / "manifest.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wheel_stat(house: Path, cell: str) -> tuple[int, int]:
    entry = next(e for e in manifest(house) if e["cell"] == cell)
    st = (house / "files" / entry["project"] / entry["file"]).stat()
    return st.st_ino, st.st_mtime_ns


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    root = tmp_path_factory.mktemp("farm-run")
    recipes = root / "recipes"
    recipes.mkdir()
    demo_recipe(recipes)
    broken_recipe(recipes, root / "broken-src")
    env = {"FARM_RECIPES": str(recipes)}
    return root, env


@pytest.fixture(scope="module")
def first_run(farm):
    root, env = farm
    house, build = root / "house", root / "build"
    t0 = time.monotonic()
    res = farm_run(env, "--jobs", "2", "--wheelhouse", str(house), "--build-dir", str(build),
                   "--package", "farm_demo", "--package", "farm_broken", *SELECT)
    return res, house, build, time.monotonic() - t0


# ---------------------------------------------------------------- the acceptance run

@pytest.mark.slow
def test_first_run_publishes_the_good_cells_reports_the_broken_one_and_exits_nonzero(first_run):
    res, house, build, _ = first_run
    assert res.returncode == 1, res.stdout + res.stderr
    published = {e["cell"]: e for e in manifest(house)}
    assert set(published) == {PY311, PY312}
    assert all(e["build_key"] for e in published.values())
    rep = report(house)
    cells = cells_of(rep)
    assert rep["exit_code"] == 1 and rep["counts"] == {"built": 2, "failed": 1}
    broken = cells[BROKEN]
    assert broken["status"] == "failed" and broken["wheel"] is None
    assert "deliberately broken" in broken["excerpt"] and "error" in broken["message"]
    log = house / "runs" / broken["log_link"]
    assert log.is_file() and "deliberately broken" in log.read_text()
    for cell in (PY311, PY312):
        c = cells[cell]
        assert c["status"] == "built" and Path(c["wheel"]).name == published[cell]["file"]
        assert c["duration"] > 0 and c["peak_process_mb"] > 0 and c["max_jobs"] == 2
        # the compile's CPU seconds, from its processes' rusage: nvcc and gcc ran, so more than nothing
        assert 0 < c["compile_cpu_s"] < c["duration"] * (os.cpu_count() or 1), c
        assert c["compiler_cache"]["enabled"] and c["compiler_cache"]["active"]
    page = (house / "runs" / "latest.html").read_text()
    assert BROKEN in page and "deliberately broken" in page and 'class="failed"' in page
    # the summary table and the final counts are printed
    assert re.search(rf"{BROKEN}\s+failed", res.stdout) and re.search(rf"{PY312}\s+built", res.stdout)
    assert "3 cells: 2 built, 1 failed in " in res.stdout


@pytest.mark.slow
def test_build_record_says_what_the_compiler_cache_did(first_run):
    _, house, build, _ = first_run
    record = json.loads((build / PY311 / "build.json").read_text())
    cache = record["compiler_cache"]
    assert cache["enabled"] and cache["group"] == "cu130-torch2.13"
    assert cache["nvcc"].startswith("PYTORCH_NVCC=ccache") and cache["torch_wrapper"].startswith("off")
    files = cache["stats"]["files"]
    assert sorted(Path(f).name for f in files) == ["binding.cpp", "elementwise.cu", "reduce.cu"]
    steps = json.loads((build / PY311 / "steps.json").read_text())
    env = steps["compile"]["env"]
    assert env["PYTORCH_NVCC"].startswith("ccache /") and env["PYTORCH_NVCC"].endswith("/bin/nvcc")
    assert env["CCACHE_DIR"].endswith("/ccache/cu130-torch2.13") and env["CCACHE_NOHASHDIR"] == "1"
    # C++ goes through the farm's own $CXX script, whatever the torch (binding.cpp above is its lookup)
    assert env["TORCH_NO_COMPILER_WRAPPER"] == "1" and env["CXX"].endswith("/ccache-bin/g++"), env
    # torch is imported through the work folder's link, so its header paths are the same for every Python
    assert env["PYTHONPATH"].split(os.pathsep)[0].endswith("/torch-site")


@pytest.mark.slow
def test_second_run_builds_nothing_and_exits_zero_in_under_3_s(first_run, farm):
    _, house, build, _ = first_run
    _, env = farm
    before = {c: wheel_stat(house, c) for c in (PY311, PY312)}
    t0 = time.monotonic()
    res = farm_run(env, "--wheelhouse", str(house), "--build-dir", str(build), "--package", "farm_demo", *SELECT)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    assert elapsed < 3.0, f"{elapsed:.2f}s"
    assert "2 cells: 2 already in the wheelhouse (not rebuilt) in " in res.stdout
    assert {c: wheel_stat(house, c) for c in (PY311, PY312)} == before
    assert report(house)["counts"] == {"skipped": 2}


@pytest.mark.slow
def test_a_failing_cell_is_tried_again_on_the_next_run(first_run, farm):
    """Only a published build key finishes a cell: the broken cell is not remembered as done."""
    _, house, build, _ = first_run
    _, env = farm
    res = farm_run(env, "--wheelhouse", str(house), "--build-dir", str(build), "--package", "farm_broken", *SELECT)
    assert res.returncode == 1
    assert cells_of(report(house))[BROKEN]["status"] == "failed"


# ---------------------------------------------------------------- interrupt and resume

def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


HOLD = """\
# farm test: the first Python 3.12 build of this tree stops here until the run is interrupted. The
# 'once' marker lives in the compiler cache folder (mounted, and kept between builds) so the restart
# goes through; 'held' in the cell's build folder tells the test that the compile step is running.
import os as _os, sys as _sys, time as _time
if _sys.version_info[:2] == (3, 12):
    _once = _os.path.join(_os.environ["CCACHE_DIR"], {marker!r})
    if not _os.path.exists(_once):
        open(_once, "w").close()
        open(_os.path.join(_os.path.dirname(_os.environ["CCACHE_STATSLOG"]), "held"), "w").close()
        _time.sleep(600)
"""


def assert_report_agrees_with_manifest(house: Path) -> dict[str, dict]:
    """Every cell the run report calls built has its build key in the manifest, and no other does."""
    served = {e["build_key"]: e for e in manifest(house)}
    cells = cells_of(report(house))
    for cell_id, c in cells.items():
        published = c["build_key"] in served
        assert published == (c["status"] in ("built", "skipped")), (cell_id, c["status"], published)
        if c["status"] == "built":
            assert Path(c["wheel"]).name == served[c["build_key"]]["file"]
    return cells


@pytest.mark.slow
def test_sigint_mid_run_then_restart_rebuilds_only_the_interrupted_cell(tmp_path):
    """The py312 cell is interrupted while its compile step runs (it waits on an event, not a timer):
    the report and the manifest agree, nothing of the cell is left running, the restart builds only it."""
    from farm.build.ccache import group_dir

    src, recipes = tmp_path / "held-src", tmp_path / "recipes"
    shutil.copytree(DEMO, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    marker = f"farm-test-hold-{os.getpid()}-{time.time_ns()}"
    (src / "setup.py").write_text(HOLD.format(marker=marker) + (src / "setup.py").read_text())
    recipes.mkdir()
    (recipes / "farm_demo.yml").write_text(
        (PROJECT / "recipes" / "farm_demo.yml").read_text().replace("../examples/farm-demo", str(src)))
    env = {"FARM_RECIPES": str(recipes)}
    house, build = tmp_path / "house", tmp_path / "build"
    argv = [sys.executable, "-m", "farm", "run", "--plain", "--jobs", "1", "--wheelhouse", str(house),
            "--build-dir", str(build), "--package", "farm_demo", *SELECT]
    out = tmp_path / "run1.out"
    once = group_dir("13.0", "2.13", True) / marker
    try:
        with open(out, "w") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=PROJECT)
        try:
            _wait_for(lambda: (build / PY312 / "held").exists() or proc.poll() is not None, 1800,
                      "the py312 compile step to start")
            assert proc.poll() is None, out.read_text()
            assert [e["cell"] for e in manifest(house)] == [PY311]
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        text = out.read_text()
        assert code == 130, text
        cells = assert_report_agrees_with_manifest(house)
        assert cells[PY312]["status"] == "interrupted" and cells[PY311]["status"] == "built"
        assert report(house)["exit_code"] == 130
        # only this run's: its build folder is in every step's command line and mounted into every container
        assert not processes_mentioning(str(build / PY312)), "a step of the interrupted cell still runs"
        assert not containers_mounting(build / PY312), "a container of the interrupted cell is left"
        assert not processes_mentioning(f"--child {PY312}", str(build))
        assert [e["cell"] for e in manifest(house)] == [PY311]
        finished = wheel_stat(house, PY311)

        res = farm_run(env, "--jobs", "1", "--wheelhouse", str(house), "--build-dir", str(build),
                       "--package", "farm_demo", *SELECT)
        assert res.returncode == 0, res.stdout + res.stderr
        cells = assert_report_agrees_with_manifest(house)
        assert report(house)["skipped"] == [PY311] and cells[PY312]["status"] == "built"
        # the resumed run's last count says outright that the finished cell was left alone
        assert "2 cells: 1 already in the wheelhouse (not rebuilt), 1 built in " in res.stdout, res.stdout
        assert wheel_stat(house, PY311) == finished                  # same inode, same mtime: untouched
        assert sorted(e["cell"] for e in manifest(house)) == [PY311, PY312]
    finally:
        once.unlink(missing_ok=True)


def test_an_interrupted_cell_whose_wheel_was_published_is_reported_built(tmp_path):
    """The race of a Ctrl-C: the child published, then took the signal before it reported. The run's
    record must follow the manifest (the next run skips that cell), not the child's exit."""
    from wheelhouse_fixtures import make_wheel

    from farm.run.farmrun import reconcile_with_wheelhouse
    from farm.run.selection import CellRun
    from farm.wheelhouse import publish

    house = tmp_path / "house"
    wheel = make_wheel(tmp_path / "dist", "drtk", "0.1.0+cu128torch2.8")
    publish([wheel], house, record={"cell": "drtk-cu128-torch2.8-py311", "build_key": "k-published"})
    landed = CellRun("drtk-cu128-torch2.8-py311", "drtk", "linux", "k-published", status="interrupted",
                     excerpt="KeyboardInterrupt")
    lost = CellRun("drtk-cu128-torch2.8-py312", "drtk", "linux", "k-lost", status="interrupted")
    waiting = CellRun("drtk-cu128-torch2.8-py313", "drtk", "linux", "k-later", status="not-started")
    assert reconcile_with_wheelhouse([landed, lost, waiting], house) == [landed]
    assert landed.status == "built" and landed.excerpt is None
    assert Path(landed.wheel) == house / "files" / "drtk" / wheel.name and Path(landed.wheel).is_file()
    assert (lost.status, waiting.status) == ("interrupted", "not-started")


# ---------------------------------------------------------------- memory admission and OOM

@pytest.mark.slow
def test_memory_admission_clamps_max_jobs_records_it_and_keeps_every_arch(farm, tmp_path):
    _, env = farm
    house, build = tmp_path / "house", tmp_path / "build"
    # farm_demo: max_jobs 2 x peak_gb_per_job 2 = 4 GB; a 3 GB budget admits one job. The container
    # runner, named, so that the opening line must name its memory limit, the cap each build has too.
    ensure_engine()
    res = farm_run(env, "--runner", "container", "--mem-budget", "3", "--wheelhouse", str(house),
                   "--build-dir", str(build), "--package", "farm_demo", "--cuda", "13.0", "--torch", "2.13",
                   "--python", "3.11", "--platform", "linux")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "clamped" in res.stdout
    assert f"memory budget 3.0 GB, at most {default_limits().memory_gb:g} GB per build container" in res.stdout
    record = json.loads((build / PY311 / "build.json").read_text())
    assert record["max_jobs"] == 1 and record["max_jobs_recipe"] == 2
    assert "memory admission" in record["max_jobs_clamp"]
    assert record["arch_list"] == "7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX"     # never fewer archs
    steps = json.loads((build / PY311 / "steps.json").read_text())
    assert steps["compile"]["env"]["MAX_JOBS"] == "1"
    assert cells_of(report(house))[PY311]["max_jobs_clamp"] == record["max_jobs_clamp"]


OOM_SETUP = '''\
"""Kills the farm's step process with SIGKILL, as the kernel's OOM killer would (the test says so)."""
import os
import signal

with open({log!r}, "a") as fh:
    fh.write(os.environ.get("MAX_JOBS", "?") + "\\n")
pid = os.getppid()
while pid > 1:
    with open(f"/proc/{{pid}}/cmdline", "rb") as fh:
        if b"farm.build.steps" in fh.read():
            os.kill(pid, signal.SIGKILL)
            break
    with open(f"/proc/{{pid}}/stat") as fh:
        pid = int(fh.read().rsplit(")", 1)[1].split()[1])
raise SystemExit("the step process was not found")
'''


@pytest.mark.slow
def test_an_out_of_memory_kill_is_retried_once_with_max_jobs_halved(farm, tmp_path):
    """No real memory exhaustion (it would take the shared machine down): the compile SIGKILLs the step,
    which is exactly what the OOM killer does; the farm must call it oom and retry once with half the jobs."""
    root, _ = farm
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    src = tmp_path / "oom-src"
    src.mkdir()
    log = tmp_path / "max_jobs.log"
    (src / "setup.py").write_text(OOM_SETUP.format(log=str(log)))
    (recipes / "farm_oom.yml").write_text(
        f"name: farm_oom\nsource:\n  path: {src}\nversion: 0.1.0\nlinks_torch: true\n"
        "combinations:\n  - {cuda: '13.0', torch: '2.13.0', pythons: ['3.11']}\nmax_jobs: 4\npeak_gb_per_job: 1\n")
    house = tmp_path / "house"
    res = farm_run({"FARM_RECIPES": str(recipes)}, "--runner", "host", "--mem-budget", "16",
                   "--wheelhouse", str(house), "--build-dir", str(tmp_path / "build"))
    assert res.returncode == 1, res.stdout + res.stderr
    assert log.read_text().split() == ["4", "2"]
    cell = cells_of(report(house))["farm_oom-cu130-torch2.13-py311"]
    assert cell["status"] == "oom" and cell["attempts"] == 2 and cell["max_jobs"] == 2
    assert "out of memory" in cell["max_jobs_clamp"]
    assert "oom farm_oom-cu130-torch2.13-py311: retrying once" in res.stdout


# ---------------------------------------------------------------- selection (no builds)

def test_unbuildable_cells_are_left_out_and_counted_in_one_line(tmp_path):
    res = run_farm("run", "--plain", "--dry-run", "--package", "farm_demo", "--wheelhouse", str(tmp_path / "h"))
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if "unbuildable here (" in ln)
    assert "Windows cells on a non-Windows host" in line and "CUDA 12.8: no toolkit here" in line
    planned = re.search(r"(\d+) cells planned: 0 already in the wheelhouse \(not rebuilt\), (\d+) to build, (\d+) unbuildable", res.stdout)
    total, todo, unbuildable = map(int, planned.groups())
    assert total == todo + unbuildable and todo >= 2 and unbuildable > todo
    assert f"would build {PY311}" in res.stdout and "-win" not in " ".join(
        ln for ln in res.stdout.splitlines() if ln.startswith("[farm run] would build"))


def test_needs_patch_cells_are_unbuildable_here_not_failures(tmp_path):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    broken_recipe(recipes, tmp_path / "src", extra="needs_patch: true\n")
    res = run_farm("run", "--plain", "--dry-run", "--wheelhouse", str(tmp_path / "h"),
                   env={"FARM_RECIPES": str(recipes)})
    assert res.returncode == 0 and "needs_patch" in res.stdout and "0 to build" in res.stdout


@pytest.mark.slow
def test_an_expected_failure_is_reported_and_the_run_exits_zero(farm, tmp_path):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    broken_recipe(recipes, farm[0] / "broken-src", extra=(
        "expected_fail:\n  cells: farm_broken-cu130-*\n  reason: the test's source is broken on purpose\n"))
    house = tmp_path / "house"
    res = farm_run({"FARM_RECIPES": str(recipes)}, "--wheelhouse", str(house), "--build-dir", str(tmp_path / "b"))
    assert res.returncode == 0, res.stdout + res.stderr
    cell = cells_of(report(house))[BROKEN]
    assert cell["status"] == "expected-fail" and "deliberately broken" in cell["excerpt"]
    assert cell["expected_fail"] == "the test's source is broken on purpose"


def test_build_requires_farm_pulls_in_and_orders_the_dependency(tmp_path):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    demo_recipe(recipes)
    text = (recipes / "farm_demo.yml").read_text().replace("name: farm_demo", "name: farm_needs_demo")
    (recipes / "farm_needs_demo.yml").write_text(text + "build_requires_farm: [farm_demo]\n")
    res = run_farm("run", "--plain", "--dry-run", "--package", "farm_needs_demo", "--cuda", "13.0", "--torch", "2.13",
                   "--python", "3.12", "--platform", "linux", "--wheelhouse", str(tmp_path / "h"),
                   env={"FARM_RECIPES": str(recipes)})
    assert res.returncode == 0, res.stderr
    order = [ln.split()[4] for ln in res.stdout.splitlines() if ln.startswith("[farm run] would build")]
    assert order == [PY312, "farm_needs_demo-cu130-torch2.13-py312"]
    assert "(needed by another cell)" in res.stdout


@pytest.mark.parametrize("want,peak,free,running,cap,jobs,words", [
    (2, 3, 10, False, None, 2, None),
    (2, 3, 4, False, None, 1, "2 jobs x 3 GB exceed the 4.0 GB free of the budget; clamped to 1"),
    # an idle 24 GB host: the budget fits two 11 GB jobs, the 21 GB container holding them does not
    (4, 11, 23.5, False, 21, 1, "4 jobs x 11 GB exceed the 21.0 GB limit of a build container; clamped to 1"),
    (2, 3, 10, True, 21, 2, None),
    (1, 12, 5, True, None, None, None),       # waits for a running cell to free memory
    (1, 12, 5, False, None, 1, "even one job (12 GB) exceeds the 5.0 GB free of the budget"),
    (1, 12, 30, True, 8, 1, "even one job (12 GB) exceeds the 8.0 GB limit of a build container"),   # waiting frees none
])
def test_memory_admission_fits_the_budget_and_the_build_containers_limit(want, peak, free, running, cap, jobs, words):
    from farm.runners.admission import admit_jobs

    admitted, clamp = admit_jobs(want, peak, free, running, cap)
    assert admitted == jobs
    assert (clamp is None) if words is None else (words in clamp), clamp


def test_bad_options_are_one_line_exit_2(tmp_path):
    for args, key in ((["--jobs", "0"], "--jobs"), (["--mem-budget", "-1"], "--mem-budget"),
                      (["--shard", "3/2"], "--shard")):
        res = run_farm("run", "--dry-run", *args, "--wheelhouse", str(tmp_path))
        assert res.returncode == 2 and key in res.stderr and res.stderr.count("\n") == 1


def _show_two_cells(display, second_status: str, second_message: str) -> list:
    """farm_demo's PY311 cell built, then BROKEN's cell finishing as `second_status`, through `display`
    (one skipped cell): the two cells, for the summary."""
    from types import SimpleNamespace

    from farm.run.selection import CellRun

    ok = CellRun(PY311, "farm_demo", "linux", status="running", max_jobs=2, attempts=1, started=time.time() - 5)
    other = CellRun(BROKEN, "farm_broken", "linux", status="running", max_jobs=1, attempts=1, started=time.time() - 3,
                    max_jobs_clamp="memory admission: ...")
    sched = SimpleNamespace(running={c.id: SimpleNamespace(cell=c) for c in (ok, other)}, pending=[], jobs=2)
    display.start(2, 1)
    display.event("start", ok, sched)
    ok.status, ok.duration, ok.wheel = "built", 5.0, "/x/farm_demo-0.1.0+cu130torch2.13-cp311-cp311-linux_x86_64.whl"
    del sched.running[PY311]
    display.event("finish", ok, sched)
    other.status, other.duration, other.message = second_status, 3.0, second_message
    del sched.running[BROKEN]
    display.event("finish", other, sched)
    display.stop()
    return [ok, other]


def test_terminal_progress_shows_counts_running_cells_and_a_summary_table():
    """The rich display, rendered into a string (a terminal is faked: tests run without one)."""
    import io

    from farm.run.farmrun import RunResult
    from farm.run.report import Display

    stream = io.StringIO()
    display = Display(plain=False, stream=stream)
    display.console.width = 160
    cells = _show_two_cells(display, "failed", "error: #error deliberately broken")
    display.summary(RunResult("r", 1, cells, {"Windows cells on a non-Windows host": ["x-win"]}))
    text = stream.getvalue()
    assert "done 1  failed 1  expected-fail 0  skipped 1" in text
    assert re.search(rf"{BROKEN}\s*│\s*failed", text) and "1*" in text          # clamped max_jobs is marked
    assert "unbuildable here (not selected, exit code unaffected): 1 cells" in text


def test_a_cell_stopped_by_ctrl_c_is_counted_as_interrupted_not_as_failed():
    """The progress line of a run interrupted in a compile (seen in the slice: 'done 1  failed 1' for a
    cell that had not failed)."""
    import io

    from farm.run.report import Display

    stream = io.StringIO()
    _show_two_cells(Display(plain=True, stream=stream), "interrupted", "stopped by an interrupt of the run")
    assert "done 1  failed 0  expected-fail 0  skipped 1  running 0  interrupted 1" in stream.getvalue()


def test_the_last_count_says_how_many_finished_cells_were_left_alone():
    """What a resumed run ends with (design.md §11.1): the cells a run before it finished are counted
    first, in words that say they were not rebuilt; a run that built everything says only that."""
    from collections import Counter

    from farm.run.report import tally_line

    resumed = Counter({"built": 3, "skipped": 9})
    assert tally_line(resumed, 12, 2460) == "12 cells: 9 already in the wheelhouse (not rebuilt), 3 built in 41m00s"
    assert tally_line(Counter({"built": 1}), 1, 5).startswith("1 cell: 1 built in ")
    assert tally_line(Counter(), 0, 0) == "cells: none selected"
