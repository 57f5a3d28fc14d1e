"""Builder images: cached by recipe, what they record (glibc, tag, Pythons), the production
dry run, platform-tag checks, qemu registration and the emulated aarch64 image.

Slow on a cold machine (debootstrap ~2 min, aarch64 under qemu longer); cached under
cache_dir()/images afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm.errors import BadInput
from farm.platforms import host_arch, plat_glibc
from farm.runners import images
from farm.runners.engine import Engine, Mount, ensure_engine

PROJECT = Path(__file__).resolve().parent.parent


def farm_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, text=True, cwd=PROJECT)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return ensure_engine()


@pytest.fixture(scope="module")
def image(engine) -> images.Image:
    return images.ensure_builder(host_arch(), engine, quiet=True)


# ----- no engine needed ---------------------------------------------------------------


def test_dry_run_renders_the_production_manylinux_build_with_dnf():
    p = farm_cli("images", "build", "--dry-run", "--arch", "x86_64")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "--build-arg BASE=quay.io/pypa/manylinux_2_28_x86_64" in out
    assert "dnf install -y" in out and "apt-get" not in out
    assert "cuda/repos/rhel8/x86_64/cuda-rhel8.repo" in out
    for pkg in ("cuda-nvcc-13-0", "cuda-cudart-devel-13-0", "libcublas-devel-13-0", "libcusparse-devel-13-0",
                "libcusolver-devel-13-0", "cuda-cuobjdump-13-0"):
        assert pkg in out
    arm = farm_cli("images", "build", "--dry-run", "--arch", "aarch64", "--cuda", "12.8").stdout
    assert "manylinux_2_28_aarch64" in arm and "--platform linux/arm64" in arm
    assert "rhel8/sbsa/" in arm and "cuda-nvcc-12-8" in arm


def test_apt_and_dnf_lists_come_from_the_one_install_script():
    apt = images.apt_packages()
    assert {"python3", "python3-venv", "python3-dev", "gcc", "g++", "make", "patchelf", "git",
            "ca-certificates"} <= set(apt)
    assert images.base_recipe("x86_64")["include"] == sorted(apt)


def test_base_and_builder_keys_follow_their_recipes(monkeypatch):
    k1 = images.base_key("x86_64")
    assert images.base_key("x86_64") == k1
    assert images.base_key("aarch64") != k1
    b1 = images.builder_key("x86_64", images.base_ref("x86_64"))
    monkeypatch.setattr(images, "apt_packages", lambda: ["python3", "gcc", "extra-package"])
    assert images.base_key("x86_64") != k1
    assert images.builder_key("x86_64", images.base_ref("x86_64")) != b1


def _fake_image(**kw) -> images.Image:
    # A record only (no engine): check_plat reads nothing else.
    base = dict(ref="localhost/farm-builder:test", id="sha256:0", arch="x86_64", base="b", package_manager="apt",
                glibc="2.36", plat="manylinux_2_34_x86_64", plat_cap="manylinux_2_36_x86_64")
    return images.Image(**{**base, **kw})


def test_check_plat_normalises_and_refuses_tags_the_image_cannot_honour():
    im = _fake_image()
    assert images.check_plat(im, "manylinux_2_34") == "manylinux_2_34_x86_64"
    assert images.check_plat(im, "manylinux_2_35_x86_64") == "manylinux_2_35_x86_64"
    for bad in ("manylinux_2_28", "manylinux2014_x86_64", "manylinux_2_39", "manylinux_2_34_aarch64", "linux_x86_64"):
        with pytest.raises(BadInput) as exc:
            images.check_plat(im, bad)
        assert "\n" not in str(exc.value) and bad in str(exc.value)
    prod = _fake_image(glibc="2.28", plat="manylinux_2_28_x86_64", plat_cap="manylinux_2_28_x86_64")
    assert images.check_plat(prod, "manylinux_2_28") == "manylinux_2_28_x86_64"


# ----- real engine -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.container
def test_builder_image_is_cached_and_not_rebuilt(engine, image, monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("the builder image was rebuilt although its recipe did not change")

    monkeypatch.setattr(Engine, "build", no_build)
    monkeypatch.setattr(images, "_debootstrap", no_build)
    again = images.ensure_builder(host_arch(), engine, quiet=True)
    assert again.id == image.id and again.ref == image.ref
    assert images.load_image(host_arch(), engine) == image
    assert images.base_tarball(host_arch()).exists() and images.sysroot_tarball(host_arch()).exists()


@pytest.mark.slow
@pytest.mark.container
def test_debian_image_records_glibc_tag_and_pythons(engine, image):
    assert image.package_manager == "apt"
    assert image.glibc == "2.36"
    # Debian 12's own gcc gave manylinux_2_34 (pthread_once@GLIBC_2.34); the bullseye toolchain builds the
    # probe against glibc 2.31, and what it then needs is older still (design.md §8.3).
    assert image.plat == f"manylinux_2_24_{image.arch}"
    assert image.plat_cap == f"manylinux_2_36_{image.arch}"
    assert image.toolchain["glibc"] == "2.31"
    own = image.python("3.11")
    assert own == {"version": "3.11", "path": "/usr/bin/python3"}
    inside = json.loads(engine.output(image.ref, ["cat", images.IMAGE_FACTS_PATH], network=False))
    assert inside["glibc"] == image.glibc and inside["package_manager"] == "apt"
    assert images.check_plat(image, "manylinux_2_28") == f"manylinux_2_28_{image.arch}"   # torch's own tag
    with pytest.raises(BadInput, match="manylinux_2_24.*glibc 2.36"):
        images.check_plat(image, "manylinux_2_17")


@pytest.mark.slow
@pytest.mark.container
def test_recorded_host_pythons_run_in_the_image_from_a_read_only_mount(engine, image):
    mounted = [p for p in image.pythons if p.get("mount")]
    host_minors = {".".join(p.name.split(".")[:2]) for p in images.pyenv_prefixes()} - {"3.11"}
    assert {p["version"] for p in mounted} == host_minors
    if not mounted:
        pytest.skip("this host has no pyenv Pythons besides the image's own")
    py = mounted[-1]
    out = engine.output(image.ref, [py["path"], "-c", "import sys, ssl, venv; print('%d.%d' % sys.version_info[:2])"],
                        mounts=[Mount(py["mount"], py["mount"], read_only=True)], network=False)
    assert out.strip() == py["version"]


@pytest.mark.slow
@pytest.mark.container
def test_images_show_lists_the_image_with_its_tag(image):
    p = farm_cli("images", "show")
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith(image.ref))
    assert "glibc 2.36" in line and f"tag {image.plat}" in line and "3.11" in line
    assert "gone" not in line


@pytest.mark.slow
@pytest.mark.container
def test_prune_removes_superseded_images_and_files_and_keeps_what_current_builds_use(engine, image, tmp_path):
    LAYER_REPO = images.LAYER_REPO
    # Superseded things as a host collects them: a builder tag of an older key, a package layer over a
    # builder that is gone, a base tarball and a record of older keys.
    old_builder = f"{images.BUILDER_REPO}:{host_arch()}-000000000000"
    engine.tag(image.ref, old_builder)
    (tmp_path / "Dockerfile").write_text(f"FROM {image.ref}\nLABEL farm.layer-of=sha256:{'0' * 64}\n")
    old_layer = f"{LAYER_REPO}:{host_arch()}-000000000000"
    engine.build(tmp_path, old_layer, dockerfile=tmp_path / "Dockerfile", arch=host_arch(), network=False)
    current_layer = f"{LAYER_REPO}:{host_arch()}-111111111111"   # a layer over the current builder stays
    (tmp_path / "Dockerfile").write_text(f"FROM {image.ref}\nLABEL farm.layer-of={image.id}\n")
    engine.build(tmp_path, current_layer, dockerfile=tmp_path / "Dockerfile", arch=host_arch(), network=False)
    # A superseded builder another checkout's build still runs on: kept, said, and no failure.
    busy = f"{images.BUILDER_REPO}:{host_arch()}-000000000001"
    (tmp_path / "Dockerfile").write_text(f"FROM {image.ref}\nLABEL farm.test-busy=1\n")
    engine.build(tmp_path, busy, dockerfile=tmp_path / "Dockerfile", arch=host_arch(), network=False)
    holder = engine.create(busy, ["true"], network=False)
    old_tarball = images.images_dir() / f"base-{images.SUITE}-{host_arch()}-{'0' * 16}.tar"
    old_tarball.write_bytes(b"")
    old_record = images.images_dir() / "records" / f"{host_arch()}-{'0' * 16}.json"
    old_record.write_text(json.dumps({**json.loads(json.dumps(image.__dict__)), "key": "0" * 16}))
    try:
        dry = farm_cli("images", "prune", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        for stale in (old_builder, old_layer, str(old_tarball), str(old_record)):
            assert f"would remove {stale}" in dry.stdout, dry.stdout
        assert image.ref not in dry.stdout and current_layer not in dry.stdout
        assert engine.image_id(old_builder) and old_tarball.exists()   # a dry run removes nothing

        done = farm_cli("images", "prune")
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"removed {old_builder}" in done.stdout and f"removed {old_layer}" in done.stdout
        assert f"kept {busy}: " in done.stdout and "in use" in done.stdout and engine.image_id(busy)
        assert engine.image_id(old_builder) is None and engine.image_id(old_layer) is None
        assert not old_tarball.exists() and not old_record.exists()
        assert engine.image_id(image.ref) == image.id and engine.image_id(current_layer)
        assert images.load_image(host_arch(), engine) is not None   # the current record stays
        assert image.ref not in farm_cli("images", "prune", "--dry-run").stdout
    finally:
        engine.rm(holder)
        for ref in (old_builder, old_layer, current_layer, busy):
            engine.remove_image(ref)
        old_tarball.unlink(missing_ok=True)
        old_record.unlink(missing_ok=True)


def test_setup_qemu_is_idempotent():
    first = farm_cli("images", "setup-qemu")
    if first.returncode != 0:
        # One clear line naming why (no root, no binfmt_misc): that is the contract.
        assert first.stderr.count("\n") == 1 and "qemu-aarch64" in first.stderr
        pytest.skip(first.stderr.strip())
    second = farm_cli("images", "setup-qemu")
    assert second.returncode == 0 and "already registered" in second.stdout
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").read_text()
    assert entry.startswith("enabled") and "F" in entry.split("flags:")[1].split()[0]


def arm_image_or_skip(engine: Engine) -> images.Image:
    """The emulated aarch64 image: built when FARM_TEST_ARM=1 (`make test-arm`), else used
    only if this machine already has it (debootstrap under qemu takes ~12 min cold)."""
    if os.environ.get("FARM_TEST_ARM") != "1" and images.load_image("aarch64", engine) is None:
        pytest.skip("aarch64 image not built here; FARM_TEST_ARM=1 builds it (~12 min under qemu)")
    return images.ensure_builder("aarch64", engine, quiet=True)


@pytest.mark.slow
@pytest.mark.container
@pytest.mark.arm
def test_aarch64_image_runs_under_qemu_and_records_its_own_tag(engine):
    arm = arm_image_or_skip(engine)
    assert arm.arch == "aarch64" and engine.image_arch(arm.ref) == "aarch64"
    assert engine.output(arm.ref, ["uname", "-m"], arch="aarch64", network=False).strip() == "aarch64"
    assert plat_glibc(arm.plat) <= (2, 31) and arm.toolchain["glibc"] == "2.31"   # the bullseye sysroot
    # Host pyenv Pythons are x86_64 binaries: never offered to an aarch64 image.
    assert [p["version"] for p in arm.pythons] == ["3.11"] and not arm.pythons[0].get("mount")
