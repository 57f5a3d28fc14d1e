"""`farm run` (what `make farm` calls): build every selected cell that is not built yet (design.md §11.1)."""

from __future__ import annotations

from pathlib import Path

from farm.commands.common import add_mem_budget, check_selection, empty_selection, output_dir
from farm.commands.plan import add_filters, filters_of
from farm.errors import BadInput
from farm.runners.base import RUNNER_KINDS


def register(sub) -> None:
    parser = sub.add_parser("run", help="build what is missing, in parallel, resumably (make farm)")
    add_filters(parser)
    parser.add_argument("--jobs", type=int, help="cells at once (default: one per CPU; the first Python of a build runs before its siblings)")
    add_mem_budget(parser, "memory the builds may reserve, max_jobs x peak_gb_per_job each (default: MemAvailable)")
    parser.add_argument("--runner", choices=RUNNER_KINDS, help="default: container when an engine answers, else host")
    parser.add_argument("--wheelhouse", type=Path, help="default: $FARM_WHEELHOUSE, else ./wheelhouse")
    parser.add_argument("--build-dir", type=Path, help="per-cell build folders (default: the project's build/)")
    parser.add_argument("--arm-jobs", type=int, default=None,
                        help="emulated aarch64 cells at once (default: FARM_EMULATED_JOBS, else 1)")
    parser.add_argument("--no-compiler-cache", action="store_true", help="build without ccache (recorded)")
    parser.add_argument("--dry-run", action="store_true", help="plan and list what would be built")
    parser.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    parser.set_defaults(func=run_command)


def run_command(args) -> int:
    from farm.recipes.plan import parse_shard
    from farm.run.farmrun import RunOptions, run_farm
    from farm.runners.emulation import emulated_concurrency

    for name in ("jobs", "arm_jobs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise BadInput("command line", f"--{name.replace('_', '-')}", value, "must be at least 1")
    shard = parse_shard(args.shard) if args.shard else None
    output_dir(args.wheelhouse, "--wheelhouse")
    output_dir(args.build_dir, "--build-dir")
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
