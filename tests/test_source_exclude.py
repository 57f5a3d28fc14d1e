"""`source.git.exclude` (issue 15): paths a build never reads are left out of the checkout, so an
upstream whose big blobs are really MISSING from its object store still gives a source tree.

The upstreams here are real repositories with loose blob objects deleted, fetched through the
farm's blobless mirror; the recipe cases run the real `farm recipes check`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hostile import assert_recipe_check_refuses
from test_source import as_url, commit, git, make_repo, prep, src

from farm.build.buildkey import KeyMaker
from farm.errors import SourceError
from farm.policy import load_defaults
from farm.recipes.reader import load_recipe


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_CACHE", str(tmp_path / "cache"))


def drop_blob(repo: Path, path: str) -> str:
    """Delete the loose object of `path`'s blob at HEAD, as the snapshots here lack big files."""
    oid = git(repo, "rev-parse", f"HEAD:{path}")
    (repo / ".git" / "objects" / oid[:2] / oid[2:]).unlink()
    assert subprocess.run(["git", "cat-file", "-e", oid], cwd=repo).returncode != 0
    return oid


@pytest.fixture
def holey(tmp_path):
    """An upstream whose assets/big.png and docs/pic.png blobs are gone (an older commit kept them)."""
    repo = make_repo(tmp_path / "up" / "holey", {"setup.py": "print('v1')\n", "src/keep.c": "int x;\n"})
    sha = commit(repo, {"assets/big.png": "P" * 5000, "assets/notes.txt": "n\n",
                        "docs/pic.png": "D" * 3000, "docs/index.md": "# doc\n"}, "assets")
    missing = [drop_blob(repo, "assets/big.png"), drop_blob(repo, "docs/pic.png")]
    return repo, sha, missing


def test_a_missing_blob_fails_the_checkout_naming_its_paths_and_exclude(holey, tmp_path):
    repo, sha, _ = holey
    with pytest.raises(SourceError) as err:
        prep(src(repo, sha), tmp_path / "work")
    line = str(err.value)
    assert "\n" not in line
    assert "2 file(s)" in line and "assets/big.png" in line and "docs/pic.png" in line, line
    assert "source.git.exclude" in line and "'/assets/'" in line, line
    assert "assets/notes.txt" not in line          # present upstream: not blamed
    assert not (tmp_path / "work").exists()        # nothing half-made
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".work.partial-")]


def test_excluded_paths_are_never_read_and_the_rest_is_checked_out(holey, tmp_path):
    repo, sha, missing = holey
    res = prep(src(repo, sha, exclude=["/assets/*.png", "*.png"]), tmp_path / "work")
    work = tmp_path / "work"
    assert (work / "setup.py").read_text() == "print('v1')\n"
    assert (work / "assets" / "notes.txt").read_text() == "n\n"   # only the pattern's files go
    assert (work / "docs" / "index.md").is_file()
    assert not (work / "assets" / "big.png").exists() and not (work / "docs" / "pic.png").exists()
    # A clean tree for build scripts that ask git (version from describe --dirty and the like).
    assert git(work, "status", "--porcelain") == ""
    assert git(work, "rev-parse", "HEAD") == sha
    assert res.exclude == ("/assets/*.png", "*.png")
    assert res.key_inputs()["exclude"] == ["/assets/*.png", "*.png"]
    assert res.record()["exclude"] == ["/assets/*.png", "*.png"]
    assert "without /assets/*.png, *.png" in res.description
    # The mirror holds what the checkout read and still lacks the blobs upstream lacks.
    mirror = next((Path(os.environ["FARM_CACHE"]) / "sources" / "git").glob("holey-*.git"))
    listed = subprocess.run(["git", "rev-list", "--objects", "--missing=print", sha], cwd=mirror,
                            capture_output=True, text=True, check=True).stdout.split()
    assert sorted(o[1:] for o in listed if o.startswith("?")) == sorted(missing)
    assert git(repo, "rev-parse", "HEAD:assets/notes.txt") in listed


def test_a_source_without_exclude_keys_as_before(holey, tmp_path):
    repo, sha, _ = holey
    res = prep(src(repo, sha, exclude=["assets/", "docs/"]), tmp_path / "a")
    assert not (tmp_path / "a" / "docs").exists()
    plain = prep({"git": {"url": as_url(repo), "ref": git(repo, "rev-parse", "HEAD~1")}}, tmp_path / "b")
    assert "exclude" not in plain.key_inputs() and res.key_inputs()["exclude"] == ["assets/", "docs/"]


def test_a_pattern_under_a_submodule_applies_inside_it(tmp_path):
    sub = make_repo(tmp_path / "up" / "cutlass", {"include/c.h": "#pragma once\n",
                                                   "media/images/perf.png": "I" * 4000})
    top = make_repo(tmp_path / "up" / "top", {"setup.py": "print('top')\n"})
    git(top, "submodule", "add", "-q", str(sub), "third_party/cutlass")
    git(top, "commit", "-q", "-m", "sub")
    sub_oid = drop_blob(sub, "media/images/perf.png")     # after `submodule add` cloned it whole
    sha = git(top, "rev-parse", "HEAD")
    with pytest.raises(SourceError) as err:
        prep(src(top, sha), tmp_path / "w1", submodules=True)
    assert "media/images/perf.png" in str(err.value) and "'third_party/cutlass/media/images/'" in str(err.value)
    res = prep(src(top, sha, exclude=["third_party/cutlass/media/"]), tmp_path / "w2", submodules=True)
    work = tmp_path / "w2"
    assert (work / "third_party" / "cutlass" / "include" / "c.h").is_file()
    assert not (work / "third_party" / "cutlass" / "media").exists()
    assert res.submodules[0][0] == "third_party/cutlass" and sub_oid not in res.submodules[0]


HEADER = "name: pkg\nlinks_torch: true\nsource:\n  git:\n    url: https://github.com/example/pkg.git\n" \
         "    ref: v1.0.0\n"


def header(name: str) -> str:
    return HEADER.replace("name: pkg", f"name: {name}")


# (case, the exclude lines as YAML, what the one line says after "<file>: ")
BAD = [
    ("a string, not a list", "    exclude: assets/\n", "source.git.exclude: 'assets/': expected a non-empty list"),
    ("an empty list", "    exclude: []\n", "source.git.exclude: []: expected a non-empty list"),
    ("a number", "    exclude: [4]\n", "source.git.exclude[0]: 4: write it as a quoted string"),
    ("a mapping", "    exclude: [{a: b}]\n", "source.git.exclude[0]: {'a': 'b'}: expected a string"),
    ("a blank pattern", "    exclude: ['  ']\n", "source.git.exclude[0]: '  ': must not be empty"),
    ("trailing blank", "    exclude: ['assets/ ']\n", "source.git.exclude[0]: 'assets/ ': leading or trailing"),
    ("a parent folder", "    exclude: [docs/../../etc]\n", "source.git.exclude[0]: 'docs/../../etc': '..'"),
    ("everything", "    exclude: ['/**']\n", "source.git.exclude[0]: '/**': would exclude the whole tree"),
    ("a negation", "    exclude: ['!setup.py']\n", "source.git.exclude[0]: '!setup.py': a '!' re-include"),
    ("a line break", "    exclude: [\"a\\nb\"]\n", "source.git.exclude[0]: 'a\\nb': a line break"),
    ("a 1 MB pattern", "    exclude: ['" + "../" * 350_000 + "']\n", "source.git.exclude[0]: '../../"),
    ("a misspelt key", "    excludes: [assets/]\n", "source.git.excludes: unknown key; did you mean 'exclude'?"),
    # what the source step used to refuse before fetching: the loader's now, before any fetch
    ("an empty pattern", "    exclude: ['']\n", "source.git.exclude[0]: '': must not be empty"),
    ("a leading parent folder", "    exclude: [../x]\n", "source.git.exclude[0]: '../x': '..' leads outside"),
    ("a bare star", "    exclude: ['*']\n", "source.git.exclude[0]: '*': would exclude the whole tree"),
    ("a negation of a folder", "    exclude: ['!keep']\n", "source.git.exclude[0]: '!keep': a '!' re-include"),
]


@pytest.mark.parametrize("case, lines, needle", BAD, ids=[c[0] for c in BAD])
def test_a_bad_exclude_in_a_recipe_is_one_line(tmp_path, case, lines, needle):
    assert_recipe_check_refuses(tmp_path, HEADER + lines, needle)


def test_exclude_is_part_of_the_recipe_and_its_build_key(tmp_path):
    # One recipe name in three folders: the name is keyed too, so only `exclude` may tell the digests apart.
    paths = {}
    for variant, extra in (("plain", ""), ("narrow", "    exclude: ['/assets/*.png']\n"),
                           ("wide", "    exclude: [assets/]\n")):
        folder = tmp_path / variant / "recipes"
        folder.mkdir(parents=True)
        paths[variant] = folder / "pkg.yml"
        paths[variant].write_text(header("pkg") + extra)
    defaults = load_defaults()
    recipes = {n: load_recipe(p, defaults) for n, p in paths.items()}
    assert recipes["plain"].source.exclude == () and recipes["narrow"].source.exclude == ("/assets/*.png",)
    assert recipes["wide"].source.plain() == {"git": {"url": "https://github.com/example/pkg.git", "ref": "v1.0.0",
                                                      "exclude": ["assets/"]}}
    assert "exclude" not in recipes["plain"].source.plain()["git"]
    digests = {n: KeyMaker(defaults, {"pkg": r}).recipe_digest("pkg") for n, r in recipes.items()}
    assert len(set(digests.values())) == 3, digests
