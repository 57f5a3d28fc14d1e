"""Every error the farm reports, in one place, grouped by the pipeline stage that raises it.

The CLI (farm/cli.py) prints a FarmError as one line `farm: <message>` and exits
with its `exit_code`; each class below states its code, so the table of exit
codes is this file. Codes: 1 a step failed, 2 bad input or a refusal (nothing
written), 137 out of memory (`farm run` retries with fewer jobs).
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_SHOWN = 200
MAX_VALUE_SHOWN = 80      # an offending value (or key) echoed in an error line: enough to recognise it, no more


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """A value as an error line shows it: at most about `limit` characters, on one line.

    A 5 MB name must not make a 5 MB error line, and a value with a newline must
    not break the one-line rule.
    """
    text = str(text).replace("\r", "\\r").replace("\n", "\\n")
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def shown(value: object) -> str:
    """An offending value as every error line echoes it: its repr, cut to MAX_VALUE_SHOWN characters.

    The one helper for values (design.md §12): a 120 kB argument, or a file that is not what it
    was named as, is recognisable in the line without being printed."""
    return shorten(repr(value), MAX_VALUE_SHOWN)


# ---------------------------------------------------------------- every stage

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
        parts = [shorten(self.where), shorten(key, MAX_VALUE_SHOWN) if key else None,
                 None if value is None else shown(value), problem]
        super().__init__(": ".join(p for p in parts if p))


class NoSuchCell(FarmError):
    """A request for a cell the farm does not build (e.g. ARM on a line with no ARM row)."""

    exit_code = 2


# ---------------------------------------------------------------- matrix

class UpstreamUnreadable(FarmError):
    """The upstream index could not be read; nothing was written."""

    exit_code = 1


# ---------------------------------------------------------------- arch

class FatbinError(FarmError):
    """A file the reader cannot read: not ELF/PE, or a truncated or corrupt fatbin."""

    exit_code = 2


# ---------------------------------------------------------------- recipes

class RecipeProblems(BadInput):
    """Every problem found in one recipe file. It reads as the first one (the one line a command
    that loads recipes prints); `farm recipes check` prints each of `problems`."""

    exit_code = 2

    def __init__(self, problems: Iterable[BadInput]):
        self.problems = tuple(problems)
        first = self.problems[0]
        super().__init__(first.where, first.key, first.value, first.problem)


# ---------------------------------------------------------------- build: the host side (farm build)

class NotBuildableHere(FarmError):
    """A cell this host cannot build (Windows on Linux, needs_patch, no toolkit for the line)."""

    exit_code = 2


class NeedsFarmWheel(NotBuildableHere):
    """A build_requires_farm dependency has no wheel for the cell's coordinates in the wheelhouse."""

    exit_code = 2


class BuildFailed(FarmError):
    """A build step of the cell failed; the message names the step and the log's last line."""

    exit_code = 1


class BuildOOM(BuildFailed):
    """A step was killed with exit 137 (out of memory): `farm run` retries it with max_jobs halved (design.md §11.2)."""

    exit_code = 137


# ---------------------------------------------------------------- build: the steps (in the container)

class BadSpec(FarmError):
    """A step spec the steps cannot read (another farm version wrote it, or it was edited)."""

    exit_code = 2


class StepFailed(FarmError):
    """A step of the in-container entrypoint (farm/build/steps.py) cannot go on."""

    exit_code = 1


class SourceError(FarmError):
    """Fetching or preparing a source failed (network, unsafe archive, git, patch)."""

    exit_code = 1


class UnsafeArchive(SourceError):
    """An archive member would land outside the extraction folder."""

    exit_code = 1


class PatchFailed(SourceError):
    """A recipe patch did not apply."""

    exit_code = 1


class DownloadFailed(FarmError):
    """A wheel or build dependency could not be downloaded."""

    exit_code = 1


class IndexUnreachable(DownloadFailed):
    """The index a download must come from does not answer (and nothing cached answers for it)."""

    exit_code = 1


class EnvironmentFailed(FarmError):
    """The cell's Python/torch environment could not be made or does not run."""

    exit_code = 1


class TorchMismatch(FarmError):
    """The torch environment holds another torch or CUDA than the cell wants."""

    exit_code = 1


class ToolkitUnavailable(FarmError):
    """No CUDA toolkit of the cell's line is installed or can be fetched."""

    exit_code = 1


class ToolkitCannotEmit(FarmError):
    """The toolkit's nvcc cannot emit an architecture the cell's arch list asks for."""

    exit_code = 1


class CompileFailed(FarmError):
    """Building the wheel (pip wheel / setup.py) failed."""

    exit_code = 1


class CompileStalled(CompileFailed):
    """The compile printed nothing for the recipe's timeout: hung, so killed (design.md §6.4)."""

    exit_code = 1


class WheelError(FarmError):
    """The wheel handed to a build step is not a well-formed wheel."""

    exit_code = 1


class RepairError(FarmError):
    """auditwheel could not repair the wheel, or grafted something not allowed."""

    exit_code = 1


class GateCannotRun(FarmError):
    """The gate could not judge the wheel (missing file, no interpreter, no torch env): exit 2."""

    exit_code = 2


class WindowsToolchainMissing(FarmError):
    """A Windows build lacks MSVC or the CUDA toolkit."""

    exit_code = 1


# ---------------------------------------------------------------- runners

class RunnerError(FarmError):
    """A runner could not start or finish the build entrypoint."""

    exit_code = 1


class EngineUnavailable(FarmError):
    """No container engine answers; the message says which were tried and why."""

    exit_code = 1


class EngineError(FarmError):
    """An engine command failed (not a build step: those report an exit code)."""

    exit_code = 1


class ImageError(FarmError):
    """A build image could not be built, found or loaded."""

    exit_code = 1


# ---------------------------------------------------------------- wheelhouse

class PublishConflict(FarmError):
    """A file name already published with other bytes: new bytes never reuse an old name (design.md §5.4)."""

    exit_code = 2


class ShrinkRefused(FarmError):
    """An index rebuild would list fewer wheels in a channel than its pages do; nothing written."""

    exit_code = 1


# ---------------------------------------------------------------- run

class DemoFailed(FarmError):
    """`farm demo` built the cell but pip could not install it from the served channel."""

    exit_code = 1
