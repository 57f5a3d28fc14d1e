"""`farm plan --estimate` (design.md §5.5): the real CLI over the real plan, against the committed build
records and against records crafted in a tmp folder, whose figures the test can work out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from farmcli import run_farm
from hostile import assert_one_line_refusal, tree_state

from farm.recipes.estimate import DEFAULT_CELL_MINUTES, LANE_FACTOR, SIBLING_COST, SOURCES, TIMEOUT_MARGIN

HOUR = 3600.0


def _record(folder: Path, name: str, **fields) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"recipe": name, "cell": f"{name}-cu130-torch2.13-py312",
                                                     "date": "2026-12-01T10:00:00Z", **fields}))


def full(wall_s: float, compile_s: float, archs: int, cores: int = 2, **more) -> dict:
    """A full cold record of `archs` tokens (any tokens: only their number counts)."""
    tokens = " ".join(f"{n}.0" for n in range(5, 5 + archs))
    return {"tier": "full", "wall_s": wall_s, "steps": {"source": 1.0, "compile": compile_s}, "arch_list": tokens,
            "cores": cores, **more}


def estimate_json(*args: str, records: Path | None = None) -> dict:
    res = run_farm("plan", "--estimate", "--format", "json", *args,
                   *(("--records", str(records)) if records else ()), timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def line(data: dict, package: str, lane: str) -> dict:
    (found,) = [r for r in data["recipes"] if r["package"] == package and r["lane"] == lane]
    return found


# ---------------------------------------------------------------- crafted records: figures worked out by hand

def test_a_full_record_on_6_archs_prices_a_3_arch_cell_at_half(tmp_path):
    """10 min of compile for 6 archs: a cell of 3 archs (sageattention's cu126 arm64 list: 8.0 9.0+PTX 9.0a)
    costs 5 min on one runner and 10 CPU-minutes on the record's 2 cores, marked scaled."""
    records = tmp_path / "records"
    _record(records, "sageattention", **full(600, 600, archs=6))
    cell = ("--package", "sageattention", "--cuda", "12.6", "--torch", "2.6", "--python", "3.12",
            "--platform", "linux_aarch64")
    listed = json.loads(run_farm("plan", "--format", "json", *cell).stdout)
    assert [c["arch_list"] for c in listed] == ["8.0 9.0+PTX 9.0a"]
    data = estimate_json(*cell, records=records)
    got = line(data, "sageattention", "linux_aarch64")
    assert (got["cells"], got["rows"], got["source"]) == (1, 1, "scaled")
    assert got["wall_hours"] == pytest.approx(300 / HOUR, abs=1e-4)
    assert got["cpu_hours"] == pytest.approx(600 / HOUR, abs=1e-4)
    assert "full record: 10.0 min for 6 archs on 2 cores, scaled to 3 archs" in got["basis"]
    table = run_farm("plan", "--estimate", *cell, "--records", str(records))
    assert table.returncode == 0, table.stderr
    (row,) = [ln for ln in table.stdout.splitlines() if ln.startswith("sageattention ")]
    assert row.split()[1:7] == ["linux_aarch64", "1", "1", "0.2", "0.08", "scaled"], row
    assert "scaled to 3 archs" in row


def test_a_row_pays_its_first_python_in_full_and_each_sibling_a_share(tmp_path):
    """diso's cu130/torch2.13 rows: six Pythons on linux, five on Windows and arm64. The record: 10 min,
    8 of them compile, 6 archs, as diso's x86 cells."""
    records = tmp_path / "records"
    _record(records, "diso", **full(600, 480, archs=6))
    data = estimate_json("--package", "diso", "--cuda", "13.0", "--torch", "2.13", records=records)
    siblings = {"linux": 5, "windows": 4, "linux_aarch64": 5}
    first = {"linux": 600, "windows": 600 * LANE_FACTOR["windows"],
             "linux_aarch64": 120 + 480 * 5 / 6}     # arm64's list has 5 tokens: only the compile shrinks
    for lane, source in (("linux", "measured"), ("windows", "default"), ("linux_aarch64", "scaled")):
        got = line(data, "diso", lane)
        row_wall = first[lane] * (1 + siblings[lane] * SIBLING_COST)
        assert (got["cells"], got["rows"], got["source"]) == (siblings[lane] + 1, 1, source), lane
        assert got["wall_hours"] == pytest.approx(row_wall / HOUR, abs=1e-4), lane
        assert got["cpu_hours"] == pytest.approx(2 * row_wall / HOUR, abs=1e-4), lane   # diso: min(2 cores, 3 jobs)
        assert got["cpu_hours_by_source"][source] == got["cpu_hours"]
    assert "x1.5 for Windows (assumed)" in line(data, "diso", "windows")["basis"]
    assert "on native arm64 runners" in line(data, "diso", "linux_aarch64")["basis"]
    lanes = {x["lane"]: x for x in data["lanes"]}
    assert data["total"]["cpu_hours"] == pytest.approx(sum(x["cpu_hours"] for x in lanes.values()), abs=1e-3)
    assert data["total"]["wall_hours"] == max(x["wall_hours"] for x in lanes.values())


def test_a_warm_status_record_gives_way_to_the_rows_cold_first_python(tmp_path):
    """The status cell (py312) was a sibling the cache served; the row's first Python (py310) compiled from
    nothing but for one CMake compiler check (1 hit in 106): the estimate is measured from that cell."""
    records = tmp_path / "records"
    warm = {"active": True, "hits": 103, "misses": 3}
    _record(records, "pyg_lib", **full(19, 10, archs=4, compiler_cache=warm))
    cells = records / "pyg_lib"
    for python, wall, cache in (("310", 400.0, {"active": True, "hits": 1, "misses": 105}), ("311", 19.0, warm)):
        _record(cells, f"pyg_lib-cu130-torch2.13-py{python}",
                **full(wall, wall - 20, archs=4, compiler_cache=cache, recipe="pyg_lib",
                       cell=f"pyg_lib-cu130-torch2.13-py{python}"))
    # a newer cold record of the emulated arm64 lane is no x86 figure: it is passed over
    _record(cells, "pyg_lib-cu130-torch2.13-py310-aarch64",
            **full(5000.0, 4900.0, archs=4, recipe="pyg_lib", cell="pyg_lib-cu130-torch2.13-py310-aarch64",
                   date="2026-12-02T10:00:00Z"))
    one = ("--package", "pyg_lib", "--cuda", "13.0", "--torch", "2.13", "--python", "3.12", "--platform", "linux")
    got = line(estimate_json(*one, records=records), "pyg_lib", "linux")
    assert got["source"] in ("measured", "scaled") and got["basis"].startswith("full record: 6.7 min for 4 archs"), got
    # without the cold cell the warm status record is named, and the default used
    (cells / "pyg_lib-cu130-torch2.13-py310.json").unlink()
    (cells / "pyg_lib-cu130-torch2.13-py310-aarch64.json").unlink()
    got = line(estimate_json(*one, records=records), "pyg_lib", "linux")
    assert got["source"] == "default" and "warm rebuild: 103 cache hits" in got["basis"], got


def test_a_recipe_whose_records_hold_rows_pays_their_measured_sibling_share(tmp_path):
    """Two recorded torch rows of cc_torch: first Pythons of 800 and 600 s cold, siblings after them of 80 s
    (torch 2.12: share 0.1) and 240 s (torch 2.13: share 0.4). A cell costs the mean cold build, 700 s, and a
    row's later Pythons the mean share 0.25 of it. A row whose first cell the cache served, and an arm64
    row, measure nothing."""
    records = tmp_path / "records"
    cells = records / "cc_torch"
    cold = {"active": True, "hits": 0, "misses": 1}
    warm = {"active": True, "hits": 1, "misses": 0}

    def cell(torch: str, python: str, wall: float, day: int, cache: dict, suffix: str = "") -> None:
        name = f"cc_torch-cu130-torch{torch}-py{python}{suffix}"
        _record(cells, name, **full(wall, wall - 20, archs=6, compiler_cache=cache, recipe="cc_torch", cell=name,
                                    date=f"2026-12-0{day}T10:00:00Z"))

    cell("2.12", "310", 800, 1, cold)
    cell("2.12", "311", 80, 2, warm)
    cell("2.12", "312", 80, 2, warm)
    cell("2.12", "313", 80, 3, warm)
    cell("2.13", "310", 600, 4, cold)
    cell("2.13", "311", 240, 5, warm)
    cell("2.11", "310", 30, 4, warm)       # first of its row, but served by the cache: no share
    cell("2.11", "311", 900, 5, warm)
    cell("2.13", "310", 700, 6, cold, suffix="-aarch64")
    cell("2.13", "311", 2100, 7, warm, suffix="-aarch64")
    row = ("--package", "cc_torch", "--cuda", "13.0", "--torch", "2.13", "--platform", "linux",
           *(a for py in ("3.10", "3.11", "3.12", "3.13") for a in ("--python", py)))
    got = line(estimate_json(*row, records=records), "cc_torch", "linux")
    assert (got["cells"], got["rows"], got["source"]) == (4, 1, "measured"), got
    assert got["wall_hours"] == pytest.approx(700 * (1 + 3 * 0.25) / HOUR, abs=1e-4), got
    assert got["basis"] == ("full records: 11.7 min (mean of 2 cold builds) for 6 archs on 2 cores; "
                            "later Pythons 0.25 of the first (2 rows measured)"), got
    # without recorded rows, the documented default share
    for f in cells.glob("*-py31[123]*.json"):
        f.unlink()
    got = line(estimate_json(*row, records=records), "cc_torch", "linux")
    assert got["wall_hours"] == pytest.approx(700 * (1 + 3 * SIBLING_COST) / HOUR, abs=1e-4), got
    assert "later Pythons" not in got["basis"], got


def test_without_a_full_cold_record_the_default_is_used_and_named(tmp_path):
    records = tmp_path / "records"
    _record(records, "diso", **full(600, 480, archs=6, compiler_cache={"active": True, "hits": 40, "misses": 2}))
    _record(records, "flash_attn", tier="flags", wall_s=30000.0, steps={"compile": 29990.0},
            flags={"compiling_invocations": 3, "stopped": True})
    _record(records, "fused_ssim", tier="smoke", wall_s=30.0, arch_list="12.0+PTX", steps={"compile": 25.0})
    _record(records, "cumesh", tier="blocked", reason="needs a patch")
    one = ("--cuda", "13.0", "--torch", "2.13", "--python", "3.12", "--platform", "linux")
    data = estimate_json("--package", "diso", "--package", "flash_attn", "--package", "fused_ssim",
                         "--package", "cumesh", "--package", "o_voxel", *one, records=records)
    for package in ("diso", "flash_attn", "fused_ssim", "cumesh", "o_voxel"):
        assert line(data, package, "linux")["source"] == "default", package
    # diso: its full record was a warm rebuild (cache hits), so its timeout of 10 min / 3 on 2 cores
    diso = line(data, "diso", "linux")
    assert diso["wall_hours"] == pytest.approx(10 * 60 / TIMEOUT_MARGIN / HOUR, abs=1e-4)
    assert diso["cpu_hours"] == pytest.approx(2 * diso["wall_hours"], abs=1e-4)
    assert "warm rebuild: 40 cache hits" in diso["basis"]
    # flash_attn: timeout 1290 / 3 = 430 min, but its stopped flags run already spent 500 min; one job of
    # 2 nvcc threads keeps both cores busy
    flash = line(data, "flash_attn", "linux")
    assert flash["wall_hours"] == pytest.approx(30000 / HOUR, abs=1e-4)
    assert flash["cpu_hours"] == pytest.approx(2 * 30000 / HOUR, abs=1e-4)
    assert flash["basis"].startswith("flags record: at least 500.0 min")
    # a smoke record says nothing of the whole list; o_voxel has neither a record here nor a timeout
    assert line(data, "fused_ssim", "linux")["basis"] == "timeout 15 min / 3 (smoke record of 30 s)"
    assert line(data, "cumesh", "linux")["basis"] == f"default {DEFAULT_CELL_MINUTES:g} min (blocked record)"
    unmeasured = line(data, "o_voxel", "linux")
    assert unmeasured["wall_hours"] == pytest.approx(DEFAULT_CELL_MINUTES / 60, abs=1e-4)
    assert unmeasured["basis"] == f"default {DEFAULT_CELL_MINUTES:g} min"


def test_a_flags_record_with_finished_objects_prices_the_cell_from_its_cpu_sample(tmp_path):
    """flash_attn's flags run finished 2 of its 73 objects at 600 CPU-s each, for 4 archs: its cu130 cell costs
    73 x 600 CPU-s (12.17 CPU-h), its 2-arch cu126 cell half of that; both marked sampled."""
    records = tmp_path / "records"
    _record(records, "flash_attn", tier="flags", wall_s=1500.0, steps={"compile": 1490.0},
            arch_list="8.0 9.0 10.0 12.0+PTX",
            flags={"compiling_invocations": 3, "stopped": True, "finished": 2, "objects_total": 73,
                   "cpu_s_per_object": 600.0, "cpu_h_estimate": 12.17})
    cell = ("--package", "flash_attn", "--python", "3.12", "--platform", "linux")
    on_13 = line(estimate_json(*cell, "--cuda", "13.0", "--torch", "2.13", records=records), "flash_attn", "linux")
    assert (on_13["cells"], on_13["source"]) == (1, "sampled")
    assert on_13["cpu_hours"] == pytest.approx(12.17, abs=1e-3)
    assert on_13["wall_hours"] == pytest.approx(12.17 / 2, abs=1e-3)   # one job of 4 nvcc threads on 2 cores
    assert on_13["basis"] == "flags sample: 2 of 73 objects at 600 CPU-s each for 4 archs"
    on_126 = line(estimate_json(*cell, "--cuda", "12.6", "--torch", "2.6", records=records), "flash_attn", "linux")
    assert on_126["source"] == "sampled" and on_126["cpu_hours"] == pytest.approx(12.17 / 2, abs=1e-3)
    assert SOURCES.index("sampled") == SOURCES.index("default") - 1   # less direct than a measured full build


def test_wall_hours_spread_rows_over_the_runners_but_never_below_the_longest_row(tmp_path):
    records = tmp_path / "records"
    _record(records, "diso", **full(600, 600, archs=6))
    select = ("--package", "diso", "--platform", "linux")

    def lane(runners: int) -> dict:
        (found,) = estimate_json(*select, "--runners", str(runners), records=records)["lanes"]
        return found

    one, many, some = lane(1), lane(100_000), lane(7)
    assert one["cpu_hours"] == many["cpu_hours"] == some["cpu_hours"] and one["rows"] > 7
    assert one["wall_hours"] == pytest.approx(one["cpu_hours"] / 2, abs=1e-3)   # one runner builds every row
    # each row from the plan's own listing: 600 s for 6 archs, compile only, so 100 s an arch
    rows: dict[tuple[str, str], list[int]] = {}
    for c in json.loads(run_farm("plan", "--format", "json", *select).stdout):
        rows.setdefault((c["cuda"], c["torch"]), []).append(len(c["arch_list"].split()))
    longest = max(100 * archs[0] * (1 + (len(archs) - 1) * SIBLING_COST) for archs in rows.values()) / HOUR
    assert len(rows) == one["rows"] and sum(map(len, rows.values())) == one["cells"]
    assert many["wall_hours"] == pytest.approx(longest, abs=1e-4)
    assert some["wall_hours"] == pytest.approx(max(one["wall_hours"] / 7, longest), abs=1e-3)
    assert longest < one["wall_hours"] / 7 < one["wall_hours"]


# ---------------------------------------------------------------- the committed records, the whole grid

def test_the_whole_grid_summary_prints_cpu_hours_per_lane():
    res = run_farm("plan", "--estimate", "--summary", timeout=120)
    assert res.returncode == 0, res.stderr
    rows = {ln.split()[0]: ln.split() for ln in res.stdout.splitlines()[1:] if ln.split() and
            ln.split()[0] in ("linux", "windows", "linux_aarch64", "total")}
    assert list(rows) == ["linux", "windows", "linux_aarch64", "total"], res.stdout
    counts = run_farm("plan", "--format", "table", "--summary")
    total_cells = int(counts.stdout.splitlines()[-1].split()[-1])
    assert int(rows["total"][1]) == total_cells == sum(int(rows[k][1]) for k in ("linux", "windows", "linux_aarch64"))
    for name, r in rows.items():
        cells, row_count, cpu, wall, *by_source = r[1:]
        assert 0 < int(row_count) < int(cells) and float(cpu) > 0 and float(wall) > 0, name
        assert sum(map(float, by_source)) == pytest.approx(float(cpu), abs=0.2), name
    assert float(rows["total"][3]) == pytest.approx(sum(float(rows[k][3]) for k in rows if k != "total"), abs=0.2)
    assert float(rows["windows"][5]) == 0 and float(rows["windows"][6]) == 0   # no Windows record: all default
    assert float(rows["linux"][5]) > 0, "the committed full records measure some of the linux lane"


def test_the_committed_records_are_what_the_figures_rest_on():
    from farm.recipes.status import read_cell_records, read_records, records_dir

    def cold(r) -> bool:   # full, and the cache served at most 5 % of its compiles
        cache = r.get("compiler_cache") or {}
        hits = cache.get("hits") or 0
        return r["tier"] == "full" and hits <= 0.05 * (hits + (cache.get("misses") or 0))

    records = read_records(records_dir())
    data = estimate_json()
    cold_full = {n for n, r in records.items() if cold(r)}
    cold_full |= {n for n, cells in read_cell_records(records_dir()).items() if any(map(cold, cells.values()))}
    assert len(cold_full) >= 10 and "pyg_lib" in cold_full   # its status cell was a warm sibling, its py310 cold
    sampled = {n for n, r in records.items() if r["tier"] == "flags" and (r.get("flags") or {}).get("finished")}
    for r in data["recipes"]:
        if r["package"] in sampled and r["lane"] != "windows":   # a flags run that finished objects
            assert r["source"] == "sampled", r
            continue
        expected = "default" if r["package"] not in cold_full or r["lane"] == "windows" else \
            ("scaled", "measured") if r["lane"] == "linux" else ("scaled",)
        assert r["source"] in expected, r
    # one cell of diso costs the mean of its cold x86 builds (status record and cell records, each build
    # once), on its 2 cores
    builds = {(r["cell"], r["date"]): r["wall_s"] for r in
              [records["diso"], *read_cell_records(records_dir())["diso"].values()]
              if cold(r) and not r["cell"].endswith("-aarch64")}
    assert len(builds) >= 3
    status = estimate_json("--package", "diso", "--cuda", "13.0", "--torch", "2.13", "--python", "3.12",
                           "--platform", "linux")
    got = line(status, "diso", "linux")
    assert got["source"] == "measured" and got["cells"] == 1
    assert got["cpu_hours"] == pytest.approx(sum(builds.values()) / len(builds) * 2 / HOUR, abs=1e-4)
    assert f"(mean of {len(builds)} cold builds)" in got["basis"]


def test_the_documented_default_is_near_the_mean_of_the_full_records():
    """DEFAULT_CELL_MINUTES stands for the recipes nobody measured: it must stay within a factor of two of
    what the measured ones cost, or its comment (and design.md §5.5) no longer hold."""
    from farm.recipes.status import read_records, records_dir

    walls = [r["wall_s"] for r in read_records(records_dir()).values() if r["tier"] == "full"]
    mean_minutes = sum(walls) / len(walls) / 60
    assert DEFAULT_CELL_MINUTES / 2 <= mean_minutes <= DEFAULT_CELL_MINUTES * 2, mean_minutes


def test_an_empty_selection_says_so():
    res = run_farm("plan", "--estimate", "--package", "vllm", "--platform", "windows")
    assert res.returncode == 0 and res.stdout.startswith("0 cells: package vllm has no cells"), res.stdout
    data = estimate_json("--package", "vllm", "--platform", "windows")
    assert data["total"]["cells"] == 0 and data["recipes"] == [] and set(data["total"]["cpu_hours_by_source"]) \
        == set(SOURCES)


# ---------------------------------------------------------------- bad input: one line, exit 2, nothing written

BAD_OPTIONS = {
    "zero-runners": (("--runners", "0"), "--runners: '0': expected a whole number of runners >= 1"),
    "word-runners": (("--runners", "many"), "--runners: 'many'"),
    "github-format": (("--format", "github"), "--format: 'github': an estimate is a table or JSON"),
    "unknown-package": (("--package", "disso"), "did you mean 'diso'?"),
    "unknown-cuda": (("--cuda", "13.O"), "--cuda: '13.O': unknown CUDA line"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_a_bad_option_is_one_line(tmp_path, case):
    args, needle = BAD_OPTIONS[case]
    assert_one_line_refusal(run_farm("plan", "--estimate", *args, cwd=tmp_path), 2, needle)
    assert tree_state(tmp_path) == {}


def test_estimate_options_without_estimate_are_refused(tmp_path):
    assert_one_line_refusal(run_farm("plan", "--runners", "5"), 2, "--runners: '5': prices a plan: only with --estimate")
    assert_one_line_refusal(run_farm("plan", "--records", str(tmp_path)), 2, "only with --estimate")


BAD_RECORDS = {
    "no-arch-list": ({"tier": "full", "wall_s": 60.0, "steps": {"compile": 50.0}}, "arch_list"),
    "compile-over-wall": (full(60, 90, archs=6), "steps.compile: 90"),
    "zero-cores": (full(60, 50, archs=6, cores=0), "cores: 0"),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_a_bad_record_is_refused_naming_its_file_and_key(tmp_path, case):
    fields, needle = BAD_RECORDS[case]
    records = tmp_path / "records"
    _record(records, "diso", **fields)
    before = tree_state(tmp_path)
    res = run_farm("plan", "--estimate", "--package", "diso", "--records", str(records))
    refused = assert_one_line_refusal(res, 2, needle)
    assert "diso.json" in refused
    assert tree_state(tmp_path) == before


def test_records_that_name_a_file_or_nothing_are_refused(tmp_path):
    (tmp_path / "records").write_text("")
    assert_one_line_refusal(run_farm("plan", "--estimate", "--records", str(tmp_path / "records")), 2,
                            "--records")
    assert_one_line_refusal(run_farm("plan", "--estimate", "--records", str(tmp_path / "recrods")), 2,
                            "recrods': no such folder")



def test_a_row_is_a_recipe_cuda_torch_platform_and_a_torch_free_row_its_cuda_line():
    """The grouping the sibling share rests on: cumm (torch-free) rows by CUDA line and platform, whatever
    torch each Python's cell was built against; diso by (CUDA, torch, platform)."""
    from farm.recipes.cells import row_id
    from farm.recipes.plan import full_plan

    plan = full_plan(cells_of=["cumm", "diso"])
    for name, key in (("cumm", lambda c: (c.cuda, c.platform)), ("diso", lambda c: (c.cuda, c.torch, c.platform))):
        cells = [c for c in plan.cells if c.recipe_name == name]
        by_row: dict[str, set] = {}
        for c in cells:
            by_row.setdefault(row_id(c), set()).add(key(c))
        assert all(len(keys) == 1 for keys in by_row.values())
        assert len(by_row) == len({key(c) for c in cells}) < len(cells)
    assert row_id(next(c for c in plan.cells if c.id == "diso-cu130-torch2.13-py312-aarch64")) == \
        "diso-cu130-torch2.13-aarch64"
