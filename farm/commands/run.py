"""`farm run` (what `make farm` calls): build every selected cell that is not built yet (design.md §11.1)."""

from __future__ import annotations

from farm.commands.common import add_mem_budget, add_path, check_selection, empty_selection, number_arg
from farm.commands.plan import add_filters, filters_of
from farm.runners.base import RUNNER_KINDS


def register(sub) -> None:
    parser = sub.add_parser("run", help="build what is missing, in parallel, resumably (make farm)")
    add_filters(parser)
    parser.add_argument("--jobs", type=_count("--jobs"), help="cells at once (default: one per CPU; the first Python of a build runs before its siblings)")
    add_mem_budget(parser, "memory the builds may reserve, max_jobs x peak_gb_per_job each (default: MemAvailable)")
    parser.add_argument("--runner", choices=RUNNER_KINDS, help="default: container when an engine answers, else host")
    add_path(parser, "--wheelhouse", kind="output_dir", help="default: $FARM_WHEELHOUSE, else ./wheelhouse")
    add_path(parser, "--build-dir", kind="output_dir", help="per-cell build folders (default: the project's build/)")
    parser.add_argument("--arm-jobs", type=_count("--arm-jobs"), default=None,
                        help="emulated aarch64 cells at once (default: FARM_EMULATED_JOBS, else 1)")
    parser.add_argument("--no-compiler-cache", action="store_true", help="build without ccache (recorded)")
    parser.add_argument("--dry-run", action="store_true", help="plan and list what would be built")
    parser.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    parser.set_defaults(func=run_command)


def _count(option: str):
    return number_arg(option, 1, 4096, "must be a whole number of at least 1 (and at most 4096)", whole=True)


def run_command(args) -> int:
    from farm.recipes.plan import parse_shard
    from farm.run.farmrun import RunOptions, run_farm
    from farm.runners.emulation import emulated_concurrency

    shard = parse_shard(args.shard) if args.shard else None
    check_selection(args)
    options = RunOptions(filters=filters_of(args), shard=shard,
                         jobs=args.jobs, mem_budget_gb=args.mem_budget, runner=args.runner,
                         wheelhouse=args.wheelhouse, build_dir=args.build_dir,
                         arm_jobs=args.arm_jobs if args.arm_jobs is not None else emulated_concurrency(),
                         compiler_cache=not args.no_compiler_cache, dry_run=args.dry_run,
                         plain=True if args.plain else None)
    result = run_farm(options)
    if not result.cells and not result.unbuildable:
        print(empty_selection(args))
    return result.exit_code
