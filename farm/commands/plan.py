"""`farm plan`: the cells, filtered, sharded, as a table, JSON or a GitHub Actions matrix."""

from __future__ import annotations

import sys
from collections import Counter

from farm.commands.common import (
    add_path,
    add_recipes,
    check_selection,
    empty_selection,
    platform_value,
    print_json,
)
from farm.errors import BadInput
from farm.platforms import PLATFORMS
from farm.recipes.estimate import DEFAULT_RUNNERS, check_runners
from farm.recipes.plan import Filters, full_plan, in_shard, parse_shard


def add_filters(parser) -> None:
    parser.add_argument("--package", action="append", default=[], help="repeatable")
    parser.add_argument("--cuda", action="append", default=[])
    parser.add_argument("--torch", action="append", default=[])
    parser.add_argument("--python", action="append", default=[])
    parser.add_argument("--platform", action="append", default=[], type=platform_value,
                        metavar="{" + ",".join(PLATFORMS) + "}")
    parser.add_argument("--shard", help="i/n: only this host's share (a hash of the cell id)")
    add_recipes(parser)   # every verb that selects cells reads the recipes


def filters_of(args) -> Filters:
    return Filters(tuple(args.package), tuple(args.cuda), tuple(args.torch), tuple(args.python), tuple(args.platform))


def register(sub) -> None:
    parser = sub.add_parser("plan", help="list the cells to build")
    add_filters(parser)
    parser.add_argument("--missing", action="store_true", help="only cells whose build key is not in the wheelhouse")
    parser.add_argument("--format", choices=("table", "json", "github"), default="table")
    parser.add_argument("--summary", action="store_true", help="per-package counts per platform (with --estimate: "
                        "CPU-hours per lane)")
    parser.add_argument("--estimate", action="store_true", help="cells, rows, CPU-hours and wall hours per recipe "
                        "and lane, from the build records (design.md §5.5)")
    parser.add_argument("--runners", type=check_runners,
                        help=f"--estimate: runners per lane for the wall hours (default {DEFAULT_RUNNERS})")
    add_path(parser, "--records", kind="input_dir", help="--estimate: build records folder (default recipes/records)")
    parser.set_defaults(func=plan_command)


def planned(args):
    """The plan, once every selected value is known (a typo is refused before anything is derived)."""
    from farm.matrix.grid import load_grid
    from farm.policy import load_defaults
    from farm.recipes.reader import load_recipes

    defaults = load_defaults()
    recipes = load_recipes(defaults=defaults)
    grid = load_grid(defaults.folder)
    check_selection(args, defaults, recipes, grid)
    return full_plan(defaults, recipes, grid)


def selected(args):
    """(plan, the cells the filters, --shard and --missing select, the shard): for plan and ci."""
    shard = parse_shard(args.shard) if args.shard else None
    plan = planned(args)
    cells = in_shard(plan.select(filters_of(args)), shard)
    if getattr(args, "missing", False):
        from farm.run.selection import missing_cells

        cells = missing_cells(plan, cells, getattr(args, "wheelhouse", None))
    return plan, cells, shard


def plan_command(args) -> int:
    for option, value in (("--runners", args.runners), ("--records", args.records)):
        if value is not None and not args.estimate:
            raise BadInput("command line", option, str(value), "prices a plan: only with --estimate")
    if args.estimate and args.format == "github":
        raise BadInput("command line", "--format", "github", "an estimate is a table or JSON (--format table|json)")
    plan, cells, shard = selected(args)
    if not cells:   # known values that select nothing: said once, on stderr when stdout is data
        built = args.missing and in_shard(plan.select(filters_of(args)), shard)
        print("0 cells: every selected cell is in the wheelhouse with its build key" if built
              else empty_selection(args), file=sys.stderr if args.format != "table" else sys.stdout)
    if args.estimate:
        return estimate_command(args, plan, cells)
    if args.format == "json":
        why = cannot_build_here(plan, cells)
        print_json([{"id": c.id, "package": c.recipe_name, "cuda": c.cuda, "torch": c.torch,
                     "torch_pin": c.torch_pin, "python": c.python, "platform": c.platform,
                     "arch_list": c.arch.arch_list.torch(), "tags": list(c.tags),
                     "cannot_build_here": why.get(c.id)} for c in cells])
        return 0
    if args.format == "github":
        from farm.run.ci import github_matrix

        print_json(github_matrix(cells))
        return 0
    if args.summary:
        counts = Counter((c.recipe_name, c.platform) for c in cells)
        names = sorted({c.recipe_name for c in cells})
        print(f"{'package':<28} {'linux':>7} {'windows':>8} {'aarch64':>8} {'total':>7}")
        for name in names:
            row = [counts[(name, p)] for p in PLATFORMS]
            print(f"{name:<28} {row[0]:>7} {row[1]:>8} {row[2]:>8} {sum(row):>7}")
        totals = [sum(counts[(n, p)] for n in names) for p in PLATFORMS]
        print(f"{'total':<28} {totals[0]:>7} {totals[1]:>8} {totals[2]:>8} {sum(totals):>7}")
        return 0
    why = cannot_build_here(plan, cells)
    for c in cells:
        print(f"{c.id:<60} {c.torch_pin:<8} {c.arch.arch_list}" + (f"  cannot build here: {why[c.id]}"
                                                                   if c.id in why else ""))
    if cells:
        print(f"{len(cells)} cells" + (f", {len(why)} of them cannot build here" if why else ""))
    return 0


def cannot_build_here(plan, cells) -> dict[str, str]:
    """cell id -> why this host cannot build it, from the runner's and the image's facts alone (what
    `farm build` refuses before any set-up: a Windows cell here, needs_patch, a Python the lane lacks)."""
    from farm.build.cell import refusal

    found = {}
    for c in cells:
        why = refusal(c, plan.recipes[c.recipe_name], None)
        if why:
            found[c.id] = why[0]
    return found


def estimate_command(args, plan, cells) -> int:
    from farm.recipes.estimate import as_json, estimate, render_summary, render_table

    est = estimate(cells, plan.recipes, plan.defaults, args.records, args.runners or DEFAULT_RUNNERS)
    if args.format == "json":
        print_json(as_json(est))
    elif cells:
        print(render_summary(est) if args.summary else render_table(est), end="")
    return 0
