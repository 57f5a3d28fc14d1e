"""Which process owns a container the farm created, and whether that process is gone (design.md §8.2).

A SIGTERMed `farm build` removes its container on the way out; a SIGKILLed one cannot, and
the engine has no portable way to tie a container's life to a client process (podman's
`start --attach` client dying leaves the container running, docker's likewise). So every
container the farm creates carries `farm.owner=<host>:<pid>:<start>`, the creating process
with its start time (ticks since boot, /proc/<pid>/stat field 22), so that a reused pid
does not pass for the owner; and the next build on the host removes the labelled containers
whose owner is gone (Engine.reap_orphans). A container without the label, one whose owner
lives, or one made on another host (a shared engine) is never touched.
"""

from __future__ import annotations

import os
import socket

OWNER_LABEL = "farm.owner"
ROLE_LABEL = "farm.role"   # what the container is for: `build` (a build step) or `tool` (anything else)


def process_start(pid: int) -> str | None:
    """When `pid` started (clock ticks since boot, as the kernel keeps it), or None: no such process,
    or no /proc to ask (then a pid is all there is to go by)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode(errors="replace")
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()   # from field 3 (state) on: the name may hold spaces
    return fields[19] if len(fields) > 19 else None


def owner_value(pid: int | None = None) -> str:
    """The farm.owner label of a container created by `pid` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{process_start(pid) or '?'}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process: alive
        return True
    return True


def owner_gone(value: str) -> bool:
    """True only when `value` names a process of THIS host that no longer runs (or whose pid now
    belongs to a process started at another time). Another host's owner, or a value this farm
    did not write, is never judged gone."""
    parts = value.rsplit(":", 2)   # a host name may hold a colon; pid and start never do
    if len(parts) != 3:
        return False
    host, pid_text, start = parts
    if host != socket.gethostname() or not pid_text.isdigit() or int(pid_text) <= 0:
        return False
    pid = int(pid_text)
    if start == "?":   # written where there is no /proc: the pid is all there is
        return not _alive(pid)
    return process_start(pid) != start
