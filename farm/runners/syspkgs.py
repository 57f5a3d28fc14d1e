"""A recipe's `system_packages` (design.md §8.5): the distribution packages its build needs
beyond the builder image (torchsparse: sparsehash's headers).

The container runner runs such a cell in a layer image `FROM` the builder image that installs
exactly those packages with the image's own package manager, built once and keyed by the
builder image's id, the manager and the sorted package list. The host runner installs nothing
(no sudo from the farm): it checks the packages are there and refuses the cell, before any
work, when they are not.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from filelock import FileLock

from farm.errors import BadInput
from farm.process import run
from farm.runners import images
from farm.runners.engine import Engine

KEY = "system_packages"
LAYER_REPO = images.LAYER_REPO
# How each manager installs a list and leaves no package lists behind. Debian's base ships without
# /var/lib/apt/lists (design.md §8.3), which apt-get update needs.
_INSTALL = {
    "apt": ("mkdir -p /var/lib/apt/lists/partial && apt-get update -qq && "
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {pkgs} && "
            "apt-get clean && rm -rf /var/lib/apt/lists/*"),
    "dnf": "dnf install -y {pkgs} && dnf clean all",
}
# Which query tells, on the host, that a package of each manager is installed.
_HOST_QUERY = {"apt": "dpkg-query", "dnf": "rpm"}


def wanted(packages: Mapping[str, tuple[str, ...]], manager: str, where: str) -> tuple[str, ...]:
    """The packages `manager` must provide, sorted; () when the recipe names none at all. A recipe naming
    packages for other managers only is refused: its build would fail much later, in the compile."""
    if not packages:
        return ()
    if manager not in packages:
        raise BadInput(where, KEY, {k: list(v) for k, v in packages.items()},
                       f"names no {manager} packages, and this build installs with {manager}")
    return tuple(sorted(set(packages[manager])))


# ----- the container runner: a layer over the builder image ----------------------------------------


def layer_key(builder_id: str, manager: str, pkgs: tuple[str, ...]) -> str:
    """What the layer is made from: the builder image, the install command and the package set."""
    return images.sha(builder_id, manager, _INSTALL[manager], *sorted(set(pkgs)))[:16]


def layer_ref(arch: str, key: str) -> str:
    return f"{LAYER_REPO}:{arch}-{key[:12]}"


def dockerfile(builder_ref: str, manager: str, pkgs: tuple[str, ...]) -> str:
    return f"FROM {builder_ref}\nRUN {_INSTALL[manager].format(pkgs=' '.join(shlex.quote(p) for p in pkgs))}\n"


def ensure_layer(engine: Engine, image: images.Image, pkgs: tuple[str, ...]) -> images.Image:
    """`image` with `pkgs` installed: the layer image, built unless the engine has it already. The
    build reaches the distribution's mirror; the steps that later run in it stay offline."""
    manager = image.package_manager
    key = layer_key(image.id, manager, pkgs)
    ref = layer_ref(image.arch, key)
    folder = images.images_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / f".layer-{key}.lock")):
        layer_id = engine.image_id(ref)
        if not layer_id:
            log = folder / f"layer-{image.arch}-{key}.log"
            log.unlink(missing_ok=True)
            context = Path(tempfile.mkdtemp(prefix="farm-layer-", dir=folder))
            try:
                (context / "Dockerfile").write_text(dockerfile(image.ref, manager, pkgs))
                with images.shown("image packages", log, images.build_step_reader("image packages")):
                    layer_id = engine.build(context, ref, dockerfile=context / "Dockerfile", arch=image.arch,
                                            labels={"farm.layer-of": image.id, "farm.packages": json.dumps(pkgs)},
                                            network=True, pull=False, log_path=log)
            finally:
                shutil.rmtree(context, ignore_errors=True)
    return replace(image, ref=ref, id=layer_id, layer_of=image.ref, layer_of_id=image.id,
                   system_packages=list(pkgs))


# ----- the host runner: present, or refused ------------------------------------------------------


def host_manager() -> str | None:
    """The package manager whose database this host keeps (dpkg first: a Debian host may carry rpm)."""
    return next((m for m, query in _HOST_QUERY.items() if shutil.which(query)), None)


def missing_on_host(manager: str, pkgs: tuple[str, ...]) -> list[str]:
    """Those of `pkgs` this host has not installed, by its package database."""
    if manager == "apt":
        def present(p: str) -> bool:
            res = run(["dpkg-query", "-W", "-f=${Status}", p])
            return res.returncode == 0 and res.stdout.strip().endswith(" installed")
    else:
        def present(p: str) -> bool:
            return run(["rpm", "-q", "--quiet", p]).returncode == 0
    return [p for p in pkgs if not present(p)]


def check_host(packages: Mapping[str, tuple[str, ...]], where: str) -> None:
    """Refuse, in one line, a build whose system packages this host lacks (or cannot tell)."""
    if not packages:
        return
    manager = host_manager()
    if manager is None:
        raise BadInput(where, KEY, {k: list(v) for k, v in packages.items()},
                       "this host has neither dpkg nor rpm to check them; use --runner container")
    missing = missing_on_host(manager, wanted(packages, manager, where))
    if missing:
        raise BadInput(where, KEY, missing, f"not installed on this host: install them ({manager}) "
                                            "or build with --runner container, which installs them in its image")
