"""The build's contract typed both ways (design.md §4.5, §6): what the steps hand back (`StepState`,
farm/build/state.py), the one build record type (`BuildRecord`, farm/recipes/buildrecord.py) and the
one request a build is asked with (`BuildRequest`, farm/build/cell.py)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from farm.build.request import DEFAULT_FLAGS_MINUTES, BuildRequest
from farm.build.source.prepare import SourceResult
from farm.build.state import STATE_FILE, CompileStep, LabelStep, RepairStep, StepState, VerifyStep, need
from farm.errors import BadInput, BadSpec, StepFailed
from farm.recipes.buildrecord import BuildRecord
from farm.recipes.status import read_cell_records, read_records, records_dir

FARM = Path(__file__).resolve().parent.parent / "farm"
CELL = "farm_demo-cu130-torch2.13-py311"


def _ran() -> StepState:
    source = SourceResult(work_dir=Path("/work/src"), kind="git", pin="c" * 40, description="git x", commit="c" * 40,
                          submodules=(("third_party/a", "d" * 40),), patches=(("fix.patch", "e" * 64),),
                          source_date_epoch=1_700_000_000)
    compiled = CompileStep(wheel="/out/raw/x.whl", flags=None, env={"MAX_JOBS": "2"},
                           compiler_cache={"active": True, "stats": {"hits": 3, "misses": 1, "files": 9}},
                           nvcc_pid_namespace=False, peak_process_mb=512, cpu_s=61.5)
    repair = RepairStep(wheel="/out/repaired/x-manylinux_2_28_x86_64.whl", plat_tag="manylinux_2_28_x86_64",
                        repaired=True, plat="manylinux_2_28_x86_64", grafted=(), excluded_count=2, reason="",
                        dropped_rpaths={"x/_C.so": ["/work/lib"]}, nvidia_requires=())
    state = StepState().ran("source", source, 1.5).ran("compile", compiled, 30.0)
    state = state.ran("label", LabelStep("/out/labelled/x.whl"), 0.2).ran("repair", repair, 1.0)
    return state.ran("verify", VerifyStep("/out/wheel/x.whl", "/out/verify.json", ("size: big",)), 2.0)


def test_the_state_goes_through_steps_json_unchanged_in_the_form_it_always_had(tmp_path):
    state = _ran().ran("compile", _ran().compile, 4.0)   # env and toolkit run once per phase: times add up
    state.write(tmp_path)
    assert StepState.read(tmp_path) == state
    plain = json.loads((tmp_path / STATE_FILE).read_text())
    # one entry per step that ran, read as before by whoever reads the file (bench/, the tests)
    assert set(plain) == {"source", "compile", "label", "repair", "verify", "timings"}   # `failed` once one failed
    assert set(state.failing("verify", "gate failed").to_plain()) == set(plain) | {"failed"}
    assert plain["timings"]["compile"] == 34.0 and plain["compile"]["compiler_cache"]["stats"]["files"] == 9
    assert plain["repair"]["plat_tag"] == "manylinux_2_28_x86_64" and plain["source"]["commit"] == "c" * 40
    # a record's `source` is the source step's own record, as before the state was typed
    assert state.source is not None and state.source.record()["submodules"] == [["third_party/a", "d" * 40]]
    assert state.source_date_epoch == 1_700_000_000 and StepState().source_date_epoch is None


def test_a_state_of_one_step_reads_and_a_step_not_run_is_one_line(tmp_path):
    (tmp_path / STATE_FILE).write_text(json.dumps({"label": {"wheel": "/out/labelled/x.whl"}}))
    state = StepState.read(tmp_path)
    assert state.label == LabelStep("/out/labelled/x.whl") and state.compile is None and state.timings == {}
    with pytest.raises(StepFailed, match="the repair step has not run"):
        need(state.repair, "repair")
    assert StepState.read(tmp_path / "none") == StepState()


@pytest.mark.parametrize("plain, needle", [
    ({"label": {"wheel": "x.whl"}, "linker": {}}, "unknown linker"),
    ({"label": {}}, "label: missing wheel"),
    ({"label": {"wheel": 3}}, "label.wheel: expected str, got int"),
    ({"timings": {"env": "slow"}}, "timings: expected an object of seconds"),
])
def test_a_state_another_farm_wrote_is_one_line_naming_the_key(tmp_path, plain, needle):
    (tmp_path / STATE_FILE).write_text(json.dumps(plain))
    with pytest.raises(BadSpec, match=needle):
        StepState.read(tmp_path)


def test_a_build_record_is_checked_when_made_and_read_through_its_fields(tmp_path):
    record = BuildRecord({"cell": CELL, "arch_list": ["8.0", "9.0+PTX"], "wheel": "x-1.0-cp311-cp311-linux_x86_64.whl",
                          "compiler_cache": {"enabled": True, "stats": {"hits": 4, "misses": 0}}})
    assert record.cell == CELL and record.arch_list == "8.0 9.0+PTX" and record.arch_list_raw == ["8.0", "9.0+PTX"]
    assert record.tag == "linux_x86_64"   # a record from before tags were kept: its wheel's file name says it
    assert record.cache_hits == 4 and record.cache_stats == {"hits": 4, "misses": 0} and record.flags is None
    with pytest.raises(TypeError):
        record["cell"] = "other"   # type: ignore[index]
    with pytest.raises(BadInput, match=r"here: arch_list: 'sm_80': expected an arch list"):
        BuildRecord({"cell": CELL, "arch_list": "sm_80"}, "here")
    with pytest.raises(BadInput, match="tag"):
        record.with_(tag="not a tag!")
    path = record.write(tmp_path / "build.json")
    assert BuildRecord.read(path) == record
    path.write_text("{")
    with pytest.raises(BadInput, match="not a JSON build record"):
        BuildRecord.read(path)


def test_every_committed_record_reads_as_a_build_record():
    rows, cells = read_records(records_dir()), read_cell_records(records_dir())
    assert rows and all(isinstance(r, BuildRecord) and r.recipe == name for name, r in rows.items())
    assert all(isinstance(r, BuildRecord) and r.cell == cell for by in cells.values() for cell, r in by.items())


def test_a_request_is_formed_once_with_the_settings_read_and_the_tier_rules_applied(tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_RECORD", "1")
    monkeypatch.setenv("FARM_TOOLKIT_SOURCE", "system")
    full = BuildRequest.make(CELL, out=tmp_path / "out", wheelhouse=tmp_path / "house")
    assert full.record and full.toolkit_source == "system" and full.publish and full.compiler_cache
    assert full.out == (tmp_path / "out").resolve() and full.flags_stop_after_s is None
    monkeypatch.setenv("FARM_RECORD", "0")   # read once: the request keeps what it was formed with
    assert full.record
    flags = BuildRequest.make(CELL, tier="flags", record=False)
    assert not flags.publish and not flags.compiler_cache and flags.flags_minutes == DEFAULT_FLAGS_MINUTES
    assert flags.flags_stop_after_s == 60 * DEFAULT_FLAGS_MINUTES and not flags.record
    smoke = BuildRequest.make(CELL, tier="smoke", arch="8.6")
    assert not smoke.publish and smoke.arch == "8.6" and smoke.compiler_cache
    with pytest.raises(BadInput, match="only a --smoke build takes one token"):
        BuildRequest.make(CELL, arch="8.6")
    with pytest.raises(BadInput, match="expected one of full, smoke, flags"):
        BuildRequest.make(CELL, tier="huge")
    monkeypatch.setenv("FARM_TOOLKIT_SOURCE", "nvidia")   # checked by provision.source_asked, at the edge
    with pytest.raises(BadInput, match="FARM_TOOLKIT_SOURCE.*expected auto, pypi, system or image"):
        BuildRequest.make(CELL)


def _string_keys(tree: ast.AST, names: set[str]) -> list[str]:
    """`x["compile"]`, `x.get("compile")`: subscripts and gets by one of `names`."""
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and node.args and isinstance(node.args[0], ast.Constant):
            key = node.args[0].value
        if key in names:
            found.append(f"{key} (line {node.lineno})")
    return found


def test_no_step_result_is_read_by_its_key_outside_the_state_module():
    # steps.json's entries are read through StepState's fields (design.md §6); a reader by key would
    # break silently when a result type changes.
    steps = {"source", "env", "toolkit", "prebuild", "compile", "label", "repair", "verify"}
    offenders = {}
    for path in FARM.rglob("*.py"):
        if path.name == "state.py":
            continue
        text = path.read_text()
        if "StepState" not in text and "steps.json" not in text:
            continue
        found = _string_keys(ast.parse(text), steps)
        if found:
            offenders[str(path.relative_to(FARM))] = found
    assert not offenders


def test_a_recipe_record_is_assembled_from_the_state_of_a_flags_run_and_a_failed_one(tmp_path):
    from farm.build.record import for_recipe
    from farm.recipes.plan import cell_plan

    cell, _ = cell_plan(CELL)
    flags = {"sass": ["sm_80", "sm_90"], "ptx": ["compute_90"], "equal": True, "compiling_invocations": 2}
    compiled = CompileStep(wheel=None, flags=flags, env={}, compiler_cache={"active": False}, nvcc_pid_namespace=False,
                           peak_process_mb=300, cpu_s=118.4)
    StepState().ran("compile", compiled, 60.0).write(tmp_path)
    record = for_recipe("farm_demo", cell, tier="flags", tier_asked="flags", out=tmp_path, key="k" * 64,
                        runner="host", started=0.0)
    assert record.sass == ("sm_80", "sm_90") and record.ptx == ("compute_90",) and record.flags == flags
    assert record.peak_mb == 300 and record.cache_hits is None and record.recipe == "farm_demo"
    assert record.compile_cpu_s == 118.4   # what the estimate's CPU-hours can be checked against
    StepState().failing("compile", "nvcc failed").write(tmp_path)
    (tmp_path / "compile.log").write_text(f"{tmp_path}/src/a.cu(3): error: no such thing\n")
    failed = for_recipe("farm_demo", cell, tier="failed", tier_asked="full", out=tmp_path, key="k" * 64,
                        runner="host", started=0.0, reason=f"{CELL}: compile failed (log: {tmp_path}/build.log)")
    assert failed.tier == "failed" and failed.tier_asked == "full" and str(tmp_path) not in (failed.reason or "")
