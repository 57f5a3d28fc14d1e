"""`farm ci github`: GitHub Actions workflows for the farm; `farm ci outputs`: what their plan jobs emit."""

from __future__ import annotations

from pathlib import Path

from .plan import add_filters, filters_of, selected


def register(sub) -> None:
    parser = sub.add_parser("ci", help="export the farm to GitHub Actions (workflows, plan-job outputs)")
    verbs = parser.add_subparsers(dest="ci_verb", metavar="VERB")
    verbs.required = True

    p = verbs.add_parser("github", help="write the build and matrix-refresh workflows")
    add_filters(p)
    p.add_argument("--out", type=Path, default=Path(".github/workflows"), help="default: .github/workflows/")
    p.set_defaults(func=github_command)

    p = verbs.add_parser("outputs", help="(in a plan job) per chunk of this group, the cells missing from the wheelhouse")
    add_filters(p)
    p.add_argument("--group", type=int, required=True)
    p.add_argument("--layout", required=True, help="the chunk layout digest the workflow was generated with")
    p.add_argument("--wheelhouse", type=Path, default=Path("wheelhouse"))
    p.set_defaults(func=outputs_command)


def github_command(args) -> int:
    from ..ci import actionlint_config, github_workflows
    from ..yamlio import write_atomic

    plan, cells, shard = selected(args)
    files, chunks, left = github_workflows(plan, cells, filters_of(args), shard, out_dir=str(args.out))
    for name, text in files.items():
        write_atomic(args.out / name, text)
        print(f"wrote {args.out / name} ({len(text.encode())} bytes)")
    config = args.out.parent / "actionlint.yaml"   # .github/actionlint.yaml next to .github/workflows/
    write_atomic(config, actionlint_config())
    print(f"wrote {config}")
    lanes = sorted({c.lane for c in chunks})
    print(f"{sum(len(c.cells) for c in chunks)} cells in {len(chunks)} build jobs ({', '.join(lanes) or 'none'})")
    if left:
        print(f"left out: {sum(len(v) for v in left.values())} cells of recipes that need a patch nobody wrote: "
              + ", ".join(left))
    return 0


def outputs_command(args) -> int:
    from ..ci import missing_outputs

    plan, cells, _ = selected(args)
    for line in missing_outputs(plan, cells, args.group, args.layout, args.wheelhouse):
        print(line)
    return 0
