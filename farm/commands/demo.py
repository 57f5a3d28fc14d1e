"""`farm demo`: build, publish and install the bundled demo extension (the README's first command)."""

from __future__ import annotations

from farm.commands.common import add_path
from farm.runners.base import RUNNER_KINDS


def register(sub) -> None:
    parser = sub.add_parser("demo", help="build farm_demo for a real cell, publish it, install it from the index")
    parser.add_argument("--cell", help="default: farm.run.demo.DEMO_CELL (farm_demo-cu130-torch2.13-py311)")
    parser.add_argument("--runner", choices=RUNNER_KINDS, help="default: container when an engine answers")
    add_path(parser, "--wheelhouse", kind="output_dir")
    add_path(parser, "--build-dir", kind="output_dir",
                        help="the cell's build folder and the server log go here (default: the project's build/)")
    parser.set_defaults(func=demo_command)


def demo_command(args) -> int:
    from farm.build.cell import outcome
    from farm.build.display import StepDisplay
    from farm.commands.build import showing_build
    from farm.run.demo import DEMO_CELL, demo_out, run_demo

    cell_id = args.cell or DEMO_CELL
    out = demo_out(cell_id, args.build_dir)
    display = StepDisplay(prefix="[farm demo]")
    with showing_build(display, cell_id, out):
        run_demo(cell_id, args.runner, args.wheelhouse, build_dir=args.build_dir, log=display.line,
                 built=lambda result: display.summary(outcome(cell_id, out, result)))
    return 0
