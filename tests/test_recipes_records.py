"""Build records of recipes (recipes/records/<name>.json, design.md §4.5): a block keeps the last measured
build beside its reason (issue 33 item 7), a rebuild while blocked keeps the block, `farm recipes unblock`
puts the measured build back; and `--records` that is not a folder is one line, exit 2, nothing written
(issue 33 item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from farmcli import run_farm
from hostile import assert_one_line_refusal, tree_state

from farm.recipes.status import read_records, save_record

CELL = "natten-cu130-torch2.13-py312"
MEASURED = {"recipe": "natten", "tier": "full", "cell": CELL, "date": "2026-12-01T10:00:00Z", "wall_s": 5400.0,
            "peak_mb": 14000, "wheel_bytes": 90_000_000, "sass": ["sm_80", "sm_90"], "ptx": ["compute_90"],
            "gate": "pass", "arch_list": "8.0 9.0+PTX", "build_key": "ab" * 32, "cores": 16,
            "source": {"kind": "git", "commit": "c" * 40}, "patches": []}


def _status_row(records: Path, tmp_path: Path, name: str) -> dict[str, str]:
    from farm.recipes.status import COLUMNS

    out = tmp_path / "status.md"
    res = run_farm("recipes", "status", "--records", records, "--out", out)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in out.read_text().splitlines() if ln.startswith(f"| {name} |"))
    return dict(zip(COLUMNS, [c.strip() for c in line.strip("|").split("|")], strict=True))


def test_block_keeps_the_measured_build_beside_its_reason_and_unblock_puts_it_back(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    (records / "natten.json").write_text(json.dumps(MEASURED))
    res = run_farm("recipes", "block", "natten", "--why", "needs 40 GB per job", "--records", records)
    assert res.returncode == 0, res.stderr
    blocked = json.loads((records / "natten.json").read_text())
    assert (blocked["tier"], blocked["reason"]) == ("blocked", "needs 40 GB per job")
    assert blocked["last_build"] == MEASURED                        # not overwritten: beside the reason
    row = _status_row(records, tmp_path, "natten")
    assert row["tier"] == "blocked (last build full)" and row["reason"] == "needs 40 GB per job"
    assert (row["wall"], row["peak mem"], row["gate"]) == ("90.0 min", "13.7 GB", "pass")
    # a second block says why anew and still keeps the measured build, never a blocked one inside a blocked one
    run_farm("recipes", "block", "natten", "--why", "upstream broke sm_100", "--records", records)
    again = json.loads((records / "natten.json").read_text())
    assert again["reason"] == "upstream broke sm_100" and again["last_build"] == MEASURED
    # a rebuild while blocked: the new measurement is kept, the block stays until unblocked
    newer = {**MEASURED, "date": "2026-12-05T10:00:00Z", "wall_s": 4000.0}
    save_record("natten", newer, records)
    kept = read_records(records)["natten"]
    assert kept["tier"] == "blocked" and kept["last_build"] == newer and kept["reason"] == "upstream broke sm_100"
    res = run_farm("recipes", "unblock", "natten", "--records", records)
    assert res.returncode == 0, res.stderr
    assert json.loads((records / "natten.json").read_text()) == newer


def test_unblock_of_a_recipe_never_built_leaves_it_not_built(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    run_farm("recipes", "block", "natten", "--why", "needs a patch", "--records", records)
    assert "last_build" not in json.loads((records / "natten.json").read_text())
    run_farm("recipes", "unblock", "natten", "--records", records)
    assert not (records / "natten.json").exists()
    assert _status_row(records, tmp_path, "natten")["tier"] == "not built yet"
    res = run_farm("recipes", "unblock", "natten", "--records", records)
    assert_one_line_refusal(res, 2, "not blocked")


def test_block_refuses_a_malformed_record_it_would_keep(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    (records / "natten.json").write_text(json.dumps({**MEASURED, "cell": "../../natten-cu130-py312"}))
    before = tree_state(tmp_path)
    res = run_farm("recipes", "block", "natten", "--why", "x", "--records", records)
    assert_one_line_refusal(res, 2, "natten.json: cell: ")
    assert tree_state(tmp_path) == before


@pytest.mark.parametrize("verb", [["block", "natten", "--why", "x"], ["unblock", "natten"]])
@pytest.mark.parametrize("kind", ["a file", "missing"])
def test_records_that_is_not_a_folder_is_one_line_and_nothing_written(tmp_path, verb, kind):
    records = tmp_path / "records"
    if kind == "a file":
        records.write_text("not a folder\n")
    before = tree_state(tmp_path)
    res = run_farm("recipes", *verb, "--records", records)
    assert_one_line_refusal(res, 2, f"{records}")
    assert tree_state(tmp_path) == before


def test_the_committed_records_are_build_records_of_the_one_schema():
    from farm.recipes.status import records_dir

    assert read_records(records_dir())   # each checked by the schema the build writes with


# ---------------------------------------------------------------- per-cell status (issue 35 item 2)

DEMO = "farm_demo-cu130-torch2.13-py{}"


def _cell(py: str, tier: str, date: str = "2026-12-05T10:00:00Z", **fields) -> dict:
    return {"recipe": "farm_demo", "cell": DEMO.format(py), "tier": tier, "date": date, **fields}


def _write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_the_table_shows_cells_built_out_of_attempted_and_each_failing_cell_with_its_reason(tmp_path):
    """A status row written before per-cell records still counts (its cell, 1/1); a recipe's cell records
    count every cell once, the newer record of a cell winning; a flags run is no attempt."""
    records = tmp_path / "records"
    _write(records / "diso.json", {"recipe": "diso", "cell": "diso-cu130-torch2.13-py312", "tier": "full",
                                   "date": "2026-12-01T10:00:00Z"})
    _write(records / "farm_demo.json", _cell("312", "failed", "2026-12-01T10:00:00Z", reason="an old failure"))
    cells = [_cell("310", "full"), _cell("311", "smoke"), _cell("312", "full"),   # 312's newer record: built
             _cell("313", "failed", reason="csrc/x.cu(3): error: no member named 'foo' on Python 3.13"),
             _cell("314", "flags")]
    for record in cells:
        _write(records / "farm_demo" / f"{record['cell']}.json", record)
    out = tmp_path / "status.md"
    res = run_farm("recipes", "status", "--records", records, "--out", out)
    assert res.returncode == 0, res.stderr
    assert _status_row(records, tmp_path, "farm_demo")["cells"] == "3/4"
    assert _status_row(records, tmp_path, "diso")["cells"] == "1/1"
    assert _status_row(records, tmp_path, "natten")["cells"] == ""          # never built
    text = out.read_text()
    section = text[text.index("## Failing cells"):]
    assert "- **farm_demo** (3/4 built): `farm_demo-cu130-torch2.13-py313`: csrc/x.cu(3): error: no member " \
           "named 'foo' on Python 3.13" in section
    assert "an old failure" not in section and "diso" not in section
    assert any(ln.startswith("farm_demo ") and " 3/4 " in ln for ln in res.stdout.splitlines())


def test_a_build_record_goes_to_its_cell_and_to_the_status_row_only_for_the_status_cell(tmp_path):
    from farm.recipes.reader import load_recipes
    from farm.recipes.status import read_cell_records, save_build, status_cell_id

    recipe = load_recipes()["farm_demo"]
    records = tmp_path / "records"
    records.mkdir()
    status = status_cell_id(recipe)
    other = _cell("313", "failed", reason="boom")
    assert save_build(recipe, other, records) == records / "farm_demo.json"   # no row yet: it becomes the row
    newer_other = {**other, "tier": "full", "date": "2026-12-06T10:00:00Z"}
    save_build(recipe, newer_other, records)                                  # the row's own cell: replaced
    assert read_records(records)["farm_demo"] == newer_other
    mine = {**_cell("312", "full"), "cell": status}
    save_build(recipe, mine, records)
    assert read_records(records)["farm_demo"] == mine                         # the status cell takes the row
    third = _cell("310", "failed", reason="no such header on 3.10")
    assert save_build(recipe, third, records) == records / "farm_demo" / f"{third['cell']}.json"
    assert read_records(records)["farm_demo"] == mine                         # another cell: its record only
    assert read_cell_records(records)["farm_demo"] == {status: mine, other["cell"]: newer_other,
                                                       third["cell"]: third}


@pytest.mark.parametrize("where,record,needle", [
    ("farm_demo/farm_demo-cu130-torch2.13-py313.json", _cell("312", "full"), "cell: 'farm_demo-cu130-torch2.13-py312'"),
    ("farm_demo/farm_demo-cu130-torch2.13-py313.json", {**_cell("313", "full"), "recipe": "diso"}, "recipe: 'diso'"),
    ("farm_demo/farm_demo-cu130-torch2.13-py313.json", _cell("313", "failed"), "reason"),
])
def test_a_bad_cell_record_is_one_line_naming_it_and_nothing_written(tmp_path, where, record, needle):
    records = tmp_path / "records"
    _write(records / where, record)
    out = tmp_path / "status.md"
    res = run_farm("recipes", "status", "--records", records, "--out", out)
    assert_one_line_refusal(res, 2, needle)
    assert where in res.stderr and not out.exists()
