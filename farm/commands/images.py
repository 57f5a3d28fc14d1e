"""`farm images base|build|show|prune|setup-qemu`: the builder images (design.md §8.2, §8.3)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from farm.platforms import host_arch
from farm.runners import images
from farm.runners.engine import Engine

if TYPE_CHECKING:
    from farm.build.display import StepDisplay


def register(sub) -> None:
    parser = sub.add_parser("images", help="builder images: debootstrapped base, build, show, qemu for aarch64")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    def arch_arg(p):
        p.add_argument("--arch", choices=images.ARCHES, default=None, help="default: this host's")

    p = verbs.add_parser("base", help="debootstrap Debian bookworm (minbase + build packages) and import it")
    arch_arg(p)
    p.set_defaults(func=base_command)

    p = verbs.add_parser("build", help="build docker/Dockerfile FROM the base; cached by its recipe")
    arch_arg(p)
    p.add_argument("--dry-run", action="store_true",
                   help="print the production build (manylinux_2_28 + dnf + NVIDIA's repo) instead")
    p.add_argument("--cuda", default="", help="CUDA X.Y installed from NVIDIA's repo (dnf images; dry-run default 13.0)")
    p.add_argument("--base", default=None, help="BASE image (default: the local Debian base)")
    p.add_argument("--force", action="store_true", help="rebuild even if the cached image matches")
    p.set_defaults(func=build_command)

    p = verbs.add_parser("show", help="list built images with their glibc, platform tag and Pythons")
    p.set_defaults(func=show_command)

    p = verbs.add_parser("prune", help="remove the farm's images and files no current builder or package layer uses")
    p.add_argument("--dry-run", action="store_true", help="list what would go")
    p.set_defaults(func=prune_command)

    p = verbs.add_parser("setup-qemu", help="mount binfmt_misc and register qemu-aarch64 (idempotent)")
    p.set_defaults(func=setup_qemu_command)


def base_command(args) -> int:
    with _shown():
        ref = images.ensure_base(args.arch or host_arch())
    print(ref)
    return 0


@contextmanager
def _shown() -> Iterator[StepDisplay]:
    """Image set-up's steps (debootstrap, import, build, probe) on the build display (design.md §6.9)."""
    from farm import progress
    from farm.build.display import StepDisplay

    display = StepDisplay(prefix="[farm images]")
    try:
        with progress.using(display):
            yield display
    finally:
        display.close()


def build_command(args) -> int:
    if args.cuda:   # a typo would name an image tag and a dnf package that do not exist
        from farm.commands.common import check_cuda
        from farm.policy import load_defaults

        check_cuda(args.cuda, load_defaults())
    arch = args.arch or host_arch()
    if args.dry_run:
        print(images.render_production(arch, cuda=args.cuda or "13.0"))
        return 0
    with _shown():
        image = images.ensure_builder(arch, base=args.base, cuda=args.cuda, force=args.force)
    print(f"{image.ref} {image.id[:19]} {image.plat} pythons {' '.join(image.python_versions())}")
    return 0


def show_command(args) -> int:
    engine = Engine.available()
    rows = images.list_images(engine)
    if not rows:
        print("no builder images recorded (run `farm images build`)")
        return 0
    for image, present in rows:
        state = "" if present else "  (gone from the engine)"
        print(f"{image.ref}  {image.arch}  glibc {image.glibc}  tag {image.plat} (max {image.plat_cap})  "
              f"{image.package_manager}  pythons {' '.join(image.python_versions())}{state}")
    return 0


def setup_qemu_command(args) -> int:
    print(images.setup_qemu(quiet=True))
    return 0


def prune_command(args) -> int:
    """Each superseded builder image (docker/ or the base changed), package layer over one, base image and
    base tarball is ~0.6 GB that no build will use again. A ref a container still holds (another
    checkout's build running on it) stays, said, and is no failure, as with `docker image prune`; any
    other refusal of the engine is (exit 1)."""
    engine = Engine.detect()
    found = images.stale(engine)
    refused = 0
    for ref in found.refs:
        why = None if args.dry_run else engine.remove_image(ref)
        if why and "in use" not in why:
            refused += 1
        print(f"{'would remove' if args.dry_run else 'kept' if why else 'removed'} {ref}" + (f": {why}" if why else ""))
    for path in found.files:
        if not args.dry_run:
            path.unlink(missing_ok=True)
        print(f"{'would remove' if args.dry_run else 'removed'} {path}")
    if not found.refs and not found.files:
        print("nothing stale")
    return 1 if refused else 0
