"""The processes of `farm run` (design.md §11.1): each cell builds in its own child process
(`python -m farm.run.processes --child`, which calls farm.build.cell.build_cell) in its own session, so a
crash or a failure stays in that cell; on an interrupt a child's whole process tree is stopped.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from farm.errors import FarmError


def proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, rss pages, state) for every process we can read."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                data = fh.read().decode(errors="replace")
        except OSError:
            continue
        rest = data[data.rfind(")") + 2:].split()
        # fields after the name: state ppid ... (rss is field 24 overall, index 21 here)
        table[int(entry.name)] = (int(rest[1]), int(rest[21]), rest[0])
    return table


def descendants(roots: set[int], table: dict[int, tuple[int, int, str]] | None = None) -> set[int]:
    table = table if table is not None else proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        for kid in children.get(pid, ()):
            if kid not in found:
                found.add(kid)
                stack.append(kid)
    return found


def stop_tree(pids: set[int]) -> None:
    """SIGSTOP everything (so nothing spawns), widen to new descendants until stable, then SIGKILL."""
    frozen: set[int] = set()
    todo = set(pids)
    for _ in range(20):
        for pid in todo - frozen:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        frozen |= todo
        grown = descendants(frozen) - frozen
        if not grown:
            break
        todo = grown
    for pid in frozen:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def child_main(argv: list[str]) -> int:
    """`python -m farm.run.processes --child <cell> ...`: build_cell in this process, result JSON to --result."""
    import argparse

    from farm.build.cell import build_cell
    from farm.build.request import BuildRequest

    parser = argparse.ArgumentParser(prog="python -m farm.run.processes --child")
    parser.add_argument("cell")
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--wheelhouse", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--runner")
    parser.add_argument("--max-jobs", type=int)
    parser.add_argument("--max-jobs-reason")
    parser.add_argument("--no-compiler-cache", action="store_true")
    args = parser.parse_args(argv)
    try:
        request = BuildRequest.make(args.cell, runner_kind=args.runner, out=args.out, wheelhouse=args.wheelhouse,
                                    max_jobs=args.max_jobs, max_jobs_reason=args.max_jobs_reason,
                                    compiler_cache=not args.no_compiler_cache)
        res = build_cell(request, log=lambda m: print(m, flush=True))
    except FarmError as exc:
        print(f"farm: {exc}", file=sys.stderr, flush=True)
        _write_json(args.result, {"status": "error", "message": str(exc), "exit_code": exc.exit_code})
        return exc.exit_code
    except KeyboardInterrupt:
        print("farm: interrupted", file=sys.stderr, flush=True)
        return 130
    _write_json(args.result, {"status": res.status, "wheel": str(res.wheel) if res.wheel else None,
                              "record_path": str(res.record_path) if res.record_path else None})
    return 0


def _write_json(path: Path, data) -> None:
    from farm.yamlio import write_atomic

    write_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(child_main(sys.argv[2:]))
    print("python -m farm.run.processes --child <cell> ...: the per-cell child of `farm run`", file=sys.stderr)
    sys.exit(2)
