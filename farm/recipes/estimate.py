"""What a plan costs: cells, rows, CPU-hours and wall hours per recipe and lane (design.md §5.5).

`farm plan --estimate` prices every selected cell from the recipe's build record (design.md §4.5),
measured on the farm's own host, and says for each figure where it came from:

- measured: a full, cold build record of a cell with the same number of arch tokens;
- scaled:   a full record carried to another arch count (the compile step only: each arch costs
            about one more device pass of every kernel, the same work per token) or to the arm64 lane;
- sampled:  a flags record whose stopped compile finished some of its objects: their mean CPU-seconds
            (the nvcc wrapper's `times`) times the compile's object count (ninja's total), for its arch
            count; scaled to other arch counts like a full record;
- default:  no usable record (none, blocked, failed, smoke, flags without a sample, or a warm rebuild): the recipe's
            timeout / TIMEOUT_MARGIN, else DEFAULT_CELL_MINUTES, never below what a failed or stopped
            attempt already spent; every Windows figure (no Windows build has a record).

Rows, not cells, are the unit of scheduling: a row is one (recipe, CUDA, torch, platform), whose
Pythons share a compiler cache, so its first cell costs the full figure and each later one a share of
it: the share the recipe's own recorded rows measured, else SIBLING_COST. Wall hours at N runners are
max(row hours / N, the longest row).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from farm import settings
from farm.errors import BadInput
from farm.platforms import PLATFORMS, cell_suffix
from farm.recipes.buildrecord import BuildRecord
from farm.recipes.cells import row_id, row_of_cell_id
from farm.recipes.status import read_cell_records, read_records, records_dir, wall_text

if TYPE_CHECKING:
    from farm.policy import Defaults
    from farm.recipes.cells import Cell
    from farm.recipes.model import Recipe

# A row's Python after the first, against the first, when they share the compiler cache (design.md §11.3),
# for a recipe whose records hold no row of its own to measure it: four Pythons of a row cost 2.08x one
# cell for farm_demo and 2.28x for diso (measured on this farm's 2-core host), i.e. (2.08 - 1) / 3 = 0.36
# and (2.28 - 1) / 3 = 0.43 per sibling. The higher one, so that a farm sized from the estimate is not short.
# Measured rows range from 0.09 (pyg_lib, all of it served by the cache) to about 1 (a TU per Python.h).
SIBLING_COST = 0.43
# The committed records were measured on a 2-core host; a record that names its `cores` is taken at its word.
RECORD_HOST_CORES = 2
# The recipes' measured timeouts are about three times the cold wall time they were set from
# (torch_cluster 32.2 min -> 105, flex_gemm 61 -> 195, sageattention 30.5 -> 90), and their unmeasured
# ones were guessed by the same rule: a timeout / 3 is the recipe author's own estimate of one cell.
TIMEOUT_MARGIN = 3.0
# No record and no timeout: about the mean cold wall time of the full records (13.6 min over 16
# recipes, from 1.2 min for diso to 61 min for flex_gemm).
DEFAULT_CELL_MINUTES = 15.0
# A full record counts as cold when the compiler cache served at most this share of its compiles: a CMake
# build's compiler check can hit in an otherwise cold build (pyg_lib's first Python: 1 hit in 106).
COLD_HIT_SHARE = 0.05
# Per lane, against the x86 Linux figure. arm64: GitHub's native arm64 runners are assumed (no QEMU,
# design.md §8.4); their speed per core is taken as x86's, not measured. Windows: nothing measured
# (no Windows build has a record); MSVC host passes and no manylinux toolchain cache are assumed to
# cost half again.
LANE_FACTOR = {"linux": 1.0, "linux_aarch64": 1.0, "windows": 1.5}
DEFAULT_RUNNERS = 20
SOURCES = ("measured", "scaled", "sampled", "default")   # in order of directness: a group shows its least direct


@dataclass(frozen=True)
class Basis:
    """What one recipe's figures rest on: a full record, or a default with its reason."""

    source: str          # measured | default
    wall_s: float        # one cell of the basis' arch list, wall seconds on the measuring host
    compile_s: float     # the part that grows with the arch count (0 for a default)
    tokens: int          # arch tokens of the recorded cell (0: a default, not scaled by archs)
    cores: int           # cores the build keeps busy: min(host cores, max_jobs x nvcc_threads)
    why: str             # one line, e.g. 'full record: 7.4 min for 6 archs on 2 cores'
    sibling: float = SIBLING_COST   # a row's later Python against its first


@dataclass(frozen=True)
class Priced:
    """One cell's figure: wall seconds on one runner, CPU seconds, and where the figure came from."""

    wall_s: float
    cpu_s: float
    source: str
    why: str                     # the basis' line
    scaled_to: int | None = None  # the arch count the compile step was scaled to
    note: str | None = None      # what the lane changed


@dataclass
class Tally:
    """Cells, rows and hours of a group of cells (one recipe in one lane, a lane, the whole plan)."""

    cells: int = 0
    rows: int = 0
    cpu_s: float = 0.0
    row_walls: list[float] = field(default_factory=list)
    cpu_by_source: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0.0))
    why: set[str] = field(default_factory=set)
    scaled_to: set[int] = field(default_factory=set)
    notes: set[str] = field(default_factory=set)

    def add_row(self, cells: list[Priced], sibling: float) -> None:
        # the first Python fills the compiler cache, its siblings pay `sibling` of it
        ordered = sorted(cells, key=lambda p: -p.wall_s)
        weights = [1.0] + [sibling] * (len(ordered) - 1)
        self.cells += len(ordered)
        self.rows += 1
        self.row_walls.append(sum(w * p.wall_s for w, p in zip(weights, ordered, strict=True)))
        for w, p in zip(weights, ordered, strict=True):
            self.cpu_s += w * p.cpu_s
            self.cpu_by_source[p.source] += w * p.cpu_s
            self.why.add(p.why)
            self.scaled_to |= {p.scaled_to} if p.scaled_to else set()
            self.notes |= {p.note} if p.note else set()

    def merge(self, other: Tally) -> None:
        self.cells += other.cells
        self.rows += other.rows
        self.cpu_s += other.cpu_s
        self.row_walls += other.row_walls
        for s in SOURCES:
            self.cpu_by_source[s] += other.cpu_by_source[s]
        self.why |= other.why
        self.scaled_to |= other.scaled_to
        self.notes |= other.notes

    def basis(self) -> str:
        """The figures' bases in one line: 'full record: 3.0 min for 6 archs on 2 cores, scaled to 2, 4 archs'."""
        scaled = f", scaled to {', '.join(map(str, sorted(self.scaled_to)))} archs" if self.scaled_to else ""
        return "; ".join(sorted(self.why)) + scaled + "".join(f", {n}" for n in sorted(self.notes))

    @property
    def source(self) -> str:
        """The least direct source of any of its figures."""
        used = [s for s in SOURCES if self.cpu_by_source[s] > 0]
        return used[-1] if used else SOURCES[0]

    def cpu_hours(self) -> float:
        return self.cpu_s / 3600

    def wall_hours(self, runners: int) -> float:
        """Rows spread over `runners` runners like the measuring host, packed perfectly; never below the
        longest row, which one runner builds from start to end."""
        if not self.row_walls:
            return 0.0
        return max(sum(self.row_walls) / runners, max(self.row_walls)) / 3600


@dataclass(frozen=True)
class Estimate:
    runners: int
    by_recipe: dict[tuple[str, str], Tally]    # (recipe, platform) -> its tally
    by_lane: dict[str, Tally]                  # platform -> tally

    def total(self) -> Tally:
        whole = Tally()
        for tally in self.by_lane.values():
            whole.merge(tally)
        return whole

    def total_wall_hours(self) -> float:
        """Each lane runs on its own N runners (x86, arm64 and Windows runners differ), all at once."""
        return max((t.wall_hours(self.runners) for t in self.by_lane.values()), default=0.0)


# ---------------------------------------------------------------- one recipe's basis

def _cores(recipe: Recipe, defaults: Defaults, record: BuildRecord) -> int:
    jobs, threads = recipe.parallelism(defaults)
    jobs, threads = record.max_jobs or jobs, record.nvcc_threads or threads
    return max(1, min(record.cores or RECORD_HOST_CORES, jobs * threads))


def _arch_tokens(record: BuildRecord, where: str) -> int:
    text = record.arch_list_raw
    if not isinstance(text, str) or not text.split():
        raise BadInput(where, "arch_list", text, "a full record names the arch list it built, e.g. '8.0 9.0+PTX'")
    return len(text.split())


def _compile_seconds(record: BuildRecord, wall: float, where: str) -> float:
    # a record without step times: all of its wall time is taken to grow with the archs
    value = record.compile_s
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= wall:
        raise BadInput(where, "steps.compile", value, f"expected seconds between 0 and wall_s ({wall})")
    return float(value)


def _x86_linux(cell: str) -> bool:
    """Whether a record's cell id is of the x86 Linux lane, the one every basis is a figure of."""
    return not cell.endswith(tuple(cell_suffix(p) for p in PLATFORMS if cell_suffix(p)))


def is_cold_full(record: BuildRecord) -> bool:
    """A full build whose compile the cache (nearly) did not serve: what one cell costs from nothing."""
    if record.tier != "full" or not record.wall_s:
        return False
    hits = record.cache_hits or 0
    return hits <= COLD_HIT_SHARE * (hits + (record.cache_misses or 0))


def cold_records(name: str, status: BuildRecord | None, cells: Mapping[str, BuildRecord],
                 folder: Path) -> list[tuple[BuildRecord, Path]]:
    """Every cold full x86 build the recipe has a record of, oldest first, with its file: the status cell's
    and its cell records' (one per cell and date). Since the cache shares torch's headers across Pythons,
    most of a slice's cells are siblings that it served, and the cold ones are the first Python of each row."""
    found: dict[tuple[str, str], tuple[BuildRecord, Path]] = {}
    if status is not None and is_cold_full(status):
        found[(status.cell or name, status.date or "")] = (status, folder / f"{name}.json")
    for cell, record in cells.items():
        if is_cold_full(record) and _x86_linux(cell):
            found[(cell, record.date or "")] = (record, folder / name / f"{cell}.json")
    return [found[key] for key in sorted(found, key=lambda k: (k[1], k[0]))]


def mean_basis(bases: list[Basis]) -> Basis:
    """One figure from several measured ones: the mean of those with the newest one's arch count. Cells of
    one recipe differ by more than noise (an environment the cache already held costs no install), so
    one record alone can be far from what a slice costs."""
    newest = bases[-1]
    alike = [b for b in bases if b.tokens == newest.tokens]
    if len(alike) == 1:
        return newest
    wall = sum(b.wall_s for b in alike) / len(alike)
    return replace(newest, wall_s=wall, compile_s=sum(b.compile_s for b in alike) / len(alike),
                   why=f"full records: {wall_text(wall)} (mean of {len(alike)} cold builds) for {newest.tokens} "
                       f"archs on {newest.cores} cores")


def sibling_share(cells: Mapping[str, BuildRecord]) -> tuple[float, int] | None:
    """What a later Python of a row cost against the row's first, in wall time, over the recipe's recorded
    x86 rows whose first cell (by date) was a cold full build with full siblings after it; with the number
    of rows. None when no row qualifies. The share differs by recipe more than any one figure can stand
    for: a TU that reaches Python.h is compiled again for every Python (design.md §11.3)."""
    rows: dict[str, list[BuildRecord]] = {}
    for cell, record in cells.items():
        if record.tier == "full" and record.wall_s and _x86_linux(cell):
            rows.setdefault(row_of_cell_id(cell), []).append(record)
    shares = []
    for row in rows.values():
        first, *later = sorted(row, key=lambda r: r.date or "")
        if later and first.wall_s and is_cold_full(first):
            shares.append(sum(r.wall_s or 0.0 for r in later) / len(later) / first.wall_s)
    return (sum(shares) / len(shares), len(shares)) if shares else None


def with_sibling_share(basis: Basis, cells: Mapping[str, BuildRecord]) -> Basis:
    """`basis` with the sibling share its recipe's rows measured, named in its line; as it is without one."""
    measured = sibling_share(cells)
    if measured is None:
        return basis
    share, rows = measured
    return replace(basis, sibling=share,
                   why=f"{basis.why}; later Pythons {share:.2f} of the first ({rows} row{'s' * (rows > 1)} measured)")


def basis_of(recipe: Recipe, record: BuildRecord | None, defaults: Defaults, where: str) -> Basis:
    """The figure one cell of `recipe` costs: its full cold record, else the documented default."""
    record = record or BuildRecord({})
    cores = _cores(recipe, defaults, record)
    tier, wall, hits = record.tier, record.wall_s, record.cache_hits
    if is_cold_full(record):
        assert wall
        tokens = _arch_tokens(record, where)
        return Basis("measured", float(wall), _compile_seconds(record, wall, where), tokens, cores,
                     f"full record: {wall_text(wall)} for {tokens} archs on {cores} cores")
    sample = record.flags if tier == "flags" else None
    if sample and sample.get("cpu_h_estimate"):
        tokens = _arch_tokens(record, where)
        cpu_s = float(sample["cpu_h_estimate"]) * 3600
        return Basis("sampled", cpu_s / cores, cpu_s / cores, tokens, cores,
                     f"flags sample: {sample['finished']} of {sample['objects_total']} objects at "
                     f"{sample['cpu_s_per_object']:g} CPU-s each for {tokens} archs")
    if recipe.timeout:
        seconds, why = recipe.timeout * 60 / TIMEOUT_MARGIN, f"timeout {recipe.timeout} min / {TIMEOUT_MARGIN:g}"
    else:
        seconds, why = DEFAULT_CELL_MINUTES * 60, f"default {DEFAULT_CELL_MINUTES:g} min"
    if tier == "full" and hits:
        why += f" (its full record was a warm rebuild: {hits} cache hits)"
    elif tier:
        why += f" ({tier} record" + (f" of {wall_text(wall)}" if wall else "") + ")"
    if tier in ("failed", "flags") and wall and wall > seconds:
        # a failed or stopped attempt spent this much before it ended: the build costs at least that
        seconds, why = float(wall), f"{tier} record: at least {wall_text(wall)} (default {wall_text(seconds)})"
    return Basis("default", seconds, 0.0, 0, cores, why)


def price(basis: Basis, cell: Cell) -> Priced:
    """One cell: the basis carried to the cell's arch count and lane."""
    wall, source, scaled_to, note = basis.wall_s, basis.source, None, None
    tokens = len(cell.arch.arch_list.tokens)
    measured = basis.source == "measured"   # a sample stays a sample, scaled or not
    if basis.tokens and tokens != basis.tokens:
        wall += basis.compile_s * (tokens / basis.tokens - 1)
        source, scaled_to = "scaled" if measured else source, tokens
    factor = LANE_FACTOR[cell.platform]
    if cell.platform == "linux_aarch64" and basis.source in ("measured", "sampled"):
        source, note = "scaled" if measured else source, "on native arm64 runners (x86 figure)"
    if cell.platform == "windows":
        source, note = "default", f"x{factor:g} for Windows (assumed)"
    wall *= factor
    return Priced(wall, wall * basis.cores, source, basis.why, scaled_to, note)


# ---------------------------------------------------------------- the plan's estimate

def estimate(cells: Iterable[Cell], recipes: Mapping[str, Recipe], defaults: Defaults,
             records_folder: Path | None = None, runners: int = DEFAULT_RUNNERS) -> Estimate:
    """Price `cells` row by row from the records in `records_folder` (default recipes/records/)."""
    folder = Path(records_folder or records_dir())
    records, cell_records = read_records(folder), read_cell_records(folder)
    rows: dict[str, list[Cell]] = {}
    for cell in cells:
        rows.setdefault(row_id(cell), []).append(cell)
    bases: dict[str, Basis] = {}
    by_recipe: dict[tuple[str, str], Tally] = {}
    for row in rows.values():
        name, platform = row[0].recipe_name, row[0].platform
        if name not in bases:
            own_cells = cell_records.get(name, {})
            cold = cold_records(name, records.get(name), own_cells, folder)
            basis = mean_basis([basis_of(recipes[name], r, defaults, settings.display(path)) for r, path in cold]) \
                if cold else basis_of(recipes[name], records.get(name), defaults,
                                      settings.display(folder / f"{name}.json"))
            bases[name] = with_sibling_share(basis, own_cells)
        by_recipe.setdefault((name, platform), Tally()).add_row([price(bases[name], c) for c in row],
                                                                bases[name].sibling)
    by_lane: dict[str, Tally] = {}
    for (_, platform), tally in sorted(by_recipe.items(), key=lambda kv: PLATFORMS.index(kv[0][1])):
        by_lane.setdefault(platform, Tally()).merge(tally)
    return Estimate(runners, by_recipe, by_lane)


def check_runners(text: str) -> int:
    """argparse `type` of --runners: a whole number >= 1, else one line."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise BadInput("command line", "--runners", text, "expected a whole number of runners >= 1, e.g. 20")
    return value


# ---------------------------------------------------------------- output

def assumptions() -> dict[str, object]:
    return {"sibling_cost": SIBLING_COST, "sibling_cost_measured": "per recipe, from its recorded rows",
            "record_host_cores": RECORD_HOST_CORES,
            "timeout_margin": TIMEOUT_MARGIN, "default_cell_minutes": DEFAULT_CELL_MINUTES,
            "lane_factor": dict(LANE_FACTOR), "arm64": "native runners", "runners_per_lane": "N, each like the "
            "measuring host", "wall": "max(row hours / N, longest row)"}


def _fields(tally: Tally, runners: int) -> dict[str, object]:
    return {"cells": tally.cells, "rows": tally.rows, "cpu_hours": round(tally.cpu_hours(), 4),
            "wall_hours": round(tally.wall_hours(runners), 4), "source": tally.source,
            "cpu_hours_by_source": {s: round(v / 3600, 4) for s, v in tally.cpu_by_source.items()}}


def as_json(est: Estimate) -> dict[str, object]:
    total = _fields(est.total(), est.runners)
    total["wall_hours"] = round(est.total_wall_hours(), 4)
    return {"runners": est.runners, "assumptions": assumptions(),
            "recipes": [{"package": name, "lane": platform, **_fields(t, est.runners), "basis": t.basis()}
                        for (name, platform), t in sorted(est.by_recipe.items())],
            "lanes": [{"lane": platform, **_fields(t, est.runners)} for platform, t in est.by_lane.items()],
            "total": total}


def _figures(tally: Tally, wall_h: float) -> str:
    return f"{tally.cells:>7} {tally.rows:>6} {tally.cpu_hours():>10.1f} {wall_h:>9.2f}"


def _head(est: Estimate) -> str:
    return f"{'cells':>7} {'rows':>6} {'CPU-h':>10} {f'wall-h@{est.runners}':>9}"


def render_table(est: Estimate) -> str:
    """One line per recipe and lane with its source and basis, then the lanes' totals."""
    lines = [f"{'package':<28} {'lane':<14} {_head(est)}  {'source':<9} basis"]
    for (name, platform), t in sorted(est.by_recipe.items()):
        lines.append(f"{name:<28} {platform:<14} {_figures(t, t.wall_hours(est.runners))}  {t.source:<9} {t.basis()}")
    return "\n".join(lines) + "\n\n" + render_summary(est)


def render_summary(est: Estimate) -> str:
    """CPU-hours per lane and in total, how much of them rests on each source, and the assumptions."""
    lines = [f"{'lane':<14} {_head(est)}  CPU-h by source: " + " ".join(f"{s:>9}" for s in SOURCES)]
    for lane, t, wall in [*((p, t, t.wall_hours(est.runners)) for p, t in est.by_lane.items()),
                          ("total", est.total(), est.total_wall_hours())]:
        lines.append(f"{lane:<14} {_figures(t, wall)}  {'':<16} "
                     + " ".join(f"{t.cpu_by_source[s] / 3600:>9.1f}" for s in SOURCES))
    lines += [f"CPU-h: wall x the cores a build keeps busy. wall-h@{est.runners}: {est.runners} runners per lane, each "
              f"like the measuring host ({RECORD_HOST_CORES} cores), a row per job, max(row hours / "
              f"{est.runners}, longest row).",
              f"A row's later Pythons cost the share its recipe's recorded rows measured, else {SIBLING_COST:g}, "
              f"of its first; arm64 on native runners; Windows "
              f"x{LANE_FACTOR['windows']:g} (assumed); default: the recipe's timeout / {TIMEOUT_MARGIN:g}, else "
              f"{DEFAULT_CELL_MINUTES:g} min a cell (design.md §5.5)."]
    return "\n".join(lines) + "\n"
