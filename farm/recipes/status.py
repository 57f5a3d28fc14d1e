"""Per-recipe build records and the status table generated from them (`farm recipes status`).

A record (`recipes/records/<name>.json`, small, committed) is written by the build itself: at the
end of `farm build --record` (full or smoke), of a flags run, or of a failed build (tier `failed`,
with the first compiler error line); `farm recipes block NAME --why ...` writes a `blocked` one, keeping
the last measured build beside the reason (`last_build`): a build recorded while blocked becomes the new
`last_build`, and `farm recipes unblock NAME` puts it back. Every record is checked by the build record's
one schema (farm/recipes/buildrecord.py) when written and when read.
Every recorded build also leaves the record of its own cell (`recipes/records/<name>/<cell id>.json`,
the same schema): `<name>.json` stays the recipe's status row (its status cell, or the one cell it holds),
and the cell records give the per-cell status, cells built out of cells attempted, with each failing
cell's one-line reason (design.md §4.5).
The table (`docs/recipe-status.md`) is generated from those records and never edited by hand:
every recipe has a row, "not built yet" when it has no record.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm import __version__, settings
from farm.errors import BadInput
from farm.recipes.buildrecord import BuildRecord, write_record
from farm.recipes.cells import cell_id
from farm.yamlio import write_atomic

if TYPE_CHECKING:
    from farm.recipes.model import Recipe

# The cell every recipe's status is measured on (x86_64; torch-free and abi3 recipes have their own id).
STATUS_CUDA, STATUS_TORCH, STATUS_PYTHON, STATUS_PLATFORM = "13.0", "2.13", "3.12", "linux"
NOT_BUILT = "not built yet"
STATUS_DOC = "docs/recipe-status.md"
COLUMNS = ("recipe", "source pin", "patches", "tier", "cell", "cells", "wall", "peak mem", "wheel", "tag", "floor",
           "SASS", "PTX", "gate", "date", "reason")
# A cell is attempted when a build of it was recorded that made a wheel or failed; a flags run builds none.
BUILT_TIERS, ATTEMPTED_TIERS = ("full", "smoke"), ("full", "smoke", "failed")


def records_dir() -> Path:
    return settings.recipes_dir() / "records"


def status_cell_id(recipe) -> str:
    """The recipe's cell on cu130 / torch 2.13 / Python 3.12 / linux, when the recipe has it.

    A recipe whose own `combinations` or `max_torch` stop before torch 2.13 on CUDA 13.0 gets its
    newest CUDA 13.0 torch instead (Python 3.12 there, else that row's newest Python): the id always
    names a cell `farm plan --package` lists, unless the recipe has no CUDA 13.0 linux cell at all."""
    from farm.matrix.grid import load_grid, load_pcwm
    from farm.policy import load_defaults
    from farm.recipes.cells import recipe_cells
    from farm.versions import vtuple

    torch = STATUS_TORCH if recipe.links_torch else None
    wanted = cell_id(recipe.name, STATUS_CUDA, torch, STATUS_PYTHON, STATUS_PLATFORM, recipe.wheel_abi)
    cells = [c for c in recipe_cells(recipe, load_defaults(), load_grid(), load_pcwm())
             if c.cuda == STATUS_CUDA and c.platform == STATUS_PLATFORM]
    if not cells or any(c.id == wanted for c in cells):
        return wanted
    best = max(cells, key=lambda c: (c.torch == STATUS_TORCH, vtuple(c.torch), c.python == STATUS_PYTHON,
                                     vtuple(c.python)))
    return best.id


def record_date() -> str:
    """When a record is written, as every record says it."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- writing

def save_build(recipe: Recipe, record: Mapping[str, Any], folder: Path | None = None) -> Path:
    """Write a build's record as its cell's (`<name>/<cell>.json`), and as the recipe's status row when the
    cell is the recipe's status cell, the cell that row holds already, or the row is not written yet.
    Returns the path of the record written last."""
    folder = Path(folder or records_dir())
    built = BuildRecord(record)
    cell_path = save_cell_record(recipe.name, built, folder)
    held = _existing(folder / f"{recipe.name}.json", strict=False)
    if held is None or built.cell in (held.cell, status_cell_id(recipe)):
        return save_record(recipe.name, built, folder)
    return cell_path


def save_cell_record(name: str, record: Mapping[str, Any], folder: Path | None = None) -> Path:
    """The record of one cell's build, replacing that cell's previous one."""
    built = BuildRecord(record)
    path = Path(folder or records_dir()) / name / f"{built.cell}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_record(path, built, settings.display(path))


def write_blocked_record(name: str, why: str, cell: str, folder: Path | None = None) -> Path:
    """A `blocked` record with the last measured build beside the reason (the one a block replaces keeps
    its own); a malformed record it would keep is refused, nothing written."""
    folder = records_folder(folder, "farm recipes block")
    old = _existing(folder / f"{name}.json", strict=True)
    record: dict[str, object] = {"recipe": name, "cell": cell, "tier": "blocked", "date": record_date(),
                                 "reason": why, "farm_version": __version__}
    last = old.last_build if old is not None and old.tier == "blocked" else old
    if last:
        record["last_build"] = last.to_plain()
    return _write_checked(folder / f"{name}.json", record)


def unblock(name: str, folder: Path | None = None) -> Path:
    """Put the last measured build back in place of a `blocked` record (none: the recipe is not built yet)."""
    path = records_folder(folder, "farm recipes unblock") / f"{name}.json"
    old = _existing(path, strict=True)
    if old is None or old.tier != "blocked":
        raise BadInput(settings.display(path), "tier", old.tier if old else None, f"{name} is not blocked")
    if old.last_build:
        return _write_checked(path, old.last_build)
    path.unlink()
    return path


def save_record(name: str, record: Mapping[str, Any], folder: Path | None = None) -> Path:
    """Write a build's record; while the recipe is blocked it becomes the block's `last_build` (a block
    stays until `farm recipes unblock`)."""
    path = Path(folder or records_dir()) / f"{name}.json"
    old = _existing(path, strict=False)
    built = BuildRecord(record, settings.display(path))
    if old is not None and old.tier == "blocked" and built.tier != "blocked":
        built = old.with_(settings.display(path), last_build=built.to_plain())
    return _write_checked(path, built)


def _write_checked(path: Path, record: Mapping[str, Any]) -> Path:
    where = settings.display(path)
    return write_record(path, BuildRecord(record, where).check_last_build(where), where)


def records_folder(folder: Path | None, verb: str) -> Path:
    """The records folder a verb writes into: an existing folder, else one line (exit 2), nothing created."""
    path = Path(folder or records_dir())
    if not path.is_dir():
        what = "not a folder" if path.exists() or path.is_symlink() else "no such folder (nothing created)"
        raise BadInput(verb, "--records", settings.display(path), what)
    return path


def _existing(path: Path, strict: bool) -> BuildRecord | None:
    """The record at `path` (None when there is none); a malformed one is refused when `strict`, else
    taken for none (a build's fresh record replaces it)."""
    if not path.exists():
        return None
    try:
        return read_record(path)
    except BadInput:
        if strict:
            raise
        return None


# ---------------------------------------------------------------- reading

def read_records(folder: Path) -> dict[str, BuildRecord]:
    """Every `<name>.json` in `folder`, checked: a bad one is refused naming the file, key and value."""
    return {path.stem: read_record(path)
            for path in (sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else [])}


def read_cell_records(folder: Path) -> dict[str, dict[str, BuildRecord]]:
    """recipe -> cell id -> that cell's record, from every `<name>/<cell>.json` in `folder`, checked alike
    (a folder older than per-cell records has none: {})."""
    found: dict[str, dict[str, BuildRecord]] = {}
    for path in sorted(Path(folder).glob("*/*.json")) if Path(folder).is_dir() else []:
        record = read_record(path, recipe=path.parent.name)
        if record.cell != path.stem:
            raise BadInput(settings.display(path), "cell", record.cell, f"the record of {path.name} must name {path.stem}")
        found.setdefault(path.parent.name, {})[path.stem] = record
    return found


def read_record(path: Path, recipe: str | None = None) -> BuildRecord:
    """One record (`<name>.json`, or a cell's `<name>/<cell>.json` with `recipe` given): the build record's
    schema, and what a recipe's record must say besides."""
    return BuildRecord.read_recipe(path, settings.display(path), recipe or path.stem)


# ---------------------------------------------------------------- the table

def _pin(recipe: Recipe, record: BuildRecord | None) -> str:
    if record is not None and record.source_commit:
        return record.source_commit[:12]
    if record is not None and record.source_sha256:
        return f"sha256 {record.source_sha256[:12]}"
    s = recipe.source
    if s.kind == "git":
        return (s.pinned_commit or "")[:12] or f"{s.ref} (tag, commit unrecorded)"
    if s.kind == "sdist":
        return s.pypi or (s.sha256 or "")[:12] or "sdist"
    return f"path {s.path_text}"


def _size(n: float | None) -> str:
    if n is None:
        return ""
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


def wall_text(s: float | None) -> str:
    if s is None:
        return ""
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def _gate(record: BuildRecord) -> str:
    if record.flags:
        from farm.recipes.buildoutput import flags_verdict

        return flags_verdict(record.flags)
    gate, warned = record.gate or "", record.gate_warnings
    return f"{gate} (warn: {', '.join(warned)})" if gate == "pass" and warned else gate


def _tag(record: BuildRecord) -> str:
    """The platform tag the recipe's wheel reached, short (manylinux_2_34: the status cell is x86_64); a
    record from before tags were recorded has it in its wheel's file name."""
    from farm.platforms import plat_glibc

    tag = record.tag or ""
    glibcs = []
    for part in tag.split(".") if tag else []:
        try:
            glibcs.append(plat_glibc(part))
        except ValueError:
            return tag
    return f"manylinux_{min(glibcs)[0]}_{min(glibcs)[1]}" if glibcs else tag


def _floor(record: BuildRecord | None) -> str:
    """The floor the build was held to; "-" for a record from before floors were kept (unknown)."""
    if not record:
        return ""
    return record.floor_text or "-"


def cell_tally(record: BuildRecord | None,
               cells: Mapping[str, BuildRecord]) -> tuple[int, int, list[tuple[str, str]]]:
    """(cells built, cells attempted, [(cell, reason)] of the failing ones) over a recipe's cell records and
    its status row (a record older than per-cell records counts for its cell; of two, the newer)."""
    latest = dict(cells)
    if record is not None and record.cell and record.tier in ATTEMPTED_TIERS:
        mine = latest.get(record.cell)
        if mine is None or str(record.date) > str(mine.date):
            latest[record.cell] = record
    tried = {c: r for c, r in latest.items() if r.tier in ATTEMPTED_TIERS}
    built = sum(r.tier in BUILT_TIERS for r in tried.values())
    failing = sorted((c, r.reason or "") for c, r in tried.items() if r.tier == "failed")
    return built, len(tried), failing


def status_rows(recipes: Mapping[str, Recipe], records: Mapping[str, BuildRecord],
                cells: Mapping[str, Mapping[str, BuildRecord]] | None = None) -> list[dict[str, str]]:
    """One row per recipe, in name order: COLUMNS -> the text shown (`cells`: built/attempted)."""
    rows = []
    for name in sorted(recipes):
        recipe, rec = recipes[name], records.get(name)
        built, tried, _ = cell_tally(rec, (cells or {}).get(name, {}))
        note = ""
        if rec is not None and rec.tier == "blocked" and (last := rec.last_build):   # its figures, the block's words
            note = f"last build {last.tier}"
            rec = last.without("tier_asked").with_(tier=rec.tier, date=rec.date, reason=rec.reason, cell=rec.cell)
        if rec is None:
            rows.append({c: "" for c in COLUMNS} | {
                "recipe": name, "source pin": _pin(recipe, None),
                "patches": ", ".join(p.file for p in recipe.patches) or "-", "tier": NOT_BUILT,
                "cell": status_cell_id(recipe), "cells": f"{built}/{tried}" if tried else ""})
            continue
        patches = rec.patch_files or tuple(p.file for p in recipe.patches)
        peak, hits = rec.peak_mb, rec.cache_hits
        rows.append({
            "recipe": name, "source pin": _pin(recipe, rec), "patches": ", ".join(patches) or "-",
            "tier": (rec.tier or NOT_BUILT) + (f" (asked {rec.tier_asked})" if rec.tier_asked else "")
            + (f" ({note})" if note else ""),
            "cell": rec.cell or status_cell_id(recipe), "cells": f"{built}/{tried}" if tried else "",
            "wall": wall_text(rec.wall_s) + (f" ({hits} ccache hit{'s' if hits > 1 else ''})" if hits else ""),
            "peak mem": f"{peak / 1024:.1f} GB" if peak else "", "wheel": _size(rec.wheel_bytes),
            "tag": _tag(rec), "floor": _floor(rec),
            "SASS": " ".join(rec.sass), "PTX": " ".join(rec.ptx), "gate": _gate(rec),
            "date": (rec.date or "")[:10], "reason": rec.reason or "",
        })
    return rows


def render_text(rows: list[dict[str, str]]) -> str:
    shown = [c for c in COLUMNS if c != "reason"]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in shown}
    lines = ["  ".join(c.ljust(widths[c]) for c in shown)]
    for r in rows:
        lines.append("  ".join(r[c].ljust(widths[c]) for c in shown).rstrip()
                     + (f"  -- {r['reason']}" if r["reason"] else ""))
    return "\n".join(lines) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|") or " "


def render_failing_cells(recipes: Mapping[str, Recipe], records: Mapping[str, BuildRecord],
                         cells: Mapping[str, Mapping[str, BuildRecord]]) -> str:
    """The section below the table: each recipe's failing cells with their one-line reasons."""
    lines = ["## Failing cells", "",
             "Per recipe, each recorded cell whose last build failed, with its first error line "
             "(`cells` in the table: built, full or smoke, out of attempted, built or failed).", ""]
    failing = [(name, cell_tally(records.get(name), cells.get(name, {}))) for name in sorted(recipes)]
    items = [f"- **{name}** ({built}/{tried} built): `{cell}`: {reason or 'no reason recorded'}"
             for name, (built, tried, bad) in failing for cell, reason in bad]
    return "\n".join(lines + (items or ["No recorded cell failed."])) + "\n"


def render_markdown(rows: list[dict[str, str]], records_folder: str) -> str:
    tiers: dict[str, int] = {}
    for r in rows:
        tier = r["tier"].split(" (")[0]
        tiers[tier] = tiers.get(tier, 0) + 1
    counts = ", ".join(f"{n} {t}" for t, n in sorted(tiers.items()))
    head = [
        "# Recipe status",
        "",
        f"Generated by `farm recipes status` from the build records in `{records_folder}/`; do not edit by hand.",
        f"The status cell is CUDA {STATUS_CUDA} / torch {STATUS_TORCH} / Python {STATUS_PYTHON} / "
        f"{STATUS_PLATFORM} (x86_64). Tiers: full (built and verified), smoke (one arch token built and verified), "
        "flags (nvcc's targets recorded and compared, not built), failed, blocked. `tag`: the platform tag the "
        "wheel reached; `floor`: the manylinux floor the gate held it to (design.md §7.8), `-` for a build "
        "recorded before floors were.",
        "",
        f"{len(rows)} recipes: {counts}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" for _ in COLUMNS) + "|",
    ]
    body = ["| " + " | ".join(_md_cell(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(head + body) + "\n"


def status_doc() -> Path:
    """The table's default file: the project's docs/recipe-status.md for the project's recipes; beside the
    recipes (DIR/recipe-status.md) for a folder of one's own, whose table must not overwrite the project's."""
    own = settings.PROJECT_ROOT / "recipes"
    folder = settings.recipes_dir()
    return settings.PROJECT_ROOT / STATUS_DOC if folder.resolve() == own.resolve() else folder / "recipe-status.md"


def generate(records_folder: Path | None = None, out: Path | None = None) -> tuple[str, Path]:
    """Read every record (refusing a bad one before writing anything), write the markdown table;
    the text table and the file written."""
    from farm.recipes.reader import load_recipes

    folder = Path(records_folder or records_dir())
    records, cells = read_records(folder), read_cell_records(folder)
    recipes = load_recipes()
    rows = status_rows(recipes, records, cells)
    target = Path(out or status_doc())
    write_atomic(target, render_markdown(rows, settings.display(folder)) + "\n"
                 + render_failing_cells(recipes, records, cells))
    stale = sorted((set(records) | set(cells)) - set(recipes))
    text = render_text(rows) + (f"records without a recipe (ignored): {', '.join(stale)}\n" if stale else "")
    return text, target


# ---------------------------------------------------------------- CLI: farm recipes status | block | rebuild

def status_command(args) -> int:
    text, target = generate(args.records, args.out)
    print(text, end="")
    print(f"wrote {settings.display(target)}")
    return 0


def known_recipe(name: str):
    """The loaded recipe `name`, or one line naming the folder that lacks it."""
    from farm.recipes.reader import load_recipes

    recipes = load_recipes()
    if name not in recipes:
        raise BadInput("farm recipes", "name", name, f"no such recipe in {settings.display(settings.recipes_dir())}/")
    return recipes[name]


def block_command(args) -> int:
    why = " ".join(args.why.split())
    if not why or "\n" in args.why.strip():
        raise BadInput("farm recipes block", "--why", args.why, "say what blocks it in one non-empty line")
    recipe = known_recipe(args.name)
    path = write_blocked_record(recipe.name, why, status_cell_id(recipe), args.records)
    print(f"{recipe.name}: blocked ({why}); recorded in {settings.display(path)}")
    return 0


def unblock_command(args) -> int:
    recipe = known_recipe(args.name)
    path = unblock(recipe.name, args.records)
    state = "its last build put back" if path.exists() else "not built yet"
    print(f"{recipe.name}: unblocked ({state}) in {settings.display(path)}")
    return 0


def rebuild_command(args) -> int:
    """One build at a time (each may use every core), records written even when a build fails."""
    import sys

    from farm.process import call

    if args.arch is not None and args.tier != "smoke":
        raise BadInput("farm recipes rebuild", "--arch", args.arch, "only the smoke tier builds one chosen token")
    if args.minutes is not None and args.tier != "flags":
        raise BadInput("farm recipes rebuild", "--for", f"{args.minutes:g}", "only the flags tier stops after a time")
    cells = [status_cell_id(known_recipe(name)) for name in args.names]   # every name checked before building
    if args.arch is not None:   # and the token, in every cell's list, before a build or the table is written
        from farm.recipes.cells import smoke_cell
        from farm.recipes.plan import cell_plan

        for cell in cells:
            smoke_cell(cell_plan(cell)[0], args.arch)
    failed = []
    for cell in cells:
        # a cold compile: the record's wall time and peak memory set the recipe's timeout and peak_gb_per_job
        argv = [sys.executable, "-m", "farm", "build", cell, "--runner", args.runner, "--record", "--force",
                "--no-publish", "--no-compiler-cache"]
        if args.tier == "smoke":
            argv += ["--smoke"] + (["--arch", args.arch] if args.arch is not None else [])
        elif args.tier == "flags":
            argv += ["--flags-only"] + (["--for", f"{args.minutes:g}"] if args.minutes is not None else [])
        print(f"$ farm {' '.join(argv[3:])}", flush=True)
        if call(argv) != 0:
            failed.append(cell)
    text, target = generate()
    print(text, end="")
    print(f"wrote {settings.display(target)}")
    if failed:
        print(f"farm: {len(failed)} of {len(cells)} builds failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
