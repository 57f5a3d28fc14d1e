"""`farm ci github`: GitHub Actions workflows for the farm; `farm ci outputs`: what their plan jobs emit."""

from __future__ import annotations

from pathlib import Path

from farm.commands.common import empty_selection, output_dir
from farm.commands.plan import add_filters, filters_of, selected


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
    from farm.run.ci import actionlint_config, github_workflows
    from farm.yamlio import write_atomic

    output_dir(args.out, "--out")
    plan, cells, shard = selected(args)   # every value known before anything is written
    if not cells:
        print(f"{empty_selection(args)}; nothing written")
        return 0
    files, chunks, left = github_workflows(plan, cells, filters_of(args), shard, out_dir=str(args.out))
    for name, text in files.items():
        write_atomic(args.out / name, text)
        print(f"wrote {args.out / name} ({len(text.encode())} bytes)")
    write_atomic(config := actionlint_path(args.out), actionlint_config())
    print(f"wrote {config}")
    lanes = sorted({c.lane for c in chunks})
    print(f"{sum(len(c.cells) for c in chunks)} cells in {len(chunks)} build jobs ({', '.join(lanes) or 'none'})")
    if left:
        print(f"left out: {sum(len(v) for v in left.values())} cells of recipes that need a patch nobody wrote: "
              + ", ".join(left))
    return 0


def actionlint_path(out: Path) -> Path:
    """actionlint reads .github/actionlint.yaml, and GitHub would take any YAML file inside
    .github/workflows/ for a workflow: beside it for that layout, else inside --out (never elsewhere)."""
    if out.name == "workflows" and out.parent.name == ".github":
        return out.parent / "actionlint.yaml"
    return out / "actionlint.yaml"


def outputs_command(args) -> int:
    from farm.run.ci import missing_outputs

    plan, cells, _ = selected(args)
    for line in missing_outputs(plan, cells, args.group, args.layout, args.wheelhouse):
        print(line)
    return 0
