"""Scraping the wheel index into the PCWM (design.md §2.1-2.4) and failing closed (design.md §2.3).

Every test reads a real HTTP server on 127.0.0.1: the shared replay, or a
changed copy of it in a temporary folder.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

import pytest
from farmcli import PROJECT, run_farm
from replay_server import copy_replay, refused_url, serve

from farm.errors import UpstreamUnreadable
from farm.matrix.grid import DEFAULT_SOURCE, PCWM_FILE, derive, load_pcwm_file
from farm.matrix.upstream import Fetcher, discover_lines, parse_wheel, scrape
from farm.policy import load_defaults

COMMITTED = PROJECT / "defaults" / PCWM_FILE


@pytest.fixture(scope="module")
def policy():
    return load_defaults().grid_policy


@pytest.fixture(scope="module")
def replay(replay_url, policy):
    return scrape(replay_url, policy)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


# ---------------------------------------------------------------- what the replay yields

def test_replay_yields_exactly_the_cuda_lines_12_4_to_13_2(replay):
    assert replay.pcwm.cudas == ("12.4", "12.6", "12.8", "12.9", "13.0", "13.2")
    assert replay.warnings == ()
    assert replay.pages == 7     # the root and one torch/ page per line; cu118/cu121 (below min_cuda) never read


def test_lines_below_min_cuda_are_not_fetched_so_lowering_the_floor_reads_their_missing_pages(replay_url, policy):
    with pytest.raises(UpstreamUnreadable, match=re.escape(replay_url + "cu118/torch/") + ".*HTTP 404"):
        scrape(replay_url, dataclasses.replace(policy, min_cuda="11.8"))


def test_cu124_unlabelled_aarch64_builds_of_2_4_and_2_5_are_in(replay):
    pcwm = replay.pcwm
    for torch in ("2.4.0", "2.4.1", "2.5.0", "2.5.1"):
        for python in ("3.10", "3.11", "3.12"):
            assert pcwm.has("12.4", torch, python, "linux_aarch64"), (torch, python)
    assert pcwm.torches("12.4", "linux_aarch64") == ("2.4.0", "2.4.1", "2.5.0", "2.5.1")


def test_ancient_mirrored_wheels_and_release_candidates_are_out(replay):
    assert replay.pcwm.torches("12.4") == ("2.4.0", "2.4.1", "2.5.0", "2.5.1", "2.6.0")
    assert replay.pcwm.torches("12.6")[0] == "2.6.0"
    assert all(not re.search(r"[a-z]", c.torch) for c in replay.pcwm.combos)   # no rc, no .post mirrors
    # 2.0.1 aarch64 is on every page, unlabelled, with no labelled 2.0.1 beside it
    assert not any(c.torch.startswith(("0.", "1.", "2.0.")) for c in replay.pcwm.combos)


def test_free_threaded_wheels_are_dropped_not_folded_into_a_standard_cell(tmp_path, policy):
    whl = copy_replay(tmp_path / "replay")
    page = whl / "cu130" / "torch" / "index.html"
    text = page.read_text()
    extra = ('<a href="/whl/cu130/torch-2.13.0%2Bcu130-cp316-cp316t-manylinux_2_28_x86_64.whl">'
             "torch-2.13.0+cu130-cp316-cp316t-manylinux_2_28_x86_64.whl</a><br/>\n")
    page.write_text(text.replace("  </body>", extra + "  </body>"))
    with serve(tmp_path / "replay") as base:
        pcwm = scrape(base + "whl/", policy).pcwm
    assert not any(c.python == "3.16" for c in pcwm.combos)
    assert parse_wheel("torch-2.9.0+cu129-cp314-cp314t-win_amd64.whl") is None


def test_cp39_is_observed_in_the_pcwm_but_in_no_grid_row(replay, policy):
    assert replay.pcwm.has("12.8", "2.8.0", "3.9", "linux")
    assert replay.pcwm.has("12.4", "2.4.1", "3.9", "windows")
    grid = derive(replay.pcwm, policy)
    assert grid.rows and all("3.9" not in row.pythons for row in grid.rows)


def test_wheels_belong_to_the_line_of_their_page_and_platforms_map_to_pcwm_spelling(replay):
    assert replay.pcwm.has("12.4", "2.6.0", "3.12", "linux")            # manylinux_2_28_x86_64
    assert replay.pcwm.has("12.4", "2.4.0", "3.12", "linux")            # linux_x86_64
    assert replay.pcwm.has("12.9", "2.9.0", "3.14", "windows")
    assert not replay.pcwm.has("12.9", "2.9.1", "3.14", "windows")       # 2.9.1 shipped no Windows wheels
    text = replay.pcwm.to_json()
    assert '"platform": "linux_x86_64"' in text and '"platform": "linux"' not in text


def test_cuda_lines_are_discovered_from_any_link_form():
    root = "".join(f'<a href="{href}">x</a>' for href in [
        "cu130/", "./cu126", "/whl/cu128/", "https://mirror.example/whl/cu129/", "cu92", "cu132",
        "cpu/", "rocm6.4/", "xpu/", "nightly/", "/whl/torch/", "/whl/cu128/torch/", "cu12x/"])
    assert discover_lines(root) == ["9.2", "12.6", "12.8", "12.9", "13.0", "13.2"]


# ---------------------------------------------------------------- the file

def test_scraping_twice_through_two_different_ports_gives_identical_bytes(tmp_path):
    outs = []
    for i in range(2):
        with serve() as base:
            out = tmp_path / f"pcwm{i}.json"
            result = run_farm("matrix", "scrape", "--index-url", base + "whl/", "--out", str(out))
            assert result.returncode == 0, result.stderr
            outs.append((base, out.read_bytes()))
    (base_a, a), (base_b, b) = outs
    assert base_a != base_b
    assert a == b
    assert base_a.encode() not in a and b'"source": "' + DEFAULT_SOURCE.encode() + b'"' in a


def test_committed_pcwm_is_what_scraping_the_replay_gives(tmp_path, replay_url):
    out = tmp_path / "pcwm.json"
    result = run_farm("matrix", "scrape", "--index-url", replay_url, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == COMMITTED.read_bytes(), "run `make matrix` and commit defaults/"


def test_source_label_is_a_setting_and_the_file_round_trips(tmp_path, replay_url):
    out = tmp_path / "pcwm.json"
    result = run_farm("matrix", "scrape", "--index-url", replay_url, "--out", str(out),
                      "--source-label", "https://mirror.example/whl/")
    assert result.returncode == 0, result.stderr
    loaded = load_pcwm_file(out)
    assert loaded.source == "https://mirror.example/whl/"
    assert loaded.combos == load_pcwm_file(COMMITTED).combos
    assert loaded.to_json() == out.read_text()


def test_a_dropped_connection_is_retried_and_without_retries_fails(policy):
    with serve(drop_once={"/whl/cu128/torch/"}) as base:
        assert scrape(base + "whl/", policy).pcwm.torches("12.8")
    with serve(drop_once={"/whl/cu128/torch/"}) as base:
        fetcher = Fetcher(retries=0)
        with pytest.raises(UpstreamUnreadable, match=re.escape(base + "whl/cu128/torch/")):
            scrape(base + "whl/", policy, fetcher=fetcher)
        fetcher.close()


# ---------------------------------------------------------------- fail closed (design.md §2.3)

def scrape_over_existing(tmp_path: Path, index_url: str):
    """Run `farm matrix scrape` over an existing matrix file; return (result, unchanged?)."""
    out = tmp_path / "existing.json"
    out.write_bytes(COMMITTED.read_bytes())
    before = sha(out)
    result = run_farm("matrix", "scrape", "--index-url", index_url, "--out", str(out))
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".existing.json")]
    return result, sha(out) == before and not leftovers


def test_http_500_on_one_supported_line_fails_naming_the_url_and_keeps_the_file(tmp_path):
    with serve(statuses={"/whl/cu128/torch/": 500}) as base:
        result, unchanged = scrape_over_existing(tmp_path, base + "whl/")
    assert result.returncode != 0
    assert base + "whl/cu128/torch/" in result.stderr and "HTTP 500" in result.stderr
    assert unchanged


def test_refused_connection_fails_naming_the_url_and_keeps_the_file(tmp_path):
    url = refused_url()
    result, unchanged = scrape_over_existing(tmp_path, url)
    assert result.returncode != 0
    assert url in result.stderr and "refused" in result.stderr.lower()
    assert unchanged


def test_supported_line_page_without_target_wheels_fails_naming_the_url_and_keeps_the_file(tmp_path):
    whl = copy_replay(tmp_path / "replay")
    page = whl / "cu129" / "torch" / "index.html"
    # keep only the mirrored ancient wheels and the release candidate
    kept = [line for line in lines_of(page) if "<a " not in line or re.search(r">torch-(0|1|2\.0)\.|rc1", line)]
    assert len(kept) < len(lines_of(page)) and any("rc1" in line for line in kept)
    page.write_text("".join(kept))
    with serve(tmp_path / "replay") as base:
        result, unchanged = scrape_over_existing(tmp_path, base + "whl/")
    assert result.returncode != 0
    assert base + "whl/cu129/torch/" in result.stderr and "12.9" in result.stderr
    assert unchanged


def test_root_page_without_cuda_links_fails_naming_the_url_and_keeps_the_file(tmp_path):
    whl = copy_replay(tmp_path / "replay")
    root = whl / "index.html"
    root.write_text("".join(line for line in lines_of(root) if not re.search(r'href="cu\d+/"', line)))
    with serve(tmp_path / "replay") as base:
        result, unchanged = scrape_over_existing(tmp_path, base + "whl/")
    assert result.returncode != 0
    assert base + "whl/" in result.stderr and "no CUDA line" in result.stderr
    assert unchanged


def add_line(whl: Path, tag: str, page: str) -> None:
    root = whl / "index.html"
    root.write_text(root.read_text().replace('    <a href="nightly/">',
                                             f'    <a href="{tag}/">{tag}</a><br/>\n    <a href="nightly/">'))
    (whl / tag / "torch").mkdir(parents=True)
    (whl / tag / "torch" / "index.html").write_text(page)


def test_new_unsupported_line_with_only_a_release_candidate_is_a_warning(tmp_path):
    whl = copy_replay(tmp_path / "replay")
    add_line(whl, "cu133", "<html><body>\n"
             '<a href="/whl/cu133/torch-2.14.0rc1%2Bcu133-cp312-cp312-manylinux_2_28_x86_64.whl">'
             "torch-2.14.0rc1+cu133-cp312-cp312-manylinux_2_28_x86_64.whl</a><br/>\n</body></html>\n")
    out = tmp_path / "pcwm.json"
    with serve(tmp_path / "replay") as base:
        result = run_farm("matrix", "scrape", "--index-url", base + "whl/", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "warning" in result.stderr and "13.3" in result.stderr and base + "whl/cu133/torch/" in result.stderr
    assert out.read_bytes() == COMMITTED.read_bytes()
