"""Build records at the wheelhouse's edge (issue 33 items 4 and 7): `farm publish --record`, `farm index merge`
and `farm index recover` (from a wheel's own farm_build.json) accept a build record only in the form the build
writes it (farm/recipes/buildrecord.py, design.md §4.5). A forged or malformed one is one line naming the file,
the key and the value, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil

import pytest
from hostile import assert_one_line_refusal, tree_state
from wheelhouse_fixtures import make_wheel, rezip, run_farm

from farm.errors import BadInput
from farm.recipes.buildrecord import check_build_record
from farm.wheelhouse import publish, read_journal
from farm.wheelhouse.manifest import frame, unframe

CELL = "drtk-cu128-torch2.8-py311"
GOOD = {"cell": CELL, "build_key": "ab" * 32, "arch_list": "8.0 9.0+PTX", "cuda": "12.8", "torch": "2.8.0"}

# case -> (the record's fields over GOOD, the key the refusal names)
FORGED = {
    "cell id with ../": ({"cell": "../../etc/drtk-cu128-torch2.8-py311"}, "cell"),
    "cell id with a slash": ({"cell": "drtk/cu128"}, "cell"),
    "markup in a build key": ({"build_key": "<script>alert(1)</script>"}, "build_key"),
    "a space in a build key": ({"build_key": "k 1"}, "build_key"),
    "newline in an arch list": ({"arch_list": "8.0\n9.0+PTX"}, "arch_list"),
    "markup in an arch list": ({"arch_list": "8.0 <b>9.0</b>"}, "arch_list"),
    "a mapping for a cell": ({"cell": {"id": CELL}}, "cell"),
    "a mapping for a build key": ({"build_key": {"k": 1}}, "build_key"),
    "a number for a CUDA line": ({"cuda": 12.8}, "cuda"),
    "pythons not strings": ({"pythons": [3.11]}, "pythons"),
    "a newline in any text": ({"image": "builder\nInjected: yes"}, "image"),
    "NaN for seconds": ({"seconds": float("nan")}, "seconds"),
    "a list for a wheel": ({"wheel": ["x.whl"]}, "wheel"),
    "a wheel in a folder": ({"wheel": "../x/drtk-0.1.0+cu128torch2.8-cp311-cp311-manylinux_2_34_x86_64.whl"},
                            "wheel"),
}


@pytest.fixture
def house(tmp_path):
    house = tmp_path / "wh"
    publish([make_wheel(tmp_path / "first", "drtk", "0.0.1+cu128torch2.8")], house)
    return house


@pytest.mark.parametrize("case", list(FORGED))
def test_publish_refuses_a_forged_record_file_in_one_line_naming_file_key_and_value(house, tmp_path, case):
    fields, key = FORGED[case]
    wheel = make_wheel(tmp_path / "in")
    record = {**GOOD, **fields}
    if "wheel" not in fields:
        record["wheel"] = wheel.name
    path = tmp_path / "r.json"
    path.write_text(json.dumps(record))
    before = tree_state(tmp_path)
    line = assert_one_line_refusal(run_farm("publish", wheel, "--record", path, "--wheelhouse", house,
                                            check=False), 2, f"{path}: {key}: ")
    assert "\n" not in line and len(line) < 400
    assert tree_state(tmp_path) == before


@pytest.mark.parametrize("wheel", [17, {"file": "x.whl"}, ["x.whl"], True])
def test_publish_refuses_a_record_whose_wheel_is_not_a_string_without_a_traceback(house, tmp_path, wheel):
    # issue 33 item 4: a non-string `wheel` was a TypeError traceback
    w = make_wheel(tmp_path / "in")
    path = tmp_path / "r.json"
    path.write_text(json.dumps([{**GOOD, "wheel": wheel}]))
    before = tree_state(tmp_path)
    assert_one_line_refusal(run_farm("publish", w, "--record", path, "--wheelhouse", house, check=False), 2,
                            f"{path}: wheel: ")
    assert tree_state(tmp_path) == before


def _carrying(tmp_path, info: object) -> object:
    w = make_wheel(tmp_path / "plain", "drtk", "0.2.0+cu128torch2.8")
    data = info if isinstance(info, bytes) else json.dumps(info).encode()
    return rezip(w, tmp_path / "carrying" / w.name,
                 lambda f: {**f, "drtk-0.2.0+cu128torch2.8.dist-info/farm_build.json": data})


@pytest.mark.parametrize("case", [*FORGED, "not JSON", "a list"])
def test_recover_refuses_a_wheel_carrying_a_forged_record_and_changes_nothing(house, tmp_path, case):
    info = {"not JSON": b"{cell: ", "a list": [GOOD]}.get(case) or {**GOOD, **FORGED[case][0]}
    wheel = _carrying(tmp_path, info)
    shutil.copy(wheel, house / "files/drtk" / wheel.name)   # as a lost journal would leave it: no record
    (house / "manifest.jsonl").unlink()
    before = tree_state(house)
    line = assert_one_line_refusal(run_farm("index", "recover", "--wheelhouse", house, check=False), 2,
                                   f"files/drtk/{wheel.name}")
    assert "farm_build.json" in line and "nothing changed" in line
    if case in FORGED:
        assert f": {FORGED[case][1]}: " in line
    assert tree_state(house) == before


def test_recover_lists_a_wheel_carrying_a_good_record_with_that_record(house, tmp_path):
    wheel = _carrying(tmp_path, {**GOOD, "arch_provenance": "recipe arch_list"})
    shutil.copy(wheel, house / "files/drtk" / wheel.name)
    (house / "manifest.jsonl").unlink()
    run_farm("index", "recover", "--wheelhouse", house)
    entry = {e.file: e for e in read_journal(house).entries}[wheel.name]
    assert (entry.cell, entry.build_key, entry.arch_list) == (CELL, GOOD["build_key"], GOOD["arch_list"])


def test_merge_refuses_a_staging_journal_with_a_forged_cell(house, tmp_path):
    staging = tmp_path / "staging"
    wheel = make_wheel(tmp_path / "in", "drtk", "0.3.0+cu128torch2.8")
    publish([wheel], staging, record=GOOD)
    path = staging / "manifest.jsonl"   # a forged line, framed as a writer frames it
    (line,) = path.read_text().splitlines()
    path.write_text(frame(unframe(line).replace(f'"cell":"{CELL}"', '"cell":"../../x-cu128-py311"')) + "\n")
    (staging / ".manifest.idx").unlink(missing_ok=True)
    before = tree_state(house)
    assert_one_line_refusal(run_farm("index", "merge", staging, "--wheelhouse", house, check=False), 2, "cell: ")
    assert tree_state(house) == before


@pytest.mark.parametrize("case", list(FORGED))
def test_the_schema_refuses_each_forged_record_and_takes_what_the_build_writes(case):
    fields, key = FORGED[case]
    with pytest.raises(BadInput) as caught:
        check_build_record("r.json", {**GOOD, **fields})
    assert caught.value.key == key
    assert check_build_record("r.json", GOOD) == GOOD


def test_the_build_writes_only_a_record_its_readers_accept(tmp_path):
    from farm.recipes.buildrecord import write_record

    path = tmp_path / "build.json"
    with pytest.raises(BadInput, match="build_key"):
        write_record(path, {**GOOD, "build_key": "a b"})
    assert list(tmp_path.iterdir()) == []
    write_record(path, GOOD)
    assert json.loads(path.read_text()) == GOOD
