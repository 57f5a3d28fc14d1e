"""nox sessions: one `build-<cell id>` per cell, plus tests and lint.

The session list comes from the farm's cached plan (ids and tags, keyed by a
hash of defaults/ and recipes/), so listing stays fast with the full grid.
When specific build sessions are named on the command line only those are
registered. Policy lives in the farm, not here. As with any noxfile, a bare
`nox` runs every session, here every build: `make farm` is the parallel,
resumable way to do that.
"""

from __future__ import annotations

import logging
import os
import sys

import nox

from farm.recipes.plan import session_index
from farm.runners.cpython import why_not_session

nox.options.default_venv_backend = "none"


def _named_sessions(argv: list[str]) -> set[str] | None:
    """Session names given with -s/--session(s)/-e, when every one is a build session."""
    names, take = [], False
    for arg in argv:
        if arg in ("-s", "--session", "--sessions", "-e"):
            take = True
            continue
        if arg.startswith(("--session=", "--sessions=")):
            names.append(arg.split("=", 1)[1])
            continue
        if take and not arg.startswith("-"):
            names.append(arg)
            continue
        take = False
    if names and all(n.startswith("build-") for n in names):
        return set(names)
    return None


def _register(cell_id: str, tags: tuple[str, ...], alone: bool) -> None:
    cannot = why_not_session(tags)   # said in the list, and by `farm build` before any set-up

    def build(session: nox.Session) -> None:
        argv = [sys.executable, "-m", "farm", "build", cell_id, *session.posargs]
        if alone:   # `nox -s build-<cell>` IS `farm build <cell>`: its output, its one-line refusal, its exit code
            os.execv(sys.executable, argv)
        session.run(*argv, external=True)

    build.__doc__ = f"build the wheel of cell {cell_id}" + (f" (cannot build here: {cannot})" if cannot else "")
    nox.session(name=f"build-{cell_id}", tags=list(tags), venv_backend="none")(build)


_wanted = _named_sessions(sys.argv[1:])
if _wanted is not None and len(_wanted) == 1:
    logging.getLogger("nox").setLevel(logging.WARNING)   # no session banner around the farm's own lines
for _cell_id, _tags in session_index():
    if _wanted is None or f"build-{_cell_id}" in _wanted:
        _register(_cell_id, _tags, alone=_wanted is not None and len(_wanted) == 1)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """the test suite (same as `make test`)"""
    session.run("make", "test", external=True)


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff over the farm, its tests and this file"""
    session.run("make", "lint", external=True)
