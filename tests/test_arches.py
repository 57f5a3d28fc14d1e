"""Arch lists: tokens, resolution order per lane, exceptions as additions, normalisation, clamps, hazards."""

from __future__ import annotations

import pytest
from farmcli import copy_defaults, run_farm

from farm.arch.resolve import ArchOverrides, fallback_hazards, resolve
from farm.archlist import ArchList
from farm.errors import BadInput, NoSuchCell
from farm.policy import load_defaults


@pytest.fixture(scope="module")
def defaults():
    return load_defaults()


def listed(cuda, torch, platform, defaults, overrides=None):
    kwargs = {"overrides": overrides} if overrides else {}
    return str(resolve(cuda, torch, platform, defaults, **kwargs).arch_list)


def test_cu128_torch29_default_gets_volta_from_the_exception(defaults):
    res = resolve("12.8", "2.9", "linux", defaults)
    assert str(res.arch_list) == "7.0 7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX"
    assert res.provenance.startswith("arch_exceptions[12.8/2.9]")
    assert res.exports()["TORCH_CUDA_ARCH_LIST"] == "7.0 7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX"


def test_cu128_torch211_has_no_volta(defaults):
    res = resolve("12.8", "2.11", "linux", defaults)
    assert str(res.arch_list) == "7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX"
    assert res.provenance == "arch_policy[12.8]"


def test_windows_is_x86_lane_and_sees_the_exception(defaults):
    assert listed("12.8", "2.9", "windows", defaults).startswith("7.0 ")


def edit_row(tmp_path, row: str):
    folder = copy_defaults(tmp_path)
    path = folder / "arch_policy.yml"
    text = path.read_text()
    old = '"12.8": "7.5;8.0;8.6;9.0+PTX;10.0;12.0+PTX"'
    assert old in text
    path.write_text(text.replace(old, f'"12.8": "{row}"', 1))
    return folder


def test_editing_the_policy_row_reaches_the_exception_minor(tmp_path):
    # The issue's example adds 10.3, which CUDA 12.8's nvcc cannot emit (sm_103 arrived in 12.9):
    # the clamp refuses that edit (next test); 8.9 shows the same reach with an emittable arch.
    edited = load_defaults(edit_row(tmp_path, "7.5;8.0;8.6;8.9;9.0+PTX;10.0;12.0+PTX"))
    assert "8.9" not in listed("12.9", "2.9", "linux", edited)
    assert listed("12.8", "2.9", "linux", edited) == "7.0 7.5 8.0 8.6 8.9 9.0+PTX 10.0 12.0+PTX"
    assert listed("12.8", "2.11", "linux", edited) == "7.5 8.0 8.6 8.9 9.0+PTX 10.0 12.0+PTX"


def test_adding_an_arch_the_line_cannot_emit_to_a_policy_row_is_refused(tmp_path):
    folder = edit_row(tmp_path, "7.5;8.0;8.6;9.0+PTX;10.0;10.3;12.0+PTX")
    with pytest.raises(BadInput, match=r"arch_policy\[12.8\]: '10.3': CUDA 12.8's nvcc cannot emit sm 10.3"):
        load_defaults(folder)


def test_arm_lane_never_sees_the_exception(defaults):
    res = resolve("12.8", "2.9", "linux_aarch64", defaults)
    assert str(res.arch_list) == "8.0 9.0+PTX 10.0 12.0+PTX"
    assert res.provenance == "arch_policy_aarch64[12.8]"


def test_no_cu124_arm_cell(defaults):
    with pytest.raises(NoSuchCell, match="12.4"):
        resolve("12.4", "2.5", "linux_aarch64", defaults)


def test_arm_lane_never_reads_x86_recipe_lists(defaults):
    overrides = ArchOverrides.from_mapping({"arch_list": "8.6 8.9", "arch_list_by_cuda": {"13.0": "8.9"}}, "r.yml")
    assert listed("13.0", "2.13", "linux_aarch64", defaults, overrides) == "8.0 9.0+PTX 10.0 11.0 12.0+PTX"
    arm = ArchOverrides.from_mapping({"arch_list": "8.6", "arch_list_aarch64": "9.0 11.0"}, "r.yml")
    assert listed("13.0", "2.13", "linux_aarch64", defaults, arm) == "9.0 11.0+PTX"
    assert listed("13.0", "2.13", "linux", defaults, arm) == "8.6+PTX"


@pytest.mark.parametrize(("text", "expected"), [
    ("9.0 12.0", "9.0 12.0+PTX"),
    ("9.0;12.0", "9.0 12.0+PTX"),
    ("12.0 9.0", "9.0 12.0+PTX"),            # numeric, not lexical: 12.0 > 9.0
    ("9.0+PTX 10.0", "9.0+PTX 10.0+PTX"),
    ("8.0 9.0+PTX 10.0 12.0+PTX", "8.0 9.0+PTX 10.0 12.0+PTX"),
    ("9.0a", "9.0a"),                         # no plain token: no PTX
    ("12.0f", "12.0f"),
    ("9.0 9.0a 12.0f", "9.0+PTX 9.0a 12.0f"),  # highest PLAIN token gets it
])
def test_ptx_normalisation(text, expected):
    once = ArchList.parse(text).normalised()
    assert str(once) == expected
    assert once.normalised() == once  # idempotent


def test_cmake_rendering():
    assert ArchList.parse("7.5 8.0 9.0+PTX 9.0a 12.0f").cmake() == "75-real;80-real;90;90a-real;120f-real"


@pytest.mark.parametrize("bad", ["8.O", "sm_80", "8", "9.0a+PTX", "8.0+ptx", "compute_90", ""])
def test_bad_tokens_are_one_line_errors(bad):
    with pytest.raises(BadInput) as err:
        ArchList.parse(bad, "recipes/x.yml", "arch_list")
    assert "recipes/x.yml" in str(err.value) and "arch_list" in str(err.value)
    assert "\n" not in str(err.value)


def test_toolkit_clamp_is_an_error_not_a_drop(defaults):
    overrides = ArchOverrides.from_mapping({"arch_list": "7.0 8.0"}, "recipes/old.yml")
    with pytest.raises(BadInput, match=r"recipes/old.yml: arch_list: '7.0': CUDA 13.0's nvcc cannot emit"):
        resolve("13.0", "2.13", "linux", defaults, overrides, where="recipes/old.yml")
    with pytest.raises(BadInput, match="cannot emit sm 11.0"):
        resolve("12.8", "2.9", "linux", defaults, ArchOverrides.from_mapping({"arch_list": "11.0"}, "r"), where="r")
    with pytest.raises(BadInput, match="family-specific 12.0f"):
        resolve("12.8", "2.9", "linux", defaults, ArchOverrides.from_mapping({"arch_list": "12.0f"}, "r"), where="r")


# ---------------------------------------------------------------- CLI, bad inputs


def test_cli_explain_policy_default():
    out = run_farm("arch", "explain", "--cuda", "12.8", "--torch", "2.9", "--platform", "linux")
    assert out.returncode == 0, out.stderr
    assert "arch list:   7.0 7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX" in out.stdout
    assert "provenance:  arch_exceptions[12.8/2.9]" in out.stdout
    assert 'export TORCH_CUDA_ARCH_LIST="7.0 7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX"' in out.stdout


def test_cli_explain_explicit_list_gets_ptx():
    out = run_farm("arch", "explain", "--cuda", "12.8", "--torch", "2.9", "--arch-list", "8.0 8.9+PTX")
    assert out.returncode == 0, out.stderr
    assert "arch list:   8.0 8.9+PTX" in out.stdout


def test_cli_arm_request_without_arm_row_says_no_such_cell():
    out = run_farm("arch", "explain", "--cuda", "12.4", "--torch", "2.5", "--platform", "linux_aarch64")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "no such cell" in out.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--arch-list", "8.O"], "--arch-list: '8.O'"),
    (["--arch-list", "sm_80"], "--arch-list: 'sm_80'"),
    (["--arch-list", "8.0 13.7"], "--arch-list: '13.7': CUDA 12.8's nvcc cannot emit"),
])
def test_cli_bad_lists_are_one_line_exit_2(args, needle):
    out = run_farm("arch", "explain", "--cuda", "12.8", "--torch", "2.9", *args)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and needle in out.stderr and "Traceback" not in out.stderr


def test_cli_unknown_cuda_line_is_one_line():
    out = run_farm("arch", "explain", "--cuda", "12.7", "--torch", "2.9")
    assert out.returncode == 2 and "--cuda: '12.7': unknown CUDA line" in out.stderr


@pytest.mark.parametrize(("file", "old", "new", "needle"), [
    ("arch_policy.yml", '"12.8": "7.5;8.0;', '"12.8": "7.5;8.O;', "arch_policy.yml: arch_policy[12.8]: '8.O'"),
    ("arch_policy.yml", '"12.8": "7.5;8.0;', '"12.8": "7.5;sm_80;', "arch_policy[12.8]: 'sm_80'"),
    ("arch_policy.yml", '"12.8": "7.5;8.0;', '"12.8": "7.5;13.7;', "arch_policy[12.8]: '13.7': CUDA 12.8's nvcc cannot emit"),
    ("arch_policy.yml", '  "12.8": "7.5;8.0;8.6;9.0+PTX;10.0;12.0+PTX"\n', "",
     "arch_exceptions[12.8/2.8]: '12.8/2.8': CUDA 12.8 has no arch_policy row"),
    ("arch_policy.yml", '"12.8/2.8":  {add: ["7.0"]}', '"12.8/2.8":  {remove: ["7.0"]}', "arch_exceptions[12.8/2.8]"),
    ("arch_policy.yml", "arch_policy:\n", "arch_policy:\n  - [\n", "arch_policy.yml:"),
    ("gpus.yml", '{cc: "8.9",', '{cc: "8.9x",', "gpus.yml: devices[9].cc: '8.9x'"),
    ("python_cuda_torch_os_policy.yml", 'python_min: "3.10"', "python_min: 3.10", "python_min: 3.1"),
    ("python_cuda_torch_os_policy.yml", "peak_gb_per_job: 8 ", "peak_gb_per_job: lots ",
     "defaults.peak_gb_per_job: 'lots'"),
    ("torch_arch_matrix.yml", '"2.13": {"12.6": "5.0;', '"2.13": {"12.6": "5,0;', "torch_arch_matrix.yml: x86[2.13][12.6]"),
])
def test_bad_defaults_are_one_line_naming_file_key_value(tmp_path, file, old, new, needle):
    folder = copy_defaults(tmp_path)
    path = folder / file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    out = run_farm("arch", "explain", "--cuda", "12.8", "--torch", "2.9", env={"FARM_DEFAULTS": str(folder)})
    assert out.returncode == 2, out.stdout
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert needle in out.stderr, out.stderr


def test_the_policy_peak_gb_per_job_may_be_fractional_like_a_recipes(tmp_path):
    from farm.policy import load_defaults
    from farm.recipes.reader import load_recipes

    folder = copy_defaults(tmp_path)
    path = folder / "python_cuda_torch_os_policy.yml"
    path.write_text(path.read_text().replace("peak_gb_per_job: 8 ", "peak_gb_per_job: 2.5 ", 1))
    defaults = load_defaults(folder)
    recipes = load_recipes(defaults=defaults)
    without_own = next(r for r in recipes.values() if r.peak_gb_per_job is None)
    assert without_own.peak_gb(defaults) == 2.5
    assert recipes["diso"].peak_gb(defaults) == 2.0   # the recipe's own wins


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    folder = copy_defaults(tmp_path)
    (folder / "arch_policy.yml").write_text("arch_policy:\n  '12.8': [unclosed\n")
    out = run_farm("arch", "explain", "--cuda", "12.8", "--torch", "2.9", env={"FARM_DEFAULTS": str(folder)})
    assert out.returncode == 2
    assert "arch_policy.yml:" in out.stderr and "YAML syntax error" in out.stderr
    assert out.stderr.count("\n") == 1


def test_missing_policy_row_is_named(tmp_path, defaults):
    folder = copy_defaults(tmp_path)
    path = folder / "arch_policy.yml"
    text = path.read_text()
    # drop the 13.2 row of the x86 table only (the ARM table keeps its own)
    path.write_text(text.replace('  "13.2": "7.5;8.0;8.6;9.0+PTX;10.0;12.0+PTX"\n', "", 1))
    with pytest.raises(BadInput, match=r"arch_policy\[13.2\]: '13.2': no arch_policy row"):
        resolve("13.2", "2.13", "linux", load_defaults(folder))


# ---------------------------------------------------------------- hazards (design.md §3.5)

def kinds(hazards, lane=None):
    return {(h.kind, h.lane, h.cuda) for h in hazards if lane is None or h.lane == lane}


def test_hazard_a_by_cuda_map_missing_a_built_line(defaults):
    rec = ArchOverrides.from_mapping({"arch_list_by_cuda": {"12.8": "7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX"}}, "r")
    found = kinds(fallback_hazards("r", rec, {"x86": ["12.8", "13.0"]}, defaults))
    assert ("a", "x86", "13.0") in found
    assert not any(cuda == "12.8" for _, _, cuda in found)


def test_hazard_a_silenced_by_arch_fallback_policy(defaults):
    rec = ArchOverrides.from_mapping({"arch_list_by_cuda": {"12.8": "7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX"},
                                      "arch_fallback": "policy"}, "r")
    assert not any(k == "a" for k, _, _ in kinds(fallback_hazards("r", rec, {"x86": ["12.8", "13.0"]}, defaults)))


def test_hazard_b_x86_explicit_list_and_arm_policy_with_extra_arch(defaults):
    rec = ArchOverrides.from_mapping({"arch_list": "8.0 9.0+PTX 12.0+PTX"}, "r")
    hazards = fallback_hazards("r", rec, {"x86": ["13.0"], "aarch64": ["13.0"]}, defaults)
    b = [h for h in hazards if h.kind == "b"]
    assert [(h.lane, h.cuda) for h in b] == [("aarch64", "13.0")]
    assert "added: 10.0 11.0" in b[0].message


def test_hazard_c_resolved_list_below_the_recipe_floor(defaults):
    rec = ArchOverrides.from_mapping({"arch_list_by_cuda": {"12.8": "8.0 9.0+PTX"}, "arch_fallback": "policy"}, "r")
    hazards = fallback_hazards("r", rec, {"x86": ["12.6", "12.8"]}, defaults)
    assert ("c", "x86", "12.6") in kinds(hazards)        # policy 12.6 starts at 5.0 < 8.0
    assert ("c", "x86", "12.8") not in kinds(hazards)


def test_no_hazard_for_a_plain_recipe(defaults):
    assert fallback_hazards("r", ArchOverrides(), {"x86": ["12.8", "13.0"], "aarch64": ["13.0"]}, defaults) == []
