"""The old userland: a Debian bullseye root (glibc 2.31, the libstdc++ of gcc 10) with CPythons built
inside it, where published wheels are installed and imported as a user of an old distribution would
(design.md §9.9).

Its Pythons must themselves run on glibc 2.31, so they are compiled in that root from the upstream
CPython tarball Debian's source archive carries (the `.orig` tarball of a pythonX.Y source package),
checked against the checksum its `.dsc` lists. A minor Debian no longer carries can be given as a
python.org source tarball (`Python-X.Y.Z.tar.xz`). Everything is cached under cache_dir()/images
keyed by a hash of its inputs: the debootstrapped root, each built CPython, and the image made of
them; a second call finds the image and builds nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from farm import settings
from farm.errors import BadInput, ImageError
from farm.platforms import host_arch
from farm.process import last_line, run
from farm.runners import images
from farm.runners.cpython import file_sha256
from farm.runners.engine import Engine, Mount
from farm.yamlio import write_atomic

SUITE = "bullseye"
OLDLAND_REPO, OLDLAND_BASE_REPO = "localhost/farm-oldland", "localhost/farm-oldland-base"
# minbase plus what a CPython build needs for ssl, zlib, ctypes (libffi), bz2, lzma and sqlite3, and the
# compiler that also builds test extensions there (their symbols then need at most glibc 2.31).
PACKAGES = ("ca-certificates", "g++", "gcc", "libbz2-dev", "libc6-dev", "libffi-dev", "liblzma-dev",
            "libsqlite3-dev", "libssl-dev", "make", "uuid-dev", "xz-utils", "zlib1g-dev")
# Bump when the way the root, a CPython or the image is made changes (their inputs are hashed).
_RECIPE_VERSION = 1
PREFIX = "/opt/python"   # each CPython at /opt/python/X.Y
# What every built CPython must import: pip's TLS, wheels' zips, ctypes (torch), venv + ensurepip.
REQUIRED_MODULES = ("ssl", "zlib", "ctypes", "bz2", "lzma", "sqlite3", "venv", "ensurepip")


@dataclass(frozen=True)
class CPythonSource:
    """One upstream CPython source tarball: from a Debian source package (`dsc` names the
    package version whose checksums vouch for it), or a local file given by the user."""

    version: str            # "3.11.2"
    sha256: str
    orig: str = ""          # the .orig tarball's name in Debian's pool
    dsc: str = ""           # the .dsc that lists its checksum
    path: str = ""          # a local python.org tarball instead

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    def pool_url(self, name: str) -> str:
        package = name.split("_", 1)[0]
        return f"{settings.DEBIAN_MIRROR.value().rstrip('/')}/pool/main/p/{package}/{name}"


# The CPythons built from Debian's archive (bookworm's python3.11). Debian carries no python3.12 any more
# (trixie went from 3.11 to 3.13; its python3.13 source is not wired here yet): give a python.org
# tarball with `--cpython-source`.
DEBIAN_SOURCES = {
    "3.11": CPythonSource("3.11.2", "2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849",
                          orig="python3.11_3.11.2.orig.tar.gz", dsc="python3.11_3.11.2-6+deb12u6.dsc"),
}
_LOCAL_TARBALL = re.compile(r"Python-(3\.\d+\.\d+)\.(?:tgz|tar\.(?:gz|xz))")


def local_source(path: Path) -> CPythonSource:
    """A python.org source tarball named `Python-X.Y.Z.tar.xz` (or .tgz/.tar.gz), or BadInput."""
    m = _LOCAL_TARBALL.fullmatch(path.name)
    if not m:
        raise BadInput("--cpython-source", None, str(path), "expected a python.org tarball named Python-X.Y.Z.tar.xz")
    if not path.is_file():
        raise BadInput("--cpython-source", None, str(path), "no such file")
    return CPythonSource(m.group(1), file_sha256(path), path=str(path.resolve()))


def _dsc_sha256(dsc_text: str, name: str) -> str | None:
    """The sha256 a .dsc's Checksums-Sha256 field lists for `name`."""
    m = re.search(r"^Checksums-Sha256:\n((?: .*\n)+)", dsc_text, re.M)
    for line in (m.group(1).splitlines() if m else []):
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return parts[0]
    return None


def fetch_source(src: CPythonSource) -> Path:
    """The source tarball on this machine: downloaded once from Debian's pool into the cache and
    checked against the checksum its .dsc lists (and the one pinned here), or the local file."""
    if src.path:
        return Path(src.path)
    folder = images.images_dir() / "cpython-src"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / src.orig
    if out.is_file() and file_sha256(out) == src.sha256:
        return out
    try:
        with urllib.request.urlopen(src.pool_url(src.dsc), timeout=60) as r:
            listed = _dsc_sha256(r.read().decode(errors="replace"), src.orig)
        if listed != src.sha256:
            raise ImageError(f"{src.dsc} lists sha256 {listed} for {src.orig}, not the pinned {src.sha256}")
        part = out.with_name(out.name + ".part")
        with urllib.request.urlopen(src.pool_url(src.orig), timeout=600) as r, open(part, "wb") as fh:
            shutil.copyfileobj(r, fh)
    except OSError as exc:
        raise ImageError(f"cannot download CPython {src.version} from Debian's pool: {exc}") from None
    got = file_sha256(part)
    if got != src.sha256:
        part.unlink(missing_ok=True)
        raise ImageError(f"{src.orig}: sha256 {got}, but {src.dsc} lists {src.sha256}")
    os.replace(part, out)
    return out


# ----- the root, each CPython, the image -------------------------------------------------

def base_recipe(arch: str) -> dict[str, Any]:
    return {"suite": SUITE, "variant": "minbase", "arch": images.DEB_ARCH[arch], "include": sorted(PACKAGES),
            "version": _RECIPE_VERSION}


def _base_key(arch: str) -> str:
    return images.sha(json.dumps(base_recipe(arch), sort_keys=True))[:16]


# Runs inside the bullseye root: configure, build and install into /out (DESTDIR), then check the
# modules pip, venv and torch need. No --enable-optimizations: a PGO build takes 10x longer, and
# this interpreter only installs and imports wheels.
_BUILD_SCRIPT = r"""set -eu
mkdir -p /build && cd /build
tar -xf /src/source.tar
cd Python-*/
./configure --prefix="$PREFIX" --with-ensurepip=install > /out.log/configure.log 2>&1
make -j"$JOBS" > /out.log/make.log 2>&1
make install DESTDIR=/out > /out.log/install.log 2>&1
rm -rf "/out$PREFIX"/lib/python*/test
"/out$PREFIX/bin/python3" -c "import $MODULES; print('ok')"
"""


def _cpython_key(arch: str, src: CPythonSource) -> str:
    return images.sha(_base_key(arch), src.sha256, _BUILD_SCRIPT, ",".join(REQUIRED_MODULES),
                      str(_RECIPE_VERSION))[:16]


def _cpython_tarball(arch: str, src: CPythonSource) -> Path:
    return images.images_dir() / f"oldland-cpython-{src.version}-{arch}-{_cpython_key(arch, src)}.tar"


def _build_cpython(engine: Engine, base: str, arch: str, src: CPythonSource, quiet: bool) -> Path:
    """Compile `src` inside the bullseye root (no network) and cache the installed prefix as a tarball."""
    out = _cpython_tarball(arch, src)
    if out.is_file():
        return out
    tarball = fetch_source(src)
    log = images.images_dir() / f"oldland-cpython-{src.version}-{arch}.log"
    work = Path(tempfile.mkdtemp(prefix=f"farm-oldland-py{src.minor}-", dir=images.images_dir()))
    try:
        (work / "out").mkdir()
        (work / "log").mkdir()
        images._say(f"building CPython {src.version} inside {base} (a few minutes; log {log})", quiet)
        env = {"PREFIX": f"{PREFIX}/{src.minor}", "JOBS": str(os.cpu_count() or 2),
               "MODULES": ", ".join(REQUIRED_MODULES)}
        log.unlink(missing_ok=True)
        res = engine.run(base, ["sh", "-c", _BUILD_SCRIPT], log_path=log, env=env, network=False, arch=arch,
                         mounts=[Mount(tarball, "/src/source.tar", read_only=True), Mount(work / "out", "/out"),
                                 Mount(work / "log", "/out.log")])
        for step in ("configure", "make", "install"):   # the build's own logs follow the script's
            part = work / "log" / f"{step}.log"
            if part.is_file():
                with open(log, "a") as fh:
                    fh.write(f"\n----- {step} -----\n" + part.read_text(errors="replace"))
        if res.exit_code != 0:
            raise ImageError(f"building CPython {src.version} in {SUITE} failed (exit {res.exit_code}): "
                             f"{last_line(log, default='')} (log {log})")
        part_tar = out.with_name(out.name + ".part")
        run(["tar", "-C", work / "out", "--numeric-owner", "-cf", part_tar, "."], error=ImageError,
            what=f"packing CPython {src.version}")
        os.replace(part_tar, out)
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class Oldland:
    """The built image and the interpreters in it."""

    ref: str
    pythons: dict[str, str]   # "3.11" -> /opt/python/3.11/bin/python3
    glibc: str = "2.31"

    def python(self, minor: str) -> str | None:
        return self.pythons.get(minor)


def _sources(extra: list[CPythonSource]) -> list[CPythonSource]:
    by_minor = dict(DEBIAN_SOURCES)
    for src in extra:   # a given tarball wins over Debian's of the same minor
        by_minor[src.minor] = src
    return [by_minor[m] for m in sorted(by_minor, key=lambda v: tuple(int(x) for x in v.split(".")))]


def oldland_key(arch: str, sources: list[CPythonSource]) -> str:
    return images.sha(_base_key(arch), *(f"{s.minor}={_cpython_key(arch, s)}" for s in sources),
                      str(_RECIPE_VERSION))[:16]


def ensure_oldland(engine: Engine | None = None, extra_sources: Sequence[CPythonSource] = (), quiet: bool = False,
                   arch: str | None = None) -> Oldland:
    """The bullseye image with its CPythons, made once (debootstrap, each CPython, the image) and then
    found by the key in its tag."""
    arch = images.check_arch(arch or host_arch())
    if arch != host_arch():   # CPython compiled under QEMU takes an hour; nothing needs it yet
        raise BadInput("farm check-oldland", "--arch", arch, f"the old userland is made for this host's {host_arch()}")
    engine = engine or Engine.detect()
    sources = _sources(list(extra_sources))
    key = oldland_key(arch, sources)
    ref = f"{OLDLAND_REPO}:{SUITE}-{arch}-{key[:12]}"
    pythons = {s.minor: f"{PREFIX}/{s.minor}/bin/python3" for s in sources}
    folder = images.images_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / f".oldland-{arch}.lock")):
        if engine.image_id(ref):
            return Oldland(ref, pythons)
        base_key = _base_key(arch)
        base = f"{OLDLAND_BASE_REPO}:{SUITE}-{arch}-{base_key[:12]}"
        if not engine.image_id(base):
            tarball = folder / f"oldland-{SUITE}-{arch}-{base_key}.tar"
            if not tarball.exists():
                images._debootstrap(base_recipe(arch), tarball, folder / f"oldland-{SUITE}-{arch}.log", quiet)
            engine.import_tarball(tarball, base, arch, changes=["ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]'])
        built = [_build_cpython(engine, base, arch, s, quiet) for s in sources]
        with tempfile.TemporaryDirectory(prefix="farm-oldland-image-", dir=folder) as tmp:
            context = Path(tmp)
            lines = [f"FROM {base}"]
            for tar in built:   # a hard link: the context is on the same file system as the cache
                os.link(tar, context / tar.name)
                lines.append(f"ADD {tar.name} /")
            write_atomic(context / "Dockerfile", "\n".join(lines) + "\n")
            images._say(f"making {ref}", quiet)
            engine.build(context, ref, dockerfile=context / "Dockerfile", labels={"farm.key": key},
                         arch=arch, network=False, pull=False, log_path=folder / f"oldland-image-{arch}.log")
    return Oldland(ref, pythons)
