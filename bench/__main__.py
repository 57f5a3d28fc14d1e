"""Run benchmark modules: bench/results/<topic>.json per topic, latest.json gathering them all.

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
from datetime import datetime, timezone
from pathlib import Path

from farm.yamlio import write_atomic

from .figures import Figure

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    topics = argv or sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    figures: list[Figure] = []
    failed = []
    for topic in topics:
        started = time.perf_counter()
        try:
            mine = importlib.import_module(f"bench.bench_{topic}").run()
        except Exception:
            traceback.print_exc()
            failed.append(topic)
            continue
        figures += mine
        took = time.perf_counter() - started
        print(f"[bench] {topic}: {took:.1f}s", file=sys.stderr)
        # one file per topic, so `python -m bench run` does not erase the other topics' figures
        measured = {"topic": topic, "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "seconds": round(took, 1), "figures": [f.as_dict() for f in mine]}
        write_atomic(results / f"{topic}.json", json.dumps(measured, indent=2) + "\n")
    every = [json.loads(p.read_text()) for p in sorted(results.glob("*.json")) if p.name != "latest.json"]
    out = results / "latest.json"
    write_atomic(out, json.dumps(every, indent=2) + "\n")
    width = max((len(f.name) for f in figures), default=10)
    for f in figures:
        print(f.line(width))
    print(f"wrote {out} (every topic's latest run)" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
