"""What a build tells the person watching it while it runs (design.md §6.9): the progress events.

One event is one JSON object on one line: a step starting, reporting progress, ending or
failing. The steps child (`python -m farm.build.steps`, in a container or on the host)
appends its events to `<out>/progress.jsonl`, which both runners mount, so the stream
needs nothing from the runner; `farm build` tails that file and hands each event to its
display (farm/build/display.py), beside the events of the steps it runs itself
(downloads, publish). Image set-up (farm/runners/images.py) emits the same events.

Code that has something to report calls `emit()`; where the event goes is decided by
whoever runs the build, with `using(sink)`: the display, the progress file, or nowhere
(the default, e.g. under `farm run`, which shows cells rather than steps).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

PROGRESS_FILE = "progress.jsonl"
# How far a compile is, as its build tool prints it, one line at a time: ninja's `[n/N] ...`, CMake
# Makefiles' `[ NN%] ...` (the compile log's reader counts them; its first-error reader skips them).
NINJA = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")
CMAKE_PERCENT = re.compile(r"^\[\s*(\d+)%\]\s+(.*)$")
KINDS = ("start", "progress", "end", "fail", "log")
# The steps of one cell, in the order a person sees them (prebuild only when the recipe has one).
CELL_STEPS = ("source", "downloads", "env", "toolkit", "prebuild", "compile", "label", "repair", "verify",
              "publish")


@dataclass(frozen=True)
class Event:
    """One thing a step reports. Only `step` and `kind` are always there.

    start: the step began. progress: `done` of `total` `unit` (objects, bytes, %; total None when the
    build tool does not tell), on `current` (a file), with `hits` compiler-cache hits so far. end:
    done in `seconds`. fail: after `seconds`, `error` (one line) and `lines` (the cause, e.g. the
    compiler's first error with its source excerpt). log: one line of a log streamed with -v.
    `peak_mb` on end and fail: the largest process the step had waited for so far.
    """

    step: str
    kind: str
    t: float = field(default_factory=time.time)
    seconds: float | None = None
    done: float | None = None
    total: float | None = None
    unit: str | None = None
    current: str | None = None
    hits: int | None = None
    error: str | None = None
    lines: tuple[str, ...] = ()
    peak_mb: int | None = None
    text: str | None = None

    def to_line(self) -> str:
        data = {k: v for k, v in asdict(self).items() if v not in (None, ())}
        return json.dumps(data, separators=(",", ":"), default=str) + "\n"

    @classmethod
    def from_line(cls, line: str) -> Event | None:
        """The event on one line of the progress file; None for anything else (a foreign line, a
        newer farm's kind): the display must never die of what a child wrote."""
        try:
            data = json.loads(line)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("step"), str) or data.get("kind") not in KINDS:
            return None
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        if "lines" in data:
            data["lines"] = tuple(str(x) for x in data["lines"]) if isinstance(data["lines"], list) else ()
        try:
            return cls(**data)
        except TypeError:
            return None


Sink = Callable[[Event], None]
_sink: Sink | None = None
_sink_lock = threading.Lock()


def active() -> bool:
    """Whether anything listens (a relay need not read files nobody will see)."""
    return _sink is not None


def emit(event: Event) -> None:
    """Report `event` to the current sink (nothing happens without one)."""
    sink = _sink
    if sink is not None:
        sink(event)


def send_to(sink: Sink | None) -> Sink | None:
    """Send every emit() of this process to `sink` from now on; returns the sink it replaces (to put back)."""
    global _sink
    with _sink_lock:
        before, _sink = _sink, sink
    return before


@contextmanager
def using(sink: Sink | None) -> Iterator[None]:
    """Send every emit() of this process to `sink` for the duration (threads included)."""
    global _sink
    with _sink_lock:
        before, _sink = _sink, sink
    try:
        yield
    finally:
        with _sink_lock:
            _sink = before


def _children_usage():
    """getrusage of every process this one has waited for so far (with their own waited-for
    children), or None on Windows, which has no getrusage."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_CHILDREN)


def peak_child_mb() -> int | None:
    """The largest single process this one has waited for so far (a cicc, usually): what one job peaks
    at, in MB. None on Windows."""
    usage = _children_usage()
    return usage.ru_maxrss // 1024 if usage else None


def children_cpu_s() -> float | None:
    """CPU seconds (user + system) of every process this one has waited for so far: a compile's nvcc,
    cicc, ptxas and gcc through ninja and pip. None on Windows."""
    usage = _children_usage()
    return usage.ru_utime + usage.ru_stime if usage else None


def cpu_spent_since(before: float | None) -> float | None:
    """The CPU seconds waited-for processes took since children_cpu_s() said `before`."""
    now = children_cpu_s()
    return round(now - before, 1) if now is not None and before is not None else None


_started: dict[str, float] = {}   # step -> when its latest run in this process began (monotonic)


def started(name: str) -> float | None:
    """When the latest run of step `name` began in this process (None outside one): lets a counter
    that several calls feed within one step (downloads) tell the same run from the next."""
    return _started.get(name)


@contextmanager
def step(name: str) -> Iterator[None]:
    """A step run in this process: start, then end with its time, or fail with the error's line."""
    t0 = _started[name] = time.monotonic()
    emit(Event(name, "start"))
    try:
        yield
    except Exception as exc:
        emit(Event(name, "fail", seconds=round(time.monotonic() - t0, 2), error=str(exc) or type(exc).__name__))
        raise
    emit(Event(name, "end", seconds=round(time.monotonic() - t0, 2)))


class FileSink:
    """Appends each event to a file as one line, with one write (readers take whole lines only)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        data = event.to_line().encode("utf-8")
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)


class Tail:
    """Follows a growing text file from a thread, handing each complete new line to `on_line`.

    poll() reads what is there now (call it after the writer has finished, so nothing is left
    unread); stop() ends the thread after a last poll. A file that does not exist yet is empty.
    """

    def __init__(self, path: Path, on_line: Callable[[str], None], interval: float = 0.2):
        self.path = Path(path)
        self.on_line = on_line
        self.interval = interval
        self._offset = 0
        self._partial = b""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> None:
        with self._lock:
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self._offset)
                    chunk = fh.read()
            except OSError:
                return
            self._offset += len(chunk)
            *whole, self._partial = (self._partial + chunk).split(b"\n")
            for raw in whole:
                self.on_line(raw.decode("utf-8", "replace").rstrip("\r"))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def start(self) -> Tail:
        self._thread = threading.Thread(target=self._run, name=f"tail {self.path.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.poll()

    def __enter__(self) -> Tail:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def follow_events(path: Path, sink: Sink, interval: float = 0.2) -> Tail:
    """A Tail of a progress file that hands each event on it to `sink` (not started)."""

    def on_line(line: str) -> None:
        event = Event.from_line(line)
        if event is not None:
            sink(event)

    return Tail(path, on_line, interval)


def _log_lines_of(step: str) -> Callable[[str], None]:
    return lambda text: emit(Event(step, "log", text=text))


class Relay:
    """`farm build`'s side of the stream: follows the steps child's progress file and re-emits each
    event into this process's sink, remembering which steps are still open; with `logs`
    ({step: log file}) each new line of those logs goes on as a `log` event (shown with -v)."""

    def __init__(self, path: Path, logs: dict[str, Path] | None = None, interval: float = 0.2):
        self.open: dict[str, float] = {}   # step -> when it started (monotonic)
        self._logs = {name: Tail(log, _log_lines_of(name), interval) for name, log in (logs or {}).items()}
        self._tails = [follow_events(path, self._event, interval), *self._logs.values()]

    def _event(self, event: Event) -> None:
        if event.kind == "start":
            self.open[event.step] = time.monotonic()
        elif event.kind in ("end", "fail"):
            self.open.pop(event.step, None)
            if event.step in self._logs:   # the step's last log lines come before its end
                self._logs[event.step].poll()
        emit(event)

    def poll(self) -> None:
        """Everything written so far, now: called when the child has exited, before the host goes on."""
        for tail in self._tails:
            tail.poll()

    def fail_open(self, error: str) -> None:
        """The child ended without ending its step (killed, out of memory): that step fails with `error`."""
        self.poll()
        for name, started in list(self.open.items()):
            self._event(Event(name, "fail", seconds=round(time.monotonic() - started, 2), error=error))

    def __enter__(self) -> Relay:
        for tail in self._tails:
            tail.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for tail in self._tails:
            tail.stop()
