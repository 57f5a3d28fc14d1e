"""`farm verify WHEEL...`: the verify gate (design.md §7) on wheels built anywhere.

The expectation comes from a cell of the plan (`--cell`) or from the command
line (`--arch-list` and `--platform`, optionally `--torch/--cuda` for the local
label, `--name/--version/--python`); `--floor` names the manylinux floor to hold it to. Exit 0: every wheel passed; 1: a wheel
failed (one line on stderr per failed wheel: its failed checks and the first one's
message); 2: the gate could not run (bad input, missing file, no interpreter).
"""

from __future__ import annotations

import dataclasses
import json
import sys

from farm.archlist import ArchList
from farm.build.verify.expectation import Expectation, cell_expectation
from farm.build.verify.gate import verify_wheel
from farm.commands.common import add_path, add_platform, add_recipes, check_version
from farm.errors import BadInput, FarmError, GateCannotRun, shorten
from farm.versions import cuda_tag, python_tag
from farm.yamlio import write_atomic


def register(sub) -> None:
    p = sub.add_parser("verify", help="run the verify gate on wheels (design.md section 7); exit 1 when one fails",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("wheels", nargs="+", metavar="WHEEL")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--cell", help="cell id from the plan, e.g. farm_demo-cu130-torch2.13-py311")
    which.add_argument("--arch-list", help="the arch list the wheel must carry, checked as written (e.g. '8.0 8.9 9.0+PTX')")
    add_platform(p)
    p.add_argument("--torch", help="torch minor of the channel (torch-linked wheel: label +cuNNNtorchM.m)")
    p.add_argument("--cuda", help="CUDA line (label +cuNNN, with --torch +cuNNNtorchM.m)")
    p.add_argument("--python", help="Python the wheel targets, e.g. 3.11 (checks the cpXY tag)")
    p.add_argument("--name", help="distribution name the wheel must carry")
    p.add_argument("--version", dest="pkg_version", help="public version the wheel must carry")
    p.add_argument("--floor", help="the manylinux floor the wheel's versioned symbols must stay within, e.g. "
                                   "manylinux_2_28 (design.md section 7.8; without it the floor check is skipped)")
    add_path(p, "--torch-env", kind="input", help="the torch environment to import against (venv or its python)")
    p.add_argument("--skip-import", action="store_true", help="skip the import check")
    add_path(p, "--report", kind="output_file", help="write the JSON reports to this file")
    p.add_argument("--format", choices=("text", "json"), default="text")
    add_recipes(p)   # --cell reads the plan
    p.set_defaults(func=verify_command)


def expectation_from_args(args) -> Expectation:
    from farm.floor import floor_problem

    floor = getattr(args, "floor", None)
    if floor is not None and floor_problem(floor):
        raise BadInput("command line", "--floor", floor, floor_problem(floor) or "")
    return dataclasses.replace(_expectation(args), floor=floor)


def _expectation(args) -> Expectation:
    if args.cell:
        for opt in ("arch_list", "torch", "cuda", "python", "name", "pkg_version"):
            if getattr(args, opt, None):
                raise BadInput("command line", "--cell", args.cell, f"--{opt.replace('_', '-')} comes from the cell")
        return cell_expectation(args.cell)
    if not args.platform:
        raise BadInput("command line", "--platform", None, "--arch-list needs --platform (linux, windows, linux_aarch64)")
    arch_list = ArchList.parse(args.arch_list, "command line", "--arch-list")
    check_version(args.torch, "--torch")
    check_version(args.cuda, "--cuda")
    check_version(args.python, "--python")
    if args.torch and not args.cuda:
        raise BadInput("command line", "--torch", args.torch, "--torch needs --cuda (the label is +cuNNNtorchM.m)")
    label = None
    if args.cuda:
        label = cuda_tag(args.cuda) + (f"torch{args.torch}" if args.torch else "")
    return Expectation(
        name=args.name, version=args.pkg_version, local_label=label,
        python_tag=f"cp{python_tag(args.python)}" if args.python else None,
        platform=args.platform, arch_list=arch_list, links_torch=bool(args.torch),
    )


def verify_command(args) -> int:
    expectation = expectation_from_args(args)
    reports, cannot = [], []
    for wheel in args.wheels:
        try:
            report = verify_wheel(wheel, expectation, torch_env=args.torch_env, skip_import=args.skip_import)
        except GateCannotRun as exc:
            print(f"farm: {exc}", file=sys.stderr)
            cannot.append({"wheel": str(wheel), "error": str(exc)})
            continue
        reports.append(report)
        if args.format == "text":
            print("\n".join(report.lines()))
        if not report.passed:  # the verdict on stdout, and one line per failed wheel on stderr
            first = report.check(report.failed[0])
            print(f"farm: {shorten(report.wheel)}: failed {', '.join(report.failed)}: {shorten(first.message)}",
                  file=sys.stderr)
    passed = bool(reports) and not cannot and all(r.passed for r in reports)
    doc = {"passed": passed, "wheels": [r.as_dict() for r in reports], "gate_errors": cannot}
    if args.format == "json":
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    if args.report:
        write_atomic(args.report, json.dumps(doc, indent=2) + "\n")
    if cannot:
        return GateCannotRun.exit_code
    return 0 if passed else 1


__all__ = ["register", "expectation_from_args", "verify_command", "FarmError"]
