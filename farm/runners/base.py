"""What every runner is (the `Runner` protocol) and the parts they share: mounts, the step log.

Both runners run the SAME entrypoint, `python -m farm.build.steps <args>` (design.md §6); they
differ only in mounts, limits and network:

- `container` (farm/runners/container.py): the builder image through the engine; every
  mount is a bind mount at its target; limits are enforced; network=False is
  `--network=none`.
- `host` (farm/runners/host.py): this machine; a mount's step-side path is its host
  path (targets are ignored); no limits; network=False is a new network namespace
  (`unshare -n`) when root, else the network stays open and that is recorded.

The pipeline calls, per phase:

    runner = get_runner("container" | "host" | None, arch="x86_64")    # farm.runners.choose
    mounts = runner.standard_mounts(work=..., out=...)           # + runner.python(v)[1]
    code, log = runner.run_step(["compile", cell_id], env, mounts, network=False, log_path=...)
    record["runner"] = runner.describe()

and writes every path it passes in argv/env as `runner.inside(path, mounts)`.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from farm.runners.engine import Mount
from farm.settings import PROJECT_ROOT, cache_dir, ccache_dir

RUNNER_KINDS = ("container", "host")
ENTRYPOINT_MODULE = "farm.build.steps"
# The step-side layout inside a container (the image creates these folders).
PROJECT_TARGET = "/farm/project"
WORK_TARGET = "/farm/work"
OUT_TARGET = "/farm/out"
CACHE_TARGET = "/farm/cache"
# Cache folders under cache_dir() a build step reads or fills.
STANDARD_CACHES = ("toolkits", "envs", "overlays", "downloads", "ccache", "sources")


class StepResult(NamedTuple):
    exit_code: int
    log_path: Path


class Runner(Protocol):
    """Where a step runs. ContainerRunner and HostRunner implement it."""

    kind: str
    entrypoint: str
    # What network=False achieves: "none" (container), "namespace" (host, root) or "open".
    network_isolation: str

    def run_step(self, argv: list[str], env: dict[str, str] | None = None, mounts: Sequence[Mount] = (),
                 network: bool = True, log_path: Path | None = None, timeout: float | None = None) -> StepResult:
        """Run `python -m farm.build.steps <argv>`; output (stdout+stderr) is appended to log_path.

        Returns (exit_code, log_path). A timeout gives exit code 124. An out-of-memory
        kill shows as 137; callers decide what that means (design.md §11.2).
        """
        ...

    def provide_system_packages(self, packages: Mapping[str, tuple[str, ...]], where: str) -> None:
        """Make the recipe's `system_packages` (by package manager; `where`: its file) present for the
        steps, or refuse in one line before any work (design.md §8.5)."""
        ...

    def network_isolation_when_off(self) -> str:
        ...

    def memory_cap_gb(self) -> float | None:
        """What one build may hold here whatever the host has free (a container's memory limit), or None;
        memory admission keeps max_jobs x peak_gb_per_job under it (design.md §11.2)."""
        ...

    def standard_mounts(self, work: Path, out: Path, caches: dict[str, Path] | None = None) -> list[Mount]:
        ...

    def inside(self, host_path: Path | str, mounts: Sequence[Mount]) -> str:
        """Where the step sees `host_path` (must lie under one of `mounts`, or be the project)."""
        ...

    def python(self, version: str) -> tuple[str, list[Mount]]:
        """(interpreter path as the step sees it, mounts it needs) for Python `version`."""
        ...

    def describe(self) -> dict[str, Any]:
        ...


def standard_mounts(work: Path, out: Path, caches: dict[str, Path] | None = None) -> list[Mount]:
    """Project (read-only), the cell's work dir, the output dir and the cache folders.

    `caches` maps a name to a host folder (default: each of STANDARD_CACHES under
    cache_dir()); each lands at /farm/cache/<name>, where FARM_CACHE points inside.
    """
    if caches is None:
        caches = {name: ccache_dir() if name == "ccache" else cache_dir() / name for name in STANDARD_CACHES}
    mounts = [Mount(PROJECT_ROOT, PROJECT_TARGET, read_only=True), Mount(work, WORK_TARGET), Mount(out, OUT_TARGET)]
    for name, path in caches.items():
        Path(path).mkdir(parents=True, exist_ok=True)
        mounts.append(Mount(path, f"{CACHE_TARGET}/{name}"))
    for m in mounts[1:3]:
        Path(m.source).mkdir(parents=True, exist_ok=True)
    return mounts


def run_logged(runner: Runner, execute: Callable[..., int], argv: Sequence[str], env: dict[str, str] | None,
               mounts: Sequence[Mount], network: bool, log_path: Path | None, timeout: float | None) -> StepResult:
    """Runner.run_step for both runners: the log (default: a new one under cache_dir()/logs), its first
    line naming the step, then the runner's own `execute(argv, env, mounts, network, log_path, timeout)`."""
    if log_path is None:
        log_path = cache_dir() / "logs" / f"step-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as fh:
        fh.write(f"# farm {runner.kind} runner: {runner.entrypoint} {shlex.join(argv)} "
                 f"(network {'on' if network else runner.network_isolation_when_off()})\n")
    return StepResult(execute(list(argv), dict(env or {}), list(mounts), network, log_path, timeout), log_path)
