"""Advisory locks on an open file descriptor, the one place that tells POSIX from Windows.

POSIX: flock, shared or exclusive. Windows has no flock: a lock on the file's first byte
(msvcrt), where a shared lock is taken as an exclusive one. Readers then wait for each other
instead of overlapping, which costs nothing on a Windows runner that builds one cell at a time.
Either way closing the descriptor drops the lock.
"""

from __future__ import annotations

import os
import sys
import time


def lock(fd: int, *, shared: bool = False, blocking: bool = True) -> bool:
    """Lock `fd`'s file; False, without waiting, when `blocking` is off and someone else holds it."""
    if sys.platform == "win32":
        import msvcrt

        while True:
            try:
                os.lseek(fd, 0, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                return True
            except OSError:
                if not blocking:
                    return False
                time.sleep(0.1)
    import fcntl

    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True
