"""Whole-house operations: rebuild the pages, verify the bytes, prune yanked wheels, read build keys."""

from __future__ import annotations

import hashlib
import json
import re
import time
import zipfile
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from urllib.parse import unquote, urljoin

from ..errors import BadInput
from .index import COMPAT, FILES, SIMPLE, Config, House, Site, rebuild_pages, update
from .manifest import append_records, locked, read_journal, step
from .paths import default_wheelhouse

_HREF = re.compile(rb'<a [^>]*href="([^"]*)"')


@dataclass
class RebuildResult:
    pages: int
    wheels: int
    missing: list[str] = field(default_factory=list)   # journal entries whose file is gone (only with allow_shrink)


def rebuild(wheelhouse, allow_shrink: bool = False) -> RebuildResult:
    """Regenerate every page from the journal. Stats wheels, never opens one.

    Refuses (ShrinkRefused, nothing written) when any project page or channel
    would list fewer wheels than the pages on disk do, unless allow_shrink.
    """
    root = Path(wheelhouse)
    with locked(root):
        site, missing = rebuild_pages(root, allow_shrink)
    return RebuildResult(pages=len(site.kind), wheels=len(site.house.entries), missing=missing)


def built_keys(wheelhouse=None) -> set[str]:
    """Build keys of the wheels the house serves (not yanked, not pruned): `farm plan --missing` skips these cells.

    A house that does not exist yet has none. Default house: $FARM_WHEELHOUSE, else ./wheelhouse.
    """
    root = default_wheelhouse(wheelhouse)
    journal = read_journal(root)
    house = House.derive(journal.entries, Config.load(root))
    return {e.build_key for e in house.entries if e.build_key and e.file not in house.yanked}


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def verify(wheelhouse) -> list[str]:
    """Re-hash every wheel and sidecar against the journal and follow every link of every page.

    Returns one line per problem (empty: all good). Reads every wheel body;
    index pages never do, this is the separate check SPEC 10 asks for.
    """
    root = Path(wheelhouse)
    journal = read_journal(root)
    problems: list[str] = []
    hashes: dict[Path, str] = {}
    for e in journal.entries:
        path = root / FILES / e.project / e.file
        sidecar = path.with_name(e.file + ".metadata")
        if not path.is_file():
            problems.append(f"{path.relative_to(root)}: in the manifest but missing")
            continue
        got = hashes[path.resolve()] = file_sha256(path)
        if got != e.sha256:
            problems.append(f"{path.relative_to(root)}: sha256 {got} but the manifest says {e.sha256}")
        if path.stat().st_size != e.size:
            problems.append(f"{path.relative_to(root)}: {path.stat().st_size} bytes but the manifest says {e.size}")
        if not sidecar.is_file():
            problems.append(f"{sidecar.relative_to(root)}: missing")
            continue
        side = sidecar.read_bytes()
        if hashlib.sha256(side).hexdigest() != e.metadata_sha256:
            problems.append(f"{sidecar.relative_to(root)}: sha256 differs from the manifest's metadata_sha256")
        try:
            with zipfile.ZipFile(path) as zf:
                inner = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
                if len(inner) != 1 or zf.read(inner[0]) != side:
                    problems.append(f"{sidecar.relative_to(root)}: not byte-identical to the wheel's METADATA")
        except zipfile.BadZipFile:
            problems.append(f"{path.relative_to(root)}: not a zip archive")
    problems += check_links(root, hashes)
    return problems


def check_links(root: Path, hashes: dict[Path, str] | None = None) -> list[str]:
    """Every href of every index page resolves to a file under the house; a #sha256= matches its bytes."""
    hashes = {} if hashes is None else hashes
    problems = []
    pages = [*root.glob(f"{SIMPLE}/**/index.html"), *root.glob("cu*/torch*/**/index.html"),
             *root.glob(f"{COMPAT}/**/index.html")]
    for page in pages:
        base = "/" + page.relative_to(root).as_posix()
        for raw in _HREF.findall(page.read_bytes()):
            href = raw.decode("utf-8").replace("&amp;", "&")
            if href.startswith(("http://", "https://")):
                continue  # an external file base URL: not checkable offline
            url, _, fragment = href.partition("#")
            target = root / unquote(urljoin(base, url)).lstrip("/")
            if url.endswith("/"):
                if not (target / "index.html").is_file():
                    problems.append(f"{page.relative_to(root)}: link {href} has no page")
                continue
            if not target.is_file():
                problems.append(f"{page.relative_to(root)}: link {href} resolves to nothing")
                continue
            if fragment.startswith("sha256="):
                key = target.resolve()
                if key not in hashes:
                    hashes[key] = file_sha256(target)
                if hashes[key] != fragment[7:]:
                    problems.append(f"{page.relative_to(root)}: {target.name} does not have the advertised sha256")
    return problems


def parse_date(text: str, where: str = "--before") -> datetime:
    try:
        d = date.fromisoformat(text)
        return datetime(d.year, d.month, d.day, tzinfo=timezone.utc)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(where, None, text, "expected a date like 2026-05-01 or 2026-05-01T12:00:00Z") from None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def _published(entry_published: str) -> datetime | None:
    try:
        return datetime.fromisoformat(entry_published.replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass
class PruneResult:
    removed: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)


def prune(wheelhouse, before: datetime | str) -> PruneResult:
    """Delete yanked wheels published before `before`, and leftovers of crashed publishes older than it.

    Journal first, then pages, then the files: at no point does a page link a deleted file.
    """
    root = Path(wheelhouse)
    cutoff = parse_date(before) if isinstance(before, str) else before
    result = PruneResult()
    with locked(root):
        journal = read_journal(root)
        config = Config.load(root)
        house = House.derive(journal.entries, config)
        doomed = [e for e in house.entries if e.file in house.yanked
                  and (_published(e.published) or cutoff) < cutoff]
        if doomed:
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            append_records(root, (json.dumps({"op": "remove", "file": e.file, "project": e.project, "at": now,
                                               "reason": f"pruned: yanked and published before {cutoff.isoformat()}"},
                                              sort_keys=True) for e in doomed))
            gone = {e.file for e in doomed}
            after = Site(House.derive([e for e in journal.entries if e.file not in gone], config))
            update(root, Site(house), after)
            for e in doomed:
                folder = root / FILES / e.project
                (folder / e.file).unlink(missing_ok=True)
                (folder / (e.file + ".metadata")).unlink(missing_ok=True)
                step(f"pruned {e.file}")
                result.removed.append(e.file)
        # Files no journal record names: a publish that died between rename and append, or a temporary.
        gone = {e.file for e in doomed}
        live = {(e.project, e.file) for e in journal.entries if e.file not in gone}
        limit = cutoff.timestamp()
        for folder in (root / FILES).glob("*"):
            for path in folder.iterdir():
                name = path.name.removesuffix(".metadata")
                if name.startswith(".") and not path.name.endswith(".tmp"):
                    continue
                if (folder.name, name) in live or path.stat().st_mtime >= min(limit, time.time() - 3600):
                    continue
                path.unlink(missing_ok=True)
                result.orphans.append(f"{folder.name}/{path.name}")
    return result
