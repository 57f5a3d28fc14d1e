"""Real pip and uv against `farm serve` on 127.0.0.1 (design.md §9.7): installs, metadata-only resolution, exact pins.

The machine's pip configuration (find-links, constraints) is kept out with
--isolated, PIP_CONFIG_FILE=/dev/null and no PIP_*/UV_* variables; every
index URL points at a loopback server started by the test.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import re
import shlex
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from wheelhouse_fixtures import FARM, REPO, clean_env, compiled_so, make_wheel, served

from farm.wheelhouse import publish

PY = sys.executable
UV = str(Path(sys.executable).with_name("uv"))
DRTK = "drtk==0.1.0+cu128torch2.8"
WHEEL_GET = re.compile(r'"(?:GET|HEAD) (\S+\.whl) HTTP')
METADATA_GET = re.compile(r'"GET (\S+\.whl\.metadata) HTTP/[\d.]+" 200')


class Log:
    def __init__(self, path: Path):
        self.path = path
        self.mark = 0

    def start(self) -> None:
        self.mark = self.path.stat().st_size if self.path.exists() else 0

    def since(self) -> str:
        with open(self.path) as fh:
            fh.seek(self.mark)
            return fh.read()


@pytest.fixture(scope="module")
def farm_index(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    wheels = tmp / "in"
    so = compiled_so(tmp)
    publish([
        make_wheel(wheels, "drtk", "0.1.0+cu128torch2.8", requires_python=">=3.9,<3.14"),
        make_wheel(wheels, "drtk", "0.1.0+cu128torch2.9"),
        make_wheel(wheels, "My_Ext", "0.2.0+cu128", tags="cp311-cp311-manylinux_2_34_x86_64", so=so,
                   payload="import ctypes, os\nLIB = os.path.join(os.path.dirname(__file__), '_ext.so')\n"),
    ], tmp / "wh")
    log = tmp / "access.log"
    with farm_serve(tmp / "wh", log) as url:
        yield url, Log(log), so is not None


@contextlib.contextmanager
def farm_serve(house: Path, log: Path):
    """The real `farm serve` command on a free loopback port; yields its base URL."""
    proc = subprocess.Popen([*FARM, "serve", "--wheelhouse", str(house), "--port", "0", "--access-log", str(log)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"on (http://127\.0\.0\.1:\d+)/", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        yield m.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def fake_pypi(tmp: Path):
    """Another index (plain http.server) offering drtk 100.0.0, standing in for PyPI."""
    root = tmp / "pypi"
    w = make_wheel(root / "files", "drtk", "100.0.0", tags="py3-none-any", requires_python=None)
    (root / "simple/drtk").mkdir(parents=True)
    (root / "simple/drtk/index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="../../files/{w.name}">{w.name}</a></body></html>\n')
    handler = partial(type("Quiet", (SimpleHTTPRequestHandler,), {"log_message": lambda *a: None}),
                      directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    finally:
        server.shutdown()
        server.server_close()


def pip(*args, cwd=None) -> subprocess.CompletedProcess:
    cmd = [PY, "-m", "pip", *args, "--isolated", "--no-cache-dir", "--disable-pip-version-check"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), cwd=cwd, timeout=300)
    assert proc.returncode == 0, f"{shlex.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    return proc


def uv(*args, tmp: Path) -> subprocess.CompletedProcess:
    cmd = [UV, *args]
    env = clean_env(UV_CACHE_DIR=str(tmp / "uv-cache"), UV_PYTHON=PY, UV_PYTHON_DOWNLOADS="never")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, f"{shlex.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    return proc


def installed_version(target: Path, dist: str) -> str:
    (info,) = [p for p in target.glob("*.dist-info") if p.name.lower().startswith(dist.lower() + "-")]
    return re.search(r"^Version: (.+)$", (info / "METADATA").read_text(), re.M).group(1)


@pytest.mark.parametrize("spelling", ["my_ext", "My-Ext", "MY_EXT"])
def test_pip_installs_from_a_channel_whatever_the_project_spelling(farm_index, tmp_path, spelling):
    url, log, has_so = farm_index
    target = tmp_path / "t"
    pip("install", "--target", str(target), "--index-url", f"{url}/cu128/torch2.8/", spelling)
    assert installed_version(target, "My_Ext") == "0.2.0+cu128"
    if has_so:  # the compiled part arrived intact and loads
        assert ctypes.CDLL(str(target / "my_ext/_ext.so")).farm_answer() == 42


@pytest.mark.parametrize("spelling", ["my_ext", "My-Ext", "MY_EXT"])
def test_uv_installs_from_a_channel_whatever_the_project_spelling(farm_index, tmp_path, spelling):
    url, log, _ = farm_index
    target = tmp_path / "t"
    uv("pip", "install", "--target", str(target), "--index-url", f"{url}/cu128/torch2.8/", spelling, tmp=tmp_path)
    assert installed_version(target, "My_Ext") == "0.2.0+cu128"


def test_pip_dry_run_report_reads_the_metadata_sidecar_and_never_the_wheel(farm_index, tmp_path):
    url, log, _ = farm_index
    log.start()
    proc = pip("install", "--dry-run", "--ignore-installed", "--report", "-", "--quiet",
               "--index-url", f"{url}/cu128/torch2.8/", DRTK, "My-Ext")
    report = json.loads(proc.stdout)
    assert sorted(i["metadata"]["version"] for i in report["install"]) == ["0.1.0+cu128torch2.8", "0.2.0+cu128"]
    seen = log.since()
    assert WHEEL_GET.findall(seen) == [], seen
    assert len(METADATA_GET.findall(seen)) == 2, seen


def test_uv_pip_compile_reads_the_metadata_sidecar_and_never_the_wheel(farm_index, tmp_path):
    url, log, _ = farm_index
    (tmp_path / "req.in").write_text(f"{DRTK}\nMy_Ext\n")
    log.start()
    proc = uv("pip", "compile", str(tmp_path / "req.in"), "--index-url", f"{url}/cu128/torch2.8/",
              "--python-version", "3.11", "--no-header", tmp=tmp_path)
    assert "drtk==0.1.0+cu128torch2.8" in proc.stdout and "my-ext==0.2.0+cu128" in proc.stdout.lower()
    seen = log.since()
    assert WHEEL_GET.findall(seen) == [], seen
    assert len(METADATA_GET.findall(seen)) == 2, seen


def test_pip_reads_the_html_pages_metadata_attributes_too(tmp_path):
    """With JSON negotiation off, pip must find the sidecar through data-core-metadata / data-dist-info-metadata."""
    publish([make_wheel(tmp_path / "in")], tmp_path / "wh")
    log = Log(tmp_path / "access.log")
    with served(tmp_path / "wh", log.path, negotiate=False) as url:
        pip("install", "--dry-run", "--ignore-installed", "--quiet", "--index-url", f"{url}/cu128/torch2.8/", DRTK)
    seen = log.since()
    assert "application/vnd.pypi.simple.v1+json" in seen  # pip asked for JSON and was given HTML
    assert WHEEL_GET.findall(seen) == [] and len(METADATA_GET.findall(seen)) == 1, seen


def test_a_pip_from_before_pep_714_installs_from_a_channel(farm_index, tmp_path):
    """pip 23.0.1 (what pyenv's and python.org's Python 3.10 bundle) asks for the JSON page and crashes on a
    `dist-info-metadata` key there (TypeError: unhashable type: 'dict'); the farm's users are on such pips."""
    from farm.build.downloads import download

    url, _, _ = farm_index
    old_pip = download(["pip==23.0.1"], python="3.11", platform="linux", no_deps=True,
                       root=tmp_path / "cache").file_for("pip")
    assert old_pip is not None
    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run([python, str(old_pip / "pip"), "install", "--isolated", "--no-index", "--quiet", str(old_pip)],
                   check=True, env=clean_env())
    proc = subprocess.run([python, "-m", "pip", "install", "--isolated", "--no-cache-dir",
                           "--disable-pip-version-check", "--index-url", f"{url}/cu128/torch2.8/", DRTK],
                          capture_output=True, text=True, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Successfully installed drtk-0.1.0+cu128torch2.8" in proc.stdout
    version = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True, check=True).stdout
    assert version.startswith("pip 23.0.1 "), version


def farm_find_command(url: str, pypi: str) -> list[str]:
    """The install command `farm find` prints, pointed at the loopback farm and the fake PyPI."""
    from types import SimpleNamespace

    from farm.arch.find import PYPI_SIMPLE, Channel, install_command

    recipe = SimpleNamespace(name="drtk", version="0.1.0", links_torch=True)
    import os
    old = os.environ.get("FARM_INDEX_URL")
    os.environ["FARM_INDEX_URL"] = url
    try:
        command = install_command(Channel("12.8", "2.8", "linux", ("3.11",)), recipe)
    finally:
        if old is None:
            os.environ.pop("FARM_INDEX_URL")
        else:
            os.environ["FARM_INDEX_URL"] = old
    assert PYPI_SIMPLE in command and DRTK in command
    return shlex.split(command.replace(PYPI_SIMPLE, pypi.rstrip("/")))


def test_the_farm_find_exact_pin_beats_a_higher_version_on_pypi(farm_index, tmp_path):
    url, _, _ = farm_index
    with fake_pypi(tmp_path) as pypi:
        argv = farm_find_command(url, pypi)
        assert argv[:2] == ["pip", "install"]
        target = tmp_path / "pinned"
        pip(*argv[1:], "--target", str(target))
        assert installed_version(target, "drtk") == "0.1.0+cu128torch2.8"
        # Why the pin matters: unpinned, the same two indexes give PyPI's higher version.
        loose = tmp_path / "loose"
        pip("install", "--index-url", f"{url}/cu128/torch2.8/", "--extra-index-url", pypi, "drtk",
            "--target", str(loose))
        assert installed_version(loose, "drtk") == "100.0.0"


def test_uv_with_the_channel_as_priority_index_gets_the_farm_build_over_pypi(farm_index, tmp_path):
    """uv gives --extra-index-url priority and stops at the first index that has the name (first-index),
    so for uv the channel goes in --extra-index-url and PyPI in --index-url."""
    url, _, _ = farm_index
    with fake_pypi(tmp_path) as pypi:
        target = tmp_path / "t"
        uv("pip", "install", "--target", str(target), "--index-url", pypi,
           "--extra-index-url", f"{url}/cu128/torch2.8/", DRTK, tmp=tmp_path)
        assert installed_version(target, "drtk") == "0.1.0+cu128torch2.8"
        target2 = tmp_path / "t2"
        uv("pip", "install", "--target", str(target2), "--index-url", pypi,
           "--extra-index-url", f"{url}/cu128/torch2.8/", "drtk", tmp=tmp_path)
        assert installed_version(target2, "drtk") == "0.1.0+cu128torch2.8"  # even unpinned


def get(url: str, accept: str | None = None):
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read(), resp.url
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read(), url


def test_serve_negotiates_pep691_json_and_html(farm_index):
    url, _, _ = farm_index
    page = f"{url}/cu128/torch2.8/drtk/"
    status, headers, body, _ = get(page, "application/vnd.pypi.simple.v1+json")
    assert status == 200 and headers["Content-Type"] == "application/vnd.pypi.simple.v1+json"
    assert headers["Vary"] == "Accept"
    doc = json.loads(body)
    assert doc["name"] == "drtk" and len(doc["files"]) == 1
    status, headers, body, _ = get(page, "application/vnd.pypi.simple.v1+json;q=0.2, text/html")
    assert headers["Content-Type"].startswith("text/html") and b"<a href=" in body
    status, headers, body, _ = get(page)
    assert headers["Content-Type"].startswith("text/html")
    status, headers, _, _ = get(page, "application/vnd.pypi.simple.v1+html")
    assert headers["Content-Type"] == "application/vnd.pypi.simple.v1+html"
    assert get(page, "application/xml")[0] == 406
    status, headers, body, _ = get(f"{url}/simple/", "application/vnd.pypi.simple.v1+json")
    assert [p["name"] for p in json.loads(body)["projects"]] == ["drtk", "my-ext"]


def test_serve_redirects_unnormalised_project_urls_and_hides_dotfiles(farm_index):
    url, _, _ = farm_index
    status, _, _, final = get(f"{url}/cu128/torch2.8/My_Ext/")
    assert status == 200 and final.endswith("/cu128/torch2.8/my-ext/")
    assert get(f"{url}/.lock")[0] == 404
    assert get(f"{url}/files/drtk/.hidden.tmp")[0] == 404
