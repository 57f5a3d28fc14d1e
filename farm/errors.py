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
        parts = [shorten(self.where), shorten(key) if key else None,
                 None if value is None else shorten(repr(value)), problem]
        super().__init__(": ".join(p for p in parts if p))


MAX_SHOWN = 200


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """A value as an error line shows it: at most about `limit` characters, on one line.

    A 5 MB name must not make a 5 MB error line, and a value with a newline must
    not break the one-line rule.
    """
    text = str(text).replace("\r", "\\r").replace("\n", "\\n")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


class NoSuchCell(FarmError):
    """A request for a cell the farm does not build (e.g. ARM on a line with no ARM row)."""

    exit_code = 2


class UpstreamUnreadable(FarmError):
    """The upstream index could not be read; nothing was written."""

    exit_code = 1
