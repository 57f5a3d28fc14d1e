"""`farm find` and `farm coverage` over the real grid (design.md §3.7)."""

from __future__ import annotations

import json

import pytest
from farmcli import run_farm

from farm.arch.coverage import DEAD, NATIVE
from farm.arch.find import channel_verdict, channels, find
from farm.matrix.grid import load_grid
from farm.policy import load_defaults


@pytest.fixture(scope="module")
def defaults():
    return load_defaults()


@pytest.fixture(scope="module")
def grid():
    return load_grid()


def test_thor_on_every_arm_channel_of_128_and_129_is_never_served(defaults, grid):
    thor = defaults.gpus.by_name("Jetson AGX Thor")
    arm = [c for c in channels(defaults, grid, "linux_aarch64") if c.cuda in ("12.8", "12.9")]
    assert arm
    verdicts = {(c.cuda, c.torch): channel_verdict(thor, c, defaults).status for c in arm}
    # dead wherever torch's own ARM list is known; `unknown` (never native/JIT) where the PAM lacks the combo
    assert set(verdicts.values()) <= {DEAD, "unknown"}
    known = {k for k in verdicts if defaults.pam.lookup(k[1], k[0], "linux_aarch64") is not None}
    assert known and all(verdicts[k] == DEAD for k in known)
    cu130 = [c for c in channels(defaults, grid, "linux_aarch64") if c.cuda == "13.0"]
    assert cu130 and all(channel_verdict(thor, c, defaults).status == NATIVE for c in cu130)


def test_orin_dead_on_every_channel_of_every_platform(defaults, grid):
    orin = defaults.gpus.by_name("Jetson AGX Orin")
    assert all(channel_verdict(orin, c, defaults).status == DEAD for c in channels(defaults, grid))


def test_find_orin_says_no_channel_and_why():
    out = run_farm("find", "--gpu", "Jetson AGX Orin", "--platform", "linux_aarch64", "--python", "3.12")
    assert out.returncode == 1
    assert "no channel serves Jetson AGX Orin" in out.stdout
    assert "Tegra" in out.stdout and "8.7" in out.stdout and "JetPack" in out.stdout


def test_find_rtx5090_native_first_with_exact_pin_and_pypi_as_extra():
    out = run_farm("find", "--gpu", "RTX 5090", "--platform", "linux", "--python", "3.12", "--package", "drtk",
                   "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    statuses = [o["status"] for o in data["offers"]]
    assert statuses == sorted(statuses, key=lambda s: s != "native")
    first = data["offers"][0]
    assert first["status"] == "native"
    label = f"cu{first['cuda'].replace('.', '')}torch{first['torch']}"
    assert f"'drtk==0.1.0+{label}'" in first["command"]
    assert f"/{label[:5]}/torch{first['torch']}/ --extra-index-url https://pypi.org/simple" in first["command"]
    assert not any(o["cuda"] == "12.6" for o in data["offers"])   # torch's cu126 builds stop at 9.0


def test_find_with_an_unserved_torch_falls_back_and_says_why():
    out = run_farm("find", "--gpu", "RTX 4090", "--platform", "linux", "--python", "3.12", "--torch", "2.14")
    assert out.returncode == 0, out.stderr
    assert "torch 2.14 has no channel" in out.stdout and "fallback cu128/torch2.8" in out.stdout
    assert "cu128/torch2.8/" in out.stdout


def test_find_arm_fallback_is_cu130_torch210(defaults, grid):
    gh200 = defaults.gpus.by_name("GH200 (Grace Hopper)")
    answer = find(gh200, "linux_aarch64", "3.12", defaults, grid, torch="2.8")
    assert any("cu130/torch2.10" in n for n in answer.notes)
    assert [(o.channel.cuda, o.channel.torch) for o in answer.offers] == [("13.0", "2.10")]


def test_driver_560_gets_no_cuda13_channel(defaults, grid):
    ada = defaults.gpus.by_name("RTX 4090")
    answer = find(ada, "linux", "3.12", defaults, grid, driver=560)
    assert answer.offers
    assert all(not o.channel.cuda.startswith("13.") for o in answer.offers)


def test_coverage_flags_rtx5090_dead_on_cu126_torch213():
    out = run_farm("coverage", "--cuda", "12.6", "--torch", "2.13", "--platform", "linux")
    assert out.returncode == 0, out.stderr
    assert "RTX 5090 (12.0), a current device, is dead" in out.stdout


def test_coverage_json_v100_native_linux_dead_windows():
    out = run_farm("coverage", "--cuda", "12.8", "--torch", "2.9", "--format", "json")
    data = {(r["platform"]): r["devices"] for r in json.loads(out.stdout)}
    assert data["linux"]["7.0"]["status"] == "native"
    assert data["windows"]["7.0"]["status"] == "dead"


def test_unknown_gpu_name_is_one_line():
    out = run_farm("find", "--gpu", "Voodoo 5", "--platform", "linux", "--python", "3.12")
    assert out.returncode == 2 and "--gpu: 'Voodoo 5': unknown GPU" in out.stderr
