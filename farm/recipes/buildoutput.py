"""What a build leaves in its output folder, read back (design.md §4.5, §6.9): the first error of a
compile log, the SASS and PTX verify.json's arches check found, the words of a flags report.

The build writes these, and the build record and the status table read them: here, in the recipes
stage above the build, both see one reading (design.md §1.1).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from farm import progress

# Errors a compiler or linker locates, in the forms nvcc, cudafe++, gcc/clang and ld print them.
_LOCATED = (
    re.compile(r"^\S.*\(\d+\): (?:catastrophic )?error\b"),            # nvcc/cudafe++: file.cu(12): error: ...
    re.compile(r"^\S.*?:\d+(?::\d+)?: (?:fatal )?error\b"),            # gcc/clang: file.cpp:3:1: error: ...
    re.compile(r"^nvcc (?:fatal|error)\s*:"),                          # nvcc fatal   : Unsupported gpu ...
    re.compile(r"^ptxas (?:fatal|error)\s*[:]"),                       # ptxas error   : Entry function ...
    re.compile(r":\s*undefined reference to\b|^(?:\S*/)?ld(?:\.\w+)?: cannot find\b"),
    re.compile(r"^CMake Error\b"),
)
# Lines that report a failure without being its cause: setuptools' and ninja's summaries.
_CONSEQUENCE = re.compile(r"^(?:error: command .* failed|collect2: error|ninja: build stopped|FAILED: |"
                          r"subprocess\.CalledProcessError|RuntimeError: Error compiling objects)")
# A tool's own `error:` line (`c++: error: unrecognized ...`, `ValueError: error: ...`), not a source line quoting one.
_GENERIC = re.compile(r"^(?:[\w.+-]+: )?(?:fatal )?error:", re.I)
EXCERPT_LINES = 2   # the source line and caret a compiler prints under its error


def _is_noise(line: str) -> bool:
    """The frontend's own notes (`$ cd ...`, `# exit 1 ...`) and ninja/CMake status lines, which quote
    whole command lines (full of -Werror and *error* paths)."""
    return line.startswith(("#", "$")) or bool(progress.NINJA.match(line)) or bool(progress.CMAKE_PERCENT.match(line))


def first_error_lines(source: str | Path, excerpt: int = EXCERPT_LINES) -> list[str]:
    """The compile's first located compiler or linker error and the excerpt lines under it; else its
    first generic `error:` line that is not a summary; else []. `source`: a log file or its text."""
    try:
        text = Path(source).read_text(encoding="utf-8", errors="replace") if isinstance(source, Path) else source
    except OSError:
        return []
    lines = [ln.rstrip() for ln in text.splitlines()]
    for patterns in (_LOCATED, (_GENERIC,)):
        for i, line in enumerate(lines):
            stripped = line.strip()
            if not stripped or _is_noise(stripped) or _CONSEQUENCE.search(stripped):
                continue
            if any(p.search(stripped) for p in patterns):
                block = [stripped[:300]]
                for nxt in lines[i + 1:i + 1 + excerpt]:
                    if not nxt.strip() or any(p.search(nxt.strip()) for p in _LOCATED) or _is_noise(nxt.strip()):
                        break
                    block.append(nxt[:300])
                return block
    return []


def first_error(source: str | Path) -> str | None:
    """The compile's first compiler error line (the cause; later ones tend to follow from it)."""
    found = first_error_lines(source, excerpt=0)
    return found[0] if found else None


def arches_found(report: Mapping[str, Any]) -> dict[str, list[str]]:
    """The SASS and PTX the arches check found over all modules, from a report as written (verify.json)."""
    check: dict[str, Any] = next((c for c in report.get("checks") or [] if c.get("name") == "arches"), {})
    union = (check.get("details") or {}).get("union") or {}
    return {"sass": list(union.get("sass") or []), "ptx": list(union.get("ptx") or [])}


def by_arch(names: Iterable[str]) -> list[str]:
    """Target names (sm_90a, compute_120, ...) in arch order, not string order."""
    return sorted(names, key=lambda n: (int(re.sub(r"\D", "", n) or 0), n))


def flags_verdict(report: Mapping[str, Any]) -> str:
    """The status table's gate column for a flags run: equal to the list, or how it differs."""
    if report.get("equal"):
        waived = f"{waived_text(report)}; " if report.get("waived") else ""
        return f"flags equal the list ({waived}{report.get('compiling_invocations')} nvcc calls{sample_text(report)})"
    return f"flags differ: {flags_differences(report) or 'no nvcc call seen'}"


def flags_differences(report: Mapping[str, Any]) -> str:
    """'missing sm_100; extra sm_89; sm_80 waived': how a flags report differs from the list (also the
    status table's words; records written before waivers were reported have no 'waived')."""
    parts = [f"missing {' '.join(report['missing'])}" if report.get("missing") else "",
             f"extra {' '.join(report['extra'])}" if report.get("extra") else "", waived_text(report)]
    return "; ".join(p for p in parts if p)


def waived_text(report: Mapping[str, Any]) -> str:
    """'sm_80 sm_86 waived' (what the gate would forgive as well), or ''."""
    return f"{' '.join(report['waived'])} waived" if report.get("waived") else ""


def sample_text(report: Mapping[str, Any]) -> str:
    """'; 2 of 73 objects finished at 640 CPU-s each: ~13 CPU-h for the cell' (what the stop left to
    sample; also the status table's words)."""
    if "finished" not in report:
        return ""
    total = f" of {report['objects_total']}" if report.get("objects_total") else ""
    if not report["finished"]:
        return f"; none{total} objects finished before the stop, so no CPU sample"
    text = f"; {report['finished']}{total} objects finished at {report['cpu_s_per_object']:g} CPU-s each"
    return text + (f": ~{report['cpu_h_estimate']:g} CPU-h for the cell" if report.get("cpu_h_estimate") else "")
