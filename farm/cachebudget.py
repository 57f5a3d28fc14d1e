"""Heavy cache entries: built once under a lock, used under a shared lock, evicted LRU.

An entry is a directory under cache_dir()/<kind>/ (toolkits, envs, overlays), a
file under cache_dir()/downloads/, or check-install's uv cache, cache_dir()/uv,
one entry evicted whole (uv_cache_in_use). A directory entry is complete only when its
marker (`.farm-complete.json`) exists; the marker is written last, so a crash
mid-build leaves a directory that is simply rebuilt. Users hold a shared flock
on the entry's lock file (`.<name>.lock` next to it) for as long as they use
it; eviction takes the exclusive lock without waiting, so an entry in use is
never removed. The lock file's mtime is the entry's last use (LRU order).

Budget: FARM_CACHE_BUDGET_GB (default 80; 0 = unlimited), and never more than leaves
FARM_CACHE_RESERVE_GB (default 10) of the disk free: a torch environment is ~4.7 GB.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from farm import settings
from farm.errors import FarmError
from farm.filelock import lock as lock_fd
from farm.settings import cache_dir
from farm.yamlio import write_atomic

MARKER = ".farm-complete.json"
DIR_KINDS = ("toolkits", "envs", "overlays")
DOWNLOADS = "downloads"
UV = "uv"   # check-install's uv cache: torch and its CUDA wheels unpacked, ~8 GB per torch minor
DEFAULT_BUDGET_GB = 80.0


def lock_file(entry: Path) -> Path:
    return entry.parent / f".{entry.name}.lock"


def _open_lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


@contextmanager
def flocked(path: Path, shared: bool = False, on_wait: Callable[[], None] | None = None):
    """Hold a blocking flock on `path` (created when missing). When someone else holds it,
    `on_wait` is called before waiting, so a caller can say why it stands still."""
    fd = _open_lock(path)
    try:
        if not lock_fd(fd, shared=shared, blocking=False):
            if on_wait is not None:
                on_wait()
            lock_fd(fd, shared=shared)
        yield
    finally:
        os.close(fd)


def try_exclusive(path: Path) -> int | None:
    """The fd of an exclusive lock on `path`, or None when someone holds it."""
    fd = _open_lock(path)
    if lock_fd(fd, blocking=False):
        return fd
    os.close(fd)
    return None


def read_marker(entry: Path) -> dict | None:
    try:
        return json.loads((entry / MARKER).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def tree_size(path: Path) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                total += st.st_blocks * 512 if st.st_blocks else st.st_size
    return total


def make_read_only(path: Path) -> None:
    """Drop write bits everywhere below `path` (a signal to tools and non-root users)."""
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            p = os.path.join(root, name)
            st = os.lstat(p)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o222)
    os.chmod(path, stat.S_IMODE(os.stat(path).st_mode) & ~0o222)


def remove_tree(path: Path) -> None:
    """rmtree that also works on read-only trees."""
    def writable(func, p, _exc):
        os.chmod(os.path.dirname(p), 0o755)
        if not os.path.islink(p) and os.path.isdir(p):
            os.chmod(p, 0o755)
        func(p)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        os.chmod(path, 0o755)
        shutil.rmtree(path, onerror=writable)


class Lease:
    """A shared lock on a complete entry, held until close() (or process exit)."""

    def __init__(self, entry: Path, fd: int, info: dict, built: bool):
        self.entry, self.info, self.built = entry, info, built
        self._fd: int | None = fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def acquire(entry: Path, build: Callable[[Path], dict], *, read_only: bool = True) -> Lease:
    """Return a shared lease on the complete entry, building it first when needed.

    `build(entry)` fills the (fresh, empty) directory and returns metadata for
    the marker. It runs under the exclusive lock, so concurrent callers wait
    and then reuse the result. Anything left by an earlier crash is removed first.
    """
    lock = lock_file(entry)
    built = False
    for _attempt in range(3):
        info = read_marker(entry)
        if info is None:
            with flocked(lock):
                info = read_marker(entry)
                if info is None:
                    if entry.exists() or entry.is_symlink():
                        remove_tree(entry)  # half-built by a crashed run
                    entry.mkdir(parents=True)
                    try:
                        info = dict(build(entry))
                    except BaseException:
                        remove_tree(entry)
                        raise
                    info.setdefault("created", time.time())
                    info["size_bytes"] = tree_size(entry)
                    if read_only:
                        make_read_only(entry)
                    os.chmod(entry, 0o755)  # the marker goes in; the tree below stays read-only
                    write_atomic(entry / MARKER, json.dumps(info, indent=1, sort_keys=True))
                    os.chmod(entry / MARKER, 0o444)
                    if read_only:
                        os.chmod(entry, 0o555)
                    built = True
        fd = _open_lock(lock)
        lock_fd(fd, shared=True)
        info = read_marker(entry)
        if info is not None:          # not evicted between build and lease
            os.utime(lock)
            return Lease(entry, fd, info, built)
        os.close(fd)
    raise FarmError(f"cache entry {entry} keeps disappearing (evicted while being acquired?)")


@contextmanager
def downloads_in_use(root: Path | None = None):
    """Shared lock over the downloads folder while reading or adding files (eviction waits for none)."""
    d = (root or cache_dir()) / DOWNLOADS
    with flocked(d / ".downloads.lock", shared=True):
        yield d


@contextmanager
def uv_cache_in_use(root: Path | None = None, log=None):
    """check-install's uv cache, under a shared lock while the check uses it (eviction takes the whole
    folder, and only when no check holds it). Afterwards its size is noted for the budget, which is
    then enforced: uv's cache grew to 23 GB over three torch minors, unseen by the budget."""
    root = root or cache_dir()
    folder = root / UV
    folder.mkdir(parents=True, exist_ok=True)
    with flocked(lock_file(folder), shared=True):
        os.utime(lock_file(folder))
        try:
            yield folder
        except BaseException:
            # an interrupted or failed check does not walk a tree of 20 GB on its way out: the noted size
            # goes, and the next budget check measures the folder itself
            (folder / MARKER).unlink(missing_ok=True)
            raise
        write_atomic(folder / MARKER, json.dumps({"kind": UV, "size_bytes": tree_size(folder)}))
    enforce_budget(root, log=log)


def touch(paths: Iterable[Path]) -> None:
    now = time.time()
    for p in paths:
        try:
            os.utime(p, (now, now))
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------- budget

@dataclass(frozen=True)
class Usage:
    path: Path
    kind: str
    size: int
    last_used: float


def budget_bytes() -> int | None:
    raw = (settings.CACHE_BUDGET_GB.get() or "").strip()
    try:
        gb = float(raw) if raw else DEFAULT_BUDGET_GB
    except ValueError:
        from farm.errors import BadInput
        raise BadInput("environment", settings.CACHE_BUDGET_GB.name, raw, "expected a number of GB (0 = unlimited)") from None
    return None if gb <= 0 else int(gb * 1024**3)


PENDING = ".pending"   # reservations: bytes writers are about to put into the cache (room_for)
# A reservation's payload starts after one padding byte: a Windows lock (farm/filelock.py) covers the
# file's first byte, and reading a byte another process has locked there fails.
RESERVATION_PAD = b" "


@contextmanager
def room_for(entry: Path, nbytes: int, root: Path | None = None, log=None, keep: Iterable[Path] = ()):
    """Reserve `nbytes` for the cache directory `entry` while the caller writes it, after making room
    for them and for every other writer's reservation: two environments installed at once each make
    room for both, where each making room for its own filled a shared disk. A reservation is a file
    under PENDING held under an exclusive flock for as long as its writer lives (a dead writer's
    lock is gone, and so its reservation counts for nothing); `keep` as for enforce_budget."""
    root = root or cache_dir()
    folder = root / PENDING
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(folder / f".{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        lock_fd(fd)   # before the name readers look at: a visible reservation is always a held one
        os.write(fd, RESERVATION_PAD + json.dumps({"entry": os.path.relpath(entry, root), "bytes": nbytes}).encode())
        os.replace(folder / f".{name}", folder / name)
        enforce_budget(root, log=log, keep=keep)
        yield
    finally:
        (folder / name).unlink(missing_ok=True)
        (folder / f".{name}").unlink(missing_ok=True)
        os.close(fd)


def reservations(root: Path | None = None) -> dict[Path, int]:
    """The bytes live writers have reserved, by the entry they write; a dead writer's file goes."""
    root = root or cache_dir()
    out: dict[Path, int] = {}
    folder = root / PENDING
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.name.startswith("."):
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.lseek(fd, len(RESERVATION_PAD), os.SEEK_SET)   # past the byte a Windows lock covers
            data = json.loads(os.read(fd, 4096) or b"{}")
            if lock_fd(fd, shared=True, blocking=False):   # nobody holds it: its writer died
                path.unlink(missing_ok=True)
                continue
        except ValueError:
            continue
        finally:
            os.close(fd)
        entry = root / data["entry"]
        out[entry] = out.get(entry, 0) + int(data["bytes"])
    return out


def usage(root: Path | None = None, pending: dict[Path, int] | None = None) -> list[Usage]:
    """Every evictable entry with its size. An incomplete directory that a writer has reserved room for
    counts as the larger of what it holds and the reservation (`pending`, from reservations())."""
    root = root or cache_dir()
    pending = pending or {}
    folders = [(kind, entry) for kind in DIR_KINDS if (root / kind).is_dir()
               for entry in (root / kind).iterdir() if not entry.name.startswith(".") and entry.is_dir()]
    if (root / UV).is_dir():
        folders.append((UV, root / UV))
    out: list[Usage] = []
    for kind, entry in folders:
        info = read_marker(entry)
        size = info["size_bytes"] if info else max(tree_size(entry), pending.get(entry, 0))
        lock = lock_file(entry)
        when = lock.stat().st_mtime if lock.exists() else entry.stat().st_mtime
        out.append(Usage(entry, kind, size, when))
    dl = root / DOWNLOADS
    if dl.is_dir():
        for f in dl.iterdir():
            if f.is_file() and f.suffix == ".whl":
                st = f.stat()
                out.append(Usage(f, DOWNLOADS, st.st_size, st.st_mtime))
    return out


def unpacked_size(wheels: Iterable[Path]) -> int:
    """The bytes installing these wheels writes, read from their zip directories (nothing unpacked)."""
    import zipfile

    total = 0
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            total += sum(info.file_size for info in zf.infolist())
    return total


def enforce_budget(root: Path | None = None, budget: int | None = -1, log=None,
                   keep: Iterable[Path] = ()) -> list[Path]:
    """Evict least recently used entries until the caches, and the bytes writers have reserved
    (room_for), fit the budget; return what went.

    `keep` names what the caller is about to hand back (a download's files): never evicted here,
    however tight the disk, or a caller would return paths that are already gone.
    """
    root = root or cache_dir()
    configured = budget == -1
    budget = budget_bytes() if configured else budget
    if budget is None:
        return []
    kept = {Path(p) for p in keep}
    pending = reservations(root)
    every = usage(root, pending)
    listed = {u.path for u in every}
    # what is kept still counts against the budget, and so does what writers are about to write
    total = sum(u.size for u in every) + sum(n for entry, n in pending.items() if entry not in listed)
    entries = [u for u in every if u.path not in kept]
    if configured:   # the configured budget never outgrows the disk (an explicit one is taken as given)
        reserve = int(float(settings.CACHE_RESERVE_GB.value()) * 1024**3)
        budget = min(budget, total + shutil.disk_usage(root).free - reserve)
    removed: list[Path] = []
    if total <= budget:
        return removed
    dl_fd = None
    try:
        for u in sorted(entries, key=lambda u: u.last_used):
            if total <= budget:
                break
            if u.kind == DOWNLOADS:
                if dl_fd is None:
                    dl_fd = try_exclusive(root / DOWNLOADS / ".downloads.lock")
                    if dl_fd is None:
                        dl_fd = -1   # downloads busy: skip them this round
                if dl_fd == -1:
                    continue
                u.path.unlink(missing_ok=True)
            else:
                fd = try_exclusive(lock_file(u.path))
                if fd is None:
                    continue          # in use
                try:
                    if (u.path / MARKER).exists():
                        os.chmod(u.path, 0o755)
                    (u.path / MARKER).unlink(missing_ok=True)   # no longer complete, then gone
                    remove_tree(u.path)
                finally:
                    os.close(fd)
            total -= u.size
            removed.append(u.path)
            if log:
                log(f"cache: evicted {u.kind}/{u.path.name} ({u.size / 1024**3:.2f} GB, least recently used)")
    finally:
        if dl_fd not in (None, -1):
            os.close(dl_fd)
    return removed
