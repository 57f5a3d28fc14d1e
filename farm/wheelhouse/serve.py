"""`farm serve`: the wheelhouse over HTTP, loopback by default (SPEC 10).

A static file server with three additions an index needs:
- PEP 691 content negotiation: a project or root folder answers with its
  `index.json` when the Accept header prefers `application/vnd.pypi.simple.v1+json`
  (pip and uv do), else with `index.html`; `Vary: Accept` always;
- a non-normalised project folder (`/simple/My_Pkg/`) redirects to its PEP 503 name;
- dot-files (temporaries of a publish in flight, the lock) are never served.
Each request is one access-log line (common log format + Accept) to stderr or a file.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import datetime, timezone
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from .names import normalize

JSON_V1 = "application/vnd.pypi.simple.v1+json"
HTML_V1 = "application/vnd.pypi.simple.v1+html"
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

    def __init__(self, *args, directory: str, **kwargs):
        super().__init__(*args, directory=directory, **kwargs)

    def send_head(self):
        path = unquote(urlsplit(self.path).path)
        parts = [p for p in path.split("/") if p]
        if any(p.startswith(".") for p in parts):
            self.send_error(HTTPStatus.NOT_FOUND)
            return None
        fs = Path(self.translate_path(self.path))
        if fs.is_dir() and path.endswith("/"):
            return self._send_index(fs)
        if not fs.exists() and len(parts) >= 2 and path.endswith("/"):
            fixed = normalize(parts[-1])
            if fixed != parts[-1] and (fs.parent / fixed).is_dir():
                self.send_response(HTTPStatus.MOVED_PERMANENTLY)
                self.send_header("Location", quote("/" + "/".join(parts[:-1] + [fixed]) + "/"))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
        return super().send_head()

    def _send_index(self, folder: Path):
        choice = negotiate(self.headers.get("Accept")) if self.negotiate_json else ("html", "text/html; charset=utf-8")
        if choice is None:
            self.send_error(HTTPStatus.NOT_ACCEPTABLE, "serves application/vnd.pypi.simple.v1+json or text/html")
            return None
        fmt, ctype = choice
        page = folder / "index.json" if fmt == "json" else folder / "index.html"
        if fmt == "json" and not page.is_file():  # not a PEP 503 page (e.g. the site root): HTML only
            page, ctype = folder / "index.html", "text/html; charset=utf-8"
        try:
            fh = open(page, "rb")
        except OSError:
            self.send_error(HTTPStatus.NOT_FOUND)
            return None
        st = os.fstat(fh.fileno())
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(st.st_size))
        self.send_header("Vary", "Accept")
        self.send_header("Cache-Control", "max-age=60")
        self.end_headers()
        return fh

    def guess_type(self, path):
        name = str(path)
        if name.endswith((".whl", ".metadata")):
            return "application/octet-stream"
        return super().guess_type(path)

    def log_request(self, code="-", size="-"):
        if isinstance(code, HTTPStatus):
            code = code.value
        stamp = datetime.now(timezone.utc).strftime("%d/%b/%Y:%H:%M:%S +0000")
        accept = self.headers.get("Accept", "-") if self.headers else "-"
        agent = self.headers.get("User-Agent", "-") if self.headers else "-"
        line = (f'{self.client_address[0]} - - [{stamp}] "{self.requestline}" {code} {size} '
                f'"{accept}" "{agent[:80]}"\n')
        with self.log_lock:
            self.log_stream.write(line)
            self.log_stream.flush()

    def log_error(self, format, *args):  # the request line is logged once by log_request
        pass


def make_server(wheelhouse, host: str = "127.0.0.1", port: int = 0, access_log=None,
                negotiate: bool = True) -> ThreadingHTTPServer:
    """A ready server (not yet serving); `server.server_address[1]` is the port."""
    stream = open(access_log, "a", buffering=1) if access_log else sys.stderr
    handler_cls = type("Handler", (WheelhouseHandler,), {"negotiate_json": negotiate, "log_stream": stream})
    handler = partial(handler_cls, directory=str(Path(wheelhouse).resolve()))
    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve(wheelhouse, host: str = "127.0.0.1", port: int = 8000, access_log=None, negotiate: bool = True) -> None:
    root = Path(wheelhouse)
    root.mkdir(parents=True, exist_ok=True)
    server = make_server(root, host, port, access_log, negotiate)
    shown_host = f"[{host}]" if ":" in host else host
    print(f"serving {root} on http://{shown_host}:{server.server_address[1]}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
