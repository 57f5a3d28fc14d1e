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

import json
import os
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm import __version__, settings
from farm.errors import BadInput, shorten
from farm.recipes.buildrecord import RECORD_TIERS, check_build_record, write_record
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


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _portable(text: str, *prefixes: Path) -> str:
    """A line fit for a committed file: the machine's folders cut off (work dir, project, home)."""
    for prefix in prefixes:
        text = text.replace(str(prefix).rstrip("/") + "/", "")
    return text.replace(str(Path.home()), "~")


# ---------------------------------------------------------------- writing

def write_build_record(recipe, cell, *, tier: str, tier_asked: str, out: Path, key: str, runner: str,
                       started: float, build: dict | None = None, reason: str | None = None) -> Path:
    """The record of one build of `cell` from its output folder (steps.json, verify.json, build.json)."""
    import time

    from farm.recipes.buildoutput import arches_found, by_arch, first_error

    state = _read_json(out / "steps.json")
    source = state.get("source") or {}
    work_src = Path(source.get("work_dir") or settings.work_dir(cell.id) / "src")
    report = _read_json(out / "verify.json")
    union = arches_found(report)
    build = build or {}
    wheel = build.get("wheel")
    wheel_path = out / "wheel" / wheel if wheel else None
    compile_state = state.get("compile") or {}
    record = {
        "recipe": recipe.name, "cell": cell.id, "tier": tier, "date": _now(),
        # no description: a path source's names this machine's folder
        "source": {k: source.get(k) for k in ("kind", "commit", "sha256", "pin") if source.get(k)},
        "patches": [{"file": f, "sha256": h} for f, h in source.get("patches") or []],
        "arch_list": cell.arch.arch_list.torch(), "wall_s": round(time.time() - started, 1),
        "steps": state.get("timings") or {}, "peak_mb": compile_state.get("peak_process_mb"),
        "runner": runner, "build_key": key, "farm_version": __version__,
    }
    # what the wall time was bought with: an estimate turns it into CPU-hours (design.md §5.5)
    limits = (build.get("runner_info") or {}).get("limits") or {}
    if layer := {k: v for k, v in (build.get("runner_info") or {}).items() if k in ("layer_of", "system_packages")}:
        record["image_layer"] = {"ref": build["runner_info"].get("image_ref"), **layer}   # design.md §8.5
    record["cores"] = max(1, int(limits.get("cpus") or os.cpu_count() or 1))
    for key in ("max_jobs", "nvcc_threads"):   # a smoke build trades threads for jobs (farm.build.cell.smoke_parallelism)
        if build.get(key):
            record[key] = build[key]
    if tier_asked == "smoke" or tier == "smoke":
        record["smoke_of"] = cell.arch.provenance
    if report:
        record["gate"] = "pass" if report.get("passed") else "fail: " + ", ".join(report.get("failed") or [])
        record["gate_warnings"] = report.get("warned") or []
        record["sass"], record["ptx"] = by_arch(union["sass"]), by_arch(union["ptx"])
    cache = compile_state.get("compiler_cache") or {}
    stats = cache.get("stats") or {}
    # a warm cache makes wall time and peak memory a rebuild's, not a compile's: say so
    record["compiler_cache"] = {"active": bool(cache.get("active")), "hits": stats.get("hits"),
                                "misses": stats.get("misses")}
    if compile_state.get("flags"):
        flags = compile_state["flags"]
        record["flags"] = flags
        record["sass"], record["ptx"] = flags["sass"], flags["ptx"]
    if wheel_path is not None and wheel_path.is_file():
        record["wheel"], record["wheel_bytes"] = wheel, wheel_path.stat().st_size
    # the tag reached (a wheel the gate failed has one too) and the floor it was held to (design.md §7.8)
    if tag := build.get("tag") or (state.get("repair") or {}).get("plat_tag"):
        record["tag"] = tag
    if floor := build.get("floor") or (_read_json(out / "spec-host.json").get("record") or {}).get("floor"):
        record["floor"] = floor
    if tier == "failed":
        record["tier_asked"] = tier_asked
        line = first_error(out / "compile.log") if "compile" in (state.get("failed") or {}) else None
        line = line or re.sub(r"\s*\(log: [^)]*\)$", "", reason or "")
        record["reason"] = shorten(_portable(line, work_src, out, settings.PROJECT_ROOT))
    return save_build(recipe, record)


def save_build(recipe, record: dict, folder: Path | None = None) -> Path:
    """Write a build's record as its cell's (`<name>/<cell>.json`), and as the recipe's status row when the
    cell is the recipe's status cell, the cell that row holds already, or the row is not written yet.
    Returns the path of the record written last."""
    folder = Path(folder or records_dir())
    cell_path = save_cell_record(recipe.name, record, folder)
    held = _existing(folder / f"{recipe.name}.json", strict=False)
    if held is None or record["cell"] in (held.get("cell"), status_cell_id(recipe)):
        return save_record(recipe.name, record, folder)
    return cell_path


def save_cell_record(name: str, record: dict, folder: Path | None = None) -> Path:
    """The record of one cell's build, replacing that cell's previous one."""
    path = Path(folder or records_dir()) / name / f"{record['cell']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_record(path, record, settings.display(path))


def write_blocked_record(name: str, why: str, cell: str, folder: Path | None = None) -> Path:
    """A `blocked` record with the last measured build beside the reason (the one a block replaces keeps
    its own); a malformed record it would keep is refused, nothing written."""
    folder = records_folder(folder, "farm recipes block")
    old = _existing(folder / f"{name}.json", strict=True)
    record: dict[str, object] = {"recipe": name, "cell": cell, "tier": "blocked", "date": _now(), "reason": why,
              "farm_version": __version__}
    last = (old or {}).get("last_build") if (old or {}).get("tier") == "blocked" else old
    if last:
        record["last_build"] = last
    return _write_checked(folder / f"{name}.json", record)


def unblock(name: str, folder: Path | None = None) -> Path:
    """Put the last measured build back in place of a `blocked` record (none: the recipe is not built yet)."""
    path = records_folder(folder, "farm recipes unblock") / f"{name}.json"
    old = _existing(path, strict=True)
    if not old or old.get("tier") != "blocked":
        raise BadInput(settings.display(path), "tier", (old or {}).get("tier"), f"{name} is not blocked")
    if old.get("last_build"):
        return _write_checked(path, old["last_build"])
    path.unlink()
    return path


def save_record(name: str, record: dict, folder: Path | None = None) -> Path:
    """Write a build's record; while the recipe is blocked it becomes the block's `last_build` (a block
    stays until `farm recipes unblock`)."""
    path = Path(folder or records_dir()) / f"{name}.json"
    old = _existing(path, strict=False)
    if old and old.get("tier") == "blocked" and record.get("tier") != "blocked":
        record = {**old, "last_build": record}
    return _write_checked(path, record)


def _write_checked(path: Path, record: dict) -> Path:
    where = settings.display(path)
    check_build_record(where, record.get("last_build") or {}, prefix="last_build.")
    return write_record(path, record, where)


def records_folder(folder: Path | None, verb: str) -> Path:
    """The records folder a verb writes into: an existing folder, else one line (exit 2), nothing created."""
    path = Path(folder or records_dir())
    if not path.is_dir():
        what = "not a folder" if path.exists() or path.is_symlink() else "no such folder (nothing created)"
        raise BadInput(verb, "--records", settings.display(path), what)
    return path


def _existing(path: Path, strict: bool) -> dict | None:
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

def read_records(folder: Path) -> dict[str, dict]:
    """Every `<name>.json` in `folder`, checked: a bad one is refused naming the file, key and value."""
    return {path.stem: read_record(path)
            for path in (sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else [])}


def read_cell_records(folder: Path) -> dict[str, dict[str, dict]]:
    """recipe -> cell id -> that cell's record, from every `<name>/<cell>.json` in `folder`, checked alike
    (a folder older than per-cell records has none: {})."""
    found: dict[str, dict[str, dict]] = {}
    for path in sorted(Path(folder).glob("*/*.json")) if Path(folder).is_dir() else []:
        record = read_record(path, recipe=path.parent.name)
        if record["cell"] != path.stem:
            raise BadInput(settings.display(path), "cell", record["cell"], f"the record of {path.name} must name {path.stem}")
        found.setdefault(path.parent.name, {})[path.stem] = record
    return found


def read_record(path: Path, recipe: str | None = None) -> dict:
    """One record (`<name>.json`, or a cell's `<name>/<cell>.json` with `recipe` given): the build record's
    schema, and what a recipe's record must say besides."""
    where = settings.display(path)
    recipe = recipe or path.stem
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadInput(where, None, None, f"not a JSON build record: {shorten(str(exc), 120)}") from None
    if not isinstance(data, dict):
        raise BadInput(where, None, type(data).__name__, "a build record is a JSON object")
    if data.get("recipe") != recipe:
        raise BadInput(where, "recipe", data.get("recipe"), f"the record of {path.name} must name {recipe}")
    if data.get("tier") not in RECORD_TIERS:
        raise BadInput(where, "tier", data.get("tier"), f"expected one of {', '.join(RECORD_TIERS)}")
    for key in ("cell", "date"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise BadInput(where, key, data.get(key), "expected a non-empty string")
    if data["tier"] in ("failed", "blocked") and not (isinstance(data.get("reason"), str) and data["reason"]):
        raise BadInput(where, "reason", data.get("reason"), f"a {data['tier']} record says why in one line")
    check_build_record(where, data)
    if data.get("last_build") is not None:
        check_build_record(where, data["last_build"], prefix="last_build.")
    return data


# ---------------------------------------------------------------- the table

def _pin(recipe, record: dict) -> str:
    src = record.get("source") or {}
    if src.get("commit"):
        return src["commit"][:12]
    if src.get("sha256"):
        return f"sha256 {src['sha256'][:12]}"
    s = recipe.source
    if s.kind == "git":
        return (s.pinned_commit or "")[:12] or f"{s.ref} (tag, commit unrecorded)"
    if s.kind == "sdist":
        return s.pypi or (s.sha256 or "")[:12] or "sdist"
    return f"path {s.path_text}"


def _size(n) -> str:
    if n is None:
        return ""
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


def wall_text(s) -> str:
    if s is None:
        return ""
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def _gate(record: dict) -> str:
    from farm.recipes.buildoutput import flags_differences, sample_text, waived_text

    flags = record.get("flags")
    if flags:
        if flags.get("equal"):
            waived = f"{waived_text(flags)}; " if flags.get("waived") else ""
            return f"flags equal the list ({waived}{flags.get('compiling_invocations')} nvcc calls{sample_text(flags)})"
        return f"flags differ: {flags_differences(flags) or 'no nvcc call seen'}"
    gate = record.get("gate") or ""
    warned = record.get("gate_warnings") or []
    return f"{gate} (warn: {', '.join(warned)})" if gate == "pass" and warned else gate


def _tag(record: dict) -> str:
    """The platform tag the recipe's wheel reached, short (manylinux_2_34: the status cell is x86_64); a
    record from before tags were recorded has it in its wheel's file name."""
    from farm.platforms import plat_glibc

    tag = record.get("tag") or (record["wheel"][: -len(".whl")].split("-")[-1] if record.get("wheel") else "")
    glibcs = []
    for part in tag.split(".") if tag else []:
        try:
            glibcs.append(plat_glibc(part))
        except ValueError:
            return tag
    return f"manylinux_{min(glibcs)[0]}_{min(glibcs)[1]}" if glibcs else tag


def _floor(record: dict) -> str:
    """The floor the build was held to; "-" for a record from before floors were kept (unknown)."""
    if not record:
        return ""
    return (record.get("floor") or {}).get("text") or "-"


def cell_tally(record: dict, cells: Mapping[str, dict]) -> tuple[int, int, list[tuple[str, str]]]:
    """(cells built, cells attempted, [(cell, reason)] of the failing ones) over a recipe's cell records and
    its status row (a record older than per-cell records counts for its cell; of two, the newer)."""
    latest = dict(cells)
    if record.get("tier") in ATTEMPTED_TIERS:
        mine = latest.get(record["cell"])
        if mine is None or str(record.get("date")) > str(mine.get("date")):
            latest[record["cell"]] = record
    tried = {c: r for c, r in latest.items() if r.get("tier") in ATTEMPTED_TIERS}
    built = sum(r["tier"] in BUILT_TIERS for r in tried.values())
    failing = sorted((c, r.get("reason") or "") for c, r in tried.items() if r["tier"] == "failed")
    return built, len(tried), failing


def status_rows(recipes: Mapping[str, Recipe], records: dict[str, dict],
                cells: Mapping[str, Mapping[str, dict]] | None = None) -> list[dict[str, str]]:
    """One row per recipe, in name order: COLUMNS -> the text shown (`cells`: built/attempted)."""
    rows = []
    for name in sorted(recipes):
        recipe, rec = recipes[name], records.get(name, {})
        built, tried, _ = cell_tally(rec, (cells or {}).get(name, {}))
        if rec.get("tier") == "blocked" and rec.get("last_build"):   # its figures, the block's words
            last = rec["last_build"]
            rec = {**{k: v for k, v in last.items() if k != "tier_asked"},
                   **{k: rec[k] for k in ("tier", "date", "reason", "cell")},
                   "tier_note": f"last build {last.get('tier')}"}
        patches = [p["file"] for p in rec.get("patches") or []] if rec.get("patches") else \
            [p.file for p in recipe.patches]
        peak = rec.get("peak_mb")
        hits = (rec.get("compiler_cache") or {}).get("hits")
        rows.append({
            "recipe": name, "source pin": _pin(recipe, rec), "patches": ", ".join(patches) or "-",
            "tier": rec.get("tier", NOT_BUILT) + (f" (asked {rec['tier_asked']})" if rec.get("tier_asked") else "")
            + (f" ({rec['tier_note']})" if rec.get("tier_note") else ""),
            "cell": rec.get("cell") or status_cell_id(recipe), "cells": f"{built}/{tried}" if tried else "",
            "wall": wall_text(rec.get("wall_s")) + (f" ({hits} ccache hit{'s' if hits > 1 else ''})" if hits else ""),
            "peak mem": f"{peak / 1024:.1f} GB" if peak else "", "wheel": _size(rec.get("wheel_bytes")),
            "tag": _tag(rec), "floor": _floor(rec),
            "SASS": " ".join(rec.get("sass") or []), "PTX": " ".join(rec.get("ptx") or []), "gate": _gate(rec),
            "date": (rec.get("date") or "")[:10], "reason": rec.get("reason") or "",
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


def render_failing_cells(recipes: Mapping[str, Recipe], records: dict[str, dict],
                         cells: Mapping[str, Mapping[str, dict]]) -> str:
    """The section below the table: each recipe's failing cells with their one-line reasons."""
    lines = ["## Failing cells", "",
             "Per recipe, each recorded cell whose last build failed, with its first error line "
             "(`cells` in the table: built, full or smoke, out of attempted, built or failed).", ""]
    failing = [(name, cell_tally(records.get(name, {}), cells.get(name, {}))) for name in sorted(recipes)]
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
