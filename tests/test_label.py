"""Step 5, label: a real wheel built by pip from a tiny C extension, relabelled and installed again."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename
from wheel_builder import build_wheel

from farm.build.label import label_wheel, read_wheel_metadata, substitute_requires
from farm.errors import BadInput

REQUIRES = [
    "numpy>=1.0",
    "torch>=2.0",
    "torchvision",
    "TorchAudio[foo]>=2; sys_platform == 'linux'",
    "Torch_Vision>=0.1",  # not the torch family (different canonical name): kept
]
EXTRAS = {"x": ["torch>=2.0", "scipy"], "y": ["torchaudio==2.8.0"]}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("wheel"), install_requires=REQUIRES, extras_require=EXTRAS)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def field_values(meta: str, name: str) -> list[str]:
    head = meta.split("\n\n", 1)[0]
    return [ln.split(":", 1)[1].strip() for ln in head.splitlines() if ln.lower().startswith(name.lower() + ":")]


def assert_consistent(wheel: Path) -> dict:
    """File name, METADATA, .dist-info, WHEEL tags and RECORD agree; every hash is right."""
    name, version, build, tags = parse_wheel_filename(wheel.name)
    meta, di = read_wheel_metadata(wheel)
    assert field_values(meta, "Version") == [str(version)]
    assert di == f"demo_pkg-{version}.dist-info"
    with zipfile.ZipFile(wheel) as z:
        files = {i.filename for i in z.infolist() if not i.is_dir()}
        rows = list(csv.reader(io.StringIO(z.read(f"{di}/RECORD").decode())))
        wheel_file = z.read(f"{di}/WHEEL").decode()
        listed = {}
        for path, h, size in rows:
            if path == f"{di}/RECORD":
                assert (h, size) == ("", "")
                continue
            data = z.read(path)
            expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert h == expected, path
            assert int(size) == len(data), path
            listed[path] = h
        assert set(listed) | {f"{di}/RECORD"} == files
        assert len(rows) == len(files)
        assert z.infolist()[-1].filename == f"{di}/RECORD"
        tag_lines = sorted(ln.split(":", 1)[1].strip() for ln in wheel_file.splitlines() if ln.startswith("Tag:"))
        assert tag_lines == sorted(str(t) for t in tags)
        build_lines = [ln for ln in wheel_file.splitlines() if ln.startswith("Build:")]
        assert build_lines == ([f"Build: {build[0]}"] if build else [])
        info = json.loads(z.read(f"{di}/farm_build.json")) if f"{di}/farm_build.json" in files else None
    return {"meta": meta, "version": str(version), "build": build, "info": info, "di": di}


def test_label_puts_the_local_version_everywhere_and_keeps_record_valid(built, tmp_path):
    before = digest(built)
    info = {"cell": "demo_pkg-cu128-torch2.8-py311", "build_key": "k" * 16, "arch_list": "8.0 9.0+PTX",
            "source_commit": "a" * 40, "toolkit": "12.8.93", "image": "farm-builder:abc"}
    out = label_wheel(built, tmp_path / "out", local_label="cu128torch2.8", build_info=info)
    assert out.name == "demo_pkg-1.2.0+cu128torch2.8-cp311-cp311-linux_x86_64.whl"
    got = assert_consistent(out)
    assert got["version"] == "1.2.0+cu128torch2.8"
    assert got["info"] == info
    assert digest(built) == before  # input untouched
    assert [p.name for p in (tmp_path / "out").iterdir()] == [out.name]  # no temporary left


def test_torch_family_is_stripped_in_every_spelling(built, tmp_path):
    out = label_wheel(built, tmp_path, local_label="+cu128torch2.8")
    meta = assert_consistent(out)["meta"]
    reqs = field_values(meta, "Requires-Dist")
    names = [r.split(";")[0].split(">")[0].split("=")[0].split("[")[0].strip().lower() for r in reqs]
    assert not {"torch", "torchvision", "torchaudio"} & set(names)
    assert "numpy>=1.0" in reqs and any(r.startswith("scipy") and 'extra == "x"' in r for r in reqs)
    assert any(r.lower().startswith("torch_vision") or r.lower().startswith("torch-vision") for r in reqs)
    assert sorted(field_values(meta, "Provides-Extra")) == ["x", "y"]
    # the description body survives untouched
    original, _ = read_wheel_metadata(built)
    assert meta.split("\n\n", 1)[1:] == original.split("\n\n", 1)[1:]


def test_recipe_requires_dist_replaces_requirements_and_extras(built, tmp_path):
    reqs = substitute_requires(
        ["numpy", "cumesh=={VER:cumesh}+{LOCAL}", "flex_gemm=={VER:flex_gemm}+{LOCAL:flex_gemm}",
         "rich; extra == 'pretty'"],
        "cu128torch2.8", versions={"cumesh": "0.0.1", "flex_gemm": "1.0"}, labels={"flex_gemm": "cu128"},
    )
    assert reqs == ["numpy", "cumesh==0.0.1+cu128torch2.8", "flex_gemm==1.0+cu128", "rich; extra == 'pretty'"]
    out = label_wheel(built, tmp_path, local_label="cu128torch2.8", requires_dist=reqs)
    meta = assert_consistent(out)["meta"]
    assert field_values(meta, "Requires-Dist") == reqs
    assert field_values(meta, "Provides-Extra") == ["pretty"]
    out_empty = label_wheel(built, tmp_path / "empty", local_label="cu128torch2.8", requires_dist=[])
    meta = assert_consistent(out_empty)["meta"]
    assert field_values(meta, "Requires-Dist") == [] and field_values(meta, "Provides-Extra") == []


def test_recipe_requires_dist_may_not_name_torch(built, tmp_path):
    with pytest.raises(BadInput, match=r"requires_dist\[1\].*torch family"):
        label_wheel(built, tmp_path, local_label="cu128", requires_dist=["numpy", "torch>=2.0; extra == 'x'"],
                    where="recipes/demo.yml")
    assert not list(tmp_path.iterdir())


def test_placeholders_without_a_value_are_refused_in_one_line():
    with pytest.raises(BadInput, match="cumesh") as exc:
        substitute_requires(["cumesh=={VER:cumesh}"], "cu128", {}, {}, where="recipes/o_voxel.yml")
    assert "recipes/o_voxel.yml" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(BadInput, match="unknown placeholder"):
        substitute_requires(["x=={VERSION}"], "cu128", {}, {})


def test_build_number_on_a_rebuild_and_torch_free_label(built, tmp_path):
    out = label_wheel(built, tmp_path, local_label="cu128", build_number=3)
    assert out.name == "demo_pkg-1.2.0+cu128-3-cp311-cp311-linux_x86_64.whl"
    got = assert_consistent(out)
    assert got["build"] == (3, "") and got["version"] == "1.2.0+cu128"


def test_relabelling_replaces_an_existing_local_version(built, tmp_path):
    first = label_wheel(built, tmp_path / "a", local_label="cu126torch2.7", build_number=1)
    second = label_wheel(first, tmp_path / "b", local_label="cu128torch2.8")
    assert second.name == "demo_pkg-1.2.0+cu128torch2.8-cp311-cp311-linux_x86_64.whl"
    assert assert_consistent(second)["build"] == ()


def test_labelled_wheel_installs_and_reports_its_labelled_version(built, tmp_path):
    out = label_wheel(built, tmp_path / "out", local_label="cu128torch2.8", build_info={"cell": "c"})
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(target), str(out)], check=True)
    probe = (
        "import importlib.metadata as m, demo, json;"
        "d = m.distribution('demo-pkg');"
        "print(json.dumps([d.version, d.requires, demo.answer(), d.read_text('farm_build.json')]))"
    )
    res = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(target)},
                         capture_output=True, text=True, check=True)
    version, requires, answer, info = json.loads(res.stdout)
    assert version == "1.2.0+cu128torch2.8" and answer == 7
    assert not any(r.lower().startswith(("torch>", "torch ", "torchvision", "torchaudio")) for r in requires)
    assert json.loads(info) == {"cell": "c"}
