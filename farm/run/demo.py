"""`farm demo`: the main job on its embedded default, end to end.

Build the bundled farm_demo extension for a cell this machine can build
(cu130 / torch 2.13 / Python 3.11), publish it into a wheelhouse, serve that
wheelhouse on 127.0.0.1, install the wheel from its channel with pip as a
user would, and show what the installed binary carries: its SASS and PTX, the platform tag it
reached and the manylinux floor the gate held it to.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from farm import progress, settings
from farm.arch.find import PYPI_SIMPLE
from farm.build.cell import BuildResult, build_cell
from farm.build.request import BuildRequest
from farm.errors import DemoFailed
from farm.process import last_useful_lines, run

DEMO_CELL = "farm_demo-cu130-torch2.13-py311"


def demo_out(cell_id: str, build_dir: Path | None = None) -> Path:
    """The demo cell's build folder: <build dir>/<cell id> (the project's build/ by default)."""
    return Path(build_dir or settings.PROJECT_ROOT / "build") / cell_id


def run_demo(cell_id: str | None = None, runner_kind: str | None = None, wheelhouse: Path | None = None,
             log=print, build_dir: Path | None = None, built: Callable[[BuildResult], None] | None = None) -> dict:
    """built: shown the build's result before the install (`farm demo` prints the build summary)."""
    from packaging.utils import parse_wheel_filename

    from farm.arch.fatbin import read_fatbin
    from farm.recipes.plan import find_cell
    from farm.wheelhouse import channel_root
    from farm.wheelhouse.serve import make_server

    cell_id = cell_id or DEMO_CELL
    house = Path(wheelhouse or settings.wheelhouse_dir())
    build_dir = Path(build_dir or settings.PROJECT_ROOT / "build")
    result = build_cell(BuildRequest.make(cell_id, runner_kind=runner_kind, wheelhouse=house,
                                          out=demo_out(cell_id, build_dir)), log=log)
    wheel = result.wheel
    assert wheel is not None   # the full tier: only `flags` builds no wheel
    if built is not None:
        built(result)
    access_log = build_dir / "demo-access.log"
    access_log.parent.mkdir(parents=True, exist_ok=True)
    server = make_server(house, "127.0.0.1", 0, access_log=access_log)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        cell = find_cell(cell_id)
        channel = f"http://127.0.0.1:{port}/{channel_root(cell.cuda, cell.torch)}/"
        version = parse_wheel_filename(wheel.name)[1]
        with tempfile.TemporaryDirectory(prefix="farm-demo-") as tmp:
            target = Path(tmp) / "site"
            cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target),
                   "--index-url", channel, "--extra-index-url", PYPI_SIMPLE, f"farm_demo=={version}"]
            log(f"$ {' '.join(cmd[2:])}")
            with progress.step("install"):
                proc = run(cmd)
                if proc.returncode != 0:   # shown as a one-item list, brackets and quotes, as before
                    raise DemoFailed(f"pip could not install from {channel}: {last_useful_lines(proc.stderr, 1)}")
            installed = next(target.glob("farm_demo-*.dist-info")).name
            modules = sorted(target.glob("farm_demo/_C*.so"))
            report = read_fatbin(modules[0])
            sass, ptx = " ".join(report.names("SASS")), " ".join(report.names("PTX"))
            floor = _carried_floor(target / installed)
    finally:
        server.shutdown()
    tag = wheel.name[: -len(".whl")].split("-")[-1]
    log(f"installed {installed} from {channel} (server log: {access_log})")
    log(f"  SASS: {sass}")
    log(f"  PTX:  {ptx}")
    log(f"  tag:  {tag}")     # where pip installs it: this glibc or newer
    log(f"  floor: {floor}")  # what the gate held it to (design.md §7.8)
    return {"wheel": str(wheel), "channel": channel, "sass": sass, "ptx": ptx, "installed": installed,
            "tag": tag, "floor": floor}


def _carried_floor(dist_info: Path) -> str:
    """The floor the installed wheel's own build record names ("unknown" for a wheel built before floors)."""
    from farm.wheelhouse.names import BUILD_INFO_NAME

    try:
        info = json.loads((dist_info / BUILD_INFO_NAME).read_text())
    except (OSError, ValueError):
        return "unknown"
    floor = info.get("floor") if isinstance(info, dict) else None
    return floor["text"] if isinstance(floor, dict) and isinstance(floor.get("text"), str) else "unknown"
