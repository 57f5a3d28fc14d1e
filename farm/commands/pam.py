"""`farm pam measure`: torch's own arch list, read out of a torch wheel or environment (design.md §3.8)."""

from __future__ import annotations

from farm import settings
from farm.arch.pam import measure, write_measurement
from farm.commands.common import add_path, print_json
from farm.policy import PAM_MEASURED_FILE, load_defaults


def register(sub) -> None:
    parser = sub.add_parser("pam", help="PyTorch arches matrix: measure torch's own arch list")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    m = verbs.add_parser("measure", help="read torch's arch list from its libtorch_cuda*.so and record it "
                                         f"in defaults/{PAM_MEASURED_FILE} (it overrides the table)")
    add_path(m, "source", kind="input", metavar="TORCH_WHEEL_OR_ENV",
                   help="a torch wheel file, or an environment (venv, prefix, site-packages) with torch")
    add_path(m, "--out", kind="output_file", help=f"write here instead of defaults/{PAM_MEASURED_FILE}")
    m.add_argument("--dry-run", action="store_true", help="print the measurement, write nothing")
    m.add_argument("--format", choices=("text", "json"), default="text")
    m.set_defaults(func=measure_command)


def measure_command(args) -> int:
    result = measure(args.source)
    table = load_defaults().pam.lookup(result.torch_minor, result.cuda, result.platform)
    written = None if args.dry_run else write_measurement(result, args.out)
    if args.format == "json":
        print_json({**result.as_dict(), "table_before": None if table is None else table.torch(),
                    "written": None if written is None else str(written)})
        return 0
    print(f"torch {result.torch_version} ({result.platform}, CUDA {result.cuda}): {result.arch_list}")
    if result.partial:
        print(f"  only some kernels: {' '.join(result.partial)}")
    before = "unknown" if table is None else str(table)
    print(f"  table said: {before}" + ("" if table is None or table == result.arch_list else "  (differs)"))
    if written:
        print(f"  recorded in {settings.display(written)} (overrides the table for this combo)")
    return 0
