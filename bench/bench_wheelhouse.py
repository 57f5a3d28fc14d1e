"""Wheelhouse at farm scale: `farm index rebuild` over 15,000 wheels, and one publish into that house.

The wheel bodies are sparse files (64 MiB apparent, no blocks) that the
indexer cannot read: running as root, permission bits do not stop it, so the
bodies stay root-owned with mode 000 while the indexer runs as `nobody`
(setpriv) in a house that user owns; a probe checks that `nobody` really gets
EACCES on a body. As a second guard the indexer process carries an audit hook
that aborts on any open() of a .whl. Not root: mode 000 alone does it.

Baselines (same run): writing the same number of files with the same bytes
plainly (open/write/close, no fsync, no rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .figures import Figure

REPO = Path(__file__).resolve().parent.parent
N_WHEELS = 15_000
REBUILD_BUDGET = 5.0
PUBLISH_BUDGET = 0.5
BODY_SIZE = 64 << 20

CHANNELS = {  # cuda -> torch minors: 20 channels, roughly the grid's shape
    "12.6": ["2.6", "2.7", "2.8"], "12.8": ["2.7", "2.8", "2.9", "2.10", "2.11"],
    "12.9": ["2.8", "2.9", "2.10"], "13.0": ["2.9", "2.10", "2.11", "2.12", "2.13"],
    "13.2": ["2.11", "2.12", "2.13", "2.14"],
}
PYTHONS = ["3.10", "3.11", "3.12", "3.13", "3.14"]
PLATFORMS = [("manylinux_2_28_x86_64", "linux"), ("win_amd64", "windows"), ("manylinux_2_28_aarch64", "linux_aarch64")]

GUARD = """
import os, sys, json, time
def _hook(event, args):
    if event == 'open' and isinstance(args[0], (str, bytes, os.PathLike)) and os.fsdecode(args[0]).endswith('.whl') \\
            and '/files/' in os.fsdecode(args[0]) and not os.fsdecode(args[0]).startswith(os.environ['BENCH_INPUT']):
        os.write(2, b'opened a wheel body: ' + os.fsencode(args[0]) + b'\\n'); os._exit(3)
sys.addaudithook(_hook)
"""

REBUILD = GUARD + """
from farm.wheelhouse import rebuild
t = time.perf_counter(); r = rebuild(sys.argv[1]); dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "pages": r.pages, "wheels": r.wheels}))
"""

PUBLISH = GUARD + """
import statistics
from farm.wheelhouse import publish
times, pages = [], []
for w in sys.argv[2:]:
    t = time.perf_counter(); r = publish([w], sys.argv[1]); times.append(time.perf_counter() - t)
    pages.append(len(r.pages))
print(json.dumps({"seconds": statistics.median(times), "all": times, "pages": pages}))
"""


def _entries():
    from farm.wheelhouse import ManifestEntry

    meta = b"Metadata-Version: 2.1\nName: %s\nVersion: %s\nRequires-Python: >=3.10\n\n"
    projects = [(f"bench-proj{i:02d}", True) for i in range(48)] + [(f"bench-free{i}", False) for i in range(8)]
    for project, linked in projects:
        combos = ([(c, t) for c, ts in CHANNELS.items() for t in ts] if linked else [(c, None) for c in CHANNELS])
        for cuda, torch in combos:
            label = "cu" + cuda.replace(".", "") + (f"torch{torch}" if torch else "")
            for py in PYTHONS:
                for tag, plat in PLATFORMS:
                    pt = "cp" + py.replace(".", "")
                    version = f"1.0.0+{label}"
                    file = f"{project.replace('-', '_')}-{version}-{pt}-{pt}-{tag}.whl"
                    md = meta % (project.encode(), version.encode())
                    yield ManifestEntry(
                        file=file, project=project, name=project, version=version, build_tag=None,
                        python_tag=pt, abi_tag=pt, platform_tag=tag, cuda=cuda, torch=torch, platform=plat,
                        pythons=(py,), size=BODY_SIZE, sha256=hashlib.sha256(file.encode()).hexdigest(),
                        metadata_sha256=hashlib.sha256(md).hexdigest(), requires_python=">=3.10",
                        cell=f"{project}-{label}-py{py}-{plat}", build_key=hashlib.sha1(file.encode()).hexdigest(),
                        arch_list="8.0 8.6 8.9 9.0 10.0 12.0+PTX", published="2026-06-01T00:00:00.000000Z",
                        host="bench"), md


def _build_house(house: Path) -> int:
    lines = []
    for e, md in _entries():
        folder = house / "files" / e.project
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / e.file, "wb") as fh:
            fh.truncate(BODY_SIZE)  # sparse: 64 MiB apparent, no data
        (folder / (e.file + ".metadata")).write_bytes(md)
        lines.append(e.to_json())
    (house / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return len(lines)


def _as_indexer(house: Path):
    """(argv prefix, preexec) running as a user that cannot read the wheel bodies."""
    bodies = [p for p in (house / "files").rglob("*.whl")]
    for p in bodies:
        os.chmod(p, 0)
    if os.geteuid() != 0:
        return []
    nobody = pwd.getpwnam("nobody")
    for dirpath, _dirs, filenames in os.walk(house):
        os.chown(dirpath, nobody.pw_uid, nobody.pw_gid)
        for f in filenames:
            if not f.endswith(".whl"):
                os.chown(os.path.join(dirpath, f), nobody.pw_uid, nobody.pw_gid)
    return ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", "--"]


def _run(prefix: list[str], code: str, *args: str, env: dict) -> dict:
    proc = subprocess.run([*prefix, sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=REPO, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{code.splitlines()[-3]} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _plain_write(folder: Path, files: list[tuple[str, bytes]]) -> float:
    folder.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    for i, (_, data) in enumerate(files):
        with open(folder / f"f{i}", "wb") as fh:
            fh.write(data)
    return time.perf_counter() - t


def _written(house: Path, since_ns: int) -> list[tuple[str, bytes]]:
    return [(str(p), p.read_bytes()) for p in house.rglob("*")
            if p.is_file() and p.stat().st_mtime_ns >= since_ns and not p.name.endswith(".whl")]


def run() -> list[Figure]:
    sys.path.insert(0, str(REPO / "tests"))
    from wheelhouse_fixtures import make_wheel

    tmp = Path(tempfile.mkdtemp(prefix="bench-wheelhouse-"))
    os.chmod(tmp, 0o755)
    try:
        house = tmp / "wh"
        t = time.perf_counter()
        n = _build_house(house)
        setup = time.perf_counter() - t
        assert n == N_WHEELS, n
        prefix = _as_indexer(house)
        env = {**os.environ, "PYTHONPATH": str(REPO), "BENCH_INPUT": str(tmp / "input")}
        probe = next((house / "files" / "bench-proj00").glob("*.whl"))
        denied = subprocess.run([*prefix, sys.executable, "-c", f"open({str(probe)!r}, 'rb')"],
                                capture_output=True, text=True)
        if denied.returncode == 0 or "Permission" not in denied.stderr:
            raise RuntimeError("the indexer user can read wheel bodies; the benchmark would not prove anything")

        start = time.time_ns()
        cold = _run(prefix, REBUILD, str(house), env=env)
        pages_written = _written(house, start)
        start = time.time_ns()
        warm = _run(prefix, REBUILD, str(house), env=env)   # over existing pages: includes the shrink check
        base_rebuild = _plain_write(tmp / "plain1", pages_written)

        # Three publishes (torch-linked, torch-free into 5 channels, another project); the median is the figure.
        wheels = [make_wheel(tmp / "input", "bench_proj00", "1.0.1+cu128torch2.8", tags="cp312-cp312-manylinux_2_28_x86_64"),
                  make_wheel(tmp / "input", "bench_free0", "1.0.1+cu128", tags="cp312-cp312-manylinux_2_28_x86_64"),
                  make_wheel(tmp / "input", "bench_proj02", "1.0.1+cu130torch2.13", tags="cp312-cp312-win_amd64")]
        os.chmod(tmp / "input", 0o755)
        start = time.time_ns()
        pub = _run(prefix, PUBLISH, str(house), *map(str, wheels), env=env)
        pub_files = _written(house, start) + [(str(w), w.read_bytes()) for w in wheels]
        base_publish = _plain_write(tmp / "plain2", pub_files) / len(wheels)
        wheel2 = make_wheel(tmp / "input", "bench_proj01", "1.0.1+cu130torch2.13",
                            tags="cp312-cp312-manylinux_2_28_x86_64")
        t = time.perf_counter()
        cli = subprocess.run([*prefix, sys.executable, "-m", "farm", "publish", str(wheel2), "--wheelhouse", str(house)],
                             capture_output=True, text=True, cwd=REPO, env=env)
        cli_s = time.perf_counter() - t
        if cli.returncode != 0:
            raise RuntimeError(cli.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def budget(value: float, limit: float) -> str:
        return f"budget {limit:g} s: {'met' if value <= limit else 'NOT met'}"

    return [
        Figure("wheelhouse: index rebuild, 15k unreadable wheels", cold["seconds"], base_rebuild,
               note=f"{budget(cold['seconds'], REBUILD_BUDGET)}; every page written ({cold['pages']} pages, "
                    f"{len(pages_written)} files); again over existing pages (unchanged ones not rewritten) "
                    f"{warm['seconds']:.2f} s; baseline = the same files written plainly; house setup {setup:.1f} s"),
        Figure("wheelhouse: publish 1 wheel into 15k house", pub["seconds"], base_publish,
               note=f"{budget(pub['seconds'], PUBLISH_BUDGET)}; median of 3 ({', '.join(f'{t:.3f}' for t in pub['all'])} s, "
                    f"{'/'.join(map(str, pub['pages']))} pages regenerated); `farm publish` CLI wall time {cli_s:.2f} s "
                    "(interpreter + every command module's imports); baseline = the same files written plainly, per wheel"),
    ]
