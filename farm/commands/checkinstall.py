"""`farm check-install`: install every package of every channel and Python the wheelhouse serves, with pip and
uv from the served index, import each, and publish the matrix (design.md §9.8)."""

from __future__ import annotations

from farm.settings import default_wheelhouse


def register(sub) -> None:
    p = sub.add_parser("check-install", help="install each package of every channel x Python with pip and uv from "
                                             "the served index into fresh venvs, import it, and write "
                                             "install-matrix.json and the install/ page")
    p.add_argument("--wheelhouse", default=None,
                   help="the wheelhouse folder (default: $FARM_WHEELHOUSE, else ./wheelhouse)")
    p.add_argument("--installer", action="append", metavar="{pip,uv}",
                   help="repeatable (default: both)")
    p.set_defaults(func=check_install_command)


def check_install_command(args) -> int:
    from farm.run.installcheck import INSTALLERS, check_install

    matrix = check_install(default_wheelhouse(args.wheelhouse), installers=args.installer or INSTALLERS)
    for skipped in matrix["not_checked"]:
        print(f"not checked: {skipped['cell']}: {skipped['reason']}")
    works, fails = matrix["counts"]["works"], matrix["counts"]["fails"]
    print(f"install matrix: {works} installed and imported, {fails} failed; wrote install-matrix.json and install/")
    return 1 if fails else 0
