"""`farm pam measure`: torch's own arch list read out of PyPI's torch 2.13.0 (CUDA 13.0) and applied over the table."""

from __future__ import annotations

import pytest
from farmcli import copy_defaults, run_farm
from wheel_factory import make_wheel, torch_cuda_wheel

from farm.arch.pam import Measurement, extract_torch_libs, measure, write_measurement
from farm.archlist import ArchList
from farm.policy import PAM_MEASURED_FILE, load_defaults

TORCH_2_13_CU130_LINUX = "7.5 8.0 8.6 9.0 10.0 12.0"


@pytest.fixture(scope="module")
def torch_wheel():
    return torch_cuda_wheel()


@pytest.mark.slow
def test_measure_reads_torchs_own_list_from_its_wheel(torch_wheel):
    m = measure(torch_wheel)
    assert (m.torch_version, m.cuda, m.platform, m.torch_minor) == ("2.13.0+cu130", "13.0", "linux", "2.13")
    assert m.arch_list.torch() == TORCH_2_13_CU130_LINUX
    # Hand-tuned kernels for single archs are seen but are not torch's list.
    assert {"9.0a", "10.0a", "10.3f"} <= set(m.partial)
    assert m.libraries["libtorch_cuda.so"]["entries"] > 1000


@pytest.mark.slow
def test_measure_reads_an_environment_the_same_way(torch_wheel):
    site = extract_torch_libs(torch_wheel)    # shaped like site-packages: torch/version.py, torch/lib/
    from_env = measure(site)
    assert from_env.platform == "linux"       # from the ELF machine, as no wheel tag is at hand
    assert from_env.arch_list == measure(torch_wheel).arch_list


@pytest.mark.slow
def test_farm_pam_measure_records_an_override_that_defaults_apply(torch_wheel, tmp_path):
    folder = copy_defaults(tmp_path)
    (folder / PAM_MEASURED_FILE).unlink(missing_ok=True)
    result = run_farm("pam", "measure", str(torch_wheel), env={"FARM_DEFAULTS": str(folder)})
    assert result.returncode == 0, result.stderr
    assert TORCH_2_13_CU130_LINUX in result.stdout and "recorded in" in result.stdout
    assert load_defaults(folder).pam.lookup("2.13", "13.0", "linux").torch() == TORCH_2_13_CU130_LINUX
    again = run_farm("pam", "measure", str(torch_wheel), "--dry-run", "--format", "json",
                     env={"FARM_DEFAULTS": str(folder)})
    assert again.returncode == 0 and '"written": null' in again.stdout


def test_a_measurement_overrides_the_table_for_its_combo_only(tmp_path):
    untouched = copy_defaults(tmp_path / "before")
    (untouched / PAM_MEASURED_FILE).unlink(missing_ok=True)
    before = load_defaults(untouched).pam
    folder = copy_defaults(tmp_path / "after")     # defaults are loaded once per folder
    (folder / PAM_MEASURED_FILE).unlink(missing_ok=True)
    measured = ArchList.parse("8.0 9.0 12.0+PTX")
    for platform, cuda in (("linux", "13.0"), ("linux_aarch64", "13.0"), ("windows", "12.8")):
        write_measurement(Measurement("2.13.0+cu130", cuda, platform, measured, (), "test"),
                          folder / PAM_MEASURED_FILE)
    write_measurement(Measurement("2.12.1+cu129", "12.9", "linux", measured, (), "test"), folder / PAM_MEASURED_FILE)
    after = load_defaults(folder).pam
    assert after.lookup("2.13", "13.0", "linux") == measured
    assert after.lookup("2.13", "13.0", "linux_aarch64") == measured
    assert after.lookup("2.13", "12.8", "windows") == measured
    assert before.lookup("2.12", "12.9", "linux") is None and after.lookup("2.12", "12.9", "linux") == measured
    assert after.lookup("2.12", "13.0", "linux") == before.lookup("2.12", "13.0", "linux")
    # Measuring again replaces the record of that combo instead of adding a second one.
    text = (folder / PAM_MEASURED_FILE).read_text()
    assert text.count("source: test") == 4


def test_a_cpu_torch_or_a_non_torch_wheel_is_refused_in_one_line(tmp_path):
    cpu = make_wheel(tmp_path, "torch", "2.13.0+cpu",
                     {"torch/version.py": b"__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n"},
                     tag="cp311-cp311-manylinux_2_28_x86_64")
    env = {"FARM_CACHE": str(tmp_path / "cache"), "FARM_DEFAULTS": str(copy_defaults(tmp_path))}
    result = run_farm("pam", "measure", str(cpu), env=env)
    assert result.returncode == 2 and "not a CUDA build" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    other = make_wheel(tmp_path / "o", "probe", "1.0", {"probe/__init__.py": b""}, tag="py3-none-any")
    result = run_farm("pam", "measure", str(other), env=env)
    assert result.returncode == 2 and "not a torch wheel" in result.stderr
    missing = run_farm("pam", "measure", str(tmp_path / "nothing"), env=env)
    assert missing.returncode == 2 and "no such file" in missing.stderr
