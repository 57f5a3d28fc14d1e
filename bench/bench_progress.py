"""What showing a build's progress costs (design.md §6.9): a compile log of 10,000 ninja lines (the
length of torch's real `-v` command lines) and ccache's stats log of those 10,000 files through the
whole path a count takes: the step's CompileWatch parses each line, counts the cache hits so far and
appends an event to the progress file, the host's relay reads it back and the plain display
throttles it; against reading the same log and matching ninja's `[n/N]` alone (the least any
progress reader must do). The ratio's goal guards linear time: a reader that went back to a log's
start per object (the stats log once was) is thousands of times the baseline here.
"""

from __future__ import annotations

import io
import re
import tempfile
from pathlib import Path

from farm import progress
from farm.build.compilelog import CompileWatch
from farm.build.display import StepDisplay

from .figures import Figure, median_time

OBJECTS = 10_000
COMMAND = ("ccache /farm/cache/toolkits/13.0-x86_64/bin/nvcc -MD -MF /farm/work/src/build/csrc/k{n}.o.d "
           + "-I/farm/cache/envs/torch/include " * 8 + "-c -c /farm/work/src/csrc/k{n}.cu -o /farm/work/src/build/k{n}.o "
           + " ".join(f"-gencode=arch=compute_{a},code=sm_{a}" for a in (75, 80, 86, 90, 100, 120)))


def run() -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="farm-bench-progress-") as tmp:
        folder = Path(tmp)
        log = folder / "compile.log"
        log.write_text("".join(f"[{n}/{OBJECTS}] {COMMAND.format(n=n)}\n" for n in range(1, OBJECTS + 1)))
        stats = folder / "ccache-stats.log"
        stats.write_text("".join(f"# ../../csrc/k{n}.cu\n{'direct_cache_hit' if n % 2 else 'cache_miss'}\n"
                                 for n in range(1, OBJECTS + 1)))
        ninja = re.compile(r"^\[(\d+)/(\d+)\]")

        def bare() -> None:
            with open(log) as fh:
                for line in fh:
                    ninja.match(line)

        def shown() -> None:
            events = folder / progress.PROGRESS_FILE
            events.unlink(missing_ok=True)
            with progress.using(progress.FileSink(events)):
                with CompileWatch(log, str(stats), interval=3600) as watch:   # one read at the end: the same lines, no sleeping
                    pass
            display = StepDisplay(plain=True, stream=io.StringIO())
            with progress.using(display):
                relay = progress.Relay(events)
                relay.poll()
            assert watch.count.done == OBJECTS and watch.hits == OBJECTS // 2
            assert display.steps["compile"].last is not None

        baseline = median_time(bare)
        measured = median_time(shown)
    per_object_ms = 1000 * measured / OBJECTS
    return [Figure(f"progress: {OBJECTS} ninja lines counted, written, relayed and shown vs only matched",
                   measured, baseline, goal=500.0,
                   note=f"{per_object_ms:.3f} ms per object, against seconds to minutes per object compiled")]
