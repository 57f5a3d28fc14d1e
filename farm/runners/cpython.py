"""The Pythons a container lane has, and the CPythons the farm builds for a lane that lacks them
(design.md §8.4).

The local Debian base has one Python of its own (bookworm: 3.11). On the host's architecture the
host's pyenv Pythons are mounted beside it (farm/runners/images.py). Those cannot run in the emulated
aarch64 image, so for that lane the farm builds CPython itself, natively in the arm64 builder image
(under QEMU: no PGO/LTO), from the upstream tarballs Debian's source archive carries, checked against
the sha256 the package's .dsc gives. A built prefix is cached under cache_dir()/tools, keyed by its
inputs (the tarball, the builder image, the -dev packages, the configure line), and mounted read-only
at a fixed path in every step that uses it, like a pyenv prefix.

Which Pythons a lane has is known from these facts alone, before any image is built, so `farm plan`,
`farm build` and the nox sessions say up front that a cell cannot build here (`why_no_python`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from farm import settings
from farm.errors import ImageError
from farm.platforms import host_arch
from farm.process import last_line
from farm.runners import images
from farm.runners.engine import Engine, Mount, default_limits
from farm.settings import cache_dir


@dataclass(frozen=True)
class Source:
    """An upstream CPython tarball as Debian's source archive carries it (its package's .dsc)."""

    version: str      # 3.13.5
    suite: str        # the Debian suite whose source package holds it
    sha256: str       # Checksums-Sha256 of the orig tarball in that .dsc

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def filename(self) -> str:
        return f"python{self.minor}_{self.version}.orig.tar.xz"

    @property
    def url(self) -> str:
        return f"{settings.DEBIAN_MIRROR.value().rstrip('/')}/pool/main/p/python{self.minor}/{self.filename}"


# What Debian's archive carries (dists/<suite>/main/source/Sources). 3.10 and 3.12 are in no current
# suite, so no lane that needs them gets them here. A sid tarball leaves the archive when sid moves
# on: the download then fails in one line, and a prefix built before stays cached.
SOURCES = {s.minor: s for s in (
    Source("3.13.5", "trixie", "93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640"),
    Source("3.14.10", "sid", "de414a57119abef52784d8993e341d53aed635fc2b05c2607d9f98a2c5b72032"),
    Source("3.15.2", "sid", "8b5536d280142ecf6cdfe15d12a21ba1c65e300bbf7b28a8d0cdb849575797de"),
)}
# The base's own python3 (docker/install-deps.sh records it in the image as /usr/bin/python3).
BASE_PYTHON = {"bookworm": "3.11"}
# What the stdlib's C modules link against (configure finds several through pkg-config); the builder
# image has the runtime libraries only.
DEV_PACKAGES = ("libbz2-dev", "libexpat1-dev", "libffi-dev", "liblzma-dev", "libncursesw5-dev", "libreadline-dev",
                "libsqlite3-dev", "libssl-dev", "pkg-config", "uuid-dev", "zlib1g-dev")
# No test modules: fewer objects to compile and install under QEMU, and no cell imports them.
CONFIGURE = ("--disable-test-modules", "--with-ensurepip=install", "--with-system-expat")
# What a farm step needs of the interpreter (the pyenv check of images.py, plus what the gate's import uses).
CHECK_IMPORTS = "ssl, ctypes, zlib, bz2, lzma, sqlite3, readline, uuid, venv, ensurepip, pyexpat"
PREFIX_ROOT = "/opt/farm-python"   # where a built prefix is mounted in a container
# Bump when the build script below changes what it makes.
_RECIPE_VERSION = 1


# ----- which Pythons a lane has, from facts alone ------------------------------------------------

@functools.cache
def lane_pythons(arch: str) -> dict[str, str]:
    """Python minor -> where a container cell of `arch` gets it, without building or probing an image."""
    found = {BASE_PYTHON[images.SUITE]: f"Debian {images.SUITE}'s own"}
    if arch == host_arch():
        for prefix in images.pyenv_prefixes():
            found.setdefault(".".join(prefix.name.split(".")[:2]), "this host's pyenv")
    else:
        for minor, src in SOURCES.items():
            found.setdefault(minor, f"built by the farm from Debian {src.suite}'s CPython {src.version}")
    current = images.builder_key(arch, images.base_ref(arch))
    for image, _ in images.list_images(None):   # a recorded image of this checkout's recipe may have more
        if image.arch == arch and image.key == current:
            found.update({v: f"the image's ({image.ref})" for v in image.python_versions() if v not in found})
    return found


def why_no_python(arch: str, version: str) -> str | None:
    """Why a container cell of `arch` cannot have Python `version` here (None: it can), in one line."""
    have = lane_pythons(arch)
    if version in have:
        return None
    listed = ", ".join(sorted(have, key=lambda v: tuple(int(x) for x in v.split("."))))
    if arch == host_arch():
        return (f"Python {version}: not in the {arch} image (it has {listed}: Debian's and this host's "
                "pyenv Pythons)")
    return (f"Python {version}: the emulated {arch} image has {listed} (Debian's, and those the farm builds "
            f"from Debian's source archive, which carries no CPython {version})")


def why_not_session(tags: tuple[str, ...]) -> str | None:
    """The same reason for a nox build session, from its tags alone (`pyXY` and the platform, last): the
    session list stays as light as the cached plan it comes from. Windows cells are `farm build`'s to refuse."""
    from farm.platforms import cell_arch

    platform = tags[-1] if tags else ""
    py = next((t[2:] for t in tags if t[:3] == "py3" and t[2:].isdigit()), None)
    if platform == "windows" or py is None:
        return None
    return why_no_python(cell_arch(platform), f"{py[0]}.{py[1:]}")


def buildable(arch: str, version: str) -> bool:
    """Whether the farm builds CPython `version` for a container lane of `arch` (one the host's cannot serve)."""
    return arch != host_arch() and version in SOURCES


# ----- the source tarball ------------------------------------------------------------------------

def source_dir() -> Path:
    return images.images_dir() / "cpython-src"


def fetch_source(src: Source) -> Path:
    """The tarball in the cache, downloaded once and checked against the .dsc's sha256 (a mismatch
    keeps nothing)."""
    dest = source_dir() / src.filename
    if dest.is_file() and file_sha256(dest) == src.sha256:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{src.filename}.", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh, urllib.request.urlopen(src.url, timeout=60) as resp:
            shutil.copyfileobj(resp, fh)
        got = file_sha256(tmp)
        if got != src.sha256:
            raise ImageError(f"{src.url}: sha256 {got}, Debian's .dsc says {src.sha256} (nothing kept)")
        os.replace(tmp, dest)
    except (OSError, urllib.error.URLError) as exc:
        raise ImageError(f"cannot download CPython {src.version} from {src.url}: "
                         f"{getattr(exc, 'reason', None) or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def file_sha256(path: Path) -> str:
    """sha256 of a source tarball (also the old userland's, farm/runners/oldland.py)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ----- the build ---------------------------------------------------------------------------------

def prefix_in_container(src: Source) -> str:
    return f"{PREFIX_ROOT}/{src.version}"


def build_key(builder_id: str, src: Source) -> str:
    return images.sha(builder_id, src.sha256, *DEV_PACKAGES, *CONFIGURE, str(_RECIPE_VERSION))[:16]


def prefix_dir(builder: images.Image, src: Source) -> Path:
    return cache_dir() / "tools" / f"cpython-{src.version}-{builder.arch}-{build_key(builder.builder_id, src)}"


def entry(builder: images.Image, src: Source, folder: Path) -> dict[str, Any]:
    """An image's Python entry for a built prefix: run at `path`, mounted from `source` at `mount`."""
    prefix = prefix_in_container(src)
    return {"version": src.minor, "path": f"{prefix}/bin/python3", "mount": prefix, "source": str(folder)}


def built(builder: images.Image, version: str) -> dict[str, Any] | None:
    """The entry of CPython `version` when its prefix for `builder` is built already (nothing is built)."""
    src = SOURCES.get(version)
    if src is None:
        return None
    folder = prefix_dir(builder, src)
    return entry(builder, src, folder) if (folder / ".farm-ok").exists() else None


def _script(src: Source, jobs: int) -> str:
    prefix = prefix_in_container(src)
    configure = " ".join(CONFIGURE)
    return (f"set -eu; mkdir -p /tmp/cpython && cd /tmp/cpython && tar -xJf /farm/src/{src.filename} "
            f"--strip-components=1 && ./configure --prefix={prefix} {configure} && make -j{jobs} && make install "
            f"&& {prefix}/bin/python3 -c 'import {CHECK_IMPORTS}; print(\"farm-cpython-ok\")'")


def ensure(builder: images.Image, version: str, engine: Engine | None = None, quiet: bool = False) -> dict[str, Any]:
    """CPython `version` for `builder`'s lane: built once (natively in the image with the -dev packages
    added, under QEMU for an emulated lane), checked by importing what farm steps need, then cached."""
    src = SOURCES[version]
    engine = engine or Engine.detect()
    folder = prefix_dir(builder, src)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder.parent / f".{folder.name}.lock")):
        if (folder / ".farm-ok").exists():
            return entry(builder, src, folder)
        from farm.runners.syspkgs import ensure_layer

        tarball = fetch_source(src)
        layer = ensure_layer(engine, builder, DEV_PACKAGES)
        log = images.images_dir() / f"cpython-{src.version}-{builder.arch}.log"
        log.unlink(missing_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        limits = default_limits()
        jobs = max(1, int(limits.cpus or os.cpu_count() or 1))
        if not quiet:
            print(f"farm images: building CPython {src.version} for {builder.arch} in {layer.ref} (log {log})",
                  flush=True)
        try:
            with images.shown(f"cpython {src.minor}", log):
                res = engine.run(layer.ref, ["sh", "-c", _script(src, jobs)], log_path=log, limits=limits,
                                 network=False, arch=builder.arch,
                                 mounts=[Mount(tarball.parent, "/farm/src", read_only=True),
                                         Mount(staging, prefix_in_container(src))])
            if res.exit_code != 0 or "farm-cpython-ok" not in log.read_text(errors="replace"):
                raise ImageError(f"building CPython {src.version} for {builder.arch} failed (exit {res.exit_code}): "
                                 f"{last_line(log, default='')} (log {log})")
            (staging / ".farm-ok").write_text(f"{src.version} {src.sha256}\n")
            os.replace(staging, folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return entry(builder, src, folder)
