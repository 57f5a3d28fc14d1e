"""`farm check-oldland`: each published Linux x86_64 wheel installed with pip from the served wheelhouse
into a venv of the old userland (farm/runners/oldland.py: Debian bullseye, glibc 2.31), beside its cell's
torch, and imported as the gate imports it (design.md §9.9).

One container per wheel, on the host's network so that pip reaches the wheelhouse served on the host's
127.0.0.1. torch and its dependencies come from the farm's downloads folder, mounted read-only and used
with --find-links: the container trusts no CA of the host's and reaches no torch index. The import is
the gate's own child (farm/build/verify/importcheck.py), with CUDA_VISIBLE_DEVICES='' and the libcuda
stub when the recipe says verify.needs_driver. When pip refuses the wheel, the wheel is unpacked by hand
and imported all the same, so the result also says what a forced install meets (`GLIBC_2.34 not found`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from farm.build.downloads import download, unmet_for_target
from farm.build.environments import torch_index
from farm.build.verify.importcheck import _CHILD, _event_problems, _modules_to_import, libcuda_stub_dir
from farm.cachebudget import downloads_in_use
from farm.errors import BadInput, FarmError, IndexUnreachable
from farm.recipes.model import Verify as VerifyKnobs
from farm.runners.engine import Engine, Mount
from farm.runners.oldland import SUITE, CPythonSource, Oldland, ensure_oldland
from farm.wheelhouse.manifest import ManifestEntry, house_folder, read_journal
from farm.wheelhouse.names import normalize
from farm.wheelhouse.wheelfile import Wheel
from farm.yamlio import write_atomic

CHECK_TIMEOUT = 1800   # one wheel: a venv, torch and its CUDA wheels unpacked, the import
_CELL_RECIPE = re.compile(r"(.+?)-cu\d+")

# Runs in the container. The venv's pip is first brought to a current release, as users are told to
# (design.md §9.9). Exit codes tell the steps apart: 10 venv,
# 11 torch, 14 torch of another CUDA than the cell's, 12 the wheel (the forced import then runs),
# 13 the import. Each step's output is kept in /check for the report.
_SCRIPT = r"""set -u
cd /tmp
"$PY" -m venv /tmp/venv > /check/venv.log 2>&1 || exit 10
PIP="/tmp/venv/bin/python -m pip --disable-pip-version-check --no-input"
$PIP install --no-index --upgrade "/downloads/$PIP_WHEEL" >> /check/venv.log 2>&1 || exit 10
if [ -n "$TORCH" ]; then
    $PIP install --no-index --find-links /downloads "$TORCH" > /check/torch.log 2>&1 || exit 11
    /tmp/venv/bin/python -c "import torch; print(torch.version.cuda)" > /check/torch-cuda.txt 2>> /check/torch.log
    case "$(cat /check/torch-cuda.txt)" in "$CUDA"|"$CUDA".*) ;; *) exit 14 ;; esac
fi
if ! $PIP install --find-links /downloads --index-url "$INDEX" "$WANT" > /check/pip.log 2>&1; then
    # An index answers a refused tag with "no matching distribution"; the file itself says why.
    $PIP install --no-deps --no-index "/wheel/$FILE" > /check/direct.log 2>&1
    mkdir /tmp/forced && "$PY" -m zipfile -e "/wheel/$FILE" /tmp/forced \
        && LD_LIBRARY_PATH="$STUB" /tmp/venv/bin/python /check/child.py "$CHILD_ARGS" < /check/forced.json \
           > /check/forced.out 2> /check/forced.err
    exit 12
fi
LD_LIBRARY_PATH="$STUB" /tmp/venv/bin/python /check/child.py "$CHILD_ARGS" < /check/plan.json \
    > /check/import.out 2> /check/import.err || exit 13
"""
_PIP_REFUSAL = re.compile(r"is not a supported wheel on this platform")


@dataclass
class OldlandResult:
    """One wheel's outcome: pass (installed and imported), fail (with the first line of the failure)
    or skip (nothing to check it with)."""

    file: str
    cell: str
    python: str
    torch: str | None
    result: str
    reason: str = ""
    forced_import: str = ""     # when pip refused: what importing the unpacked wheel gave


def _python_for(entry: ManifestEntry, image: Oldland) -> str | None:
    return next((v for v in entry.pythons if image.python(v)), None)


def _knobs(entry: ManifestEntry, recipes: dict | None) -> VerifyKnobs:
    """The recipe's verify knobs (import names, needs_driver, ...), or the defaults for a wheel of no
    known recipe (one published by hand)."""
    m = _CELL_RECIPE.match(entry.cell)
    wanted = normalize(m.group(1) if m else entry.cell)   # a cell derived from the file name: farm-demo
    recipe = next((r for name, r in (recipes or {}).items() if normalize(name) == wanted), None)
    return recipe.verify if recipe is not None else VerifyKnobs()


def _checked(entries: list[ManifestEntry]) -> list[ManifestEntry]:
    """The wheels an x86_64 Linux userland installs: Linux x86_64 tags and platform-free ones."""
    return [e for e in entries if e.platform_tag.endswith("x86_64") or e.platform_tag == "any"]


def _first_problem(stdout: str, knobs: VerifyKnobs) -> str:
    events = [json.loads(ln[len("FARM-IMPORT "):]) for ln in stdout.splitlines() if ln.startswith("FARM-IMPORT ")]
    problems, _ = _event_problems(events, knobs.expect_device_error)
    if problems:
        return problems[0]
    if not any(e["event"] == "done" for e in events):
        begun = [e["module"] for e in events if e["event"] == "begin"]
        return f"the import child died while importing {begun[-1] if begun else 'nothing yet'}"
    return ""


def _pip_line(log: Path) -> str:
    """The line that says why pip did not install the wheel: its refusal of the tag, else its last error."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    refusal = next((ln for ln in lines if _PIP_REFUSAL.search(ln)), None)
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return refusal or (errors[0] if errors else (lines[-1] if lines else "pip failed with no output"))


def fetch_requirements(wheel: Path, entry: ManifestEntry, python: str, glibc: str, served: frozenset[str],
                       cache: Path | None) -> None:
    """Download on the host, for the userland's Python and glibc, the cell's torch (from where the farm
    takes it for that CUDA) and what the wheel requires besides torch and the house's own projects
    (numpy, say): a user's pip takes those from PyPI, which the container does not reach, so they must
    be in the downloads folder its pip finds links in. An earlier build's torch may have been evicted.
    A torch the folder already holds for this target is taken from there, whatever the network."""
    if entry.torch:   # IndexUnreachable when it is in no downloads folder and its index does not answer
        download([f"torch=={entry.torch}.*"], python=python, platform="linux", glibc=glibc,
                 index=torch_index(entry.torch, entry.cuda), root=cache)
    wanted = [r for r in unmet_for_target([wheel], python, "linux")
              if canonicalize_name(Requirement(r).name) not in served | {"torch"}]
    if wanted:
        download(wanted, python=python, platform="linux", glibc=glibc, root=cache)


def check_wheel(engine: Engine, image: Oldland, entry: ManifestEntry, wheel: Path, index_url: str,
                downloads: Path, pip_wheel: str, knobs: VerifyKnobs, logs: Path,
                served: frozenset[str], cache: Path | None) -> OldlandResult:
    """Install and import one wheel in the old userland (see the module's doc); each step's output is
    kept in the folder `logs`."""
    python = _python_for(entry, image)
    result = OldlandResult(entry.file, entry.cell, python or ",".join(entry.pythons), entry.torch, "skip")
    if python is None:
        result.reason = (f"no CPython {' or '.join(entry.pythons)} in the {SUITE} userland (it builds "
                         f"{', '.join(sorted(image.pythons))}: give a source tarball with --cpython-source)")
        return result
    if knobs.skip_import:
        result.reason = f"waived: {knobs.skip_import if isinstance(knobs.skip_import, str) else 'verify.skip_import'}"
        return result
    try:
        fetch_requirements(wheel, entry, python, image.glibc, served, cache)
    except IndexUnreachable as exc:   # the network's limit, not the wheel's: a skip with its reason
        result.reason = (f"not checked here: torch {entry.torch} for CUDA {entry.cuda} is in no downloads folder "
                         f"for Python {python}, and {exc} (FARM_TORCH_INDEX_URL)")
        return result
    with tempfile.TemporaryDirectory(prefix="farm-oldland-check-") as tmp:
        check = Path(tmp)
        w = Wheel(wheel, check)
        modules, _skipped, _absent = _modules_to_import(w, knobs)
        site = f"/tmp/venv/lib/python{python}/site-packages"
        (check / "child.py").write_text(_CHILD)
        (check / "plan.json").write_text(json.dumps({"path": site, "modules": modules, "ops": list(knobs.expect_ops)}) + "\n")
        (check / "forced.json").write_text(json.dumps({"path": "/tmp/forced", "modules": modules, "ops": []}) + "\n")
        mounts = [Mount(check, "/check"), Mount(downloads, "/downloads", read_only=True),
                  Mount(wheel.parent, "/wheel", read_only=True)]
        stub = ""
        if knobs.needs_driver:   # the gate's stub is often a link into a toolkit: the container gets a copy
            (check / "stub").mkdir()
            shutil.copyfile((libcuda_stub_dir(w) / "libcuda.so.1").resolve(), check / "stub" / "libcuda.so.1")
            stub = "/check/stub"
        env = {"PY": image.pythons[python], "TORCH": f"torch=={entry.torch}.*" if entry.torch else "",
               "INDEX": index_url, "WANT": f"{entry.name}=={entry.version}", "FILE": wheel.name, "STUB": stub, "PIP_WHEEL": pip_wheel, "CUDA": entry.cuda,
               "CHILD_ARGS": json.dumps({"torch": bool(entry.torch)}), "CUDA_VISIBLE_DEVICES": "",
               "PIP_CONFIG_FILE": "/dev/null", "PYTHONDONTWRITEBYTECODE": "1"}
        res = engine.run(image.ref, ["sh", "-c", _SCRIPT], mounts=mounts, env=env, host_network=True,
                         log_path=check / "container.log", timeout=CHECK_TIMEOUT)
        result.result, result.reason = _judge(res.exit_code, res.timed_out, check, knobs, entry.cuda)
        if res.exit_code == 12:
            result.forced_import = _first_problem(_read(check / "forced.out"), knobs) or "imports"
        logs.mkdir(parents=True, exist_ok=True)
        for kept in sorted(check.glob("*.log")) + sorted(check.glob("*.out")) + sorted(check.glob("*.err")):
            shutil.copyfile(kept, logs / kept.name)
    return result


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def _judge(code: int, timed_out: bool, check: Path, knobs: VerifyKnobs, cuda: str) -> tuple[str, str]:
    if timed_out:
        return "fail", f"did not finish in {CHECK_TIMEOUT}s"
    if code == 10:
        return "fail", "venv: " + (_read(check / "venv.log").strip().splitlines() or ["failed"])[-1]
    if code == 11:
        return "fail", "torch: " + _pip_line(check / "torch.log")
    if code == 14:
        built_for = _read(check / "torch-cuda.txt").strip() or "no CUDA"
        return "fail", (f"torch: the downloads folder's torch is built for {built_for}, "
                        f"the cell's CUDA is {cuda}")
    if code == 12:
        direct = _pip_line(check / "direct.log")
        return "fail", direct if _PIP_REFUSAL.search(direct) else _pip_line(check / "pip.log")
    problem = _first_problem(_read(check / "import.out"), knobs)
    if code == 0 and not problem:
        return "pass", "installed and imported"
    return "fail", problem or f"exit {code}: " + (_read(check / "container.log").strip().splitlines() or [""])[-1]


def _current_pip(cache: Path | None) -> Path:
    """A current pip wheel in the downloads folder of `cache` (fetched once by the host's pip)."""
    found = download(["pip"], python="3.11", platform="linux", no_deps=True, root=cache).file_for("pip")
    if found is None:
        raise FarmError("the downloads folder holds no pip wheel after downloading one")
    return found


@contextlib.contextmanager
def served_index(wheelhouse: Path, index_url: str | None) -> Iterator[str]:
    """`index_url`, or the wheelhouse served by `farm serve`'s server on a free port of 127.0.0.1 meanwhile."""
    if index_url:
        yield index_url
        return
    from farm.wheelhouse.serve import make_server

    server = make_server(wheelhouse, "127.0.0.1", 0, access_log=os.devnull)   # pip's requests are no news
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


def check_oldland(wheelhouse: Path, out: Path, *, index_url: str | None = None, files: list[str] | None = None,
                  extra_sources: Sequence[CPythonSource] = (), recipes: dict | None = None,
                  engine: Engine | None = None, log: Callable[[str], None] = print,
                  cache: Path | None = None) -> list[OldlandResult]:
    """Check every live Linux x86_64 wheel of `wheelhouse` (or those named in `files`); the results
    are written to `out` as JSON, atomically, once all are known, each wheel's logs to the folder
    `<out's name>-logs/<wheel>/` beside it. Torch and the wheels' own requirements come from the
    downloads folder of `cache` (cache_dir() unless given)."""
    root = house_folder(wheelhouse)
    live = read_journal(root).live()
    served = frozenset(str(canonicalize_name(e.name)) for e in live)   # their requirements come from the house
    if files:
        known = {e.file for e in live}
        for f in files:
            if f not in known:
                raise BadInput(str(root / "manifest.jsonl"), "--wheel", f, "no such live wheel in the wheelhouse")
        live = [e for e in live if e.file in files]
    entries = _checked(live)
    engine = engine or Engine.detect()
    image = ensure_oldland(engine, list(extra_sources))
    pip_wheel = _current_pip(cache)
    results = []
    with served_index(root, index_url) as url, downloads_in_use(cache) as downloads:
        for entry in entries:
            wheel = root / "files" / entry.project / entry.file
            try:
                r = check_wheel(engine, image, entry, wheel, url, downloads, pip_wheel.name, _knobs(entry, recipes),
                                out.parent / f"{out.stem}-logs" / entry.file, served, cache)
            except FarmError as exc:
                r = OldlandResult(entry.file, entry.cell, ",".join(entry.pythons), entry.torch, "fail", str(exc))
            log(f"{r.result:4}  {r.file}" + (f": {r.reason}" if r.result != "pass" else "")
                + (f" (forced: {r.forced_import})" if r.forced_import else ""))
            results.append(r)
    doc = {"userland": SUITE, "logs": f"{out.stem}-logs", "glibc": image.glibc, "image": image.ref, "pythons": sorted(image.pythons),
           "index_url": url, "results": [asdict(r) for r in results]}
    write_atomic(out, json.dumps(doc, indent=2) + "\n")
    return results
