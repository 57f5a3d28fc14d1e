"""`farm arch explain`: a cell's arch list, the rule that produced it, and what the build exports."""

from __future__ import annotations

from farm.arch.resolve import NO_OVERRIDES, resolve
from farm.archlist import ArchList
from farm.commands.common import Known, add_platform, add_recipes, load_recipe_arch, print_json
from farm.errors import NoSuchCell
from farm.platforms import lane
from farm.policy import clamp, load_defaults
from farm.versions import minor_of, vtuple


def register(sub) -> None:
    parser = sub.add_parser("arch", help="arch lists: explain how a cell gets its list")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    explain = verbs.add_parser("explain", help="print a cell's arch list, its provenance and the exported variables")
    explain.add_argument("--cuda", required=True)
    explain.add_argument("--torch", required=True, help="torch minor, e.g. 2.9")
    add_platform(explain, default="linux")
    which = explain.add_mutually_exclusive_group()
    which.add_argument("--package", help="resolve with this recipe's overrides")
    which.add_argument("--arch-list", help="explain an explicit list instead of the policy's")
    explain.add_argument("--format", choices=("text", "json"), default="text")
    add_recipes(explain)
    explain.set_defaults(func=explain_command)


def explain(cuda: str, torch: str, platform: str, package: str | None = None, arch_list: str | None = None):
    from farm.matrix.grid import load_grid

    defaults = load_defaults()
    grid = load_grid(defaults.folder)
    recipe = load_recipe_arch(package) if package else None
    Known.of(defaults, {recipe.name: recipe} if recipe else None, grid).check(cuda=(cuda,), torch=(torch,))
    own = recipe is not None and any((c.cuda, minor_of(c.torch)) == (cuda, torch) for c in recipe.combinations)
    if grid.row(cuda, torch) is None and not own:   # both values exist, but not together
        lines = sorted({r.cuda for r in grid.rows if r.torch == torch}, key=vtuple)
        raise NoSuchCell(f"no such cell: the grid has no CUDA {cuda} build of torch {torch}"
                         + (f" (torch {torch} is built for CUDA {', '.join(lines)})" if lines else ""))
    if arch_list is not None:
        explicit = ArchList.parse(arch_list, "command line", "--arch-list")
        clamp(explicit, cuda, defaults.toolkits, "command line", "--arch-list")
        # An explicit list still has no ARM cell on a line without an ARM row.
        if lane(platform) == "aarch64":
            resolve(cuda, torch, platform, defaults)
        from farm.arch.resolve import Resolution

        return Resolution(explicit.normalised(), "--arch-list", lane(platform), cuda, torch)
    if recipe is not None:
        return resolve(cuda, torch, platform, defaults, recipe.arch, where=str(recipe.path))
    return resolve(cuda, torch, platform, defaults, NO_OVERRIDES)


def explain_command(args) -> int:
    res = explain(args.cuda, args.torch, args.platform, args.package, args.arch_list)
    exports = res.exports()
    if args.format == "json":
        print_json({"cuda": res.cuda, "torch": res.torch, "platform": args.platform, "lane": res.lane,
                    "package": args.package, "arch_list": res.arch_list.torch(), "provenance": res.provenance,
                    "exports": exports})
        return 0
    subject = f"package {args.package}" if args.package else ("explicit list" if args.arch_list else "policy default")
    print(f"cell:        cu{res.cuda.replace('.', '')} torch{res.torch} {args.platform} ({res.lane} lane), {subject}")
    print(f"arch list:   {res.arch_list}")
    print(f"provenance:  {res.provenance}")
    for name, value in exports.items():
        print(f'export {name}="{value}"')
    return 0
