"""`farm serve` against hostile requests and a hostile wheelhouse, as a real process on 127.0.0.1.

Malformed request lines go over raw sockets (no client library would send them); every
answer must be a status line, then EOF: never a traceback, never a reset, and the
server keeps serving. Symlinks planted in the wheelhouse that lead out of it, a FIFO,
and every spelling of `..` must not reach a byte outside. `--port` refusals are one
line, exit 2, nothing written; SIGTERM ends the server within a second, also while requests
are mid-way; half-sent and trickling requests are closed once their head is overdue and never
keep a whole request from its answer.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from farmcli import run_farm
from hostile import assert_one_line_refusal, tree_state
from slowed_serve import SLOW
from wheelhouse_fixtures import FARM, REPO, make_wheel

from farm.wheelhouse import publish
from farm.wheelhouse.serve import HEAD_TIMEOUT, MAX_CLIENTS, MAX_REQUEST_LINE

SECRET = b"farm-serve-secret-outside-the-wheelhouse"


@contextlib.contextmanager
def farm_serve(house: Path, *extra: str, farm: tuple[str, ...] = tuple(FARM)):
    """The real `farm serve --port 0`; yields (process, port). Its stderr is checked for tracebacks."""
    proc = subprocess.Popen([*farm, "serve", "--wheelhouse", str(house), "--port", "0", *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"on http://127\.0\.0\.1:(\d+)/", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        yield proc, int(m.group(1))
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def hostile_house(tmp_path_factory):
    """A published wheelhouse with traps planted in it, and a secret next to it; yields (house, port, wheel)."""
    tmp = tmp_path_factory.mktemp("hostile-serve")
    wheel = make_wheel(tmp / "in")
    house = tmp / "wh"
    publish([wheel], house)
    (tmp / "secret.txt").write_bytes(SECRET)
    (house / "files/x").mkdir()
    (house / "files/x/y.whl").symlink_to("/etc/passwd")                   # the probe's case
    (house / "files/x/secret.whl").symlink_to(tmp / "secret.txt")         # out, by an absolute link
    (house / "files/x/up.whl").symlink_to("../../../secret.txt")          # out, by a relative link
    (house / "files/out").symlink_to(tmp)                                 # a folder link out
    (house / "files/x/inside.whl").symlink_to(house / "files/drtk" / wheel.name)  # stays inside: served
    (house / "files/drtk/.partial.whl").write_bytes(SECRET)               # a publish in flight
    os.mkfifo(house / "files/x/pipe.whl")                                 # would block a naive open()
    (house / "files/x/sub").mkdir()
    (house / "files/x/lock.whl").symlink_to(house / ".lock")                # in-house links to dot-files
    (house / "files/x/partial.whl").symlink_to("../drtk/.partial.whl")
    (house / "files/x/dotdir").symlink_to(house / "files/drtk/.staging")
    (house / "files/drtk/.staging").mkdir()
    (house / "files/drtk/.staging/index.html").write_bytes(SECRET)
    (house / "files/x/with space").mkdir()
    (house / "files/x/sub/index.html").symlink_to(tmp / "secret.txt")     # an index page leading out
    log = tmp / "access.log"
    with farm_serve(house, "--access-log", str(log)) as (proc, port):
        yield house, port, wheel, log
        assert proc.poll() is None, "the server died"
    tail = proc.stderr.read()
    assert "Traceback" not in tail and "Exception" not in tail, tail[-3000:]


def raw_request(port: int, data: bytes, timeout: float = 10) -> tuple[int | None, bytes]:
    """Send `data` on a fresh connection, read to EOF; (status, whole response). A reset fails the test."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):  # ConnectionResetError here: the server dropped us unread
            chunks.append(chunk)
    reply = b"".join(chunks)
    m = re.match(rb"HTTP/1\.[01] (\d{3}) ", reply)
    return (int(m.group(1)) if m else None), reply


def line(target: bytes, method: bytes = b"GET", version: bytes = b"HTTP/1.0") -> bytes:
    return method + b" " + target + b" " + version + b"\r\nHost: 127.0.0.1\r\n\r\n"


# (id, raw request, status)
HOSTILE_REQUESTS = [
    ("percent-NUL", line(b"/%00"), 400),
    ("percent-NUL-in-file", line(b"/files/drtk/x.whl%00.html"), 400),
    ("raw-NUL", line(b"/\x00"), 400),
    ("component-over-255", line(b"/" + b"a" * 300), 414),
    ("file-name-over-255", line(b"/files/drtk/" + b"b" * 256 + b".whl"), 414),
    ("5000-components", line(b"/a" * 5000), 414),
    ("40-components", line(b"/a" * 40), 414),
    ("70kB-request-line", line(b"/" + b"c" * 70_000), 414),
    ("line-just-over-the-limit", line(b"/" + b"d" * MAX_REQUEST_LINE), 414),
    ("70kB-line-without-end", b"GET /" + b"e" * 70_000, 414),
    ("bad-method", line(b"/", method=b"BREW"), 501),
    ("control-char-method", line(b"/", method=b"G\x01T"), 501),
    ("bad-version", line(b"/", version=b"HTTP/9.9"), 505),
    ("not-http", line(b"/", version=b"FOO/1.0"), 400),
    ("percent-not-hex", line(b"/files/%zz"), 400),
    ("percent-truncated", line(b"/files/%e"), 400),
    ("percent-not-utf8", line(b"/%ff%fe"), 400),
    ("dotdot", line(b"/../secret.txt"), 400),
    ("dotdot-deep", line(b"/files/drtk/../../../secret.txt"), 400),
    ("dotdot-encoded", line(b"/%2e%2e/secret.txt"), 400),
    ("dotdot-encoded-slashes", line(b"/files/..%2f..%2f..%2fsecret.txt"), 400),
    ("dotdot-all-encoded", line(b"/files%2f%2e%2e%2f%2e%2e%2fsecret.txt"), 400),
    ("dotdot-backslash", line(b"/..%5c..%5csecret.txt"), 400),
    ("raw-backslash", line(b"/files\\..\\..\\secret.txt"), 400),
    ("dot-component", line(b"/files/./drtk/"), 400),
    ("absolute-form-dotdot", line(b"http://127.0.0.1/../secret.txt"), 400),
    ("no-leading-slash", line(b"secret.txt"), 400),
    ("symlink-to-etc-passwd", line(b"/files/x/y.whl"), 404),
    ("symlink-out-absolute", line(b"/files/x/secret.whl"), 404),
    ("symlink-out-relative", line(b"/files/x/up.whl"), 404),
    ("through-a-folder-link-out", line(b"/files/out/secret.txt"), 404),
    ("folder-link-out-itself", line(b"/files/out/"), 404),
    ("index-page-linking-out", line(b"/files/x/sub/"), 404),
    ("fifo", line(b"/files/x/pipe.whl"), 404),
    ("publish-temporary", line(b"/files/drtk/.partial.whl"), 404),
    ("hidden-dotfile", line(b"/.lock"), 404),
    ("in-house-symlink-to-the-lock", line(b"/files/x/lock.whl"), 404),
    ("in-house-symlink-to-a-publish-temporary", line(b"/files/x/partial.whl"), 404),
    ("in-house-symlink-to-a-dot-folder", line(b"/files/x/dotdir/"), 404),
    ("header-over-64kB", b"GET / HTTP/1.0\r\nX-Big: " + b"f" * 70_000 + b"\r\n\r\n", 431),
]


@pytest.mark.parametrize("request_bytes,status", [c[1:] for c in HOSTILE_REQUESTS],
                         ids=[c[0] for c in HOSTILE_REQUESTS])
def test_a_hostile_request_gets_a_status_and_a_clean_close(hostile_house, request_bytes, status):
    house, port, wheel, _ = hostile_house
    before = tree_state(house)
    got, reply = raw_request(port, request_bytes)
    assert got == status, reply[:500]
    assert SECRET not in reply and b"root:" not in reply, reply[:500]
    assert tree_state(house) == before
    # still serving: the real wheel right after
    ok, body = raw_request(port, line(f"/files/drtk/{wheel.name}".encode()))
    assert ok == 200 and body.endswith(wheel.read_bytes())


def test_a_folder_without_its_slash_is_redirected_to_its_path_quoted_once(hostile_house):
    _, port, _, _ = hostile_house
    status, reply = raw_request(port, line(b"/files/x/with%20space"))
    assert status == 301 and b"\r\nLocation: /files/x/with%20space/\r\n" in reply, reply[:500]


def test_the_access_log_has_one_printable_line_per_request(hostile_house):
    _, port, _, log = hostile_house
    size = log.stat().st_size
    raw_request(port, line(b"/%00\x1b[31m"))
    raw_request(port, line(b"/" + b"g" * 70_000))
    new = log.read_bytes()[size:].decode()
    lines = new.splitlines()
    assert len(lines) == 2, new[:2000]
    assert '" 400 ' in lines[0] and "\x1b" not in lines[0] and "\\x1b" in lines[0]
    assert '"" 414 ' in lines[1] and len(lines[1]) < 2000


def test_a_symlink_that_stays_inside_is_served_and_the_rest_as_before(hostile_house):
    house, port, wheel, _ = hostile_house
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"{base}/files/x/inside.whl", timeout=10) as resp:
        assert resp.status == 200 and resp.read() == wheel.read_bytes()
    with urllib.request.urlopen(f"{base}/cu128/torch2.8/drtk/", timeout=10) as resp:
        assert resp.status == 200 and wheel.name.replace("+", "%2B") in resp.read().decode()
    # a folder without its slash is sent to it, as a static server does
    with urllib.request.urlopen(f"{base}/cu128/torch2.8/drtk", timeout=10) as resp:
        assert resp.url.endswith("/cu128/torch2.8/drtk/")
    for path in ("/files/x/y.whl", "/files/nope.whl", "/files/x/pipe.whl"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + path, timeout=10)
        assert err.value.code == 404
    req = urllib.request.Request(f"{base}/files/drtk/{wheel.name}", method="HEAD")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200 and int(resp.headers["Content-Length"]) == wheel.stat().st_size
        assert resp.read() == b""


# ---------------------------------------------------------------- the command line

@pytest.mark.parametrize("port", ["99999", "65536", "-1", "abc", "", "8o8o", "1e3", "٣"])
def test_a_bad_port_is_one_line_and_writes_nothing(tmp_path, port):
    house = tmp_path / "wh"
    res = run_farm("serve", "--wheelhouse", str(house), f"--port={port}", "--access-log", str(tmp_path / "a.log"),
                   timeout=30)
    assert_one_line_refusal(res, 2, "--port")
    assert tree_state(tmp_path) == {}


def test_a_port_in_use_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "wh").mkdir()
    before = tree_state(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = run_farm("serve", "--wheelhouse", str(tmp_path / "wh"), "--port", str(port),
                       "--access-log", str(tmp_path / "a.log"), timeout=30)
    assert_one_line_refusal(res, 2, f"cannot listen on 127.0.0.1:{port}")
    assert tree_state(tmp_path) == before


def test_an_access_log_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "wh").mkdir()
    before = tree_state(tmp_path)
    res = run_farm("serve", "--wheelhouse", str(tmp_path / "wh"), "--port", "0",
                   "--access-log", str(tmp_path / "no" / "such" / "a.log"), timeout=30)
    assert_one_line_refusal(res, 2, "--access-log")
    assert tree_state(tmp_path) == before


@pytest.mark.parametrize("setup, needle", [("missing", "no such wheelhouse (nothing created)"),
                                           ("a file", "not a folder")])
def test_serve_refuses_a_wheelhouse_that_is_missing_or_a_file_and_creates_nothing(tmp_path, setup, needle):
    house = tmp_path / "wh"
    if setup == "a file":
        house.write_text("not a wheelhouse\n")
    before = tree_state(tmp_path)
    res = run_farm("serve", "--wheelhouse", str(house), "--port", "0", timeout=30)
    line = assert_one_line_refusal(res, 2, needle)
    assert "--wheelhouse" in line and str(house) in line, line
    assert tree_state(tmp_path) == before


def test_sigterm_stops_farm_serve_within_a_second(tmp_path):
    """Measured with a real signal: idle and half-sent connections open, one download done."""
    publish([make_wheel(tmp_path / "in")], tmp_path / "wh")
    took = []
    for _ in range(3):
        with farm_serve(tmp_path / "wh") as (proc, port):
            idle = socket.create_connection(("127.0.0.1", port))
            half = socket.create_connection(("127.0.0.1", port))
            half.sendall(b"GET /simple/ HT")
            assert raw_request(port, line(b"/simple/"))[0] == 200
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=5)
            took.append(time.monotonic() - start)
            idle.close()
            half.close()
            assert code == 0, proc.stderr.read()
            assert "Traceback" not in proc.stderr.read()
    print(f"farm serve: SIGTERM to exit {', '.join(f'{t:.3f}' for t in took)} s")
    assert max(took) < 1.0, took


class Hammer:
    """Clients that keep the server's accept loop busy: `fast` of them request /simple/ back to back, one
    sends its request a byte every 50 ms (so a request is always mid-way), until the server is gone."""

    def __init__(self, port: int, fast: int = 8):
        self.port, self.done = port, threading.Event()
        self.threads = [threading.Thread(target=self._fast) for _ in range(fast)]
        self.threads.append(threading.Thread(target=self._slow))
        self.answered = 0

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        for t in self.threads:
            t.join(timeout=10)

    def _fast(self) -> None:
        while not self.done.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    s.sendall(line(b"/simple/"))
                    if s.recv(16).startswith(b"HTTP/1.0 200"):
                        self.answered += 1
            except OSError:
                time.sleep(0.01)

    def _slow(self) -> None:
        while not self.done.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    for byte in line(b"/simple/"):
                        s.sendall(bytes([byte]))
                        if self.done.wait(0.05):
                            return
                    s.recv(16)
            except OSError:
                time.sleep(0.01)


SLOWED = (sys.executable, str(Path(__file__).with_name("slowed_serve.py")))


@pytest.mark.parametrize("farm,busy,bound", [
    (tuple(FARM), 50, 1.0),
    # the probe's condition: each hand-over and each request 0.5 s slower; the stop then waits for the
    # hand-over under way (0.5 s) and for the cut connections' threads (CLOSE_WAIT)
    (SLOWED, 2, 1.0 + SLOW),
], ids=["as-is", "slowed-handler"])
def test_sigterm_stops_farm_serve_within_a_second_while_requests_are_mid_way(tmp_path, farm, busy, bound):
    """The signal lands while connections are being accepted and handled (the probe's swallowed SIGTERM):
    the server still ends at once, exit 0, and prints nothing but its access log."""
    publish([make_wheel(tmp_path / "in")], tmp_path / "wh")
    took = []
    for _ in range(3):
        with farm_serve(tmp_path / "wh", farm=farm) as (proc, port), Hammer(port) as hammer:
            deadline = time.monotonic() + 30
            while hammer.answered < busy and time.monotonic() < deadline:  # busy, not merely started
                time.sleep(0.01)
            assert hammer.answered >= busy, hammer.answered
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                pytest.fail("SIGTERM did not stop farm serve within 5 s: " + proc.stderr.read()[-2000:])
            took.append(time.monotonic() - start)
            err = proc.stderr.read()
            assert code == 0, err[-2000:]
            assert "Traceback" not in err and "Exception" not in err, err[-2000:]
    print(f"farm serve, busy: SIGTERM to exit {', '.join(f'{t:.3f}' for t in took)} s")
    assert max(took) < bound, took


def closed_by_server(s: socket.socket, by: float) -> bytes:
    """What the server sends before it closes `s` (a 408, or nothing); fails the test if `s` is open at `by`."""
    got = b""
    s.settimeout(max(0.01, by - time.monotonic()))
    try:
        while chunk := s.recv(4096):
            got += chunk
    except TimeoutError:
        pytest.fail(f"a half-sent connection was still open {HEAD_TIMEOUT + 2:g} s after it connected: {got[:80]!r}")
    except ConnectionResetError:
        pass
    return got


def test_half_sent_requests_neither_block_others_nor_outlive_the_request_timeout(hostile_house):
    """50 connections that sent half a request line and one that trickles a byte every 0.3 s: a whole request
    is still answered at once, and each of them is closed once HEAD_TIMEOUT has passed (the probe's were
    held for 49 s and more)."""
    _, port, _, _ = hostile_house
    start = time.monotonic()
    half = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
    for s in half:
        s.sendall(b"GET /simple/ HT")
    trickle = socket.create_connection(("127.0.0.1", port))
    stop = threading.Event()

    def drip():
        for byte in b"GET /simple/ HTTP/1.0\r\nX-Slow: " + b"a" * 1000:
            if stop.wait(0.3):
                return
            try:
                trickle.sendall(bytes([byte]))
            except OSError:
                return
    dripper = threading.Thread(target=drip)
    dripper.start()
    try:
        asked = time.monotonic()
        assert raw_request(port, line(b"/simple/"), timeout=5)[0] == 200
        assert time.monotonic() - asked < 1.0
        for s in [*half, trickle]:
            reply = closed_by_server(s, by=start + HEAD_TIMEOUT + 2)
            assert reply == b"" or reply.startswith(b"HTTP/1.0 408 "), reply[:200]
        assert time.monotonic() - start >= HEAD_TIMEOUT - 0.5, "closed before the client had its time"
    finally:
        stop.set()
        dripper.join()
        for s in [*half, trickle]:
            s.close()


def threads_of(pid: int) -> int:
    """Threads of a process this test started."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Threads:\s+(\d+)$", status, re.M).group(1))


def test_past_max_clients_the_oldest_half_sent_connection_makes_room(tmp_path):
    """MAX_CLIENTS + 20 half-sent connections: the server keeps at most MAX_CLIENTS threads for them, a whole
    request is still answered at once (it takes the slot of the oldest), and SIGTERM still ends it at once."""
    publish([make_wheel(tmp_path / "in")], tmp_path / "wh")
    with farm_serve(tmp_path / "wh") as (proc, port):
        half = []
        for _ in range(MAX_CLIENTS + 20):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /simple/ HT")
            half.append(s)
        try:
            asked = time.monotonic()
            assert raw_request(port, line(b"/simple/"), timeout=5)[0] == 200
            assert time.monotonic() - asked < 1.0
            assert threads_of(proc.pid) <= MAX_CLIENTS + 4, threads_of(proc.pid)
            closed = 0
            for s in half:
                s.settimeout(max(0.01, asked + 1.0 - time.monotonic()))
                try:
                    closed += s.recv(1) == b""
                except TimeoutError:
                    pass
                except ConnectionResetError:
                    closed += 1
            assert closed >= 21, f"{closed} of {len(half)} half-sent connections closed to make room"
            assert proc.poll() is None
            start = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=5) == 0
            assert time.monotonic() - start < 1.0
        finally:
            for s in half:
                s.close()
