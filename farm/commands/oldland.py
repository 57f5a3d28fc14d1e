"""`farm check-oldland`: install and import every published Linux x86_64 wheel in an old userland
(Debian bullseye, glibc 2.31) with pip from the served wheelhouse, beside its cell's torch
(design.md §9.9). Exit 0: every checked wheel installs and imports; 1: one does not, none could be
checked, or the userland could not be made; 2: bad input.
"""

from __future__ import annotations

from farm.commands.common import add_path
from farm.settings import default_wheelhouse


def register(sub) -> None:
    p = sub.add_parser("check-oldland", help="install and import the wheelhouse's wheels in a Debian bullseye "
                                             "container (glibc 2.31); exit 1 when one fails",
                       description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    p.add_argument("--wheelhouse", default=None, help="default: $FARM_WHEELHOUSE, else ./wheelhouse")
    p.add_argument("--wheel", action="append", dest="wheels", metavar="FILE",
                   help="check only this published wheel (a file name; repeatable)")
    p.add_argument("--index-url", help="install from this index instead of serving the wheelhouse on 127.0.0.1")
    add_path(p, "--cpython-source", kind="input_file", action="append", dest="cpython_sources",
             help="a python.org Python-X.Y.Z.tar.xz to build a CPython Debian no longer carries (3.12)")
    add_path(p, "--out", kind="output_file", required=True, help="the results, as JSON")
    p.set_defaults(func=check_oldland_command)


def check_oldland_command(args) -> int:
    from farm.recipes.reader import load_recipes
    from farm.run.oldland import check_oldland
    from farm.runners.oldland import local_source

    sources = [local_source(p) for p in args.cpython_sources or ()]
    results = check_oldland(default_wheelhouse(args.wheelhouse), args.out, index_url=args.index_url,
                            files=args.wheels, extra_sources=sources, recipes=load_recipes())
    passed = [r for r in results if r.result == "pass"]
    failed = [r for r in results if r.result == "fail"]
    print(f"{len(passed)} installed and imported, {len(failed)} failed, "
          f"{len(results) - len(passed) - len(failed)} skipped; results in {args.out}")
    return 1 if failed or not passed else 0
