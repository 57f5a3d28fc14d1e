"""What a test started itself, told apart from what other builds and test runs on this machine started.

Developers run farm builds in the background and CI runs on the same machine, so a test that asks
"is a process (or container) of mine still there?" must never count another's (issue 33 saw the
suite fail on the import check of a build running beside it). Three ways to know a thing is the test's:
- a marker variable in the environment of the command the test starts (owner_env()): every host
  process below it inherits it, wherever it has been reparented to;
- a mount from a folder of the test's own (its tmp_path): the farm mounts a build's --out folder
  into its container, so that container and every process in it have one;
- a command line holding a path of the test's own (its tmp_path), for the farm's own processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

OWNER_VAR = "CWFARM_TEST_OWNER"


def owner_env() -> dict[str, str]:
    """An environment entry no other process on the machine has: give it to the command the test starts."""
    return {OWNER_VAR: uuid.uuid4().hex}


def _pids() -> list[str]:
    return [name for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()]


def _read(pid: str, what: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{what}").read_bytes()
    except OSError:   # gone between the listing and the read, or not ours to read
        return b""


def command_line(pid: str) -> str:
    return _read(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace").strip()


def processes_mentioning(*texts: str) -> list[str]:
    """'pid: command line' of the processes whose command line holds every one of `texts`; one of them must be
    the test's own (a path under its tmp_path, a marker it made), else another build's could match."""
    found = []
    for pid in _pids():
        cmd = command_line(pid)
        if cmd and all(t in cmd for t in texts):
            found.append(f"{pid}: {cmd[:200]}")
    return found


def _fs_path(folder: Path) -> tuple[str, str]:
    """(device, path of `folder` inside its file system) as /proc/*/mountinfo shows a bind mount's source."""
    folder_text = str(Path(folder).resolve())
    best = ("", "", "")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        device, root, point = fields[2], fields[3], fields[4]
        inside = _under(folder_text, point)
        if inside and len(point) >= len(best[2]):
            best = (device, root, point)
    device, root, point = best
    rest = folder_text[len(point.rstrip("/")):] if point != "/" else folder_text
    return device, root.rstrip("/") + rest


def _mounts_from(pid: str, device: str, path: str) -> bool:
    for line in _read(pid, "mountinfo").decode(errors="replace").splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[2] == device and _under(fields[3], path):
            return True
    return False


def own_processes(owner: dict[str, str], folder: Path, *needles: bytes) -> list[str]:
    """'pid: command line' of the processes whose command line holds one of `needles` and that are the test's:
    the marker of `owner` (owner_env()) in their environment (host processes), or a mount from `folder`
    (processes in the test's containers)."""
    marker = f"{OWNER_VAR}={owner[OWNER_VAR]}".encode()
    device, path = _fs_path(folder)
    found = []
    for pid in _pids():
        if not any(n in _read(pid, "cmdline") for n in needles):
            continue
        if marker in _read(pid, "environ").split(b"\0") or _mounts_from(pid, device, path):
            found.append(f"{pid}: {command_line(pid)[:200]}")
    return found


def containers_mounting(folder: Path | str) -> list[str]:
    """Ids of the containers (running or not) with a mount from inside `folder`: the ones a build of the test's
    made. Each container is inspected on its own, so one another build removes meanwhile is simply not listed."""
    from farm.runners.engine import Engine

    engine = Engine.available()
    if engine is None:
        return []
    ids = subprocess.run([engine.exe, "ps", "-aq"], capture_output=True, text=True).stdout.split()
    found = []
    for cid in ids:
        shown = subprocess.run([engine.exe, "inspect", cid], capture_output=True, text=True)
        try:
            mounts = json.loads(shown.stdout)[0].get("Mounts") or []
        except (ValueError, IndexError):
            continue   # removed since the listing
        if any(_under(str(m.get("Source", "")), str(folder)) for m in mounts):
            found.append(cid)
    return found


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")
