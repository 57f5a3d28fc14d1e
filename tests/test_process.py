"""farm.process: the one way a child's failure becomes one line."""

from __future__ import annotations

import sys

import pytest

from farm.errors import SourceError
from farm.process import last_line, last_useful_lines, run, useful_lines


def test_useful_lines_are_stripped_non_blank_and_skip_what_is_asked(tmp_path):
    text = "  one \n\n[notice] pip is old\n two\n"
    assert useful_lines(text) == ["one", "[notice] pip is old", "two"]
    assert useful_lines(text, skip=lambda ln: ln.startswith("[notice]")) == ["one", "two"]
    log = tmp_path / "build.log"
    log.write_bytes(b"ok\n\xff bad byte\n")
    assert useful_lines(log) == ["ok", "\ufffd bad byte"]


def test_last_line_prefers_the_matching_line_then_the_last_then_the_default():
    git = "hint: x\nerror: first\nfatal: second\ntrailer\n"
    is_error = lambda ln: ln.startswith(("fatal:", "error:"))  # noqa: E731
    assert last_line(git, prefer=is_error) == "fatal: second"
    assert last_line(git, prefer=is_error, first=True) == "error: first"
    assert last_line("a\nb\n", prefer=is_error) == "b"
    assert last_line("\n \n") == "no output"
    assert last_line("", default="?") == "?"
    assert last_line("x" * 500, limit=300) == "x" * 300
    assert last_useful_lines("a\nb\nc\n", 2) == ["b", "c"]


def test_run_raises_the_given_error_with_what_and_the_explaining_line(tmp_path):
    fail = [sys.executable, "-c", "import sys; print('noise', file=sys.stderr); sys.exit('fatal: broken')"]
    with pytest.raises(SourceError) as err:
        run(fail, cwd=tmp_path, error=SourceError, what="git fetch failed")
    assert str(err.value) == "git fetch failed: fatal: broken" and err.value.exit_code == 1
    proc = run(fail)                      # without `error` the caller reads the exit code
    assert proc.returncode == 1 and "noise" in proc.stderr
    assert run([sys.executable, "-c", "print(42)"], env={"PATH": ""}).stdout == "42\n"


def test_signal_group_stops_the_leader_and_what_it_started(tmp_path):
    """The compile's and the host runner's stop: the whole group goes, not only its leader."""
    import os
    import subprocess
    import time

    from farm.process import signal_group

    started = tmp_path / "child.pid"
    proc = subprocess.Popen(["sh", "-c", f"sleep 300 & echo $! > {started}; wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while not started.exists() or not started.read_text().strip():
        assert time.monotonic() < deadline, "the group's child never started"
        time.sleep(0.05)
    child = int(started.read_text())
    signal_group(proc, hard=True)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{child}") and "zombie" not in _state(child):
        assert time.monotonic() < deadline, "the leader's child outlived the group's stop"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next((ln for ln in fh if ln.startswith("State:")), "").lower()
    except OSError:
        return "zombie"   # gone between the two looks


def test_stop_group_returns_only_when_no_member_runs_even_one_slow_to_exit(tmp_path):
    """The CI flake of a stopped compile: kill() returns before a killed grandchild has exited. One that
    holds a gigabyte of written memory takes a visible while to free it (0.15 s for 2 GB, measured), so
    a stop that waits only for its leader returns with that member still running, every time."""
    import subprocess
    import time

    from farm.process import group_members, stop_group

    ready = tmp_path / "allocated"
    hog = f"b = b'x' * (1 << 30); open({str(ready)!r}, 'w').close(); import time; time.sleep(300)"
    proc = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{hog}" & wait'], start_new_session=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the group's memory holder never started"
        time.sleep(0.05)
    assert len(group_members(proc.pid)) == 2   # the shell and the holder: the group this test made
    stop_group(proc, grace=0.5)
    assert proc.returncode is not None and group_members(proc.pid) == []
