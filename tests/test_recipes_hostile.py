"""`farm recipes check --dir` against hostile recipe folders, through the real CLI: every problem is
one line on stderr naming the file, the key and the value; exit 2; never a traceback; one bad file
never hides another; nothing is written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from farmcli import copy_defaults, run_farm
from hostile import assert_one_line_refusal, tree_state

from farm.errors import BadInput
from farm.policy import load_defaults
from farm.recipes.reader import load_recipe

GIT = "source: {git: {url: https://github.com/example/pkg.git, ref: v1.0.0}}\n"
HEADER = "name: pkg\n" + GIT + "links_torch: true\n"

# A "billion laughs": nine levels of nine aliases, 9**9 strings once expanded.
BOMB = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10))


def recipe(extra: str = "", header: str = HEADER) -> bytes:
    return (header + extra).encode()


def folder_with(tmp_path: Path, files: dict) -> Path:
    """`files`: name -> bytes (a file), None (a folder), or ('link', target) (a symbolic link)."""
    folder = tmp_path / "recipes"
    folder.mkdir()
    for name, body in files.items():
        path = folder / name
        if body is None:
            path.mkdir()
        elif isinstance(body, tuple):
            path.symlink_to(body[1])
        else:
            path.write_bytes(body)
    return folder


# (case id, files, what the one line must contain after "farm: <folder>/"). The line must also say
# the key and the value where the case has them: both are in the needle.
CASES = [
    # -- the text and the YAML itself
    ("not UTF-8", {"pkg.yml": recipe("env: {A: caf\xe9}\n").replace(b"caf\xc3\xa9", b"caf\xe9")},
     "pkg.yml: not UTF-8 text (byte 0xe9 at offset"),
    ("UTF-16 with its BOM", {"pkg.yml": b"\xff\xfe" + HEADER.encode("utf-16-le")},
     "pkg.yml: not UTF-8 text (byte 0xff at offset 0)"),
    ("a list as a mapping key", {"pkg.yml": recipe("env:\n  ? [A, B]\n  : x\n")},
     "pkg.yml:5:5: env: a key written as a list: keys must be plain strings"),
    ("a mapping as a mapping key", {"pkg.yml": recipe("? {a: 1}\n: x\n")},
     "pkg.yml:4:3: a key written as a mapping: keys must be plain strings"),
    ("a date that does not exist", {"pkg.yml": recipe("expected_fail: {cells: ['*'], reason: r, until: 2024-13-45}\n")},
     "pkg.yml:4:49: expected_fail.until: '2024-13-45': not a real date (month must be in 1..12)"),
    ("a date key that does not exist", {"pkg.yml": recipe("2024-02-30: x\n")},
     "pkg.yml:4:1: 2024-02-30: '2024-02-30': not a real date (day is out of range for month)"),
    ("an alias bomb", {"pkg.yml": recipe("env: {A: x}\nextra:\n" + "".join("  " + line + "\n" for line in BOMB.splitlines()))},
     "pkg.yml:11:7: extra.a5: aliases expand this to more than 1,001,"),
    ("an alias that contains itself", {"pkg.yml": recipe("build_deps: &loop [numpy, *loop]\n")},
     "pkg.yml:4:13: build_deps[1]: an alias refers to a node that contains it"),
    ("lists nested 990 deep", {"pkg.yml": recipe("build_deps: " + "[" * 990 + "]" * 990 + "\n")},
     "pkg.yml:4:76: build_deps[0][0][0]"),
    ("mappings nested 300 deep", {"pkg.yml": recipe("env:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(300)))},
     "pkg.yml:68:129: env.k0.k1.k2"),
    ("a key written twice", {"pkg.yml": recipe("max_jobs: 2\nmax_jobs: 4\n")},
     "pkg.yml:5:1: max_jobs: written twice in one mapping"),
    ("a number of 5000 digits", {"pkg.yml": recipe("max_jobs: " + "9" * 5000 + "\n")},
     "pkg.yml:4:11: max_jobs: '99999"),
    ("an !!int tag on a word", {"pkg.yml": recipe("max_jobs: !!int abc\n")},
     "pkg.yml:4:11: max_jobs: 'abc': not a valid !!int value"),
    ("an !!float tag on a word", {"pkg.yml": recipe("peak_gb_per_job: !!float abc\n")},
     "pkg.yml:4:18: peak_gb_per_job: 'abc': not a valid !!float value"),
    ("a !!timestamp tag on a word", {"pkg.yml": recipe("expected_fail: {cells: ['*'], reason: r, until: !!timestamp hello}\n")},
     "pkg.yml:4:49: expected_fail.until: 'hello': not a valid !!timestamp value"),
    ("a YAML syntax error", {"pkg.yml": recipe("env: {A: [unclosed}\n")},
     "pkg.yml:4:19: YAML syntax error: "),
    ("a control character", {"pkg.yml": recipe("pre_build: 'a\x07b'\n")},
     "pkg.yml: YAML syntax error: unacceptable character #x0007: control characters are not allowed"),
    ("an empty file", {"pkg.yml": b""},
     "pkg.yml: empty recipe (needs at least name, source and links_torch)"),
    ("a list, not a mapping", {"pkg.yml": b"- name: pkg\n"},
     "pkg.yml: not a recipe: a recipe is a YAML mapping, this file holds a list"),
    # -- numbers, with the bound in the message
    ("max_jobs 10**30", {"pkg.yml": recipe(f"max_jobs: {10 ** 30}\n")},
     f"pkg.yml: max_jobs: {10 ** 30}: must be at least 1 and at most 256"),
    ("max_jobs negative", {"pkg.yml": recipe("max_jobs: -3\n")},
     "pkg.yml: max_jobs: -3: must be at least 1 and at most 256"),
    ("max_jobs fractional", {"pkg.yml": recipe("max_jobs: 2.5\n")},
     "pkg.yml: max_jobs: 2.5: expected a whole number, got a number"),
    ("max_jobs a boolean", {"pkg.yml": recipe("max_jobs: true\n")},
     "pkg.yml: max_jobs: True: expected a whole number, got a boolean"),
    ("nvcc_threads 1000", {"pkg.yml": recipe("nvcc_threads: 1000\n")},
     "pkg.yml: nvcc_threads: 1000: must be at least 1 and at most 64"),
    ("timeout zero minutes", {"pkg.yml": recipe("timeout: 0\n")},
     "pkg.yml: timeout: 0: must be at least 1 and at most 7,200"),
    ("timeout of a year", {"pkg.yml": recipe("timeout: 525600\n")},
     "pkg.yml: timeout: 525600: must be at least 1 and at most 7,200"),
    ("peak_gb_per_job infinite", {"pkg.yml": recipe("peak_gb_per_job: .inf\n")},
     "pkg.yml: peak_gb_per_job: inf: expected a positive number of GB up to 1024"),
    ("peak_gb_per_job NaN", {"pkg.yml": recipe("peak_gb_per_job: .nan\n")},
     "pkg.yml: peak_gb_per_job: nan: expected a positive number of GB up to 1024"),
    ("peak_gb_per_job zero", {"pkg.yml": recipe("peak_gb_per_job: 0\n")},
     "pkg.yml: peak_gb_per_job: 0: expected a positive number of GB up to 1024"),
    # -- arch lists
    ("a token written twice", {"pkg.yml": recipe("arch_list: 8.0 8.0+PTX\n")},
     "pkg.yml: arch_list: '8.0 8.0+PTX': 8.0 and 8.0+PTX name the same arch: write it once"),
    ("a token twice in a by_cuda row", {"pkg.yml": recipe("arch_list_by_cuda: {'12.8': 8.6;9.0;8.6}\n")},
     "pkg.yml: arch_list_by_cuda[12.8]: '8.6;9.0;8.6': 8.6 and 8.6 name the same arch: write it once"),
    ("a token twice in an own combination",
     {"pkg.yml": recipe("combinations: [{cuda: '12.8', torch: '2.8.0', pythons: ['3.12'], arch_list: 9.0a 9.0a}]\n")},
     "pkg.yml: combinations[0].arch_list: '9.0a 9.0a': 9.0a and 9.0a name the same arch: write it once"),
    ("a token twice in allow_missing_archs",
     {"pkg.yml": recipe("verify: {allow_missing_archs: {windows: {archs: 12.0 12.0, reason: msvc}}}\n")},
     "pkg.yml: verify.allow_missing_archs.windows.archs: '12.0 12.0': 12.0 and 12.0 name the same arch"),
    ("a CUDA line written as a number", {"pkg.yml": recipe("arch_list_by_cuda: {12.8: '8.0'}\n")},
     "pkg.yml: arch_list_by_cuda[12.8]: 12.8: write CUDA lines as quoted strings, e.g. '12.8'"),
    # -- until
    ("until soon", {"pkg.yml": recipe("expected_fail: {cells: ['*'], reason: r, until: soon}\n")},
     "pkg.yml: expected_fail.until: 'soon': expected a date like 2025-06-30"),
    ("until a quoted day that does not exist", {"pkg.yml": recipe("expected_fail: {cells: ['*'], reason: r, until: '2025-02-30'}\n")},
     "pkg.yml: expected_fail.until: '2025-02-30': not a real date (day is out of range for month)"),
    ("until a time", {"pkg.yml": recipe("expected_fail: {cells: ['*'], reason: r, until: 2025-06-30 12:00:00}\n")},
     "pkg.yml: expected_fail.until: datetime.datetime(2025, 6, 30, 12, 0): expected a day like 2025-06-30, not a time"),
    ("until a number", {"pkg.yml": recipe("expected_fail: {cells: ['*'], reason: r, until: 20250630}\n")},
     "pkg.yml: expected_fail.until: 20250630: write it as a quoted string, e.g. '20250630'"),
    # -- sources
    ("a path source that does not exist", {"pkg.yml": b"name: pkg\nsource: {path: ../nowhere}\nlinks_torch: true\n"},
     "pkg.yml: source.path: '../nowhere': no such folder ("),
    ("a path source that is a file", {"pkg.yml": b"name: pkg\nsource: {path: pkg.yml}\nlinks_torch: true\n"},
     "pkg.yml: source.path: 'pkg.yml': not a folder ("),
    ("a ref that is a 4000-digit number",
     {"pkg.yml": ("name: pkg\nsource: {git: {url: https://x.org/p.git, ref: " + "7" * 4000 + "}}\nlinks_torch: true\n").encode()},
     "pkg.yml:2:47: source.git.ref: '77777"),
    ("a path source of 1 MB", {"pkg.yml": ('name: pkg\nsource: {path: "' + "x" * 1_000_000 + '"}\nlinks_torch: true\n').encode()},
     "pkg.yml: source.path: 'xxxxxxxx"),
    ("a path source under an unknown user's home", {"pkg.yml": b"name: pkg\nsource: {path: '~nosuchuser/src'}\nlinks_torch: true\n"},
     "pkg.yml: source.path: '~nosuchuser/src': not a usable path (Could not determine home directory.)"),
    ("a path source with a NUL", {"pkg.yml": b'name: pkg\nsource: {path: "a\\0b"}\nlinks_torch: true\n'},
     "pkg.yml: source.path: 'a\\x00b': holds a NUL byte, which no file, argument or environment variable can"),
    ("a patch file name of 100 kB", {"pkg.yml": recipe("patches: ['" + "p" * 100_000 + ".patch']\n")},
     "pkg.yml: patches[0].file: 'pppppppp"),
    # what the source step re-checked before it took the loader's typed values (design.md §6.1): the loader's alone
    ("an unknown source kind", {"pkg.yml": b"name: pkg\nsource: {hg: {url: https://x.org/p}}\nlinks_torch: true\n"},
     "pkg.yml: source.hg: unknown key; known keys: git, sdist, path"),
    ("an sdist sha256 of 63 digits", {"pkg.yml": f"name: pkg\nsource: {{sdist: {{pypi: pkg==1.0, sha256: '{'a' * 63}'}}}}\n"
                                                 "links_torch: true\n".encode()},
     f"pkg.yml: source.sdist.sha256: '{'a' * 63}': expected 64 lowercase hex digits"),
    ("an sdist with both url and pypi",
     {"pkg.yml": f"name: pkg\nsource: {{sdist: {{url: https://x.org/p.tar.gz, pypi: p==1.0, sha256: '{'a' * 64}'}}}}\n"
                 "links_torch: true\n".encode()},
     "pkg.yml: source.sdist: needs exactly one of url or pypi (name==version)"),
    ("an sdist pin with extras", {"pkg.yml": f"name: pkg\nsource: {{sdist: {{pypi: 'pkg[cuda]==1.0', sha256: '{'a' * 64}'}}}}\n"
                                             "links_torch: true\n".encode()},
     "pkg.yml: source.sdist.pypi: 'pkg[cuda]==1.0': expected an exact pin like 'name==1.2.3' (no extras, no markers)"),
    ("an sdist pin with a marker",
     {"pkg.yml": f"name: pkg\nsource: {{sdist: {{pypi: 'pkg==1.0; os_name == \"nt\"', sha256: '{'a' * 64}'}}}}\n"
                 "links_torch: true\n".encode()},
     "pkg.yml: source.sdist.pypi: 'pkg==1.0; os_name == \"nt\"': expected an exact pin like 'name==1.2.3' (no extras"),
    ("a git source without a url", {"pkg.yml": recipe(header="name: pkg\nsource: {git: {ref: v1.0.0}}\nlinks_torch: true\n")},
     "pkg.yml: source.git.url: missing required key"),
    ("an archive extra source with a bad sha256",
     {"pkg.yml": recipe("extra_sources: [{url: https://x.org/c.tar.gz, sha256: 'cd', dest: third_party/c}]\n")},
     "pkg.yml: extra_sources[0].sha256: 'cd': expected 64 lowercase hex digits"),
    ("an archive extra source into the parent folder",
     {"pkg.yml": recipe(f"extra_sources: [{{url: https://x.org/w.bin, sha256: '{'a' * 64}', dest: ../out.bin}}]\n")},
     "pkg.yml: extra_sources[0].dest: '../out.bin': must be a relative path inside the source tree"),
    ("an archive extra source at a Windows absolute path",
     {"pkg.yml": recipe(f"extra_sources: [{{url: https://x.org/w.bin, sha256: '{'a' * 64}', dest: '\\\\srv\\w.bin'}}]\n")},
     "pkg.yml: extra_sources[0].dest: '\\\\\\\\srv\\\\w.bin': must be a relative path inside the source tree"),
    ("an extra source that is a string", {"pkg.yml": recipe("extra_sources: [https://x.org/c.tar.gz]\n")},
     "pkg.yml: extra_sources[0]: 'https://x.org/c.tar.gz': expected a mapping, got a string"),
    ("a patch outside its folder", {"pkg.yml": recipe("patches: [../../evil.patch]\n")},
     "pkg.yml: patches[0].file: '../../evil.patch': must be a file under recipes/patches/pkg/"),
    ("a patch when that is a list", {"pkg.yml": recipe("patches: [{file: a.patch, when: [linux]}]\n"),
                                     "patches": None, "patches/pkg": None, "patches/pkg/a.patch": b""},
     "pkg.yml: patches[0].when: ['linux']: expected a mapping, got a list"),
    # -- names
    ("a name ending in an underscore", {"pkg_.yml": recipe(header=HEADER.replace("name: pkg", "name: pkg_"))},
     "pkg_.yml: name: 'pkg_': use lowercase letters, digits and underscores, starting and ending with a letter or digit"),
    ("a name in capitals", {"Pkg.yml": recipe(header=HEADER.replace("name: pkg", "name: Pkg"))},
     "Pkg.yml: name: 'Pkg': use lowercase letters"),
    ("a 5 MB name", {"pkg.yml": recipe(header=HEADER.replace("name: pkg", "name: " + "x" * 5_000_000))},
     "pkg.yml: name: 'xxxxxxxxxx"),
    ("a name that is not the file's", {"pkg.yml": recipe(header=HEADER.replace("name: pkg", "name: other"))},
     "pkg.yml: name: 'other': must match the file name (pkg)"),
    ("two names that normalise alike",
     {"a_b.yml": recipe(header=HEADER.replace("name: pkg", "name: a_b")),
      "a__b.yml": recipe(header=HEADER.replace("name: pkg", "name: a__b"))},
     "a_b.yml: name: 'a_b': the same project as 'a__b' of "),
    # -- the folder
    ("a .yaml file", {"pkg.yml": recipe(), "other.yaml": recipe(header=HEADER.replace("name: pkg", "name: other"))},
     "other.yaml: recipes are read only from <name>.yml files: rename it to other.yml"),
    ("a .YML file", {"pkg.yml": recipe(), "other.YML": b"name: other\n"},
     "other.YML: recipes are read only from <name>.yml files: rename it to other.yml"),
    ("a folder named x.yml", {"pkg.yml": recipe(), "x.yml": None},
     "x.yml: a folder, not a file"),
    ("a dangling link named x.yml", {"pkg.yml": recipe(), "x.yml": ("link", "gone.yml")},
     "x.yml: file not found"),
    # -- long values are cut in the line
    ("a 1 MB unknown key", {"pkg.yml": recipe("? " + "k" * 1_000_000 + "\n: 1\n")},   # '?': past YAML's 1024
     "pkg.yml: kkkkkkkk"),
    ("a 1 MB placeholder", {"pkg.yml": recipe("requires_dist: ['x=={VER:" + "y" * 1_000_000 + "}']\n")},
     "pkg.yml: requires_dist[0]: 'x=={VER:yyyy"),
    ("an environment variable named by a number", {"pkg.yml": recipe("env: {1: x}\n")},
     "pkg.yml: env.1: 1: not an environment variable name"),
]


@pytest.mark.parametrize("case, files, needle", CASES, ids=[c[0] for c in CASES])
def test_hostile_recipe_folder_gets_one_line_per_problem(tmp_path, case, files, needle):
    folder = folder_with(tmp_path, files)
    before = tree_state(tmp_path)
    res = run_farm("recipes", "check", "--dir", str(folder), timeout=60)
    line = assert_one_line_refusal(res, 2, f"farm: {folder}/{needle}")
    assert "a farm bug" not in line
    if "nested" in case:                      # the key path is cut before the problem: look for it
        assert line.endswith(": nested more than 64 levels deep"), line
    if any(isinstance(body, bytes) and len(body) > 10_000 for body in files.values()):
        assert "characters)" in line          # a long value is shown cut, with its length
    assert "1 invalid" in res.stdout
    assert tree_state(tmp_path) == before, "recipes check wrote something"


def test_every_bad_file_is_reported_and_the_good_one_counts_as_valid(tmp_path):
    folder = folder_with(tmp_path, {
        "a.yml": recipe("max_jobs: 0\n", HEADER.replace("name: pkg", "name: a")),
        "b.yml": b"\xff\xfe",
        "c.yml": recipe(header=HEADER.replace("name: pkg", "name: c")),
        "d.yml": recipe("arch_list: 8.0 8.0\nnvcc_threads: 99\nwheel_abi: abi4\n", HEADER.replace("name: pkg", "name: d")),
    })
    res = run_farm("recipes", "check", "--dir", str(folder), timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.splitlines() == [
        f"farm: {folder}/a.yml: max_jobs: 0: must be at least 1 and at most 256",
        f"farm: {folder}/b.yml: not UTF-8 text (byte 0xff at offset 0): save it as UTF-8",
        f"farm: {folder}/d.yml: wheel_abi: 'abi4': expected one of cpython, abi3, py3-none, pure; did you mean 'abi3'?",
        f"farm: {folder}/d.yml: arch_list: '8.0 8.0': 8.0 and 8.0 name the same arch: write it once",
        f"farm: {folder}/d.yml: nvcc_threads: 99: must be at least 1 and at most 64",
    ]
    assert res.stdout.startswith(f"1 recipes valid, 3 invalid in {folder}/")


def test_commands_that_load_recipes_still_refuse_in_one_line(tmp_path):
    """farm plan reads the same files: the first problem, one line, exit 2 (check lists them all)."""
    folder = folder_with(tmp_path, {"pkg.yml": recipe("max_jobs: 0\nnvcc_threads: 99\n")})
    res = run_farm("plan", "--summary", env={"FARM_RECIPES": str(folder)}, timeout=120)
    assert_one_line_refusal(res, 2, f"{folder}/pkg.yml: max_jobs: 0: must be at least 1 and at most 256")
    (folder / "pkg.yml").write_bytes(recipe())
    (folder / "pkg.yaml").write_bytes(recipe())
    res = run_farm("plan", "--summary", env={"FARM_RECIPES": str(folder)}, timeout=120)
    assert_one_line_refusal(res, 2, f"{folder}/pkg.yaml: recipes are read only from <name>.yml files")


def test_a_missing_recipes_folder_is_one_line_not_zero_recipes(tmp_path):
    # --dir is --recipes' older name: both are checked while the command line is parsed.
    res = run_farm("recipes", "check", "--dir", str(tmp_path / "nope"), timeout=60)
    assert_one_line_refusal(res, 2, f"farm: command line: --recipes: '{tmp_path / 'nope'}': no such folder")
    assert res.stdout == ""
    (tmp_path / "file").write_text("x")
    res = run_farm("recipes", "check", "--recipes", str(tmp_path / "file"), timeout=60)
    assert_one_line_refusal(res, 2, f"farm: command line: --recipes: '{tmp_path / 'file'}': is a file, not a folder")
    # FARM_RECIPES, read where no option was given, is checked by the loader, in one line too.
    res = run_farm("recipes", "check", env={"FARM_RECIPES": str(tmp_path / "nope")}, timeout=60)
    assert_one_line_refusal(res, 2, f"farm: {tmp_path / 'nope'}: no such recipes folder")


def test_the_alias_bomb_is_refused_fast_without_expanding_it(tmp_path):
    path = tmp_path / "pkg.yml"
    path.write_text(HEADER + "verify:\n" + "".join("  " + line + "\n" for line in BOMB.splitlines()))
    defaults = load_defaults()
    start = time.perf_counter()
    with pytest.raises(BadInput, match=r"verify\.a5: aliases expand this to more than [\d,]+ nodes"):
        load_recipe(path, defaults)
    assert time.perf_counter() - start < 0.1
    start = time.perf_counter()
    res = run_farm("recipes", "check", "--dir", str(tmp_path), timeout=60)
    took = time.perf_counter() - start
    assert_one_line_refusal(res, 2, "aliases expand this to more than")
    assert took < 5, f"the CLI took {took:.1f} s"        # the 36 s MemoryError it was


def test_what_a_hostile_corpus_must_not_refuse(tmp_path):
    """A BOM, a real until date (plain or quoted), a path source that exists, the numbers at their bounds."""
    (tmp_path / "src").mkdir()
    folder = folder_with(tmp_path, {
        "a.yml": b"\xef\xbb\xbf" + recipe(header=HEADER.replace("name: pkg", "name: a")),
        "b.yml": recipe("expected_fail: {cells: ['*'], reason: r, until: 2025-06-30}\nmax_jobs: 256\n"
                        "nvcc_threads: 64\ntimeout: 7200\npeak_gb_per_job: 1024\n", HEADER.replace("name: pkg", "name: b")),
        "c.yml": recipe("expected_fail: {cells: ['*'], reason: r, until: '2025-06-30'}\n", HEADER.replace("name: pkg", "name: c")),
        "d.yml": b"name: d\nsource: {path: ../src}\nlinks_torch: true\n",
        ".#d.yml": ("link", "nobody@host.1234"),     # an editor's lock file is no recipe
    })
    res = run_farm("recipes", "check", "--dir", str(folder), timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"4 recipes valid, 0 invalid in {folder}/")
    defaults = load_defaults()
    assert load_recipe(folder / "b.yml", defaults).expected_fail.until == "2025-06-30"
    assert load_recipe(folder / "c.yml", defaults).expected_fail.until == "2025-06-30"


def test_policy_numbers_are_bounded_too(tmp_path):
    defaults = copy_defaults(tmp_path)
    policy = defaults / "python_cuda_torch_os_policy.yml"
    policy.write_text(policy.read_text().replace("max_jobs: 3 ", "max_jobs: 100000 ", 1))
    res = run_farm("recipes", "check", env={"FARM_DEFAULTS": str(defaults)}, timeout=60)
    assert_one_line_refusal(res, 2, f"{policy}: defaults.max_jobs: 100000: must be at least 1 and at most 256")
