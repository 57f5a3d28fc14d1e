"""`farm coverage` (devices x cells) and `farm find` (channels serving one GPU)."""

from __future__ import annotations

from types import SimpleNamespace

from farm.arch.coverage import DEAD, JIT, NATIVE, UNKNOWN, device_for_sm
from farm.arch.find import coverage_rows, find
from farm.commands.common import (
    add_platform,
    add_recipes,
    check_selection,
    check_version,
    did_you_mean,
    driver_value,
    empty_selection,
    print_json,
    unknown,
)
from farm.errors import BadInput
from farm.policy import load_defaults
from farm.versions import vtuple

MARK = {NATIVE: "N", JIT: "J", UNKNOWN: "?", DEAD: "x"}


def register(sub) -> None:
    cov = sub.add_parser("coverage", help="which GPUs each channel serves: native / JIT-only / dead / unknown")
    cov.add_argument("--package")
    cov.add_argument("--cuda")
    cov.add_argument("--torch")
    add_platform(cov)
    cov.add_argument("--driver", type=driver_value, help="NVIDIA driver branch, e.g. 575")
    cov.add_argument("--format", choices=("text", "json"), default="text")
    add_recipes(cov)
    cov.set_defaults(func=coverage_command)

    fnd = sub.add_parser("find", help="which channels serve a GPU, best first, with the exact install command")
    which = fnd.add_mutually_exclusive_group(required=True)
    which.add_argument("--gpu", help='a product name, e.g. "RTX 5090"')
    which.add_argument("--sm", help="a compute capability, e.g. 12.0")
    fnd.add_argument("--driver", type=driver_value)
    add_platform(fnd, required=True)
    fnd.add_argument("--python", required=True)
    fnd.add_argument("--torch", help="the torch minor already installed, e.g. 2.8")
    fnd.add_argument("--package")
    fnd.add_argument("--format", choices=("text", "json"), default="text")
    add_recipes(fnd)
    fnd.set_defaults(func=find_command)


def _grid():
    from farm.matrix.grid import load_grid

    return load_grid()


def coverage_command(args) -> int:
    defaults = load_defaults()
    recipe = _recipe(args, defaults)
    rows = list(coverage_rows(defaults, _grid(), recipe=recipe, cuda=args.cuda, torch=args.torch,
                              platform=args.platform, driver=args.driver))
    if not rows:   # known values, no channel: an empty answer, not a mistake
        print(empty_selection(args, "channels"))
        return 0
    if args.format == "json":
        print_json([{"cuda": c.cuda, "torch": c.torch, "platform": c.platform,
                     "devices": {cc: {"status": v.status, "reason": v.reason} for cc, v in vs.items()}}
                    for c, vs in rows])
        return 0
    devices = sorted({cc for _, vs in rows for cc in vs}, key=vtuple)
    width = max(len(f"cu{c.cuda} torch{c.torch} {c.platform}") for c, _ in rows)
    print(f"{'channel':<{width}}  " + " ".join(f"{cc:>4}" for cc in devices))
    flagged = []
    for channel, verdicts in rows:
        name = f"cu{channel.cuda.replace('.', '')} torch{channel.torch} {channel.platform}"
        marks = " ".join(f"{MARK[verdicts[cc].status] if cc in verdicts else '':>4}" for cc in devices)
        print(f"{name:<{width}}  {marks}")
        for cc, v in verdicts.items():
            device = defaults.gpus.by_cc(vtuple(cc)[:2])
            if v.status == DEAD and device and device.current:
                flagged.append(f"{name}: {device.name} ({cc}), a current device, is dead: {v.reason}")
    print("N native, J JIT-only, ? unknown (not in the PAM), x dead; blank: the device does not live on that platform")
    for cc in devices:
        device = defaults.gpus.by_cc(vtuple(cc)[:2])
        assert device is not None, cc    # coverage rows only name devices of the table
        print(f"  {cc:>4} {', '.join(device.products)}{' (Tegra)' if device.tegra else ''}")
    if flagged:
        print(f"{len(flagged)} current device(s) left dead:")
        for line in flagged:
            print(f"  ! {line}")
    return 0


def _recipe(args, defaults, selection=None):
    """The --package recipe (or None), once every selected value (of `selection`, default `args`) is known."""
    from farm.recipes.reader import load_recipes

    recipes = load_recipes(defaults=defaults)
    check_selection(selection or args, defaults, recipes)
    return recipes[args.package] if args.package else None


def _device(args, defaults):
    """The device of --gpu or --sm; only devices of defaults/gpus.yml (Tegra parts by compute capability
    too): an answer for a device that does not exist would be invented."""
    gpus = defaults.gpus
    if args.gpu:
        device = gpus.by_name(args.gpu)
        if device is None:
            products = [p for d in gpus.devices for p in d.products]
            raise BadInput("command line", "--gpu", args.gpu, "unknown GPU (see defaults/gpus.yml, or use --sm)"
                           + did_you_mean(args.gpu, products))
        return device
    ccs = {d.cc for d in gpus.devices} | {d.alias for d in gpus.devices if d.alias} | set(gpus.tegra_ccs)
    try:
        cc = vtuple(args.sm)
    except ValueError:
        cc = ()
    if cc not in ccs:
        known = [f"{major}.{minor}" for major, minor in sorted(ccs)]
        raise unknown("--sm", args.sm, "compute capability in defaults/gpus.yml", known)
    return device_for_sm(cc, defaults)


def find_command(args) -> int:
    defaults = load_defaults()
    device = _device(args, defaults)
    # --torch is what the user has installed, which may be newer than any channel: find falls back and
    # says so (a well-formed version is enough); Python and package select from the farm's own tables.
    check_version(args.torch, "--torch")
    recipe = _recipe(args, defaults, SimpleNamespace(package=args.package, python=args.python))
    answer = find(device, args.platform, args.python, defaults, _grid(), driver=args.driver, torch=args.torch,
                  recipe=recipe)
    if args.format == "json":
        print_json({"device": device.name, "cc": device.cc_text, "platform": args.platform, "python": args.python,
                    "notes": list(answer.notes), "why_none": answer.why_none,
                    "offers": [{"cuda": o.channel.cuda, "torch": o.channel.torch, "status": o.verdict.status,
                                "reason": o.verdict.reason, "command": o.command, "uv_command": o.uv_command}
                               for o in answer.offers]})
        return 0 if answer.offers else 1
    print(f"{device.name} (sm {device.cc_text}{', Tegra' if device.tegra else ''}) on {args.platform}, "
          f"Python {args.python}" + (f", driver {args.driver}" if args.driver else ""))
    for note in answer.notes:
        print(f"note: {note}")
    if not answer.offers:
        print(answer.why_none)
        return 1
    for i, offer in enumerate(answer.offers):
        c = offer.channel
        print(f"{i + 1:>2}. cu{c.cuda.replace('.', '')}/torch{c.torch}  {offer.verdict.status}: {offer.verdict.reason}")
        print(f"      {offer.command}")
        print(f"      {offer.uv_command}")
    return 0
