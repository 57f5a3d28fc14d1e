"""`farm check-install`: what a user meets who installs from the served index (design.md §9.8).

A cell of the install matrix is one (channel, Python, platform) the wheelhouse serves. For each cell
this host can run (its platform, a Python of that line here) and each installer (pip, uv):
- a fresh venv of that Python;
- the channel's torch, installed as a user installs it before the farm's wheels. The exact torch
  the wheels were built against comes from the farm's own torch downloads (find-links, offline):
  the PyTorch index is out of reach here, and the downloads are the same files. uv installs it in
  both rows, hard-linking from its cache: pip would unpack 4.7 GB per venv;
- every package of the channel, one after another, with the very line the channel page prints
  (farm.arch.find.pip_words / uv_words), the channel served by `farm serve`'s server on 127.0.0.1;
- each package imported as the gate imports it (design.md §7.7), a libcuda stub standing in for the
  user's driver.
Each (package, cell, installer) is "installs and imports" or "fails" with the failure's first line.
The matrix is written as install-matrix.json and the page install/ (farm.pages.installmatrix), both
in one atomic write.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from farm.cachebudget import uv_cache_in_use
from farm.errors import BadInput, FarmError
from farm.pages.installmatrix import MATRIX_FILE, PAGE, WORKS, render_install_page
from farm.platforms import LABELS, cell_suffix, host_platform
from farm.process import TimeoutExpired, last_line, run
from farm.settings import cache_dir, display
from farm.versions import cuda_tag, vtuple
from farm.wheelhouse.index import FILES, Config, House, channel_root
from farm.wheelhouse.manifest import ManifestEntry, house_folder, read_journal

if TYPE_CHECKING:
    from farm.build.downloads import DownloadSet

INSTALLERS = ("pip", "uv")
FAILS = "fails"
TORCH_FROM = ("the farm's own torch downloads (--find-links, offline), the files the wheels were built "
              "against: the PyTorch index is out of reach from this host")
STEP_TIMEOUT = 1800.0   # seconds per install command (a cold uv cache unpacks torch and its CUDA wheels)


@dataclass(frozen=True)
class Package:
    """One project's newest wheel for a cell."""

    project: str
    version: str
    file: str
    links_torch: bool

    @property
    def pin(self) -> str:
        return f"{self.project}=={self.version}"


@dataclass(frozen=True)
class Cell:
    """A (channel, Python, platform) the wheelhouse serves, with its packages and its torch."""

    cuda: str
    torch: str
    python: str
    platform: str
    torch_pin: str | None
    packages: tuple[Package, ...]

    @property
    def id(self) -> str:
        return f"{cuda_tag(self.cuda)}-torch{self.torch}-py{self.python.replace('.', '')}{cell_suffix(self.platform)}"

    @property
    def channel(self) -> str:
        return channel_root(self.cuda, self.torch) + "/"


def plan_cells(root: Path) -> list[Cell]:
    """Every cell of the house at `root`, from its journal: per channel, Python and platform, the newest
    live (not yanked) wheel of each project. A platform-independent wheel counts on this host's platform."""
    from packaging.version import Version

    entries = read_journal(root).entries
    house = House.derive(entries, Config.load(root))
    newest: dict[tuple[str, str, str, str], dict[str, ManifestEntry]] = defaultdict(dict)
    pins: dict[tuple[str, str], set[str]] = defaultdict(set)
    for e in entries:
        if e.file in house.yanked:
            continue
        if e.torch and e.extra.get("torch"):
            pins[(e.cuda, e.torch)].add(str(e.extra["torch"]))
        for cuda, torch in house.channels_of(e):
            for python in e.pythons:
                held = newest[(cuda, torch, python, e.platform or host_platform())]
                if e.project not in held or Version(e.version) > Version(held[e.project].version):
                    held[e.project] = e
    cells = []
    for (cuda, torch, python, platform), held in newest.items():
        packages = tuple(Package(e.project, e.version, e.file, e.torch is not None) for _, e in sorted(held.items()))
        cells.append(Cell(cuda, torch, python, platform, _torch_pin(cuda, torch, platform, pins), packages))
    return sorted(cells, key=lambda c: (vtuple(c.cuda), vtuple(c.torch), c.platform, vtuple(c.python)))


def _why_no_cells(root: Path) -> str:
    """Why a house gives the matrix no cell: nothing live, or only torch-free wheels, which a user installs
    after torch from a channel of their CUDA line, and this house has none of those yet."""
    house = House.derive(read_journal(root).entries, Config.load(root))
    free = sorted({e.project for e in house.entries if e.file not in house.yanked and not e.torch})
    if not free:
        return "publishes no wheel: nothing to install"
    lines = sorted({cuda_tag(e.cuda) for e in house.entries if e.file not in house.yanked and not e.torch})
    return (f"publishes only torch-free wheels ({', '.join(free)}; {', '.join(lines)}), and no channel of their CUDA "
            f"line to install them in beside torch: name one in config.json's channels, e.g. [\"13.0\", \"2.13\"]")


def _torch_pin(cuda: str, torch: str, platform: str, pins: dict[tuple[str, str], set[str]]) -> str | None:
    """The torch the channel's wheels were built against (their build records), else the grid's pin."""
    recorded = pins.get((cuda, torch))
    if recorded:
        return max(recorded, key=vtuple)
    try:
        from farm.matrix.grid import load_grid
        from farm.policy import load_defaults

        row = load_grid(load_defaults().folder).row(cuda, torch)
        return row.pin(platform) if row is not None else None
    except FarmError:
        return None


# ---------------------------------------------------------------- one cell

@dataclass
class Tools:
    """What every cell uses: the served index, uv, its cache, the recipes' verify knobs, the work folder."""

    base_url: str
    root: Path
    work: Path
    uv: str
    uv_cache: Path
    knobs: dict            # PEP 503 project name -> farm.recipes.model.Verify
    log: Callable[[str], None]


def _env(tools: Tools) -> dict[str, str]:
    """pip and uv as a user's would run, minus this machine's own settings (PIP_*, UV_*, PYTHONPATH)."""
    from farm.build.downloads import isolated_pip_env

    env = {k: v for k, v in isolated_pip_env().items() if not k.startswith("UV_")}
    env.update({"UV_CACHE_DIR": str(tools.uv_cache), "UV_NO_CONFIG": "1", "UV_LINK_MODE": "hardlink",
                "UV_PYTHON_DOWNLOADS": "never"})
    return env


_ERROR = re.compile(r"(ERROR:|error:|×)")
_REASON = re.compile(r"^(cause:|╰─▶)\s*")
_PIP_CRASH = "ERROR: Exception:"   # pip's own bug: a traceback follows, its last line says what broke
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b.*")


def first_line(output: str) -> str:
    """The failure's first line: pip's `ERROR: ...`, uv's `error: ...` or `× ...` with the reason uv
    gives below it (`cause:` or `╰─▶`, wrapped over lines) joined on, else the last useful line. A pip
    that crashed says `ERROR: Exception:` and a traceback: the exception it ends with is joined on."""
    lines = [ln.strip() for ln in output.splitlines()]
    for i, line in enumerate(lines):
        if not _ERROR.match(line):
            continue
        if line == _PIP_CRASH:
            raised = [ln for ln in lines[i + 1:] if _RAISED.match(ln)]
            return f"{line} {raised[-1]}"[:400] if raised else line
        if i + 1 < len(lines) and _REASON.match(lines[i + 1]):
            reason = []
            for more in lines[i + 1:]:
                if not more or more.startswith(("hint:", "help:")) or _ERROR.match(more):
                    break
                reason.append(_REASON.sub("", more))
            line = f"{line.rstrip(':')}: {' '.join(reason)}"
        return line[:400]
    return last_line(output, limit=400)


def _run_step(cmd: list[str], tools: Tools) -> str | None:
    """None when `cmd` succeeds, else its failure's first line."""
    try:
        proc = run(cmd, env=_env(tools), timeout=STEP_TIMEOUT)
    except OSError as exc:
        return f"{cmd[0]}: {exc.strerror or exc}"
    except TimeoutExpired:
        return f"{Path(cmd[0]).name} did not finish in {STEP_TIMEOUT:.0f} s"
    return None if proc.returncode == 0 else first_line(proc.stderr + "\n" + proc.stdout)


def left_behind(checked: Iterable[Path], following: Iterable[Path]) -> list[str]:
    """The distributions (PEP 503 names) among the wheel files of the torch just checked that the next torch
    does not install at the same version: torch itself, and the CUDA runtime wheels and triton that
    changed with it. Those the next torch shares stay in uv's cache."""
    from packaging.utils import parse_wheel_filename

    def distributions(files: Iterable[Path]) -> set[tuple[str, str]]:
        parsed = (parse_wheel_filename(f.name) for f in files if f.name.endswith(".whl"))
        return {(str(name), str(version)) for name, version, _build, _tags in parsed}

    kept = distributions(following)
    return sorted({name for name, version in distributions(checked) if (name, version) not in kept})


def forget_torch(tools: Tools, pin: str | None, checked: Iterable[Path], following: Iterable[Path]) -> None:
    """Drop a torch from uv's cache once the cells of its version are checked (cells come in torch
    order, so no later cell installs it again): torch, ~2 GB unpacked a Python, and the runtime wheels
    the next torch does not share. Dropping torch alone left 16 GB after three torch minors."""
    names = left_behind(checked, following)
    if not names:
        return
    failed = _run_step([tools.uv, "cache", "clean", *names], tools)
    tools.log(f"uv cache: torch {pin}'s wheels " + (f"not removed: {failed}" if failed else
                                                     f"removed ({len(names)}: {', '.join(names)})"))


def _words(installer: str, python: Path, tools: Tools, cell: Cell, package: Package) -> list[str]:
    """The channel page's line for `installer`, run with the venv's interpreter."""
    from farm.arch.find import pip_words, uv_words

    url = tools.base_url + cell.channel
    if installer == "pip":
        return [str(python), "-m", *pip_words(url, package.pin), "--disable-pip-version-check", "--no-input"]
    return [tools.uv, *uv_words(url, package.pin)[1:], "--python", str(python)]


def torch_download(cell: Cell) -> tuple[DownloadSet | None, str | None]:
    """The cell's torch and what it installs with, from the farm's downloads (cached); else why not."""
    from farm.build.environments import EnvRequest, download_environment

    if cell.torch_pin is None:
        return None, f"no torch pin for {cell.channel} (no build record names it, no grid row)"
    try:
        return download_environment(EnvRequest(cell.python, cell.torch_pin, cell.cuda, cell.platform)), None
    except FarmError as exc:
        return None, f"torch {cell.torch_pin}: {exc}"


def check_cell(cell: Cell, tools: Tools, installers: Iterable[str],
               torch: tuple[DownloadSet | None, str | None]) -> dict[str, dict[str, dict]]:
    """project -> installer -> {"status", "error"?, "seconds"} for one cell, given its torch_download."""
    from farm.build.environments import venv_python
    from farm.runners.host import HostRunner

    results: dict[str, dict[str, dict]] = {p.project: {} for p in cell.packages}

    def all_fail(installer: str, why: str) -> None:
        for p in cell.packages:
            results[p.project][installer] = {"status": FAILS, "error": why}

    interpreter = HostRunner().python(cell.python)[0]
    torch_files, torch_why = torch
    for installer in installers:
        if torch_why is not None:
            all_fail(installer, torch_why)
            continue
        assert torch_files is not None and cell.torch_pin is not None
        venv = tools.work / f"{cell.id}-{installer}"
        t0 = time.monotonic()
        try:
            why = _run_step([interpreter, "-m", "venv", *([] if installer == "pip" else ["--without-pip"]), str(venv)],
                            tools)
            python = venv_python(venv)
            if why is None:
                why = _run_step([tools.uv, "pip", "install", "--python", str(python), "--no-index", "--find-links",
                                 str(torch_files.files[0].parent), f"torch=={cell.torch_pin}"], tools)
                why = None if why is None else f"torch {cell.torch_pin}: {why}"
            if why is not None:
                all_fail(installer, why)
                continue
            tools.log(f"{cell.id} {installer}: fresh venv with torch {cell.torch_pin} in {time.monotonic() - t0:.0f} s")
            for package in cell.packages:
                t1 = time.monotonic()
                why = _run_step(_words(installer, python, tools, cell, package), tools)
                if why is None:
                    why = _import_problem(python, package, tools)
                entry = {"status": WORKS if why is None else FAILS, "seconds": round(time.monotonic() - t1, 1)}
                if why is not None:
                    entry["error"] = why
                results[package.project][installer] = entry
                tools.log(f"{cell.id} {installer}: {package.pin}: {entry['status']}" + (f": {why}" if why else ""))
        finally:
            shutil.rmtree(venv, ignore_errors=True)
    return results


def _import_problem(python: Path, package: Package, tools: Tools) -> str | None:
    """None when the package imports in the venv as the gate would import it, else the first problem."""
    from farm.build.verify.importcheck import import_installed, libcuda_stub_dir
    from farm.recipes.model import Verify
    from farm.wheelhouse.wheelfile import Wheel

    workdir = Path(tempfile.mkdtemp(prefix="import-", dir=tools.work))
    wheel = Wheel(tools.root / FILES / package.project / package.file, workdir)
    try:
        try:
            stub = libcuda_stub_dir(wheel)
        except FarmError as exc:
            return f"no libcuda stub to import with: {exc}"
        problems = import_installed(python, package.links_torch, wheel, tools.knobs.get(package.project, Verify()),
                                    library_path=stub)
        return problems[0][:400] if problems else None
    finally:
        if wheel.zip is not None:
            wheel.zip.close()
        shutil.rmtree(workdir, ignore_errors=True)


# ---------------------------------------------------------------- the matrix

def _recipe_knobs() -> dict:
    """The recipes' verify knobs by project name; none when the recipes cannot be read (defaults then)."""
    from farm.recipes.reader import load_recipes
    from farm.wheelhouse.names import normalize

    try:
        return {normalize(r.name): r.verify for r in load_recipes().values()}
    except FarmError:
        return {}


def _uv_binary() -> str:
    try:
        from uv import find_uv_bin  # the `uv` wheel (the project's test extra)

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
    if found is None:
        raise BadInput("command line", "--installer", "uv", "uv is not installed here (pip install uv), "
                                                            "or check with --installer pip only")
    return found


def check_install(wheelhouse, installers: Iterable[str] = INSTALLERS, log: Callable[[str], None] = print) -> dict:
    """Check every cell of the house (design.md §9.8), write install-matrix.json and install/ atomically,
    and return the matrix."""
    from farm.runners.host import HostRunner
    from farm.wheelhouse.index import write_files
    from farm.wheelhouse.serve import make_server

    root = house_folder(wheelhouse)
    installers = tuple(dict.fromkeys(installers))
    bad = [i for i in installers if i not in INSTALLERS]
    if bad or not installers:
        raise BadInput("command line", "--installer", bad[0] if bad else "", f"expected {' or '.join(INSTALLERS)}")
    cells = plan_cells(root)
    if not cells:
        raise BadInput(display(root / "manifest.jsonl"), None, None, _why_no_cells(root))
    here = host_platform()
    runnable, skipped = [], []
    for cell in cells:
        if cell.platform != here:
            skipped.append({"cell": cell.id, "reason": f"{LABELS.get(cell.platform, cell.platform)} wheels are not "
                                                       f"installed on this {LABELS[here]} host"})
            continue
        try:
            HostRunner().python(cell.python)
        except BadInput:
            skipped.append({"cell": cell.id, "reason": f"no Python {cell.python} on this host"})
            continue
        runnable.append(cell)
    work_parent = cache_dir() / "work"   # beside uv's cache: one file system, so torch is hard-linked
    work_parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="check-install-", dir=work_parent))
    server = make_server(root, "127.0.0.1", 0, access_log=work / "access.log")
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    serving.start()
    results: dict[str, dict[str, dict]] = defaultdict(dict)
    with uv_cache_in_use(log=log) as uv_cache:   # counted and evicted by the cache budget
        try:
            tools = Tools(f"http://127.0.0.1:{server.server_address[1]}/", root, work, _uv_binary(), uv_cache,
                          _recipe_knobs(), log)
            log(f"serving {root} on {tools.base_url} for {len(runnable)} cell(s) x {', '.join(installers)}")
            checked: list[Path] = []   # the wheel files of the torch pin being checked, over its cells
            for i, cell in enumerate(runnable):
                torch = torch_download(cell)
                files = torch[0].files if torch[0] else ()
                if i and cell.torch_pin != runnable[i - 1].torch_pin:
                    if "uv" in installers:
                        forget_torch(tools, runnable[i - 1].torch_pin, checked, files)
                    checked = []
                checked.extend(files)
                for project, by_installer in check_cell(cell, tools, installers, torch).items():
                    version = next(p.version for p in cell.packages if p.project == project)
                    results[project][cell.id] = {"version": version, **by_installer}
        finally:
            server.shutdown()
            server.server_close()
            shutil.rmtree(work, ignore_errors=True)
    counts = {WORKS: 0, FAILS: 0}
    for by_cell in results.values():
        for entry in by_cell.values():
            for installer in installers:
                counts[entry[installer]["status"]] += 1
    matrix = {
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host_platform": here, "installers": list(installers), "torch_from": TORCH_FROM,
        "cells": [{"id": c.id, "channel": c.channel, "cuda": c.cuda, "torch": c.torch, "torch_pin": c.torch_pin,
                   "python": c.python, "platform": c.platform, "packages": [p.project for p in c.packages]}
                  for c in cells],
        "results": {p: dict(sorted(by_cell.items())) for p, by_cell in sorted(results.items())},
        "not_checked": skipped,
        "counts": {"works": counts[WORKS], "fails": counts[FAILS]},
    }
    data = json.dumps(matrix, indent=1, sort_keys=True) + "\n"
    write_files(root, [(MATRIX_FILE, data.encode()), (PAGE, render_install_page(matrix).encode())])
    return matrix

