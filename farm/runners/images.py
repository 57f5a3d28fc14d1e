"""Builder images: the local Debian base, the builder image built from docker/Dockerfile,
what each image provides (glibc, platform tag, Pythons), and QEMU for aarch64 images.
It is longer than 600 lines because the base, its sysroot and the builder are one chain keyed
together (builder_key hashes all three), and splitting it would split that key.

Production builds FROM quay.io/pypa/manylinux_2_28_{x86_64,aarch64}. Where no registry
is reachable (here), the base is debootstrapped Debian bookworm imported into the
engine, with a debootstrapped Debian bullseye added at /opt/farm-sysroot: the sysroot the
image's host compiler builds against (glibc 2.31, gcc 10; farm/runners/hostcompiler.py).
Everything heavy is cached under cache_dir()/images and keyed by a hash of
its recipe, so nothing is rebuilt unless the recipe (package list, Dockerfile,
install script) changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from farm import progress, settings
from farm.errors import BadInput, EngineError, ImageError
from farm.platforms import host_arch, plat_glibc
from farm.process import call, last_line, run
from farm.runners.engine import Engine, Mount, full_id
from farm.runners.hostcompiler import compiler_env
from farm.settings import PROJECT_ROOT, cache_dir
from farm.yamlio import write_atomic

DOCKER_DIR = PROJECT_ROOT / "docker"
DOCKERFILE = DOCKER_DIR / "Dockerfile"
INSTALL_SCRIPT = DOCKER_DIR / "install-deps.sh"
FLOOR_SHIM = DOCKER_DIR / "libstdcxx-floor.cpp"   # the toolchain's libstdc++ floor shim (design.md §8.3)
LIBM_FLOOR = DOCKER_DIR / "glibc-floor.h"          # the libm symbol versions every compile binds (§8.3)
ARCHES = ("x86_64", "aarch64")
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
SUITE = "bookworm"
# The farm's own repositories in the engine (a recipe's package layers: farm/runners/syspkgs.py).
BUILDER_REPO, BASE_REPO, LAYER_REPO = "localhost/farm-builder", "localhost/farm-base", "localhost/farm-layer"
PRODUCTION_BASE = "quay.io/pypa/manylinux_2_28_{arch}"
# Bump when the way a base tarball is made changes (not its inputs, those are hashed).
_BASE_RECIPE_VERSION = 1
# Bump when what _probe() records changes, so existing records are redone.
_RECORD_VERSION = 1
IMAGE_FACTS_PATH = "/etc/farm-image.json"

# A shared object like a torch extension's: C++ standard library, threads, call_once,
# thread_local. What its symbol versions need is the lowest tag the image's toolchain
# gives such code: on glibc >= 2.34 std::call_once binds pthread_once@GLIBC_2.34
# (libpthread moved into libc), so a Debian 12 base yields manylinux_2_34 (design.md §8.3).
_PLAT_PROBE_CPP = r"""
#include <cmath>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
static std::once_flag once;
static std::mutex m;
thread_local std::string tls;
extern "C" double farm_probe(int n) {
    std::call_once(once, [] { tls = "1"; });
    std::vector<std::thread> ts; double acc = 0;
    for (int i = 0; i < n; ++i) ts.emplace_back([&acc, i] { std::lock_guard<std::mutex> g(m); acc += std::sqrt(double(i)); });
    for (auto &t : ts) t.join();
    std::ostringstream os; os << acc;
    return std::stod(os.str() + tls);
}
"""


def images_dir() -> Path:
    return cache_dir() / "images"


def check_arch(arch: str) -> str:
    if arch not in ARCHES:
        raise BadInput("farm images", "--arch", arch, f"must be one of {', '.join(ARCHES)}")
    return arch


def sha(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    return h.hexdigest()


# ----- the Debian base (debootstrap + import) ----------------------------------------


def apt_packages() -> list[str]:
    """The apt package list, read from the one install script."""
    out = run(["sh", INSTALL_SCRIPT, "--print", "apt"], error=ImageError, what=f"{INSTALL_SCRIPT.name} --print apt")
    return out.stdout.split()


def base_recipe(arch: str) -> dict[str, Any]:
    return {"suite": SUITE, "variant": "minbase", "arch": DEB_ARCH[check_arch(arch)],
            "include": sorted(apt_packages()), "version": _BASE_RECIPE_VERSION}


def base_key(arch: str) -> str:
    return sha(json.dumps(base_recipe(arch), sort_keys=True))[:16]


def debian_ref(arch: str) -> str:
    """The debootstrapped bookworm as imported, before the sysroot is added."""
    return f"{BASE_REPO}:{SUITE}-{arch}-{base_key(arch)[:12]}"


def base_ref(arch: str) -> str:
    """The local base the builder image is built FROM: bookworm with the bullseye sysroot."""
    return f"{debian_ref(arch)}-{SYSROOT_SUITE}-{sysroot_key(arch)[:12]}"


def base_tarball(arch: str) -> Path:
    return images_dir() / f"base-{SUITE}-{arch}-{base_key(arch)}.tar"


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"farm images: {msg}", flush=True)


# What image set-up shows while it runs (design.md §6.9): a step per stage, counted from its log.
_DEBOOTSTRAP = re.compile(r"^I: (Retrieving|Validating|Extracting|Unpacking|Configuring|Installing) (.+?)[.\s]*$")
_BUILD_STEP = re.compile(r"^(?:STEP (\d+)/(\d+): |#\d+ \[(?:[\w.-]+ )?(\d+)/(\d+)\] )(.*)$")   # podman, buildkit


def debootstrap_progress() -> Callable[[str], None]:
    """A reader of debootstrap's log lines that emits the packages fetched so far and what it is doing."""
    fetched = [0]

    def on_line(line: str) -> None:
        if m := _DEBOOTSTRAP.match(line):
            verb, what = m.groups()
            if verb == "Retrieving" and what not in ("InRelease", "Packages"):
                fetched[0] += 1
            progress.emit(progress.Event("debootstrap", "progress", done=fetched[0], unit="packages fetched",
                                         current=f"{verb} {what}"))
    return on_line


def build_step_reader(step: str) -> Callable[[str], None]:
    """A reader of an engine build log's lines (`STEP 5/9: RUN ...`) that emits the build's step as
    progress of `step`: the builder image's, or a recipe's package layer's (farm/runners/syspkgs.py)."""
    def on_line(line: str) -> None:
        if m := _BUILD_STEP.match(line):
            done, total = int(m.group(1) or m.group(3)), int(m.group(2) or m.group(4))
            progress.emit(progress.Event(step, "progress", done=done - 1, total=total, unit="steps",
                                         current=m.group(5).strip()[:80]))
    return on_line


image_build_progress = build_step_reader("image build")


@contextmanager
def shown(step: str, log: Path, reader: Callable[[str], None] | None = None) -> Iterator[None]:
    """A step of image set-up: its start and end, and its log's lines read for progress meanwhile."""
    with progress.step(step):
        if reader is None or not progress.active():
            yield
            return
        with progress.Tail(log, reader, interval=0.5):
            yield


def _debootstrap(recipe: dict[str, Any], tarball: Path, log: Path, quiet: bool, *, top: str = ".",
                 finish: Callable[[Path], object] | None = None) -> None:
    """Debootstrap `recipe` and pack the root as `tarball`: its members at the top (top "."), or
    inside one folder named `top`; `finish` edits the root first."""
    if os.geteuid() != 0:
        raise ImageError("debootstrap needs root (run `farm images base` as root, or import a base by hand)")
    if not shutil.which("debootstrap"):
        raise ImageError("debootstrap is not installed (run `make setup-engine`)")
    arch = next(a for a, deb in DEB_ARCH.items() if deb == recipe["arch"])
    if arch != host_arch():
        # Debootstrap's second stage runs the target's binaries: needs binfmt + qemu.
        setup_qemu(quiet=quiet)
    work = Path(tempfile.mkdtemp(prefix=f"farm-deboot-{arch}-", dir=images_dir()))
    root = work / ("root" if top == "." else top)
    try:
        suite = recipe["suite"]
        cmd = ["debootstrap", f"--variant={recipe['variant']}", f"--arch={recipe['arch']}",
               "--include=" + ",".join(recipe["include"]), suite, str(root), settings.DEBIAN_MIRROR.value()]
        _say(f"debootstrap {suite} {recipe['arch']} (a few minutes; log {log})", quiet)
        with shown("debootstrap", log, debootstrap_progress()), open(log, "ab") as fh:
            code = call(cmd, fh)
        if code != 0:
            raise ImageError(f"debootstrap failed (exit {code}): {last_line(log, default='')} (log {log})")
        # Trim what a builder never needs; keep the image small and the tarball stable.
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(root / junk, ignore_errors=True)
            (root / junk).mkdir(parents=True, exist_ok=True)
        if finish is not None:
            finish(root)
        tmp = tarball.with_suffix(".tar.part")
        run(["tar", "-C", root if top == "." else work, "--numeric-owner", "-cf", tmp, top], error=ImageError,
            what=f"tar of the {arch} base")
        os.replace(tmp, tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_base(arch: str, engine: Engine | None = None, quiet: bool = False) -> str:
    """The local Debian base image for `arch` (debootstrapped once, imported once); returns its ref."""
    check_arch(arch)
    engine = engine or Engine.detect()
    images_dir().mkdir(parents=True, exist_ok=True)
    ref = base_ref(arch)
    with FileLock(str(images_dir() / f".base-{arch}.lock")):
        if engine.image_id(ref):
            return ref
        debian = debian_ref(arch)
        if not engine.image_id(debian):
            tarball = base_tarball(arch)
            if not tarball.exists():
                _debootstrap(base_recipe(arch), tarball, images_dir() / f"base-{arch}.log", quiet)
            _say(f"importing {tarball.name} as {debian}", quiet)
            with progress.step("base import"):
                engine.import_tarball(tarball, debian, arch, changes=["ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]'])
        _add_sysroot(engine, arch, debian, ref, quiet)
    return ref


# ----- the sysroot: an older glibc and libstdc++ to build against (design.md §8.3) --------

# Debian 11: glibc 2.31, gcc 10 (GLIBCXX_3.4.28), the oldest Debian the mirror still debootstraps
# (buster's packages are gone from it). Only its compiler, C library and C++ library: the image's
# binutils, Pythons and everything else stay bookworm's.
SYSROOT_SUITE = "bullseye"
SYSROOT_PACKAGES = ("libc6-dev", "libstdc++-10-dev", "gcc-10", "g++-10")
SYSROOT_DIR = "/opt/farm-sysroot"
# Bump when the way a sysroot tarball is made changes (the link fixing, the layout).
_SYSROOT_RECIPE_VERSION = 1


def sysroot_recipe(arch: str) -> dict[str, Any]:
    return {"suite": SYSROOT_SUITE, "variant": "minbase", "arch": DEB_ARCH[check_arch(arch)],
            "include": sorted(SYSROOT_PACKAGES), "at": SYSROOT_DIR, "version": _SYSROOT_RECIPE_VERSION}


def sysroot_key(arch: str) -> str:
    return sha(json.dumps(sysroot_recipe(arch), sort_keys=True))[:16]


def sysroot_tarball(arch: str) -> Path:
    return images_dir() / f"sysroot-{SYSROOT_SUITE}-{arch}-{sysroot_key(arch)}.tar"


def relative_links(root: Path) -> int:
    """Make every absolute symlink under `root` relative, so it resolves inside the root wherever the
    root is mounted: ld follows /lib64/ld-linux-x86-64.so.2 and the lib*.so development links
    under --sysroot, and an absolute target there leads into the image's own (bookworm) /lib.
    Returns how many links were rewritten."""
    changed = 0
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            link = Path(folder, name)
            if not link.is_symlink():
                continue
            target = os.readlink(link)
            if os.path.isabs(target):
                link.unlink()
                link.symlink_to(os.path.relpath(root / target.lstrip("/"), link.parent))
                changed += 1
    return changed


def _add_sysroot(engine: Engine, arch: str, debian: str, ref: str, quiet: bool) -> None:
    """`ref`: the imported Debian base with the bullseye sysroot unpacked at SYSROOT_DIR."""
    tarball = sysroot_tarball(arch)
    if not tarball.exists():
        _debootstrap(sysroot_recipe(arch), tarball, images_dir() / f"sysroot-{arch}.log", quiet,
                     top=Path(SYSROOT_DIR).name, finish=relative_links)
    with tempfile.TemporaryDirectory(prefix="farm-sysroot-", dir=images_dir()) as tmp:
        context = Path(tmp)
        os.link(tarball, context / "sysroot.tar")   # same folder: no copy of ~300 MB
        (context / "Dockerfile").write_text(f"FROM {debian}\nADD sysroot.tar {Path(SYSROOT_DIR).parent}/\n")
        _say(f"adding the {SYSROOT_SUITE} sysroot: {ref}", quiet)
        with progress.step("sysroot layer"):
            engine.build(context, ref, labels={"farm.sysroot": sysroot_key(arch)}, arch=arch, network=False,
                         log_path=images_dir() / f"sysroot-layer-{arch}.log")


# ----- the builder image -----------------------------------------------------------


@dataclass
class Image:
    """A built builder image and what it provides (the build record quotes it)."""

    ref: str
    id: str
    arch: str
    base: str
    package_manager: str
    glibc: str
    plat: str  # the lowest manylinux tag this image's toolchain produces
    plat_cap: str  # the highest its glibc allows
    pythons: list[dict[str, Any]] = field(default_factory=list)  # {version, path, mount?}
    cuda_home: str = ""
    cuda: str = ""  # the CUDA_VERSION build argument (dnf images), "" when the toolkit comes from PyPI
    key: str = ""
    # A recipe's package layer over a builder image (farm/runners/syspkgs.py): that image's ref and id,
    # and the packages the layer adds. Empty for the builder image itself.
    layer_of: str = ""
    layer_of_id: str = ""
    system_packages: list[str] = field(default_factory=list)
    # The host compiler a build uses when it is not the image's own gcc: {bin, sysroot, gcc, glibc}
    # (docker/install-deps.sh, farm/runners/hostcompiler.py). Empty on a manylinux image.
    toolchain: dict[str, Any] = field(default_factory=dict)

    @property
    def builder_id(self) -> str:
        """The builder image's id: what the layer's Python, its envs and tools venv come from."""
        return self.layer_of_id or self.id

    def python(self, version: str) -> dict[str, Any] | None:
        """The interpreter for Python `version` ("3.12"), with the host prefix to mount if any."""
        return next((p for p in self.pythons if p["version"] == version), None)

    def python_versions(self) -> list[str]:
        return [p["version"] for p in self.pythons]

    def describe(self) -> dict[str, Any]:
        layer = {"layer_of": self.layer_of, "system_packages": self.system_packages} if self.layer_of else {}
        compiler = {"toolchain": self.toolchain} if self.toolchain else {}
        return {"image_ref": self.ref, "image_id": self.id, "arch": self.arch, "base": self.base,
                "glibc": self.glibc, "plat": self.plat, "pythons": self.python_versions(), **compiler, **layer}


def builder_key(arch: str, base: str, cuda: str = "") -> str:
    """Hash of everything the image and its record come from: base recipe, Dockerfile,
    install script, the toolchain's floor files, and the platform probe (which decides the recorded tag)."""
    base_part = base_key(arch) + sysroot_key(arch) if base.startswith(f"{BASE_REPO}:") else base
    return sha(base_part, DOCKERFILE.read_bytes(), INSTALL_SCRIPT.read_bytes(), FLOOR_SHIM.read_bytes(),
               LIBM_FLOOR.read_bytes(), _PLAT_PROBE_CPP, cuda, arch, str(_RECORD_VERSION))[:16]


def builder_ref(arch: str, key: str) -> str:
    return f"{BUILDER_REPO}:{arch}-{key[:12]}"


def _records_dir() -> Path:
    return images_dir() / "records"


def _record_path(arch: str, key: str) -> Path:
    return _records_dir() / f"{arch}-{key}.json"


def build_args(base: str, cuda: str = "") -> dict[str, str]:
    return {"BASE": base, "CUDA_VERSION": cuda}


def render_production(arch: str, cuda: str = "13.0", engine_name: str = "docker") -> str:
    """What `farm images build --dry-run` shows: the production build command and the dnf plan."""
    check_arch(arch)
    base = PRODUCTION_BASE.format(arch=arch)
    tag = f"farm-builder:manylinux_2_28-{arch}" + (f"-cu{cuda.replace('.', '')}" if cuda else "")
    plat = {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}[arch]
    lines = [f"{engine_name} build --platform {plat} -f {DOCKERFILE.relative_to(PROJECT_ROOT)} "
             f"--build-arg BASE={base} --build-arg CUDA_VERSION={cuda} -t {tag} "
             f"{DOCKER_DIR.relative_to(PROJECT_ROOT)}",
             "# RUN farm-install-deps (package manager: dnf)"]
    plan = run(["sh", INSTALL_SCRIPT, "--dry-run", "dnf"], env={**os.environ, "ARCH": arch, "CUDA_VERSION": cuda},
               error=ImageError, what=f"{INSTALL_SCRIPT.name} --dry-run dnf")
    lines += plan.stdout.rstrip().splitlines()
    lines.append(f"# the image's tag: its AUDITWHEEL_PLAT, manylinux_2_28_{arch}")
    return "\n".join(lines)


def ensure_builder(arch: str | None = None, engine: Engine | None = None, base: str | None = None,
                   cuda: str = "", force: bool = False, quiet: bool = False) -> Image:
    """The builder image for `arch`, built only when its recipe changed (or `force`)."""
    arch = check_arch(arch or host_arch())
    engine = engine or Engine.detect()
    base = base or ensure_base(arch, engine, quiet=quiet)
    key = builder_key(arch, base, cuda)
    ref = builder_ref(arch, key)
    _records_dir().mkdir(parents=True, exist_ok=True)
    with FileLock(str(images_dir() / f".builder-{arch}.lock")):
        image_id = engine.image_id(ref)
        rec = _read_record(_record_path(arch, key))
        if image_id and rec and rec.id == image_id and not force:
            return rec
        if not image_id or force:
            _say(f"building {ref} FROM {base}", quiet)
            # A local base needs neither a registry nor the network (apt has all it needs).
            local = base.startswith("localhost/")
            log = images_dir() / f"build-{arch}-{key}.log"
            log.unlink(missing_ok=True)
            with shown("image build", log, image_build_progress):
                image_id = engine.build(DOCKER_DIR, ref, dockerfile=DOCKERFILE, build_args=build_args(base, cuda),
                                        labels={"farm.key": key, "farm.base": base}, arch=arch,
                                        network=not local, pull=not local, log_path=log)
        with progress.step("image probe"):
            image = _probe(engine, ref, image_id, arch, base, key)
        image.cuda = cuda
        write_atomic(_record_path(arch, key), json.dumps(asdict(image), indent=2) + "\n")
        # The record of the image this one supersedes goes (the image stays: a build may use it).
        for old in list_images(None):
            if old[0].arch == arch and old[0].cuda == cuda and old[0].key != key:
                _record_path(arch, old[0].key).unlink(missing_ok=True)
        return image


def _read_record(path: Path) -> Image | None:
    try:
        return Image(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def load_image(arch: str | None = None, engine: Engine | None = None, cuda: str = "") -> Image | None:
    """The current builder image for `arch` if it is built and recorded, else None (no building)."""
    arch = check_arch(arch or host_arch())
    engine = engine or Engine.detect()
    key = builder_key(arch, base_ref(arch), cuda)
    rec = _read_record(_record_path(arch, key))
    if rec and engine.image_id(rec.ref) == rec.id:
        return rec
    return None


def list_images(engine: Engine | None = None) -> list[tuple[Image, bool]]:
    """Every recorded builder image and whether the engine still has it."""
    out = []
    for path in sorted(_records_dir().glob("*.json")) if _records_dir().is_dir() else []:
        rec = _read_record(path)
        if rec:
            present = engine is not None and engine.image_id(rec.ref) == rec.id
            out.append((rec, present))
    return out


# ----- what is stale: the farm's images and files that nothing current uses -----

@dataclass
class Stale:
    refs: list[str]       # engine refs (builders, their package layers, bases) to remove
    files: list[Path]     # base tarballs and image records under images_dir()


def stale(engine: Engine) -> Stale:
    """The farm's own images that nothing current uses. A builder is current when its record's key is the
    key this checkout computes for it (docker/ and the base as they are now); a package layer when it was
    made over a current builder (its `farm.layer-of` label); a base when it is this checkout's base of an
    arch. Images of other repositories are never looked at."""
    current = [rec for rec, present in list_images(engine)
               if present and rec.key == builder_key(rec.arch, rec.base, rec.cuda)]
    keep = {rec.ref for rec in current} | {base_ref(a) for a in ARCHES} | {debian_ref(a) for a in ARCHES}
    builder_ids = {rec.id for rec in current}
    refs = [r for r in engine.image_refs(BUILDER_REPO) + engine.image_refs(BASE_REPO) if r not in keep]
    refs += [r for r in engine.image_refs(LAYER_REPO)
             if full_id(engine.image_labels(r).get("farm.layer-of", "")) not in builder_ids]
    folder = images_dir()
    tarballs = {base_tarball(a) for a in ARCHES} | {sysroot_tarball(a) for a in ARCHES}
    files = [p for p in sorted(folder.glob(f"base-{SUITE}-*.tar")) + sorted(folder.glob("sysroot-*.tar"))
             if p not in tarballs]
    current_records = {_record_path(rec.arch, rec.key) for rec in current}
    files += [p for p in sorted(_records_dir().glob("*.json")) if p not in current_records] \
        if _records_dir().is_dir() else []
    return Stale(refs, files)


# ----- handing an image to another host (CI: built once per run, loaded by every build job) -----


def archive_path(folder: Path, arch: str) -> Path:
    return Path(folder) / f"farm-builder-{check_arch(arch)}.tar"


def save_builder(arch: str, folder: Path, engine: Engine | None = None) -> Path:
    """The current builder image of `arch` (built when it is not) as one archive in `folder`."""
    engine = engine or Engine.detect()
    image = ensure_builder(arch, engine)
    out = archive_path(folder, arch)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    part.unlink(missing_ok=True)   # the engine refuses to overwrite
    engine.save(image.ref, part)
    os.replace(part, out)
    return out


def adopt_builder(arch: str, *, archive: Path | None = None, registry: str | None = None,
                  engine: Engine | None = None) -> Image:
    """Make the builder image another host made this host's: load `archive`, or pull
    `<registry>:<arch>-<key>` (the local tag's name part), then probe and record it here, because the
    Pythons it can mount are this host's. The image must carry the key this checkout computes, so a
    build keyed here is the build that image makes."""
    check_arch(arch)
    engine = engine or Engine.detect()
    base = base_ref(arch)
    ref = builder_ref(arch, builder_key(arch, base))
    if not engine.image_id(ref):
        if archive is not None:
            engine.load(archive)
        elif registry:
            remote = f"{registry}:{ref.split(':', 1)[1]}"
            engine.pull(remote)
            engine.tag(remote, ref)
    if not engine.image_id(ref):
        where = archive or registry or "the engine"
        raise ImageError(f"{where} holds no {ref}: it was built from another checkout of docker/ "
                         "(rebuild it from this one)")
    return ensure_builder(arch, engine, base=base)


# ----- what an image provides ------------------------------------------------------


def _glibc_tag(glibc: str, arch: str) -> str:
    major, minor = glibc.split(".")[:2]
    return f"manylinux_{major}_{minor}_{arch}"




def _probe(engine: Engine, ref: str, image_id: str, arch: str, base: str, key: str) -> Image:
    """Read the facts file, measure the lowest platform tag, and check host Pythons in the image."""
    with tempfile.TemporaryDirectory(prefix="farm-probe-", dir=images_dir()) as tmp:
        t = Path(tmp)
        (t / "probe.cpp").write_text(_PLAT_PROBE_CPP)
        facts = json.loads(engine.output(ref, ["cat", IMAGE_FACTS_PATH], network=False, arch=arch))
        # The compiler a build uses (farm.runners.hostcompiler): the image's toolchain when it has one.
        cxx = compiler_env(facts.get("toolchain")).get("CXX", "g++")
        engine.output(ref, [cxx, "-O2", "-shared", "-fPIC", "-pthread", "-o", "/probe/_probe.so", "/probe/probe.cpp"],
                      mounts=[Mount(t, "/probe")], network=False, arch=arch)
        cap = _glibc_tag(facts["glibc"], arch)
        plat = facts.get("declared_plat") or _lowest_plat(t / "_probe.so", arch, t)
        if plat_glibc(plat) > plat_glibc(cap):  # never claim more than the glibc inside can give
            plat = cap
    pythons = list(facts["pythons"])
    if arch == host_arch():
        pythons += _host_pythons_usable(engine, ref, {p["version"] for p in pythons})
    pythons.sort(key=lambda p: tuple(int(x) for x in p["version"].split(".")))
    return Image(ref=ref, id=image_id, arch=arch, base=base, package_manager=facts["package_manager"],
                 glibc=facts["glibc"], plat=plat, plat_cap=cap, pythons=pythons,
                 cuda_home=facts.get("cuda_home", ""), key=key, toolchain=facts.get("toolchain") or {})


def _lowest_plat(so: Path, arch: str, tmp: Path) -> str:
    """`auditwheel show` on a one-file wheel holding the probe: the lowest tag it allows."""
    whl = tmp / f"farmprobe-0-py3-none-linux_{arch}.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.write(so, "farmprobe/_probe.so")
        z.writestr("farmprobe-0.dist-info/METADATA", "Metadata-Version: 2.1\nName: farmprobe\nVersion: 0\n")
        z.writestr("farmprobe-0.dist-info/WHEEL",
                   f"Wheel-Version: 1.0\nGenerator: farm\nRoot-Is-Purelib: false\nTag: py3-none-linux_{arch}\n")
        # auditwheel walks the files RECORD names (hashes are not checked by `show`).
        z.writestr("farmprobe-0.dist-info/RECORD", "farmprobe/_probe.so,,\nfarmprobe-0.dist-info/METADATA,,\n"
                   "farmprobe-0.dist-info/WHEEL,,\nfarmprobe-0.dist-info/RECORD,,\n")
    exe = shutil.which("auditwheel") or str(Path(sys.executable).with_name("auditwheel"))
    p = run([exe, "show", whl])
    m = re.search(r'platform tag:\s*"?(manylinux_\d+_\d+_\w+)', p.stdout.replace("\n", " "))
    if p.returncode != 0 or not m:
        raise ImageError(f"auditwheel show on the platform probe failed: {(p.stderr or p.stdout).strip()[-300:]}")
    return m.group(1)


def pyenv_prefixes() -> list[Path]:
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    try:
        found = [p for p in root.iterdir() if re.fullmatch(r"3\.\d+\.\d+", p.name) and (p / "bin/python3").exists()]
    except OSError:  # no pyenv, or not readable by this user
        return []
    return sorted(found, key=lambda p: tuple(int(x) for x in p.name.split(".")))


def _host_pythons_usable(engine: Engine, ref: str, have: set[str]) -> list[dict[str, Any]]:
    """Host pyenv Pythons that run inside the image when mounted read-only at the same path.

    A Debian base has its own Python only; the host's pyenv prefixes (same glibc
    family) provide the others. Each is checked by importing what pip and venv need.
    """
    cands: dict[str, Path] = {}
    for prefix in pyenv_prefixes():  # sorted: the newest patch of each minor wins
        minor = ".".join(prefix.name.split(".")[:2])
        if minor not in have:
            cands[minor] = prefix
    if not cands:
        return []
    checks = " ; ".join(
        f"{p}/bin/python3 -c 'import ssl, ctypes, zlib, bz2, lzma, venv, ensurepip' >/dev/null 2>&1 && echo ok {v}"
        for v, p in cands.items())
    mounts = [Mount(p, str(p), read_only=True) for p in cands.values()]
    try:
        out = engine.output(ref, ["sh", "-c", checks + " ; true"], mounts=mounts, network=False)
    except EngineError:
        return []
    ok = set(re.findall(r"^ok (\S+)$", out, re.M))
    return [{"version": v, "path": f"{p}/bin/python3", "mount": str(p)} for v, p in cands.items() if v in ok]


def check_plat(image: Image, plat: str) -> str:
    """The platform tag to repair for on `image`: `plat` normalised, or one-line BadInput.

    Refused: a tag lower than the image's (its compiler links newer symbols, the wheel
    would lie), higher than its glibc, or for another architecture.
    """
    p = plat.strip()
    try:
        want = plat_glibc(p)
    except ValueError:
        raise BadInput("--plat", None, plat, "not a manylinux tag (manylinux_2_X[_arch])") from None
    if not p.endswith(image.arch):
        if re.search(r"_(x86_64|aarch64|i686|ppc64le|s390x|armv7l)$", p):
            raise BadInput("--plat", None, plat, f"image {image.ref} builds {image.arch}")
        p = f"{p}_{image.arch}"
    if want < plat_glibc(image.plat):
        raise BadInput("--plat", None, plat, f"image {image.ref} produces {image.plat} at best: what its "
                       f"compiler links needs that glibc (the image's own is glibc {image.glibc})")
    if want > plat_glibc(image.plat_cap):
        raise BadInput("--plat", None, plat, f"image {image.ref} has glibc {image.glibc}; "
                       f"{image.plat_cap} is the highest it can claim")
    return p


# ----- QEMU for aarch64 on x86 ------------------------------------------------------

BINFMT = Path("/proc/sys/fs/binfmt_misc")
QEMU_BINFMT_CONF = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")


def setup_qemu(quiet: bool = False) -> str:
    """Mount binfmt_misc and register qemu-aarch64 (Debian's qemu-user-static), idempotently.

    Registered with the F (fix-binary) flag, as Debian's file says, so the interpreter
    works inside containers and chroots that do not contain it.
    """
    if host_arch() == "aarch64":
        return "native aarch64 host: no emulation needed"
    entry = BINFMT / "qemu-aarch64"
    if entry.exists() and entry.read_text().startswith("enabled"):
        return "qemu-aarch64 already registered"
    if os.geteuid() != 0:
        raise ImageError("cannot register qemu-aarch64: not root (binfmt_misc needs root)")
    if not QEMU_BINFMT_CONF.exists():
        raise ImageError(f"cannot register qemu-aarch64: {QEMU_BINFMT_CONF} missing (run `make setup-engine`)")
    if not (BINFMT / "register").exists():
        p = run(["mount", "-t", "binfmt_misc", "binfmt_misc", BINFMT])
        if p.returncode != 0:
            raise ImageError(f"cannot mount binfmt_misc at {BINFMT}: {p.stderr.strip() or p.returncode}")
    if entry.exists():  # registered but disabled
        entry.write_text("1")
    else:
        line = QEMU_BINFMT_CONF.read_text().strip().splitlines()[-1]
        try:
            (BINFMT / "register").write_text(line)
        except OSError as exc:
            raise ImageError(f"cannot register qemu-aarch64 in {BINFMT}: {exc.strerror}") from None
    _say("registered qemu-aarch64 in binfmt_misc", quiet)
    return "qemu-aarch64 registered"
