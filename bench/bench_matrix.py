"""Scrape + derive over loopback, against a plain fetch of the same pages in the same run.

The ratio is the cost of parsing, filtering and deriving on top of reading the
bytes; the page count says how many requests one scrape makes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import requests

from farm.matrix.grid import derive, render_grid_yaml, render_phantoms_json
from farm.matrix.upstream import scrape
from farm.policy import load_defaults

from .figures import Figure, median_time

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from replay_server import serve  # noqa: E402  (the same loopback server the tests use)


def run() -> list[Figure]:
    policy = load_defaults().grid_policy
    with serve() as base:
        root = base + "whl/"
        first = scrape(root, policy)
        urls = [root] + [f"{root}cu{c.replace('.', '')}/torch/" for c in first.pcwm.cudas]
        assert len(urls) == first.pages

        def plain_fetch():
            with requests.Session() as session:
                for url in urls:
                    session.get(url, timeout=30).raise_for_status()

        def scrape_and_derive():
            grid = derive(scrape(root, policy).pcwm, policy)
            render_grid_yaml(grid)
            render_phantoms_json(grid)

        baseline = median_time(plain_fetch, repeat=7)
        value = median_time(scrape_and_derive, repeat=7)
    return [Figure(
        name="matrix scrape+derive (loopback replay)",
        value=value,
        baseline=baseline,
        goal=5.0,
        note=f"{first.pages} pages, {len(first.pcwm.combos)} combos; baseline: plain GET of the same pages",
    )]
