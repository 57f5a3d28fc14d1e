"""`farm recipes check` (validate every recipe, print the fallback hazards of design.md §3.5), `farm recipes list`,
`farm recipes new` (a first recipe from a pinned sdist or git tag, §4.6) and `farm recipes scan` (upstream hazards, §4.7)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TypedDict

from farm import settings
from farm.commands.common import add_path, add_recipes, arch_token_arg, minutes_arg, print_json
from farm.policy import load_defaults
from farm.recipes.checks import check_recipes
from farm.recipes.reader import load_recipes


def register(sub) -> None:
    parser = sub.add_parser("recipes", help="recipes: validate them, show fallback hazards, list them")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    check = verbs.add_parser("check", help="validate every recipe (exit 2 on an invalid one) and print fallback hazards")
    add_path(check, "--recipes", "--dir", kind="input_dir", metavar="DIR",   # --dir: its older name
             help="the recipes folder (default: $FARM_RECIPES, else the project's recipes/)")
    check.set_defaults(func=check_command)
    listing = verbs.add_parser("list", help="one line per recipe: torch axis, wheel ABI, platforms, source")
    listing.add_argument("--format", choices=("table", "json"), default="table")
    add_recipes(listing)
    listing.set_defaults(func=list_command)
    new = verbs.add_parser("new", help="write recipes/NAME.yml from a pinned sdist or git tag, check it, scan the "
                                       "source for hazards and print the cell to build first")
    new.add_argument("name", metavar="NAME", help="the recipe's name: the wheel's name, lowercase, with underscores")
    new.add_argument("--sdist", metavar="PROJECT==VERSION", help="the release's sdist on PyPI ($FARM_PYPI_URL)")
    new.add_argument("--git", metavar="URL", help="a git repository (git's url.<mirror>.insteadOf applies)")
    new.add_argument("--ref", metavar="TAG", help="with --git: a release tag or a full commit SHA")
    add_recipes(new)
    new.set_defaults(func=new_command)
    scan = verbs.add_parser("scan", help="read a recipe's upstream source for the hazards the farm has met, each "
                                         "with file:line and the farm's fix")
    scan.add_argument("name", metavar="NAME")
    add_path(scan, "--source", kind="input_dir", metavar="DIR",
             help="scan this checkout instead of fetching the recipe's source (paths as its patches see them)")
    scan.add_argument("--format", choices=("text", "json"), default="text")
    add_recipes(scan)
    scan.set_defaults(func=scan_command)
    _register_status_verbs(verbs)


def _register_status_verbs(verbs) -> None:
    """status, block, unblock, rebuild: the status table and its build records (farm/recipes/status.py)."""
    from farm.recipes.status import (
        STATUS_DOC,
        block_command,
        rebuild_command,
        status_command,
        unblock_command,
    )

    status = verbs.add_parser("status", help="print the status table and write docs/recipe-status.md from the "
                                             "build records")
    add_path(status, "--records", kind="input_dir", help="records folder (default recipes/records)")
    add_path(status, "--out", kind="output_file", help=f"markdown file to write (default {STATUS_DOC}; "
                                                          "with a recipes folder of one's own, recipe-status.md in it)")
    add_recipes(status)
    status.set_defaults(func=status_command)
    block = verbs.add_parser("block", help="record why a recipe cannot be built (a blocked build record)")
    block.add_argument("name")
    block.add_argument("--why", required=True, help="one line: what blocks it")
    block.add_argument("--records", type=Path, help="records folder (default recipes/records)")
    add_recipes(block)
    block.set_defaults(func=block_command)
    unblocked = verbs.add_parser("unblock", help="put a blocked recipe's last measured build record back")
    unblocked.add_argument("name")
    unblocked.add_argument("--records", type=Path, help="records folder (default recipes/records)")
    add_recipes(unblocked)
    unblocked.set_defaults(func=unblock_command)
    rebuild = verbs.add_parser("rebuild", help="build the named recipes' status cells one at a time, record them, "
                                               "regenerate the table")
    rebuild.add_argument("names", nargs="+")
    rebuild.add_argument("--tier", choices=("full", "smoke", "flags"), default="full")
    rebuild.add_argument("--for", dest="minutes", type=minutes_arg("--for"), help="flags tier: minutes of compile (default 10)")
    rebuild.add_argument("--arch", type=arch_token_arg("--arch"), help="smoke tier: the token to build, e.g. 9.0a (default: the list's lowest)")
    rebuild.add_argument("--runner", choices=("container", "host"), default="container")
    add_recipes(rebuild)
    rebuild.set_defaults(func=rebuild_command)


def check_command(args) -> int:
    defaults = load_defaults()
    report = check_recipes(args.recipes, defaults=defaults)
    for error in report.errors:           # every problem of every file, one line each
        print(f"farm: {error}", file=sys.stderr)
    folder = settings.display(report.folder)
    lines_from = "the derived grid" if report.used_grid else "every supported CUDA line (no derived grid yet)"
    print(f"{len(report.recipes)} recipes valid, {len(report.invalid)} invalid in {folder}/ "
          f"(lines built: {lines_from})")
    by_recipe: dict[str, list] = {}
    for hazard in report.hazards:
        print(f"warning: {hazard}")
        by_recipe.setdefault(hazard.recipe, []).append(hazard)
    if by_recipe:
        print(f"fallback hazards (design.md section 3.5): {len(report.hazards)} in {len(by_recipe)} recipes")
        for name, found in by_recipe.items():
            lanes: dict[str, list[str]] = {}
            for h in found:
                if h.cuda not in lanes.setdefault(h.lane, []):
                    lanes[h.lane].append(h.cuda)
            kinds = "".join(sorted({h.kind for h in found}))
            print(f"  {name}: " + "; ".join(f"{lane_name} {'/'.join(cudas)}" for lane_name, cudas in lanes.items())
                  + f" ({kinds})")
    else:
        print("fallback hazards (design.md section 3.5): none")
    return 2 if report.errors else 0


class RecipeRow(TypedDict):
    """One line of `farm recipes list` (also its JSON form)."""
    name: str
    torch: str
    wheel_abi: str
    platforms: list[str]
    rows: str
    min_torch: str | None
    max_torch: str | None
    source: str
    needs_patch: bool


def list_command(args) -> int:
    recipes = load_recipes()
    rows: list[RecipeRow] = []
    for name, r in sorted(recipes.items()):
        if r.source.kind == "git":
            source = f"git {r.source.ref}"
        elif r.source.kind == "sdist":
            source = f"sdist {r.source.pypi or r.source.url}"
        else:
            source = f"path {r.source.path_text}"
        rows.append({
            "name": name,
            "torch": "per-torch" if r.links_torch else "torch-free",
            "wheel_abi": r.wheel_abi,
            "platforms": list(r.platforms),
            "rows": "own combinations" if r.combinations else "grid",
            "min_torch": r.min_torch, "max_torch": r.max_torch,
            "source": source,
            "needs_patch": r.needs_patch,
        })
    if args.format == "json":
        print_json(rows)
        return 0
    plat = {"linux": "L", "windows": "W", "linux_aarch64": "A"}
    header = f"{'name':<28} {'torch':<10} {'abi':<8} {'plat':<4} {'rows':<5} {'torch range':<11} source"
    print(header)
    for row in rows:
        span = f"{row['min_torch'] or ''}..{row['max_torch'] or ''}" if row["min_torch"] or row["max_torch"] else "-"
        flags = "  [needs_patch]" if row["needs_patch"] else ""
        print(f"{row['name']:<28} {row['torch']:<10} {row['wheel_abi']:<8} "
              f"{''.join(plat[p] for p in row['platforms']):<4} {'own' if row['rows'] != 'grid' else 'grid':<5} "
              f"{span:<11} {row['source']}{flags}")
    print(f"{len(rows)} recipes, {sum(r['needs_patch'] for r in rows)} marked needs_patch")
    return 0


def new_command(args) -> int:
    from farm.build.source.new import new_recipe

    folder = settings.recipes_dir()
    made = new_recipe(args.name, folder, sdist=args.sdist, git=args.git, ref=args.ref, defaults=load_defaults())
    print(f"pinned: {made.shown}" + (f", version {made.version}" if made.version else ""))
    print(f"wrote {settings.display(made.path)}; farm recipes check: {made.valid} valid in {settings.display(folder)}/")
    _print_hazards(made.hazards, made.files_read)
    given = "" if folder.resolve() == (settings.PROJECT_ROOT / "recipes").resolve() else f" --recipes {folder}"
    print(f"build first: farm build {made.first_cell}{given}")
    return 0


def scan_command(args) -> int:
    from farm.build.source.scan import scan_recipe
    from farm.recipes.status import known_recipe

    report = scan_recipe(known_recipe(args.name), args.source)
    if args.format == "json":
        print_json({"files_read": report.files_read, "skipped": report.skipped,
                    "hazards": [h.plain() for h in report.hazards]})
        return 0
    _print_hazards(report.hazards, report.files_read)
    return 0


def _print_hazards(hazards, files_read: int) -> None:
    handled = sum(1 for h in hazards if h.handled)
    print(f"hazard scan (design.md section 4.7): {len(hazards)} in {files_read} files"
          + (f", {handled} handled by the recipe" if handled else ""))
    for h in hazards:
        print(f"  {h.location}: {h.kind}: {h.summary}")
        print(f"      {h.text}")
        print(f"      {'handled: ' + h.handled if h.handled else 'fix: ' + h.fix}")
