"""`farm ci github`: GitHub Actions workflows for the farm; `farm ci outputs`: what their plan jobs emit;
`farm ci row`: what a row job builds; `farm ci image save|load`: the builder image handed between jobs."""

from __future__ import annotations

from pathlib import Path

from farm.commands.common import add_path, empty_selection, minutes_arg, number_arg
from farm.commands.plan import add_filters, filters_of, selected
from farm.errors import BadInput
from farm.runners.base import RUNNER_KINDS
from farm.runners.images import ARCHES


def register(sub) -> None:
    parser = sub.add_parser("ci", help="export the farm to GitHub Actions (workflows, plan-job outputs)")
    verbs = parser.add_subparsers(dest="ci_verb", metavar="VERB")
    verbs.required = True

    p = verbs.add_parser("github", help="write the build and matrix-refresh workflows")
    add_filters(p)
    add_path(p, "--out", kind="output_dir", default=Path(".github/workflows"), help="default: .github/workflows/")
    add_path(p, "--wheelhouse", kind="input_dir",
             help="whose config.json may name an image_registry (default: the project's wheelhouse)")
    p.set_defaults(func=github_command)

    p = verbs.add_parser("outputs", help="(in a plan job) per chunk of this group, the rows with a cell missing from the wheelhouse")
    add_filters(p)
    p.add_argument("--group", type=number_arg("--group", 1, 10**6, "expected a group number of at least 1",
                                              whole=True), required=True)
    p.add_argument("--layout", required=True, help="the chunk layout digest the workflow was generated with")
    add_path(p, "--wheelhouse", kind="maybe_dir", default=Path("wheelhouse"))
    p.set_defaults(func=outputs_command)

    p = verbs.add_parser("row", help="(in a row job) build a row's Python siblings in sequence into a staging folder")
    add_filters(p)   # the workflow's selection: its row jobs build only the Pythons it selected
    p.add_argument("row", metavar="ROW_ID", help="e.g. farm_demo-cu130-torch2.13 (a cell id without its Python)")
    add_path(p, "--staging", kind="output_dir", help="the staging wheelhouse each built sibling is published into")
    add_path(p, "--wheelhouse", kind="maybe_dir", help="the house that says what is built (default: nothing is)")
    add_path(p, "--out", kind="output_dir", default=Path("build"), help="build folders and row-report.json (default build/)")
    p.add_argument("--runner", choices=RUNNER_KINDS, help="default: container when an engine answers, else host")
    p.add_argument("--budget-minutes", type=minutes_arg("--budget-minutes", 7 * 24 * 60), help="start a sibling only while it fits in these minutes")
    add_path(p, "--summary", kind="output_file", help="append the report as Markdown to this file ($GITHUB_STEP_SUMMARY)")
    p.add_argument("--pythons", action="store_true", help="print the row's Pythons and build nothing")
    p.set_defaults(func=row_command)

    p = verbs.add_parser("image", help="hand the builder image between jobs: save it to, or load it from, a folder")
    p.add_argument("action", choices=("save", "load"))
    p.add_argument("--arch", choices=ARCHES, required=True)
    where = p.add_mutually_exclusive_group(required=True)
    add_path(where, "--dir", kind="output_dir", help="the folder of the image archive (an artifact)")
    where.add_argument("--registry", help="load: pull <registry>:<arch>-<key> instead (wheelhouse/config.json)")
    p.set_defaults(func=image_command)


def github_command(args) -> int:
    from farm import settings
    from farm.run.ciworkflow import actionlint_config, github_workflows
    from farm.wheelhouse import Config
    from farm.yamlio import write_atomic

    registry = Config.load(args.wheelhouse or settings.wheelhouse_dir()).image_registry
    plan, cells, shard = selected(args)   # every value known before anything is written
    if not cells:
        print(f"{empty_selection(args)}; nothing written")
        return 0
    files, chunks, left = github_workflows(plan, cells, filters_of(args), shard, out_dir=str(args.out),
                                           registry=registry)
    for name, text in files.items():
        write_atomic(args.out / name, text)
        print(f"wrote {args.out / name} ({len(text.encode())} bytes)")
    write_atomic(config := actionlint_path(args.out), actionlint_config())
    print(f"wrote {config}")
    lanes = sorted({c.lane for c in chunks})
    built = [c for c in cells if not plan.recipes[c.recipe_name].needs_patch]
    print(f"{len(built)} cells in {sum(len(c.rows) for c in chunks)} row jobs, {len(chunks)} matrices "
          f"({', '.join(lanes) or 'none'})" + (f"; builder image from {registry}" if registry else ""))
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


def row_command(args) -> int:
    from farm.run.cirow import build_row, find_row

    plan, cells, _ = selected(args)
    row = find_row(args.row, plan, cells)
    if args.pythons:
        print(" ".join(c.python for c in row.cells))
        return 0
    if args.staging is None:
        raise BadInput("command line", "--staging", None, "a row job publishes into a staging folder: name it")
    print(f"row {row.id}: {len(row.cells)} sibling(s) ({' '.join(c.python for c in row.cells)}), "
          f"compiler cache group {row.cache_group}", flush=True)
    report = build_row(row, plan, staging=args.staging, wheelhouse=args.wheelhouse, out=args.out,
                       runner_kind=args.runner, budget_minutes=args.budget_minutes)
    if args.summary is not None:
        with open(args.summary, "a") as fh:
            fh.write(report.markdown())
    print(report.summary())
    for s in report.siblings:
        if s.status in ("failed", "deferred"):
            print(f"  {s.status}: {s.cell}: {s.why}")
    return 1 if report.failed else 0


def image_command(args) -> int:
    from farm.runners import images

    if args.action == "save":
        if args.dir is None:
            raise BadInput("command line", "--dir", None, "save writes the archive into a folder: name it")
        print(f"saved {images.save_builder(args.arch, args.dir)}")
        return 0
    archive = None
    if args.dir is not None:
        archive = images.archive_path(args.dir, args.arch)
        if not archive.is_file():
            raise BadInput("command line", "--dir", str(args.dir), f"holds no {archive.name}")
    image = images.adopt_builder(args.arch, archive=archive, registry=args.registry)
    print(f"{image.ref} {image.id[:19]} {image.plat} pythons {' '.join(image.python_versions())}")
    return 0
