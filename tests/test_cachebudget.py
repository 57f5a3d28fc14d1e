"""Cache entries: built once under a lock, never seen half-built, evicted least-recently-used
under FARM_CACHE_BUDGET_GB, never while another process uses them (real flock, real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm import cachebudget as C


def _filler(size: int):
    def build(path: Path) -> dict:
        (path / "blob").write_bytes(os.urandom(size))
        return {"kind": "test"}
    return build


def test_a_crash_mid_build_leaves_nothing_that_looks_complete(tmp_path):
    entry = tmp_path / "envs" / "e1"

    def crash(path: Path) -> dict:
        (path / "half").write_text("x")
        raise RuntimeError("killed mid-build")

    with pytest.raises(RuntimeError):
        C.acquire(entry, crash)
    assert not entry.exists() and C.read_marker(entry) is None
    # A directory left by a hard kill (no marker) is rebuilt, not used.
    entry.mkdir(parents=True)
    (entry / "stale").write_text("x")
    lease = C.acquire(entry, _filler(10))
    assert lease.built and not (entry / "stale").exists() and (entry / "blob").exists()
    lease.close()
    again = C.acquire(entry, crash)          # complete: the builder is not called
    assert not again.built and again.info["kind"] == "test"
    again.close()


def test_concurrent_builders_build_once(tmp_path):
    entry = tmp_path / "toolkits" / "t1"
    project = str(Path(__file__).resolve().parent.parent)
    code = "\n".join([
        "import sys, time",
        f"sys.path.insert(0, {project!r})",
        "from pathlib import Path",
        "from farm import cachebudget as C",
        "def b(p):",
        "    time.sleep(1.0); (p / 'n').write_text('x')",
        f"    with open({str(tmp_path / 'count')!r}, 'a') as f: f.write('built\\n')",
        "    return {}",
        f"C.acquire(Path({str(entry)!r}), b).close()",
    ])
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(3)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    assert (tmp_path / "count").read_text() == "built\n"


def test_eviction_is_lru_within_budget_and_spares_entries_in_use(tmp_path):
    mib = 1024 * 1024
    entries = [tmp_path / "envs" / f"e{i}" for i in range(4)]
    for i, e in enumerate(entries):
        C.acquire(e, _filler(mib)).close()
        os.utime(C.lock_file(e), (1000 + i, 1000 + i))     # e0 oldest ... e3 newest
    dl = tmp_path / "downloads"
    dl.mkdir()
    (dl / "old-1.0-py3-none-any.whl").write_bytes(b"x" * mib)
    os.utime(dl / "old-1.0-py3-none-any.whl", (500, 500))
    # Another process uses e0 (the oldest): it must survive.
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_SH);"
         " print('held', flush=True); time.sleep(60)", str(C.lock_file(entries[0]))],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        removed = C.enforce_budget(tmp_path, budget=int(2.5 * mib))
    finally:
        holder.kill()
        holder.wait()
    names = [p.name for p in removed]
    assert names == ["old-1.0-py3-none-any.whl", "e1", "e2"]
    assert entries[0].exists() and entries[3].exists()
    assert not entries[1].exists() and not entries[2].exists()


def test_check_installs_uv_cache_counts_against_the_budget_and_goes_whole_only_when_unused(tmp_path, monkeypatch):
    # the check's own budget pass must not depend on this machine's free disk (clean3 ran at <10 GB free)
    monkeypatch.setenv("FARM_CACHE_RESERVE_GB", "0")
    mib = 1024 * 1024
    with C.uv_cache_in_use(tmp_path) as uv:
        (uv / "archive-v0").mkdir()
        (uv / "archive-v0" / "torch.so").write_bytes(os.urandom(2 * mib))
        assert C.enforce_budget(tmp_path, budget=mib) == []   # counted, but a check is using it
        assert (uv / "archive-v0" / "torch.so").exists()
    (entry,) = [u for u in C.usage(tmp_path) if u.kind == C.UV]
    assert entry.path == uv and entry.size >= 2 * mib     # noted when the check ended
    assert C.enforce_budget(tmp_path, budget=mib) == [uv]
    assert not uv.exists()


def test_an_interrupted_check_leaves_its_uv_cache_to_be_measured_by_the_next_budget_check(tmp_path, monkeypatch):
    # the check's own budget pass must not depend on this machine's free disk (clean3 ran at <10 GB free)
    monkeypatch.setenv("FARM_CACHE_RESERVE_GB", "0")
    mib = 1024 * 1024
    with C.uv_cache_in_use(tmp_path) as uv:
        pass
    assert C.read_marker(uv)["size_bytes"] < mib
    with pytest.raises(KeyboardInterrupt), C.uv_cache_in_use(tmp_path) as uv:
        (uv / "torch.so").write_bytes(os.urandom(2 * mib))
        raise KeyboardInterrupt
    assert C.read_marker(uv) is None                 # the old, smaller size is not believed
    (entry,) = [u for u in C.usage(tmp_path) if u.kind == C.UV]
    assert entry.size >= 2 * mib


_HOLDER = """
import sys
from pathlib import Path
from farm import cachebudget as C
root = Path(sys.argv[1])
with C.room_for(root / "envs" / "other", int(sys.argv[2]), root):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_room_is_made_for_every_writers_reservation_before_each_writes(tmp_path, monkeypatch):
    """Two installs at once (one in another process): the second makes room for both, and evicts the
    oldest entry although its own bytes alone would fit; once the other writer is killed, its
    reservation counts for nothing and its file goes."""
    mib = 1024 * 1024
    monkeypatch.setenv("FARM_CACHE_BUDGET_GB", str(3.5 * mib / 1024**3))
    monkeypatch.setenv("FARM_CACHE_RESERVE_GB", "0")   # the machine's free disk plays no part here
    entries = [tmp_path / "envs" / f"e{i}" for i in range(2)]
    for i, e in enumerate(entries):
        C.acquire(e, _filler(mib)).close()
        os.utime(C.lock_file(e), (1000 + i, 1000 + i))
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path), str(mib)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"   # 2 MiB + its 1 MiB fit in 3.5: nothing went
        assert all(e.exists() for e in entries)
        assert C.reservations(tmp_path) == {tmp_path / "envs" / "other": mib}
        # a Windows lock covers the file's first byte, which a reader may not read: no payload there
        (held,) = (tmp_path / C.PENDING).iterdir()
        assert held.read_bytes()[:1] == C.RESERVATION_PAD and json.loads(held.read_bytes()[1:])["bytes"] == mib
        mine = tmp_path / "envs" / "mine"
        mine.mkdir()
        with C.room_for(mine, mib, tmp_path):
            assert not entries[0].exists() and entries[1].exists()   # 2 + 1 + 1 MiB did not fit
            # an entry being written counts as the larger of its bytes and its reservation, once
            assert [u.size for u in C.usage(tmp_path, C.reservations(tmp_path)) if u.path == mine] == [mib]
    finally:
        holder.kill()
        holder.wait()
    assert C.reservations(tmp_path) == {}                      # the killed writer's lock went with it
    assert not list((tmp_path / C.PENDING).iterdir())


def test_the_bytes_a_wheel_installs_are_read_from_its_zip_directory(tmp_path):
    import zipfile
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x/big.bin", b"\0" * 100_000)
        zf.writestr("x/small.py", "A = 1\n")
    assert wheel.stat().st_size < 10_000
    assert C.unpacked_size([wheel]) == 100_006


def test_budget_setting_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("FARM_CACHE_BUDGET_GB", "0")
    assert C.budget_bytes() is None
    monkeypatch.setenv("FARM_CACHE_BUDGET_GB", "1.5")
    assert C.budget_bytes() == int(1.5 * 1024**3)
    monkeypatch.setenv("FARM_CACHE_BUDGET_GB", "lots")
    with pytest.raises(Exception) as err:
        C.budget_bytes()
    assert "FARM_CACHE_BUDGET_GB" in str(err.value)


def test_lease_marks_last_use(tmp_path):
    entry = tmp_path / "overlays" / "o1"
    C.acquire(entry, _filler(1)).close()
    os.utime(C.lock_file(entry), (1000, 1000))
    C.acquire(entry, _filler(1)).close()
    assert C.lock_file(entry).stat().st_mtime > time.time() - 60


def test_filelock_exclusive_against_shared_and_released_on_close(tmp_path):
    """farm.filelock, which cachebudget, the journal and `farm build`'s cell lock take (flock here; its
    Windows branch cannot run on this host)."""
    from farm.filelock import lock

    path = tmp_path / "x.lock"
    first, second = (os.open(path, os.O_RDWR | os.O_CREAT) for _ in range(2))
    try:
        assert lock(first, shared=True) and lock(second, shared=True, blocking=False)   # readers share
        os.close(second)
        second = os.open(path, os.O_RDWR)
        assert not lock(second, blocking=False)            # a writer does not get in beside a reader
        os.close(first)                                     # closing drops the lock
        assert lock(second, blocking=False)
        third = os.open(path, os.O_RDWR)
        assert not lock(third, shared=True, blocking=False)  # nor a reader beside a writer
        os.close(third)
    finally:
        os.close(second)
