"""The wheelhouse's pages and journal (design.md §9), with small real wheels built by the tests."""

from __future__ import annotations

import hashlib
import html
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from urllib.parse import unquote, urljoin

import pytest
from wheelhouse_fixtures import REPO, comfy_env_matches, make_wheel, run_farm

from farm.errors import BadInput, PublishConflict, ShrinkRefused
from farm.wheelhouse import built_keys, check_links, index, prune, publish, read_journal, rebuild, verify

LINK = re.compile(r'<a ([^>]*)>([^<]*)</a>')
ATTR = re.compile(r'([\w-]+)="([^"]*)"')


def links(page: Path) -> list[dict]:
    """Each anchor of a page: its attributes (unescaped), 'text', and 'target' (resolved path under the house)."""
    out = []
    root = page
    while root.name and not (root / "manifest.jsonl").exists():
        root = root.parent
    base = "/" + page.relative_to(root).as_posix()
    for attrs, text in LINK.findall(page.read_text()):
        d = {k: html.unescape(v) for k, v in ATTR.findall(attrs)}
        d["raw"] = attrs
        d["text"] = html.unescape(text)
        url = d["href"].split("#", 1)[0]
        d["target"] = root / unquote(urljoin(base, url)).lstrip("/")
        out.append(d)
    return out


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def house(tmp_path):
    return tmp_path / "wh"


@pytest.fixture
def wheels(tmp_path):
    return tmp_path / "in"


def test_channel_link_carries_sha256_escaped_requires_python_and_both_metadata_attributes(house, wheels):
    w = make_wheel(wheels, requires_python=">=3.9,<3.14")
    publish([w], house)
    page = house / "cu128/torch2.8/drtk/index.html"
    (link,) = links(page)
    assert "%2B" in link["href"] and "+" not in link["href"]
    assert link["target"].is_file()
    assert link["href"].endswith("#sha256=" + sha(w))
    assert 'data-requires-python="&gt;=3.9,&lt;3.14"' in link["raw"]
    assert link["data-requires-python"] == ">=3.9,<3.14"
    sidecar = link["target"].with_name(link["target"].name + ".metadata")
    with zipfile.ZipFile(w) as zf:
        assert sidecar.read_bytes() == zf.read("drtk-0.1.0+cu128torch2.8.dist-info/METADATA")
    assert link["data-core-metadata"] == link["data-dist-info-metadata"] == "sha256=" + sha(sidecar)
    assert link["text"] == w.name
    # The same page as PEP 691 JSON, beside it.
    doc = json.loads((house / "cu128/torch2.8/drtk/index.json").read_text())
    (f,) = doc["files"]
    assert f["core-metadata"] == {"sha256": sha(sidecar)}
    assert "dist-info-metadata" not in f   # the JSON key pip 22.3 to 23.1 crash on (PEP 714)
    assert f["hashes"] == {"sha256": sha(w)} and f["requires-python"] == ">=3.9,<3.14" and f["yanked"] is False
    assert doc["meta"]["api-version"] == "1.1" and doc["versions"] == ["0.1.0+cu128torch2.8"]


def test_pages_rendered_in_an_older_format_are_all_rendered_again_by_the_next_publish(house, wheels):
    """A house whose pages an older farm wrote (here: a JSON page still naming `dist-info-metadata`, which
    pip 22.3 to 23.1 crash on) gets every page rendered again by the next publish, even of projects
    it does not touch, and loses the pages the journal no longer gives a place; with the current format
    stamp the same publish leaves those pages alone."""
    publish([make_wheel(wheels, "drtk", "0.1.0+cu128torch2.8")], house)
    page = house / "cu128/torch2.8/drtk/index.json"
    current = page.read_bytes()
    old_style = current.replace(b'"core-metadata"', b'"dist-info-metadata"')
    assert old_style != current

    page.write_bytes(old_style)   # the stamp says current: an untouched project's page is not rendered
    publish([make_wheel(wheels, "other", "0.1.0+cu128torch2.8")], house)
    assert page.read_bytes() == old_style

    # a page an older farm wrote that the journal gives no place now (a project folder of another
    # spelling, say): a publish of the current format leaves it, the re-render removes it
    dropped = house / "cu128/torch2.8/Old_Name"
    dropped.mkdir()
    (dropped / "index.html").write_bytes(b"<html></html>")
    (house / "packages/Old_Name.json").write_bytes(b"[]")
    publish([make_wheel(wheels, "fourth", "0.1.0+cu128torch2.8")], house)
    assert (dropped / "index.html").exists()

    (house / index.FORMAT_STAMP).write_text(f"{index.PAGE_FORMAT - 1}\n")
    publish([make_wheel(wheels, "third", "0.1.0+cu128torch2.8")], house)
    assert page.read_bytes() == current
    assert (house / index.FORMAT_STAMP).read_text().strip() == str(index.PAGE_FORMAT)
    assert not dropped.exists() and not (house / "packages/Old_Name.json").exists()
    assert (house / "cu128/torch2.8/fourth/index.html").exists() and (house / "packages/fourth.json").exists()


def test_torch_free_wheel_is_listed_in_every_torch_channel_of_its_cuda_line_and_no_other(house, wheels):
    ws = [make_wheel(wheels, version="0.1.0+cu128torch2.8"), make_wheel(wheels, version="0.1.0+cu128torch2.9"),
          make_wheel(wheels, version="0.1.0+cu130torch2.10"),
          make_wheel(wheels, name="tfree", version="1.0.0+cu128")]
    publish(ws, house)
    for channel in ("cu128/torch2.8", "cu128/torch2.9"):
        (link,) = links(house / channel / "tfree/index.html")
        assert link["text"] == "tfree-1.0.0+cu128-cp311-cp311-manylinux_2_34_x86_64.whl"
        assert 'href="tfree/"' in (house / channel / "index.html").read_text()
    assert not (house / "cu130/torch2.10/tfree").exists()
    assert "tfree" not in (house / "cu130/torch2.10/index.html").read_text()
    # A channel that opens later gets the line's torch-free wheels too.
    publish([make_wheel(wheels, version="0.1.0+cu128torch2.10")], house)
    assert [d["text"] for d in links(house / "cu128/torch2.10/tfree/index.html")] == [ws[3].name]


def test_declared_channel_lists_torch_free_wheels_before_any_torch_linked_wheel(house, wheels):
    house.mkdir()
    (house / "config.json").write_text(json.dumps({"channels": [["13.0", "2.13"]]}))
    publish([make_wheel(wheels, name="tfree", version="1.0.0+cu130")], house)
    assert [d["text"] for d in links(house / "cu130/torch2.13/tfree/index.html")] == [
        "tfree-1.0.0+cu130-cp311-cp311-manylinux_2_34_x86_64.whl"]


def test_project_folders_are_pep503_normalised_whatever_the_spelling(house, wheels):
    publish([make_wheel(wheels, name="My_Ext", version="0.2.0+cu128torch2.8"),
             make_wheel(wheels, name="Zope.Thing_X", version="1.0+cu128torch2.8")], house)
    assert (house / "files/my-ext").is_dir() and (house / "simple/my-ext/index.html").is_file()
    assert (house / "cu128/torch2.8/zope-thing-x/index.html").is_file()
    root = (house / "cu128/torch2.8/index.html").read_text()
    assert 'href="my-ext/"' in root and 'href="zope-thing-x/"' in root
    # comfy-env asks for lower case with '_' -> '-' (dots kept): both spellings exist.
    assert (house / "compat/comfy-env/zope.thing-x/index.html").is_file()
    assert (house / "compat/comfy-env/zope-thing-x/index.html").is_file()
    doc = json.loads((house / "simple/index.json").read_text())
    assert [p["name"] for p in doc["projects"]] == ["my-ext", "zope-thing-x"]


def test_every_string_reaching_html_is_escaped(house, wheels):
    """A build record's cell id reaches pages through the yank reason: a record is refused with markup in
    it (design.md §4.5), and one that reaches the journal some other way still arrives escaped."""
    from farm.wheelhouse.manifest import frame, unframe

    cell = 'x<script>alert("1")</script>&'
    with pytest.raises(BadInput, match="cell"):
        publish([make_wheel(wheels, build="9")], house, record={"cell": cell, "build_key": "k9"})
    for build in ("1", "2", "3"):
        w = make_wheel(wheels, build=build)
        publish([w], house, record={"cell": "drtk-cu128-torch2.8-py311", "build_key": f"k{build}"})
    journal = house / "manifest.jsonl"
    journal.write_text("".join(frame(unframe(line).replace('"cell":"drtk-cu128-torch2.8-py311"',
                                                           f'"cell":{json.dumps(cell)}')) + "\n"
                               for line in journal.read_text().splitlines()))
    (house / ".manifest.idx").unlink(missing_ok=True)
    rebuild(house)
    text = (house / "cu128/torch2.8/drtk/index.html").read_text()
    assert "<script>" not in text and "&lt;script&gt;" in text and "&amp;" in text
    yanked = [d for d in links(house / "cu128/torch2.8/drtk/index.html") if "data-yanked" in d]
    assert len(yanked) == 1 and cell in yanked[0]["data-yanked"]


def test_abi3_wheel_is_listed_once_per_channel_and_under_each_python_for_comfy_env(house, wheels):
    w = make_wheel(wheels, name="fused", version="0.3.0+cu128torch2.8", tags="cp310-abi3-manylinux_2_28_x86_64",
                   requires_python=">=3.10")
    publish([w], house, record={"pythons": ["3.10", "3.11", "3.12", "3.13"]})
    assert [d["text"] for d in links(house / "cu128/torch2.8/fused/index.html")] == [w.name]
    compat = (house / "compat/comfy-env/fused/index.html").read_text()
    for py in ("cp310", "cp311", "cp312", "cp313"):
        (hit,) = comfy_env_matches(compat, "128", "2.8", py, "manylinux_2_28_x86_64")
        assert "#" not in hit[0] and unquote(hit[0]).endswith(w.name)
    assert comfy_env_matches(compat, "128", "2.8", "cp314", "manylinux_2_28_x86_64") == []


def test_comfy_env_matcher_finds_every_wheel_of_each_channel_in_the_compat_view(house, wheels):
    ws = {
        ("128", "2.8", "cp311", "manylinux_2_34_x86_64"): make_wheel(wheels, version="0.1.0+cu128torch2.8"),
        ("128", "2.8", "cp312", "win_amd64"): make_wheel(wheels, version="0.1.0+cu128torch2.8",
                                                         tags="cp312-cp312-win_amd64"),
        ("130", "2.10", "cp312", "manylinux_2_28_aarch64"): make_wheel(
            wheels, version="0.1.0+cu130torch2.10", tags="cp312-cp312-manylinux_2_28_aarch64"),
        ("128", "2.9", "cp311", "manylinux_2_34_x86_64"): make_wheel(wheels, version="0.1.0+cu128torch2.9"),
    }
    tfree = make_wheel(wheels, version="0.1.0+cu128", tags="cp311-cp311-manylinux_2_34_x86_64")
    publish([*ws.values(), tfree], house)
    page = house / "compat/comfy-env/drtk/index.html"
    text = page.read_text()
    for (cu, torch, py, plat), w in ws.items():
        hits = [(unquote(h).rsplit("/", 1)[1], t) for h, t in comfy_env_matches(text, cu, torch, py, plat)]
        assert (w.name, w.name) in hits  # anchor text equal to the exact file name, href to it
    for torch in ("2.8", "2.9"):  # torch-free: under each torch label of its line, href to the real file
        hits = [h for h, _ in comfy_env_matches(text, "128", torch, "cp311", "manylinux_2_34_x86_64")
                if "%2Bcu128-" in h]
        assert len(hits) == 1
    for d in links(page):
        assert "#" not in d["href"] and d["target"].is_file()


def test_packages_json_lists_every_wheel_with_its_cell(house, wheels):
    w = make_wheel(wheels, tags="cp312-cp312-manylinux_2_28_aarch64", version="0.1.0+cu130torch2.10")
    publish([w], house, record={"cell": "drtk-cu130-torch2.10-py312-aarch64", "build_key": "abc123",
                                "arch_list": ["9.0", "10.0", "11.0", "12.0+PTX"]})
    doc = json.loads((house / "packages.json").read_text())
    (entry,) = doc["wheels"]
    assert {k: entry[k] for k in (
        "project", "version", "cuda", "torch", "python", "platform", "arch_list", "sha256", "build_key")} == {
        "project": "drtk", "version": "0.1.0+cu130torch2.10", "cuda": "13.0", "torch": "2.10",
        "python": "cp312", "platform": "linux_aarch64", "arch_list": "9.0 10.0 11.0 12.0+PTX",
        "sha256": sha(w), "build_key": "abc123"}
    assert entry["channels"] == ["cu130/torch2.10/"]
    assert doc["channels"] == [{"cuda": "13.0", "torch": "2.10", "url": "cu130/torch2.10/"}]
    assert built_keys(house) == {"abc123"}


@pytest.mark.parametrize("file, problem", [
    ("drtk.whl", "not a wheel file name"),
    ("drtk-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl", "local version label"),
    ("drtk-0.1.0+cpu-cp311-cp311-manylinux_2_34_x86_64.whl", "+cuNNN"),
])
def test_unparseable_wheel_name_is_one_line_exit_2_and_nothing_written(tmp_path, file, problem):
    good = make_wheel(tmp_path / "in")
    bad = tmp_path / "in" / file
    bad.write_bytes(good.read_bytes())
    proc = run_farm("publish", good, bad, "--wheelhouse", tmp_path / "wh", check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and file in lines[0] and problem in lines[0], lines
    assert not (tmp_path / "wh" / "manifest.jsonl").exists()
    assert not list((tmp_path / "wh").rglob("*.whl"))


def test_metadata_that_disagrees_with_the_file_name_is_refused(house, tmp_path):
    w = make_wheel(tmp_path / "a", version="0.1.0+cu128torch2.8")
    renamed = tmp_path / "drtk-0.2.0+cu128torch2.8-cp311-cp311-manylinux_2_34_x86_64.whl"
    renamed.write_bytes(w.read_bytes())
    with pytest.raises(BadInput, match="METADATA Version"):
        publish([renamed], house)
    assert not (house / "manifest.jsonl").exists()


def test_a_published_name_never_takes_other_bytes_and_the_same_bytes_are_a_noop(house, tmp_path):
    w = make_wheel(tmp_path / "a")
    publish([w], house)
    stamps = {p: p.stat().st_mtime_ns for p in house.rglob("*") if p.is_file() and p.name != ".lock"}
    again = publish([w], house)
    assert again.published == [] and [e.file for e in again.already] == [w.name]
    assert again.pages == []   # every page was already right: none rewritten, none counted
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    other = make_wheel(tmp_path / "b", payload="x = 1\n")
    assert other.name == w.name
    with pytest.raises(PublishConflict, match="higher build number"):
        publish([other], house)
    assert sha(house / "files/drtk" / w.name) == sha(w)
    assert len(read_journal(house).entries) == 1
    assert not [p for p in (house / "files/drtk").iterdir() if p.name.startswith(".")]


def test_retention_keeps_the_last_two_builds_of_a_cell_and_yanks_older_then_prune_deletes_them(house, wheels):
    for build in ("1", "2", "3", "4"):
        publish([make_wheel(wheels, build=build)], house,
                record={"cell": "drtk-cu128-torch2.8-py311", "build_key": f"key{build}"})
    publish([make_wheel(wheels, version="0.1.0+cu128torch2.9")], house, record={"build_key": "other"})
    ls = {d["text"]: d for d in links(house / "cu128/torch2.8/drtk/index.html")}
    assert len(ls) == 4  # yanked files stay listed (PEP 592)
    yanked = sorted(t for t, d in ls.items() if "data-yanked" in d)
    assert [t.split("-")[2] for t in yanked] == ["1", "2"]
    assert "retention" in ls[yanked[0]]["data-yanked"]
    doc = json.loads((house / "cu128/torch2.8/drtk/index.json").read_text())
    assert sorted(f["filename"].split("-")[2] for f in doc["files"] if f["yanked"]) == ["1", "2"]
    assert built_keys(house) == {"key3", "key4", "other"}
    compat = (house / "compat/comfy-env/drtk/index.html").read_text()
    assert "-1-cp311" not in compat and "-3-cp311" in compat  # comfy-env only sees what it may pick

    assert prune(house, "2000-01-01").removed == []  # nothing that old
    result = prune(house, "2999-01-01")
    assert sorted(f.split("-")[2] for f in result.removed) == ["1", "2"]
    assert [d["text"].split("-")[2] for d in links(house / "cu128/torch2.8/drtk/index.html")] == ["3", "4"]
    assert not list((house / "files/drtk").glob("drtk-0.1.0+cu128torch2.8-1-*"))
    assert check_links(house) == [] and verify(house) == []
    assert len(read_journal(house).entries) == 3


def test_rebuild_refuses_to_shrink_a_project_or_channel_unless_allowed(house, wheels):
    publish([make_wheel(wheels), make_wheel(wheels, version="0.1.0+cu130torch2.13",
                                            tags="cp312-cp312-manylinux_2_28_x86_64")], house)
    gone = house / "files/drtk/drtk-0.1.0+cu130torch2.13-cp312-cp312-manylinux_2_28_x86_64.whl"
    gone.unlink()
    page = house / "cu130/torch2.13/drtk/index.html"
    before = page.read_bytes()
    proc = run_farm("index", "rebuild", "--wheelhouse", house, check=False)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert "fewer wheels" in line and "--allow-shrink" in line and gone.name in line
    assert page.read_bytes() == before
    with pytest.raises(ShrinkRefused):
        rebuild(house)
    result = rebuild(house, allow_shrink=True)
    assert result.missing == [gone.name]
    assert not page.exists() and not (house / "cu130/torch2.13/index.html").exists()
    assert [d["text"] for d in links(house / "simple/drtk/index.html")] == [
        "drtk-0.1.0+cu128torch2.8-cp311-cp311-manylinux_2_34_x86_64.whl"]
    assert check_links(house) == []


def test_rebuild_reproduces_the_published_pages_without_opening_a_wheel(house, wheels):
    ws = [make_wheel(wheels, version=v, tags=t) for v, t in (
        ("0.1.0+cu128torch2.8", "cp311-cp311-manylinux_2_34_x86_64"),
        ("0.1.0+cu128", "cp310-abi3-win_amd64"),
        ("0.1.0+cu130torch2.10", "cp312-cp312-manylinux_2_28_aarch64"))]
    for w in ws:
        publish([w], house)
    pages = {p: p.read_bytes() for p in house.rglob("index.*")} | {house / "packages.json": (house / "packages.json").read_bytes()}
    for p in pages:
        p.unlink()
    hook = (
        "import sys, os\n"
        "def hook(event, args):\n"
        "    if event == 'open' and str(args[0]).endswith('.whl'):\n"
        "        os.write(2, b'opened a wheel body: ' + str(args[0]).encode() + b'\\n'); os._exit(3)\n"
        "sys.addaudithook(hook)\n"
        "from farm.cli import main\n"
        f"sys.exit(main(['index', 'rebuild', '--wheelhouse', {str(house)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    for p, data in pages.items():
        assert p.read_bytes() == data, p


def test_verify_rehashes_and_reports_a_corrupted_wheel(house, wheels):
    w = make_wheel(wheels)
    publish([w], house)
    assert verify(house) == []
    target = house / "files/drtk" / w.name
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    problems = verify(house)
    assert any("sha256" in p and w.name in p for p in problems)
    proc = run_farm("index", "verify", "--wheelhouse", house, check=False)
    assert proc.returncode == 1 and w.name in proc.stdout


def test_build_record_must_agree_with_the_label_and_name_its_wheel(house, wheels, tmp_path):
    w = make_wheel(wheels)
    rec = tmp_path / "build.json"
    rec.write_text(json.dumps({"cuda": "13.0", "build_key": "k"}))
    proc = run_farm("publish", w, "--record", rec, "--wheelhouse", house, check=False)
    assert proc.returncode == 2 and "cuda" in proc.stderr and "12.8" in proc.stderr
    rec.write_text("{not json")
    proc = run_farm("publish", w, "--record", rec, "--wheelhouse", house, check=False)
    assert proc.returncode == 2 and "build.json" in proc.stderr and "not JSON" in proc.stderr
    w2 = make_wheel(wheels, version="0.1.0+cu128torch2.9")
    rec.write_text(json.dumps([{"wheel": w.name, "build_key": "k1", "cell": "drtk-cu128-torch2.8-py311"},
                               {"wheel": w2.name, "build_key": "k2"}]))
    run_farm("publish", w, w2, "--record", rec, "--wheelhouse", house)
    entries = {e.file: e for e in read_journal(house).entries}
    assert entries[w.name].build_key == "k1" and entries[w2.name].cell == "drtk-cu128-torch2.9-py311"
    assert built_keys(house) == {"k1", "k2"}


def test_a_torn_journal_tail_is_ignored_and_cut_by_the_next_publish(house, wheels):
    publish([make_wheel(wheels)], house)
    with open(house / "manifest.jsonl", "a") as fh:
        fh.write('{"op":"add","file":"half-writ')
    assert len(read_journal(house).entries) == 1
    result = publish([make_wheel(wheels, version="0.1.0+cu128torch2.9")], house)
    assert any("cut the torn last record" in note for note in result.notes)  # said, not silent
    lines = (house / "manifest.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["op"] == "add" for line in lines)


def test_built_keys_of_a_house_that_does_not_exist_is_empty(tmp_path):
    assert built_keys(tmp_path / "nowhere") == set()


def test_incremental_publishes_through_the_journal_cache_give_the_pages_a_rebuild_gives(house, wheels, monkeypatch):
    """Publishes read the journal through .manifest.idx (rewritten every CACHE_EVERY lines); whatever the
    cache state (fresh, stale, torn journal tail, foreign), the pages equal a full rebuild's."""
    from farm.wheelhouse import journalindex

    monkeypatch.setattr(journalindex, "CACHE_EVERY", 3)
    labels = ["cu128torch2.8", "cu128", "cu128torch2.9", "cu130torch2.10", "cu130", "cu128torch2.10"]
    for i in range(14):
        name = ["drtk", "tfree", "My_Ext"][i % 3]
        publish([make_wheel(wheels, name, f"0.{i}.0+{labels[i % len(labels)]}")], house,
                record={"cell": f"{name.lower()}-cu128-py31{i % 4}"})
        if i == 6:
            with open(house / "manifest.jsonl", "a") as fh:
                fh.write('{"op":"add","file":"torn')
        if i == 9:
            (house / ".manifest.idx").write_bytes(b"not a pickle")
    assert (house / ".manifest.idx").is_file()
    pages = {p: p.read_bytes() for p in [*house.rglob("index.*"), *house.glob("packages*.json"),
                                         *house.glob("packages/*.json")]}
    for p in pages:
        p.unlink()
    (house / ".manifest.idx").unlink()
    rebuild(house)
    for p, data in pages.items():
        assert p.read_bytes() == data, p
    assert sorted(p.relative_to(house) for p in house.rglob("index.*")) == sorted(
        p.relative_to(house) for p in pages if p.name.startswith("index."))


def test_a_configured_file_base_url_is_where_every_href_points(house, wheels):
    house.mkdir()
    (house / "config.json").write_text(json.dumps({"file_base_url": "https://files.example.org/farm/"}))
    w = make_wheel(wheels)
    publish([w], house)
    (link,) = links(house / "cu128/torch2.8/drtk/index.html")
    assert link["href"] == f"https://files.example.org/farm/drtk/{w.name.replace('+', '%2B')}#sha256={sha(w)}"
    compat = (house / "compat/comfy-env/drtk/index.html").read_text()
    assert 'href="https://files.example.org/farm/drtk/drtk-0.1.0%2Bcu128torch2.8-' in compat
    (house / "config.json").write_text(json.dumps({"file_base_url": "ftp://nope"}))
    with pytest.raises(BadInput, match="file_base_url"):
        rebuild(house)
