"""`farm publish`, `farm index rebuild|verify|recover`, `farm prune`, `farm serve`: the wheelhouse (design.md §9)."""

from __future__ import annotations

import sys

from farm.commands.common import add_path, add_recipes
from farm.settings import default_wheelhouse


def _add_house(parser) -> None:
    parser.add_argument("--wheelhouse", default=None,
                        help="the wheelhouse folder (default: $FARM_WHEELHOUSE, else ./wheelhouse)")


def _house(args):
    return default_wheelhouse(args.wheelhouse)


def register(sub) -> None:
    p = sub.add_parser("publish", help="publish wheels into the wheelhouse (manifest first, then pages)")
    p.add_argument("wheels", nargs="+", metavar="WHEEL")
    p.add_argument("--record", help="build record JSON (cell, build_key, arch_list, ...): one object, or a list "
                                    "of objects each naming its 'wheel'")
    _add_house(p)
    p.set_defaults(func=publish_command)

    p = sub.add_parser("index", help="regenerate or check the wheelhouse index")
    isub = p.add_subparsers(dest="index_command", metavar="ACTION")
    isub.required = True
    r = isub.add_parser("rebuild", help="regenerate every page from manifest.jsonl, never reading a wheel")
    r.add_argument("--allow-shrink", action="store_true",
                   help="accept listing fewer wheels for a project or channel than the pages on disk do")
    _add_house(r)
    r.set_defaults(func=rebuild_command)
    pg = isub.add_parser("pages", help="write the human pages: find-your-wheel (index.html, find.json), matrix/, archs/")
    _add_house(pg)
    add_recipes(pg)   # find-your-wheel lists every recipe
    pg.set_defaults(func=pages_command)
    v = isub.add_parser("verify", help="check the journal, re-hash every wheel and sidecar, find orphans and "
                                       "links under files/, compare every page with the journal, follow every link")
    _add_house(v)
    v.set_defaults(func=verify_command)
    rc = isub.add_parser("recover", help="rebuild manifest.jsonl from files/ (sidecars, each wheel's farm_build.json), "
                                         "cutting a torn tail and losing no wheel on disk, then every page")
    _add_house(rc)
    rc.set_defaults(func=recover_command)
    m = isub.add_parser("merge", help="publish the wheels of per-host staging wheelhouses into this one")
    m.add_argument("stagings", nargs="+", metavar="STAGING")
    _add_house(m)
    m.set_defaults(func=merge_command)

    p = sub.add_parser("prune", help="delete yanked wheels (retention keeps 2 per cell) published before DATE")
    p.add_argument("--before", required=True, metavar="DATE", help="e.g. 2026-05-01 or 2026-05-01T12:00:00Z")
    _add_house(p)
    p.set_defaults(func=prune_command)

    p = sub.add_parser("serve", help="serve the wheelhouse over HTTP (PEP 503 HTML, PEP 691 JSON)")
    _add_house(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", default="8000", help="0 picks a free port (printed)")
    add_path(p, "--access-log", kind="output_file", help="append the access log here (default: stderr)")
    p.add_argument("--html-only", action="store_true", help="never answer with PEP 691 JSON")
    p.set_defaults(func=serve_command)


def publish_command(args) -> int:
    from farm.wheelhouse import publish

    result = publish(args.wheels, _house(args), record=args.record)
    for e in result.published:
        print(f"published {e.project}/{e.file}")
    for note in result.notes:
        print(note)
    replaced = {e.file for e in result.replaced}
    for e in result.already:
        if e.file in replaced:
            print(f"replaced {e.project}/{e.file}: the copy in the wheelhouse no longer matched its recorded sha256")
        else:
            print(f"already published {e.project}/{e.file} (same sha256; pages refreshed)")
    print(f"{len(result.pages)} page(s) regenerated")
    return 0


def rebuild_command(args) -> int:
    from farm.wheelhouse import rebuild

    result = rebuild(_house(args), allow_shrink=args.allow_shrink)
    for file in result.missing:
        print(f"dropped from the index (file missing): {file}", file=sys.stderr)
    print(f"{result.pages} page(s), {result.wheels} wheel(s)")
    return 0


def pages_command(args) -> int:
    from farm.pages.find import write_site
    from farm.wheelhouse.manifest import house_folder

    for path in write_site(house_folder(_house(args))):   # pages of a house, never a new house
        print(f"wrote {path}")
    return 0


def verify_command(args) -> int:
    from farm.wheelhouse import verify

    problems = verify(_house(args))
    for line in problems:
        print(line)
    if problems:
        print(f"farm: {len(problems)} problem(s) in {_house(args)}", file=sys.stderr)
        return 1
    print("every wheel, sidecar and link checks out")
    return 0


def recover_command(args) -> int:
    from farm.wheelhouse.recover import recover

    r = recover(_house(args))
    if r.torn:
        print(f"cut a torn last manifest record ({r.torn} bytes)")
    if r.bad_lines:
        print(f"dropped {r.bad_lines} damaged manifest line(s)")
    for rel in r.added:
        print(f"added from the file itself: {rel}")
    for rel in r.sidecars:
        print(f"rewrote {rel} from its wheel")
    for rel in r.removed:
        print(f"removed {rel} (a link, or a sidecar without its wheel)")
    for rel in r.dropped:
        print(f"dropped the record of {rel}: the file is gone")
    for rel in r.damaged:
        print(f"still damaged: {rel} does not match its recorded sha256; republish the good wheel", file=sys.stderr)
    for line in r.left:
        print(f"left as it is: {line}", file=sys.stderr)
    print(f"manifest rebuilt: {r.kept + len(r.added)} wheel(s) ({r.kept} kept, {len(r.added)} added); "
          f"{r.pages} page(s) regenerated")
    return 1 if r.damaged or r.left else 0


def merge_command(args) -> int:
    from farm.wheelhouse.merge import merge

    result = merge(args.stagings, _house(args))
    for file in result.published:
        print(f"published {file}")
    print(f"merged {result.stagings} staging folder(s): {len(result.published)} new, "
          f"{len(result.already)} already there")
    return 0


def prune_command(args) -> int:
    from farm.wheelhouse import prune

    result = prune(_house(args), args.before)
    for file in result.removed:
        print(f"pruned {file}")
    for file in result.orphans:
        print(f"removed leftover {file}")
    return 0


def serve_command(args) -> int:
    from farm.errors import BadInput
    from farm.wheelhouse.serve import serve

    # Read here, not by argparse's type=int, whose refusal is a usage block and not one line.
    port = args.port.strip()
    if not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise BadInput("command line", "--port", args.port, "not a port number (0-65535; 0 picks a free one)")
    serve(_house(args), host=args.host, port=int(port), access_log=args.access_log, negotiate=not args.html_only)
    return 0
