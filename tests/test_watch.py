"""`farm matrix watch` (design.md §2.8) against changed copies of the replay served on loopback.

The committed grid is the baseline; watch never touches defaults/.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest
from farmcli import PROJECT, run_farm
from replay_server import REPLAY, copy_replay, refused_url, serve

DEFAULTS = PROJECT / "defaults"


def defaults_state() -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(DEFAULTS.iterdir()) if p.is_file()}


@pytest.fixture
def replay_copy(tmp_path) -> Path:
    return copy_replay(tmp_path / "replay")


def watch(folder: Path, fmt: str = "json"):
    """Serve `folder` (a replay tree) and run watch against it; JSON output is parsed."""
    before = defaults_state()
    with serve(folder) as base:
        result = run_farm("matrix", "watch", "--index-url", base + "whl/", "--format", fmt)
    assert defaults_state() == before, "watch must not touch defaults/"
    if fmt == "json" and result.returncode in (0, 3):
        return result, json.loads(result.stdout)
    return result, None


def edit(page: Path, fn) -> None:
    page.write_text("".join(fn(page.read_text().splitlines(keepends=True))))


def test_unchanged_replay_reports_nothing_and_exits_0():
    result, report = watch(REPLAY)
    assert result.returncode == 0, result.stderr
    assert report["news"] is False
    assert all(report[k] == [] for k in ("new_lines", "new_minors", "new_cells", "moved_pins", "vanished_cells"))
    text, _ = watch(REPLAY, "text")
    assert text.returncode == 0 and "nothing new upstream" in text.stdout


def test_an_extra_patch_2_13_1_moves_the_pins(replay_copy):
    def add_patch(lines):
        out = []
        for line in lines:
            out.append(line)
            if ">torch-2.13.0+cu130-" in line:
                out.append(line.replace("2.13.0%2Bcu130", "2.13.1%2Bcu130").replace("2.13.0+cu130", "2.13.1+cu130"))
        return out

    edit(replay_copy / "cu130" / "torch" / "index.html", add_patch)
    result, report = watch(replay_copy.parent)
    assert result.returncode == 3, result.stderr
    assert report["moved_pins"] == [{"cuda": "13.0", "torch": "2.13", "platform": p, "old": "2.13.0", "new": "2.13.1"}
                                    for p in ("linux", "windows", "linux_aarch64")]
    assert report["new_lines"] == report["new_minors"] == report["vanished_cells"] == report["new_cells"] == []
    text, _ = watch(replay_copy.parent, "text")
    assert text.returncode == 3 and "pin moved: cu130 torch 2.13 linux: 2.13.0 -> 2.13.1" in text.stdout


def test_an_extra_cuda_line_is_news_with_its_checklist(replay_copy):
    page = (replay_copy / "cu132" / "torch" / "index.html").read_text().replace("cu132", "cu133")
    (replay_copy / "cu133" / "torch").mkdir(parents=True)
    (replay_copy / "cu133" / "torch" / "index.html").write_text(page)
    root = replay_copy / "index.html"
    root.write_text(root.read_text().replace('<a href="nightly/">', '<a href="cu133/">cu133</a><br/>\n    <a href="nightly/">'))
    result, report = watch(replay_copy.parent)
    assert result.returncode == 3, result.stderr
    [line] = report["new_lines"]
    assert line["cuda"] == "13.3" and line["tag"] == "cu133"
    assert line["torches"] == ["2.12.0", "2.12.1", "2.13.0"]
    assert line["platforms"] == ["linux", "linux_aarch64", "windows"]
    checklist = "\n".join(t["task"] for t in line["checklist"])
    assert 'add "13.3" to supported_cudas' in checklist and "arch_policy row for 13.3" in checklist
    assert "arch_policy_aarch64 row for 13.3" in checklist and "toolkit row for 13.3" in checklist
    assert not any(t["done"] for t in line["checklist"] if "supported_cudas" in t["task"])
    if importlib.util.find_spec("farm.recipes.reader") is not None and report["recipes_checked"]:
        from farm.recipes.reader import load_recipes

        with_maps = sorted(name for name, r in load_recipes().items()
                           if r.arch.arch_list_by_cuda or r.arch.arch_list_by_cuda_aarch64)
        if with_maps:    # none of them can know a line that did not exist
            assert "*_by_cuda maps of:" in checklist
            assert all(f"{name} (arch_list_by_cuda" in checklist for name in with_maps)
        else:
            assert "no recipe has a *_by_cuda map lacking 13.3" in checklist
    else:
        assert "not checked" in checklist
    # the new line's minors are part of the line entry, not separate news
    assert report["new_minors"] == [] and report["moved_pins"] == [] and report["vanished_cells"] == []
    text, _ = watch(replay_copy.parent, "text")
    assert "new CUDA line 13.3 (cu133)" in text.stdout and "checklist:" in text.stdout


def test_a_removed_wheel_reports_the_vanished_cell(replay_copy):
    gone = ">torch-2.13.0+cu130-cp312-cp312-win_amd64.whl<"
    edit(replay_copy / "cu130" / "torch" / "index.html", lambda lines: [x for x in lines if gone not in x])
    result, report = watch(replay_copy.parent)
    assert result.returncode == 3, result.stderr
    assert report["vanished_cells"] == [{"cuda": "13.0", "torch": "2.13", "python": "3.12", "platform": "windows"}]
    assert report["moved_pins"] == [] and report["new_cells"] == []
    text, _ = watch(replay_copy.parent, "text")
    assert "vanished cell: cu130 torch 2.13 py3.12 windows" in text.stdout


def test_a_new_minor_and_a_new_windows_cell_are_news(replay_copy):
    def add(lines):
        out = []
        for line in lines:
            out.append(line)
            if ">torch-2.13.0+cu130-" in line:   # a new minor 2.14 on cu130
                out.append(line.replace("2.13.0%2Bcu130", "2.14.0%2Bcu130").replace("2.13.0+cu130", "2.14.0+cu130"))
            if ">torch-2.13.0+cu130-cp314-cp314-win_amd64" in line:   # py3.15 Windows for 2.13
                out.append(line.replace("cp314", "cp315"))
        return out

    edit(replay_copy / "cu130" / "torch" / "index.html", add)
    result, report = watch(replay_copy.parent)
    assert result.returncode == 3, result.stderr
    assert [(m["cuda"], m["torch"]) for m in report["new_minors"]] == [("13.0", "2.14")]
    assert report["new_cells"] == [{"cuda": "13.0", "torch": "2.13", "python": "3.15", "platform": "windows"}]


def test_unreadable_index_exits_4_naming_the_url():
    url = refused_url()
    result = run_farm("matrix", "watch", "--index-url", url)
    assert result.returncode == 4
    assert url in result.stderr


def test_a_new_line_with_only_a_release_candidate_is_a_warning_not_news(replay_copy):
    (replay_copy / "cu133" / "torch").mkdir(parents=True)
    (replay_copy / "cu133" / "torch" / "index.html").write_text(
        '<a href="/whl/cu133/torch-2.14.0rc1%2Bcu133-cp312-cp312-manylinux_2_28_x86_64.whl">'
        "torch-2.14.0rc1+cu133-cp312-cp312-manylinux_2_28_x86_64.whl</a>\n")
    root = replay_copy / "index.html"
    root.write_text(root.read_text().replace('<a href="xpu/">', '<a href="./cu133">cu133</a><br/>\n    <a href="xpu/">'))
    result, report = watch(replay_copy.parent)
    assert result.returncode == 0, result.stderr
    assert report["news"] is False and any("13.3" in w for w in report["warnings"])
