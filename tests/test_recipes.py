"""Recipes: the schema's one-line errors, the 44 recipes against the facts, and the fallback hazards."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import MappingProxyType

import pytest
import yaml

from farm.archlist import ArchList
from farm.errors import BadInput
from farm.matrix.grid import load_grid
from farm.policy import load_defaults
from farm.recipes.checks import check_recipes, recipe_hazards
from farm.recipes.lines import built_lines
from farm.recipes.model import FULL_SHA
from farm.recipes.reader import TOP_KEYS, load_recipe, load_recipes
from farm.settings import PROJECT_ROOT

FACTS = PROJECT_ROOT.parent / "shared" / "facts" / "packages.yml"
RECIPES = PROJECT_ROOT / "recipes"
HEADER = """\
name: pkg
source: {git: {url: https://github.com/example/pkg.git, ref: v1.0.0}}
links_torch: true
"""


@pytest.fixture(scope="module")
def defaults():
    return load_defaults()


def write(folder: Path, text: str, name: str = "pkg") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yml"
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path: Path, defaults, names=None) -> str:
    with pytest.raises(BadInput) as caught:
        load_recipe(path, defaults, names)
    message = str(caught.value)
    assert "\n" not in message
    assert caught.value.exit_code == 2
    return message


# Each case: (what is wrong, recipe text, the one-line message after "<file>: ").
# `HEADER` is prepended unless the text starts with "name:".
MALFORMED = [
    ("allow_graft that is not a list", "allow_graft: libfoo.so*\n",
     "allow_graft: 'libfoo.so*': expected a list of strings, got a string"),
    ("unknown key with a near miss", "arch_lst: '8.0'\n",
     "arch_lst: unknown key; did you mean 'arch_list'?"),
    ("unknown key inside source.git",
     "name: pkg\nsource: {git: {url: https://github.com/e/p.git, reff: v1.0}}\nlinks_torch: true\n",
     "source.git.reff: unknown key; did you mean 'ref'?"),
    ("unknown verify knob", "verify: {import_name: [pkg]}\n",
     "verify.import_name: unknown key; did you mean 'import_names'?"),
    ("links_torch is not a boolean", "name: pkg\nsource: {path: src}\nlinks_torch: 'yes'\n",
     "links_torch: 'yes': expected true or false, got a string"),
    ("max_jobs is a word", "max_jobs: four\n",
     "max_jobs: 'four': expected a whole number, got a string"),
    ("max_jobs is zero", "max_jobs: 0\n",
     "max_jobs: 0: must be at least 1 and at most 256"),
    ("requires_dist is a string, not a list", "requires_dist: numpy\n",
     "requires_dist: 'numpy': expected a list of strings, got a string"),
    ("git ref main", "name: pkg\nsource: {git: {url: https://github.com/e/p.git, ref: main}}\nlinks_torch: true\n",
     "source.git.ref: 'main': a branch moves: pin a full 40-hex commit SHA or a release tag"),
    ("git ref master", "name: pkg\nsource: {git: {url: https://github.com/e/p.git, ref: master}}\nlinks_torch: true\n",
     "source.git.ref: 'master': a branch moves: pin a full 40-hex commit SHA or a release tag"),
    ("git ref HEAD", "name: pkg\nsource: {git: {url: https://github.com/e/p.git, ref: HEAD}}\nlinks_torch: true\n",
     "source.git.ref: 'HEAD': a branch moves: pin a full 40-hex commit SHA or a release tag"),
    ("git ref is a feature branch",
     "name: pkg\nsource: {git: {url: https://github.com/e/p.git, ref: feature/fast-kernels}}\nlinks_torch: true\n",
     "source.git.ref: 'feature/fast-kernels': looks like a branch name: pin a full 40-hex commit SHA or a "
     "release tag like v1.2.3"),
    ("git ref is a branch-like word",
     "name: pkg\nsource: {git: {url: https://github.com/e/p.git, ref: blackwell-support}}\nlinks_torch: true\n",
     "source.git.ref: 'blackwell-support': looks like a branch name: pin a full 40-hex commit SHA or a "
     "release tag like v1.2.3"),
    ("git ref is an abbreviated SHA",
     "name: pkg\nsource: {git: {url: https://github.com/e/p.git, ref: 446e936}}\nlinks_torch: true\n",
     "source.git.ref: '446e936': abbreviated commit: write the full 40-hex SHA"),
    ("git ref written as a YAML number",
     "name: pkg\nsource: {git: {url: https://github.com/e/p.git, ref: 0.6}}\nlinks_torch: true\n",
     "source.git.ref: 0.6: write the ref as a quoted string, e.g. '0.6' (YAML reads it as a number)"),
    ("git ref that YAML reads as a date",
     "name: pkg\nsource: {git: {url: https://github.com/e/p.git, ref: 2024-05-01}}\nlinks_torch: true\n",
     "source.git.ref: datetime.date(2024, 5, 1): write the ref as a quoted string, e.g. '2024-05-01' (YAML reads "
     "it as a date)"),
    ("tag commit is not a full SHA",
     "name: pkg\nsource: {git: {url: https://github.com/e/p.git, ref: v1.0, commit: abc123}}\nlinks_torch: true\n",
     "source.git.commit: 'abc123': expected the full 40-hex commit SHA"),
    ("sdist without sha256",
     "name: pkg\nsource: {sdist: {pypi: pkg==1.0}}\nlinks_torch: true\n",
     "source.sdist.sha256: missing: an sdist source must carry its sha256"),
    ("sdist pinned loosely",
     f"name: pkg\nsource: {{sdist: {{pypi: pkg>=1.0, sha256: {'a' * 64}}}}}\nlinks_torch: true\n",
     "source.sdist.pypi: 'pkg>=1.0': expected an exact pin like 'name==1.2.3'"),
    ("source names two kinds",
     "name: pkg\nsource: {git: {url: https://github.com/e/p.git, ref: v1.0}, path: src}\nlinks_torch: true\n",
     "source: needs exactly one of git, sdist, path (found: git, path)"),
    ("source names no kind", "name: pkg\nsource: {}\nlinks_torch: true\n",
     "source: needs exactly one of git, sdist, path (found: none)"),
    ("torch in requires_dist", "requires_dist: [numpy, torch>=2.0]\n",
     "requires_dist[1]: 'torch>=2.0': the torch family (torch, torchvision, torchaudio) is never listed: "
     "the cell's channel decides which torch a wheel goes with"),
    ("torchvision with a marker", "requires_dist: [\"torchvision; sys_platform == 'linux'\"]\n",
     "requires_dist[0]: \"torchvision; sys_platform == 'linux'\": the torch family (torch, torchvision, "
     "torchaudio) is never listed: the cell's channel decides which torch a wheel goes with"),
    ("torchaudio with extras and odd case", "requires_dist: ['TorchAudio[sox]==2.1']\n",
     "requires_dist[0]: 'TorchAudio[sox]==2.1': the torch family (torch, torchvision, torchaudio) is never "
     "listed: the cell's channel decides which torch a wheel goes with"),
    ("unknown placeholder", "requires_dist: ['dep=={VERSION}']\n",
     "requires_dist[0]: 'dep=={VERSION}': unknown placeholder {VERSION} (known: {LOCAL}, {LOCAL:<recipe>}, "
     "{VER:<recipe>})"),
    ("not a requirement", "requires_dist: ['numpy >>= 1']\n",
     None),  # packaging's wording varies by version: checked by prefix below
    ("arch token nvcc does not know", "arch_list: sm_80\n",
     "arch_list: 'sm_80': not an arch token (expected X.Y, X.Y+PTX, X.Ya or X.Yf)"),
    ("package-wide 7.0 on a recipe that builds CUDA 13", "arch_list: 7.0 8.0\n",
     "arch_list: '7.0': CUDA 13.0's nvcc cannot emit sm 7.0 (it emits: 7.5 8.0 8.6 8.7 8.8 8.9 9.0 10.0 "
     "10.3 11.0 12.0 12.1)"),
    ("sm_110 on a 12.8 line", "arch_list_by_cuda: {'12.8': 8.0 11.0}\n",
     "arch_list_by_cuda[12.8]: '11.0': CUDA 12.8's nvcc cannot emit sm 11.0 (it emits: 5.0 5.2 5.3 6.0 6.1 "
     "6.2 7.0 7.2 7.5 8.0 8.6 8.7 8.9 9.0 10.0 10.1 12.0)"),
    ("ARM list below Turing on CUDA 13", "arch_list_by_cuda_aarch64: {'13.0': 5.0 8.0}\n",
     "arch_list_by_cuda_aarch64[13.0]: '5.0': CUDA 13.0's nvcc cannot emit sm 5.0 (it emits: 7.5 8.0 8.6 "
     "8.7 8.8 8.9 9.0 10.0 10.3 11.0 12.0 12.1)"),
    ("arch list written as a YAML number", "arch_list: 8.0\n",
     "arch_list: 8.0: an arch list must be a string like '8.0;9.0+PTX'"),
    ("by_cuda line written as a number", "arch_list_by_cuda: {12.8: '8.0'}\n",
     "arch_list_by_cuda[12.8]: 12.8: write CUDA lines as quoted strings, e.g. '12.8'"),
    ("by_cuda line the farm does not support", "arch_list_by_cuda: {'11.8': '8.0'}\n",
     "arch_list_by_cuda[11.8]: '11.8': not a supported CUDA line (12.4, 12.6, 12.8, 12.9, 13.0, 13.2)"),
    ("arch_fallback other than policy", "arch_fallback: true\n",
     "arch_fallback: True: the only value is 'policy'"),
    ("platform outside the three", "platforms: [linux, macos]\n",
     "platforms: 'macos': unknown platform (expected linux, windows, linux_aarch64)"),
    ("platform misspelled", "platforms: [linux_arm64]\n",
     "platforms: 'linux_arm64': unknown platform (expected linux, windows, linux_aarch64); did you mean "
     "'linux_aarch64'?"),
    ("min_torch with a patch", "min_torch: '2.8.1'\n",
     "min_torch: '2.8.1': expected a torch minor like '2.8' (major.minor)"),
    ("min_torch as a YAML number", "min_torch: 2.5\n",
     "min_torch: 2.5: write it as a quoted string, e.g. '2.5'"),
    ("max_torch below min_torch", "min_torch: '2.9'\nmax_torch: '2.8'\n",
     "max_torch: '2.8': is below min_torch 2.9"),
    ("wheel_abi misspelled", "wheel_abi: abi4\n",
     "wheel_abi: 'abi4': expected one of cpython, abi3, py3-none, pure; did you mean 'abi3'?"),
    ("wheel_abi with an underscore", "wheel_abi: py3_none\n",
     "wheel_abi: 'py3_none': expected one of cpython, abi3, py3-none, pure; did you mean 'py3-none'?"),
    ("pure wheel with an arch list", "wheel_abi: pure\narch_list: '8.0'\n",
     "arch_list: a pure wheel carries no binaries: arch lists do not apply"),
    ("name differs from the file", "name: other\nsource: {path: src}\nlinks_torch: true\n",
     "name: 'other': must match the file name (pkg)"),
    ("links_torch missing", "name: pkg\nsource: {path: src}\n",
     "links_torch: missing required key"),
    ("version as a YAML number", "version: 0.1\n",
     "version: 0.1: write it as a quoted string, e.g. '0.1'"),
    ("version with a local label", "version: 1.0+cu128\n",
     "version: '1.0+cu128': no local label: the farm adds +cuNNN[torchM.m] itself"),
    ("toolkit component misspelled", "cuda_components: [curnd]\n",
     "cuda_components: 'curnd': unknown toolkit component; did you mean 'curand'?"),
    ("own combination with a torch minor", "combinations: [{cuda: '12.8', torch: '2.8', pythons: ['3.12']}]\n",
     "combinations[0].torch: '2.8': own combinations name an exact torch patch, e.g. '2.8.0'"),
    ("own combination with a free-threaded Python",
     "combinations: [{cuda: '12.8', torch: '2.8.0', pythons: ['3.13t']}]\n",
     "combinations[0].pythons: '3.13t': free-threaded Pythons are never targets"),
    ("env with an unknown placeholder", "env: {NVCC_FLAGS: '--arch {ARCHS}'}\n",
     "env.NVCC_FLAGS: '--arch {ARCHS}': unknown placeholder {ARCHS} (known: {ARCHS_TORCH}, {ARCHS_CMAKE}, "
     "{CUDA}, {CUDA_HOME})"),
    ("patch file that does not exist", "patches: [{file: fix.patch}]\n",
     "patches[0].file: 'fix.patch': no such file {folder}/patches/pkg/fix.patch"),
    ("skip_arch without a reason", "verify: {skip_arch: true}\n",
     "verify.skip_arch: True: give the reason as a string (e.g. kernels compiled at run time by NVRTC)"),
]


@pytest.mark.parametrize("case, text, expected", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_recipe_is_one_line_naming_file_key_and_value(tmp_path, defaults, case, text, expected):
    body = text if text.startswith("name:") else HEADER + text
    path = write(tmp_path / "recipes", body)
    message = error_of(path, defaults)
    if expected is None:
        assert message.startswith(f"{path}: requires_dist[0]: 'numpy >>= 1': not a valid requirement: ")
    else:   # {folder}: the recipes folder the loader was given (the message names the real one)
        assert message == f"{path}: {expected.replace('{folder}', str(path.parent))}"


def test_a_patch_when_cuda_is_a_line_or_a_bound_and_the_loader_refuses_anything_else(tmp_path, defaults):
    """One reading of `when`: the loaded Patch.applies, which the source step asks."""
    folder = tmp_path / "recipes"
    (folder / "patches" / "pkg").mkdir(parents=True)
    (folder / "patches" / "pkg" / "fix.patch").write_text("")
    path = write(folder, HEADER + "patches: [{file: fix.patch, when: {cuda: ['12', '>=13.0']}}]\n")
    patch = load_recipe(path, defaults).patches[0]
    assert patch.applies("linux", "12.8") and patch.applies("windows", "13.2") and not patch.applies("linux", "11.8")
    path = write(folder, HEADER + "patches: [{file: fix.patch, when: {cuda: '=>12.8'}}]\n")
    assert error_of(path, defaults) == f"{path}: patches[0].when.cuda: '=>12.8': expected a CUDA line like 12.8 or >=12.8"


def test_unknown_key_far_from_every_key_lists_the_known_keys(tmp_path, defaults):
    path = write(tmp_path / "recipes", HEADER + "colour: red\n")
    assert error_of(path, defaults).startswith(f"{path}: colour: unknown key; known keys: name, source, version,")


def test_key_written_twice_is_refused_with_its_line(tmp_path, defaults):
    path = write(tmp_path / "recipes", HEADER + "max_jobs: 2\nmax_jobs: 4\n")
    assert error_of(path, defaults) == f"{path}:5:1: max_jobs: written twice in one mapping"


def test_ver_and_local_must_name_an_existing_recipe(tmp_path, defaults):
    path = write(tmp_path / "recipes", HEADER + "requires_dist: ['cumm=={VER:cumm}+{LOCAL:cumn}']\n")
    assert error_of(path, defaults, names=["pkg", "cumm"]) == (
        f"{path}: requires_dist[0]: 'cumm=={{VER:cumm}}+{{LOCAL:cumn}}': {{LOCAL:cumn}} names no recipe; "
        "did you mean 'cumm'?")
    # The same file is fine once the referenced recipe exists.
    assert load_recipe(path, defaults, names=["pkg", "cumm", "cumn"]).references() == {"cumm", "cumn"}


def test_load_recipes_checks_cross_references_across_files(tmp_path, defaults):
    folder = tmp_path / "recipes"
    write(folder, HEADER.replace("pkg", "a", 1) + "requires_dist: ['b=={VER:b}+{LOCAL}']\n", name="a")
    with pytest.raises(BadInput, match=r"a\.yml: requires_dist\[0\]: .*\{VER:b\} names no recipe"):
        load_recipes(folder, defaults)
    write(folder, HEADER.replace("pkg", "b", 1) + "version: '1.0'\n", name="b")
    assert set(load_recipes(folder, defaults)) == {"a", "b"}


def test_build_requires_farm_loop_is_refused(tmp_path, defaults):
    folder = tmp_path / "recipes"
    write(folder, HEADER.replace("pkg", "a", 1) + "build_requires_farm: [b]\n", name="a")
    write(folder, HEADER.replace("pkg", "b", 1) + "build_requires_farm: [a]\n", name="b")
    with pytest.raises(BadInput) as caught:
        load_recipes(folder, defaults)
    assert str(caught.value) == f"{folder / 'b.yml'}: build_requires_farm: 'a': build dependency loop: a -> b -> a"


def test_tag_like_refs_and_full_shas_are_accepted(tmp_path, defaults):
    for ref in ("v1.2.3", "0.6", "release-1.0", "v1.5.0-aot", "2.0.0b0", "446e9360ed10d3c8d03925ccb5f220ccb62009de"):
        path = write(tmp_path / "recipes", f"name: pkg\nsource: {{git: {{url: https://x.org/p.git, ref: '{ref}'}}}}\n"
                                           "links_torch: true\n")
        assert load_recipe(path, defaults).source.ref == ref


def test_path_source_is_relative_to_the_recipe_file_not_the_working_directory(tmp_path, defaults, monkeypatch):
    path = write(tmp_path / "recipes", "name: pkg\nsource: {path: ../examples/pkg}\nlinks_torch: true\n")
    monkeypatch.chdir("/")
    recipe = load_recipe(path, defaults)
    assert recipe.source.kind == "path"
    assert recipe.source_path == (tmp_path / "examples" / "pkg").resolve()
    assert recipe.build_relevant()["source"] == {"path": "../examples/pkg"}   # machine-independent


def test_bundled_demo_recipe_with_a_path_source_loads_among_the_others(defaults):
    recipes = load_recipes(RECIPES, defaults)
    demo = recipes.get("farm_demo")
    if demo is None:
        pytest.skip("recipes/farm_demo.yml is not there yet")
    assert demo.source.kind == "path"
    assert demo.source_path == (PROJECT_ROOT / "examples" / "farm-demo").resolve()


def test_recipe_is_immutable(defaults):
    recipe = load_recipes(RECIPES, defaults)["spconv"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.max_jobs = 9
    assert isinstance(recipe.requires_dist, tuple) and isinstance(recipe.build_deps, tuple)
    assert isinstance(recipe.verify.no_direct_import, tuple)
    assert isinstance(recipe.env, MappingProxyType)
    with pytest.raises(TypeError):
        recipe.arch.arch_list_by_cuda["12.8"] = None   # type: ignore[index]


def test_build_relevant_ignores_verify_and_comments_but_not_build_keys(tmp_path, defaults):
    folder = tmp_path / "recipes"
    base = HEADER + "max_jobs: 2\nverify: {import_names: [pkg]}\n"
    first = load_recipe(write(folder, base), defaults).build_relevant()
    assert "verify" not in first
    for same in (base.replace("import_names: [pkg]", "import_names: [pkg, pkg._C]"),
                 "# a comment\n" + base.replace("max_jobs: 2", "max_jobs: 2   # why two"),
                 base + "submodules: false\n"):      # a default written out
        assert load_recipe(write(folder, same), defaults).build_relevant() == first
    for different in (base.replace("max_jobs: 2", "max_jobs: 3"), base + "arch_list: 8.0 9.0\n",
                      base + "build_deps: [numpy]\n", base.replace("v1.0.0", "v1.0.1"),
                      base + "allow_graft: ['libgomp.so*']\n"):   # what may be grafted changes the wheel
        assert load_recipe(write(folder, different), defaults).build_relevant() != first


def test_load_recipes_is_cached_until_a_file_changes(tmp_path, defaults):
    folder = tmp_path / "recipes"
    path = write(folder, HEADER + "max_jobs: 2\n")
    os.utime(path, (1000, 1000))   # the rewrite below then has another mtime, however coarse the clock
    first = load_recipes(folder, defaults)
    assert load_recipes(folder, defaults)["pkg"] is first["pkg"]
    path.write_text(HEADER + "max_jobs: 3\n")   # the same size: only the mtime tells
    assert load_recipes(folder, defaults)["pkg"].max_jobs == 3


# ---------------------------------------------------------------- the 44 recipes against the facts

def _facts():
    return {p["name"]: p for p in yaml.safe_load(FACTS.read_text())["packages"]}


def _sm_variants(arch_list) -> dict[int, set[str]]:
    """sm -> the variants ('' plain, 'a', 'f') a list asks SASS for."""
    out: dict[int, set[str]] = {}
    for t in arch_list.tokens:
        out.setdefault(t.sm, set()).add(t.variant)
    return out


def _narrowed(facts_list, mine, waived: set[int]) -> list[str]:
    """What the recipe's list drops of the facts' list: an sm with no SASS token at all, or a PTX the facts
    ask for with no PTX at or above it. An arch-specific token (9.0a) for a plain one (9.0) keeps the sm
    (a package whose kernels exist only as 9.0a declares that, design.md §3); an sm waived by
    verify.allow_missing_archs (with its reason) is not counted."""
    have = _sm_variants(mine)
    lost = [f"sm {t.sm}" for t in facts_list.tokens if t.sm not in have and t.sm not in waived]
    ptx_at = [t.sm for t in mine.tokens if t.ptx]
    lost += [f"PTX {t.sm}" for t in facts_list.tokens if t.ptx and not any(p >= t.sm for p in ptx_at)]
    return lost


def test_every_package_of_the_facts_has_a_recipe_that_keeps_its_identity(defaults):
    """The recipes started as the facts; building them for real moved pins, added patches, deps and
    sub-arch tokens. What may not move silently: the upstream source, the grid the package is built
    for, and its arch lists (never narrower than the facts, unless waived with a reason)."""
    facts = _facts()
    recipes = load_recipes(RECIPES, defaults)
    grid = load_grid()
    assert len(facts) == 44
    assert set(facts) <= set(recipes)
    for name, fact in facts.items():
        r = recipes[name]
        text = r.path.read_text()
        git = fact["source"]["git"]
        if r.source.kind == "git":
            assert r.source.url == git["url"], name
            if r.source.ref != git["ref"]:   # a moved pin says, in a comment, what it was before
                assert git["ref"][:12] in text, (name, "moved pin without the old one named")
        else:   # an sdist of the same release, with the reason in a comment
            assert r.source.kind == "sdist" and git["ref"].lstrip("v") in text, name
        if r.source.kind == "git" and not FULL_SHA.match(r.source.ref):
            # a tag carries its commit, unless the recipe says the source could not be reached to resolve it
            assert (r.source.commit and FULL_SHA.match(r.source.commit)) or "unresolved" in text, \
                (name, "a tag without its commit")
        assert r.links_torch is fact["links_torch"], name
        assert set(r.platforms) == set(fact.get("platforms", defaults.grid_policy.platforms)), name
        assert r.min_torch == fact.get("min_torch") and r.max_torch == fact.get("max_torch"), name
        rows = [(c.cuda, c.pythons) for c in r.combinations]
        assert rows == [(c["cuda"], tuple(c["pythons"])) for c in fact.get("combinations", ())], name
        waived = {t.sm for lane in r.verify.allow_missing_archs.values() for t in lane.archs.tokens}
        for key in ("arch_list", "arch_list_aarch64"):
            if fact.get(key):
                assert getattr(r, key) is not None, (name, key)
                assert _narrowed(ArchList.parse(fact[key]), getattr(r, key), waived) == [], (name, key)
        built = built_lines(r, defaults, grid)
        for key, lane in (("arch_list_by_cuda", "x86"), ("arch_list_by_cuda_aarch64", "aarch64")):
            mine = getattr(r, key)
            for cuda, theirs in fact.get(key, {}).items():
                if cuda not in built[lane]:   # e.g. torchao's 12.4 row: its torch floor has no CUDA 12.4 wheels
                    continue
                assert cuda in mine, (name, key, cuda)
                assert _narrowed(ArchList.parse(theirs), mine[cuda], waived) == [], (name, key, cuda)
            if fact.get(key) or fact.get(key.replace("_by_cuda", "")):
                continue
            # The facts gave this lane no list: a list of the recipe's own may add to the policy row, not drop from it.
            rows = defaults.arch_policy.x86 if lane == "x86" else defaults.arch_policy.aarch64
            for cuda, own in mine.items():
                if cuda in built[lane]:
                    assert _narrowed(rows[cuda], own, waived) == [], (name, key, cuda, "narrower than the policy row")


def test_a_recipe_still_marked_needs_patch_says_why(defaults):
    """needs_patch stays only where a lane truly cannot build, with a comment saying why."""
    recipes = load_recipes(RECIPES, defaults)
    for name, r in recipes.items():
        if r.needs_patch:
            lines = r.path.read_text().splitlines()
            at = next(i for i, line in enumerate(lines) if line.startswith("needs_patch:"))
            said = "#" in lines[at] or (at > 0 and lines[at - 1].lstrip().startswith("#"))
            assert said, (name, "needs_patch without a reason")


def test_the_narrowing_check_sees_a_dropped_arch():
    facts_list = ArchList.parse("8.0 8.6 9.0 12.0+PTX")
    assert _narrowed(facts_list, ArchList.parse("8.0 8.6 9.0a 12.0+PTX"), set()) == []
    assert _narrowed(facts_list, ArchList.parse("9.0a 12.0+PTX"), set()) == ["sm 80", "sm 86"]
    assert _narrowed(facts_list, ArchList.parse("9.0a 12.0+PTX"), {80, 86}) == []
    assert _narrowed(facts_list, ArchList.parse("8.0 8.6 9.0 12.0a"), set()) == ["PTX 120"]


def test_notes_that_name_recipe_keys_are_carried_over(defaults):
    recipes = load_recipes(RECIPES, defaults)
    assert recipes["spconv"].build_requires_farm == ("cumm",)
    assert dict(recipes["torchsparse"].system_packages) == {"dnf": ("sparsehash-devel",), "apt": ("libsparsehash-dev",)}
    assert recipes["o_voxel"].references() == {"cumesh", "flex_gemm"}


# ---------------------------------------------------------------- lines built and hazards (design.md §3.5)

def test_built_lines_follow_the_grid_min_torch_platforms_and_arm_rows(defaults):
    recipes = load_recipes(RECIPES, defaults)
    grid = load_grid()
    assert built_lines(recipes["cc_torch"], defaults, grid) == {
        "x86": {"12.4", "12.6", "12.8", "12.9", "13.0", "13.2"}, "aarch64": {"12.6", "12.8", "12.9", "13.0", "13.2"}}
    # torch 2.11 has no cu124 wheels; gsplat_maskgaussian opts out of ARM; vllm has own rows on Linux only.
    assert built_lines(recipes["torchao"], defaults, grid)["x86"] == {"12.6", "12.8", "12.9", "13.0", "13.2"}
    assert built_lines(recipes["gsplat_maskgaussian"], defaults, grid)["aarch64"] == set()
    assert built_lines(recipes["vllm"], defaults, grid) == {"x86": {"12.9", "13.0"}, "aarch64": set()}
    # Without a grid: every supported line (ARM where the policy has a row).
    assert built_lines(recipes["torchao"], defaults)["x86"] == set(defaults.grid_policy.supported_cudas)
    assert "12.4" not in built_lines(recipes["cc_torch"], defaults)["aarch64"]


def test_package_wide_list_is_checked_only_against_lines_the_recipe_builds(tmp_path, defaults):
    # torch <= 2.8 never reaches CUDA 13, so sm_70 in a package-wide list is emittable everywhere it builds.
    path = write(tmp_path / "recipes", HEADER + "max_torch: '2.8'\narch_list: 7.0 8.0\n")
    assert load_recipe(path, defaults, grid=load_grid()).arch_list.torch() == "7.0 8.0"
    # Without the grid's torch rows every supported line counts, CUDA 13 included: refused.
    assert "CUDA 13.0's nvcc cannot emit sm 7.0" in error_of(path, defaults)


def _hazards_by_recipe(report):
    out: dict[str, dict[tuple[str, str], set[str]]] = {}
    for h in report.hazards:
        out.setdefault(h.recipe, {}).setdefault((h.lane, h.cuda), set()).add(h.kind)
    return out


def _lines(found):
    return {name: {lane: sorted((c for ln, c in hz if ln == lane), key=lambda c: tuple(map(int, c.split("."))))
                   for lane in ("x86", "aarch64")} for name, hz in found.items()}


def test_recipes_check_warns_where_an_arm_line_falls_back_and_nowhere_else(defaults):
    report = check_recipes(RECIPES, defaults)
    assert report.errors == ()
    lines = _lines(_hazards_by_recipe(report))
    assert set(lines) == {"flash_attn", "pyg_lib"}
    assert lines["flash_attn"] == {"x86": [], "aarch64": ["13.0", "13.2"]}
    assert lines["pyg_lib"] == {"x86": [], "aarch64": ["12.6", "12.8", "12.9", "13.0", "13.2"]}


def test_an_arm_line_with_no_list_of_its_own_warns_what_the_policy_row_changes(tmp_path, defaults):
    """sageattention as the facts gave it (an ARM list for 12.8 only): its other ARM lines fall back to
    policy rows that differ from its x86 lists, and the hazard says what is added and missing."""
    folder = tmp_path / "recipes"
    data = yaml.safe_load((RECIPES / "sageattention.yml").read_text())
    data["arch_list_by_cuda_aarch64"] = {"12.8": "8.0 9.0 9.0a 12.0+PTX"}
    write(folder, yaml.safe_dump(data), name="sageattention")
    shutil.copytree(RECIPES / "patches" / "sageattention", folder / "patches" / "sageattention")
    hazards = recipe_hazards(load_recipe(folder / "sageattention.yml", defaults), defaults, load_grid())
    lines = _lines({"s": {(h.lane, h.cuda) for h in hazards}})["s"]
    assert lines == {"x86": [], "aarch64": ["12.6", "12.9", "13.0", "13.2"]}
    sage = {h.cuda: h.message for h in hazards if h.kind == "b"}
    assert "(added: 10.0; missing: 8.6 8.9 9.0a)" in sage["12.9"], sage["12.9"]
    assert "(added: 10.0 11.0; missing: 8.6 8.9 9.0a)" in sage["13.0"], sage["13.0"]


def test_diso_and_gsplat_maskgaussian_warn_until_they_declare_arch_fallback_policy(tmp_path, defaults):
    folder = tmp_path / "recipes"
    for name in ("diso", "gsplat_maskgaussian"):
        text = (RECIPES / f"{name}.yml").read_text()
        assert "arch_fallback: policy" in text
        write(folder, text.replace("arch_fallback: policy", ""), name=name)
    grid = load_grid()
    diso = recipe_hazards(load_recipe(folder / "diso.yml", defaults), defaults, grid)
    assert {(h.lane, h.cuda, h.kind) for h in diso} == {
        ("x86", c, "a") for c in ("12.8", "12.9", "13.0", "13.2")} | {("aarch64", "12.6", "b")}
    mask = recipe_hazards(load_recipe(folder / "gsplat_maskgaussian.yml", defaults), defaults, grid)
    assert {(h.lane, h.cuda, h.kind) for h in mask} == {("x86", c, "a") for c in ("12.8", "12.9", "13.0", "13.2")}


# ---------------------------------------------------------------- the command

def farm(*args, env=None):
    return subprocess.run([sys.executable, "-m", "farm", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=PROJECT_ROOT, timeout=120)


def test_farm_recipes_check_prints_hazards_and_exits_zero():
    done = farm("recipes", "check")
    assert done.returncode == 0, done.stderr
    assert "0 invalid" in done.stdout
    assert "  flash_attn: aarch64 13.0/13.2 (b)" in done.stdout
    assert "  pyg_lib: aarch64 12.6/12.8/12.9/13.0/13.2 (b)" in done.stdout
    assert "fallback hazards (design.md section 3.5): " in done.stdout and " in 2 recipes" in done.stdout


def test_farm_recipes_check_exits_2_with_one_line_per_invalid_recipe(tmp_path):
    folder = tmp_path / "recipes"
    write(folder, HEADER)
    bad = write(folder, HEADER.replace("pkg", "bad", 1).replace("v1.0.0", "main"), name="bad")
    done = farm("recipes", "check", env={"FARM_RECIPES": str(folder)})
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"farm: {bad}: source.git.ref: 'main': a branch moves: pin a full 40-hex commit SHA or a release tag"]
    assert "1 recipes valid, 1 invalid" in done.stdout


def test_farm_recipes_list_names_every_recipe():
    done = farm("recipes", "list", "--format", "json")
    assert done.returncode == 0, done.stderr
    rows = yaml.safe_load(done.stdout)
    names = {r["name"] for r in rows}
    assert set(_facts()) <= names
    by_name = {r["name"]: r for r in rows}
    assert by_name["spconv"]["torch"] == "torch-free" and by_name["torchao"]["wheel_abi"] == "abi3"


def test_every_top_level_key_is_read_and_a_wrong_value_is_refused_under_its_own_name(tmp_path, defaults):
    """load_recipe reads a file part by part (farm.recipes.reader._PARTS): a key of TOP_KEYS that no
    part reads would be accepted and silently dropped. `[1]` fits no key, so each is refused, alone
    and under its own name."""
    header = {line.split(":", 1)[0]: line for line in HEADER.splitlines()}
    for key in TOP_KEYS:
        path = tmp_path / "pkg.yml"
        path.write_text("".join(f"{line}\n" for k, line in header.items() if k != key) + f"{key}: [1]\n")
        with pytest.raises(BadInput) as refused:
            load_recipe(path, defaults)
        keys = [p.key for p in getattr(refused.value, "problems", (refused.value,))]
        assert len(keys) == 1 and keys[0].split("[")[0] == key, (key, keys)
