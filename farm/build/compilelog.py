"""Reading a compile's log while it runs and after it failed (design.md §6.9).

While it runs: how far it is, where the build tool tells. Ninja (torch's BuildExtension, CMake's
Ninja generator) prints `[n/N] <command or description>` as each edge finishes; CMake's Makefile
generator `[ NN%] Building CUDA object ...`; setuptools without ninja prints each compiler
command, which counts files without a total. The flags tier's nvcc wrapper leaves one file per
nvcc call. `CompileWatch` follows compile.log and ccache's stats log from a thread inside the
compile step and emits a progress event per counted line.

After it failed: the compiler's FIRST error line (`file.cu(12): error: ...`, `file.cpp:3:1: error:`,
`nvcc fatal : ...`, the linker's undefined reference), with the source excerpt printed under it,
not the last line of the Python traceback that setuptools adds after it. How a log's first error
reads is farm/recipes/buildoutput.py's, which the build record reads with the same words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from farm import progress
from farm.process import last_line, useful_lines
from farm.progress import CMAKE_PERCENT, NINJA
from farm.recipes.buildoutput import first_error

SOURCE_FILE = re.compile(r"(?:^|\s)(?:-c\s+)?['\"]?([^\s'\"]+\.(?:cu|cpp|cc|cxx|c|C|mm|m))['\"]?(?=\s|$)")
CMAKE_OBJECT = re.compile(r"Building \w+ object (?:\S*?\.dir/)?(\S+?)\.(?:o|obj)$")
CMAKE_LINK = re.compile(r"Linking \w+ (?:shared |static )?(?:module|library|executable) (\S+)")
# A compiler command line as setuptools prints it without ninja: the compiler, then -c.
COMPILER_CALL = re.compile(r"^(?:\S*/)?(?:ccache\s+\S*?)?(?:\S*/)?(?:nvcc|gcc|g\+\+|c\+\+|cc|clang\+\+|clang|"
                           r"[\w-]+-linux-gnu-(?:gcc|g\+\+))\s.*\s-c\s")

UNIT_OBJECTS = "objects"
UNIT_PERCENT = "%"


def short_path(path: str) -> str:
    """The last two parts of a path: `csrc/elementwise.cu`, wherever the source tree was mounted."""
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:])


def _source_of(command: str) -> str | None:
    """The file a compiler command or a build tool's description names."""
    if m := CMAKE_OBJECT.search(command):
        return short_path(m.group(1))
    if m := CMAKE_LINK.search(command):
        return f"linking {short_path(m.group(1))}"
    tokens = command.split()
    for i, token in enumerate(tokens):   # the file after -c, else the first source file that is not -o's
        if token == "-c" and i + 1 < len(tokens) and SOURCE_FILE.search(tokens[i + 1]):
            return short_path(tokens[i + 1].strip("'\""))
    for m in SOURCE_FILE.finditer(command):
        before = command[:m.start(1)].rstrip("'\" ").split()
        if not before or before[-1] != "-o":
            return short_path(m.group(1))
    return None


@dataclass
class Count:
    """How far a compile is: done of total (None: the tool does not tell) in unit, on current."""

    done: int = 0
    total: int | None = None
    unit: str = UNIT_OBJECTS
    current: str | None = None


def read_progress_line(line: str, count: Count) -> bool:
    """Update `count` from one line of compile output; True when the line moved it."""
    if m := NINJA.match(line):
        count.done, count.total, count.unit = int(m.group(1)), int(m.group(2)), UNIT_OBJECTS
        count.current = _source_of(m.group(3)) or count.current
        return True
    if m := CMAKE_PERCENT.match(line):
        count.done, count.total, count.unit = int(m.group(1)), 100, UNIT_PERCENT
        count.current = _source_of(m.group(2)) or count.current
        return True
    if count.total is None and COMPILER_CALL.match(line):
        count.done += 1
        count.current = _source_of(line) or count.current
        return True
    return False


class CompileWatch:
    """Follows a running compile (its log, ccache's stats log, the flags tier's nvcc calls) and emits
    `compile` progress events: one per line that moves the count, so no intermediate count is lost."""

    def __init__(self, log: Path, stats_log: str | None = None, calls: Path | None = None,
                 interval: float = 0.25):
        self.count = Count()
        self.calls = calls
        self.hits: int | None = None
        self._block_hit = False
        self._tail = progress.Tail(log, self._line, interval)
        # read as it grows, never again from its start: a 10,000-object build must not reread it per object
        self._stats = progress.Tail(Path(stats_log), self._stats_line) if stats_log else None

    def _stats_line(self, line: str) -> None:
        """ccache's stats log: `# <file>`, then its counters; a file with a hit counter is a hit (the rule
        of farm.build.ccache.read_stats_log, counted as the lines come)."""
        from farm.build.ccache import HIT_COUNTERS

        if line.startswith("# "):
            self.hits, self._block_hit = self.hits or 0, False
        elif line.strip() in HIT_COUNTERS and not self._block_hit:
            self.hits, self._block_hit = (self.hits or 0) + 1, True

    def _cache_hits(self) -> int | None:
        if self._stats is not None:
            self._stats.poll()
        return self.hits

    def _line(self, line: str) -> None:
        moved = read_progress_line(line, self.count)
        if not moved and self.calls is not None and self.count.total is None:
            calls = sum(1 for _ in self.calls.glob("call.*"))   # the flags tier: nvcc calls so far
            moved, self.count.done = calls != self.count.done, max(self.count.done, calls)
        if moved:
            self.hits = self._cache_hits()
            c = self.count
            progress.emit(progress.Event("compile", "progress", done=c.done, total=c.total, unit=c.unit,
                                         current=c.current, hits=self.hits))

    def poll(self) -> None:
        """Read what the compile wrote since the last look, now (the thread does this every interval)."""
        self._tail.poll()

    def __enter__(self) -> CompileWatch:
        self._tail.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._tail.stop()
        self.hits = self._cache_hits()


# ---------------------------------------------------------------- the first error

def failure_line(log: Path) -> str:
    """What a failed compile's one-line error says: its first compiler error, else the log's last
    useful line (a setup.py that raised, a backend that refused); never the frontend's '# exit' note."""
    return first_error(log) or last_line(log, skip=lambda ln: ln.startswith("#"), limit=300)


def last_lines(log: Path, count: int = 3) -> list[str]:
    """A log's last useful lines (a failed pre_build's tail)."""
    try:
        return [ln[:300] for ln in useful_lines(log, skip=lambda ln: ln.startswith("#"))[-count:]]
    except OSError:
        return []
