"""Starting a child process, and reporting its failure in one line: the one module of farm/ that
imports `subprocess` (tests/test_layout.py checks it; issue 36).

`run` is the farm's one way to run a command whose output is read after it ends
(text, captured) and whose failure becomes a FarmError naming the command and
the line of its output that explains it. `useful_lines`, `last_useful_lines` and
`last_line` pick that line out of a child's output or a log file. `stream` is `run` for a
child whose output tells how far it is (pip's download progress): each stdout line is handed
on as it comes. `call` runs a child with its output going to a log file (or to this process's
own terminal) and returns its exit code; `spawn` starts one like that and returns it running,
by default in a process group of its own, for a caller that polls it, waits with a limit or
watches its log (a build step, a compile, a cell of `farm run`); `signal_group` stops such a
group. A caller meets `CompletedProcess`, `Popen`, `TimeoutExpired` and `DEVNULL` here too.

Exceptions, each a module that still imports `subprocess` itself, and why:
- farm/build/verify/importcheck.py: the gate's import child is long-lived and spoken to over
  its stdin and stdout pipes, one import per request; none of the calls above hands out pipes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from subprocess import DEVNULL as DEVNULL  # re-exported: the names a caller of call() and spawn() meets
from subprocess import CompletedProcess as CompletedProcess
from subprocess import Popen as Popen
from subprocess import TimeoutExpired as TimeoutExpired
from typing import IO

from farm.errors import FarmError

NO_OUTPUT = "no output"


def useful_lines(source: str | PathLike, *, skip: Callable[[str], bool] | None = None) -> list[str]:
    """The non-blank lines of a text (str) or of a file (a Path), stripped, without those `skip` matches.

    A file is read as UTF-8 with undecodable bytes replaced; OSError reaches the caller.
    """
    text = Path(source).read_text(encoding="utf-8", errors="replace") if isinstance(source, PathLike) else source
    lines = (ln.strip() for ln in (text or "").splitlines())
    return [ln for ln in lines if ln and not (skip and skip(ln))]


def last_useful_lines(source: str | PathLike, count: int, *,
                      skip: Callable[[str], bool] | None = None) -> list[str]:
    """The last `count` useful lines (see useful_lines): the tail an error line joins with ' | '."""
    return useful_lines(source, skip=skip)[-count:]


def last_line(source: str | PathLike, *, prefer: Callable[[str], object] | None = None, first: bool = False,
              skip: Callable[[str], bool] | None = None, limit: int | None = None,
              default: str = NO_OUTPUT) -> str:
    """The one line that explains a failure: the last line `prefer` matches (the first one with
    first=True), else the last useful line, else `default`; cut to `limit` characters."""
    lines = useful_lines(source, skip=skip)
    preferred = [ln for ln in lines if prefer(ln)] if prefer else []
    if preferred:
        line = preferred[0] if first else preferred[-1]
    elif lines:
        line = lines[-1]
    else:
        return default
    return line[:limit] if limit else line


def run(cmd: Sequence[str | PathLike] | str, *, cwd: str | PathLike | None = None, env: Mapping[str, str] | None = None,
        timeout: float | None = None, input: str | None = None, error: type[FarmError] | None = None,
        what: str = "", explain: Callable[[str], str] = last_line) -> subprocess.CompletedProcess[str]:
    """Run `cmd` to its end with stdout and stderr captured as text.

    With `error` set, a nonzero exit raises error(f"{what}: {explain(stderr)}"); without it the
    caller reads returncode itself. A timeout raises subprocess.TimeoutExpired as subprocess.run does.
    A string `cmd` is handed on whole: Windows' cmd.exe line, which a list would quote again.
    """
    args = cmd if isinstance(cmd, str) else [str(c) for c in cmd]
    proc = subprocess.run(args, cwd=cwd, env=None if env is None else dict(env),
                          timeout=timeout, input=input, capture_output=True, text=True)
    if error is not None and proc.returncode != 0:
        raise error(f"{what}: {explain(proc.stderr)}")
    return proc


def signal_group(proc: subprocess.Popen, *, hard: bool) -> None:
    """Signal the process group `proc` leads (started with start_new_session=True): SIGTERM, or SIGKILL when
    `hard`. Windows has neither groups nor SIGTERM: there `taskkill /T /F` ends the process tree."""
    if os.name == "nt":
        subprocess.run(["taskkill", "/T", "/F", "/PID", str(proc.pid)], capture_output=True)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL if hard else signal.SIGTERM)


# How long stop_group waits for the killed members to be gone. SIGKILL takes effect when the member next
# runs, and a member that frees gigabytes (a compiler, a linker) takes a while to exit.
GROUP_EXIT_WAIT = 10.0


def stop_group(proc: subprocess.Popen, *, grace: float = 0.0) -> None:
    """End the group `proc` leads, and return only once none of its members runs any more.

    With `grace`, SIGTERM first and SIGKILL whatever is left `grace` seconds later (or as soon as the leader
    has gone: the group outlives its leader). Waiting for the leader alone is not enough: kill() returns
    before a killed grandchild has exited, and on a loaded machine it can still be running, holding files
    and memory, when the caller goes on (design.md §6.4)."""
    if grace:
        signal_group(proc, hard=False)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    signal_group(proc, hard=True)
    proc.wait()
    deadline = time.monotonic() + GROUP_EXIT_WAIT
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def group_members(pgid: int) -> list[int]:
    """The pids of group `pgid`'s members that have not exited (zombies left out: they run nothing and
    hold no memory). Read from /proc where there is one; elsewhere only whether the group still exists.
    Windows has no groups: there signal_group's `taskkill /T /F` has ended the tree, and none is left."""
    if os.name == "nt":
        return []
    proc_root = Path("/proc")
    if not (proc_root / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
        except OSError:   # no such group any more (or not ours to signal)
            return []
        return [pgid]
    members = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:   # exited (and reaped) while we looked
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ')'.
        state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def stream(cmd: Sequence[str | PathLike], on_line: Callable[[str], None], *, cwd: str | PathLike | None = None,
           env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `cmd` to its end like run(), handing each line of its stdout to `on_line` as it is printed;
    stdout and stderr are captured too (stderr read by a thread, so neither pipe can fill and block)."""
    args = [str(c) for c in cmd]
    proc = subprocess.Popen(args, cwd=cwd, env=None if env is None else dict(env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    assert proc.stdout is not None and proc.stderr is not None
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)   # type: ignore[union-attr]
    reader.start()
    out: list[str] = []
    for line in proc.stdout:
        out.append(line)
        on_line(line.rstrip("\n"))
    code = proc.wait()
    reader.join()
    return subprocess.CompletedProcess(args, code, "".join(out), "".join(err))


Output = IO[bytes] | int | None   # an open binary file, DEVNULL, or None: this process's own stdout


def spawn(cmd: Sequence[str | PathLike], out: Output = None, *, cwd: str | PathLike | None = None,
          env: Mapping[str, str] | None = None, own_group: bool = True) -> Popen[bytes]:
    """Start `cmd` with stdin from /dev/null and its stdout and stderr both to `out`, and return it running.

    own_group: a session of its own, so that signal_group() stops the compilers it starts as well and a
    terminal's Ctrl-C reaches the farm only, which then stops the group itself."""
    return subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=None if env is None else dict(env),
                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=own_group)


def call(cmd: Sequence[str | PathLike], out: Output = None, *, cwd: str | PathLike | None = None,
         env: Mapping[str, str] | None = None, timeout: float | None = None) -> int:
    """Run `cmd` to its end as spawn(own_group=False) starts it; its exit code. Past `timeout` seconds
    the child is killed and TimeoutExpired raised, as subprocess.run does."""
    proc = spawn(cmd, out, cwd=cwd, env=env, own_group=False)
    try:
        return proc.wait(timeout=timeout)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
