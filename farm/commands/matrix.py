"""`farm matrix scrape|derive|watch|pages`: the upstream matrix and the grid (design.md §2)."""

from __future__ import annotations

import sys

from farm import settings
from farm.commands.common import add_path, add_recipes, number_arg
from farm.errors import UpstreamUnreadable
from farm.matrix.grid import (
    DEFAULT_SOURCE,
    GRID_FILE,
    PCWM_FILE,
    PHANTOMS_FILE,
    derive,
    load_grid,
    load_pcwm,
    load_pcwm_file,
    unsupported_lines,
    write_grid,
)
from farm.pages.matrix import write_matrix
from farm.policy import load_defaults

# farm.matrix.upstream (requests) and farm.matrix.watch are imported by the verbs that use them: every
# `farm` command registers this module, and none of the others should pay for requests.


def register(sub) -> None:
    parser = sub.add_parser("matrix", help="the upstream wheel matrix: scrape, derive the grid, watch, pages")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    p = verbs.add_parser("scrape", help="read the PyTorch wheel index into defaults/scraped_torch_matrix.json")
    p.add_argument("--index-url", default=DEFAULT_SOURCE, help="the index (or a mirror) to read")
    p.add_argument("--source-label", default=DEFAULT_SOURCE, help="the canonical label written into the file")
    add_path(p, "--out", kind="output_file", help=f"default: defaults/{PCWM_FILE}")
    p.add_argument("--timeout", type=number_arg("--timeout", 0, 3600, "expected seconds > 0 and at most 3600",
                                                low_open=True), help="seconds to wait for each answer (default 30)")
    p.set_defaults(func=scrape_command)

    p = verbs.add_parser("derive", help=f"write defaults/{GRID_FILE} and defaults/{PHANTOMS_FILE}")
    add_path(p, "--pcwm", kind="input_file", help=f"default: defaults/{PCWM_FILE}")
    add_path(p, "--out-dir", kind="output_dir", help="default: the defaults folder")
    p.set_defaults(func=derive_command)

    p = verbs.add_parser("watch", help="report what the live index has that the grid lacks (exit 0/3/4)")
    p.add_argument("--index-url", default=DEFAULT_SOURCE)
    p.add_argument("--format", choices=("text", "json"), default="text")
    add_recipes(p)   # a new line's checklist names the recipes whose maps lack it
    p.set_defaults(func=watch_command)

    p = verbs.add_parser("pages", help="write the matrix/ HTML page (one table per CUDA line)")
    add_path(p, "--out", kind="output_dir", help="default: <wheelhouse>/matrix")
    p.set_defaults(func=pages_command)


def _warn(message: str) -> None:
    print(f"farm: warning: {message}", file=sys.stderr)


def scrape_command(args) -> int:
    from farm.matrix.upstream import TIMEOUT, Fetcher, scrape, write_pcwm

    defaults = load_defaults()
    out = args.out or defaults.folder / PCWM_FILE
    fetcher = Fetcher(timeout=(TIMEOUT[0], args.timeout or TIMEOUT[1]))
    try:
        result = scrape(args.index_url, defaults.grid_policy, args.source_label, fetcher)
    finally:
        fetcher.close()
    for message in result.warnings:
        _warn(message)
    changed = write_pcwm(result.pcwm, out)
    pcwm = result.pcwm
    print(f"{'wrote' if changed else 'unchanged'} {settings.display(out)}: {len(pcwm.combos)} combos on "
          f"CUDA {', '.join(pcwm.cudas)} ({result.pages} pages read)")
    return 0


def derive_command(args) -> int:
    defaults = load_defaults()
    policy = defaults.grid_policy
    source = args.pcwm or defaults.folder / PCWM_FILE
    pcwm = load_pcwm_file(source)
    for cuda in unsupported_lines(pcwm, policy):
        _warn(f"CUDA {cuda} is in {settings.display(source)} but not in supported_cudas: skipped")
    for cuda in policy.supported_cudas:
        if cuda not in pcwm.cudas:
            _warn(f"supported CUDA {cuda} has no wheels in {settings.display(source)}: no rows")
    grid = derive(pcwm, policy)
    grid_path, phantoms_path = write_grid(grid, args.out_dir or defaults.folder)
    print(f"wrote {settings.display(grid_path)} ({len(grid.rows)} rows) and "
          f"{settings.display(phantoms_path)} ({len(grid.phantoms)} phantom cells)")
    return 0


def watch_command(args) -> int:
    from farm.matrix.watch import EXIT_UNREADABLE, watch

    try:
        report = watch(args.index_url)
    except UpstreamUnreadable as exc:
        print(f"farm: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    sys.stdout.write(report.to_json() if args.format == "json" else report.to_text())
    return report.exit_code


def pages_command(args) -> int:
    defaults = load_defaults()
    pcwm = load_pcwm(defaults.folder)
    out = args.out or settings.wheelhouse_dir() / "matrix"
    path = write_matrix(out, pcwm, load_grid(defaults.folder))
    print(f"wrote {settings.display(path)}")
    return 0
