"""What a person sees while one cell builds (design.md §6.9): the steps as they start and end, live
progress, and a summary at the end.

`Terminal` is what `farm run`'s display (farm/run/report.py) and this one share: rich on a terminal,
plain prefixed lines otherwise. `StepDisplay` is a progress sink (farm/progress.py): on a
terminal one live rich view of the running steps, with a line printed above it as each step starts
and ends; otherwise plain lines, at most one progress line every `interval` seconds per step (start
and end lines always), so a CI log of a three-hour compile stays short. quiet: nothing until the
caller prints the result; verbose: the compile log's lines too.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from farm.progress import Event

if TYPE_CHECKING:
    from rich.live import Live

PLAIN_INTERVAL = 10.0   # seconds between two plain progress lines of one step
HEARTBEAT = 60.0        # a plain line for a running step that said nothing for this long (a cold env, verify)


def fmt_s(seconds: float | None, tenths: bool = True) -> str:
    """1.2s under a minute (short steps are most of a cached build; 1s without tenths), then 4m05s, 2h03m."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s" if tenths else f"{int(seconds)}s"
    whole = int(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 60}m{whole % 60:02d}s"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class Throttle:
    """Lets a key through at most once every `interval` seconds (its first time at once)."""

    def __init__(self, interval: float = PLAIN_INTERVAL, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.clock = clock
        self._last: dict[str, float] = {}

    def ready(self, key: str) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            return False
        self._last[key] = now
        return True

    def forget(self, key: str) -> None:
        self._last.pop(key, None)


class Terminal:
    """rich on a terminal (or when plain=False), else plain lines with a prefix."""

    def __init__(self, plain: bool | None = None, stream: TextIO | None = None, prefix: str = "[farm]"):
        self.stream = stream or sys.stdout
        self.rich = (not plain) if plain is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.prefix = prefix
        if self.rich:
            from rich.console import Console

            self.console = Console(file=self.stream)

    def line(self, text: str) -> None:
        if self.rich:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self.stream.write(f"{self.prefix} {text}\n")
            self.stream.flush()


def describe(event: Event | None, current: bool = True) -> str:
    """A progress event in words: `2/3 objects, csrc/reduce.cu, 1 cache hit`, `412.0 MB of 904.0 MB, torch-...`;
    without the current file for a step's end line."""
    if event is None:
        return ""
    parts = []
    if event.unit == "bytes":
        parts.append(f"{fmt_bytes(event.done)} of {fmt_bytes(event.total)}" if event.total else fmt_bytes(event.done))
    elif event.unit == "%" and event.done is not None:
        parts.append(f"{event.done:.0f}%")
    elif event.done is not None:
        counted = f"{event.done:.0f}/{event.total:.0f}" if event.total else f"{event.done:.0f}"
        parts.append(f"{counted} {event.unit or ''}".rstrip())
    if event.current and current:
        parts.append(event.current)
    if event.hits is not None:
        parts.append(f"{event.hits} cache hit{'s' if event.hits != 1 else ''}")
    return ", ".join(parts)


@dataclass
class StepState:
    name: str
    started: float
    status: str = "running"          # running | done | failed
    seconds: float | None = None
    earlier: float = 0.0             # the seconds of its earlier runs (env and toolkit run once per phase)
    this_run: float = 0.0
    last: Event | None = None        # the latest progress event
    peak_mb: int | None = None
    error: str | None = None
    lines: tuple[str, ...] = ()


@dataclass
class Outcome:
    """What the summary says beyond what the display saw: filled by the caller from the build's files."""

    title: str                                  # `<cell id>: built`, `<cell id>: failed at compile`
    wheel: Path | None = None
    arch_list: str | None = None
    sass: list[str] = field(default_factory=list)
    ptx: list[str] = field(default_factory=list)
    cache: dict[str, Any] | None = None                   # {hits, misses} of the compiler cache
    logs: list[Path] = field(default_factory=list)
    extra: list[tuple[str, str]] = field(default_factory=list)


class StepDisplay(Terminal):
    """The progress sink `farm build`, `farm demo` and `farm images build` use (see the module doc)."""

    def __init__(self, plain: bool | None = None, stream: TextIO | None = None, *, quiet: bool = False, verbose: bool = False,
                 interval: float = PLAIN_INTERVAL, prefix: str = "[farm build]",
                 clock: Callable[[], float] = time.monotonic, heartbeat: float = HEARTBEAT):
        super().__init__(plain, stream, prefix)
        self.quiet, self.verbose = quiet, verbose
        self.throttle = Throttle(interval, clock)
        self.clock = clock
        self.steps: dict[str, StepState] = {}
        self._lock = threading.RLock()
        self._live: Live | None = None
        self._last_refresh = 0.0
        self.heartbeat = heartbeat
        self._said: dict[str, float] = {}   # step -> when its last plain line was printed
        self._beating: threading.Thread | None = None
        self._stop_beating = threading.Event()

    # ----- the sink
    def __call__(self, event: Event) -> None:
        with self._lock:
            getattr(self, f"_on_{event.kind}")(event)

    def _on_start(self, event: Event) -> None:
        # A step run again (env and toolkit, once per phase) keeps its place in the summary, and its time
        # there is the sum of its runs; its lines say each run's own time.
        before = self.steps.get(event.step)
        earlier = (before.seconds or 0.0) if before and before.status != "running" else 0.0
        self.steps[event.step] = StepState(event.step, started=self.clock(), earlier=earlier)
        self.throttle.forget(event.step)
        self._refresh(force=True)   # the live view first, so the line printed above it is not followed by a stale one
        self._say(f"{event.step}: start", event.step)
        if not self.rich and not self.quiet and self._beating is None:
            self._beating = threading.Thread(target=self._beat, name="build display heartbeat", daemon=True)
            self._beating.start()

    def _on_progress(self, event: Event) -> None:
        state = self.steps.get(event.step) or self.steps.setdefault(event.step, StepState(event.step, self.clock()))
        previous, state.last = state.last, event
        if self.quiet:
            return
        if self.rich:
            # Each new count is drawn at least once, however quickly the next one comes.
            self._refresh(force=previous is None or previous.done != event.done)
        elif self.throttle.ready(event.step):
            self._say(f"{event.step}: {describe(event)}", event.step)

    def _on_end(self, event: Event) -> None:
        state = self._finish(event, "done")
        detail = describe(state.last, current=False)
        self._say(f"{event.step}: done in {fmt_s(state.this_run)}" + (f" ({detail})" if detail else ""))

    def _on_fail(self, event: Event) -> None:
        state = self._finish(event, "failed")
        state.error, state.lines = event.error, event.lines
        self._say(f"{event.step}: failed after {fmt_s(state.this_run)}: {event.error}")

    def _on_log(self, event: Event) -> None:
        if self.verbose and not self.quiet and event.text is not None:
            if self.rich:
                self.console.print(event.text, markup=False, highlight=False, soft_wrap=True)
            else:
                self.stream.write(event.text + "\n")
                self.stream.flush()

    def _finish(self, event: Event, status: str) -> StepState:
        state = self.steps.get(event.step) or self.steps.setdefault(event.step, StepState(event.step, self.clock()))
        state.status = status
        state.this_run = event.seconds if event.seconds is not None else self.clock() - state.started
        state.seconds = state.earlier + state.this_run
        state.peak_mb = event.peak_mb
        self._refresh(force=True)
        return state

    def _beat(self) -> None:
        """Plain mode: a running step that printed nothing for `heartbeat` seconds says it still runs."""
        while not self._stop_beating.wait(self.heartbeat / 4):
            with self._lock:
                now = self.clock()
                for state in self.steps.values():
                    if state.status == "running" and now - self._said.get(state.name, now) >= self.heartbeat:
                        detail = describe(state.last)
                        self._say(f"{state.name}: running for {fmt_s(now - state.started)}"
                                  + (f" ({detail})" if detail else ""), state.name)

    # ----- output
    def _say(self, text: str, step: str | None = None) -> None:
        if not self.quiet:
            self.line(text)
            if step is not None:
                self._said[step] = self.clock()

    def line(self, text: str) -> None:
        if self.quiet:
            return
        if self.rich:
            self._ensure_live()
        super().line(text)

    def _ensure_live(self) -> None:
        if self._live is None and self.rich and not self.quiet:
            from rich.live import Live

            self._live = Live(get_renderable=self._renderable, console=self.console, refresh_per_second=4,
                              transient=True)
            self._live.start()

    def _refresh(self, force: bool = False) -> None:
        if not self.rich or self.quiet:
            return
        self._ensure_live()
        now = time.monotonic()
        if self._live is not None and (force or now - self._last_refresh >= 0.1):
            self._last_refresh = now
            self._live.refresh()

    def _renderable(self) -> Any:
        from rich.spinner import Spinner
        from rich.table import Table

        table = Table.grid(padding=(0, 1))
        for state in self.steps.values():
            if state.status == "running":
                table.add_row(Spinner("dots"), state.name, fmt_s(self.clock() - state.started),
                              describe(state.last))
        return table

    def close(self) -> None:
        self._stop_beating.set()
        if self._beating is not None:
            self._beating.join()
            self._beating, self._stop_beating = None, threading.Event()   # a later step may beat again
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None

    # ----- the end
    def summary_lines(self, outcome: Outcome) -> list[str]:
        out = [outcome.title]

        def row(key: str, value: str) -> None:
            out.append(f"  {key + ':':<13} {value}")

        if outcome.wheel is not None:
            size = outcome.wheel.stat().st_size if outcome.wheel.exists() else None
            row("wheel", f"{outcome.wheel} ({fmt_bytes(size)})")
        if outcome.arch_list:
            row("arch list", outcome.arch_list)
        if outcome.sass or outcome.ptx:
            row("found", f"SASS {' '.join(outcome.sass) or '-'}; PTX {' '.join(outcome.ptx) or '-'}")
        if self.steps:
            row("steps", ", ".join(f"{s.name} {fmt_s(s.seconds)}" + ("" if s.status == "done" else f" ({s.status})")
                                   for s in self.steps.values()))
        peak = max((s.peak_mb for s in self.steps.values() if s.peak_mb), default=None)
        if peak:
            row("peak memory", f"{peak} MB (the largest process)")
        cache = outcome.cache or {}
        hits = cache.get("hits")
        if hits is None:   # no record (a failed compile): the count the compile showed last
            hits = next((s.last.hits for s in self.steps.values() if s.last and s.last.hits is not None), None)
        if hits is not None:
            misses = cache.get("misses")
            row("cache", f"{hits} hit{'s' if hits != 1 else ''}" + (f", {misses} misses" if misses is not None else ""))
        for key, value in outcome.extra:
            row(key, value)
        if outcome.logs:
            row("logs", ", ".join(str(p) for p in outcome.logs if p.exists()) or "-")
        failed = next((s for s in self.steps.values() if s.status == "failed"), None)
        if failed is not None:
            # the cause as its tool printed it when the step found one (the error line above already
            # said the rest), else the step's one-line error
            row("failed", f"{failed.name} after {fmt_s(failed.seconds)}" + ("" if failed.lines else f": {failed.error}"))
            out.extend(f"    {ln}" for ln in failed.lines)
        return out

    def summary(self, outcome: Outcome) -> None:
        self.close()
        if self.quiet:
            return
        for text in self.summary_lines(outcome):
            super().line(text)
