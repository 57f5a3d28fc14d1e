"""Shared fixtures. Each helper appends its own; keep them small."""

from __future__ import annotations

import pytest
from replay_server import serve


@pytest.fixture(scope="session")
def replay_url():
    """The upstream replay (../shared/upstream-replay) served on loopback: the index root `.../whl/`."""
    with serve() as base:
        yield base + "whl/"
