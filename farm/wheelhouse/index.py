"""Index pages from the manifest: PEP 503 HTML + PEP 691 JSON, channels, the comfy-env view, packages.json.

Every page is a pure function of the journal (plus the optional
`config.json`), so `rebuild` and an incremental publish produce the same
bytes. Nothing here opens a wheel: hashes, sizes and Requires-Python come
from the manifest (design.md §9.2).

Layout (relative to the wheelhouse):
  files/<project>/<wheel>[.metadata]
  simple/[<project>/]index.{html,json}                 every wheel
  cu<NNN>/torch<M.m>/[<project>/]index.{html,json}     one channel, a PEP 503 root
  compat/comfy-env/[<hyphen-name>/]index.html          comfy-env's matcher view
  packages.json
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from farm.errors import BadInput, ShrinkRefused
from farm.settings import display
from farm.versions import cuda_tag, vtuple
from farm.wheelhouse.journalindex import JournalIndex, Summary
from farm.wheelhouse.manifest import KEEP_PER_CELL, ManifestEntry, fsync_dir, step
from farm.wheelhouse.names import channel_root, hyphen_name
from farm.wheelhouse.offers import channel_offers, offer_body

SIMPLE = "simple"
COMPAT = "compat/comfy-env"
PACKAGES = "packages.json"
PACKAGES_DIR = "packages"
CONFIG = "config.json"
FILES = "files"
PUT_BACK = "put the real folder in its place"   # what no command guesses for a files/ it cannot see (design.md §9.5)
API_VERSION = "1.1"
# The format of the pages render() writes: raise it when an unchanged journal's pages would get other bytes,
# and the next publish renders every page again (design.md §9.3). FORMAT_STAMP: the house's; none = stale.
PAGE_FORMAT = 2
FORMAT_STAMP = ".pages-format"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
# Platforms a platform-independent wheel is repeated under in the comfy-env view.
ANY_PLATFORMS = ("linux_x86_64", "linux_aarch64", "win_amd64")

_REGISTRY = re.compile(r"[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+")


@dataclass(frozen=True)
class Config:
    """Optional `config.json` in the wheelhouse.

    file_base_url: hrefs point there (object storage, release assets) instead of ../files/.
    channels: [["12.8", "2.8"], ...] channels that exist even before a torch-linked wheel lands in them,
              so torch-free wheels of that CUDA line are listed there (e.g. the grid's rows).
    image_registry: a repository (`ghcr.io/org/farm-builder`) the CI build jobs pull the builder image
              from, tagged `<arch>-<key>` as the local image, instead of building it once per run.
    """

    file_base_url: str | None = None
    channels: tuple[tuple[str, str], ...] = ()
    image_registry: str | None = None

    @classmethod
    def load(cls, root: Path) -> Config:
        path = Path(root) / CONFIG
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadInput(display(path), None, None, f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadInput(display(path), None, None, "expected a JSON object")
        base = data.get("file_base_url")
        if base is not None and not (isinstance(base, str) and base.startswith(("http://", "https://"))):
            raise BadInput(display(path), "file_base_url", base, "expected an http(s) URL")
        channels = []
        for item in data.get("channels", []):
            try:
                cuda, torch = item
                vtuple(cuda), vtuple(torch)
            except (ValueError, TypeError):
                raise BadInput(display(path), "channels", item, "expected [cuda, torch minor], e.g. ['12.8', '2.8']") from None
            channels.append((cuda, torch))
        registry = data.get("image_registry")
        if registry is not None and not (isinstance(registry, str) and _REGISTRY.fullmatch(registry)):
            raise BadInput(display(path), "image_registry", registry,
                           "expected a repository without scheme or tag, e.g. ghcr.io/org/farm-builder")
        return cls(base.rstrip("/") if base else None, tuple(channels), registry)


def channel_lines(summaries: Iterable[Summary], config: Config) -> dict[str, list[str]]:
    """CUDA line -> torch minors with a channel: where torch-linked wheels are, plus config.json's channels."""
    lines: dict[str, set[str]] = defaultdict(set)
    for s in summaries:
        for cuda, torch in s.linked:
            lines[cuda].add(torch)
    for cuda, torch in config.channels:
        lines[cuda].add(torch)
    return {c: sorted(ts, key=vtuple) for c, ts in lines.items()}


def project_roots(summary: Summary, lines: dict[str, list[str]]) -> set[str]:
    roots = {SIMPLE} | {channel_root(c, t) for c, t in summary.linked}
    return roots | {channel_root(c, t) for c in summary.free for t in lines.get(c, ())}


@dataclass
class House:
    """The journal's live entries with what derives from them: yanks and the channels of each CUDA line."""

    entries: list[ManifestEntry]
    config: Config = field(default_factory=Config)
    yanked: dict[str, str] = field(default_factory=dict)         # file -> reason
    lines: dict[str, list[str]] = field(default_factory=dict)    # cuda -> torch minors with a channel

    @classmethod
    def derive(cls, entries: Iterable[ManifestEntry], config: Config | None = None,
               lines: dict[str, list[str]] | None = None) -> House:
        """`entries`: whole projects (retention is per cell, cells are per project). `lines`: the
        channels of each CUDA line when `entries` is not the whole house (see channel_lines)."""
        entries = list(entries)
        house = cls(entries, config or Config())
        by_cell: dict[tuple[str, str], list[ManifestEntry]] = defaultdict(list)
        for e in entries:  # publish order: the journal's order
            by_cell[(e.project, e.cell)].append(e)
        for (_, cell), group in by_cell.items():
            for old in group[:-KEEP_PER_CELL]:
                house.yanked[old.file] = f"superseded: retention keeps the last {KEEP_PER_CELL} builds of {cell}"
        house.lines = lines if lines is not None else channel_lines([Summary.of(entries)], house.config)
        return house

    def channels_of(self, e: ManifestEntry) -> list[tuple[str, str]]:
        if e.torch:
            return [(e.cuda, e.torch)]
        return [(e.cuda, t) for t in self.lines.get(e.cuda, ())]

    def channels(self) -> list[tuple[str, str]]:
        return [(c, t) for c in sorted(self.lines, key=vtuple) for t in self.lines[c]]


@functools.lru_cache(maxsize=65536)
def _quoted(project: str, file: str) -> str:
    return f"{quote(project, safe='')}/{quote(file, safe='')}"  # '+' becomes %2B


def _file_href(house: House, e: ManifestEntry, prefix: str) -> str:
    rel = _quoted(e.project, e.file)
    return f"{house.config.file_base_url}/{rel}" if house.config.file_base_url else f"{prefix}{FILES}/{rel}"


def _doc(title: str, body: list[str]) -> bytes:
    return ("<!DOCTYPE html>\n<html>\n<head>\n<meta charset=\"utf-8\">\n"
            f"<meta name=\"pypi:repository-version\" content=\"{API_VERSION}\">\n"
            f"<title>{escape(title)}</title>\n</head>\n<body>\n<h1>{escape(title)}</h1>\n"
            + "".join(line + "\n" for line in body) + "</body>\n</html>\n").encode("utf-8")


def _json(obj: object) -> bytes:
    return (json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")


class Site:
    """Every index page of one House: a signature per page (to find what changed) and its rendering."""

    def __init__(self, house: House, summaries: dict[str, Summary] | None = None):
        """All pages of `house`; or, given the Summary of every project in the journal, the pages of
        the projects in `house` plus every root page (a publish renders only what it touches)."""
        self.house = house
        self._parts: dict[str, tuple[str, str, str, str]] = {}
        # page key (folder relative to the wheelhouse) -> ("root"|"project"|"compat"|"compat-root", data)
        self.kind: dict[str, str] = {}
        self.listing: dict[str, list[Any]] = {}
        roots: dict[str, dict[str, list[ManifestEntry]]] = defaultdict(lambda: defaultdict(list))
        compat: dict[str, list[tuple[str, ManifestEntry]]] = defaultdict(list)
        for e in house.entries:
            roots[SIMPLE][e.project].append(e)
            for cuda, torch in house.channels_of(e):
                roots[channel_root(cuda, torch)][e.project].append(e)
            if e.file not in house.yanked:  # comfy-env cannot read data-yanked; it only sees what it may pick
                anchors = self._compat_anchors(e)
                for folder in {hyphen_name(e.name), e.project}:
                    compat[folder].extend((a, e) for a in anchors)
        if summaries is None:
            by_project: dict[str, list[ManifestEntry]] = defaultdict(list)
            for e in house.entries:
                by_project[e.project].append(e)
            self.offers = channel_offers({p: Summary.of(es) for p, es in by_project.items()}, house.lines)
        else:
            self.offers = channel_offers({p: s for p, s in summaries.items() if s.folders}, house.lines)
        if summaries is not None:
            root_projects: dict[str, set[str]] = defaultdict(set)
            folders: set[str] = set()
            for project, summary in summaries.items():
                for root in project_roots(summary, house.lines) if summary.folders else ():
                    root_projects[root].add(project)
                folders.update(summary.folders)
        else:
            root_projects = {root: set(projects) for root, projects in roots.items()}
            folders = set(compat)
        for root, names in root_projects.items():
            self.kind[root] = "root"
            self.listing[root] = sorted(names)
        if folders:
            self.kind[COMPAT] = "compat-root"
            self.listing[COMPAT] = sorted(folders)
        for root, projects in roots.items():
            for project, entries in projects.items():
                key = f"{root}/{project}"
                self.kind[key] = "project"
                self.listing[key] = sorted(entries, key=lambda e: e.file)
        for folder, pairs in compat.items():
            key = f"{COMPAT}/{folder}"
            self.kind[key] = "compat"
            self.listing[key] = sorted({(a, e.file): (a, e) for a, e in pairs}.values(), key=lambda p: p[0])

    # ------------------------------------------------------------ comfy-env

    def _compat_anchors(self, e: ManifestEntry) -> list[str]:
        """Anchor texts comfy-env's matcher needs: +cuNNNtorchM.m, cpXY and a Linux / win_amd64 platform.

        A cpXY-cpXY torch-linked wheel is listed under its own name. Torch-free
        wheels are repeated under each torch label of their CUDA line, abi3 and
        py3-none wheels under each Python they serve, platform-independent ones
        under each platform; the href always goes to the real file.
        """
        if e.torch and e.abi_tag not in ("abi3", "none") and e.platform_tag != "any":
            return [e.file]
        public = e.version.split("+", 1)[0]
        build = f"-{e.build_tag}" if e.build_tag else ""
        cu = cuda_tag(e.cuda)
        torches = [e.torch] if e.torch else self.house.lines.get(e.cuda, [])
        if e.abi_tag in ("abi3", "none"):
            pytags = ["cp" + p.replace(".", "") for p in e.pythons] or [e.python_tag]
        else:
            pytags = [e.python_tag]
        platforms = ANY_PLATFORMS if e.platform_tag == "any" else (e.platform_tag,)
        return [f"{e.name}-{public}+{cu}torch{t}{build}-{py}-{e.abi_tag}-{plat}.whl"
                for t in torches for py in pytags for plat in platforms]

    # ------------------------------------------------------------ signatures

    def signatures(self) -> dict[str, tuple[Any, ...]]:
        sig: dict[str, tuple[Any, ...]] = {}
        y = self.house.yanked
        for key, kind in self.kind.items():
            items = self.listing[key]
            if kind == "project":
                sig[key] = tuple((e.file, e.sha256, y.get(e.file)) for e in items)
            elif kind == "compat":
                sig[key] = tuple((a, e.file, e.sha256) for a, e in items)
            else:   # a channel's root also says what it serves
                sig[key] = (tuple(items), self.offers.get(key))
        return sig

    def counts(self) -> dict[str, int]:
        """Wheels listed per project page and per root (for refuse-to-shrink)."""
        out: dict[str, int] = {}
        for key, kind in self.kind.items():
            if kind == "project":
                out[key] = len(self.listing[key])
                root = key.rsplit("/", 1)[0]
                out[root] = out.get(root, 0) + len(self.listing[key])
        return out

    # ------------------------------------------------------------ rendering

    def render(self, key: str) -> dict[str, bytes]:
        """Files (relative to the wheelhouse) of one page."""
        kind = self.kind[key]
        items = self.listing[key]
        prefix = "../" * (key.count("/") + 1)
        if kind in ("root", "compat-root"):
            title = "Simple index" if kind == "root" else "comfy-env view"
            body = [f'<a href="{escape(quote(p, safe=""))}/">{escape(p)}</a><br>' for p in items]
            if key in self.offers:
                body = offer_body(self.offers[key]) + body
            out = {f"{key}/index.html": _doc(title, body)}
            if kind == "root":
                out[f"{key}/index.json"] = _json({"meta": {"api-version": API_VERSION},
                                                  "projects": [{"name": p} for p in items]})
            return out
        project = key.rsplit("/", 1)[1]
        if kind == "compat":
            # No #sha256 fragment: comfy-env's matcher wants hrefs that end in .whl.
            body = [f'<a href="{escape(_file_href(self.house, e, prefix))}">{escape(a)}</a><br>' for a, e in items]
            return {f"{key}/index.html": _doc(f"Links for {project}", body)}
        body, files = [], []
        for e in items:
            line, record = self._link(e, prefix)
            body.append(line)
            files.append(record)
        versions = json.dumps(sorted({e.version for e in items}), separators=(",", ":"))
        head = json.dumps({"api-version": API_VERSION}, separators=(",", ":"))
        page = (f'{{"files":[{",".join(files)}],"meta":{head},"name":{json.dumps(project)},'
                f'"versions":{versions}}}\n')
        return {f"{key}/index.html": _doc(f"Links for {project}", body), f"{key}/index.json": page.encode("utf-8")}

    def _link(self, e: ManifestEntry, prefix: str) -> tuple[str, str]:
        """One file's anchor and its PEP 691 file record (JSON text) on a page `prefix` below the root.

        The prefix-free parts are computed once per file: a wheel sits on
        several pages (simple/, its channels), each render only splices them.
        """
        parts = self._parts.get(e.file)
        if parts is None:
            y = self.house.yanked
            md = f"sha256={escape(e.metadata_sha256)}"
            attrs = f'#sha256={escape(e.sha256)}"'
            if e.requires_python:
                attrs += f' data-requires-python="{escape(e.requires_python)}"'
            attrs += f' data-dist-info-metadata="{md}" data-core-metadata="{md}"'
            if e.file in y:
                attrs += f' data-yanked="{escape(y[e.file])}"'
            dumps = json.dumps
            meta = dumps({"sha256": e.metadata_sha256})
            # JSON names the sidecar `core-metadata` only (PEP 714): pip 22.3 to 23.1 crash on a JSON
            # `dist-info-metadata` whatever its value, and a user's venv of Python 3.10 or 3.11 often
            # bundles such a pip. HTML keeps both names: those pips read its attribute as text.
            record = (f',"hashes":{dumps({"sha256": e.sha256})},"requires-python":{dumps(e.requires_python)},'
                      f'"core-metadata":{meta},"yanked":{dumps(y.get(e.file, False))},'
                      f'"size":{int(e.size)},"upload-time":{dumps(e.published or None)}}}')
            parts = self._parts[e.file] = (attrs, f">{escape(e.file)}</a><br>", f'{{"filename":{dumps(e.file)}', record)
        attrs, text, filename, record = parts
        href = _file_href(self.house, e, prefix)
        return (f'<a href="{escape(href)}{attrs}{text}', f'{filename},"url":{json.dumps(href)}{record}')

    def fragments(self) -> dict[str, bytes]:
        """packages/<project>.json of each project in the house: its wheels, as packages.json lists them."""
        h = self.house
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for e in sorted(h.entries, key=lambda e: (e.project, e.file)):
            out[e.project].append({
                "file": e.file, "url": _file_href(h, e, ""), "project": e.project, "version": e.version,
                "cuda": e.cuda, "torch": e.torch, "python": e.python_tag, "pythons": list(e.pythons),
                "platform": e.platform, "arch_list": e.arch_list, "sha256": e.sha256,
                "build_key": e.build_key, "cell": e.cell, "requires_python": e.requires_python,
                "yanked": h.yanked.get(e.file, False),
                "channels": [channel_root(c, t) + "/" for c, t in h.channels_of(e)],
            })
        return {p: _json(ws) for p, ws in out.items()}


def assemble_packages(root: Path, lines: dict[str, list[str]], projects: Iterable[str],
                      fresh: dict[str, bytes], fragment_of: Callable[[str], bytes] | None) -> bytes:
    """packages.json from per-project fragments: fresh ones in memory, the rest as written on disk.

    Concatenation, no re-encoding: a publish that touched one project does not serialise 15,000 wheels.
    `fragment_of(project)` regenerates a fragment missing on disk.
    """
    parts = []
    for project in sorted(projects):
        data = fresh.get(project)
        if data is None:
            try:
                data = (root / PACKAGES_DIR / f"{project}.json").read_bytes()
            except FileNotFoundError:
                assert fragment_of is not None, f"no packages fragment of {project} and no way to make one"
                data = fragment_of(project)
        inner = data.strip()[1:-1]
        if inner:
            parts.append(inner)
    channels = [{"cuda": c, "torch": t, "url": channel_root(c, t) + "/"}
                for c in sorted(lines, key=vtuple) for t in lines[c]]
    return (b'{"channels":' + json.dumps(channels, separators=(",", ":")).encode() + b',"wheels":['
            + b",".join(parts) + b"]}\n")


# ---------------------------------------------------------------- writing

def write_files(root: Path, files: list[tuple[str, bytes]]) -> set[str]:
    """Atomic writes of many files: all to temporaries, fsynced together, then renamed in the given order.

    fsync is the cost of an index write (a journal commit each); issued from
    a thread pool they share commits, 10-30x faster than one after another.
    A crash at any point leaves each file either old or new, never partial. Returns the files replaced.
    """
    made: set[Path] = set()
    temps = []
    for rel, data in files:
        path = root / rel
        if _same_bytes(path, data):
            continue  # replacing a file is the dear part (and on a `discard` mount very dear): skip no-ops
        if path.parent not in made:
            path.parent.mkdir(parents=True, exist_ok=True)
            made.add(path.parent)
        tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(data)
        temps.append((tmp, path, rel))
    _parallel_fsync([t for t, _, _ in temps], files=True)
    for tmp, path, rel in temps:
        os.replace(tmp, path)
        step(f"page {rel}")
    _parallel_fsync(sorted(made), files=False)
    return {rel for _, _, rel in temps}


def _same_bytes(path: Path, data: bytes) -> bool:
    try:
        if os.stat(path).st_size != len(data):
            return False
        with open(path, "rb") as fh:
            return fh.read() == data
    except FileNotFoundError:
        return False


def _fsync_path(path: Path, directory: bool) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parallel_fsync(paths: list[Path], files: bool) -> None:
    if len(paths) <= 1:
        for p in paths:
            _fsync_path(p, not files)
        return
    with ThreadPoolExecutor(max_workers=min(32, len(paths))) as pool:
        list(pool.map(lambda p: _fsync_path(p, not files), paths))


def write_file(root: Path, rel: str, data: bytes) -> None:
    write_files(root, [(rel, data)])


def _page_files(key: str, kind: str) -> list[str]:
    return [f"{key}/index.html"] + ([f"{key}/index.json"] if kind in ("root", "project") else [])


def write_pages(root: Path, site: Site, keys: Iterable[str], extra: Sequence[tuple[str, bytes]] = ()) -> set[str]:
    """Write the given pages (leaf pages before the roots that link them), then `extra` files; returns
    the files whose bytes changed."""
    files: list[tuple[str, bytes]] = []
    for key in sorted(keys, key=lambda k: (site.kind[k] in ("root", "compat-root"), k)):
        files.extend(site.render(key).items())
    files.extend(extra)
    return write_files(root, files)


def remove_pages(root: Path, keys: Iterable[str], kinds: dict[str, str]) -> None:
    for key in keys:
        for rel in _page_files(key, kinds.get(key, "project")):
            (root / rel).unlink(missing_ok=True)
        try:
            (root / key).rmdir()
        except OSError:
            pass


def update(root: Path, before: Site | None, after: Site, projects: Iterable[str] | None = None,
           fragment_of: Callable[[str], bytes] | None = None) -> list[str]:
    """Regenerate only the pages whose listing changed; returns the keys of those whose bytes changed.

    `before` and `after` cover the same projects (all of them, or the ones a
    publish touched, with every root page). `projects`: every project in the
    house, for packages.json (default: those of `after`). Stale pages
    (listed before, empty now) are removed after the pages that linked them
    are rewritten.
    """
    old = before.signatures() if before else {}
    new = after.signatures()
    changed = {k for k, s in new.items() if old.get(k) != s}
    fresh = after.fragments()
    if projects is None:
        projects = sorted(fresh)
    packages = assemble_packages(root, after.house.lines, projects, fresh, fragment_of)
    extra = [(f"{PACKAGES_DIR}/{p}.json", data) for p, data in sorted(fresh.items())] + [(PACKAGES, packages)]
    written = write_pages(root, after, changed, extra)
    stale = [k for k in old if k not in new]
    if stale and before:     # stale keys come from `before`'s pages: none without it
        remove_pages(root, stale, before.kind)
    gone = {e.project for e in before.house.entries} - set(fresh) if before else set()
    for project in gone:
        (root / PACKAGES_DIR / f"{project}.json").unlink(missing_ok=True)
    return sorted(k for k in changed if any(f in written for f in _page_files(k, after.kind[k])))


def pages_current(root: Path) -> bool:
    """Whether the house's pages were last rendered in this PAGE_FORMAT."""
    try:
        return (root / FORMAT_STAMP).read_text().strip() == str(PAGE_FORMAT)
    except FileNotFoundError:
        return False


def stamp_pages_format(root: Path) -> None:
    """Say that every page of the house is now rendered in this PAGE_FORMAT (after they are written)."""
    write_files(root, [(FORMAT_STAMP, f"{PAGE_FORMAT}\n".encode())])


def unpaged(root: Path, summaries: dict[str, Summary], lines: dict[str, list[str]]) -> list[str]:
    """Projects of the journal missing one of their own pages (a publisher died between its journal append
    and its pages). One stat per (project, root): cheap next to rendering, so every publish can afford it."""
    missing = []
    for project, summary in summaries.items():
        pages = [f"{r}/{project}/index.html" for r in project_roots(summary, lines)]
        pages += [f"{COMPAT}/{folder}/index.html" for folder in summary.folders]
        if not all((root / page).is_file() for page in pages):
            missing.append(project)
    return sorted(missing)


def existing_counts(root: Path) -> dict[str, int]:
    """Wheels listed now on disk, per project page and per root, counted from the pages themselves."""
    out: dict[str, int] = {}
    candidates = list(root.glob(f"{SIMPLE}/*/index.html")) + list(root.glob("cu*/torch*/*/index.html"))
    for page in candidates:
        key = page.parent.relative_to(root).as_posix()
        n = page.read_bytes().count(b"<a ")
        out[key] = n
        parent = key.rsplit("/", 1)[0]
        out[parent] = out.get(parent, 0) + n
    return out


def existing_page_keys(root: Path) -> dict[str, str]:
    keys: dict[str, str] = {}
    for pattern, kind in ((f"{SIMPLE}/*/index.html", "project"), ("cu*/torch*/*/index.html", "project"),
                          (f"{COMPAT}/*/index.html", "compat"), (f"{SIMPLE}/index.html", "root"),
                          ("cu*/torch*/index.html", "root"), (f"{COMPAT}/index.html", "compat-root")):
        for page in root.glob(pattern):
            keys[page.parent.relative_to(root).as_posix()] = kind
    return keys


def packages_files(root: Path, site: Site) -> list[tuple[str, bytes]]:
    """packages/<project>.json of every project of a whole-house Site, then packages.json."""
    fragments = site.fragments()
    packages = assemble_packages(root, site.house.lines, fragments, fragments, None)
    return [(f"{PACKAGES_DIR}/{p}.json", data) for p, data in sorted(fragments.items())] + [(PACKAGES, packages)]


def drop_unlisted(root: Path, site: Site, on_disk: dict[str, str]) -> None:
    """After a whole-house Site's pages are written: remove the pages on disk before (`on_disk`) it
    no longer has, and the packages/<project>.json of projects it does not list."""
    remove_pages(root, [k for k in on_disk if k not in site.kind], on_disk)
    listed = site.fragments()
    for path in (root / PACKAGES_DIR).glob("*.json"):
        if path.stem not in listed:
            path.unlink()


def expected_files(root: Path, site: Site) -> dict[str, bytes]:
    """Every file a rebuild writes for a whole-house Site, by path relative to the house."""
    out = {rel: data for key in site.kind for rel, data in site.render(key).items()}
    out.update(packages_files(root, site))
    return out


def rebuild_pages(root: Path, allow_shrink: bool = False) -> tuple[Site, list[str]]:
    """All pages from the journal, statting (never reading) each wheel. Caller holds the lock."""
    config = Config.load(root)
    idx = JournalIndex.load(root)
    present, missing = [], []
    for project in idx.projects():
        folder = root / FILES / project
        try:  # one directory listing per project instead of two stats per wheel
            names = set(os.listdir(folder))
        except FileNotFoundError:
            names = set()
        except OSError as exc:   # there but not listable: never read as wheels that are gone (design.md §9.5)
            raise BadInput(display(folder), None, None, f"cannot be listed ({exc.strerror or exc}); nothing written; "
                                                        f"{PUT_BACK}") from None
        for e in idx.entries(project):
            if e.file in names and e.file + ".metadata" in names:
                present.append(e)
            else:
                missing.append(e.file)
    site = Site(House.derive(present, config))
    before = existing_counts(root)
    after = site.counts()
    shrinks = [(k, n, after.get(k, 0)) for k, n in sorted(before.items()) if after.get(k, 0) < n]
    if shrinks and not allow_shrink:
        key, was, now = shrinks[0]
        more = f" (and {len(shrinks) - 1} more)" if len(shrinks) > 1 else ""
        why = f"; {len(missing)} manifest wheel(s) missing from files/, e.g. {missing[0]}" if missing else ""
        raise ShrinkRefused(f"{display(root)}: index rebuild would list fewer wheels in {key}: "
                            f"{was} -> {now}{more}{why}; nothing written (pass --allow-shrink to accept)")
    on_disk = existing_page_keys(root)
    write_pages(root, site, site.kind, packages_files(root, site))
    drop_unlisted(root, site, on_disk)
    fsync_dir(root)
    stamp_pages_format(root)
    idx.save(force=True)
    idx.close()
    return site, missing
