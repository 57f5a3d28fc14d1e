"""The second hostile-input round's edges (issue 33, items 4, 5, 6, 8), through the real CLI: every
value is checked where it enters (an option while the command line is parsed, a recipe key while the
recipe is read), so a bad one is one short line, exit 2, and nothing written or created; a read
command never creates a path; a line never echoes more than a short cut of the value, and never the
text of a file that is not a recipe."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
from farmcli import PROJECT, run_farm
from hostile import assert_one_line_refusal, assert_recipe_check_refuses, tree_state

DEMO = "farm_demo-cu130-torch2.13-py311"
SHA = "a" * 64
COMMIT = "b" * 40
GIT = "source: {git: {url: https://github.com/example/pkg.git, ref: v1.0.0}}\n"
HEADER = "name: pkg\n" + GIT + "links_torch: true\n"
LONG = "x" * 5000
HUGE = "y" * 120_000          # just under Linux's 128 kB limit for one argument

# ---------------------------------------------------------------- path options (items 4 and 6)

# (arguments, needle); {tmp} is the test's own folder, {file} a plain file in it, {long} a 5000-byte name
PATHS = [
    # an output file: not a folder, and its folder must exist (nothing is created on the way)
    (("recipes", "status", "--out", "{tmp}"), "--out: '{tmp}': is a directory; name a file in it"),
    (("recipes", "status", "--out", "{tmp}/no/such/status.md"), "its folder {tmp}/no/such does not exist"),
    (("serve", "--wheelhouse", "{tmp}", "--access-log", "{tmp}/no/access.log"), "its folder {tmp}/no does not exist"),
    (("ci", "row", "farm_demo-cu130-torch2.13", "--staging", "{tmp}/st", "--summary", "{tmp}/no/s.md"),
     "--summary: '{tmp}/no/s.md': its folder {tmp}/no does not exist"),
    # an input folder or file: a typo is not "nothing there"
    (("recipes", "status", "--records", "{tmp}/no-records", "--out", "{tmp}/s.md"),
     "--records: '{tmp}/no-records': no such folder"),
    (("recipes", "status", "--records", "{file}", "--out", "{tmp}/s.md"), "--records: '{file}': is a file, not a folder"),
    # a plan job before anything is built has no wheelhouse yet (missing = nothing built), but never a file
    (("ci", "outputs", "--group", "1", "--layout", "0", "--wheelhouse", "{file}"),
     "--wheelhouse: '{file}': is a file, not a folder"),
    (("ci", "github", "--out", "{tmp}/wf", "--wheelhouse", "{tmp}/no-house"), "--wheelhouse: '{tmp}/no-house': no such folder"),
    (("matrix", "derive", "--pcwm", "{tmp}/no.json", "--out-dir", "{tmp}/d"), "--pcwm: '{tmp}/no.json': no such file"),
    (("verify", "{file}", "--arch-list", "8.0", "--platform", "linux", "--torch-env", "{tmp}/no-env"),
     "--torch-env: '{tmp}/no-env': no such file or folder"),
    # a read-only use of a wheelhouse never makes one
    (("index", "pages", "--wheelhouse", "{tmp}/no-house"), "no such wheelhouse (nothing created)"),
    # a path the system cannot take is one line, not an OSError's traceback
    (("build", DEMO, "--out", "{tmp}/{long}"), "a path part of 5,000 bytes: at most 255"),
    (("recipes", "status", "--out", "{tmp}/{long}.md"), "a path part of 5,003 bytes: at most 255"),
    (("run", "--dry-run", "--build-dir", "{tmp}/{long}"), "a path part of 5,000 bytes"),
]


@pytest.fixture
def sandbox(tmp_path):
    (tmp_path / "a-file").write_text("not a folder\n")
    return tmp_path


def _status_doc() -> tuple[int, int]:
    st = (PROJECT / "docs" / "recipe-status.md").stat()
    return st.st_size, st.st_mtime_ns


def _refused(sandbox: Path, args, needle: str, max_len: int = 1000) -> str:
    fill = {"tmp": str(sandbox), "file": str(sandbox / "a-file"), "long": LONG}
    before, doc = tree_state(sandbox), _status_doc()
    res = run_farm(*(a.format(**fill) for a in args), env={"FARM_WHEELHOUSE": str(sandbox / "house")},
                   cwd=sandbox, timeout=120)
    line = assert_one_line_refusal(res, 2, needle.format(**fill), max_len=max_len)
    assert tree_state(sandbox) == before, "something was written or created"
    assert _status_doc() == doc, "docs/recipe-status.md was rewritten"
    return line


@pytest.mark.parametrize(("args", "needle"), PATHS, ids=lambda v: " ".join(v)[:60] if isinstance(v, tuple) else "")
def test_a_path_option_is_checked_before_anything_is_read_or_written(sandbox, args, needle):
    _refused(sandbox, args, needle)


# ---------------------------------------------------------------- numbers and tokens (item 5)

NUMBERS = [
    (("recipes", "rebuild", "farm_demo", "--tier", "flags", "--for", "-5"), "--for: '-5': expected minutes > 0 and at most 1440"),
    (("recipes", "rebuild", "farm_demo", "--tier", "flags", "--for", "nan"), "--for: 'nan': expected minutes > 0"),
    (("recipes", "rebuild", "farm_demo", "--tier", "flags", "--for", "1e309"), "--for: '1e309': expected minutes > 0"),
    (("recipes", "rebuild", "farm_demo", "--tier", "smoke", "--arch", "99.9"),
     "--arch: '99.9': not a token of farm_demo-cu130-torch2.13-py312's list"),
    (("recipes", "rebuild", "farm_demo", "--tier", "smoke", "--arch", ""), "--arch: '': not an arch token"),
    (("build", DEMO, "--smoke", "--arch", ""), "--arch: '': not an arch token"),
    (("build", DEMO, "--smoke", "--arch", "8.6\n"), "--arch: '8.6\\n': not an arch token"),
    (("build", DEMO, "--flags-only", "--for", "inf"), "--for: 'inf': expected minutes > 0"),
    (("run", "--dry-run", "--jobs", "-1"), "--jobs: '-1': must be a whole number of at least 1"),
    (("run", "--dry-run", "--arm-jobs", "0"), "--arm-jobs: '0': must be a whole number of at least 1"),
    (("run", "--dry-run", "--mem-budget", "nan"), "--mem-budget: 'nan': must be a positive number of GB"),
    (("coverage", "--driver", "-575"), "--driver: '-575': expected a driver branch like 575"),
    (("ci", "row", "farm_demo-cu130-torch2.13", "--staging", "{tmp}/st", "--budget-minutes", "nan"),
     "--budget-minutes: 'nan': expected minutes > 0 and at most 10080"),
    (("ci", "outputs", "--group", "-1", "--layout", "0"), "--group: '-1': expected a group number of at least 1"),
    (("matrix", "scrape", "--index-url", "http://127.0.0.1:9/", "--out", "{tmp}/p.json", "--timeout", "-1"),
     "--timeout: '-1': expected seconds > 0"),
]


@pytest.mark.parametrize(("args", "needle"), NUMBERS, ids=lambda v: " ".join(v)[:60] if isinstance(v, tuple) else "")
def test_a_bad_number_or_token_is_refused_up_front(sandbox, args, needle):
    """Refused before any build starts or the status table is rewritten (rebuild used to start a build per
    cell, each failing, and then regenerate docs/recipe-status.md; `--smoke --arch ''` built the lowest)."""
    _refused(sandbox, args, needle)


# ---------------------------------------------------------------- recipe values (items 4 and 5)

RECIPE_VALUES = [
    # an extra source's dest and subdir: a path the build can make, inside the tree
    ("extra_sources: [{url: https://x.org/c.bin, sha256: '" + SHA + "', dest: \"a\\0b\"}]\n",
     "extra_sources[0].dest: 'a\\x00b': holds a NUL byte"),
    ("extra_sources: [{url: https://x.org/c.bin, sha256: '" + SHA + "', dest: \"third_party/c\\n\"}]\n",
     "extra_sources[0].dest: 'third_party/c\\n': a control character ('\\n') in a path"),
    ("extra_sources: [{url: https://x.org/c.bin, sha256: '" + SHA + "', dest: " + LONG + "}]\n",
     "extra_sources[0].dest: 'xxxxxxxx"),
    ("extra_sources: [{git: https://x.org/c.git, commit: '" + COMMIT + "', dest: 'a/" + "d/" * 2100 + "'}]\n",
     "extra_sources[0].dest: 'a/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d... (4204 "
     "characters): a path of 4,202 bytes: at most 4,096"),
    ("subdir: \"py\\tsrc\"\n", "subdir: 'py\\tsrc': a control character ('\\t') in a path"),
    ("subdir: " + LONG + "\n", "subdir: '" + "x" * 79 + "... (5002 characters): a path part of 5,000 bytes: at most 255"),
    # a trailing newline: `$` took it, fullmatch does not
    ("system_packages: {apt: [\"libfoo-dev\\n\"]}\n", "system_packages.apt[0]: 'libfoo-dev\\n': expected one package name"),
    ("env: {\"CFLAGS\\n\": x}\n", "env.CFLAGS\\n: 'CFLAGS\\n': not an environment variable name"),
    ("min_torch: \"2.8\\n\"\n", "min_torch: '2.8\\n': expected a torch minor like '2.8'"),
    ("expected_fail: {cells: ['*'], reason: r, until: \"2025-06-30\\n\"}\n",
     "expected_fail.until: '2025-06-30\\n': expected a date like 2025-06-30"),
    ("combinations: [{cuda: '12.8', torch: \"2.8.0\\n\", pythons: ['3.12']}]\n",
     "combinations[0].torch: '2.8.0\\n': own combinations name an exact torch patch"),
    ("combinations: [{cuda: '12.8', torch: 2.8.0, pythons: [\"3.12\\n\"]}]\n",
     "combinations[0].pythons: '3.12\\n': expected a Python like '3.12'"),
    # NUL in a value that becomes an environment variable
    ("env: {CFLAGS: \"-O2\\0-g\"}\n", "env.CFLAGS: '-O2\\x00-g': holds a NUL byte"),
    # direct URLs carry no pin: never fetched as they are
    ("build_deps: ['pkg @ https://x.org/pkg-1.0-py3-none-any.whl']\n",
     "build_deps[0]: 'pkg @ https://x.org/pkg-1.0-py3-none-any.whl': a direct URL (name @ url) is not pinned"),
    ("build_deps: ['pkg @ file:///tmp/pkg-1.0-py3-none-any.whl']\n",
     "build_deps[0]: 'pkg @ file:///tmp/pkg-1.0-py3-none-any.whl': a direct URL (name @ url) is not pinned"),
    ("requires_dist: ['pkg @ https://x.org/pkg-1.0.tar.gz#sha256=" + SHA + "']\n",
     "requires_dist[0]: 'pkg @ https://x.org/pkg-1.0.tar.gz#sha256=aaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
]

SOURCE_VALUES = [
    ('name: pkg\nsource: {git: {url: https://x.org/p.git, ref: "' + COMMIT + '\\n"}}\nlinks_torch: true\n',
     "source.git.ref: '" + COMMIT + "\\n': looks like a branch name"),
    ('name: pkg\nsource: {git: {url: "https://x.org/p.git\\n", ref: v1.0.0}}\nlinks_torch: true\n',
     "source.git.url: 'https://x.org/p.git\\n': expected a URL"),
    ('name: pkg\nsource: {git: {url: https://x.org/p.git, ref: "v1.0.0\\n"}}\nlinks_torch: true\n',
     "source.git.ref: 'v1.0.0\\n': looks like a branch name"),
    ("name: pkg\nsource: {sdist: {pypi: pkg==1.0, sha256: \"" + SHA + "\\n\"}}\nlinks_torch: true\n",
     "source.sdist.sha256: '" + SHA + "\\n': expected 64 lowercase hex digits"),
    ('name: "pkg\\n"\n' + GIT + "links_torch: true\n", "name: 'pkg\\n': use lowercase letters"),
]


@pytest.mark.parametrize(("extra", "needle"), RECIPE_VALUES, ids=[n[:50] for _, n in RECIPE_VALUES])
def test_a_recipe_value_the_build_could_not_use_is_refused_where_it_is_read(tmp_path, extra, needle):
    assert_recipe_check_refuses(tmp_path, HEADER + extra, needle)


@pytest.mark.parametrize(("text", "needle"), SOURCE_VALUES, ids=[n[:50] for _, n in SOURCE_VALUES])
def test_a_trailing_newline_never_passes_a_source_check(tmp_path, text, needle):
    assert_recipe_check_refuses(tmp_path, text, needle)


VALIDATOR_MODULES = ("farm.recipes", "farm.arch", "farm.versions", "farm.platforms", "farm.runners.engine",
                     "farm.build.label", "farm.build.repair", "farm.build.verify", "farm.build.source",
                     "farm.policy", "farm.wheelhouse", "farm.commands")


def test_no_validator_pattern_is_anchored_with_a_dollar():
    """`$` also matches before a trailing newline: every module-level pattern of the modules that check
    values is used with fullmatch (or anchored with \\Z). Patterns that split lines of a tool's output
    live elsewhere (farm.progress, farm.build.compilelog, downloads, runners.images) and read one line at a time."""
    found = []
    for name in VALIDATOR_MODULES:
        mod = importlib.import_module(name)
        mods = [mod]
        if hasattr(mod, "__path__"):
            mods += [importlib.import_module(f"{name}.{m.name}") for m in pkgutil.iter_modules(mod.__path__)]
        for m in mods:
            for attr, value in vars(m).items():
                if isinstance(value, re.Pattern) and isinstance(value.pattern, str) and re.search(r"(?<!\\)\$\)?$", value.pattern):
                    found.append(f"{m.__name__}.{attr}: {value.pattern}")
    assert not found, found


# ---------------------------------------------------------------- what an error line shows (item 8)

SECRET = "root:x:0:0:SECRET-PASSWORD-HASH:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin\n"


@pytest.mark.parametrize("body", [SECRET, "network: {version: 2, SECRET-KEY: x}\n", "- SECRET\n- other\n"],
                         ids=["a passwd-like file", "a YAML mapping", "a YAML list"])
def test_a_recipe_linked_to_another_file_never_prints_that_file(tmp_path, body):
    system = tmp_path / "etc" / "passwd"
    system.parent.mkdir()
    system.write_text(body)
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "pkg.yml").symlink_to(system)
    before = tree_state(tmp_path)
    res = run_farm("recipes", "check", "--dir", str(folder), timeout=60)
    line = assert_one_line_refusal(res, 2, f"farm: {folder}/pkg.yml: not a recipe")
    assert "SECRET" not in res.stderr + res.stdout, line
    assert tree_state(tmp_path) == before


@pytest.mark.parametrize("args", [
    ("plan", "--format", HUGE), ("run", "--dry-run", "--jobs", HUGE), ("build", HUGE), ("plan", "--package", HUGE),
    ("recipes", "status", "--out", "{tmp}/" + HUGE), ("coverage", "--driver", HUGE), (HUGE,),
], ids=["a choice", "a number", "a cell id", "a package", "a path", "a driver", "an unknown command"])
def test_a_120_kB_argument_is_cut_short_in_the_line(sandbox, args):
    line = _refused(sandbox, args, "", max_len=400)
    assert "yyyyyyyyyy" in line and "y" * 100 not in line, line


def test_a_long_recipe_value_is_cut_short_too(tmp_path):
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "pkg.yml").write_text(HEADER + "wheel_abi: " + "z" * 10_000 + "\n")
    res = run_farm("recipes", "check", "--dir", str(folder), timeout=60)
    line = assert_one_line_refusal(res, 2, "wheel_abi: 'zzzz")
    assert "(10002 characters)" in line and "z" * 100 not in line, line
