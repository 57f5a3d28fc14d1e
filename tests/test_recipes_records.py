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
