"""`farm recipes new` and `farm recipes scan` (design.md §4.6, §4.7) and `--recipes DIR` on the verbs that read
recipes: the real `farm` command in a child process, an sdist served by a real HTTP server on 127.0.0.1 as
FARM_PYPI_URL, real git repositories made here (reached directly and through git's url.<x>.insteadOf), and
recorded copies of the upstream files of seed recipes (tests/data/scan/<recipe>/UPSTREAM.txt says whence)."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from farmcli import PROJECT, run_farm
from local_pypi import demo_sdist, simple_index
from replay_server import serve

from farm.build.source.scan import read_hunks, scan_recipe, scan_tree
from farm.recipes.reader import load_recipes

SCAN_DATA = PROJECT / "tests" / "data" / "scan"

# Per seed recipe: what the scan names in its recorded upstream files, at which line, and what in the recipe
# handles it (its patch, its keys), or "" where nothing does. Each of these patches fixes the hazard named.
EXPECTED = {
    "fused_ssim": [
        ("setup.py:14", "own-arch-list", ""),   # the fallback list: never used once the patch reads the list
        ("setup.py:27", "gpu-probe", "patch 0001-honour-arch-list.patch"),
    ],
    "natten": [("setup.py:55", "own-arch-variable", "patch 0001-arch-list-from-torch-cuda-arch-list.patch")],
    "nunchaku": [
        ("setup.py:47", "gpu-probe", "patch 0001-arch-list-from-torch-cuda-arch-list.patch"),
        ("setup.py:140", "own-arch-list", "patch 0001-arch-list-from-torch-cuda-arch-list.patch"),
    ],
    "pointnet2_ops": [("pointnet2_ops_lib/setup.py:19", "arch-overwrite", "patch 0001-honour-arch-list.patch")],
    "pyg_lib": [("CMakeLists.txt:55", "cmake-arch", "patch 0001-honour-cudaarchs.patch")],
    "sageattention": [
        ("setup.py:111", "gpu-probe", ""),      # only when TORCH_CUDA_ARCH_LIST is unset; the farm always sets it
        ("setup.py:159", "own-arch-list", "patch 0001-honour-arch-list.patch"),
        ("setup.py:205", "libcuda", "patch 0002-tensormap-without-libcuda.patch"),
    ],
    "sageattn3": [
        ("sageattention3_blackwell/setup.py:62", "gpu-probe", "patch 0001-arch-list-from-env-and-pinned-cutlass.patch"),
        ("sageattention3_blackwell/setup.py:64", "own-arch-list", "patch 0001-arch-list-from-env-and-pinned-cutlass.patch"),
        ("sageattention3_blackwell/setup.py:65", "arch-specific", "patch 0001-arch-list-from-env-and-pinned-cutlass.patch"),
        ("sageattention3_blackwell/setup.py:82", "download", "patch 0001-arch-list-from-env-and-pinned-cutlass.patch"),
    ],
    "drtk": [("setup.py:11", "pkg_resources", "patch 0001-importlib-metadata-instead-of-pkg_resources.patch")],
    "mmcv": [("setup.py:6", "pkg_resources", "patch 0001-no-pkg-resources-torch-picks-cxx-std.patch")],
    "dpvo_cuda": [
        ("dpvo/altcorr/correlation_kernel.cu:211", "tensor-type", "patch 0002-dispatch-on-scalar-type.patch"),
        ("dpvo/fastba/ba.cpp:6", "system-package", "extra_sources place it: thirdparty/eigen-3.4.0"),
        ("dpvo/lietorch/src/lietorch_cpu.cpp:360", "tensor-type", "patch 0002-dispatch-on-scalar-type.patch"),
        ("dpvo/lietorch/src/lietorch_gpu.cu:302", "tensor-type", "patch 0002-dispatch-on-scalar-type.patch"),
    ],
    "torchsparse": [
        ("torchsparse/backend/convolution/convolution_cuda.cu:550", "tensor-type", "patch 0002-dispatch-on-scalar-type.patch"),
        ("torchsparse/backend/devoxelize/devoxelize_cuda.cu:71", "tensor-type", "patch 0002-dispatch-on-scalar-type.patch"),
        ("torchsparse/backend/hashmap/hashmap_cpu.hpp:7", "system-package", "system_packages names libsparsehash-dev"),
        ("torchsparse/backend/voxelize/voxelize_cuda.cu:54", "tensor-type", "patch 0002-dispatch-on-scalar-type.patch"),
    ],
    "flex_gemm": [("setup.py:95", "home-write", "patch 0001-ship-autotune-cache-no-home-write.patch")],
    "flex_gemm_vb": [("setup.py:81", "home-write", "patch 0001-ship-autotune-cache-and-dist-name.patch")],
    "torchao": [
        ("setup.py:311", "submodule", "submodules: true (fetched at the pinned commit before the build)"),
        ("setup.py:377", "arch-specific", "verify.allow_missing_archs waives the plain archs it never builds"),
        ("setup.py:798", "own-arch-list", "patch 0001-mxfp8-sm120-cubin.patch"),
    ],
    "flash_attn": [
        ("setup.py:70", "own-arch-variable", "patch 0001-arch-list-from-torch-cuda-arch-list.patch"),
        ("setup.py:150", "submodule", ""),      # the ROCm branch's composable_kernel
        ("setup.py:180", "own-arch-list", "patch 0001-arch-list-from-torch-cuda-arch-list.patch"),
        ("setup.py:486", "download", "env sets FLASH_ATTENTION_FORCE_BUILD, which setup.py reads"),
    ],
}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_CACHE", str(tmp_path / "cache"))   # the sdist and git caches of this test only


# ---------------------------------------------------------------- the scan, on recorded upstream files

@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_scan_names_each_seed_recipes_hazards_at_their_line_and_what_handles_them(name):
    recipe = load_recipes()[name]
    found = [(h.location, h.kind, h.handled) for h in scan_recipe(recipe, SCAN_DATA / name).hazards]
    assert found == EXPECTED[name]


def test_the_scan_finds_a_hazard_fixed_by_a_farm_patch_in_at_least_six_seed_recipes():
    by_patch = {name for name, rows in EXPECTED.items() if any(h.startswith("patch ") for _, _, h in rows)}
    assert len(by_patch) >= 6, by_patch
    kinds = {kind for rows in EXPECTED.values() for _, kind, handled in rows if handled.startswith("patch ")}
    assert {"gpu-probe", "own-arch-list", "cmake-arch", "download", "pkg_resources", "tensor-type", "libcuda",
            "home-write"} <= kinds


def test_every_recorded_tree_says_where_it_comes_from():
    for name in EXPECTED:
        note = (SCAN_DATA / name / "UPSTREAM.txt").read_text()
        assert "From: " in note and "At: " in note, name


def test_a_hunk_covers_the_lines_it_replaces():
    patch = (PROJECT / "recipes/patches/pointnet2_ops/0001-honour-arch-list.patch").read_text()
    [hunk] = read_hunks(patch)
    assert hunk.file == "pointnet2_ops_lib/setup.py" and hunk.covers(19) and not hunk.covers(40)
    assert any("TORCH_CUDA_ARCH_LIST" in line for line in hunk.removed)


def test_comments_messages_and_rocm_branches_are_not_hazards(tmp_path):
    (tmp_path / "setup.py").write_text(
        "# torch.cuda.get_device_capability() is not called here\n"
        'print("run git submodule update --init first")\n'
        "if IS_HIP:\n    archs = os.getenv('GPU_ARCHS', 'native')  # --offload-arch\n"
        "x = os.environ.get('TORCH_CUDA_ARCH_LIST')\n"
        "cuda = torch.cuda.is_available() or os.getenv('FORCE_CUDA') == '1'\n"
        "if torch.cuda.is_available():\n    WITH_CUDA = True\n\nx = 1\nif os.getenv('FORCE_CUDA', '0') == '1':\n    pass\n"
        "if torch.cuda.is_available() and torch.version.hip:\n    pass\n")
    (tmp_path / "third_party" / "lib").mkdir(parents=True)
    (tmp_path / "third_party" / "lib" / "CMakeLists.txt").write_text("FetchContent_Declare(x URL https://x)\n")
    report = scan_tree(tmp_path)
    assert report.hazards == [] and report.skipped == ["third_party"]


def test_a_header_the_tree_carries_is_no_system_package(tmp_path):
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "a.cu").write_text("#include <Eigen/Dense>\n#include <boost/any.hpp>\n")
    (tmp_path / "third_party" / "eigen" / "Eigen").mkdir(parents=True)
    (tmp_path / "third_party" / "eigen" / "Eigen" / "Dense").write_text("")
    [hazard] = scan_tree(tmp_path).hazards
    assert (hazard.location, hazard.kind, hazard.package) == ("csrc/a.cu:2", "system-package", "libboost-dev")


# ---------------------------------------------------------------- farm recipes new --sdist

@pytest.fixture
def pypi(tmp_path, monkeypatch):
    """The demo's sdist on a simple index served on 127.0.0.1: (FARM_PYPI_URL, its sha256)."""
    root = tmp_path / "pypi"
    digest = simple_index(root, demo_sdist(tmp_path / "dist"))
    with serve(root) as url:
        yield url.rstrip("/"), digest


def test_new_from_an_sdist_pins_its_sha256_and_version_checks_it_and_names_the_first_cell(pypi, tmp_path):
    url, digest = pypi
    folder = tmp_path / "mine"
    folder.mkdir()
    done = run_farm("recipes", "new", "farm_demo", "--sdist", "farm-demo==0.1.0", "--recipes", str(folder),
                    env={"FARM_PYPI_URL": url})
    assert done.returncode == 0, done.stderr
    recipe = yaml.safe_load((folder / "farm_demo.yml").read_text())
    assert recipe["source"] == {"sdist": {"pypi": "farm-demo==0.1.0", "sha256": digest}}
    assert recipe["version"] == "0.1.0" and recipe["links_torch"] is True
    assert "arch_list" not in recipe   # each cell takes the policy row of its line, listed as a comment
    assert "#   x86 13.0: 7.5 8.0 8.6 9.0+PTX 10.0 12.0+PTX" in (folder / "farm_demo.yml").read_text()
    assert f"build first: farm build farm_demo-cu130-torch2.13-py312 --recipes {folder}" in done.stdout
    assert "farm recipes check: 1 valid" in done.stdout
    assert [p.name for p in folder.iterdir()] == ["farm_demo.yml"]   # no temporary file left
    # The written recipe plans through --recipes exactly the cell it named.
    plan = run_farm("plan", "--package", "farm_demo", "--cuda", "13.0", "--torch", "2.13", "--python", "3.12",
                    "--platform", "linux", "--recipes", str(folder))
    assert plan.returncode == 0 and plan.stdout.split()[0] == "farm_demo-cu130-torch2.13-py312", plan.stderr


def test_new_refuses_a_name_that_exists_in_one_line_and_keeps_the_file(pypi, tmp_path):
    url, _ = pypi
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "farm_demo.yml").write_text("mine\n")
    done = run_farm("recipes", "new", "farm_demo", "--sdist", "farm-demo==0.1.0", "--recipes", str(folder),
                    env={"FARM_PYPI_URL": url})
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "exists" in done.stderr
    assert (folder / "farm_demo.yml").read_text() == "mine\n"


@pytest.mark.parametrize("args, needle", [
    (["--sdist", "farm-demo>=0.1"], "--sdist: 'farm-demo>=0.1': expected an exact pin"),
    (["--sdist", "farm-demo==9.9"], "no such release with an sdist"),
    (["--sdist", "farm-demo==0.1.0", "--git", "https://x/y.git"], "give exactly one source"),
    (["--git", "https://x/y.git"], "--git needs --ref"),
    (["--git", "https://x/y.git", "--ref", "main"], "--ref: 'main': a branch moves"),
])
def test_new_refuses_a_bad_source_in_one_line_writing_nothing(pypi, tmp_path, args, needle):
    url, _ = pypi
    folder = tmp_path / "mine"
    folder.mkdir()
    done = run_farm("recipes", "new", "farm_demo", *args, "--recipes", str(folder), env={"FARM_PYPI_URL": url})
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert needle in done.stderr
    assert list(folder.iterdir()) == []


def test_new_removes_a_recipe_the_check_refuses_and_says_why(pypi, tmp_path):
    url, _ = pypi
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "farm__demo.yml").write_text("name: farm__demo\nsource: {path: .}\nlinks_torch: true\n")
    done = run_farm("recipes", "new", "farm_demo", "--sdist", "farm-demo==0.1.0", "--recipes", str(folder),
                    env={"FARM_PYPI_URL": url})
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "the same project as" in done.stderr and "wheels would collide" in done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["farm__demo.yml"]


def test_scan_fetches_a_recipes_source_and_names_the_patch_that_handles_a_hazard(tmp_path):
    folder = tmp_path / "mine"
    (folder / "src").mkdir(parents=True)
    (folder / "src" / "setup.py").write_text("import os\nfrom pkg_resources import get_distribution\n")
    (folder / "patches" / "my_ext").mkdir(parents=True)
    (folder / "patches" / "my_ext" / "0001-no-pkg-resources.patch").write_text(
        "diff --git a/setup.py b/setup.py\n--- a/setup.py\n+++ b/setup.py\n@@ -1,2 +1,2 @@\n import os\n"
        "-from pkg_resources import get_distribution\n+from importlib.metadata import version\n")
    (folder / "my_ext.yml").write_text("name: my_ext\nsource: {path: src}\nlinks_torch: true\n"
                                       "patches: [{file: 0001-no-pkg-resources.patch}]\n")
    done = run_farm("recipes", "scan", "my_ext", "--format", "json", "--recipes", str(folder))
    assert done.returncode == 0, done.stderr
    [hazard] = yaml.safe_load(done.stdout)["hazards"]
    assert (hazard["file"], hazard["line"], hazard["kind"]) == ("setup.py", 2, "pkg_resources")
    assert hazard["handled"] == "patch 0001-no-pkg-resources.patch"
    assert "importlib" in hazard["fix"]


def test_new_refuses_a_bad_name_and_a_missing_folder(tmp_path):
    bad = run_farm("recipes", "new", "My-Ext", "--sdist", "x==1", "--recipes", str(tmp_path))
    assert bad.returncode == 2 and "NAME: 'My-Ext'" in bad.stderr
    gone = run_farm("recipes", "new", "my_ext", "--sdist", "x==1", "--recipes", str(tmp_path / "nope"))
    assert gone.returncode == 2 and "--recipes" in gone.stderr and "no such folder" in gone.stderr


# ---------------------------------------------------------------- farm recipes new --git, through a mirror

def git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_new_from_a_git_tag_resolves_it_through_an_insteadof_mirror(tmp_path):
    repo = tmp_path / "mirror" / "my-ext"
    repo.mkdir(parents=True)
    (repo / "setup.py").write_text("import pkg_resources\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "one")
    git(repo, "tag", "v1.0")
    sha = git(repo, "rev-parse", "HEAD")
    # The URL the recipe names is unreachable; git's own config sends it to the local mirror, as for builds.
    config = tmp_path / "gitconfig"
    config.write_text(f'[url "file://{tmp_path}/mirror/"]\n\tinsteadOf = https://forge.invalid/me/\n'
                      "[protocol \"file\"]\n\tallow = always\n")
    folder = tmp_path / "mine"
    folder.mkdir()
    done = run_farm("recipes", "new", "my_ext", "--git", "https://forge.invalid/me/my-ext", "--ref", "v1.0",
                    "--recipes", str(folder), env={"GIT_CONFIG_GLOBAL": str(config)})
    assert done.returncode == 0, done.stderr
    recipe = yaml.safe_load((folder / "my_ext.yml").read_text())
    assert recipe["source"] == {"git": {"url": "https://forge.invalid/me/my-ext", "ref": "v1.0", "commit": sha}}
    assert "setup.py:1: pkg_resources" in done.stdout


# ---------------------------------------------------------------- --recipes DIR on the verbs that read recipes

def test_recipes_option_reads_that_folder_and_its_patches_and_refuses_a_missing_one(tmp_path):
    folder = tmp_path / "mine"
    (folder / "patches" / "my_ext").mkdir(parents=True)
    (folder / "patches" / "my_ext" / "0001-x.patch").write_text("diff --git a/x b/x\n")
    (folder / "my_ext.yml").write_text("name: my_ext\nsource: {path: .}\nlinks_torch: true\n"
                                       "patches: [{file: 0001-x.patch}]\n")
    check = run_farm("recipes", "check", "--recipes", str(folder))
    assert check.returncode == 0 and "1 recipes valid" in check.stdout, check.stderr
    listed = run_farm("recipes", "list", "--recipes", str(folder))
    assert listed.stdout.split()[listed.stdout.split().index("my_ext")] == "my_ext"
    plan = run_farm("plan", "--package", "my_ext", "--summary", "--recipes", str(folder))
    assert plan.returncode == 0 and "my_ext" in plan.stdout
    explain = run_farm("arch", "explain", "--package", "my_ext", "--cuda", "13.0", "--torch", "2.13",
                       "--recipes", str(folder))
    assert explain.returncode == 0, explain.stderr
    doc = (PROJECT / "docs" / "recipe-status.md").read_bytes()
    status = run_farm("recipes", "status", "--recipes", str(folder))
    assert status.returncode == 0 and f"wrote {folder}/recipe-status.md" in status.stdout, status.stderr
    assert "my_ext" in (folder / "recipe-status.md").read_text()
    assert (PROJECT / "docs" / "recipe-status.md").read_bytes() == doc   # the project's table is not theirs
    typo = run_farm("plan", "--package", "my_exy", "--recipes", str(folder))
    assert typo.returncode == 2 and f"no recipe {folder}/my_exy.yml (did you mean 'my_ext'?)" in typo.stderr
    for verb in (["plan"], ["recipes", "scan", "my_ext"], ["build", "my_ext-cu130-torch2.13-py312"],
                 ["run", "--dry-run"], ["recipes", "status"]):
        missing = run_farm(*verb, "--recipes", str(tmp_path / "nope"))
        assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1, (verb, missing.stderr)
        assert "--recipes" in missing.stderr and "no such folder" in missing.stderr
