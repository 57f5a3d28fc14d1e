"""Malformed selections and misused paths through the real CLI (issue 16): every unknown package, CUDA
line, torch, Python, platform, GPU or sm of plan, run, ci, arch, coverage and find is one line naming
the option and the value (with the nearest known value when there is one), exit 2, and nothing written;
a path option that names a file for a folder, a folder for a file, or a folder that does not exist is
refused the same way. A KNOWN value that selects nothing is an answer, not a mistake: exit 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from farmcli import run_farm
from hostile import assert_one_line_refusal, tree_state

DEMO311 = "farm_demo-cu130-torch2.13-py311"
FIND = ("find", "--platform", "linux", "--python", "3.12")
EXPLAIN = ("arch", "explain", "--cuda", "12.8", "--torch", "2.9")
OUTPUTS = ("ci", "outputs", "--group", "1", "--layout", "0")

# (command and arguments, the text the one line must hold); {tmp} is the test's own folder
UNKNOWN_VALUES = [
    # farm plan
    (("plan", "--package", "farm_dmeo"), "'farm_dmeo': no recipe recipes/farm_dmeo.yml (did you mean 'farm_demo'?)"),
    (("plan", "--package", "nosuch"), "--package: 'nosuch': no recipe recipes/nosuch.yml"),
    (("plan", "--cuda", "13.O"), "--cuda: '13.O': unknown CUDA line (did you mean '13.0'?)"),
    (("plan", "--cuda", "99.9"), "--cuda: '99.9': unknown CUDA line"),
    (("plan", "--torch", "abc"), "--torch: 'abc': unknown torch minor (known: 2.4,"),
    (("plan", "--torch", "2.13.0"), "--torch: '2.13.0': unknown torch minor (did you mean '2.13'?)"),
    (("plan", "--python", "three"), "--python: 'three': unknown Python (known: 3.10,"),
    (("plan", "--python", "3.1"), "--python: '3.1': unknown Python (did you mean"),
    (("plan", "--platform", "linx"), "--platform: 'linx': unknown platform (did you mean 'linux'?)"),
    (("plan", "--package", "farm_demo", "--cuda", "13.0", "--python", "3.99"), "--python: '3.99'"),
    (("plan", "--format", "json", "--torch", "9.99"), "--torch: '9.99': unknown torch minor"),
    # farm run --dry-run
    (("run", "--dry-run", "--package", "farm_dmeo"), "(did you mean 'farm_demo'?)"),
    (("run", "--dry-run", "--cuda", "13.O"), "(did you mean '13.0'?)"),
    (("run", "--dry-run", "--torch", "abc"), "--torch: 'abc': unknown torch minor"),
    (("run", "--dry-run", "--python", "three"), "--python: 'three': unknown Python"),
    (("run", "--dry-run", "--platform", "window"), "(did you mean 'windows'?)"),
    (("run", "--package", "farm_dmeo"), "(did you mean 'farm_demo'?)"),   # refused before anything is built
    # farm ci github / outputs
    (("ci", "github", "--out", "{tmp}/wf", "--package", "nosuch"), "--package: 'nosuch': no recipe"),
    (("ci", "github", "--out", "{tmp}/wf", "--package", "farm_dmeo"), "(did you mean 'farm_demo'?)"),
    (("ci", "github", "--out", "{tmp}/wf", "--cuda", "13.O"), "(did you mean '13.0'?)"),
    (("ci", "github", "--out", "{tmp}/wf", "--torch", "abc"), "--torch: 'abc'"),
    (("ci", "github", "--out", "{tmp}/wf", "--python", "three"), "--python: 'three'"),
    (("ci", "github", "--out", "{tmp}/wf", "--platform", "linux_arm64"), "(did you mean 'linux_aarch64'?)"),
    ((*OUTPUTS, "--package", "farm_dmeo"), "(did you mean 'farm_demo'?)"),
    ((*OUTPUTS, "--cuda", "13.O"), "(did you mean '13.0'?)"),
    # farm arch explain
    (("arch", "explain", "--cuda", "12.8", "--torch", "9.99"), "--torch: '9.99': unknown torch minor"),
    (("arch", "explain", "--cuda", "13.O", "--torch", "2.9"), "(did you mean '13.0'?)"),
    ((*EXPLAIN, "--package", "farm_dmeo"), "(did you mean 'farm_demo'?)"),
    ((*EXPLAIN, "--platform", "linx"), "(did you mean 'linux'?)"),
    (("arch", "explain", "--cuda", "13.0", "--torch", "2.5"), "no such cell: the grid has no CUDA 13.0 build of torch 2.5"),
    # farm coverage
    (("coverage", "--package", "farm_dmeo"), "(did you mean 'farm_demo'?)"),
    (("coverage", "--cuda", "13.O"), "(did you mean '13.0'?)"),
    (("coverage", "--torch", "abc"), "--torch: 'abc': unknown torch minor"),
    (("coverage", "--platform", "linx"), "(did you mean 'linux'?)"),
    # farm find
    ((*FIND, "--sm", "99.9"), "--sm: '99.9': unknown compute capability in defaults/gpus.yml (known: 5.0,"),
    ((*FIND, "--sm", "8.99"), "--sm: '8.99': unknown compute capability in defaults/gpus.yml (did you mean"),
    ((*FIND, "--sm", "abc"), "--sm: 'abc': unknown compute capability"),
    ((*FIND, "--gpu", "RTX 40900"), "--gpu: 'RTX 40900': unknown GPU (see defaults/gpus.yml, or use --sm) (did you mean 'RTX 4090'?)"),
    (("find", "--platform", "linux", "--python", "three", "--sm", "8.9"), "--python: 'three': unknown Python"),
    (("find", "--platform", "linx", "--python", "3.12", "--sm", "8.9"), "(did you mean 'linux'?)"),
    ((*FIND, "--sm", "8.9", "--package", "farm_dmeo"), "(did you mean 'farm_demo'?)"),
    ((*FIND, "--sm", "8.9", "--torch", "abc"), "--torch: 'abc': not a version"),
    # farm images build: the CUDA line of a production image
    (("images", "build", "--dry-run", "--cuda", "13.O"), "--cuda: '13.O': unknown CUDA line (did you mean '13.0'?)"),
]

# path options: (arguments, needle); {file} is an existing file, {tmp} an existing folder
MISUSED_PATHS = [
    (("run", "--dry-run", "--wheelhouse", "{file}"), "--wheelhouse: '{file}': {file} is a file, not a folder"),
    (("run", "--dry-run", "--build-dir", "{file}/sub"), "--build-dir: '{file}/sub': {file} is a file, not a folder"),
    (("ci", "github", "--out", "{file}", "--package", "farm_demo"), "--out: '{file}': {file} is a file"),
    ((*OUTPUTS, "--wheelhouse", "{file}"), "--wheelhouse: '{file}': is a file, not a folder"),
    (("pam", "measure", "{file}", "--out", "{tmp}"), "--out: '{tmp}': is a directory; name a file in it"),
    (("pam", "measure", "{file}", "--out", "{tmp}/missing/pam.yml"), "its folder {tmp}/missing does not exist"),
    (("matrix", "scrape", "--index-url", "http://127.0.0.1:9/whl/", "--out", "{tmp}"), "--out: '{tmp}': is a directory"),
    (("matrix", "scrape", "--index-url", "http://127.0.0.1:9/whl/", "--out", "{tmp}/missing/pcwm.json"),
     "its folder {tmp}/missing does not exist"),
    (("matrix", "derive", "--out-dir", "{file}"), "--out-dir: '{file}': {file} is a file"),
    (("matrix", "pages", "--out", "{file}"), "--out: '{file}': {file} is a file"),
    (("build", DEMO311, "--out", "{file}"), "--out: '{file}': {file} is a file"),
    (("build", DEMO311, "--wheelhouse", "{file}/house"), "--wheelhouse: '{file}/house': {file} is a file"),
    (("verify", "{tmp}/x.whl", "--arch-list", "8.0", "--platform", "linux", "--report", "{tmp}"),
     "--report: '{tmp}': is a directory; name a file in it"),
    (("verify", "{tmp}/x.whl", "--arch-list", "8.0", "--platform", "linux", "--report", "{tmp}/no/r.json"),
     "--report: '{tmp}/no/r.json': its folder {tmp}/no does not exist"),
]


@pytest.fixture
def sandbox(tmp_path):
    """A folder to run in (so a stray write lands where the test sees it) and a plain file to misuse."""
    (tmp_path / "a-file").write_text("not a folder\n")
    return tmp_path


def _run(args, sandbox: Path):
    fill = {"tmp": str(sandbox), "file": str(sandbox / "a-file")}
    argv = [a.format(**fill) for a in args]
    env = {"FARM_WHEELHOUSE": str(sandbox / "house")}   # a read-only selection must not create it
    before = tree_state(sandbox)
    res = run_farm(*argv, env=env, cwd=sandbox, timeout=120)
    return res, before, fill


@pytest.mark.parametrize(("args", "needle"), UNKNOWN_VALUES, ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_an_unknown_selection_is_one_line_with_exit_2_and_nothing_written(sandbox, args, needle):
    res, before, fill = _run(args, sandbox)
    assert_one_line_refusal(res, 2, needle.format(**fill))
    assert res.stdout == ""
    assert tree_state(sandbox) == before


@pytest.mark.parametrize(("args", "needle"), MISUSED_PATHS, ids=lambda v: " ".join(v) if isinstance(v, tuple) else "")
def test_a_misused_path_is_one_line_with_exit_2_and_nothing_written(sandbox, args, needle):
    res, before, fill = _run(args, sandbox)
    assert_one_line_refusal(res, 2, needle.format(**fill))
    assert tree_state(sandbox) == before


@pytest.mark.parametrize(("args", "answer"), [
    (("plan", "--package", "farm_demo", "--cuda", "13.0", "--torch", "2.4"),
     "0 cells: package farm_demo has no cells for CUDA 13.0, torch 2.4"),
    (("run", "--dry-run", "--plain", "--package", "farm_demo", "--cuda", "12.4", "--torch", "2.13"),
     "0 cells: package farm_demo has no cells for CUDA 12.4, torch 2.13"),
    (("ci", "github", "--out", "{tmp}/wf", "--package", "farm_demo", "--cuda", "13.0", "--torch", "2.4"),
     "0 cells: package farm_demo has no cells for CUDA 13.0, torch 2.4; nothing written"),
    (("coverage", "--cuda", "13.0", "--torch", "2.5"), "0 channels: the farm has no channels for CUDA 13.0, torch 2.5"),
])
def test_a_known_value_with_no_cells_says_so_and_exits_0(sandbox, args, answer):
    res, before, _ = _run(args, sandbox)
    assert res.returncode == 0, res.stderr
    assert answer in res.stdout.splitlines()
    assert tree_state(sandbox) == before


def test_a_known_value_with_no_cells_keeps_json_on_stdout(sandbox):
    res, _, _ = _run(("plan", "--format", "json", "--package", "farm_demo", "--cuda", "13.0", "--torch", "2.4"),
                     sandbox)
    assert res.returncode == 0 and res.stdout.strip() == "[]"
    assert res.stderr.strip() == "0 cells: package farm_demo has no cells for CUDA 13.0, torch 2.4"


def _files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_ci_github_writes_only_inside_out(sandbox):
    res, _, _ = _run(("ci", "github", "--out", "{tmp}/gen/wf", "--package", "farm_demo", "--cuda", "13.0"), sandbox)
    assert res.returncode == 0, res.stderr
    assert _files_under(sandbox) == {"a-file", "gen/wf/farm-build.yml", "gen/wf/farm-matrix-refresh.yml",
                                     "gen/wf/actionlint.yaml"}


def test_ci_github_puts_the_actionlint_config_where_actionlint_reads_it(sandbox):
    """In a repository's .github/workflows/ a YAML file is a workflow: the config goes to .github/."""
    res, _, _ = _run(("ci", "github", "--out", "{tmp}/.github/workflows", "--package", "farm_demo", "--cuda", "13.0"),
                     sandbox)
    assert res.returncode == 0, res.stderr
    assert _files_under(sandbox) == {"a-file", ".github/workflows/farm-build.yml",
                                     ".github/workflows/farm-matrix-refresh.yml", ".github/actionlint.yaml"}


def test_a_read_only_selection_creates_no_wheelhouse(sandbox):
    """plan --missing and run --dry-run read the wheelhouse; one that does not exist stays absent."""
    for args in (("plan", "--missing", "--package", "farm_demo", "--cuda", "13.0", "--torch", "2.13"),
                 ("run", "--dry-run", "--plain", "--package", "farm_demo", "--cuda", "13.0", "--torch", "2.13",
                  "--wheelhouse", "{tmp}/other-house")):
        res, before, _ = _run(args, sandbox)
        assert res.returncode == 0, res.stderr
        assert tree_state(sandbox) == before
