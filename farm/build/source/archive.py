"""An sdist or a downloaded archive: a PyPI `name==version` is resolved to its sdist URL through the
index, the archive is cached per sha256 (sources/sdist/<sha256>/, sources/extra/<sha256>/) and its
sha256 checked before anything is extracted; members with absolute paths, `..`, links leading outside,
or device files refuse the whole archive.
"""

from __future__ import annotations

import calendar
import hashlib
import html
import os
import posixpath
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

import requests
from filelock import FileLock
from packaging.requirements import Requirement
from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from farm import settings
from farm.build.source.base import ZIP_EPOCH, Fetched, sources_cache
from farm.errors import BadInput, SourceError, UnsafeArchive
from farm.recipes.model import unsafe_name

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar", ".zip")
HTTP_TIMEOUT = (15, 300)


def pypi_index() -> str:
    """PyPI's base URL (a setting: FARM_PYPI_URL)."""
    return settings.PYPI_URL.value().rstrip("/")


@dataclass(frozen=True)
class SdistLink:
    """One release's sdist as the index lists it: its file name, URL and the sha256 the index gives."""

    filename: str
    url: str
    sha256: str | None


def find_pypi_sdist(pin: str, where: str = "recipe", key: str = "source.sdist.pypi") -> SdistLink:
    """'name==version' -> that release's sdist, from PyPI's simple index (PEP 691 JSON, or PEP 503 HTML
    when a plain mirror answers): the interface every PyPI mirror and proxy serves. A .tar.gz is
    preferred over a .zip."""
    requirement = Requirement(pin)
    name, version = requirement.name, next(iter(requirement.specifier)).version
    page = f"{pypi_index()}/simple/{canonicalize_name(name)}/"
    try:
        resp = requests.get(page, timeout=HTTP_TIMEOUT,
                            headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    except requests.RequestException as exc:
        raise SourceError(f"cannot reach {page}: {type(exc).__name__}") from None
    if resp.status_code == 404:
        raise BadInput(where, key, pin, "no such project on PyPI")
    if resp.status_code != 200:
        raise SourceError(f"{page}: HTTP {resp.status_code}")
    links: list[tuple[str, str, str | None]] = []
    if "json" in resp.headers.get("Content-Type", ""):
        try:
            links = [(f["filename"], f["url"], (f.get("hashes") or {}).get("sha256")) for f in resp.json()["files"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SourceError(f"{page}: not a PEP 691 project page") from None
    else:
        for href, text in re.findall(r'<a\s[^>]*href="([^"]*)"[^>]*>([^<]*)</a>', resp.text):
            url = html.unescape(href)
            digest = re.search(r"#sha256=([0-9a-f]{64})$", url)
            links.append((html.unescape(text).strip(), url, digest.group(1) if digest else None))
    sdists = []
    for filename, url, sha256 in links:
        try:
            _, file_version = parse_sdist_filename(filename)
        except (InvalidSdistFilename, InvalidVersion):
            continue
        if file_version == Version(version):
            link = SdistLink(filename, urljoin(resp.url, url.split("#", 1)[0]), sha256)
            sdists.append((not filename.endswith(".tar.gz"), link.url, link))
    if not sdists:
        raise BadInput(where, key, pin, "no such release with an sdist on PyPI")
    return min(sdists)[2]


def resolve_pypi_sdist(pin: str, where: str = "recipe") -> str:
    """'name==version' (a pin the recipe loader checked) -> the URL of that release's sdist."""
    return find_pypi_sdist(pin, where).url


def download(url: str, dest: Path, sha256: str, where: str, key: str) -> Path:
    """Fetch `url` to `dest` unless already cached there; the sha256 is checked before the rename."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest.parent) + ".lock"):
        if dest.is_file():
            return dest
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".download-")
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out:
                if url.startswith("file://") or "://" not in url:
                    with open(url.removeprefix("file://"), "rb") as src:
                        for chunk in iter(lambda: src.read(1 << 20), b""):
                            digest.update(chunk)
                            out.write(chunk)
                else:
                    try:
                        with requests.get(url, stream=True, timeout=HTTP_TIMEOUT) as resp:
                            if resp.status_code != 200:
                                raise SourceError(f"cannot download {url}: HTTP {resp.status_code}")
                            for chunk in resp.iter_content(1 << 20):
                                digest.update(chunk)
                                out.write(chunk)
                    except requests.RequestException as exc:
                        raise SourceError(f"cannot download {url}: {type(exc).__name__}") from None
            if digest.hexdigest() != sha256:
                raise BadInput(where, key, sha256, f"{url} has sha256 {digest.hexdigest()}")
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return dest


def archive_name(url: str) -> str:
    name = url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name) or "download"


def fetch_sdist(
    dest: Path, *, sha256: str, url: str | None = None, pypi: str | None = None, where: str = "recipe",
) -> Fetched:
    """Download (or reuse by sha256) an sdist and extract it into `dest` without its top folder.
    `url` or `pypi` (one of them) and `sha256` come from a loaded recipe's `Source`."""
    slot = sources_cache() / "sdist" / sha256
    cached = [p for p in slot.iterdir() if not p.name.startswith(".")] if slot.is_dir() else []
    if cached:
        archive = cached[0]
    else:
        real_url = url or resolve_pypi_sdist(pypi or "", where)   # the loader gave one of the two
        archive = download(real_url, slot / archive_name(real_url), sha256, where, "source.sdist.sha256")
    extract_archive(archive, Path(dest), strip_top=True)
    shown = pypi or url
    return Fetched("sdist", sha256, f"sdist {shown} (sha256 {sha256[:12]})", sha256=sha256,
                   date_epoch=archive_date(archive))


def archive_date(archive: Path) -> int:
    """The newest member time of a tar or zip archive: an sdist's SOURCE_DATE_EPOCH (design.md §6.5), read
    from the archive (fixed by its sha256), not from the extracted files. ZIP_EPOCH when it holds none."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            # zip times are local wall-clock times without a zone: read as UTC, the same on every host
            times = [calendar.timegm((*i.date_time, 0, 0, 0)) for i in zf.infolist()]
    else:
        try:
            with tarfile.open(archive) as tf:
                times = [int(m.mtime) for m in tf.getmembers()]
        except tarfile.TarError:
            raise SourceError(f"{Path(archive).name}: not a tar or zip archive") from None
    return max([t for t in times if t >= ZIP_EPOCH], default=ZIP_EPOCH)


def _link_escapes(member: str, target: str, hard: bool) -> bool:
    if target.startswith("/") or re.match(r"^[A-Za-z]:", target):
        return True
    base = "" if hard else posixpath.dirname(member)
    resolved = posixpath.normpath(posixpath.join(base, target))
    return resolved == ".." or resolved.startswith("../") or resolved.startswith("/")


def extract_archive(archive: Path, dest: Path, *, strip_top: bool) -> None:
    """Extract a tar or zip archive into `dest` (must not exist), refusing unsafe members.

    With `strip_top`, a single top-level folder (`name-version/` in sdists) is removed.
    """
    archive = Path(archive)
    tmp = Path(tempfile.mkdtemp(dir=Path(dest).parent, prefix=".extract-"))
    try:
        if zipfile.is_zipfile(archive):
            _extract_zip(archive, tmp)
        else:
            try:
                tf = tarfile.open(archive)
            except tarfile.TarError:
                raise SourceError(f"{archive.name}: not a tar or zip archive") from None
            with tf:
                _extract_tar(tf, archive.name, tmp)
        entries = list(tmp.iterdir())
        root = entries[0] if strip_top and len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink() else tmp
        if root is tmp:
            os.replace(tmp, dest)
        else:
            os.replace(root, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _extract_tar(tf: tarfile.TarFile, label: str, into: Path) -> None:
    members = tf.getmembers()
    for m in members:
        problem = unsafe_name(m.name)
        if problem is None and (m.issym() or m.islnk()) and _link_escapes(m.name, m.linkname, hard=m.islnk()):
            problem = f"link to {m.linkname!r} leads outside"
        if problem is None and not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
            problem = "device or special file"
        if problem:
            raise UnsafeArchive(f"{label}: refusing member {m.name!r}: {problem}")
    if hasattr(tarfile, "data_filter"):
        # The 'data' filter re-checks all of the above and drops setuid bits and ownership.
        tf.extractall(into, members=members, filter="data")
    else:
        tf.extractall(into, members=members)


def _extract_zip(archive: Path, into: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            problem = unsafe_name(info.filename)
            if problem is None and stat.S_ISLNK(info.external_attr >> 16):
                target = zf.read(info).decode("utf-8", "replace")
                if _link_escapes(info.filename, target, hard=False):
                    problem = f"link to {target!r} leads outside"
            if problem:
                raise UnsafeArchive(f"{archive.name}: refusing member {info.filename!r}: {problem}")
        for info in zf.infolist():
            path = Path(zf.extract(info, into))
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                path.chmod(mode | 0o600)
