"""Crash safety and concurrency of publishing (design.md §9.3): a crash anywhere leaves an index whose every link
resolves to a complete file with the advertised sha256, and publishing again completes."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from wheelhouse_fixtures import FARM, REPO, make_wheel

from farm.errors import BadInput
from farm.wheelhouse import check_links, publish, read_journal, rebuild, verify
from farm.wheelhouse import manifest as manifest_module
from farm.wheelhouse.recover import recover


def base_house(tmp: Path) -> Path:
    house = tmp / "base"
    publish([make_wheel(tmp / "in0", "drtk", "0.1.0+cu128torch2.8"),
             make_wheel(tmp / "in0", "tfree", "1.0.0+cu128"),
             make_wheel(tmp / "in0", "drtk", "0.1.0+cu130torch2.13")], house)
    return house


def listed(house: Path, channel: str, project: str) -> list[str]:
    page = house / channel / project / "index.html"
    return json.loads((page.with_name("index.json")).read_text())["files"] if page.exists() else []


def assert_sound(house: Path) -> None:
    """Sound links and pages, and `farm index verify` finds nothing: the journal agrees with the files."""
    assert_links_sound(house)
    assert verify(house) == []


def assert_links_sound(house: Path) -> None:
    """What a crash at any point must leave: every link resolves to a complete file with the advertised
    sha256, every page whole. (The journal may be torn and files/ may hold the dead publish's wheel.)"""
    assert check_links(house) == []
    for page in [*house.rglob("index.html")]:
        assert page.read_text().endswith("</html>\n"), page
    for page in house.rglob("index.json"):
        json.loads(page.read_text())
    json.loads((house / "packages.json").read_text())


def assert_no_wheel_lost(house: Path) -> None:
    """Every wheel file in files/ is in the journal and listed on the flat index."""
    for wheel in house.glob("files/*/*.whl"):
        assert wheel.name in [f["filename"] for f in listed(house, "simple", wheel.parent.name)], wheel


def in_child(fn, fault_at: int | None) -> int:
    """Run fn in a forked child (optionally killed at write step `fault_at`); returns its exit status."""
    pid = os.fork()
    if pid == 0:
        try:
            manifest_module._steps = 0
            if fault_at:
                os.environ["FARM_WHEELHOUSE_FAULT_AT"] = str(fault_at)
            fn()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def pages(house: Path) -> dict[str, bytes]:
    """Every generated file of the index (pages, packages.json and its fragments), by path."""
    return {p.relative_to(house).as_posix(): p.read_bytes() for p in house.rglob("*")
            if p.is_file() and not p.name.startswith(".") and "files" not in p.relative_to(house).parts
            and p.name != "manifest.jsonl"}


def same_as_a_rebuild(house: Path, tmp: Path) -> None:
    """The incremental pages equal what `farm index rebuild` makes from the same journal."""
    copy = tmp / "rebuilt"
    shutil.copytree(house, copy)
    rebuild(copy)
    assert pages(house) == pages(copy)
    shutil.rmtree(copy)


@pytest.mark.parametrize("case", ["two wheels", "opens a channel for an untouched project"])
def test_a_crash_at_every_write_step_of_a_publish_leaves_a_sound_index_and_publishing_again_completes(tmp_path, case):
    base = base_house(tmp_path)
    if case == "two wheels":
        new = [make_wheel(tmp_path / "in1", "drtk", "0.1.0+cu128torch2.9"),   # opens a channel
               make_wheel(tmp_path / "in1", "tfree", "1.1.0+cu128")]           # lands in three channels
    else:  # tfree, not published here, must appear in the new channel cu128/torch2.9
        new = [make_wheel(tmp_path / "in1", "drtk", "0.1.0+cu128torch2.9")]
    probe = tmp_path / "probe"
    shutil.copytree(base, probe)
    steps_log = tmp_path / "steps.log"
    os.environ["FARM_WHEELHOUSE_STEPS"] = str(steps_log)
    try:
        assert in_child(lambda: publish(new, probe), None) == 0
    finally:
        del os.environ["FARM_WHEELHOUSE_STEPS"]
    steps = steps_log.read_text().splitlines()
    names = [s.split(" ", 1)[1] for s in steps]
    assert "manifest: torn append" in names and any(n.startswith("placed") for n in names)
    assert sum(n.startswith("page ") for n in names) >= (10 if len(new) == 2 else 5)
    total = 3 + len(new)
    for n in range(1, len(steps) + 1):
        house = tmp_path / f"crash{n}"
        shutil.copytree(base, house)
        assert in_child(lambda h=house: publish(new, h), n) == 137, steps[n - 1]
        assert_links_sound(house)
        journal = read_journal(house)
        assert len(journal.entries) in (3, total), steps[n - 1]
        if journal.torn:  # died mid-append: a publish refuses until recover has re-read files/
            with pytest.raises(BadInput, match="farm index recover"):
                publish(new, house)
            recover(house)
            assert_sound(house)
            assert_no_wheel_lost(house)
        publish(new, house)
        assert_sound(house)
        same_as_a_rebuild(house, tmp_path)
        for channel in ("cu128/torch2.8", "cu128/torch2.9"):
            want = "tfree-1.1.0+cu128" if len(new) == 2 else "tfree-1.0.0+cu128"
            assert f"{want}-cp311-cp311-manylinux_2_34_x86_64.whl" in [
                f["filename"] for f in listed(house, channel, "tfree")], (steps[n - 1], channel)
        assert [f["filename"] for f in listed(house, "cu128/torch2.9", "drtk")] == [new[0].name]
        assert len(read_journal(house).entries) == total
        shutil.rmtree(house)


@pytest.mark.slow
def test_sigkill_of_farm_publish_at_50_random_moments(tmp_path):
    seed = int(os.environ.get("FARM_TEST_SEED", time.time_ns() % 100000))
    rng = random.Random(seed)
    house = base_house(tmp_path)
    labels = ["cu128torch2.8", "cu128torch2.9", "cu128", "cu130torch2.13", "cu130torch2.10"]
    env = {**os.environ}
    # Calibrate: how many write steps does a publish take? Each kill then waits for a random number of
    # them and a random fraction of a millisecond more, so the 50 moments spread over every phase
    # however fast or loaded this machine is.
    cal = make_wheel(tmp_path / "cal", "drtk", "0.0.1+cu128torch2.8")
    steps_log = tmp_path / "cal.steps"
    env["FARM_WHEELHOUSE_STEPS"] = str(steps_log)
    proc = subprocess.Popen([*FARM, "publish", str(cal), "--wheelhouse", str(house)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.wait() == 0
    count = len(steps_log.read_text().splitlines())
    landed = []
    for i in range(50):
        label = labels[i % len(labels)]
        w = make_wheel(tmp_path / f"in{i}", "drtk" if "torch" in label else "tfree", f"0.2.{i}+{label}")
        steps_log = tmp_path / f"{i}.steps"
        env["FARM_WHEELHOUSE_STEPS"] = str(steps_log)
        proc = subprocess.Popen([*FARM, "publish", str(w), "--wheelhouse", str(house)], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wanted = rng.randint(0, count)
        while proc.poll() is None and (len(steps_log.read_text().splitlines()) if steps_log.exists() else 0) < wanted:
            time.sleep(0.0002)
        time.sleep(rng.uniform(0, 0.001))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        done = steps_log.read_text().splitlines() if steps_log.exists() else []
        last = done[-1].split(" ", 1)[1] if done else "start"
        landed.append(last.split(" ")[0] if last.startswith(("page", "staged", "placed", "sidecar")) else last)
        try:
            assert check_links(house) == []
            if read_journal(house).torn:
                recover(house)
            publish([w], house)  # publishing again completes
            assert check_links(house) == []
            assert w.name in [f["filename"] for f in listed(house, "simple", w.name.split("-")[0])]
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, kill {i} after step {last!r}: {exc}") from None
    assert_sound(house)
    # The kills landed in different phases (not all before or after the writes).
    assert len(set(landed)) >= 3, (seed, landed)


WORKER = """
import re
import sys
from pathlib import Path
from farm.wheelhouse import publish
house, wheels = sys.argv[1], sys.argv[2:]
for w in wheels:   # a cell of its own per wheel (a cell id, design.md §5.2): retention yanks none
    publish([w], house, record={"cell": re.sub(r"[^a-z0-9]", "", Path(w).name.lower())[:60] + "-cu128-py311"})
"""


@pytest.mark.slow
def test_eight_processes_publishing_twenty_wheels_each_end_with_all_160_listed(tmp_path):
    house = tmp_path / "wh"
    labels = ["cu128torch2.8", "cu128torch2.9", "cu130torch2.13", "cu128"]
    jobs = []
    for i in range(8):
        ws = [make_wheel(tmp_path / f"in{i}", f"proj{i % 3}", f"1.{i}.{j}+{labels[(i + j) % 4]}")
              for j in range(20)]
        jobs.append(ws)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(house), *map(str, ws)], cwd=REPO,
                              stderr=subprocess.PIPE, text=True) for ws in jobs]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    entries = read_journal(house).entries
    assert len(entries) == 160
    for ws in jobs:
        for w in ws:
            project, version = w.name.split("-")[:2]
            label = version.split("+")[1]
            channels = ([f"{label[:5]}/{label[5:]}"] if "torch" in label else ["cu128/torch2.8", "cu128/torch2.9"])
            for root in ["simple", *channels]:
                assert w.name in [f["filename"] for f in listed(house, root, project)], (w.name, root)
                assert w.name in (house / root / project / "index.html").read_text()
    assert_sound(house)


def snapshot(house: Path, skip: str) -> dict[str, tuple[int, int, bytes]]:
    """(inode, mtime, bytes) of every channel page outside `skip`. A page written again, even with the same
    bytes within the clock's granularity, shows: a publish replaces a file by renaming a new one over it."""
    return {p.relative_to(house).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes())
            for p in house.glob("cu*/**/*") if p.is_file() and not p.relative_to(house).as_posix().startswith(skip)}


def test_a_publish_into_one_channel_leaves_every_other_channels_pages_untouched(tmp_path):
    house = tmp_path / "wh"
    publish([make_wheel(tmp_path / "in", "drtk", v) for v in
             ("0.1.0+cu128torch2.8", "0.1.0+cu128torch2.9", "0.1.0+cu130torch2.10", "0.1.0+cu128")], house)
    for page in house.glob("cu*/**/*"):
        if page.is_file():
            os.utime(page, (1000, 1000))   # a page written again gets today's mtime, without a sleep
    before = snapshot(house, "cu130/torch2.13")
    assert len(before) >= 12
    publish([make_wheel(tmp_path / "in", "drtk", "0.1.0+cu130torch2.13")], house)
    publish([make_wheel(tmp_path / "in", "other", "0.3.0+cu130torch2.13")], house)
    assert snapshot(house, "cu130/torch2.13") == before
    assert len(listed(house, "cu130/torch2.13", "drtk")) == 1 and len(listed(house, "cu130/torch2.13", "other")) == 1
