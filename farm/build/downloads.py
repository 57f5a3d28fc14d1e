"""Host-side downloads of binary wheels for a TARGET Python and platform (design.md §6.2).

`pip download` runs on the host with explicit --platform/--python-version and
--only-binary, isolated from this machine's pip configuration (whose find-links
carry a CPU torch that pip would prefer, and whose constraints cap torch). Files
land in the shared cache_dir()/downloads; each request's resolved file list is
kept as a manifest so a second call neither downloads nor even asks the index.
Installs later use exactly the manifest's files with `--no-index`. A project with no wheel for
the target but a pure-Python sdist is built into a wheel here first (`wheel_from_sdist`).
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from farm import progress
from farm.cachebudget import downloads_in_use, enforce_budget, flocked, touch
from farm.errors import DownloadFailed, FarmError, IndexUnreachable
from farm.platforms import marker_environment
from farm.process import CompletedProcess, last_useful_lines, stream
from farm.settings import cache_dir
from farm.versions import python_tag, vtuple
from farm.yamlio import write_atomic

PYPI_SIMPLE = "https://pypi.org/simple"
MANIFESTS = "manifests"
_SAVED = re.compile(r"^\s*(?:Saved|File was already downloaded)\s+(\S+\.whl)\s*$")
_DOWNLOADING = re.compile(r"^\s*Downloading\s+(\S+)")
_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")   # pip's --progress-bar raw (pip 24.1 and later)

ARCH_OF = {"linux": "x86_64", "linux_aarch64": "aarch64"}


def machine(platform: str) -> str:
    """Farm platform -> CPU name of its wheels (x86_64, aarch64); Windows is not downloaded here."""
    try:
        return ARCH_OF[platform]
    except KeyError:
        raise FarmError(f"no Linux wheel downloads for platform {platform!r} (only linux, linux_aarch64)") from None


def platform_tags(platform: str, glibc: str = "2.28") -> list[str]:
    """Every manylinux tag a target with this glibc accepts, newest first; `win_amd64` for a Windows
    target (its torch comes from the PyTorch channel of its CUDA line: PyPI's Windows torch is CPU-only).

    pip does not expand `manylinux_2_28_x86_64` to older glibc tags by itself
    (only the legacy manylinux2014 spelling, which it expands to 2010 and 1),
    so the list is spelled out. linux_<arch> is never accepted: it is not portable.
    """
    if platform == "windows":
        return ["win_amd64"]
    arch = machine(platform)
    major, minor = vtuple(glibc)[:2]
    if major != 2:
        raise FarmError(f"unexpected glibc {glibc!r}")
    tags = [f"manylinux_2_{m}_{arch}" for m in range(minor, 16, -1)]
    tags.append(f"manylinux2014_{arch}")
    return tags


@dataclass(frozen=True)
class Index:
    """Where wheels come from: PyPI, or a PyTorch channel with PyPI as the extra index."""

    url: str = PYPI_SIMPLE
    extra_url: str | None = None

    def args(self) -> list[str]:
        out = ["--index-url", self.url]
        if self.extra_url:
            out += ["--extra-index-url", self.extra_url]
        return out

    def reachable(self, timeout: float = 10.0) -> str | None:
        """None when the index answers, else the reason."""
        probe = self.url.rstrip("/") + "/"
        try:
            with urllib.request.urlopen(urllib.request.Request(probe, method="HEAD"), timeout=timeout):
                return None
        except urllib.error.HTTPError as exc:
            return None if exc.code in (403, 404, 405) else f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            return str(getattr(exc, "reason", exc))


def isolated_pip_env() -> dict[str, str]:
    """The environment for a pip that ignores this machine's pip config (find-links, constraints)
    and never sees the farm's own PYTHONPATH (a container step's project mount)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def _cert_args() -> list[str]:
    cert = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    return ["--cert", cert] if cert else []


@dataclass(frozen=True)
class DownloadSet:
    """The resolved closure of one request: exact wheel files in the downloads folder."""

    requirements: tuple[str, ...]
    files: tuple[Path, ...]
    manifest: Path
    markers_decided: bool = True   # False: a manifest from before the target's markers were decided

    def file_for(self, project: str) -> Path | None:
        norm = re.sub(r"[-_.]+", "_", project).lower()
        for f in self.files:
            if f.name.lower().startswith(norm + "-"):
                return f
        return None


def _manifest_key(requirements: Iterable[str], constraints: Iterable[str], python: str, platform: str, glibc: str,
                  index: Index) -> str:
    blob = json.dumps([sorted(requirements), sorted(constraints), python, platform, glibc, index.url,
                       index.extra_url], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def load_manifest(path: Path, dl_dir: Path) -> DownloadSet | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    files = tuple(dl_dir / name for name in data["files"])
    if not all(f.is_file() for f in files):
        return None   # some file was evicted: download again
    return DownloadSet(tuple(data["requirements"]), files, path, data.get("markers_decided", False))


def download(requirements: list[str] | tuple[str, ...], *, python: str, platform: str, glibc: str = "2.28",
             constraints: list[str] | tuple[str, ...] = (), index: Index = Index(), no_deps: bool = False,
             log: Callable[[str], None] | None = None, root: Path | None = None) -> DownloadSet:
    """pip download `requirements` (+ dependencies) for Python `python` on `platform` into the cache.

    A repeated identical request is answered from its manifest without running pip.
    """
    root = root or cache_dir()
    log = log or (lambda _m: None)
    key = _manifest_key(list(requirements) + (["--no-deps"] if no_deps else []), constraints, python,
                        platform, glibc, index)
    with downloads_in_use(root) as dl_dir:
        manifest = dl_dir / MANIFESTS / f"{key}.json"
        if (hit := _cache_hit(manifest, dl_dir, requirements, python, platform, no_deps, log)) is not None:
            return hit
        t0 = time.monotonic()
        with _sole_writer(dl_dir, log):
            # the build we waited for may have downloaded this very set
            if (hit := _cache_hit(manifest, dl_dir, requirements, python, platform, no_deps, log)) is not None:
                return hit
            result = _download_into(dl_dir, manifest, key, requirements, python, platform, glibc, constraints,
                                    index, no_deps, log)
    enforce_budget(root, log=log, keep=result.files)
    log(f"downloads: {len(result.files)} files for {' '.join(requirements)} in {time.monotonic() - t0:.1f}s")
    return result


def _cache_hit(manifest: Path, dl_dir: Path, requirements: Sequence[str], python: str, platform: str,
               no_deps: bool, log: Callable[[str], None]) -> DownloadSet | None:
    hit = load_manifest(manifest, dl_dir)
    # a manifest written before the target's markers were decided may lack what they add
    if hit is not None and (no_deps or hit.markers_decided or not unmet_for_target(list(hit.files), python,
                                                                                    platform)):
        touch(hit.files)
        log(f"downloads: cache hit for {' '.join(requirements)} ({len(hit.files)} files)")
        return hit
    return None


@contextmanager
def _sole_writer(dl_dir: Path, log: Callable[[str], None]) -> Iterator[None]:
    """One pip at a time writes into the shared downloads folder. pip takes a file it finds there for
    one already downloaded, so a second pip would read, or delete as a bad hash, a wheel the first is
    still copying in (seen as a failed download of the demo cell beside a rebuild sharing its CUDA wheels)."""
    with flocked(dl_dir / ".pip-writer.lock",
                 on_wait=lambda: log("downloads: another build is downloading into the shared folder; waiting for it")):
        yield


def _download_into(dl_dir: Path, manifest: Path, key: str, requirements: Sequence[str], python: str, platform: str,
                   glibc: str, constraints: Sequence[str], index: Index, no_deps: bool,
                   log: Callable[[str], None]) -> DownloadSet:
    """Run pip download (and what the target's markers add) into `dl_dir`; write the set's manifest."""
    # pip takes an unreachable first index for a warning and resolves from the extra one alone: from
    # PyPI, a PyTorch channel's torch would come as PyPI's default build, of another CUDA line.
    if index.extra_url and (why := index.reachable()) is not None:
        raise IndexUnreachable(f"{index.url} is unreachable ({why}): {' '.join(requirements)} must come from it, "
                               f"not from {index.extra_url} alone")
    t0 = time.monotonic()
    pytag = python_tag(python)
    cmd = [sys.executable, "-m", "pip", "download", "--isolated", *_cert_args(), "--progress-bar", _progress_bar(),
           "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
           "--abi", f"cp{pytag}", "--abi", "abi3", "--abi", "none", "-d", str(dl_dir), *index.args()]
    for tag in platform_tags(platform, glibc):
        cmd += ["--platform", tag]
    if no_deps:
        cmd.append("--no-deps")
    cfile = None
    if constraints:
        cfile = dl_dir / MANIFESTS / f"{key}.constraints.txt"
        write_atomic(cfile, "\n".join(constraints) + "\n")
        cmd += ["-c", str(cfile)]
    cmd += list(requirements)
    built: list[str] = []   # pure-Python wheels built here from sdists (a project that publishes no wheel)
    while True:
        log("downloads: " + " ".join(cmd))
        proc = stream(cmd, DownloadProgress(), env=isolated_pip_env())
        missing = _no_distribution(proc.stderr + proc.stdout) if proc.returncode != 0 else None
        if missing is None or missing in built or len(built) >= MAX_SDIST_BUILDS:
            break
        wheel = wheel_from_sdist(missing, dl_dir / FROM_SDIST, python, platform, log)
        built.append(missing)
        log(f"downloads: {missing} has no wheel; built {wheel.name} from its sdist")
        if "--find-links" not in cmd:
            cmd[cmd.index("-d"):cmd.index("-d")] = ["--find-links", str(dl_dir / FROM_SDIST)]
    _raise_unless_done(proc, requirements, python, platform, index)
    names = _saved(proc.stdout)
    if not names:
        raise DownloadFailed(f"pip download {' '.join(requirements)} reported no wheel files")
    # pip evaluates the markers of dependencies for the interpreter it runs on, not for
    # --python-version: a 3.10 target misses `tomli; python_version < "3.11"` when pip runs on
    # 3.11. Download what the target's markers add until nothing is missing.
    prefix = cmd[:len(cmd) - len(requirements)]
    for _ in range(MAX_MARKER_ROUNDS):
        unmet = unmet_for_target([dl_dir / n for n in names], python, platform)
        if no_deps or not unmet:
            break
        log(f"downloads: {' '.join(unmet)}: required on Python {python} by markers pip decided for this interpreter")
        proc = stream(prefix + unmet, DownloadProgress(), env=isolated_pip_env())
        _raise_unless_done(proc, unmet, python, platform, index)
        names = sorted(set(names) | set(_saved(proc.stdout)))
    if cfile:
        cfile.unlink(missing_ok=True)
    write_atomic(manifest, json.dumps({"requirements": list(requirements), "constraints": list(constraints),
                                       "python": python, "platform": platform, "glibc": glibc,
                                       "index": index.url, "files": names, "built_from_sdist": built,
                                       "markers_decided": True,
                                       "seconds": round(time.monotonic() - t0, 1)}, indent=1))
    result = DownloadSet(tuple(requirements), tuple(dl_dir / n for n in names), manifest)
    touch(result.files)
    return result


def _saved(stdout: str) -> list[str]:
    """The wheel files a pip download run saved or found already there."""
    return sorted({Path(m.group(1)).name for ln in stdout.splitlines() if (m := _SAVED.match(ln))})


def _raise_unless_done(proc: CompletedProcess[str], requirements: Sequence[str], python: str, platform: str,
                       index: Index) -> None:
    if proc.returncode != 0:
        tail = last_useful_lines(proc.stderr or proc.stdout, 3, skip=lambda ln: ln.startswith("[notice]"))
        raise DownloadFailed(f"pip download {' '.join(requirements)} for Python {python} {platform} "
                             f"from {index.url} failed: {' | '.join(tail)}")


MAX_MARKER_ROUNDS = 4   # each round adds one level of marker-only dependencies (tomli, then its own, ...)


def unmet_for_target(wheels: list[Path], python: str, platform: str) -> list[str]:
    """Requirements of `wheels` whose markers hold on the target but that no wheel among them meets
    by name (what pip left out, deciding the markers for the interpreter it runs on)."""
    env = {**marker_environment(platform, ".".join(python.split(".")[:2])), "extra": ""}
    have = {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in wheels}
    unmet: dict[str, str] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            meta = next((n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")), None)
            if meta is None:
                continue
            fields = email.parser.BytesParser().parsebytes(zf.read(meta))
        for line in fields.get_all("Requires-Dist") or []:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            name = canonicalize_name(req.name)
            if name in have or name in unmet or (req.marker is not None and not req.marker.evaluate(env)):
                continue
            req.marker = None
            unmet[name] = str(req)
    return sorted(unmet.values())


FROM_SDIST = "from-sdist"
MAX_SDIST_BUILDS = 5   # per request: a chain longer than this is a resolution problem, not a few sdists
_NO_DISTRIBUTION = re.compile(r"No matching distribution found for (\S+)")


def _no_distribution(output: str) -> str | None:
    """The requirement pip found no distribution for, as pip spells it."""
    found = _NO_DISTRIBUTION.search(output)
    return found.group(1) if found else None


def wheel_from_sdist(requirement: str, folder: Path, python: str, platform: str, log: Callable[[str], None]) -> Path:
    """A project that publishes only an sdist (fvcore): its wheel built here, accepted only when it is pure
    Python (`py3-none-any`), since a compiled one would be for this host, not the target."""
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="farm-sdist-") as tmp:
        def pip(verb: str, *args: str) -> None:
            argv = [sys.executable, "-m", "pip", verb, "--isolated", *_cert_args(), "--no-deps", *args]
            log("downloads: " + " ".join(argv))
            proc = stream(argv, DownloadProgress(), env=isolated_pip_env())
            if proc.returncode != 0:
                tail = last_useful_lines(proc.stderr or proc.stdout, 2, skip=lambda ln: ln.startswith("[notice]"))
                raise DownloadFailed(f"{requirement}: no wheel for Python {python} {platform}, and its sdist "
                                     f"did not build one: {' | '.join(tail)}")

        pip("download", "--no-binary=:all:", "-d", tmp, requirement)
        sdists = [str(p) for p in Path(tmp).iterdir() if p.name.endswith((".tar.gz", ".zip"))]
        pip("wheel", "-w", tmp, *sdists)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1 or not _pure(wheels[0].name):
            raise DownloadFailed(f"{requirement}: no wheel for Python {python} {platform}, and its sdist builds "
                                 f"{', '.join(w.name for w in wheels) or 'nothing'}, not a pure-Python wheel "
                                 "(one compiled here would be for this host, not the target)")
        target = folder / wheels[0].name
        shutil.copyfile(wheels[0], target.with_suffix(".partial"))
        os.replace(target.with_suffix(".partial"), target)
    return target


def _pure(wheel_name: str) -> bool:
    """A wheel any CPython 3 takes on any platform: every tag `py3-none-any` (or py2.py3)."""
    from packaging.utils import parse_wheel_filename

    tags = parse_wheel_filename(wheel_name)[3]
    return all(t.interpreter.startswith("py3") or t.interpreter == "py2" for t in tags) and \
        all(t.abi == "none" and t.platform == "any" for t in tags) and any(t.interpreter == "py3" for t in tags)


def _progress_bar() -> str:
    """`raw` where pip prints it (a line per quarter second of each file), else `off`."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return "raw" if vtuple(version("pip"))[:2] >= (24, 1) else "off"
    except (PackageNotFoundError, ValueError):
        return "off"


class DownloadProgress:
    """Reads pip download's output as it comes and emits `downloads` progress: bytes done of the bytes
    of the files pip has started so far (pip learns the closure as it resolves), on the current file.
    One downloads step runs pip several times (torch, then the recipe's deps): the counts go on from
    where the step's previous run left them, so the step's last line totals them all."""

    _carried: dict[float | None, tuple[int, int]] = {}   # step run -> (bytes done, bytes total) so far

    def __init__(self) -> None:
        self.run = progress.started("downloads")
        self.finished, self.total = self._carried.get(self.run, (0, 0)) if self.run is not None else (0, 0)
        self.file: str | None = None
        self.file_done = 0
        self.file_total: int | None = None

    def __call__(self, line: str) -> None:
        if m := _DOWNLOADING.match(line):
            self.finished += self.file_done
            self.file, self.file_done, self.file_total = Path(m.group(1)).name, 0, None
        elif (m := _PROGRESS.match(line)) and self.file:
            done, size = int(m.group(1)), int(m.group(2))
            if self.file_total is None:
                self.file_total, self.total = size, self.total + size
            self.file_done = done
            if self.run is not None:
                type(self)._carried = {self.run: (self.finished + done, self.total)}
            progress.emit(progress.Event("downloads", "progress", done=self.finished + done, total=self.total,
                                         unit="bytes", current=self.file))


def find_manifest(requirements: Sequence[str], *, python: str, platform: str, glibc: str = "2.28",
                  constraints: Sequence[str] = (),
                  index: Index = Index(), no_deps: bool = False, root: Path | None = None) -> DownloadSet | None:
    """The cached result of an earlier identical `download` call (offline; None when absent)."""
    root = root or cache_dir()
    key = _manifest_key(list(requirements) + (["--no-deps"] if no_deps else []), constraints, python,
                        platform, glibc, index)
    dl_dir = root / "downloads"
    return load_manifest(dl_dir / MANIFESTS / f"{key}.json", dl_dir)
