"""`farm build <cell id>`: build, verify and publish one cell."""

from __future__ import annotations

from pathlib import Path

from ..runners import RUNNER_KINDS


def register(sub) -> None:
    parser = sub.add_parser("build", help="build one cell: source -> wheel -> repair -> verify -> publish")
    parser.add_argument("cell", help="a cell id, e.g. farm_demo-cu130-torch2.13-py311")
    parser.add_argument("--runner", choices=RUNNER_KINDS, help="default: container when an engine answers, else host")
    parser.add_argument("--out", type=Path, help="output folder (default build/<cell id>)")
    parser.add_argument("--force", action="store_true", help="build even when the build key is already published")
    parser.add_argument("--no-publish", action="store_true")
    parser.add_argument("--wheelhouse", type=Path)
    parser.add_argument("--plat", help="wheel platform tag to ask auditwheel for (default: the image's)")
    parser.add_argument("--no-compiler-cache", action="store_true", help="compile without ccache (benchmarks)")
    parser.set_defaults(func=build_command)


def build_command(args) -> int:
    from ..build import build_cell

    result = build_cell(args.cell, runner_kind=args.runner, out=args.out, force=args.force,
                        publish=not args.no_publish, wheelhouse=args.wheelhouse, plat=args.plat,
                        compiler_cache=not args.no_compiler_cache)
    if result.wheel:
        print(f"wheel:      {result.wheel}")
    if result.record:
        print(f"arch list:  {result.record['arch_list']}")
        print(f"record:     {result.record_path}")
    return 0
