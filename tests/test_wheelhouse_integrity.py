"""Wheelhouse integrity (design.md §9.5): a damaged house is found by `farm index verify`, repaired by the
documented command without losing a wheel, hostile inputs are refused in one line with nothing
written, and hundreds of kills at publish step boundaries and random points (eight writers at once)
never leave an index that recovery cannot make whole."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import selectors
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

import pytest
from hostile import assert_one_line_refusal, tree_state
from wheelhouse_fixtures import make_wheel, rezip, run_farm

from farm.errors import FarmError
from farm.wheelhouse import check_links, publish, read_journal, verify
from farm.wheelhouse import manifest as manifest_module
from farm.wheelhouse.recover import recover

WHEELS = [("drtk", "0.1.0+cu128torch2.8"), ("drtk", "0.1.0+cu130torch2.13"), ("tfree", "1.0.0+cu128")]


def listed(house: Path) -> set[str]:
    """Every wheel the flat index lists (from the PEP 691 pages)."""
    out = set()
    for page in house.glob("simple/*/index.json"):
        out |= {f["filename"] for f in json.loads(page.read_text())["files"]}
    return out


@pytest.fixture
def built(tmp_path):
    """A house with three wheels published through the real CLI, and the wheels."""
    wheels = [make_wheel(tmp_path / "in", n, v) for n, v in WHEELS]
    house = tmp_path / "wh"
    run_farm("publish", *wheels, "--wheelhouse", house)
    assert listed(house) == {w.name for w in wheels}
    return house, wheels


def _tear(house, wheels):
    # The last record cut in half, as a writer killed mid-append leaves it (its wheel is in files/).
    path = house / "manifest.jsonl"
    data = path.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(data[: last + (len(data) - last) // 2])


def _flip(house, wheels):
    target = house / "files/drtk" / wheels[0].name
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))


def _symlink(house, wheels):
    (house / "files/drtk/drtk-9.9.9+cu128torch2.8-cp311-cp311-manylinux_2_34_x86_64.whl").symlink_to("/etc/passwd")


# case -> (damage, needle verify prints, repair command (None: republish the first wheel), needle of the repair)
CORRUPTIONS = {
    "torn last line": (_tear, "torn last record", ["index", "recover"], "cut a torn last manifest record"),
    "missing manifest": (lambda h, w: (h / "manifest.jsonl").unlink(), "manifest.jsonl: missing",
                         ["index", "recover"], "3 added"),
    "empty manifest": (lambda h, w: (h / "manifest.jsonl").write_bytes(b""), "manifest.jsonl: empty",
                       ["index", "recover"], "3 added"),
    "binary manifest": (lambda h, w: (h / "manifest.jsonl").write_bytes(bytes(range(256)) * 8),
                        "manifest.jsonl:1:", ["index", "recover"], "damaged manifest line"),
    "missing sidecar": (lambda h, w: (h / "files/tfree" / (w[2].name + ".metadata")).unlink(),
                        ".metadata: missing", ["index", "recover"], "rewrote files/tfree/"),
    "flipped byte in a wheel": (_flip, "republish the good wheel", None, "replaced drtk/"),
    "missing page": (lambda h, w: (h / "cu128/torch2.8/drtk/index.html").unlink(),
                     "cu128/torch2.8/drtk/index.html: missing", ["index", "rebuild"], "page(s)"),
    "garbage cache": (lambda h, w: (h / ".manifest.idx").write_bytes(b"\x80\x04garbage"), ".manifest.idx",
                      ["index", "recover"], "0 added"),
    "planted symlink": (_symlink, "a symlink to /etc/passwd", ["index", "recover"], "removed files/drtk/"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_verify_finds_each_damage_and_the_documented_command_repairs_it_losing_no_wheel(built, case):
    house, wheels = built
    damage, needle, repair, said = CORRUPTIONS[case]
    passwd = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    damage(house, wheels)
    res = run_farm("index", "verify", "--wheelhouse", house, check=False)
    assert res.returncode == 1 and needle in res.stdout, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr
    if case in ("torn last line", "missing manifest", "empty manifest"):
        # A publish on top of it would drop records silently: refused while files/ holds unlisted wheels.
        other = make_wheel(house.parent / "in2", "drtk", "0.2.0+cu128torch2.8")
        before = tree_state(house)
        refused = run_farm("publish", other, "--wheelhouse", house, check=False)
        assert_one_line_refusal(refused, 2, "farm index recover")
        assert tree_state(house) == before
    fixed = run_farm(*(repair or ["publish", wheels[0]]), "--wheelhouse", house, check=False)
    assert fixed.returncode == 0 and said in fixed.stdout, (fixed.stdout, fixed.stderr)
    again = run_farm("index", "verify", "--wheelhouse", house, check=False)
    assert again.returncode == 0, again.stdout
    assert listed(house) == {w.name for w in wheels}           # 0 wheels lost
    for w in wheels:
        assert (house / "files" / w.name.split("-")[0] / w.name).read_bytes() == w.read_bytes()
    assert hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest() == passwd


def test_recover_keeps_the_build_record_a_wheel_carries_and_frames_an_old_unframed_journal(tmp_path):
    w = make_wheel(tmp_path / "in")
    info = {"cell": "drtk-cu128-torch2.8-py311", "build_key": "k-123", "arch_list": "8.0 9.0+PTX"}
    carrying = rezip(w, tmp_path / "in2" / w.name,
                     lambda f: {**f, "drtk-0.1.0+cu128torch2.8.dist-info/farm_build.json": json.dumps(info).encode()})
    house = tmp_path / "wh"
    publish([carrying], house, record=info)
    lines = (house / "manifest.jsonl").read_text().splitlines()
    assert lines[0].endswith('"}') and '"~crc32":"' in lines[0]
    # An unframed journal (as written before framing) still loads; recover rewrites it framed.
    unframed = json.loads(lines[0])
    del unframed["~crc32"]
    (house / "manifest.jsonl").write_text(json.dumps(unframed) + "\n")
    assert [e.build_key for e in read_journal(house).entries] == ["k-123"]
    (house / "manifest.jsonl").unlink()
    result = recover(house)
    (e,) = read_journal(house).entries
    assert (e.build_key, e.cell, e.arch_list) == ("k-123", info["cell"], "8.0 9.0+PTX")
    assert result.added == [f"files/drtk/{w.name}"] and verify(house) == []
    assert all('"~crc32":"' in line for line in (house / "manifest.jsonl").read_text().splitlines())


def test_recover_twice_frames_every_line_once_a_remove_record_too(built):
    house, wheels = built
    gone = house / "files/tfree" / wheels[2].name
    gone.unlink()
    gone.with_name(gone.name + ".metadata").unlink()
    recover(house)   # drops the record: a remove record
    recover(house)   # keeps that remove record
    lines = (house / "manifest.jsonl").read_text().splitlines()
    assert [json.loads(line)["op"] for line in lines].count("remove") == 1
    assert [line.count('"~crc32"') for line in lines] == [1] * len(lines), lines
    assert verify(house) == []


def test_files_as_a_symlink_is_reported_and_refused_by_publish_and_recover_changing_nothing(built, tmp_path):
    # issue 33 item 2: recover removed the link, then wrote a `remove` record for every wheel ("the wheel
    # file is gone") while their bytes sat at the link's target; verify then passed an empty index.
    house, wheels = built
    target = tmp_path / "elsewhere"
    shutil.move(house / "files", target)
    (house / "files").symlink_to(target)
    (target / "drtk" / "planted.whl").symlink_to("/etc/passwd")
    (target / "drtk" / "orphan.whl.metadata").write_bytes(b"Name: orphan\n")
    outside = tree_state(target)
    res = run_farm("index", "verify", "--wheelhouse", house, check=False)
    assert res.returncode == 1 and f"files: a symlink to {target}, not a folder" in res.stdout, res.stdout
    assert "recover` removes" not in res.stdout and "Traceback" not in res.stderr
    before = tree_state(house)
    other = make_wheel(tmp_path / "in2", "drtk", "0.2.0+cu128torch2.8")
    assert_one_line_refusal(run_farm("publish", other, "--wheelhouse", house, check=False), 2, "files")
    assert tree_state(house) == before and tree_state(target) == outside
    line = assert_one_line_refusal(run_farm("index", "recover", "--wheelhouse", house, check=False), 2,
                                   f"a symlink to {target}")
    assert "nothing changed" in line
    assert tree_state(house) == before and tree_state(target) == outside
    assert (house / "files").is_symlink() and len(read_journal(house).entries) == len(wheels)


def _files_moved(house: Path, tmp_path: Path) -> None:
    shutil.move(house / "files", tmp_path / "elsewhere")


def _files_a_file(house: Path, tmp_path: Path) -> None:
    _files_moved(house, tmp_path)
    (house / "files").write_text("not a folder\n")


def _project_linked(house: Path, tmp_path: Path) -> None:
    shutil.move(house / "files/drtk", tmp_path / "elsewhere")
    (house / "files/drtk").symlink_to(tmp_path / "elsewhere")


def _project_a_file(house: Path, tmp_path: Path) -> None:
    shutil.move(house / "files/drtk", tmp_path / "elsewhere")
    (house / "files/drtk").write_text("not a folder\n")


def _project_a_fifo(house: Path, tmp_path: Path) -> None:
    shutil.move(house / "files/drtk", tmp_path / "elsewhere")
    os.mkfifo(house / "files/drtk")


def _stray_link(house: Path, tmp_path: Path) -> None:
    # no record names this project: a folder of wheels linked in (a journal lost) is still not recover's to drop
    (tmp_path / "elsewhere").mkdir()
    (house / "files/other").symlink_to(tmp_path / "elsewhere")


# case -> (damage, the path the refusal names, what it says)
UNSEEN = {
    "files a symlink to nowhere": (lambda h, t: (shutil.rmtree(h / "files"), (h / "files").symlink_to(t / "gone")),
                                   "files", "a symlink to"),
    "files a file": (_files_a_file, "files", "a file"),
    "files missing": (_files_moved, "files", "missing"),
    "project folder a symlink": (_project_linked, "files/drtk", "a symlink"),
    "project folder a file": (_project_a_file, "files/drtk", "a file"),
    "project folder a FIFO": (_project_a_fifo, "files/drtk", "not a regular file"),
    "an unrecorded project a symlink": (_stray_link, "files/other", "a symlink"),
}


@pytest.mark.parametrize("case", list(UNSEEN))
def test_recover_never_takes_a_folder_it_cannot_see_for_wheels_that_are_gone(built, tmp_path, case):
    house, wheels = built
    damage, where, said = UNSEEN[case]
    damage(house, tmp_path)
    journal = (house / "manifest.jsonl").read_bytes()
    before = tree_state(tmp_path)
    line = assert_one_line_refusal(run_farm("index", "recover", "--wheelhouse", house, check=False), 2,
                                   f"{house}/{where}: ")
    assert said in line and "nothing changed" in line, line
    assert tree_state(tmp_path) == before and (house / "manifest.jsonl").read_bytes() == journal
    res = run_farm("index", "verify", "--wheelhouse", house, check=False)
    assert res.returncode == 1 and "Traceback" not in res.stderr and "recover` removes" not in res.stdout, res


@pytest.mark.parametrize("case", ["project folder a file", "project folder a FIFO"])
def test_rebuild_refuses_a_project_folder_it_cannot_list_even_when_allowed_to_shrink(built, tmp_path, case):
    house, _ = built
    UNSEEN[case][0](house, tmp_path)
    before = tree_state(tmp_path)
    for extra in ([], ["--allow-shrink"]):
        res = run_farm("index", "rebuild", *extra, "--wheelhouse", house, check=False)
        assert_one_line_refusal(res, 2, f"{house}/files/drtk: ")
        assert tree_state(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a folder whatever its mode")
def test_recover_refuses_a_project_folder_it_may_not_read(built, tmp_path):
    house, _ = built
    journal = (house / "manifest.jsonl").read_bytes()
    (house / "files/drtk").chmod(0)
    try:
        res = run_farm("index", "recover", "--wheelhouse", house, check=False)
        assert_one_line_refusal(res, 2, "files/drtk")
        assert (house / "manifest.jsonl").read_bytes() == journal
    finally:
        (house / "files/drtk").chmod(0o755)


def test_verify_reports_a_wheel_whose_metadata_deflate_stream_is_damaged_without_a_traceback(built):
    house, wheels = built
    target = house / "files/drtk" / wheels[0].name
    with zipfile.ZipFile(target) as zf:
        info = zf.getinfo("drtk-0.1.0+cu128torch2.8.dist-info/METADATA")
    data = bytearray(target.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26: info.header_offset + 30])
    start = info.header_offset + 30 + name_len + extra_len
    data[start] = 0xFF   # deflate block type 3: reserved, zlib refuses the stream
    target.write_bytes(bytes(data))
    res = run_farm("index", "verify", "--wheelhouse", house, check=False)
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert res.returncode == 1 and f"files/drtk/{wheels[0].name}: its METADATA cannot be read" in res.stdout, \
        (res.stdout, res.stderr)


def test_a_crafted_pickle_cache_runs_nothing_and_is_replaced_by_json(built, tmp_path):
    house, wheels = built
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (house / ".manifest.idx").write_bytes(pickle.dumps(Evil()))
    run_farm("publish", make_wheel(tmp_path / "in3", "drtk", "0.3.0+cu128torch2.8"), "--wheelhouse", house)
    assert not marker.exists()
    json.loads((house / ".manifest.idx").read_text())   # garbage ignored and rewritten, as JSON
    assert run_farm("index", "verify", "--wheelhouse", house, check=False).returncode == 0


def test_prune_refuses_while_verify_fails_and_never_deletes_an_unlisted_wheel(built):
    house, wheels = built
    (house / "manifest.jsonl").unlink()
    before = tree_state(house / "files")
    res = run_farm("prune", "--before", "2999-01-01", "--wheelhouse", house, check=False)
    assert_one_line_refusal(res, 1, "prune refused")
    assert tree_state(house / "files") == before
    run_farm("index", "recover", "--wheelhouse", house)
    res = run_farm("prune", "--before", "2999-01-01", "--wheelhouse", house)
    assert listed(house) == {w.name for w in wheels}


def test_verify_says_recover_adds_a_stray_wheel_but_leaves_a_stray_non_wheel_to_a_person(built, tmp_path):
    house, wheels = built
    project = house / "files" / "drtk"
    stray_wheel = make_wheel(tmp_path / "stray", "drtk", "0.2.0+cu128torch2.8")
    shutil.copy(stray_wheel, project / stray_wheel.name)
    (project / "notes.txt").write_text("left here by hand\n")
    res = run_farm("index", "verify", "--wheelhouse", house, check=False)
    assert res.returncode == 1
    said = {line.split(": ", 1)[0]: line for line in res.stdout.splitlines()}
    assert "`farm index recover` adds it" in said[f"files/{project.name}/{stray_wheel.name}"]
    assert "remove it by hand" in said[f"files/{project.name}/notes.txt"]
    res = run_farm("index", "recover", "--wheelhouse", house, check=False)
    assert "left as it is: files/drtk/notes.txt" in res.stdout + res.stderr
    assert (project / "notes.txt").exists() and stray_wheel.name in listed(house)


# ---------------------------------------------------------------- malformed inputs


def _hostile(tmp_path: Path, kind: str) -> Path:
    good = make_wheel(tmp_path / "good", "drtk", "0.5.0+cu128torch2.8")
    out = tmp_path / "bad" / good.name
    di = "drtk-0.5.0+cu128torch2.8.dist-info"
    if kind == "dotdot member":
        return rezip(good, out, lambda f: {**f, "../../../tmp/x.py": b"print(1)\n"})
    if kind == "absolute member":
        return rezip(good, out, lambda f: {**f, "/tmp/x.py": b"print(1)\n"})
    if kind == "backslash member":
        return rezip(good, out, lambda f: {**f, "drtk\\evil.py": b"print(1)\n"})
    if kind == "symlink member":
        return rezip(good, out, lambda f: {**f, "drtk/link.py": b"/etc/passwd"}, links=("drtk/link.py",))
    if kind == "no WHEEL":
        return rezip(good, out, lambda f: {k: v for k, v in f.items() if k != f"{di}/WHEEL"})
    if kind == "RECORD hash fails":
        return rezip(good, out, lambda f: {**f, "drtk/__init__.py": b"tampered = True\n"}, record=False)
    if kind == "not a zip":
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(b"PK\x03\x04 this is not a zip file at all")
        return out
    raise AssertionError(kind)


HOSTILE_WHEELS = [("dotdot member", ".."), ("absolute member", "absolute"), ("backslash member", "backslash"),
                  ("symlink member", "link"), ("no WHEEL", "WHEEL"), ("RECORD hash fails", "RECORD"),
                  ("not a zip", "zip")]


@pytest.mark.parametrize("kind, needle", HOSTILE_WHEELS)
def test_publish_refuses_a_hostile_wheel_in_one_line_writing_nothing(built, tmp_path, kind, needle):
    house, _ = built
    bad = _hostile(tmp_path, kind)
    before = tree_state(house)
    res = run_farm("publish", bad, "--wheelhouse", house, check=False)
    line = assert_one_line_refusal(res, 2, needle)
    assert bad.name in line
    assert tree_state(house) == before


def _binary_manifest(house: Path) -> None:
    (house / "manifest.jsonl").write_bytes(b"\xff\xfe\x00binary\n" * 4)


def _bad_checksum(house: Path) -> None:
    path = house / "manifest.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[0] = lines[0].replace(b'"drtk"', b'"drtX"', 1)
    path.write_bytes(b"\n".join(lines))


# (command, house setup, needle). Setups: "none" = the path does not exist, "file" = it is a file.
HOUSE_CASES = [
    (["index", "verify"], "none", "no such wheelhouse"),
    (["index", "rebuild"], "none", "no such wheelhouse"),
    (["index", "recover"], "none", "no such wheelhouse"),
    (["prune", "--before", "2026-01-01"], "none", "no such wheelhouse"),
    (["index", "verify"], "file", "not a folder"),
    (["index", "rebuild"], "file", "not a folder"),
    (["index", "recover"], "file", "not a folder"),
    (["prune", "--before", "2026-01-01"], "file", "not a folder"),
    (["publish", "WHEEL"], "file", "not a folder"),
    (["publish", "WHEEL"], "under a file", "is not a folder"),
    (["publish", "WHEEL"], "binary manifest", "manifest.jsonl:1"),
    (["index", "rebuild"], "binary manifest", "manifest.jsonl:1"),
    (["publish", "WHEEL"], "bad checksum", "checksum mismatch"),
    (["prune", "--before", "yesterday"], "house", "--before"),
]


@pytest.mark.parametrize("args, setup, needle", HOUSE_CASES, ids=[f"{' '.join(a)}-{s}" for a, s, _ in HOUSE_CASES])
def test_a_bad_wheelhouse_is_refused_in_one_line_and_nothing_is_created_or_written(built, tmp_path, args, setup,
                                                                                   needle):
    house, wheels = built
    target = {"none": tmp_path / "nowhere", "file": tmp_path / "plain.txt",
              "under a file": tmp_path / "plain.txt" / "wh"}.get(setup, house)
    (tmp_path / "plain.txt").write_text("not a wheelhouse\n")
    if setup == "binary manifest":
        _binary_manifest(house)
    elif setup == "bad checksum":
        _bad_checksum(house)
    new = make_wheel(tmp_path / "new", "drtk", "0.9.0+cu128torch2.8")
    before = tree_state(tmp_path)
    res = run_farm(*[str(new) if a == "WHEEL" else a for a in args], "--wheelhouse", target, check=False)
    assert_one_line_refusal(res, 2, needle)
    assert tree_state(tmp_path) == before
    assert not (tmp_path / "nowhere").exists()


# ---------------------------------------------------------------- fault injection

KILLS = int(os.environ.get("FARM_TEST_KILLS", "500"))
WRITERS = 8
LABELS = ["cu128torch2.8", "cu128torch2.9", "cu130torch2.13", "cu128", "cu130"]


REFUSED, FAILED = 2, 3


def _writer(house: Path, wheels: list[Path], fault_at: int | None, fd: int) -> int:
    """Fork a child that publishes `wheels`, reporting each write step on `fd`; exit 137 at step
    `fault_at` (FARM_WHEELHOUSE_FAULT_AT), 0 when published, REFUSED when publish refused as it must
    after a crash (asking for `farm index recover`), FAILED on anything else (its traceback on stderr)."""
    pid = os.fork()
    if pid:
        return pid
    code = FAILED
    try:
        manifest_module._steps = 0
        os.environ["FARM_WHEELHOUSE_STEP_FD"] = str(fd)
        if fault_at:
            os.environ["FARM_WHEELHOUSE_FAULT_AT"] = str(fault_at)
        publish(wheels, house)
        code = 0
    except FarmError as exc:
        if "farm index recover" in str(exc):
            code = REFUSED
        else:
            traceback.print_exc()
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def test_hundreds_of_kills_at_step_boundaries_and_random_points_with_eight_writers_lose_nothing(tmp_path):
    """Rounds of eight concurrent writers; each is killed at a write step boundary (the fault hook),
    or with SIGKILL right after a random number of steps (the kill lands wherever the child is by
    then: mid-write, mid-fsync, waiting for the lock), or left alone. After each round every link
    must resolve; `recover` must make `verify` pass; every wheel a writer finished and every wheel
    file in files/ must be listed."""
    seed = int(os.environ.get("FARM_TEST_SEED", time.time_ns() % 100000))
    rng = random.Random(seed)
    # These are kills of processes, not of the machine: what a dead writer wrote is in the page cache
    # either way, so the house may live in RAM (tmpfs), where fsync costs nothing.
    ram = Path("/dev/shm")
    scratch = Path(tempfile.mkdtemp(dir=ram)) if ram.is_dir() and os.access(ram, os.W_OK) else tmp_path
    try:
        _kill_rounds(scratch, rng, seed)
    finally:
        if scratch != tmp_path:
            shutil.rmtree(scratch, ignore_errors=True)


def _kill_rounds(tmp_path: Path, rng: random.Random, seed: int) -> None:
    house = tmp_path / "wh"
    publish([make_wheel(tmp_path / "in", "drtk", "0.0.1+cu128torch2.8")], house)
    steps = 12  # a one-wheel publish takes about this many steps (pages vary); kills aim over all of them
    kills = boundary = rounds = refused = inconsistent = lost = recoveries = 0
    done: set[str] = set()
    started = time.monotonic()
    while kills < KILLS:
        rounds += 1
        sel = selectors.DefaultSelector()
        children = {}
        for i in range(WRITERS):
            label = LABELS[rng.randrange(len(LABELS))]
            wheels = [make_wheel(tmp_path / "in", f"p{rng.randrange(3)}", f"{rounds}.{i}.{k}+{label}")
                      for k in range(1 + (rng.random() < 0.25))]
            r, w = os.pipe()
            mode = rng.random()
            fault_at = rng.randint(1, steps * len(wheels)) if mode < 0.45 else None
            kill_after = rng.randint(0, steps * len(wheels)) if 0.45 <= mode < 0.95 else None
            pid = _writer(house, wheels, fault_at, w)
            os.close(w)
            children[pid] = {"wheels": wheels, "kill_after": kill_after, "seen": 0, "fd": r}
            sel.register(r, selectors.EVENT_READ, pid)
            if kill_after == 0:
                os.kill(pid, signal.SIGKILL)
        open_fds = len(children)
        while open_fds:   # wait on the children's step reports, never on a clock
            for key, _ in sel.select():
                pid, c = key.data, children[key.data]
                data = os.read(key.fd, 4096)
                if not data:
                    sel.unregister(key.fd)
                    os.close(key.fd)
                    open_fds -= 1
                    continue
                before, c["seen"] = c["seen"], c["seen"] + len(data)
                if c["kill_after"] and before < c["kill_after"] <= c["seen"]:
                    os.kill(pid, signal.SIGKILL)
        for pid, c in children.items():
            _, status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(status) or os.waitstatus_to_exitcode(status) == 137:
                kills += 1
                boundary += not os.WIFSIGNALED(status)
            elif os.waitstatus_to_exitcode(status) == 0:
                done.update(w.name for w in c["wheels"])
            else:
                # REFUSED: a torn journal with unlisted wheels, refused until recover. Anything else is a
                # real publish error (its traceback is in the captured stderr).
                assert os.waitstatus_to_exitcode(status) == REFUSED, (seed, rounds, os.waitstatus_to_exitcode(status))
                refused += 1
        assert check_links(house) == [], (seed, rounds)   # a crash never leaves a broken link
        if verify(house):
            recover(house)
            recoveries += 1
        inconsistent += bool(verify(house))
        shown = listed(house)
        on_disk = {p.name for p in house.glob("files/*/*.whl")}
        lost += len((done | on_disk) - shown)
        assert (inconsistent, lost) == (0, 0), (seed, rounds, sorted((done | on_disk) - shown)[:3])
    took = time.monotonic() - started
    print(f"\nfault injection (seed {seed}): {kills} kills ({boundary} at step boundaries, {kills - boundary} "
          f"SIGKILL at random points) in {rounds} rounds of {WRITERS} writers, {refused} refused publishes, "
          f"{recoveries} recoveries; {inconsistent} inconsistent indexes after recovery, {lost} wheels lost; "
          f"{len(done)} wheels published; {took:.1f} s")
    assert kills >= KILLS and boundary >= KILLS // 4 and kills - boundary >= KILLS // 4
    assert len(read_journal(house).entries) >= len(done)
