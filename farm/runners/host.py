"""The host runner: the same entrypoint on this machine, for development and engine-less hosts.

Mount targets are ignored (a step sees host paths); there are no limits. With
network=False the step runs in a new network namespace (`unshare -n`, util-linux)
when we are root and it works; otherwise the network stays open and describe()
says `network: open` (such wheels are dev-only, design.md §8.1).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from farm.errors import BadInput
from farm.platforms import host_arch
from farm.process import TimeoutExpired, run, spawn, stop_group
from farm.runners import images, syspkgs
from farm.runners.base import ENTRYPOINT_MODULE, WORK_TARGET, StepResult, run_logged, standard_mounts
from farm.runners.engine import Mount
from farm.settings import PROJECT_ROOT


@lru_cache(maxsize=1)
def _can_unshare_net() -> bool:
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("unshare"):   # Windows: no namespaces
        return False
    return run(["unshare", "--net", "--", "true"]).returncode == 0


def _windows_python(version: str) -> str | None:
    """A Windows host's Python of this line: the `py` launcher's, else the runner image's tool cache."""
    if shutil.which("py"):
        found = run(["py", f"-{version}", "-c", "import sys; print(sys.executable)"])
        if found.returncode == 0 and found.stdout.strip():
            return found.stdout.strip()
    cache = os.environ.get("RUNNER_TOOL_CACHE")   # GitHub's windows images keep several Pythons there
    hits = sorted(Path(cache).glob(f"Python/{version}.*/x64/python.exe"),   # newest patch last
                  key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.parent.name)]) if cache else []
    return str(hits[-1]) if hits else None


class HostRunner:
    """farm.runners.base.Runner on this machine."""

    kind = "host"

    def __init__(self, arch: str | None = None, entrypoint: str = ENTRYPOINT_MODULE):
        self.entrypoint = entrypoint
        want = images.check_arch(arch or host_arch())
        if want != host_arch():
            raise BadInput("farm build", "--runner", "host",
                           f"this host is {host_arch()}; {want} cells need the container runner")
        self.arch = want
        self.network_isolation = "namespace" if _can_unshare_net() else "open"

    def provide_system_packages(self, packages: Mapping[str, tuple[str, ...]], where: str) -> None:
        """The farm installs nothing on its host: the packages are there, or the cell is refused."""
        syspkgs.check_host(packages, where)

    def network_isolation_when_off(self) -> str:
        return self.network_isolation

    def memory_cap_gb(self) -> float | None:
        return None   # the host's own memory: the budget is all there is

    def standard_mounts(self, work: Path, out: Path, caches: dict[str, Path] | None = None) -> list[Mount]:
        return standard_mounts(work, out, caches)

    def inside(self, host_path: Path | str, mounts: Sequence[Mount] = ()) -> str:
        """A step on the host sees host paths."""
        return str(Path(host_path).resolve())

    def python(self, version: str) -> tuple[str, list[Any]]:
        if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
            return sys.executable, []
        for prefix in reversed(images.pyenv_prefixes()):  # newest patch first
            if re.fullmatch(re.escape(version) + r"\.\d+", prefix.name):
                return str(prefix / "bin" / "python3"), []
        if os.name == "nt" and (found := _windows_python(version)):
            return found, []
        raise BadInput("farm build", "python", version, "no such Python on this host (pyenv prefixes, the farm's own)")

    def run_step(self, argv: list[str], env: dict[str, str] | None = None, mounts: Sequence[Mount] = (),
                 network: bool = True,
                 log_path: Path | None = None, timeout: float | None = None) -> StepResult:
        return run_logged(self, self._execute, argv, env, mounts, network, log_path, timeout)

    def _execute(self, argv: list[str], env: Mapping[str, str], mounts: Sequence[Mount], network: bool,
                 log_path: Path, timeout: float | None) -> int:
        cmd = [sys.executable, "-m", self.entrypoint, *argv]
        if not network and self.network_isolation == "namespace":
            cmd = ["unshare", "--net", "--", *cmd]
        step_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        step_env["PYTHONPATH"] = os.pathsep.join(x for x in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if x)
        # The same working directory as in a container: the work mount, when there is one.
        cwd = next((str(m.source) for m in mounts if m.target == WORK_TARGET), None)
        with open(log_path, "ab") as fh:
            # Own process group, so a timeout ends the step's compilers too.
            proc = spawn(cmd, fh, env=step_env, cwd=cwd)
            try:
                return proc.wait(timeout=timeout)
            except TimeoutExpired:
                stop_group(proc)
                return 124

    def describe(self) -> dict[str, Any]:
        libc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None   # 'glibc 2.35'
        glibc = libc.split()[-1] if libc else ""
        own = f"{sys.version_info[0]}.{sys.version_info[1]}"
        pythons = sorted({own} | {".".join(p.name.split(".")[:2]) for p in images.pyenv_prefixes()},
                         key=lambda v: tuple(int(x) for x in v.split(".")))
        return {"runner": self.kind, "arch": self.arch, "glibc": glibc, "image_id": None,
                # The host's tag is what `auditwheel show` allows for each wheel (design.md §8.3).
                "plat": None, "pythons": pythons, "network_when_off": self.network_isolation,
                "limits": None}
