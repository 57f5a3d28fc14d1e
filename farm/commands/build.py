"""`farm build <cell id>`: build, verify and publish one cell."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from farm.commands.common import add_mem_budget, add_path, add_recipes, arch_token_arg, minutes_arg
from farm.runners.base import RUNNER_KINDS


def register(sub) -> None:
    parser = sub.add_parser("build", help="build one cell: source -> wheel -> repair -> verify -> publish")
    parser.add_argument("cell", help="a cell id, e.g. farm_demo-cu130-torch2.13-py311")
    parser.add_argument("--runner", choices=RUNNER_KINDS, help="default: container when an engine answers, else host")
    add_recipes(parser)
    add_path(parser, "--out", kind="output_dir", help="output folder (default: build/<cell id> in the project)")
    parser.add_argument("--force", action="store_true", help="build even when the build key is already published")
    parser.add_argument("--no-publish", action="store_true")
    add_path(parser, "--wheelhouse", kind="output_dir",
             help="where the wheel is published (default: $FARM_WHEELHOUSE, else wheelhouse/ in the project)")
    parser.add_argument("--plat", help="wheel platform tag to ask auditwheel for (default: the image's)")
    parser.add_argument("--no-compiler-cache", action="store_true", help="compile without ccache (benchmarks)")
    add_mem_budget(parser, "memory the build may use, max_jobs x peak_gb_per_job; fewer jobs when the "
                           "recipe's do not fit (default: MemAvailable)")
    tier = parser.add_mutually_exclusive_group()
    tier.add_argument("--smoke", action="store_true",
                      help="build ONE token of the cell's arch list (never published; its own build key)")
    tier.add_argument("--flags-only", action="store_true",
                      help="record every nvcc call's targets and compare them with the cell's list; "
                           "stop the compile after --for minutes, build no wheel")
    parser.add_argument("--arch", type=arch_token_arg("--arch"), help="--smoke: the token to build, e.g. 8.6 or 12.0+PTX (default: the lowest)")
    parser.add_argument("--for", dest="minutes", type=minutes_arg("--for"),
                        help="--flags-only: minutes of compile before it is stopped (default 10)")
    parser.add_argument("--record", action="store_true",
                        help="write the recipe's build record, recipes/records/<name>.json (also FARM_RECORD=1)")
    talk = parser.add_mutually_exclusive_group()
    talk.add_argument("-q", "--quiet", action="store_true", help="print only the result (the wheel, or the error)")
    talk.add_argument("-v", "--verbose", action="store_true", help="stream the compile log under the step progress")
    parser.set_defaults(func=build_command)


def build_command(args) -> int:
    from farm.build.cell import build_cell, outcome
    from farm.build.display import StepDisplay
    from farm.build.request import BuildRequest
    display = StepDisplay(quiet=args.quiet, verbose=args.verbose)
    request = BuildRequest.make(args.cell, runner_kind=args.runner, out=args.out, force=args.force,
                                publish=not args.no_publish, wheelhouse=args.wheelhouse, plat=args.plat,
                                compiler_cache=not args.no_compiler_cache, record=args.record or None,
                                tier="smoke" if args.smoke else "flags" if args.flags_only else "full",
                                arch=args.arch, flags_minutes=_minutes(args), mem_budget_gb=args.mem_budget)
    with showing_build(display, request.cell_id, request.out):
        result = build_cell(request, log=display.line)
    display.summary(outcome(request.cell_id, request.out, result))
    if args.quiet:
        _print_result(result)
    return 0


@contextmanager
def showing_build(display, cell_id: str, out: Path) -> Iterator[None]:
    """Every progress event of the build inside goes to `display`; a build that fails after a step ran
    ends with the summary up to that step (the one-line error follows on stderr, from the CLI)."""
    from farm import progress
    from farm.build.cell import outcome
    from farm.errors import FarmError

    try:
        with progress.using(display):
            yield
    except FarmError:
        if display.steps:
            display.summary(outcome(cell_id, out))
        raise
    finally:
        display.close()


def _print_result(result) -> None:
    from farm.build.compile import flags_summary

    if result.wheel:
        print(f"wheel:      {result.wheel}")
    if result.record is not None and result.record.flags:
        print(f"flags:      {flags_summary(result.record.flags)}")
    if result.record is not None:
        print(f"arch list:  {result.record.arch_list}")
        print(f"record:     {result.record_path}")


def _minutes(args) -> float | None:
    from farm.errors import BadInput

    if args.minutes is None:
        return None
    if not args.flags_only:
        raise BadInput("farm build", "--for", args.minutes, "only --flags-only stops the compile after a time")
    return args.minutes
