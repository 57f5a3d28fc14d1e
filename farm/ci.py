"""GitHub Actions matrices: cell ids only, chunked under GitHub's limits (SPEC 7.3)."""

from __future__ import annotations

import json

from .cells import Cell
from .platforms import lane

MAX_JOBS_PER_MATRIX = 256
MAX_OUTPUT_BYTES = 1_000_000
LANE_NAMES = {"linux": "x86", "windows": "windows", "linux_aarch64": "arm64"}


def lane_of(cell: Cell) -> str:
    """GitHub lanes: x86 Linux, arm64 Linux and Windows run on different runners."""
    return LANE_NAMES[cell.platform] if lane(cell.platform) == "aarch64" or cell.platform == "windows" else "x86"


def github_matrix(cells: list[Cell], max_jobs: int = MAX_JOBS_PER_MATRIX) -> dict:
    """{"chunks": [{"lane", "chunk", "cells": [ids]}]}: one workflow job per (lane, chunk)."""
    chunks = []
    by_lane: dict[str, list[str]] = {}
    for cell in cells:
        by_lane.setdefault(lane_of(cell), []).append(cell.id)
    for lane_name in sorted(by_lane):
        ids = by_lane[lane_name]
        size = max_jobs
        # a chunk's JSON must stay far below the 1 MB output limit as well
        while size > 1 and len(json.dumps(ids[:size])) > MAX_OUTPUT_BYTES // 4:
            size //= 2
        for i in range(0, len(ids), size):
            chunks.append({"lane": lane_name, "chunk": i // size + 1, "cells": ids[i:i + size]})
    return {"chunks": chunks}
