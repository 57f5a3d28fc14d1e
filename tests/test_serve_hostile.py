"""`farm serve` against hostile requests and a hostile wheelhouse, as a real process on 127.0.0.1.

Malformed request lines go over raw sockets (no client library would send them); every
answer must be a status line, then EOF: never a traceback, never a reset, and the
server keeps serving. Symlinks planted in the wheelhouse that lead out of it, a FIFO,
and every spelling of `..` must not reach a byte outside. `--port` refusals are one
line, exit 2, nothing written; SIGTERM ends the server within a second.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from farmcli import run_farm
from hostile import assert_one_line_refusal, tree_state
from wheelhouse_fixtures import FARM, REPO, make_wheel

from farm.wheelhouse import publish
from farm.wheelhouse.serve import MAX_REQUEST_LINE

SECRET = b"farm-serve-secret-outside-the-wheelhouse"


@contextlib.contextmanager
def farm_serve(house: Path, *extra: str):
    """The real `farm serve --port 0`; yields (process, port). Its stderr is checked for tracebacks."""
    proc = subprocess.Popen([*FARM, "serve", "--wheelhouse", str(house), "--port", "0", *extra],
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
