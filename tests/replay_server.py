"""A real HTTP server over a folder on 127.0.0.1: the upstream replay for tests, bench and `make matrix`.

The replay lives in <project>/../shared/upstream-replay (override with
FARM_SHARED) and is never copied into the project; tests that need a changed
index copy it into a temporary folder. `statuses` makes chosen paths answer
with an HTTP error and `drop_once` drops a first request, as a broken or flaky
upstream would.

As a command: `python tests/replay_server.py [FOLDER] -- CMD ARGS...` serves
FOLDER (default: the replay) on a free port and runs CMD with `{url}` in its
arguments replaced by `http://127.0.0.1:<port>/`; exits with CMD's code.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

PROJECT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("FARM_SHARED", PROJECT.parent / "shared"))
REPLAY = SHARED / "upstream-replay"


class _Handler(SimpleHTTPRequestHandler):
    def do_GET(self):
        path = urlsplit(self.path).path
        if path in self.server.drop_once:     # close without an answer, once: a flaky connection
            self.server.drop_once.discard(path)
            self.close_connection = True
            return
        code = self.server.statuses.get(path)
        if code:
            self.send_error(code)
            return
        super().do_GET()

    def log_message(self, format, *args):   # quiet: tests read their own output
        pass


@contextlib.contextmanager
def serve(folder: Path | str = REPLAY, statuses: Mapping[str, int] | None = None,
          drop_once: Iterable[str] = ()) -> Iterator[str]:
    """Serve `folder` on a free loopback port; yields the base URL `http://127.0.0.1:<port>/`.

    `statuses`: URL path -> HTTP error code; `drop_once`: URL paths whose first request is
    dropped without an answer.
    """
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"no folder to serve: {folder}")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(folder)))
    server.statuses = dict(statuses or {})
    server.drop_once = set(drop_once)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def refused_url() -> str:
    """A loopback URL on a port where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/whl/"


def copy_replay(dest: Path) -> Path:
    """A writable copy of the replay (the shared one is read-only); returns its `whl/` folder."""
    shutil.copytree(REPLAY, dest)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return dest / "whl"


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print("usage: replay_server.py [FOLDER] -- CMD ARGS... ({url} in ARGS is the base URL)", file=sys.stderr)
        return 2
    split = argv.index("--")
    folder = Path(argv[0]) if split else REPLAY
    with serve(folder) as url:
        return subprocess.call([a.replace("{url}", url) for a in argv[split + 1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
