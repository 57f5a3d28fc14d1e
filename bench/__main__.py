"""Run every benchmark module and write bench/results/latest.json.

A benchmark module is `bench/bench_<topic>.py` exposing `run() -> list[Figure]`.
Figures are ratios against a baseline measured in the same run, so they mean
the same thing on any machine. `python -m bench topic ...` runs a subset.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from .figures import Figure

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    topics = argv or sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))
    figures: list[Figure] = []
    failed = []
    for topic in topics:
        started = time.perf_counter()
        try:
            figures += importlib.import_module(f"bench.bench_{topic}").run()
        except Exception:
            traceback.print_exc()
            failed.append(topic)
        print(f"[bench] {topic}: {time.perf_counter() - started:.1f}s", file=sys.stderr)
    out = HERE / "results" / "latest.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps([f.as_dict() for f in figures], indent=2) + "\n")
    width = max((len(f.name) for f in figures), default=10)
    for f in figures:
        print(f.line(width))
    print(f"wrote {out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
