"""The farm's error types. The CLI turns each into one line and an exit code."""

from __future__ import annotations


class FarmError(Exception):
    """Base of every error the CLI reports as one line."""

    exit_code = 1


class BadInput(FarmError):
    """A user mistake in a file or on the command line: exit 2, nothing written.

    The message always names where (file), which key, and the offending value.
    """

    exit_code = 2

    def __init__(self, where: str, key: str | None, value: object, problem: str):
        self.where, self.key, self.value, self.problem = str(where), key, value, problem
        # file: key: value: problem, leaving out what is absent (no empty '::' fields).
        parts = [self.where, key or None, None if value is None else repr(value), problem]
        super().__init__(": ".join(p for p in parts if p))


class NoSuchCell(FarmError):
    """A request for a cell the farm does not build (e.g. ARM on a line with no ARM row)."""

    exit_code = 2


class UpstreamUnreadable(FarmError):
    """The upstream index could not be read; nothing was written."""

    exit_code = 1
