"""The gate: `verify_wheel(path, expectation)` runs the checks of design.md §7 in order, cheapest first,
each named (`CHECKS`): first the wheel as a file (`wheel_file_problems`: zip, member paths, WHEEL,
RECORD), then each pass / warn / fail / skip with a message, and returns a `Report` (JSON per
wheel). A failed static check skips the import check (importing a broken wheel proves nothing and
may hang).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from elftools.common.exceptions import ELFError

from farm.build.verify.checks import (
    check_arches,
    check_binaries,
    check_elf,
    check_file,
    check_filename,
    check_floor,
    check_metadata,
    check_torch_linkage,
)
from farm.build.verify.expectation import CheckResult, Expectation, Report
from farm.build.verify.importcheck import ImportChild, check_import
from farm.build.verify.torchenv import TorchEnv
from farm.errors import GateCannotRun
from farm.wheelhouse.wheelfile import ZIP_READ_ERRORS, Wheel

CHECKS = ("file", "filename", "metadata", "binaries", "elf", "floor", "torch_linkage", "arches", "import")


def _static_checks(report: Report, w: Wheel, exp: Expectation, env: TorchEnv | None) -> None:
    """metadata .. arches, in order. A member that cannot be read (the file check names it) or an
    ELF file that does not parse fails the check that met it, never the gate."""
    runs = (("metadata", lambda: check_metadata(w, exp)), ("binaries", lambda: check_binaries(w, exp)),
            ("elf", lambda: check_elf(w, exp, env)), ("floor", lambda: check_floor(w, exp)),
            ("torch_linkage", lambda: check_torch_linkage(w, exp)),
            ("arches", lambda: check_arches(w, exp)))
    for name, run in runs:
        try:
            report.checks.append(run())
        except ELFError as exc:
            report.checks.append(CheckResult(name, "fail", f"unreadable ELF file: {exc}"))
        except ZIP_READ_ERRORS as exc:
            report.checks.append(CheckResult(name, "fail", f"a member cannot be read: {exc}"))


def verify_wheel(path: Path | str, expectation: Expectation, *, torch_env: Path | None = None,
                 skip_import: bool = False, python: Path | None = None,
                 import_child: ImportChild | None = None) -> Report:
    """Run every check of design.md §7 on one wheel. Raises GateCannotRun when the gate cannot judge.

    torch_env: the cell's torch environment (a venv/prefix or its python); it supplies the
    interpreter of the import check and the exact sonames torch provides for the ELF check.
    python: the interpreter for torch-free wheels when no torch_env is given (default: this one).
    import_child: started before the wheel existed (farm.build.steps); closed here whether used or not.
    """
    try:
        return _verify_wheel(Path(path), expectation, torch_env, skip_import, python, import_child)
    finally:
        if import_child is not None:
            import_child.close()


def _verify_wheel(path: Path, expectation: Expectation, torch_env: Path | None, skip_import: bool,
                  python: Path | None, import_child: ImportChild | None) -> Report:
    if not path.is_file():
        raise GateCannotRun(f"{path}: no such wheel file")
    env = TorchEnv.locate(torch_env) if torch_env is not None else None
    report = Report(path.name, expectation)
    with tempfile.TemporaryDirectory(prefix="farm-verify-") as tmp:
        w = Wheel(path, Path(tmp))
        try:
            report.checks.append(check_file(w, expectation))
            report.checks.append(check_filename(w, expectation))
            if w.zip_error:
                for name in CHECKS[2:-1]:
                    report.checks.append(CheckResult(name, "skip", "the wheel is not a readable zip"))
            else:
                _static_checks(report, w, expectation, env)
            if skip_import:
                report.checks.append(CheckResult("import", "skip", "skipped (--skip-import)"))
            elif not report.passed:
                report.checks.append(CheckResult("import", "skip", f"not run: {', '.join(report.failed)} failed"))
            else:
                report.checks.append(check_import(w, expectation, env, python, import_child))
        finally:
            if w.zip is not None:
                w.zip.close()
    return report
