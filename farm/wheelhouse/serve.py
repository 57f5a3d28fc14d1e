"""`farm serve`: the wheelhouse over HTTP, loopback by default (design.md §9.7).

A static file server with three additions an index needs:
- PEP 691 content negotiation: a project or root folder answers with its
  `index.json` when the Accept header prefers `application/vnd.pypi.simple.v1+json`
  (pip and uv do), else with `index.html`; `Vary: Accept` always;
- a non-normalised project folder (`/simple/My_Pkg/`) redirects to its PEP 503 name;
- dot-files (temporaries of a publish in flight, the lock) are never served.
Each request is one access-log line (common log format + Accept) to stderr or a file.

Only regular files whose real path is inside the wheelhouse, with no dot-name on the way from
its root, are served: a symlink that leads out or to a dot-file, a FIFO or a device is a 404. A hostile request (NUL, '..', bad percent-encoding,
a component over NAME_MAX, thousands of components, a request line over MAX_REQUEST_LINE)
gets a 400, 404 or 414 and the connection ends cleanly, never a traceback.

Slow and half-open clients are bounded: a request head must be whole HEAD_TIMEOUT after the
connection was accepted (a 408 then), however slowly it trickles in; any later read or write may
stall IDLE_TIMEOUT; at most MAX_CLIENTS connections have a thread, and a new one past that takes
the slot of the oldest still sending its head (a 503 only when every slot is past its head).
SIGTERM and Ctrl-C are taken by sigwait in the main thread, never raised inside the serving code,
so where they land cannot matter (design.md §9.7).
"""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import stat
import sys
import threading
import time
from datetime import datetime, timezone
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, unquote_to_bytes, urlsplit

from farm.errors import BadInput, FarmError
from farm.wheelhouse.manifest import house_folder
from farm.wheelhouse.names import normalize
from farm.wheelhouse.offers import ChannelOffer, channel_offers

JSON_V1 = "application/vnd.pypi.simple.v1+json"
HTML_V1 = "application/vnd.pypi.simple.v1+html"
# Limits far above any real index URL (the deepest is /compat/comfy-env/<name>/<file>): a request
# past them is refused before the file system sees it.
MAX_REQUEST_LINE = 8192
MAX_REQUEST_HEAD = 1 << 20       # what is read and dropped after an over-long line, to close cleanly
NAME_MAX = 255
MAX_COMPONENTS = 32
HEAD_TIMEOUT = 5.0     # seconds from the accept to a whole request head (pip sends it in one write)
IDLE_TIMEOUT = 30.0    # seconds any later read or write may make no progress (a download stalled)
MAX_CLIENTS = 64       # connections with a handler thread
CLOSE_WAIT = 0.25      # seconds a stop waits for the threads of the connections it cut
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_BAD_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")
_OFFERS = {JSON_V1: "json", "application/vnd.pypi.simple.latest+json": "json",
           HTML_V1: "html", "application/vnd.pypi.simple.latest+html": "html", "text/html": "html"}


def negotiate(accept: str | None) -> tuple[str, str] | None:
    """(format, content type) preferred by an Accept header among what a PEP 691 index serves.

    Highest q wins; on a tie the order in the header decides. No header or */*
    gives HTML. None when nothing acceptable is offered (406).
    """
    if not accept:
        return ("html", "text/html; charset=utf-8")
    best = None
    for pos, part in enumerate(accept.split(",")):
        fields = [f.strip() for f in part.split(";")]
        mtype, q = fields[0].lower(), 1.0
        for f in fields[1:]:
            if f.startswith("q="):
                try:
                    q = float(f[2:])
                except ValueError:
                    q = 0.0
        if q <= 0:
            continue
        if mtype in _OFFERS:
            fmt, ctype = _OFFERS[mtype], (JSON_V1 if _OFFERS[mtype] == "json" else
                                          (HTML_V1 if mtype.startswith("application/") else "text/html; charset=utf-8"))
        elif mtype in ("*/*", "text/*"):
            fmt, ctype = "html", "text/html; charset=utf-8"
        else:
            continue
        if best is None or q > best[0]:
            best = (q, pos, fmt, ctype)
    return (best[2], best[3]) if best else None


class WheelhouseHandler(SimpleHTTPRequestHandler):
    server_version = "farm-wheelhouse/1"
    negotiate_json = True
    log_stream = sys.stderr
    log_lock = threading.Lock()
    timeout = IDLE_TIMEOUT  # a client that stops reading does not hold its thread for ever
    # Errors found before the version is parsed (a bad version itself) get a status line, not
    # HTTP/0.9's bare body; no client of an index speaks 0.9.
    default_request_version = "HTTP/1.0"
    server: WheelhouseServer

    def __init__(self, *args: Any, directory: str, **kwargs: Any):
        super().__init__(*args, directory=directory, **kwargs)

    def setup(self) -> None:
        super().setup()
        self.rfile.close()   # the plain reader: the one below also keeps the head's deadline
        self.head_clock = _HeadClock(self.connection, self.server.head_deadline(self.connection))
        self.rfile = io.BufferedReader(self.head_clock)

    def handle_one_request(self) -> None:
        """BaseHTTPRequestHandler's, with a request line limit of MAX_REQUEST_LINE (not 64 kB) and
        the rest of an over-long request read and dropped, so the 414 reaches the client before the
        close (closing on unread bytes would reset the connection). A head not whole by its
        deadline gets a 408."""
        try:
            self.raw_requestline = self.rfile.readline(MAX_REQUEST_LINE + 1)
            if len(self.raw_requestline) > MAX_REQUEST_LINE:
                self.requestline = self.request_version = self.command = ""
                self._drop_request_head()
                self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG,
                                f"the request line is over {MAX_REQUEST_LINE} bytes")
                self.close_connection = True
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return
            self.head_clock.deadline = None
            self.connection.settimeout(IDLE_TIMEOUT)
            self.server.head_received(self.connection)
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                self.send_error(HTTPStatus.NOT_IMPLEMENTED, f"unsupported method {self.command[:40]!r}")
                return
            method()
            self.wfile.flush()
        except _HeadTimeout:
            self.close_connection = True
            self.requestline = self.request_version = self.command = ""
            try:
                self.send_error(HTTPStatus.REQUEST_TIMEOUT, f"no whole request head within {HEAD_TIMEOUT:g} s")
            except OSError:
                pass
        except (TimeoutError, ConnectionError):
            self.close_connection = True

    def _drop_request_head(self) -> None:
        """Read what is left of the request head (up to MAX_REQUEST_HEAD, a short wait at most)."""
        self.head_clock.deadline = min(self.head_clock.deadline or float("inf"), time.monotonic() + 0.5)
        seen = 0
        try:
            while seen < MAX_REQUEST_HEAD:
                line = self.rfile.readline(65536)
                seen += len(line)
                if line in (b"", b"\r\n", b"\n"):
                    break
        except OSError:
            pass

    def _local_path(self) -> Path | int:
        """The file system path a request names, or the HTTP status refusing it."""
        raw = urlsplit(self.path).path.encode("latin-1", "replace")
        if not raw.startswith(b"/") or _BAD_PERCENT.search(raw):
            return HTTPStatus.BAD_REQUEST
        try:
            path = unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            return HTTPStatus.BAD_REQUEST
        parts = [p for p in path.split("/") if p]
        if "\0" in path or "\\" in path or any(p in (".", "..") for p in parts):
            return HTTPStatus.BAD_REQUEST
        if len(parts) > MAX_COMPONENTS or any(len(p.encode()) > NAME_MAX for p in parts):
            return HTTPStatus.REQUEST_URI_TOO_LONG
        if any(p.startswith(".") for p in parts):  # a publish's temporaries, the lock
            return HTTPStatus.NOT_FOUND
        return Path(self.directory, *parts)

    def _inside(self, fs: Path) -> str | None:
        """The real path of `fs` when it exists inside the wheelhouse, else None."""
        try:
            real = os.path.realpath(fs, strict=True)
        except (OSError, ValueError):
            return None
        root = self.directory.rstrip(os.sep)
        if real == root:
            return real
        if not real.startswith(root + os.sep):
            return None
        # The dot rule again on where a link led: an in-house link to the lock or a temporary is a 404 too.
        return None if any(p.startswith(".") for p in real[len(root) + 1:].split(os.sep)) else real

    def send_head(self) -> BinaryIO | None:   # None: answered already
        fs = self._local_path()
        if isinstance(fs, int):
            self.send_error(fs)
            return None
        path = urlsplit(self.path).path
        real = self._inside(fs)
        if real is None:
            parts = [p for p in path.split("/") if p]
            if path.endswith("/") and len(parts) >= 2:
                fixed = normalize(parts[-1])
                if fixed != parts[-1] and self._inside(fs.parent / fixed) and (fs.parent / fixed).is_dir():
                    self._redirect("/" + "/".join(parts[:-1] + [fixed]) + "/")
                    return None
            self.send_error(HTTPStatus.NOT_FOUND)
            return None
        if os.path.isdir(real):
            if not path.endswith("/"):
                self._redirect(path + "/")
                return None
            return self._send_index(Path(real))
        return self._send_file(real, self.guess_type(real))

    def _redirect(self, location: str) -> None:
        self.send_response(HTTPStatus.MOVED_PERMANENTLY)
        self.send_header("Location", quote(location, safe="/%"))   # the request's path is quoted already
        self.send_header("Content-Length", "0")
        self.end_headers()
        return None

    def _open_regular(self, real: str) -> BinaryIO | None:
        """An open regular file at `real` (no symlink in its last step, no FIFO that would block), or None."""
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return os.fdopen(fd, "rb")

    def _send_file(self, real: str, ctype: str, extra: dict[str, Any] | None = None) -> BinaryIO | None:
        fh = self._open_regular(real)
        if fh is None:
            self.send_error(HTTPStatus.NOT_FOUND)
            return None
        st = os.fstat(fh.fileno())
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(st.st_size))
        self.send_header("Last-Modified", self.date_time_string(st.st_mtime))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        return fh

    def _send_index(self, folder: Path) -> BinaryIO | None:
        choice = negotiate(self.headers.get("Accept")) if self.negotiate_json else ("html", "text/html; charset=utf-8")
        if choice is None:
            self.send_error(HTTPStatus.NOT_ACCEPTABLE, "serves application/vnd.pypi.simple.v1+json or text/html")
            return None
        fmt, ctype = choice
        page = self._inside(folder / "index.json") if fmt == "json" else None
        if page is None:  # HTML asked for, or not a PEP 503 page (e.g. the site root): HTML only
            page = self._inside(folder / "index.html")
            if fmt == "json":
                ctype = "text/html; charset=utf-8"
        if page is None:
            self.send_error(HTTPStatus.NOT_FOUND)
            return None
        return self._send_file(page, ctype, {"Vary": "Accept", "Cache-Control": "max-age=60"})

    def guess_type(self, path: str | os.PathLike[str]) -> str:
        name = str(path)
        if name.endswith((".whl", ".metadata")):
            return "application/octet-stream"
        return super().guess_type(path)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if isinstance(code, HTTPStatus):
            code = code.value
        stamp = datetime.now(timezone.utc).strftime("%d/%b/%Y:%H:%M:%S +0000")
        # A request refused before its headers were read (414, a bad request line) has none.
        headers = getattr(self, "headers", None)
        accept = _printable(headers.get("Accept", "-"), 200) if headers else "-"
        agent = _printable(headers.get("User-Agent", "-"), 80) if headers else "-"
        line = (f'{self.client_address[0]} - - [{stamp}] "{_printable(self.requestline, 1000)}" {code} {size} '
                f'"{accept}" "{agent}"\n')
        with self.log_lock:
            if not getattr(self.server, "closed", False):
                self.log_stream.write(line)
                self.log_stream.flush()

    def log_error(self, format: str, *args: Any) -> None:  # the request line is logged once by log_request
        pass


class _HeadTimeout(TimeoutError):
    """The request head was not whole by its deadline."""


class _HeadClock(io.RawIOBase):
    """A connection's bytes, read so that the request head is due by `deadline` (time.monotonic())
    however slowly it trickles in: a timeout per read alone lets a byte every few seconds hold a
    thread for ever. The handler sets `deadline` to None once the head is parsed."""

    def __init__(self, sock: socket.socket, deadline: float):
        super().__init__()
        self.sock = sock
        self.deadline: float | None = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        if self.deadline is None:
            return self.sock.recv_into(buf)
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _HeadTimeout
        self.sock.settimeout(min(left, IDLE_TIMEOUT))
        try:
            return self.sock.recv_into(buf)
        except TimeoutError:
            if time.monotonic() >= self.deadline:
                raise _HeadTimeout from None
            raise


class WheelhouseServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a bounded set of connections, each known with its accept time and
    whether its head is in; server_close() also ends the connections still open (design.md §9.7)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = MAX_CLIENTS

    def __init__(self, *args: Any, **kwargs: Any):
        self.closed = False
        self._clients: dict[socket.socket, list[Any]] = {}   # connection -> [accepted at, head still due]
        self._clients_changed = threading.Condition()
        super().__init__(*args, **kwargs)

    def head_deadline(self, conn: socket.socket) -> float:
        with self._clients_changed:
            client = self._clients.get(conn)
        return (client[0] if client else time.monotonic()) + HEAD_TIMEOUT

    def head_received(self, conn: socket.socket) -> None:
        with self._clients_changed:
            if conn in self._clients:
                self._clients[conn][1] = False

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._clients_changed:
            room = len(self._clients) < MAX_CLIENTS or self._evict_slowest_head()
            if room:
                self._clients[request] = [time.monotonic(), True]
        if not room:   # every slot is a request past its head: ask the client to come back
            try:
                request.settimeout(0.5)
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def _evict_slowest_head(self) -> bool:
        """Cut the connection that has waited longest for its head, if any (the lock is held)."""
        waiting = [(accepted, conn) for conn, (accepted, head_due) in self._clients.items() if head_due]
        if not waiting:
            return False
        conn = min(waiting, key=lambda item: item[0])[1]
        del self._clients[conn]   # its thread ends on the closed socket at once
        _cut(conn)
        return True

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, conn: socket.socket) -> None:
        with self._clients_changed:
            self._clients.pop(conn, None)
            self._clients_changed.notify_all()

    def server_close(self) -> None:
        """Close the listening socket, then every open connection; wait a moment (CLOSE_WAIT) for their threads
        to log their last line, then silence the log: a thread still busy past that writes nothing more."""
        super().server_close()
        with self._clients_changed:
            for conn in self._clients:
                _cut(conn)
            self._clients_changed.wait_for(lambda: not self._clients, timeout=CLOSE_WAIT)
        with WheelhouseHandler.log_lock:
            self.closed = True


def _cut(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _printable(text: str, limit: int) -> str:
    """A client's text as one log line shows it: control characters escaped, cut at `limit`."""
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text[:limit])
    return text.replace('"', '\\"')


def make_server(wheelhouse: Path | str, host: str = "127.0.0.1", port: int = 0, access_log: Path | str | None = None,
                negotiate: bool = True) -> WheelhouseServer:
    """A ready server (not yet serving); `server.server_address[1]` is the port."""
    class Handler(WheelhouseHandler):   # one class per server: log_stream is set on it below
        negotiate_json = negotiate

    handler_cls = Handler
    handler = partial(handler_cls, directory=str(Path(wheelhouse).resolve()))
    server = WheelhouseServer((host, port), handler)
    # Opened once the port is ours: a refused start leaves no log file behind.
    try:
        handler_cls.log_stream = open(access_log, "a", buffering=1) if access_log else sys.stderr
    except OSError as exc:
        server.server_close()
        raise BadInput("command line", "--access-log", access_log, f"cannot append to it: {exc.strerror}") from None
    return server


def house_offers(root: Path) -> dict[str, ChannelOffer]:
    """What each channel of the house at `root` serves, read from its journal (nothing written)."""
    from farm.wheelhouse.index import Config, channel_lines
    from farm.wheelhouse.journalindex import JournalIndex

    idx = JournalIndex.load(root)
    try:
        live = {p: s for p, s in idx.summaries.items() if s.folders}
        return channel_offers(live, channel_lines(live.values(), Config.load(root)))
    finally:
        idx.close()


def startup_lines(root: Path, base_url: str) -> list[str]:
    """Per channel: which Pythons and platforms it serves, and a pip line that installs from it as
    served here (design.md §9.7). A journal that cannot be read costs these lines, never the serving."""
    try:
        offers = house_offers(root)
    except (FarmError, OSError) as exc:
        return [f"channels: not listed ({exc})"]
    if not offers:
        return ["channels: none yet (nothing published)"]
    out = []
    for offer in offers.values():
        pip, _ = offer.lines(base_url)
        out += [f"{offer.path} serves {offer.serves()} ({offer.projects} project(s))", f"  {pip}"]
    return out


def serve(wheelhouse: Path | str, host: str = "127.0.0.1", port: int = 8000, access_log: Path | str | None = None,
          negotiate: bool = True) -> None:
    """Serve until SIGTERM or Ctrl-C; both end it within one poll (0.1 s), in-flight downloads cut off.

    The stop signals are blocked before any thread starts, so every thread inherits the mask and
    the main thread alone takes them, with sigwait: none is ever raised inside the serving code
    (where socketserver's error handler would swallow it and serve on)."""
    root = house_folder(wheelhouse)   # serving never makes a house: only publish does
    try:
        server = make_server(root, host, port, access_log, negotiate)
    except OSError as exc:  # port taken, privileged, host unknown
        raise BadInput("command line", "--port", port,
                       f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    shown_host = f"[{host}]" if ":" in host else host
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    failed: list[BaseException] = []

    def loop() -> None:
        try:
            server.serve_forever(poll_interval=0.1)
        except BaseException as exc:  # handed to the main thread, which stops and raises it
            failed.append(exc)

    serving = threading.Thread(target=loop, name="farm-serve")
    try:
        serving.start()
        base = f"http://{shown_host}:{server.server_address[1]}/"
        print(f"serving {root} on {base}", flush=True)
        for line in startup_lines(root, base):
            print(line, flush=True)
        while serving.is_alive() and signal.sigtimedwait(STOP_SIGNALS, 0.5) is None:
            pass
    finally:
        if serving.ident is not None:
            server.shutdown()
        server.server_close()
        while signal.sigtimedwait(STOP_SIGNALS, 0) is not None:  # a second signal: the stop is under way
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    if failed:
        raise failed[0]
