"""The wheelhouse's pages in a real browser: Debian's chromium (installed here when missing) driven by
Playwright from PyPI through executable_path (no browser download), served by `farm serve` on loopback.

FARM_SCREENSHOTS=DIR (`make pages-screenshots`) keeps the PNGs there.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from wheelhouse_fixtures import make_wheel, served

from farm.arch.find import find
from farm.matrix.grid import load_grid
from farm.policy import load_defaults
from farm.wheelhouse import publish

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.slow


def ensure_chromium() -> str:
    if not Path(CHROMIUM).exists():
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"], check=True,
                       env=env, capture_output=True)
    assert Path(CHROMIUM).exists(), "Debian's chromium is needed for the page tests"
    return CHROMIUM


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A wheelhouse with drtk 0.10.0 and 0.9.0 published (in that order) and the site pages, on 127.0.0.1."""
    from farm.pages.find import write_site

    tmp = tmp_path_factory.mktemp("pages")
    house = tmp / "wh"
    for version in ("0.10.0", "0.9.0"):
        publish([make_wheel(tmp / "in", "drtk", f"{version}+cu128torch2.8", tags="cp312-cp312-manylinux_2_28_x86_64")],
                house, record={"arch_list": "8.0 8.6 8.9 9.0 10.0 12.0+PTX"})
    write_site(house)
    with served(house, tmp / "access.log") as url:
        yield url, house


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    executable = ensure_chromium()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=FLAGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    external = []
    pg.on("request", lambda r: external.append(r.url) if not r.url.startswith("http://127.0.0.1") else None)
    yield pg
    context.close()
    assert external == [], f"the pages fetched something outside the farm: {external}"


def screenshot(pg, name: str, tmp_path: Path) -> Path:
    folder = Path(os.environ.get("FARM_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000
    return path


def choose(pg, url: str, platform: str, python: str, gpu: str, torch: str = "", package: str = "") -> str:
    """The page's result once the choices are made. Each choice redraws it at once, except a package: its
    wheel list is fetched, and the page is drawn again when it arrives. A caller that chose a package waits
    for the content it expects (expect(...).to_have_text), since the first drawing already has a #verdict."""
    pg.goto(url + "/")
    pg.wait_for_selector("body[data-ready='1']")
    pg.select_option("#platform", platform)
    pg.select_option("#python", python)
    if torch:
        pg.select_option("#torch", torch)
    if package:
        pg.select_option("#package", package)
    pg.fill("#gpu", gpu)
    pg.wait_for_selector("#verdict")
    return pg.inner_text("#result")


def test_find_page_gives_the_channel_and_command_farm_find_gives_for_a_gpu_and_platform(site, page, tmp_path):
    url, _ = site
    choose(page, url, "linux", "3.12", "RTX 4090")
    command = page.inner_text("#command")
    defaults = load_defaults()
    answer = find(defaults.gpus.by_name("RTX 4090"), "linux", "3.12", defaults, load_grid(defaults.folder))
    best = answer.offers[0].channel
    assert command == (f"pip install --index-url {url}/{best.path} --extra-index-url https://pypi.org/simple "
                       f"'<package>==<version>+cu{best.cuda.replace('.', '')}torch{best.torch}'")
    rows = page.locator("#channels tbody tr")
    assert rows.count() == len(answer.offers)
    assert [rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())] == [
        o.channel.path for o in answer.offers]
    screenshot(page, "find-rtx4090-linux", tmp_path)


def slow_network(pg, latency_ms: int) -> None:
    """Every request of `pg` answered `latency_ms` late, as on a loaded machine (Chromium's own throttling)."""
    cdp = pg.context.new_cdp_session(pg)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": latency_ms,
                                                  "downloadThroughput": -1, "uploadThroughput": -1})


def test_find_page_accepts_an_sm_and_pins_the_published_version_of_a_package(site, page, tmp_path):
    """The package's wheel list (packages/drtk.json) is fetched when the package is chosen and arrives 1.5 s
    late here: the page is read once the pin shows, not as soon as a first verdict is drawn."""
    url, _ = site
    from playwright.sync_api import expect

    slow_network(page, 1500)
    choose(page, url, "linux", "3.12", "sm_89", torch="2.8", package="drtk")
    # the highest version, not the last published; and the channel that holds it first
    expect(page.locator("#command")).to_have_text(
        f"pip install --index-url {url}/cu128/torch2.8/ --extra-index-url https://pypi.org/simple "
        "'drtk==0.10.0+cu128torch2.8'", timeout=30_000)
    assert page.inner_text("#command-uv").startswith("uv pip install --index-url https://pypi.org/simple "
                                                     f"--extra-index-url {url}/cu128/torch2.8/")
    screenshot(page, "find-sm89-drtk", tmp_path)


def test_find_page_explains_a_jetson_orin_is_served_by_no_channel(site, page, tmp_path):
    url, _ = site
    text = choose(page, url, "linux_aarch64", "3.12", "Jetson AGX Orin")
    assert page.locator("#command").count() == 0
    assert "No channel serves Jetson AGX Orin" in text and "JetPack" in text
    screenshot(page, "find-orin-arm", tmp_path)


def test_find_page_falls_back_as_farm_find_does_when_the_installed_torch_has_no_channel(site, page):
    url, _ = site
    defaults = load_defaults()
    grid = load_grid(defaults.folder)
    cases = []
    for device in ("A100", "GH200", "B200"):
        for torch in sorted({r.torch for r in grid.rows}):
            answer = find(defaults.gpus.by_name(device), "linux_aarch64", "3.12", defaults, grid, torch=torch)
            if answer.notes and answer.offers:
                cases.append((device, torch, answer))
    assert len(cases) >= 2
    for device, torch, answer in (cases[0], cases[-1]):
        text = choose(page, url, "linux_aarch64", "3.12", device, torch=torch)
        fb_cuda, fb_torch = defaults.grid_policy.fallback["linux_aarch64"]
        assert "falling back" in text and f"cu{fb_cuda.replace('.', '')}/torch{fb_torch}" in text
        assert f"{url}/{answer.offers[0].channel.path} " in page.inner_text("#command")


def test_matrix_and_archs_pages_render_their_tables(site, page, tmp_path):
    url, _ = site
    page.goto(url + "/matrix/")
    assert page.locator("table").count() >= 3
    assert page.locator("table tbody tr").count() >= 10
    screenshot(page, "matrix", tmp_path)
    page.goto(url + "/archs/")
    for table in ("#policy-table", "#pam-table", "#coverage-table-linux", "#coverage-table-linux_aarch64"):
        assert page.locator(f"{table} tbody tr").count() >= 3, table
    thor = page.locator("#coverage-table-linux_aarch64 tbody tr", has_text="Jetson AGX Thor")
    statuses = [c.get_attribute("class") for c in thor.locator("td").all()]
    assert any(s.startswith("native") for s in statuses) and any(s.startswith("dead") for s in statuses)
    screenshot(page, "archs", tmp_path)


def test_pages_load_no_external_resources(site):
    _, house = site
    for rel in ("index.html", "matrix/index.html", "archs/index.html"):
        text = (house / rel).read_text()
        for needle in ("<script src", "<link", "@import", "url(", "<img", "<iframe", "@font-face"):
            assert needle not in text, (rel, needle)


def test_chromium_is_debians_not_a_downloaded_one():
    owner = subprocess.run(["dpkg", "-S", ensure_chromium()], capture_output=True, text=True)
    assert owner.returncode == 0 and owner.stdout.startswith("chromium"), owner.stdout + owner.stderr
    assert not Path.home().joinpath(".cache/ms-playwright").exists() or not any(
        Path.home().joinpath(".cache/ms-playwright").glob("chromium-*"))
