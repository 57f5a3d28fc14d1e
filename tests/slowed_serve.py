"""`farm serve` with its request handling slowed by 0.5 s, as issue 33's probe ran it: `python tests/slowed_serve.py
serve ...`. Both the serving loop's hand-over of a connection (where socketserver's error handler once swallowed
SIGTERM) and each handler thread wait 0.5 s; nothing else changes: the real server, real sockets, a real signal."""

from __future__ import annotations

import socketserver
import sys
import time

from farm.cli import main
from farm.wheelhouse import serve

SLOW = 0.5


def slow_down() -> None:
    """Patch this process's server (never the test's: only the script's main runs it)."""
    hand_over = socketserver.ThreadingMixIn.process_request
    handle = serve.WheelhouseHandler.handle_one_request

    def slow_hand_over(self, request, client_address):
        time.sleep(SLOW)
        return hand_over(self, request, client_address)

    def slow_handle(self):
        time.sleep(SLOW)
        return handle(self)

    socketserver.ThreadingMixIn.process_request = slow_hand_over  # type: ignore[method-assign]
    serve.WheelhouseHandler.handle_one_request = slow_handle  # type: ignore[method-assign]


if __name__ == "__main__":
    slow_down()
    sys.exit(main(sys.argv[1:]))
