"""What a user meets who installs from the served index (design.md §9.7, §9.8, §10.4).

The slow part: the bundled farm_demo built by `farm run` for two channels (cu130 / torch 2.12 and 2.13) x two
Pythons (3.11, 3.12) with the shared compiler cache, plus a published wheel that cannot import; then
`farm check-install`, which serves the house on 127.0.0.1 and installs each package with real pip and
real uv into fresh venvs of the machine's Pythons, and imports it. Its page is checked in Chromium.
The fast part: the channel pages and `farm serve`'s start-up lines say which Pythons each channel serves,
and stay the same bytes whether a publish wrote them or a rebuild did.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from farmcli import PROJECT, run_farm
from wheelhouse_fixtures import make_wheel, served

from farm.arch.find import command_line, pip_words, uv_words
from farm.wheelhouse import publish

DEMO = PROJECT / "examples" / "farm-demo"
SELECT = ("--package", "farm_demo", "--cuda", "13.0", "--torch", "2.12", "--torch", "2.13", "--python", "3.11",
          "--python", "3.12", "--platform", "linux")
CELLS = ["cu130-torch2.12-py311", "cu130-torch2.12-py312", "cu130-torch2.13-py311", "cu130-torch2.13-py312"]
BROKEN_LINE = "import farm_broken failed: ImportError: farm test: this wheel cannot import"


def broken_wheel(folder: Path) -> Path:
    """A well-formed wheel for cu130 / torch 2.13 / py3.11 whose package raises on import."""
    return make_wheel(folder, "farm_broken", "0.1.0+cu130torch2.13", tags="cp311-cp311-manylinux_2_34_x86_64",
                      payload='raise ImportError("farm test: this wheel cannot import")\n')


def serve_lines(house: Path, count: int) -> tuple[list[str], subprocess.Popen]:
    """The first `count` lines `farm serve --port 0` prints, and the running server (the caller stops it)."""
    proc = subprocess.Popen([sys.executable, "-m", "farm", "serve", "--wheelhouse", str(house), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=PROJECT)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if len(lines) == count:
            break
    return lines, proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    assert proc.wait(timeout=10) == 0


# ---------------------------------------------------------------- channel pages and start-up lines (fast)

def test_channel_page_and_serve_say_which_pythons_a_channel_serves_and_a_line_that_installs(tmp_path):
    house = tmp_path / "wh"
    for py in ("cp311", "cp312"):
        publish([make_wheel(tmp_path / "in", "farm_probe_pkg", "0.3.0+cu128torch2.8", tags=f"{py}-{py}-manylinux_2_28_x86_64")],
                house)
    publish([make_wheel(tmp_path / "in", "aaa", "1.0+cu128torch2.8", tags="cp312-cp312-manylinux_2_28_x86_64")], house)
    page = (house / "cu128" / "torch2.8" / "index.html").read_text()
    # written by three incremental publishes: the second Python and the second project reached the channel's page
    assert "wheels for Linux x86_64: Python 3.11, 3.12." in page and "from versions: none" in page
    assert "&#x27;farm-probe-pkg==0.3.0+cu128torch2.8&#x27;" in page   # the project serving most Pythons is the example
    assert '<a href="aaa/">aaa</a>' in page and '<a href="farm-probe-pkg/">farm-probe-pkg</a>' in page
    # a rebuild from the journal writes the same bytes, and verify finds every page as the journal gives it
    rebuilt = run_farm("index", "rebuild", "--wheelhouse", str(house))
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (house / "cu128" / "torch2.8" / "index.html").read_text() == page
    assert run_farm("index", "verify", "--wheelhouse", str(house)).returncode == 0

    lines, proc = serve_lines(house, 3)
    try:
        base = re.fullmatch(r"serving \S+ on (http://127\.0\.0\.1:\d+/)", lines[0]).group(1)
        assert lines[1] == "cu128/torch2.8/ serves Linux x86_64: Python 3.11, 3.12 (2 project(s))"
        assert lines[2] == "  " + command_line(pip_words(base + "cu128/torch2.8/", "farm-probe-pkg==0.3.0+cu128torch2.8"))
        # the printed line resolves through the server it names (download: nothing lands in this venv)
        words = pip_words(base + "cu128/torch2.8/", "farm-probe-pkg==0.3.0+cu128torch2.8")
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp_path / "dl"),
                              "--python-version", "3.12", "--only-binary=:all:", *words[2:]],
                             capture_output=True, text=True, timeout=300)
        assert got.returncode == 0, got.stderr
        # the Python the channel does not serve: pip's bare answer, which the lines above explain
        wrong = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp_path / "dl"),
                                "--python-version", "3.10", "--only-binary=:all:", *words[2:]],
                               capture_output=True, text=True, timeout=300)
        assert wrong.returncode != 0 and "from versions: none" in wrong.stderr
    finally:
        stop(proc)


def test_the_first_line_of_a_real_pip_and_uv_failure_names_the_missing_wheel(tmp_path):
    """What an install failure's entry says: pip's and uv's own words for a pin the channel lacks, taken from
    real runs against the served channel (dry runs: nothing is installed)."""
    from uv import find_uv_bin

    from farm.run.installcheck import first_line

    house = tmp_path / "wh"
    publish([make_wheel(tmp_path / "in", "farm_probe_pkg", "0.3.0+cu128torch2.8")], house)
    with served(house, tmp_path / "access.log") as url:
        channel = f"{url}/cu128/torch2.8/"
        pin = "farm-probe-pkg==0.4.0+cu128torch2.8"
        pip = subprocess.run([sys.executable, "-m", *pip_words(channel, pin), "--dry-run", "--no-deps"],
                             capture_output=True, text=True, timeout=300)
        uv = subprocess.run([find_uv_bin(), *uv_words(channel, pin)[1:], "--dry-run", "--no-deps",
                             "--python", sys.executable], capture_output=True, text=True, timeout=300)
    assert pip.returncode != 0 and uv.returncode != 0
    assert first_line(pip.stderr) == (f"ERROR: Could not find a version that satisfies the requirement {pin} "
                                      "(from versions: 0.3.0+cu128torch2.8)")
    line = first_line(uv.stderr)
    assert line.startswith("error: No solution found when resolving dependencies: Because there is no version of "
                           "farm-probe-pkg==0.4.0+cu128torch2.8"), uv.stderr


# What pip 23.0.1 printed here against a JSON page naming `dist-info-metadata` (the check-install entry
# was "ERROR: Exception:" alone, which says nothing).
PIP_CRASH = """ERROR: Exception:
Traceback (most recent call last):
  File "/tmp/v310/lib/python3.10/site-packages/pip/_internal/cli/base_command.py", line 160, in exc_logging_wrapper
    status = run_func(*args)
  File "/tmp/v310/lib/python3.10/site-packages/pip/_internal/models/link.py", line 408, in metadata_link
    link_hash = LinkHash.split_hash_name_and_value(self.dist_info_metadata)
TypeError: unhashable type: 'dict'
"""


def test_a_crashed_pips_entry_names_the_exception_its_traceback_ends_with():
    from farm.run.installcheck import first_line

    assert first_line(PIP_CRASH) == "ERROR: Exception: TypeError: unhashable type: 'dict'"
    assert first_line("ERROR: Exception:\nTraceback (most recent call last):\n") == "ERROR: Exception:"


def test_serve_says_so_when_nothing_is_published_yet(tmp_path):
    house = tmp_path / "wh"
    publish([make_wheel(tmp_path / "in", "farm_probe_pkg", "0.3.0+cu128torch2.8")], house)
    (house / "manifest.jsonl").write_text("")   # every wheel removed from the journal: nothing served
    lines, proc = serve_lines(house, 2)
    try:
        assert lines[1] == "channels: none yet (nothing published)"
    finally:
        stop(proc)


def test_check_install_refuses_an_unknown_installer_and_an_empty_house_in_one_line(tmp_path):
    house = tmp_path / "wh"
    publish([make_wheel(tmp_path / "in", "farm_probe_pkg", "0.3.0+cu128torch2.8")], house)
    bad = run_farm("check-install", "--wheelhouse", str(house), "--installer", "conda")
    assert bad.returncode == 2 and "--installer" in bad.stderr and bad.stderr.count("\n") == 1
    (house / "manifest.jsonl").write_text("")
    empty = run_farm("check-install", "--wheelhouse", str(house))
    assert empty.returncode == 2 and "publishes no wheel" in empty.stderr and empty.stderr.count("\n") == 1
    assert not (house / "install-matrix.json").exists()
    # torch-free wheels only (cumm's shape): the line says what is there and what gives them a channel
    free_house = tmp_path / "free-wh"
    publish([make_wheel(tmp_path / "free", "farm_free_pkg", "0.1.0+cu130", tags="cp311-cp311-manylinux_2_28_x86_64")],
            free_house)
    free = run_farm("check-install", "--wheelhouse", str(free_house))
    assert free.returncode == 2 and free.stderr.count("\n") == 1, free.stderr
    assert "only torch-free wheels (farm-free-pkg; cu130)" in free.stderr and "config.json's channels" in free.stderr
    assert not (free_house / "install-matrix.json").exists()


def test_cells_this_host_cannot_run_are_listed_as_not_checked_never_as_failures(tmp_path):
    """An aarch64 wheel, and a py3.12 wheel on a host whose only Python is the farm's own 3.11 (an empty
    PYENV_ROOT): nothing is installed, both cells are named with their reason, the matrix and page written."""
    house = tmp_path / "wh"
    publish([make_wheel(tmp_path / "in", "farm_probe_pkg", "0.3.0+cu128torch2.8", tags="cp312-cp312-manylinux_2_28_x86_64"),
             make_wheel(tmp_path / "in", "farm_probe_pkg", "0.3.0+cu128torch2.8", tags="cp311-cp311-manylinux_2_28_aarch64")],
            house)
    (tmp_path / "no-pyenv" / "versions").mkdir(parents=True)
    assert sys.version_info[:2] == (3, 11), "the farm's own Python is the one Python left"
    res = run_farm("check-install", "--wheelhouse", str(house), env={"PYENV_ROOT": str(tmp_path / "no-pyenv")})
    assert res.returncode == 0, res.stderr
    assert "not checked: cu128-torch2.8-py311-aarch64: Linux aarch64 (ARM) wheels are not installed on this " \
           "Linux x86_64 host" in res.stdout
    assert "not checked: cu128-torch2.8-py312: no Python 3.12 on this host" in res.stdout
    matrix = json.loads((house / "install-matrix.json").read_text())
    assert matrix["results"] == {} and matrix["counts"] == {"works": 0, "fails": 0}
    assert [c["id"] for c in matrix["cells"]] == ["cu128-torch2.8-py312", "cu128-torch2.8-py311-aarch64"]
    page = (house / "install" / "index.html").read_text()
    assert page.count(">not checked<") == 4 and "no Python 3.12 on this host" in page   # 2 cells x pip, uv


def test_after_a_torch_uvs_cache_keeps_only_what_the_next_torch_installs_too(tmp_path):
    """check-install drops a torch from uv's cache when the next torch's cells start: torch and the runtime
    wheels that changed with it go, the ones both torches install at the same version stay. Real uv, its
    own cache folder; tiny wheels stand for torch 2.12's and 2.13's sets (cublas changed, numpy did not)."""
    from farm.run.installcheck import Tools, _uv_binary, forget_torch

    def wheels(folder: Path, torch: str, cublas: str) -> list[Path]:
        return [make_wheel(folder, name, version, tags="py3-none-any")
                for name, version in (("torch", torch), ("nvidia-cublas", cublas), ("numpy", "2.3.0"))]

    checked = wheels(tmp_path / "torch-2.12", "2.12.0", "13.0.1")
    following = wheels(tmp_path / "torch-2.13", "2.13.0", "13.1.0")
    cache, logged = tmp_path / "uv-cache", []
    tools = Tools("http://127.0.0.1:9/", tmp_path, tmp_path, _uv_binary(), cache, {}, logged.append)
    env = {**os.environ, "UV_CACHE_DIR": str(cache), "UV_NO_CONFIG": "1"}
    subprocess.run([tools.uv, "venv", "-q", str(tmp_path / "venv"), "--python", sys.executable], env=env, check=True)
    subprocess.run([tools.uv, "pip", "install", "-q", "--python", str(tmp_path / "venv" / "bin" / "python"),
                    "--no-index", "--find-links", str(tmp_path / "torch-2.12"), "torch", "nvidia-cublas", "numpy"],
                   env=env, check=True)

    def unpacked() -> list[str]:
        return sorted(d.name for d in cache.glob("archive-v0/*/*.dist-info"))

    assert unpacked() == ["numpy-2.3.0.dist-info", "nvidia_cublas-13.0.1.dist-info", "torch-2.12.0.dist-info"]
    forget_torch(tools, "2.12.0", checked, following)
    assert logged == ["uv cache: torch 2.12.0's wheels removed (2: nvidia-cublas, torch)"]
    assert unpacked() == ["numpy-2.3.0.dist-info"]


# ---------------------------------------------------------------- the install matrix on farm_demo (slow)

@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """farm_demo in 2 channels x 2 Pythons plus a wheel that cannot import, checked by `farm check-install`."""
    root = tmp_path_factory.mktemp("install-matrix")
    recipes = root / "recipes"
    recipes.mkdir()
    demo = (PROJECT / "recipes" / "farm_demo.yml").read_text().replace("../examples/farm-demo", str(DEMO))
    (recipes / "farm_demo.yml").write_text(demo)
    env = {"FARM_RECIPES": str(recipes)}
    house = root / "house"
    built = run_farm("run", "--plain", "--wheelhouse", str(house), "--build-dir", str(root / "build"), *SELECT,
                     env=env, timeout=5400)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    published = run_farm("publish", str(broken_wheel(root / "broken")), "--wheelhouse", str(house))
    assert published.returncode == 0, published.stderr
    res = run_farm("check-install", "--wheelhouse", str(house), env=env, timeout=3600)
    pages = run_farm("index", "pages", "--wheelhouse", str(house), env=env)
    assert pages.returncode == 0, pages.stderr
    return res, house


@pytest.mark.slow
def test_every_demo_cell_installs_and_imports_with_pip_and_uv_and_the_broken_wheel_fails_with_its_line(checked):
    res, house = checked
    assert res.returncode == 1, res.stdout + res.stderr     # one package fails: the command says so
    assert "install matrix: 8 installed and imported, 2 failed" in res.stdout
    matrix = json.loads((house / "install-matrix.json").read_text())
    assert [c["id"] for c in matrix["cells"]] == CELLS
    assert {c["id"]: c["torch_pin"] for c in matrix["cells"]}["cu130-torch2.12-py311"].startswith("2.12.")
    demo = matrix["results"]["farm-demo"]
    assert sorted(demo) == CELLS
    for cell in CELLS:
        assert demo[cell]["version"] == f"0.1.0+cu130torch{cell.split('-')[1][5:]}"
        assert {i: demo[cell][i]["status"] for i in ("pip", "uv")} == {"pip": "installs and imports",
                                                                       "uv": "installs and imports"}, demo[cell]
    broken = matrix["results"]["farm-broken"]
    assert sorted(broken) == ["cu130-torch2.13-py311"]
    for installer in ("pip", "uv"):
        assert broken["cu130-torch2.13-py311"][installer] == {
            "status": "fails", "error": BROKEN_LINE, "seconds": broken["cu130-torch2.13-py311"][installer]["seconds"]}
    # the lines it ran are the ones the page prints, through the channel (the run's log says which)
    assert re.search(r"cu130-torch2\.12-py312 uv: farm-demo==0\.1\.0\+cu130torch2\.12: installs and imports", res.stdout)
    # torch 2.12's cells done, uv's copy of it goes before torch 2.13's cells (and 2.13's stays: no cell follows)
    assert re.search(r"uv cache: torch 2\.12\.\S+'s wheels removed \(\d+: .*\btorch\b", res.stdout), res.stdout
    assert "uv cache: torch 2.13" not in res.stdout


@pytest.mark.slow
def test_the_install_page_shows_pythons_per_channel_and_the_line_to_type_in_chromium(checked, tmp_path):
    from playwright.sync_api import sync_playwright
    from test_pages import FLAGS, ensure_chromium, screenshot

    _, house = checked
    with served(house, tmp_path / "access.log") as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=ensure_chromium(), args=FLAGS, headless=True)
        try:
            pg = browser.new_page(viewport={"width": 1280, "height": 900})
            outside = []
            pg.on("request", lambda r: outside.append(r.url) if not r.url.startswith(url) else None)
            pg.goto(url + "/")
            pg.click("text=what installs")            # linked from the root page
            pg.wait_for_url(url + "/install/")
            rows = pg.locator("#pythons tbody tr")
            assert rows.count() == 2
            assert re.fullmatch(r"cu130/torch2\.12/\s+✓ Linux x86_64\s+✓ Linux x86_64", rows.nth(0).inner_text().strip())
            assert "✗" in rows.nth(1).inner_text()     # farm-broken fails on torch 2.13 / py3.11
            first = pg.locator('[id="cu130-torch2.13"] ~ pre.install').first.inner_text().splitlines()
            channel = f"{url}/cu130/torch2.13/"    # the page's script put the address it was read from in
            assert first == [command_line(pip_words(channel, "farm-broken==0.1.0+cu130torch2.13")),
                             command_line(uv_words(channel, "farm-broken==0.1.0+cu130torch2.13"))]
            last = pg.locator("pre.install").all_inner_texts()[-1].splitlines()
            assert last[0] == command_line(pip_words(channel, "farm-demo==0.1.0+cu130torch2.13"))
            assert BROKEN_LINE in pg.inner_text("ul.errors")
            screenshot(pg, "install", tmp_path)
            pg.goto(url + "/cu130/torch2.12/")
            assert "wheels for Linux x86_64: Python 3.11, 3.12." in pg.inner_text("#serves")
            assert pg.inner_text("#install-pip") == command_line(pip_words(url + "/cu130/torch2.12/",
                                                                           "farm-demo==0.1.0+cu130torch2.12"))
            screenshot(pg, "channel", tmp_path)
            assert outside == []
        finally:
            browser.close()
    assert os.path.getsize(house / "install" / "index.html") > 0
