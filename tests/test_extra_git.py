"""`extra_sources` as a pinned git tree (issue 15): `{git, commit, dest, exclude?}` next to the
archive form, fetched through the main source's mirror and checkout.

Upstreams are real repositories made here (one reached through an https URL that a git
`insteadOf` maps to it, as this machine reaches GitHub); the recipe cases run the real
`farm recipes check`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hostile import assert_recipe_check_refuses
from test_source import commit, git, make_repo, prep, src
from test_source_exclude import drop_blob

from farm.build.buildkey import KeyMaker
from farm.errors import BadInput, SourceError
from farm.policy import load_defaults
from farm.recipes.reader import load_recipe

FAKE_URL = "https://example.invalid/vendor/eigen.git"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def vendor(tmp_path, monkeypatch):
    """A third-party repo with two commits (the pin is the older one), a tag on the newer one, and a
    big file whose blob upstream lacks; FAKE_URL reaches it through a global insteadOf."""
    repo = make_repo(tmp_path / "up" / "eigen", {"Eigen/Core": "// core 3.4.0\n", "README.md": "eigen\n"})
    old = commit(repo, {"doc/big.png": "B" * 6000, "doc/intro.md": "intro\n"}, "docs")
    new = commit(repo, {"Eigen/Core": "// core 3.4.90\n"}, "newer")
    drop_blob(repo, "doc/big.png")      # last: a later `git add -A` would write it again
    git(repo, "tag", "3.4.90")
    cfg = tmp_path / "gitconfig"
    cfg.write_text(f'[url "{repo}"]\n\tinsteadOf = {FAKE_URL}\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(cfg))
    return repo, old, new


@pytest.fixture
def main_repo(tmp_path):
    repo = make_repo(tmp_path / "up" / "pkg", {"setup.py": "print('pkg')\n"})
    return repo, git(repo, "rev-parse", "HEAD")


def extra(commit_sha, dest="thirdparty/eigen-3.4.0", exclude=None, url=FAKE_URL):
    item = {"git": url, "commit": commit_sha, "dest": dest}
    if exclude is not None:
        item["exclude"] = exclude
    return item


def test_a_git_extra_source_is_checked_out_at_its_commit_at_dest_and_recorded(vendor, main_repo, tmp_path):
    _, old, new = vendor
    repo, sha = main_repo
    res = prep(src(repo, sha), tmp_path / "work", extra_sources=[extra(old, exclude=["*.png"])])
    tree = tmp_path / "work" / "thirdparty" / "eigen-3.4.0"
    assert (tree / "Eigen" / "Core").read_text() == "// core 3.4.0\n"   # the pin, not the newer commit
    assert (tree / "doc" / "intro.md").is_file() and not (tree / "doc" / "big.png").exists()
    assert git(tree, "rev-parse", "HEAD") == old
    assert git(tree, "config", "remote.origin.url") == FAKE_URL       # the real upstream, not the cache
    assert (tmp_path / "work" / "setup.py").read_text() == "print('pkg')\n"
    assert res.extra_sources == (("thirdparty/eigen-3.4.0", FAKE_URL, old),)
    assert res.record()["extra_sources"] == [["thirdparty/eigen-3.4.0", FAKE_URL, old]]
    # One mirror per URL in the main source's cache: a second checkout at another commit reuses it.
    mirrors = sorted((Path(os.environ["FARM_CACHE"]) / "sources" / "git").glob("eigen*.git"))
    assert len(mirrors) == 1
    prep(src(repo, sha), tmp_path / "w2", extra_sources=[extra(new, dest="eigen", exclude=["doc/"])])
    assert (tmp_path / "w2" / "eigen" / "Eigen" / "Core").read_text() == "// core 3.4.90\n"
    assert sorted((Path(os.environ["FARM_CACHE"]) / "sources" / "git").glob("eigen*.git")) == mirrors


def test_a_blob_upstream_lacks_names_the_extra_sources_exclude_and_leaves_nothing(vendor, main_repo, tmp_path):
    _, old, _ = vendor
    repo, sha = main_repo
    with pytest.raises(SourceError) as err:
        prep(src(repo, sha), tmp_path / "work", extra_sources=[extra(old)], where="recipes/pkg.yml")
    line = str(err.value)
    assert "\n" not in line and "doc/big.png" in line and "extra_sources[0].exclude" in line, line
    assert "'/doc/'" in line, line
    assert not (tmp_path / "work").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".work.partial-")]


@pytest.mark.parametrize("item, key, problem", [
    (lambda old, tree: extra("0" * 40), "extra_sources[0].commit", "no such commit in " + FAKE_URL),
    (lambda old, tree: extra(old, dest="setup.py"), "extra_sources[0].dest", "already exists"),
    (lambda old, tree: extra(old, dest="vendor/eigen"), "extra_sources[0].dest", "leads outside the source tree"),
    (lambda old, tree: extra(old, dest="loop/eigen"), "extra_sources[0].dest", "(or a link loop)"),
], ids=["an unknown commit", "dest taken", "dest through a link out of the tree", "dest through a link loop"])
def test_the_source_step_refuses_what_upstream_and_the_fetched_tree_say_in_one_line(
        vendor, main_repo, tmp_path, item, key, problem):
    """What the recipe's text cannot tell (the loader's refusals are the BAD cases below): a commit
    upstream lacks, a dest the fetched tree already has, a dest a link in the fetched tree leads out
    of it or loops."""
    _, old, _ = vendor
    repo, _ = main_repo
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / "vendor").symlink_to(outside)
    (repo / "loop").symlink_to("loop")
    sha = commit(repo, {}, "a link out of the tree, a link to itself")
    with pytest.raises(BadInput) as err:
        prep(src(repo, sha), tmp_path / "work", extra_sources=[item(old, outside)], where="recipes/pkg.yml")
    assert err.value.key == key and problem in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert not (tmp_path / "work").exists() and not list(outside.iterdir())


HEADER = ("name: pkg\nlinks_torch: true\nsource:\n  git:\n    url: https://github.com/example/pkg.git\n"
          "    ref: v1.0.0\nextra_sources:\n")
SHA = "5a0156e40feae2b8ee0e8f5e7ae8a5a4e2b7a7e1"

# (case, the extra_sources entry as YAML, what the one line says after "<file>: ")
BAD = [
    ("a tag", f"- {{git: {FAKE_URL}, commit: 3.4.0, dest: eigen}}\n",
     "extra_sources[0].commit: '3.4.0': expected the full 40-hex commit SHA (no tag, no short SHA)"),
    ("a short sha", f"- {{git: {FAKE_URL}, commit: '{SHA[:10]}', dest: eigen}}\n",
     f"extra_sources[0].commit: '{SHA[:10]}': expected the full 40-hex commit SHA"),
    ("an uppercase sha", f"- {{git: {FAKE_URL}, commit: '{SHA.upper()}', dest: eigen}}\n",
     f"extra_sources[0].commit: '{SHA.upper()}': expected the full 40-hex"),
    ("no commit", f"- {{git: {FAKE_URL}, dest: eigen}}\n", "extra_sources[0].commit: missing required key"),
    ("no dest", f"- {{git: {FAKE_URL}, commit: '{SHA}'}}\n", "extra_sources[0].dest: missing required key"),
    ("dest with ..", f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: a/../../b}}\n",
     "extra_sources[0].dest: 'a/../../b': must be a relative path inside the source tree"),
    ("absolute dest", f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: /opt/eigen}}\n",
     "extra_sources[0].dest: '/opt/eigen': must be a relative path"),
    ("not a url", f"- {{git: eigen, commit: '{SHA}', dest: eigen}}\n", "extra_sources[0].git: 'eigen': expected a URL"),
    ("url and git", f"- {{git: {FAKE_URL}, url: {FAKE_URL}, commit: '{SHA}', dest: eigen}}\n",
     "extra_sources[0].url: " + repr(FAKE_URL) + ": give either url (an archive) or git"),
    ("a sha256 on a git tree", f"- {{git: {FAKE_URL}, commit: '{SHA}', sha256: '{'a' * 64}', dest: eigen}}\n",
     "extra_sources[0].sha256: unknown key"),
    ("a misspelt exclude", f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: eigen, excludes: [doc/]}}\n",
     "extra_sources[0].excludes: unknown key; did you mean 'exclude'?"),
    ("an empty exclude", f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: eigen, exclude: []}}\n",
     "extra_sources[0].exclude: []: expected a non-empty list"),
    ("a whole-tree exclude", f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: eigen, exclude: ['/*']}}\n",
     "extra_sources[0].exclude[0]: '/*': would exclude the whole tree"),
    ("a 1 MB commit", f"- {{git: {FAKE_URL}, commit: '{'f' * 1_000_000}', dest: eigen}}\n",
     "extra_sources[0].commit: 'ffff"),
    # what the source step used to refuse after loading: the loader's now
    ("exclude not a list", f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: eigen, exclude: doc/}}\n",
     "extra_sources[0].exclude: 'doc/': expected a non-empty list"),
    ("an exclude negation", f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: eigen, exclude: ['!doc']}}\n",
     "extra_sources[0].exclude[0]: '!doc': a '!' re-include"),
    ("a Windows drive dest", f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: 'C:\\eigen'}}\n",
     "extra_sources[0].dest: 'C:\\\\eigen': must be a relative path inside the source tree"),
    ("a backslash dest with ..", f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: 'a\\..\\..\\b'}}\n",
     "extra_sources[0].dest: 'a\\\\..\\\\..\\\\b': must be a relative path inside the source tree"),
    ("the tree itself as dest", f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: ./}}\n",
     "extra_sources[0].dest: './': names the source tree itself"),
]


@pytest.mark.parametrize("case, lines, needle", BAD, ids=[c[0] for c in BAD])
def test_a_bad_git_extra_source_in_a_recipe_is_one_line(tmp_path, case, lines, needle):
    assert_recipe_check_refuses(tmp_path, HEADER + lines, needle)


def test_a_git_extra_source_is_part_of_the_build_key_and_an_archive_keys_as_before(tmp_path):
    folder = tmp_path / "recipes"
    folder.mkdir()
    archive = f"- {{url: https://example.invalid/e.tar.gz, sha256: '{'a' * 64}', dest: eigen}}\n"
    bodies = {
        "archive": archive,
        "pinned": f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: eigen}}\n",
        "other": f"- {{git: {FAKE_URL}, commit: '{'b' * 40}', dest: eigen}}\n",
        "narrow": f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: eigen, exclude: [doc/]}}\n",
        "moved": f"- {{git: {FAKE_URL}, commit: '{SHA}', dest: third_party/eigen}}\n",
    }
    defaults = load_defaults()
    recipes = {}
    for name, body in bodies.items():
        path = folder / f"{name}.yml"
        path.write_text(HEADER.replace("name: pkg", f"name: {name}") + body)
        recipes[name] = load_recipe(path, defaults)
    assert recipes["archive"].build_relevant()["extra_sources"] == [
        {"url": "https://example.invalid/e.tar.gz", "sha256": "a" * 64, "dest": "eigen"}]
    assert recipes["narrow"].build_relevant()["extra_sources"] == [
        {"git": FAKE_URL, "commit": SHA, "dest": "eigen", "exclude": ["doc/"]}]
    keys = KeyMaker(defaults, recipes)
    digests = {n: keys.recipe_digest(n) for n in recipes}
    assert len(set(digests.values())) == len(bodies), digests


def test_the_farms_own_source_step_reads_a_git_extra_source_from_the_recipe(vendor, main_repo, tmp_path):
    """The step spec carries the recipe's typed extra sources to the steps: the git form goes through JSON."""
    from farm.build.spec import SourcePart, from_plain, source_part, to_plain
    from farm.build.steps import fetch_source

    _, old, _ = vendor
    repo, sha = main_repo
    folder = tmp_path / "recipes"
    folder.mkdir()
    path = folder / "pkg.yml"
    path.write_text(f"name: pkg\nlinks_torch: true\nsource:\n  git:\n    url: file://{repo}\n    ref: '{sha}'\n"
                    f"extra_sources:\n- {{git: {FAKE_URL}, commit: '{old}', dest: vendor/eigen, exclude: ['*.png']}}\n")
    recipe = load_recipe(path, load_defaults())
    part = from_plain(SourcePart, json.loads(json.dumps(to_plain(source_part(recipe)))), "spec.source")
    assert part == source_part(recipe)
    res = fetch_source(part, tmp_path / "work", where="recipes/pkg.yml", platform="linux", cuda="13.0")
    assert res.extra_sources == (("vendor/eigen", FAKE_URL, old),)
    assert subprocess.run(["git", "-C", str(tmp_path / "work" / "vendor" / "eigen"), "status", "--porcelain"],
                          capture_output=True, text=True, check=True).stdout == ""
