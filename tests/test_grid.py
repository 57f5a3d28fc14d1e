"""Deriving the grid and phantoms from the PCWM (design.md §2.5-2.7), loading them back, and the matrix/ page."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from farmcli import PROJECT, copy_defaults, run_farm

from farm.errors import BadInput, FarmError
from farm.matrix.grid import (
    GRID_FILE,
    PCWM_FILE,
    PHANTOMS_FILE,
    Combo,
    Pcwm,
    derive,
    load_grid,
    load_pcwm,
    render_grid_yaml,
    render_phantoms_json,
    write_grid,
)
from farm.pages.matrix import render_matrix
from farm.platforms import PLATFORMS
from farm.policy import load_defaults

DEFAULTS = PROJECT / "defaults"


@pytest.fixture(scope="module")
def policy():
    return load_defaults().grid_policy


@pytest.fixture(scope="module")
def pcwm():
    return load_pcwm(DEFAULTS)


@pytest.fixture(scope="module")
def grid(pcwm, policy):
    return derive(pcwm, policy)


def test_grid_has_29_rows_and_the_committed_files_are_what_derive_gives(grid):
    assert len(grid.rows) == 29
    assert (DEFAULTS / GRID_FILE).read_text() == render_grid_yaml(grid)
    assert (DEFAULTS / PHANTOMS_FILE).read_text() == render_phantoms_json(grid)
    assert load_grid(DEFAULTS) == grid


def test_cu129_torch_2_9_pins_windows_to_2_9_0_and_its_windows_cells_are_real(grid, pcwm):
    row = grid.row("12.9", "2.9")
    assert row.pin("linux") == "2.9.1" and row.pin("linux_aarch64") == "2.9.1"
    assert row.pin("windows") == "2.9.0"
    assert row.pythons == ("3.10", "3.11", "3.12", "3.13", "3.14")
    for python in row.pythons:
        assert not grid.is_phantom("12.9", "2.9", python, "windows")
        assert grid.has_cell("12.9", "2.9", python, "windows")
        assert pcwm.has("12.9", row.pin("windows"), python, "windows")
    text = (DEFAULTS / GRID_FILE).read_text()
    assert re.search(r'cuda: "12.9", torch: "2.9", pytorch: "2.9.1", pytorch_windows: "2.9.0"', text)


def test_cu129_windows_after_2_9_is_phantom(grid):
    for torch in ("2.10", "2.11", "2.12", "2.13"):
        row = grid.row("12.9", torch)
        assert row.pin("windows") is None
        assert all(grid.is_phantom("12.9", torch, py, "windows") for py in row.pythons)
    assert ["cu129", "2.10", "312", "windows"] in json.loads((DEFAULTS / PHANTOMS_FILE).read_text())


def test_phantom_file_lists_42_cells_47_under_a_single_pin_minus_cu129_2_9_windows(grid, pcwm, policy):
    listed = json.loads((DEFAULTS / PHANTOMS_FILE).read_text())
    assert len(listed) == 42 == len(grid.phantoms)
    single_pin = {(r.cuda, r.torch, py, p) for r in grid.rows for py in r.pythons for p in PLATFORMS
                  if not pcwm.has(r.cuda, max(r.pins.values(), key=lambda v: tuple(map(int, v.split(".")))),
                                  py, p)}
    assert len(single_pin) == 47
    assert single_pin - grid.phantoms == {("12.9", "2.9", py, "windows") for py in grid.row("12.9", "2.9").pythons}


def test_cp39_never_reaches_a_row_and_every_row_has_an_x86_pin(grid):
    for row in grid.rows:
        assert "3.9" not in row.pythons
        assert row.pin("linux") or row.pin("windows")
        assert all(pin.startswith(row.torch + ".") for pin in row.pins.values())


def test_derive_twice_gives_identical_bytes(tmp_path):
    outs = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        result = run_farm("matrix", "derive", "--out-dir", str(out))
        assert result.returncode == 0, result.stderr
        assert "29 rows" in result.stdout and "42 phantom" in result.stdout
        outs.append(((out / GRID_FILE).read_bytes(), (out / PHANTOMS_FILE).read_bytes()))
    assert outs[0] == outs[1]
    assert outs[0] == ((DEFAULTS / GRID_FILE).read_bytes(), (DEFAULTS / PHANTOMS_FILE).read_bytes())


def test_a_line_missing_from_supported_cudas_is_skipped_with_a_warning_naming_it(tmp_path, pcwm):
    extra = [Combo("13.3", "2.14.0", "3.12", p) for p in PLATFORMS]
    source = tmp_path / PCWM_FILE
    source.write_text(Pcwm.of([*pcwm.combos, *extra]).to_json())
    result = run_farm("matrix", "derive", "--pcwm", str(source), "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "13.3" in result.stderr and "supported_cudas" in result.stderr
    assert "13.3" not in (tmp_path / GRID_FILE).read_text()
    assert (tmp_path / GRID_FILE).read_bytes() == (DEFAULTS / GRID_FILE).read_bytes()


def test_derive_refuses_to_write_zero_rows(tmp_path, pcwm, policy):
    grid = derive(pcwm, dataclasses.replace(policy, supported_cudas=("9.9",)))
    assert grid.rows == ()
    with pytest.raises(FarmError, match="zero grid rows"):
        write_grid(grid, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_prerelease_pythons_leave_the_rows_and_their_phantoms(pcwm, policy):
    grid = derive(pcwm, dataclasses.replace(policy, prerelease_pythons=("3.15",)))
    assert len(grid.rows) == 29
    assert all("3.15" not in r.pythons for r in grid.rows)
    # py3.15 Windows on the 2.13 rows of cu126, cu129, cu130 and cu132 are no longer cells at all
    assert grid.phantoms == {c for c in derive(pcwm, policy).phantoms if c[2] != "3.15"}
    assert len(grid.phantoms) == 42 - 4
    assert derive(pcwm, dataclasses.replace(policy, python_min="3.11")).row("12.4", "2.4").pythons == ("3.11", "3.12")


def test_a_minor_with_only_arm_wheels_makes_no_row(policy):
    pcwm = Pcwm.of([Combo("13.0", "2.13.0", "3.12", "linux"), Combo("13.0", "2.14.0", "3.12", "linux_aarch64")])
    grid = derive(pcwm, policy)
    assert [(r.cuda, r.torch) for r in grid.rows] == [("13.0", "2.13")]
    assert grid.is_phantom("13.0", "2.13", "3.12", "windows")


def test_recipe_combinations_look_up_exact_patches_in_the_pcwm(pcwm):
    assert pcwm.has("12.9", "2.9.0", "3.12", "windows")
    assert not pcwm.has("12.9", "2.9.1", "3.12", "windows")
    assert pcwm.newest("13.0", "2.13", "linux") == "2.13.0"
    assert pcwm.newest("12.9", "2.9", "windows") == "2.9.0"
    assert pcwm.newest("12.9", "2.10", "windows") is None


def test_a_hand_broken_grid_file_is_one_line_naming_file_key_and_value(tmp_path):
    folder = copy_defaults(tmp_path)
    path = folder / GRID_FILE
    path.write_text(path.read_text().replace('pytorch_windows: "2.9.0"', 'pytorch_windows: "2.8.0"', 1))
    with pytest.raises(BadInput) as err:
        load_grid(folder)
    message = str(err.value)
    assert GRID_FILE in message and "pytorch_windows" in message and "2.8.0" in message
    result = run_farm("matrix", "pages", "--out", str(tmp_path / "pages"), env={"FARM_DEFAULTS": str(folder)})
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "2.8.0" in result.stderr
    assert not (tmp_path / "pages").exists()


def test_a_phantom_naming_no_grid_cell_is_refused(tmp_path):
    folder = copy_defaults(tmp_path)
    cells = json.loads((folder / PHANTOMS_FILE).read_text()) + [["cu129", "2.9", "39", "windows"]]
    (folder / PHANTOMS_FILE).write_text(json.dumps(cells))
    with pytest.raises(BadInput, match=re.escape(PHANTOMS_FILE) + r".*\[42\].*names no cell"):
        load_grid(folder)


# ---------------------------------------------------------------- matrix/ page

def test_matrix_page_has_a_table_per_cuda_line_with_platform_marks_and_no_scripts(tmp_path):
    result = run_farm("matrix", "pages", "--out", str(tmp_path / "matrix"))
    assert result.returncode == 0, result.stderr
    html = (tmp_path / "matrix" / "index.html").read_text()
    assert html.count("<table>") == 6 and '<h2 id="cu129">' in html
    assert "<script" not in html.lower() and "http://" not in html and "src=" not in html
    cu129 = html.split('<h2 id="cu129">')[1].split("</table>")[0]
    header = re.search(r"<thead>.*</thead>", cu129).group(0)
    columns = re.findall(r"py(\d\.\d+)", header)
    assert columns == ["3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15"]
    rows = {re.match(r'<tr><th scope="row">([\d.]+)', r).group(1): r for r in re.findall(r"<tr><th scope=\"row\">.*</tr>", cu129)}
    cells = {t: re.findall(r"<td>(.*?)</td>", r) for t, r in rows.items()}
    py312 = columns.index("3.12")
    assert ">W<" in cells["2.9.0"][py312] and ">W<" not in cells["2.9.1"][py312]
    assert ">L<" in cells["2.9.1"][py312] and ">A<" in cells["2.9.1"][py312]
    assert "grid pin: windows" in rows["2.9.0"] and "grid pin: linux, linux_aarch64" in rows["2.9.1"]


def test_matrix_page_escapes_every_string():
    pcwm = Pcwm.of([Combo("13.0", "2.13.0", "3.12", "linux")], source='https://x/<script>alert("x")</script>')
    html = render_matrix(pcwm)
    assert "<script>" not in html and "&lt;script&gt;alert(&quot;x&quot;)" in html
