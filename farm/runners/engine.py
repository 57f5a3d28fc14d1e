"""The container engine behind the Docker CLI: docker or podman, one class.

The farm speaks only Docker CLI verbs (build, create, start, wait, rm, run, cp,
inspect, ps, import, and save, load, pull, tag to hand an image to another host), which both `docker` and `podman` understand (design.md §8.2). Which
executable is used: `FARM_ENGINE` (docker | podman | a path), else the first of
docker, podman that answers `info`. Engine differences are handled here and
nowhere else; each one is commented where it is handled.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from farm import settings
from farm.errors import BadInput, EngineError, EngineUnavailable
from farm.platforms import meminfo_gb
from farm.process import DEVNULL, CompletedProcess, TimeoutExpired, call, last_line, run, spawn
from farm.runners.owner import OWNER_LABEL, ROLE_LABEL, owner_gone, owner_value

ENGINE_NAMES = ("docker", "podman")
# The docker client answers `--version` without an engine; `info` needs the engine itself.
_INFO_TIMEOUT = 20


@dataclass(frozen=True)
class Mount:
    """A bind mount: host `source` at `target` inside the container."""

    source: Path | str
    target: str
    read_only: bool = False

    def as_arg(self) -> str:
        # --mount rather than -v: -v splits on ':' and breaks on paths containing one.
        opts = f"type=bind,source={Path(self.source).resolve()},target={self.target}"
        return opts + (",readonly" if self.read_only else "")


@dataclass(frozen=True)
class Limits:
    memory: str | None = None  # e.g. "8g"
    cpus: float | None = None  # e.g. 2 or 1.5

    @property
    def memory_gb(self) -> float | None:
        """The memory limit in GB (engine units: k, m, g are powers of 1024, none is bytes), or None."""
        if not self.memory:
            return None
        scale = {"k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30}.get(self.memory[-1].lower(), 1)
        return float(self.memory.rstrip("kmgKMG")) * scale / 2 ** 30

    def as_args(self) -> list[str]:
        args: list[str] = []
        if self.memory:
            # Swap equal to memory: an over-budget compiler is killed (exit 137 = oom), not paged.
            args += [f"--memory={self.memory}", f"--memory-swap={self.memory}"]
        if self.cpus:
            args += [f"--cpus={self.cpus:g}"]
        return args


HOST_RESERVE_GB = 2   # what a build container leaves the host: its shell, the engine, the farm itself
_MEMORY_VALUE = re.compile(r"[1-9][0-9]*[kmg]?")   # fullmatch


def default_limits() -> Limits:
    """A build container's limits: FARM_CONTAINER_MEMORY, else the host's memory less HOST_RESERVE_GB.
    Over it the kernel kills the compiler (exit 137, a BuildOOM that `farm run` retries with fewer jobs)
    where without one the whole host paged to a standstill: flash_attn's four 5.9 GB ciccs held a
    24 GB builder for 50 minutes."""
    own = settings.CONTAINER_MEMORY.get()
    if own is not None:
        own = own.strip().lower()
        if own == "0":
            return Limits()
        if not _MEMORY_VALUE.fullmatch(own):
            raise BadInput("environment", settings.CONTAINER_MEMORY.name, own, "expected a size like 16g, or 0 for none")
        return Limits(memory=own)
    total_gb = meminfo_gb("MemTotal")
    return Limits(memory=f"{max(1, int(total_gb - HOST_RESERVE_GB))}g") if total_gb else Limits()


@dataclass
class RunResult:
    exit_code: int
    timed_out: bool = False
    container_id: str = ""


def _docker_platform(arch: str) -> str:
    """x86_64/aarch64 (farm spelling) -> the engine's --platform value."""
    return {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}[arch]


def engine_cwd() -> str:
    """Where engine commands run: conmon (podman < 5.2) creates an empty `oom` file in its working
    directory when a container is OOM-killed, which must not land in the caller's checkout."""
    from farm.settings import cache_dir

    folder = cache_dir() / "engine-cwd"
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


class Engine:
    """One container engine reached through its Docker-compatible CLI."""

    def __init__(self, exe: str, name: str | None = None, env: dict[str, str] | None = None):
        self.exe = exe
        base = Path(exe).name
        # What the CLI is, not what answers behind it: `docker` may talk to podman's service.
        self.name = name or ("podman" if "podman" in base else "docker")
        self.env = env

    # ----- discovery ---------------------------------------------------------------

    @classmethod
    def detect(cls) -> Engine:
        """FARM_ENGINE, else the first of docker, podman whose `info` answers."""
        wanted = (settings.ENGINE.get() or "").strip()
        candidates = [wanted] if wanted else list(ENGINE_NAMES)
        why: list[str] = []
        for cand in candidates:
            exe = shutil.which(cand) or (cand if os.path.isfile(cand) else None)
            if not exe:
                why.append(f"{cand}: not installed")
                continue
            eng = cls(exe)
            ok, detail = eng.answers()
            if ok:
                return eng
            why.append(f"{cand}: `{cand} info` failed: {detail}")
        hint = "" if wanted else " (run `make setup-engine`)"
        raise EngineUnavailable("no container engine answers: " + "; ".join(why) + hint)

    @classmethod
    def available(cls) -> Engine | None:
        try:
            return cls.detect()
        except EngineUnavailable:
            return None

    def answers(self) -> tuple[bool, str]:
        try:
            p = self._run(["info", "--format", "{{json .}}"], check=False, timeout=_INFO_TIMEOUT)
        except TimeoutExpired:
            return False, f"no answer in {_INFO_TIMEOUT}s"
        if p.returncode == 0:
            return True, ""
        last = (p.stderr or p.stdout).strip().splitlines()
        return False, last[-1] if last else f"exit {p.returncode}"

    def describe(self) -> dict[str, Any]:
        """Engine name and server version for the build record (from `info`)."""
        p = self._run(["info", "--format", "{{json .}}"], check=False, timeout=_INFO_TIMEOUT)
        version = ""
        try:
            data = json.loads(p.stdout)
            # docker: ServerVersion at the top; podman: version.Version (lower-case key).
            version = data.get("ServerVersion") or (data.get("version") or {}).get("Version", "")
        except (ValueError, AttributeError):
            pass
        return {"engine": self.name, "exe": self.exe, "version": version}

    # ----- plumbing -------------------------------------------------------------

    def _env(self) -> dict[str, str] | None:
        return None if self.env is None else {**os.environ, **self.env}

    def _run(self, args: list[str], check: bool = True, timeout: float | None = None) -> CompletedProcess[str]:
        p = run([self.exe, *args], timeout=timeout, env=self._env(), cwd=engine_cwd())
        if check and p.returncode != 0:
            err = (p.stderr or "").strip().splitlines()
            raise EngineError(f"{self.name} {args[0]} failed (exit {p.returncode}): "
                              + (err[-1] if err else "no message"))
        return p

    # ----- images ---------------------------------------------------------------

    def inspect(self, ref: str, kind: str = "image") -> dict[str, Any] | None:
        """`inspect --type image|container`; None when it does not exist."""
        p = self._run(["inspect", "--type", kind, ref], check=False)
        if p.returncode != 0:
            return None
        data = json.loads(p.stdout or "[]")
        return data[0] if data else None

    def image_id(self, ref: str) -> str | None:
        data = self.inspect(ref)
        if not data:
            return None
        return full_id(data.get("Id", ""))

    def image_arch(self, ref: str) -> str | None:
        data = self.inspect(ref)
        return None if not data else {"amd64": "x86_64", "arm64": "aarch64"}.get(data.get("Architecture", ""))

    def image_labels(self, ref: str) -> dict[str, str]:
        data = self.inspect(ref) or {}
        # docker keeps labels under Config.Labels; podman fills both Labels and Config.Labels.
        return dict((data.get("Config") or {}).get("Labels") or data.get("Labels") or {})

    def import_tarball(self, tarball: Path, ref: str, arch: str, changes: Sequence[str] = ()) -> str:
        """Import a root filesystem tarball as image `ref`; returns its id."""
        args = ["import"]
        for c in changes:
            args += ["--change", c]
        if self.name == "podman":
            # podman 4.3 `import` has no --platform (docker's spelling); it takes --arch/--os.
            args += ["--os", "linux", "--arch", _docker_platform(arch).split("/")[1]]
        else:
            args += ["--platform", _docker_platform(arch)]
        self._run([*args, str(tarball), ref], timeout=1800)
        return self.image_id(ref) or ""

    def build(self, context: Path, tag: str, dockerfile: Path | None = None,
              build_args: dict[str, str] | None = None, labels: dict[str, str] | None = None,
              arch: str | None = None, network: bool = True, log_path: Path | None = None,
              pull: bool = False) -> str:
        """`build` the context into `tag`; output goes to log_path; returns the image id."""
        args = ["build", "-t", tag]
        if dockerfile:
            args += ["-f", str(dockerfile)]
        for k, v in (build_args or {}).items():
            args += ["--build-arg", f"{k}={v}"]
        for k, v in (labels or {}).items():
            args += ["--label", f"{k}={v}"]
        if arch:
            args += ["--platform", _docker_platform(arch)]
        if not network:
            args += ["--network=none"]
        if self.name == "podman" and not pull:
            # podman may otherwise ask a registry about a local FROM image (localhost/...),
            # and none is reachable where local bases are used.
            args += ["--pull=never"]
        args.append(str(context))
        with _log_sink(log_path) as sink:
            code = call([self.exe, *args], sink, cwd=engine_cwd(), env=self._env())
        if code != 0:
            last = ""
            if log_path:
                lines = [ln for ln in Path(log_path).read_text(errors="replace").splitlines() if ln.strip()]
                last = f": {lines[-1].strip()[-240:]}" if lines else ""
            where = f" (log {log_path})" if log_path else ""
            raise EngineError(f"{self.name} build of {tag} failed (exit {code}){last}{where}")
        return self.image_id(tag) or ""

    def save(self, ref: str, archive: Path) -> None:
        """`save -o`: the image with its tag as one archive file (docker-archive, which both engines load)."""
        self._run(["save", "-o", str(archive), ref], timeout=1800)

    def load(self, archive: Path) -> None:
        """`load -i`: an archive `save` wrote; the image keeps its id and tag."""
        self._run(["load", "-i", str(archive)], timeout=1800)

    def pull(self, ref: str) -> None:
        self._run(["pull", ref], timeout=3600)

    def tag(self, ref: str, new_ref: str) -> None:
        self._run(["tag", ref, new_ref])

    def image_refs(self, repository: str) -> list[str]:
        """The `repository:tag` refs the engine holds in `repository` (e.g. localhost/farm-builder)."""
        p = self._run(["images", "--format", "{{.Repository}}:{{.Tag}}", repository], check=False)
        return sorted({ln.strip() for ln in p.stdout.splitlines() if ln.strip().startswith(f"{repository}:")})

    def remove_image(self, ref: str) -> str | None:
        """`rmi` one ref (the image goes with its last tag); the engine's reason when it refuses (a container
        still uses it), else None."""
        p = self._run(["rmi", ref], check=False)
        if p.returncode == 0:
            return None
        lines = (p.stderr or "").strip().splitlines()
        return lines[-1] if lines else f"exit {p.returncode}"

    # ----- containers -----------------------------------------------------------

    def create(self, image: str, argv: list[str], mounts: Sequence[Mount] = (), env: dict[str, str] | None = None,
               workdir: str | None = None, limits: Limits | None = None, network: bool = True,
               arch: str | None = None, name: str | None = None, user: str | None = None,
               labels: dict[str, str] | None = None, host_network: bool = False) -> str:
        """`create` a container (not started); returns its id. It is labelled with its owner, this
        process, so that a later start can remove it if this process dies without doing so (reap_orphans).
        `host_network`: the host's network namespace, so a server on the host's 127.0.0.1 is reachable."""
        args = ["create"]
        if name:
            args += ["--name", name]
        for k, v in {ROLE_LABEL: "tool", **(labels or {}), OWNER_LABEL: owner_value()}.items():
            args += ["--label", f"{k}={v}"]
        for m in mounts:
            args += ["--mount", m.as_arg()]
        for k, v in (env or {}).items():
            args += ["--env", f"{k}={v}"]
        if workdir:
            args += ["--workdir", workdir]
        if user:
            args += ["--user", user]
        args += (limits or Limits()).as_args()
        if not network:
            args.append("--network=none")
        elif host_network:
            args.append("--network=host")
        if arch:
            args += ["--platform", _docker_platform(arch)]
        if self.name == "podman":
            # Never reach for a registry: images are local (and none is reachable here).
            args += ["--pull=never"]
        args += [image, *argv]
        p = self._run(args)
        return p.stdout.strip().splitlines()[-1]

    def start(self, container: str, log_path: Path | None = None, timeout: float | None = None) -> bool:
        """Start and follow the container's output into log_path until it stops.

        Returns False when `timeout` seconds passed first (the container is then killed).
        The exit code is NOT taken from here: use wait(). `start -a` (like `run --rm`)
        reports a wrong exit status with the docker CLI against some podman services.
        """
        with _log_sink(log_path) as sink:
            proc = spawn([self.exe, "start", "--attach", container], sink, cwd=engine_cwd(), env=self._env(),
                         own_group=False)
            try:
                proc.wait(timeout=timeout)
                return True
            except TimeoutExpired:
                self.rm(container)
                proc.kill()
                proc.wait()
                return False

    def wait(self, container: str) -> int:
        """The container's exit code, read with `wait` (the one reliable source)."""
        p = self._run(["wait", container])
        lines = p.stdout.strip().splitlines()
        try:
            return int(lines[-1])
        except (IndexError, ValueError) as exc:
            raise EngineError(f"{self.name} wait {container}: unreadable exit code {p.stdout!r}") from exc

    def cp_out(self, container: str, src: str, dest: Path) -> None:
        self._run(["cp", f"{container}:{src}", str(dest)])

    def reap_orphans(self) -> list[str]:
        """Remove the containers this farm created on this host whose owner process is gone (a SIGKILLed
        `farm build` leaves its build running); returns their ids. One `ps` when there are none; never
        touches a container without the owner label, one of a live owner, or one of another host."""
        found = self._run(["ps", "-a", "--filter", f"label={OWNER_LABEL}", "--format", "{{.ID}}"], check=False)
        ids = found.stdout.split() if found.returncode == 0 else []
        if not ids:
            return []
        # docker's `ps` prints labels as one string, podman's as a map: `inspect` reads both alike.
        # A container removed meanwhile fails its part of the answer; the others' lines still come.
        owners = self._run(["inspect", "--type", "container", "--format",
                            f'{{{{.Id}}}} {{{{index .Config.Labels "{OWNER_LABEL}"}}}}', *ids], check=False)
        reaped = []
        for line in owners.stdout.splitlines():
            cid, _, owner = line.strip().partition(" ")
            if cid and owner_gone(owner.strip()):
                self.rm(cid)
                reaped.append(cid)
        return reaped

    def rm(self, container: str) -> None:
        """Remove `container`, killing it at once if it runs: a build has nothing to save on the way out.
        (`docker rm -f` kills at once; podman's waits 10 s after SIGTERM, which PID 1 of a build ignores.)"""
        self._run(["rm", "-f", *(["--time", "0"] if self.name == "podman" else []), container], check=False)

    def run(self, image: str, argv: list[str], log_path: Path | None = None, timeout: float | None = None,
            **create_kw: Any) -> RunResult:
        """create + start + wait + rm: a one-shot container whose exit code is faithful.

        Deliberately not `run --rm`: the docker CLI talking to podman's service
        (podman 4.3 here) loses that exit code and reports 0.
        """
        cid = self.create(image, argv, **create_kw)
        try:
            finished = self.start(cid, log_path=log_path, timeout=timeout)
            if not finished:
                return RunResult(exit_code=124, timed_out=True, container_id=cid)
            return RunResult(exit_code=self.wait(cid), container_id=cid)
        finally:
            self.rm(cid)

    def output(self, image: str, argv: list[str], **create_kw: Any) -> str:
        """Run a short command in `image` and return its output; fails on non-zero exit."""
        tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"farm-engine-{os.getpid()}-{time.monotonic_ns()}.log"
        try:
            res = self.run(image, argv, log_path=tmp, **create_kw)
            text = tmp.read_text(errors="replace")
        finally:
            tmp.unlink(missing_ok=True)
        if res.exit_code != 0:
            raise EngineError(f"{' '.join(argv)} in {image} exited {res.exit_code}: {text.strip()[-300:]}")
        return text


def full_id(raw: str) -> str:
    """An image id as `sha256:<hex>` (docker prints it so, some podman outputs leave the prefix off)."""
    return raw if raw.startswith("sha256:") or not raw else f"sha256:{raw}"


class _log_sink:
    """A file to append output to, or DEVNULL when no log is wanted."""

    def __init__(self, path: Path | None):
        self.path: Path | None = path
        self.fh: IO[bytes] | None = None

    def __enter__(self) -> int | IO[bytes]:
        if self.path is None:
            return DEVNULL
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.path, "ab")
        return self.fh

    def __exit__(self, *exc: object) -> None:
        if self.fh:
            self.fh.close()


def ensure_engine(setup: bool = True) -> Engine:
    """An engine that answers; when none does, run scripts/setup-engine.sh once and retry.

    The setup script is idempotent (apt installs, containers.conf, `podman info`).
    """
    try:
        return Engine.detect()
    except EngineUnavailable as first:
        script = settings.PROJECT_ROOT / "scripts" / "setup-engine.sh"
        if not setup or not script.exists():
            raise
        p = run(["sh", script])
        if p.returncode != 0:
            last = last_line(p.stdout + p.stderr, default=str(p.returncode))
            raise EngineUnavailable(f"{first}; setup-engine.sh failed: {last}") from None
        return Engine.detect()
