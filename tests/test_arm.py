"""The ARM lane (design.md §1.3, §3.4, §3.5, §8.2, §8.3, §11.2).

The quick tests run in `make test`: the ARM resolver's own inputs, the fallback
hazards `farm recipes check` prints, the emulated concurrency cap, and the refusals.
The `arm`-marked test is the real emulated build: `nox -s build-<cell>-aarch64`
on this x86_64 host runs the cell in the debootstrapped arm64 image under QEMU user
emulation, with NVIDIA's sbsa CUDA 13.0 wheels and PyPI's aarch64 torch 2.13. It
takes a long time cold (cicc under qemu, ~20-27 min here; warm, ccache serves the
objects) and runs only in `make test-arm`, which sets up qemu and the image first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from farmcli import run_farm
from wheel_builder import demo_extension

from farm.arch.fatbin import read_fatbin
from farm.errors import BadInput
from farm.platforms import cell_arch, host_arch
from farm.runners import emulation

PROJECT = Path(__file__).resolve().parent.parent
ARM_CELL = "farm_demo-cu130-torch2.13-py311-aarch64"
# The ARM lane's CUDA 13.0 policy row, normalised (defaults/arch_policy.yml, arch_policy_aarch64).
ARM_SASS = {(80, ""), (90, ""), (100, ""), (110, ""), (120, "")}
ARM_PTX = {(90, ""), (120, "")}

X86_LIST = "7.5 8.6 8.9"
ARM_LIST = "8.7 9.0"
ARM_13 = "8.7 9.0 11.0 12.0"


@pytest.fixture(scope="module")
def arm_recipes(tmp_path_factory):
    """A recipes dir with one package that writes both lanes' lists, plus a per-line ARM list for 13.0."""
    folder = tmp_path_factory.mktemp("recipes")
    (folder / "armdemo.yml").write_text(
        "name: armdemo\n"
        f"source:\n  path: {PROJECT / 'examples' / 'farm-demo'}\n"
        "links_torch: true\n"
        f"arch_list: {X86_LIST}\n"
        f"arch_list_aarch64: {ARM_LIST}\n"
        f"arch_list_by_cuda_aarch64:\n  '13.0': {ARM_13}\n")
    return folder


def _plan(recipes: Path) -> list[dict]:
    p = run_farm("plan", "--package", "armdemo", "--format", "json", env={"FARM_RECIPES": str(recipes)})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_arch_list_aarch64_is_exactly_the_arm_list_and_never_the_x86_one(arm_recipes):
    cells = _plan(arm_recipes)
    arm = [c for c in cells if c["platform"] == "linux_aarch64"]
    x86 = [c for c in cells if c["platform"] != "linux_aarch64"]
    assert arm and x86
    for c in arm:
        want = "8.7 9.0 11.0 12.0+PTX" if c["cuda"] == "13.0" else "8.7 9.0+PTX"
        assert c["arch_list"] == want, c["id"]
        assert not {"7.5", "8.6", "8.9"} & set(c["arch_list"].replace("+PTX", "").split()), c["id"]
    assert {c["arch_list"] for c in x86} == {"7.5 8.6 8.9+PTX"}


def test_arch_explain_names_the_arm_rule(arm_recipes):
    env = {"FARM_RECIPES": str(arm_recipes)}
    line = run_farm("arch", "explain", "--cuda", "12.8", "--torch", "2.8", "--platform", "linux_aarch64",
                    "--package", "armdemo", env=env)
    assert line.returncode == 0, line.stderr
    assert re.search(r"provenance:\s+.*arch_list_aarch64", line.stdout) and "8.7 9.0+PTX" in line.stdout
    per_line = run_farm("arch", "explain", "--cuda", "13.0", "--torch", "2.13", "--platform", "linux_aarch64",
                        "--package", "armdemo", env=env)
    assert re.search(r"provenance:\s+.*arch_list_by_cuda_aarch64\[13\.0\]", per_line.stdout), per_line.stdout
    assert 'TORCH_CUDA_ARCH_LIST="8.7 9.0 11.0 12.0+PTX"' in per_line.stdout


def test_recipes_check_names_the_arm_fallback_lines_of_a_recipe_with_one_arm_list(tmp_path):
    """sageattention as the facts gave it (an ARM list for 12.8 only; the recipe now lists every line):
    `farm recipes check` names each ARM line that falls back to the policy row and what that changes."""
    project = Path(__file__).resolve().parent.parent
    folder = tmp_path / "recipes"
    data = yaml.safe_load((project / "recipes" / "sageattention.yml").read_text())
    data["arch_list_by_cuda_aarch64"] = {"12.8": "8.0 9.0 9.0a 12.0+PTX"}
    folder.mkdir()
    (folder / "sageattention.yml").write_text(yaml.safe_dump(data))
    shutil.copytree(project / "recipes" / "patches" / "sageattention", folder / "patches" / "sageattention")
    p = run_farm("recipes", "check", env={"FARM_RECIPES": str(folder)})
    out = p.stdout + p.stderr
    hazards = re.findall(r"sageattention: aarch64 (\d+\.\d+): \(b\) falls back to arch_policy_aarch64\[[\d.]+\] = "
                         r"([^,]+), which differs from the x86 lane's recipe arch_list_by_cuda\[[\d.]+\] = (.+?) "
                         r"\(added: ([^;]*); missing: ([^)]*)\)", out)
    by_line = {h[0]: h for h in hazards}
    assert sorted(by_line) == ["12.6", "12.9", "13.0", "13.2"], out
    for line in ("12.9", "13.0", "13.2"):
        assert "10.0" in by_line[line][3].split(), by_line[line]          # 10.0 added on ARM
    for line in by_line:
        assert {"8.6", "8.9"} <= set(by_line[line][4].split()), by_line[line]   # the x86 floor lost
    # The line with an explicit ARM list (12.8) is no hazard.
    assert "sageattention: aarch64 12.8" not in out


def test_emulated_concurrency_is_its_own_setting():
    assert emulation.emulated_concurrency({}) == 1
    assert emulation.emulated_concurrency({"FARM_EMULATED_JOBS": "3"}) == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(BadInput, match="FARM_EMULATED_JOBS"):
            emulation.emulated_concurrency({"FARM_EMULATED_JOBS": bad})
    assert emulation.is_emulated("linux_aarch64", "x86_64") and not emulation.is_emulated("linux_aarch64", "aarch64")
    assert not emulation.is_emulated("linux", "x86_64") and emulation.is_emulated("linux", "aarch64")
    assert not emulation.is_emulated("windows", "x86_64")


def test_emulated_steps_see_an_arm_cpu_not_the_hosts(tmp_path):
    # torch's CPU detection segfaults on the host's x86 /proc/cpuinfo under qemu-user: the
    # container runner mounts these over it (the arm-marked build is the proof they suffice).
    mounts = dict((dst, src) for src, dst in emulation.fake_arm_cpu(tmp_path, cpus=3))
    info = Path(mounts["/proc/cpuinfo"]).read_text()
    assert re.findall(r"^processor\t: (\d+)$", info, re.M) == ["0", "1", "2"]
    assert "CPU implementer\t: 0x41" in info and "CPU part\t: 0xd0c" in info and "asimd" in info
    assert "GenuineIntel" not in info and "flags" not in info
    sys_cpu = Path(mounts["/sys/devices/system/cpu"])
    assert (sys_cpu / "online").read_text() == "0-2\n"
    midr = (sys_cpu / "cpu2" / "regs" / "identification" / "midr_el1").read_text()
    assert re.fullmatch(r"0x[0-9a-f]{16}\n", midr) and int(midr, 16) >> 24 == 0x41
    assert (sys_cpu / "cpu1" / "cache" / "index3" / "shared_cpu_list").read_text() == "0-2\n"
    # Written once: a second call returns the same files.
    assert emulation.fake_arm_cpu(tmp_path, cpus=3) == [(Path(mounts["/proc/cpuinfo"]), "/proc/cpuinfo"),
                                                        (sys_cpu, "/sys/devices/system/cpu")]


@pytest.mark.skipif(cell_arch("linux") != "x86_64" or os.uname().machine != "x86_64",
                    reason="x86_64 hosts only")
def test_an_arm_cell_on_the_x86_host_runner_is_refused_in_one_line(tmp_path):
    p = run_farm("build", ARM_CELL, "--runner", "host", "--out", str(tmp_path / "out"),
                 "--wheelhouse", str(tmp_path / "house"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "container runner" in p.stderr and not (tmp_path / "out").exists()


# ----- the real emulated build (make test-arm) --------------------------------------------


@pytest.fixture(scope="module")
def emulated_build(tmp_path_factory):
    from farm.runners import images
    from farm.runners.engine import Engine

    if host_arch() == "x86_64" and images.load_image("aarch64", Engine.detect()) is None:
        pytest.fail("no aarch64 builder image: run `make test-arm` (it runs setup-qemu and builds the image)")
    work = tmp_path_factory.mktemp("armbuild")
    out, house = work / "out", work / "house"
    # Warm runs take their objects from the (CUDA, torch) group's ccache, filled by an earlier
    # emulated compile (~1.5 min here); FARM_TEST_ARM_COLD=1 compiles everything under qemu (~20-27 min).
    cold = ["--no-compiler-cache"] if os.environ.get("FARM_TEST_ARM_COLD") == "1" else []
    p = subprocess.run([sys.executable, "-m", "nox", "-s", f"build-{ARM_CELL}", "--", "--out", str(out),
                        "--wheelhouse", str(house), "--force", *cold], cwd=PROJECT, capture_output=True, text=True)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:] + "\n" + _tail(out / "build.log")
    record = json.loads((out / "build.json").read_text())
    wheel = out / "wheel" / record["wheel"]
    return wheel, record, out, house


def _tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


@pytest.mark.arm
@pytest.mark.slow
def test_emulated_build_makes_an_aarch64_wheel_with_exactly_the_arm_lane_archs(emulated_build, tmp_path):
    wheel, record, out, house = emulated_build
    assert re.fullmatch(r"farm_demo-0\.1\.0\+cu130torch2\.13-cp311-cp311-manylinux_2_34_aarch64\.whl", wheel.name)
    so = demo_extension(wheel, tmp_path)
    report = read_fatbin(so)
    assert report.machine == "EM_AARCH64"
    assert report.sass() == ARM_SASS        # sm_80 sm_90 sm_100 sm_110 (Thor) sm_120
    assert report.ptx() == ARM_PTX          # compute_90 compute_120
    # NVIDIA's cuobjdump (x86_64 build) reads the aarch64 ELF the same way.
    from wheel_factory import as_cuobjdump_sees, cuobjdump_entries

    assert as_cuobjdump_sees(report.entries) == cuobjdump_entries(so)


@pytest.mark.arm
@pytest.mark.slow
def test_emulated_build_record_says_where_and_how(emulated_build):
    wheel, record, out, house = emulated_build
    assert record["cell"] == ARM_CELL and record["runner"] == "container"
    assert record["arch_list"] == "8.0 9.0+PTX 10.0 11.0 12.0+PTX"
    assert record["arch_provenance"].startswith("arch_policy_aarch64")
    assert record["runner_info"]["arch"] == "aarch64" and record["runner_info"]["emulated"] is True
    assert record["toolkit"]["arch"] == "aarch64" and record["toolkit"]["version"].startswith("13.0")
    assert record["image_tag"] == "manylinux_2_34_aarch64"
    # The gate ran in the image and passed; the wheel was published into the given wheelhouse.
    verify = json.loads((out / "verify.json").read_text())
    assert verify["passed"] is True
    assert list(house.rglob(wheel.name))
