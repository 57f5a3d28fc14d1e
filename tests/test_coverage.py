"""Coverage verdicts (design.md §3.7): native / JIT-only / dead / unknown, per device, list and cell."""

from __future__ import annotations

import pytest

from farm.arch.coverage import DEAD, JIT, NATIVE, UNKNOWN, cell_verdict, device_for_sm, list_verdict
from farm.arch.resolve import resolve
from farm.archlist import ArchList
from farm.policy import load_defaults


@pytest.fixture(scope="module")
def defaults():
    return load_defaults()


def gpu(defaults, name):
    device = defaults.gpus.by_name(name)
    assert device is not None, name
    return device


def verdict(defaults, name, cuda, torch, platform, **kw):
    arch = resolve(cuda, torch, platform, defaults).arch_list
    return cell_verdict(gpu(defaults, name), cuda, torch, platform, arch, defaults, **kw)


def test_thor_dead_on_arm_cu128_and_cu129_where_torch_list_is_known(defaults):
    for cuda, torch in [("12.8", "2.9"), ("12.8", "2.10"), ("12.8", "2.11"), ("12.9", "2.10")]:
        v = verdict(defaults, "Jetson AGX Thor", cuda, torch, "linux_aarch64")
        assert v.status == DEAD, (cuda, torch, v.reason)


def test_thor_native_on_arm_cu130(defaults):
    for torch in ("2.9", "2.10", "2.11", "2.12", "2.13"):
        assert verdict(defaults, "Jetson AGX Thor", "13.0", torch, "linux_aarch64").status == NATIVE


def test_orin_dead_on_arm_even_with_an_80_cubin(defaults):
    v = verdict(defaults, "Jetson AGX Orin", "13.0", "2.10", "linux_aarch64")
    assert v.status == DEAD and "Tegra" in v.reason


def test_sm101_cubin_runs_on_thor_but_100_does_not(defaults):
    thor = gpu(defaults, "Jetson AGX Thor")
    tegra = defaults.gpus.tegra_ccs
    assert list_verdict(thor, ArchList.parse("10.1"), None, None, tegra, "l").status == NATIVE
    assert list_verdict(thor, ArchList.parse("10.0"), None, None, tegra, "l").status == DEAD


def test_rtx5090_dead_on_cu126_torch213_linux(defaults):
    v = verdict(defaults, "RTX 5090", "12.6", "2.13", "linux")
    assert v.status == DEAD
    assert v.terms[1].status == JIT     # the package's 9.0+PTX alone would JIT; torch's list has no PTX


def test_v100_native_cu128_torch29_linux_dead_on_windows_and_torch211(defaults):
    assert verdict(defaults, "V100", "12.8", "2.9", "linux").status == NATIVE
    win = verdict(defaults, "V100", "12.8", "2.9", "windows")
    assert win.status == DEAD and "torch's own list" in win.reason
    assert verdict(defaults, "V100", "12.8", "2.11", "linux").status == DEAD


def test_ptx_only_is_jit_above_the_floor_and_dead_below(defaults):
    ada = gpu(defaults, "RTX 4090")       # 8.9: served by 8.0 cubin normally; here only PTX
    tegra = defaults.gpus.tegra_ccs
    only_ptx = ArchList.parse("7.5+PTX")
    floor = defaults.toolkits["12.8"].jit_driver_floor
    assert list_verdict(ada, ArchList.parse("9.0+PTX"), floor, 600, tegra, "l").status == DEAD   # PTX above 8.9
    assert list_verdict(ada, only_ptx, floor, floor, tegra, "l").status == JIT
    assert list_verdict(ada, only_ptx, floor, floor + 5, tegra, "l").status == JIT
    below = list_verdict(ada, only_ptx, floor, floor - 1, tegra, "l")
    assert below.status == DEAD and f"R{floor}" in below.reason


def test_driver_560_refused_every_cuda13_channel(defaults):
    for torch in ("2.9", "2.10", "2.11", "2.12", "2.13"):
        v = verdict(defaults, "RTX 4090", "13.0", torch, "linux", driver=560)
        assert v.status == DEAD and "R580" in v.reason
    assert verdict(defaults, "RTX 4090", "12.8", "2.9", "linux", driver=560).status == NATIVE


def test_torch_free_cell_ignores_the_pam(defaults):
    arch = ArchList.parse("7.5 8.0 8.6 9.0 10.0 12.0+PTX")
    v5090 = gpu(defaults, "RTX 5090")
    linked = cell_verdict(v5090, "12.6", "2.13", "linux", ArchList.parse("8.0 9.0+PTX"), defaults)
    free = cell_verdict(v5090, "12.6", "2.13", "linux", ArchList.parse("8.0 9.0+PTX"), defaults, links_torch=False)
    assert linked.status == DEAD and free.status == JIT
    assert len(free.terms) == 2
    assert cell_verdict(v5090, "12.9", "2.13", "linux", arch, defaults, links_torch=False).status == NATIVE


def test_combo_missing_from_the_pam_is_unknown_never_native(defaults):
    # cu129 / torch 2.13 on linux is not in the PAM table.
    v = verdict(defaults, "RTX 4090", "12.9", "2.13", "linux")
    assert v.status == UNKNOWN and "not in the PAM" in v.reason


def test_a_and_f_variants(defaults):
    tegra = defaults.gpus.tegra_ccs
    h100, b300 = gpu(defaults, "H100"), gpu(defaults, "B300")
    assert list_verdict(h100, ArchList.parse("9.0a"), None, None, tegra, "l").status == NATIVE
    assert list_verdict(b300, ArchList.parse("10.0a"), None, None, tegra, "l").status == DEAD   # exact device only
    assert list_verdict(b300, ArchList.parse("10.0f"), None, None, tegra, "l").status == NATIVE  # family 10.x


def test_unknown_sm_builds_an_anonymous_device(defaults):
    dev = device_for_sm((7, 2), defaults)
    assert dev.tegra
    assert list_verdict(dev, ArchList.parse("7.0"), None, None, defaults.gpus.tegra_ccs, "l").status == DEAD
