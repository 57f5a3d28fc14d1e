"""The `farm` command: a thin front that parses arguments and calls library functions.

Each command group lives in farm/commands/<group>.py and exposes
`register(subparsers)`; each parser sets `func(args) -> int`. Errors of the
farm's own kinds become one line on stderr and their exit code (2 for bad
input), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import re
import signal
import sys
import threading
import time

from farm import settings
from farm.errors import MAX_SHOWN, MAX_VALUE_SHOWN, BadInput, FarmError, shorten

# One line per command group; the order is the order of `farm --help`.
COMMAND_MODULES = (
    "farm.commands.matrix",
    "farm.commands.arch",
    "farm.commands.coverage",
    "farm.commands.recipes",
    "farm.commands.plan",
    "farm.commands.build",
    "farm.commands.run",
    "farm.commands.ci",
    "farm.commands.demo",
    "farm.commands.wheelhouse",
    "farm.commands.checkinstall",
    "farm.commands.images",
    "farm.commands.verify",
    "farm.commands.pam",
    "farm.commands.oldland",
)


class FarmParser(argparse.ArgumentParser):
    """argparse, whose own refusals (an unknown option, a bad choice, a missing argument) are the farm's
    one line too, with every word of the value cut short (design.md §12), instead of a usage block."""

    def error(self, message: str):
        words = re.sub(rf"\S{{{MAX_VALUE_SHOWN + 1},}}", lambda m: shorten(m.group(0), MAX_VALUE_SHOWN), message)
        raise BadInput("command line", None, None, f"{shorten(words, MAX_SHOWN)} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = FarmParser(prog="farm", description="Build farm for CUDA Python wheels.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM (a `kill`, a CI job's timeout), raised where the farm is, like Ctrl-C: every `finally` runs,
    so a build's container is removed and its compiler's process group stopped instead of left running."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def _sigterm_as_interrupt():
    if threading.current_thread() is not threading.main_thread():   # only the main thread may set handlers
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    mark = settings.START_MARK.get()
    if mark:  # benchmarks measure how long a caller (e.g. nox) takes to reach the farm
        with open(mark, "w") as fh:
            fh.write(repr(time.time()))
    parser = build_parser()
    try:
        with _sigterm_as_interrupt():
            args = parser.parse_args(argv)   # an argument's `type` may refuse a value in one line too
            if getattr(args, "recipes", None) is not None:
                settings.use_recipes_dir(args.recipes)
            return int(args.func(args) or 0)
    except FarmError as exc:
        print(f"farm: {exc}", file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print("farm: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("farm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
