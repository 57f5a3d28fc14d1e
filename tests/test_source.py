"""Step 1, source: real git repositories made here, real sdists served over HTTP on 127.0.0.1.

The step takes the recipe loader's typed values (design.md §6.1): each case here writes the recipe's
values and reads them through the loader's own readers first. What a recipe may not say at all
(a branch, a short SHA, a bad sha256, a dest outside the tree...) is the loader's to refuse, and is
tested there (test_recipes.py, test_recipes_hostile.py); this file tests what only fetching can tell.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import shutil
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from farm.build.source.local import tree_digest
from farm.build.source.prepare import prepare_source
from farm.errors import BadInput, FarmError, PatchFailed, UnsafeArchive
from farm.recipes.values import Reader, read_extra_sources, read_patches, read_source


def git(cwd, *args):
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "protocol.file.allow=always",
         "-c", "init.defaultBranch=main", *args],
        cwd=cwd, check=True, capture_output=True, text=True,
    ).stdout.strip()


def make_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q")
    commit(path, files, "initial")
    return path


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def upstream(tmp_path):
    repo = make_repo(tmp_path / "up" / "demo", {"setup.py": "print('v1')\n", "src/a.txt": "one\ntwo\nthree\n"})
    v1 = git(repo, "rev-parse", "HEAD")
    git(repo, "tag", "v1.0")
    v2 = commit(repo, {"setup.py": "print('v2')\n"}, "second")
    git(repo, "tag", "-a", "v2.0", "-m", "annotated")
    return repo, v1, v2


def as_url(repo) -> str:
    """A repository made here as the URL a recipe names it by."""
    return str(repo) if "://" in str(repo) else f"file://{repo}"


def src(url, ref, commit=None, exclude=None):
    spec = {"url": as_url(url), "ref": ref}
    if commit:
        spec["commit"] = commit
    if exclude is not None:
        spec["exclude"] = exclude
    return {"git": spec}


def prep(source, work, *, extra_sources=(), patches=(), **kw):
    """The source step on what the recipe loader makes of these recipe values (`source`, `extra_sources`,
    `patches` as a recipes/demo.yml beside `work` would write them: a `path` is relative to that folder,
    patch files live under its patches/demo/). The step takes the loader's typed values, nothing else."""
    folder = Path(work).parent
    reader = Reader(folder / "demo.yml")
    try:
        typed = dict(source=read_source(reader, source, "source"),
                     extra_sources=read_extra_sources(reader, list(extra_sources)),
                     patches=read_patches(reader, list(patches), "demo", folder))
    except BadInput as exc:   # a case the loader refuses is the loader's test, never the step's
        raise AssertionError(f"the recipe loader refuses this: {exc}") from None
    kw.setdefault("platform", "linux")
    kw.setdefault("cuda", "13.0")
    return prepare_source(typed.pop("source"), work, **typed, **kw)


# ------------------------------------------------------------------------- git


def test_git_tag_resolves_to_its_commit_and_checks_out_that_tree(upstream, tmp_path):
    repo, v1, v2 = upstream
    res = prep(src(repo, "v1.0", v1), tmp_path / "work")
    assert res.kind == "git" and res.commit == v1 and res.pin == v1
    assert (tmp_path / "work" / "setup.py").read_text() == "print('v1')\n"
    assert git(tmp_path / "work", "rev-parse", "HEAD") == v1
    # an annotated tag resolves to the commit, not the tag object
    res2 = prep(src(repo, "v2.0", v2), tmp_path / "work2")
    assert res2.commit == v2


def test_git_tag_whose_commit_differs_from_the_recipe_fails_naming_both(upstream, tmp_path):
    repo, v1, v2 = upstream
    with pytest.raises(BadInput) as exc:
        prep(src(repo, "v1.0", v2), tmp_path / "work", where="recipes/demo.yml")
    msg = str(exc.value)
    assert "\n" not in msg and v1 in msg and v2 in msg and "recipes/demo.yml" in msg
    assert not (tmp_path / "work").exists()


def test_git_nonexistent_ref_fails_in_one_line(upstream, tmp_path):
    repo, _, _ = upstream
    with pytest.raises(BadInput, match="no such tag") as exc:
        prep(src(repo, "v9.9"), tmp_path / "work")
    assert "\n" not in str(exc.value)
    with pytest.raises(BadInput, match="no such commit"):
        prep(src(repo, "0" * 40), tmp_path / "work")


def test_a_tag_like_name_that_is_a_branch_upstream_is_refused(upstream, tmp_path):
    """A name that reads like a release passes the loader; only upstream can tell it is a branch."""
    repo, _, _ = upstream
    git(repo, "branch", "release-3.0")
    with pytest.raises(BadInput, match="is a branch, which moves") as exc:
        prep(src(repo, "release-3.0"), tmp_path / "work")
    assert exc.value.key == "source.git.ref" and "\n" not in str(exc.value)
    assert not (tmp_path / "work").exists()


def test_git_full_sha_ref_and_cache_serves_a_second_fetch_without_upstream(upstream, tmp_path):
    repo, v1, _ = upstream
    prep(src(repo, v1), tmp_path / "w1")
    prep(src(repo, "v1.0", v1), tmp_path / "w2")
    shutil.rmtree(repo)  # upstream gone: the pins are served from the cache
    res = prep(src(repo, v1), tmp_path / "w3")
    assert res.commit == v1 and (tmp_path / "w3" / "src" / "a.txt").exists()
    assert prep(src(repo, "v1.0", v1), tmp_path / "w4").commit == v1


def test_git_commit_reachable_from_no_branch_is_fetched_by_sha(tmp_path):
    repo = make_repo(tmp_path / "up" / "r", {"f": "1\n"})
    git(repo, "checkout", "-q", "-b", "tmp")
    lost = commit(repo, {"f": "2\n"}, "on a branch")
    # the mirror is made while the commit is on a branch, then the branch disappears upstream
    res = prep(src(repo, lost), tmp_path / "w1")
    git(repo, "checkout", "-q", "main")
    git(repo, "branch", "-q", "-D", "tmp")
    res = prep(src(repo, lost), tmp_path / "w2")
    assert res.commit == lost and (tmp_path / "w2" / "f").read_text() == "2\n"


def test_git_submodules_are_fetched_and_their_commits_recorded(tmp_path):
    up = tmp_path / "up"
    inner = make_repo(up / "inner", {"inner.txt": "deep\n"})
    inner_sha = git(inner, "rev-parse", "HEAD")
    sub = make_repo(up / "sub", {"sub.txt": "sub\n"})
    git(sub, "submodule", "add", "-q", str(inner), "third_party/inner")
    sub_sha = commit(sub, {}, "add inner")
    parent = make_repo(up / "parent", {"top.txt": "top\n"})
    git(parent, "submodule", "add", "-q", str(sub), "libs/sub")
    # a relative URL, as forges use: resolved against the parent's URL
    (parent / ".gitmodules").write_text((parent / ".gitmodules").read_text().replace(str(sub), "../sub"))
    top = commit(parent, {}, "add sub")
    commit(sub, {"sub.txt": "moved on\n"}, "later")  # the pinned gitlink, not the branch tip, is used

    res = prep(src(parent, top), tmp_path / "work", submodules=True)
    w = tmp_path / "work"
    assert (w / "libs/sub/sub.txt").read_text() == "sub\n"
    assert (w / "libs/sub/third_party/inner/inner.txt").read_text() == "deep\n"
    assert res.submodules == (("libs/sub", sub_sha), ("libs/sub/third_party/inner", inner_sha))
    assert res.key_inputs()["submodules"] == [["libs/sub", sub_sha], ["libs/sub/third_party/inner", inner_sha]]

    # a recipe patch may reach into a submodule's files
    pdir = tmp_path / "patches" / "demo"
    pdir.mkdir(parents=True)
    (pdir / "sub.patch").write_text("--- a/libs/sub/sub.txt\n+++ b/libs/sub/sub.txt\n@@ -1 +1 @@\n-sub\n+patched\n")
    prep(src(parent, top), tmp_path / "patched", submodules=True, patches=[{"file": "sub.patch"}])
    assert (tmp_path / "patched/libs/sub/sub.txt").read_text() == "patched\n"

    plain = prep(src(parent, top), tmp_path / "plain", submodules=False)
    assert plain.submodules == () and not (tmp_path / "plain/libs/sub/sub.txt").exists()


# ----------------------------------------------------------------------- sdist


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """A static server that, like PyPI, answers PEP 691 JSON (a folder's index.json) to clients asking for it."""

    def send_head(self):
        folder = Path(self.translate_path(self.path))
        if "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", "") and (folder / "index.json").is_file():
            data = (folder / "index.json").read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return io.BytesIO(data)
        return super().send_head()

    def log_message(self, *args):
        pass


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = lambda *a, **k: _Quiet(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def make_tar(path: Path, members: list[tuple]) -> str:
    """members: (name, text) files, or (name, None, linkname) symlinks, or (name, 'dir')."""
    with tarfile.open(path, "w:gz") as tf:
        for m in members:
            info = tarfile.TarInfo(m[0])
            if len(m) == 3:
                info.type, info.linkname = tarfile.SYMTYPE, m[2]
                tf.addfile(info)
            else:
                data = m[1].encode()
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


GOOD = [("demo-1.0/setup.py", "print('sdist')\n"), ("demo-1.0/demo/__init__.py", "x = 1\n")]


def test_sdist_by_url_is_checked_and_extracted_without_its_top_folder(served, tmp_path):
    root, base = served
    sha = make_tar(root / "demo-1.0.tar.gz", GOOD)
    res = prep({"sdist": {"url": f"{base}/demo-1.0.tar.gz", "sha256": sha}}, tmp_path / "work")
    assert res.kind == "sdist" and res.sha256 == sha == res.pin
    assert (tmp_path / "work/setup.py").read_text() == "print('sdist')\n"
    assert (tmp_path / "work/demo/__init__.py").exists()
    # cached by sha256: a second cell needs no server
    (root / "demo-1.0.tar.gz").unlink()
    prep({"sdist": {"url": f"{base}/demo-1.0.tar.gz", "sha256": sha}}, tmp_path / "work2")
    assert (tmp_path / "work2/setup.py").exists()


def test_sdist_by_pypi_name_is_resolved_through_the_simple_index(served, tmp_path, monkeypatch):
    root, base = served
    (root / "files").mkdir()
    sha = make_tar(root / "files/demo-1.0.tar.gz", GOOD)
    page = root / "simple/demo"
    page.mkdir(parents=True)
    # a plain mirror: PEP 503 HTML, relative hrefs with fragments, a wheel and another release beside it
    (page / "index.html").write_text(
        '<html><body><a href="../../files/demo-1.0-py3-none-any.whl#sha256=00">demo-1.0-py3-none-any.whl</a>\n'
        '<a href="../../files/demo-0.9.tar.gz#sha256=11">demo-0.9.tar.gz</a>\n'
        f'<a href="../../files/demo-1.0.tar.gz#sha256={sha}" data-requires-python="&gt;=3.8">demo-1.0.tar.gz</a>\n'
        '</body></html>\n')
    monkeypatch.setenv("FARM_PYPI_URL", base)
    res = prep({"sdist": {"pypi": "Demo==1.0", "sha256": sha}}, tmp_path / "work")
    assert res.sha256 == sha and (tmp_path / "work/setup.py").exists()
    with pytest.raises(BadInput, match="no such release") as exc:
        prep({"sdist": {"pypi": "demo==2.0", "sha256": "ef" * 32}}, tmp_path / "w2")
    assert "source.sdist.pypi" in str(exc.value) and "\n" not in str(exc.value)
    # cached by the pin (sha256): once fetched, PyPI is not asked again
    shutil.rmtree(root / "simple")
    prep({"sdist": {"pypi": "demo==1.0", "sha256": sha}}, tmp_path / "w3")


def test_sdist_by_pypi_name_prefers_the_pep_691_json_page(served, tmp_path, monkeypatch):
    root, base = served
    (root / "files").mkdir()
    sha = make_tar(root / "files/demo-1.0.tar.gz", GOOD)
    page = root / "simple/demo"
    page.mkdir(parents=True)
    (page / "index.json").write_text(json.dumps({"meta": {"api-version": "1.1"}, "name": "demo", "files": [
        {"filename": "demo-1.0-py3-none-any.whl", "url": f"{base}/files/nope.whl", "hashes": {}},
        {"filename": "demo-1.0.tar.gz", "url": f"{base}/files/demo-1.0.tar.gz#sha256={sha}", "hashes": {"sha256": sha}},
    ]}))
    (page / "index.html").write_text('<a href="../../files/missing-1.0.tar.gz">demo-1.0.tar.gz</a>\n')  # not read
    monkeypatch.setenv("FARM_PYPI_URL", base)
    res = prep({"sdist": {"pypi": "demo==1.0", "sha256": sha}}, tmp_path / "work")
    assert res.sha256 == sha and (tmp_path / "work/setup.py").exists()


def test_sdist_with_wrong_sha256_fails_and_extracts_nothing(served, tmp_path):
    root, base = served
    make_tar(root / "demo-1.0.tar.gz", GOOD)
    with pytest.raises(BadInput, match="sha256") as exc:
        prep({"sdist": {"url": f"{base}/demo-1.0.tar.gz", "sha256": "ab" * 32}}, tmp_path / "work")
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "work").exists()
    assert not list((tmp_path / "cache/sources/sdist").rglob("*.tar.gz"))


@pytest.mark.parametrize("bad, why", [
    (("demo-1.0/../../evil.txt", "pwned\n"), "'..'"),
    (("/tmp/evil-absolute.txt", "pwned\n"), "absolute"),
    (("demo-1.0/link", None, "../../../etc/passwd"), "leads outside"),
    (("demo-1.0/abslink", None, "/etc/passwd"), "leads outside"),
])
def test_sdist_with_an_unsafe_member_is_refused(served, tmp_path, bad, why):
    root, base = served
    sha = make_tar(root / "bad.tar.gz", [*GOOD, bad])
    with pytest.raises(UnsafeArchive, match=why) as exc:
        prep({"sdist": {"url": f"{base}/bad.tar.gz", "sha256": sha}}, tmp_path / "work")
    assert bad[0] in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "work").exists()
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/evil-absolute.txt").exists()


def test_sdist_symlink_staying_inside_is_kept(served, tmp_path):
    root, base = served
    sha = make_tar(root / "ok.tar.gz", [*GOOD, ("demo-1.0/alias.py", None, "demo/__init__.py")])
    prep({"sdist": {"url": f"{base}/ok.tar.gz", "sha256": sha}}, tmp_path / "work")
    assert (tmp_path / "work/alias.py").read_text() == "x = 1\n"


# ------------------------------------------------------------------- path + work dir


def test_local_path_is_copied_and_pinned_by_content(tmp_path):
    srcdir = tmp_path / "demo"
    (srcdir / "pkg").mkdir(parents=True)
    (srcdir / "setup.py").write_text("print(1)\n")
    (srcdir / "build").mkdir()
    (srcdir / "build" / "junk.o").write_text("old build\n")
    (srcdir / "pkg" / "__pycache__").mkdir()
    res = prep({"path": "demo"}, tmp_path / "work")   # relative to the recipe's folder
    assert res.kind == "path" and (tmp_path / "work/setup.py").exists()
    assert not (tmp_path / "work/build").exists() and not (tmp_path / "work/pkg/__pycache__").exists()
    before = res.pin
    (srcdir / "build" / "junk.o").write_text("other build\n")
    assert tree_digest(srcdir) == before  # build artefacts do not change the pin
    (srcdir / "setup.py").write_text("print(2)\n")
    assert tree_digest(srcdir) != before
    shutil.rmtree(srcdir)   # gone after the recipe was loaded: the step says so, in one line
    with pytest.raises(BadInput, match="no such folder") as exc:
        prep({"path": "demo"}, tmp_path / "w2")
    assert exc.value.key == "source.path" and "\n" not in str(exc.value)


def test_work_dir_is_replaced_on_success_and_kept_on_failure(tmp_path):
    srcdir = tmp_path / "demo"
    srcdir.mkdir()
    (srcdir / "setup.py").write_text("new\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "stale.txt").write_text("from an earlier run\n")
    prep({"path": str(srcdir)}, work)
    assert not (work / "stale.txt").exists() and (work / "setup.py").read_text() == "new\n"
    (tmp_path / "patches" / "demo").mkdir(parents=True)
    (tmp_path / "patches" / "demo" / "bad.patch").write_text(PATCH_BAD)
    with pytest.raises(PatchFailed):
        prep({"path": str(srcdir)}, work, patches=[{"file": "bad.patch"}])
    assert (work / "setup.py").read_text() == "new\n"
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


# --------------------------------------------------------------------- patches

PATCH_1 = """\
--- a/src/a.txt
+++ b/src/a.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
"""
# applies only on top of PATCH_1: order matters
PATCH_2 = """\
--- a/src/a.txt
+++ b/src/a.txt
@@ -1,3 +1,3 @@
 one
-TWO
+TWO-AGAIN
 three
"""
PATCH_WIN = """\
--- a/setup.py
+++ b/setup.py
@@ -1 +1 @@
-print('v1')
+print('windows')
"""
PATCH_BAD = """\
--- a/src/a.txt
+++ b/src/a.txt
@@ -1,3 +1,3 @@
 one
-this line is not there
+x
 three
"""
SCRIPT = """\
from pathlib import Path
p = Path("setup.py")
if "# patched" not in p.read_text():
    p.write_text(p.read_text() + "# patched\\n")
"""


@pytest.fixture
def patches(tmp_path):
    d = tmp_path / "patches" / "demo"
    d.mkdir(parents=True)
    for name, text in {"01.patch": PATCH_1, "02.patch": PATCH_2, "win.patch": PATCH_WIN,
                       "bad.patch": PATCH_BAD, "fix.py": SCRIPT}.items():
        (d / name).write_text(text)
    return d


@pytest.mark.parametrize("kind", ["git", "path"])
def test_patches_apply_in_order_with_their_when(upstream, tmp_path, patches, kind):
    repo, v1, _ = upstream
    source = src(repo, "v1.0", v1)
    if kind == "path":  # not a git repository: git apply must not look for one above it
        git(repo, "checkout", "-q", v1)
        shutil.copytree(repo, tmp_path / "plain", ignore=shutil.ignore_patterns(".git"))
        source = {"path": str(tmp_path / "plain")}
    plan = [
        {"file": "01.patch"},
        {"file": "win.patch", "when": {"platform": "windows"}},
        {"file": "02.patch", "when": {"cuda": ">=12.8", "platform": ["linux", "linux_aarch64"]}},
        {"file": "fix.py"},
    ]
    res = prep(source, tmp_path / "work", patches=plan)
    w = tmp_path / "work"
    assert (w / "src/a.txt").read_text() == "one\nTWO-AGAIN\nthree\n"
    assert (w / "setup.py").read_text() == "print('v1')\n# patched\n"
    assert [p for p, _ in res.patches] == ["01.patch", "02.patch", "fix.py"]
    assert res.skipped_patches == ("win.patch",)
    assert dict(res.patches)["01.patch"] == hashlib.sha256(PATCH_1.encode()).hexdigest()

    win = prep(source, tmp_path / "win", patches=plan, platform="windows", cuda="12.6")
    assert win.skipped_patches == ("02.patch",)
    assert (tmp_path / "win/setup.py").read_text() == "print('windows')\n# patched\n"
    assert (tmp_path / "win/src/a.txt").read_text() == "one\nTWO\nthree\n"  # 02 needs cuda >= 12.8

    with pytest.raises(PatchFailed):  # reversed order: 02 cannot apply before 01
        prep(source, tmp_path / "rev", patches=[{"file": "02.patch"}, {"file": "01.patch"}])


def test_a_failing_patch_fails_the_cell_in_one_line_naming_it(upstream, tmp_path, patches):
    repo, v1, _ = upstream
    with pytest.raises(PatchFailed) as exc:
        prep(src(repo, "v1.0", v1), tmp_path / "work",
             patches=[{"file": "01.patch"}, {"file": "bad.patch"}])
    msg = str(exc.value)
    assert "bad.patch" in msg and "\n" not in msg
    assert isinstance(exc.value, FarmError) and not (tmp_path / "work").exists()
    (patches / "boom.py").write_text("raise SystemExit('cannot find the line to fix')\n")
    with pytest.raises(PatchFailed, match=r"boom\.py.*cannot find the line"):
        prep(src(repo, "v1.0", v1), tmp_path / "work", patches=[{"file": "boom.py"}])


def test_patch_script_runs_without_network(upstream, tmp_path, patches, served):
    import os
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root here")
    _, base = served
    repo, v1, _ = upstream
    (patches / "net.py").write_text(f"import urllib.request\nurllib.request.urlopen('{base}/', timeout=5)\n")
    with pytest.raises(PatchFailed, match="net.py"):
        prep(src(repo, "v1.0", v1), tmp_path / "work", patches=[{"file": "net.py"}])


# --------------------------------------------------------------- extra sources


def test_extra_sources_are_fetched_checked_and_placed(served, tmp_path, upstream):
    root, base = served
    repo, v1, _ = upstream
    sha_tar = make_tar(root / "cutlass-3.5.tar.gz", [("cutlass-3.5/include/cutlass.h", "// h\n")])
    (root / "weights.bin").write_bytes(b"\x00\x01")
    sha_bin = hashlib.sha256(b"\x00\x01").hexdigest()
    extras = [
        {"url": f"{base}/cutlass-3.5.tar.gz", "sha256": sha_tar, "dest": "third_party/cutlass"},
        {"url": f"{base}/weights.bin", "sha256": sha_bin, "dest": "data/w.bin"},
    ]
    res = prep(src(repo, "v1.0", v1), tmp_path / "work", extra_sources=extras)
    w = tmp_path / "work"
    assert (w / "third_party/cutlass/include/cutlass.h").read_text() == "// h\n"
    assert (w / "data/w.bin").read_bytes() == b"\x00\x01"
    assert res.extra_sources == (("third_party/cutlass", sha_tar), ("data/w.bin", sha_bin))

    wrong = [{**extras[0], "sha256": "cd" * 32}]
    with pytest.raises(BadInput, match=r"extra_sources\[0\]\.sha256") as exc:
        prep(src(repo, "v1.0", v1), tmp_path / "w2", extra_sources=wrong)
    assert sha_tar in str(exc.value) and "\n" not in str(exc.value)   # what the download really has
    assert not (tmp_path / "w2").exists()
    assert not [p for p in (tmp_path / "cache/sources/extra" / ("cd" * 32)).rglob("*") if p.is_file()]

