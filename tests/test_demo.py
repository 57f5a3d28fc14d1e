"""The main job end to end: build farm_demo, publish it, serve the wheelhouse, pip-install from its channel."""

from __future__ import annotations

import json

import pytest
from farmcli import run_farm


@pytest.mark.slow
def test_farm_demo_builds_publishes_and_installs_from_the_channel(tmp_path):
    house = tmp_path / "wheelhouse"
    build = tmp_path / "build"   # the test leaves nothing in the checkout's build/
    res = run_farm("demo", "--runner", "host", "--wheelhouse", str(house), "--build-dir", str(build), timeout=3600)
    assert res.returncode == 0, res.stderr + res.stdout
    assert "installed farm_demo-0.1.0+cu130torch2.13.dist-info from http://127.0.0.1:" in res.stdout
    assert "SASS: sm_75 sm_80 sm_86 sm_90 sm_100 sm_120" in res.stdout
    assert "PTX:  compute_90 compute_120" in res.stdout
    # the tag it reached and the floor the gate held it to: this machine's builder cannot reach torch's
    # manylinux_2_28, so the Makefile's FARM_MANYLINUX_FLOOR raises it (design.md §7.8)
    assert "  tag:  manylinux_2_34_x86_64\n" in res.stdout, res.stdout
    assert "  floor: manylinux_2_34 (torch's manylinux_2_28 not reached: +6 minor, FARM_MANYLINUX_FLOOR)\n" \
        in res.stdout
    assert (build / "farm_demo-cu130-torch2.13-py311" / "build.json").is_file() and (build / "demo-access.log").is_file()
    manifest = [json.loads(line) for line in (house / "manifest.jsonl").read_text().splitlines()]
    assert [m["cell"] for m in manifest] == ["farm_demo-cu130-torch2.13-py311"]
    assert manifest[0]["build_key"] and manifest[0]["arch_list"]
    channel_page = (house / "cu130" / "torch2.13" / "farm-demo" / "index.html").read_text()
    assert "farm_demo-0.1.0%2Bcu130torch2.13-cp311-cp311-" in channel_page
    # a second demo finds the cell built (same build key) and only installs
    again = run_farm("demo", "--runner", "host", "--wheelhouse", str(house), "--build-dir", str(build), timeout=600)
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout
