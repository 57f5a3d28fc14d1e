"""The container runner: steps run in the cell's builder image through the engine.

The entrypoint needs the farm's own dependencies (pyyaml, packaging, auditwheel, ...)
inside the image, whose Python has none of them and no network. They live in a
"tools" virtual environment per image: wheels are downloaded on the host (`pip
download` for the image's Python and platform, into the shared downloads cache),
installed inside the image with `--no-index --find-links`, cached under
cache_dir()/tools/<key> and mounted read-only at /farm/tools.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock

from farm import progress, settings
from farm.errors import RunnerError
from farm.platforms import host_arch
from farm.process import last_line, run
from farm.runners import cpython, images, syspkgs
from farm.runners.base import (
    CACHE_TARGET,
    ENTRYPOINT_MODULE,
    PROJECT_TARGET,
    WORK_TARGET,
    StepResult,
    run_logged,
    standard_mounts,
)
from farm.runners.engine import Engine, Limits, Mount, default_limits
from farm.runners.owner import ROLE_LABEL
from farm.settings import PROJECT_ROOT, cache_dir

TOOLS_TARGET = "/farm/tools"
_reaped: set[str] = set()   # engines whose orphans this process has removed already


def reap_once(engine: Engine) -> None:
    """At the start of a container build (`farm build`, each cell of `farm run`): remove the containers
    whose owner died without removing them, a SIGKILLed build's (farm/runners/owner.py); once per process."""
    if engine.exe in _reaped:
        return
    _reaped.add(engine.exe)
    for cid in engine.reap_orphans():
        print(f"farm: removed container {cid[:12]}: the farm process that started it is gone")


def project_requirements() -> list[str]:
    """The farm's runtime dependencies, as pyproject.toml declares them."""
    text = (PROJECT_ROOT / "pyproject.toml").read_text()
    if sys.version_info >= (3, 11):
        import tomllib

        return list(tomllib.loads(text)["project"]["dependencies"])
    # Python 3.10: the list is simple enough to read directly
    block = re.search(r"^dependencies\s*=\s*\[(.*?)\]", text, re.S | re.M)
    if block is None:
        raise RunnerError(f"{PROJECT_ROOT / 'pyproject.toml'}: no dependencies list")
    return re.findall(r'"([^"]+)"', block.group(1))


class ContainerRunner:
    """farm.runners.base.Runner in the cell's builder image."""

    kind = "container"
    network_isolation = "none"

    def __init__(self, arch: str | None = None, engine: Engine | None = None, image: images.Image | None = None,
                 limits: Limits | None = None, build_image: bool = True, entrypoint: str = ENTRYPOINT_MODULE):
        self.entrypoint = entrypoint
        self.engine = engine or Engine.detect()
        reap_once(self.engine)
        self.arch = images.check_arch(arch or host_arch())
        if image is None:
            image = images.load_image(self.arch, self.engine)
            if image is None:
                if not build_image:
                    raise RunnerError(f"no builder image for {self.arch} (run `farm images build --arch {self.arch}`)")
                image = images.ensure_builder(self.arch, self.engine)
        self.image = self.builder = image   # the image becomes a package layer over the builder for some recipes
        self.limits = limits or default_limits()
        self._tools: Path | None = None

    # ----- what a step sees ------------------------------------------------------

    def standard_mounts(self, work: Path, out: Path, caches: dict[str, Path] | None = None) -> list[Mount]:
        return standard_mounts(work, out, caches)

    def inside(self, host_path: Path | str, mounts: Sequence[Mount]) -> str:
        p = Path(host_path).resolve()
        best = None
        for m in mounts:
            src = Path(m.source).resolve()
            if p == src or src in p.parents:
                if best is None or len(str(src)) > len(str(Path(best.source).resolve())):
                    best = m
        if best is None:
            raise RunnerError(f"{p} is not under any mount of this step")
        rel = p.relative_to(Path(best.source).resolve())
        return str(Path(best.target) / rel) if str(rel) != "." else best.target

    def python(self, version: str) -> tuple[str, list[Mount]]:
        """The interpreter for `version` and its mount: the image's own, a host pyenv prefix, or a CPython the
        farm builds for a lane the host's cannot serve (farm/runners/cpython.py, built once, then cached)."""
        py = self.image.python(version)
        if py is None and cpython.buildable(self.arch, version):
            py = cpython.ensure(self.builder, version, self.engine)
        if py is None:
            raise RunnerError(f"image {self.image.ref} provides no Python {version} "
                              f"(it has {', '.join(self.image.python_versions()) or 'none'})")
        # a pyenv prefix is mounted where it is on the host; a built one from the cache at its fixed prefix
        mounts = [Mount(py.get("source", py["mount"]), py["mount"], read_only=True)] if py.get("mount") else []
        return py["path"], mounts

    def provide_system_packages(self, packages: Mapping[str, tuple[str, ...]], where: str) -> None:
        """Steps run in a layer over the builder image holding the recipe's packages for its manager."""
        pkgs = syspkgs.wanted(packages, self.builder.package_manager, where)
        self.image = syspkgs.ensure_layer(self.engine, self.builder, pkgs) if pkgs else self.builder

    # ----- the tools environment -------------------------------------------------

    def _tool_python(self) -> dict[str, Any]:
        own = [p for p in self.image.pythons if not p.get("mount")]
        if not own:
            raise RunnerError(f"image {self.image.ref} records no Python of its own")
        # manylinux lists several; the newest is fine for the farm's own code.
        return max(own, key=lambda p: tuple(int(x) for x in p["version"].split(".")))

    def tools_env(self) -> Path:
        """The image's tools venv on the host (built once, then mounted read-only)."""
        if self._tools:
            return self._tools
        py = self._tool_python()
        reqs = sorted(project_requirements())
        # The builder's: a package layer keeps the builder's Python, so its venv serves the layer too.
        key = hashlib.sha256("\0".join([self.image.builder_id, py["path"], *reqs]).encode()).hexdigest()[:16]
        root = cache_dir() / "tools"
        dest = root / key
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root / f".{key}.lock")):
            if not (dest / ".farm-ok").exists():
                with progress.step("image tools"):   # once per image: a minute with nothing else to show
                    wheels = self._download_tools(py["version"], reqs)
                    self._install_tools(dest, py["path"], wheels, reqs)
        self._tools = dest
        return dest

    def _download_tools(self, version: str, reqs: list[str]) -> Path:
        nodot = version.replace(".", "")
        wheels = cache_dir() / "downloads" / f"farm-tools-cp{nodot}-{self.arch}"
        # pip does not widen --platform manylinux_2_36 to older manylinux tags: name each one.
        major, top = images.plat_glibc(self.image.plat_cap)
        plats = [f"manylinux_{major}_{m}_{self.arch}" for m in range(top, 4, -1)]
        plats += [f"manylinux2014_{self.arch}"] + ([f"manylinux1_{self.arch}"] if self.arch == "x86_64" else [])
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(wheels),
               *[f"--platform={p}" for p in plats], "--python-version", version, "--implementation", "cp",
               "--abi", f"cp{nodot}", *reqs]
        env = {**os.environ, "PIP_FIND_LINKS": ""}  # torch's local find-links is irrelevant here
        run(cmd, env=env, error=RunnerError, what="downloading the farm's tools for the image failed",
            explain=lambda stderr: last_line(stderr, default="?"))
        return wheels

    def _install_tools(self, dest: Path, python: str, wheels: Path, reqs: list[str]) -> None:
        tmp = dest.with_name(f"{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        log = dest.with_name(f"{dest.name}.log")
        try:
            # Built at the path it is later mounted at: a venv's scripts name their own path.
            script = (f"{python} -m venv {TOOLS_TARGET} && {TOOLS_TARGET}/bin/python -m pip install --quiet "
                      "--no-index --find-links /farm/wheels " + " ".join(shlex.quote(r) for r in reqs))
            res = self.engine.run(self.image.ref, ["sh", "-c", script], log_path=log, network=False,
                                  mounts=[Mount(tmp, TOOLS_TARGET), Mount(wheels, "/farm/wheels", read_only=True)],
                                  arch=self.arch)
            if res.exit_code != 0:
                raise RunnerError(f"installing the farm's tools in {self.image.ref} failed (exit {res.exit_code}); "
                                  f"log {log}")
            (tmp / ".farm-ok").write_text(self.image.builder_id + "\n")
            if dest.exists():
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    # ----- running ---------------------------------------------------------------

    def network_isolation_when_off(self) -> str:
        return self.network_isolation

    def memory_cap_gb(self) -> float | None:
        return self.limits.memory_gb

    def run_step(self, argv: list[str], env: dict[str, str] | None = None, mounts: Sequence[Mount] = (),
                 network: bool = True,
                 log_path: Path | None = None, timeout: float | None = None) -> StepResult:
        return run_logged(self, self._execute, argv, env, mounts, network, log_path, timeout)

    def _execute(self, argv: list[str], env: Mapping[str, str], mounts: Sequence[Mount], network: bool,
                 log_path: Path, timeout: float | None) -> int:
        tools = self.tools_env()
        all_mounts = [*mounts, Mount(tools, TOOLS_TARGET, read_only=True)]
        if not any(m.target == PROJECT_TARGET for m in all_mounts):
            all_mounts.append(Mount(PROJECT_ROOT, PROJECT_TARGET, read_only=True))
        if self.arch != host_arch():
            # qemu-user shows the guest the host's x86 CPU files; torch segfaults parsing them.
            from farm.runners.emulation import fake_arm_cpu

            all_mounts += [Mount(src, dst, read_only=True) for src, dst in fake_arm_cpu(cache_dir() / "emulation")]
        # FARM_IN_CONTAINER: the toolkit step names an installed toolkit `image`, not `system`.
        step_env = {settings.CACHE.name: CACHE_TARGET, settings.IN_CONTAINER.name: "1", "PYTHONUNBUFFERED": "1",
                    # the host compiler the build key was made with (farm.runners.hostcompiler)
                    settings.HOST_COMPILER.name: settings.HOST_COMPILER.value(), **env}
        # The project is importable from its read-only mount, ahead of anything the caller adds.
        step_env["PYTHONPATH"] = ":".join(x for x in (PROJECT_TARGET, env.get("PYTHONPATH", "")) if x)
        workdir = WORK_TARGET if any(m.target == WORK_TARGET for m in all_mounts) else None
        res = self.engine.run(self.image.ref, [f"{TOOLS_TARGET}/bin/python", "-m", self.entrypoint, *argv],
                              log_path=log_path, timeout=timeout, mounts=all_mounts, env=step_env,
                              workdir=workdir, limits=self.limits, network=network, arch=self.arch,
                              labels={ROLE_LABEL: "build"})
        return res.exit_code

    def describe(self) -> dict[str, Any]:
        return {"runner": self.kind, **self.engine.describe(), **self.image.describe(),
                "limits": {"memory": self.limits.memory, "cpus": self.limits.cpus},
                "network_when_off": self.network_isolation,
                "emulated": self.arch != host_arch()}
