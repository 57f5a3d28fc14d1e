"""Scrape the PyTorch wheel index into the PCWM (design.md §2.1-2.4), failing closed.

The index URL is a setting (a mirror, or the replay served on loopback); the
label written into the file is a separate, canonical setting, so the bytes do
not depend on the address read. CUDA lines are discovered from the root page,
never listed here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from farm.errors import UpstreamUnreadable
from farm.matrix.grid import DEFAULT_SOURCE, Combo, Pcwm
from farm.platforms import from_wheel_platform_tag
from farm.policy import GridPolicy
from farm.versions import cuda_from_tag, cuda_tag, python_from_tag, vtuple
from farm.yamlio import write_atomic

TIMEOUT = (5.0, 30.0)        # connect, read (seconds)
RETRIES = 2                  # a refused, reset or dropped connection is retried; an HTTP answer is not
_LINE = re.compile(r"cu\d{2,}")
_FINAL = re.compile(r"\d+(\.\d+)*(\.post\d+)?")
_CPYTHON = re.compile(r"cp(\d)(\d+)")


class _Links(HTMLParser):
    """(href, text) of every <a> on a page; entities in the text are decoded."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href, self._text = dict(attrs).get("href") or "", []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def links(html: str) -> list[tuple[str, str]]:
    parser = _Links()
    parser.feed(html)
    parser.close()
    return parser.links


def discover_lines(root_html: str) -> list[str]:
    """CUDA lines linked from the root page: last path segment `cuNNN`, any link form (design.md §2.1)."""
    found = set()
    for href, _ in links(root_html):
        segments = [s for s in urlsplit(href).path.split("/") if s and s != "."]
        if segments and _LINE.fullmatch(segments[-1]):
            found.add(cuda_from_tag(segments[-1]))
    return sorted(found, key=vtuple)


@dataclass(frozen=True)
class Wheel:
    version: str
    labelled: bool        # carries a +cuNNN local label
    python: str           # '3.12'
    platform: str         # farm spelling


def parse_wheel(name: str) -> Wheel | None:
    """A torch wheel file name the farm targets, or None (design.md §2.2: finals only, no `t`, known platforms)."""
    if not name.endswith(".whl"):
        return None
    parts = name[:-4].split("-")
    if len(parts) == 6:          # optional build tag
        del parts[2]
    if len(parts) != 5 or parts[0] != "torch":
        return None
    _, version, pytag, abitag, plattag = parts
    version, _, label = version.partition("+")
    m = _CPYTHON.fullmatch(pytag)
    if not _FINAL.fullmatch(version) or not m or abitag.endswith("t"):
        return None
    platforms = {p for t in plattag.split(".") if (p := from_wheel_platform_tag(t)) is not None}
    if len(platforms) != 1:
        return None
    return Wheel(version, label.startswith("cu"), python_from_tag(pytag), platforms.pop())


def parse_line_page(cuda: str, html: str) -> set[Combo]:
    """Combos of one `<cuNNN>/torch/` page. Wheels belong to the page's line, whatever their label says."""
    wheels = [w for w in (parse_wheel(text) for _, text in links(html)) if w]
    labelled = {w.version for w in wheels if w.labelled}
    # unlabelled wheels count only beside a labelled build of the same version (cu124's aarch64
    # 2.4/2.5); otherwise they are the mirrored non-CUDA wheels every page carries
    return {Combo(cuda, w.version, w.python, w.platform) for w in wheels if w.labelled or w.version in labelled}


@dataclass(frozen=True)
class Scrape:
    pcwm: Pcwm
    warnings: tuple[str, ...]
    pages: int            # pages fetched, the root included


class Fetcher:
    """GET with a timeout and retries on connection errors; anything but 200 is UpstreamUnreadable."""

    def __init__(self, timeout=TIMEOUT, retries: int = RETRIES):
        self.timeout = timeout
        self.session = requests.Session()
        # GETs of index pages are idempotent: a connection that fails or drops before the answer
        # (connect/read errors) is retried; an HTTP status is an answer and is never retried
        retry = Retry(total=retries, connect=retries, read=retries, status=0, other=0, redirect=5,
                      backoff_factor=0.2, raise_on_status=False)
        adapter = HTTPAdapter(max_retries=retry)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.count = 0

    def get(self, url: str) -> str:
        self.count += 1
        try:
            response = self.session.get(url, timeout=self.timeout)
        except requests.RequestException as exc:
            raise UpstreamUnreadable(f"cannot read {url}: {_short(exc)}") from None
        if response.status_code != 200:
            raise UpstreamUnreadable(f"cannot read {url}: HTTP {response.status_code}")
        return response.content.decode("utf-8", errors="replace")   # index pages are UTF-8 (ASCII names)

    def close(self):
        self.session.close()


def _short(exc: Exception) -> str:
    text = str(exc)
    reason = re.search(r"\[Errno[^\]]*\][^')\"]*", text)
    return reason.group(0).strip() if reason else type(exc).__name__ + (f": {text[:200]}" if text else "")


def scrape(index_url: str, policy: GridPolicy, source_label: str = DEFAULT_SOURCE,
           fetcher: Fetcher | None = None) -> Scrape:
    """Read the index into a PCWM, or raise UpstreamUnreadable naming the URL (design.md §2.3)."""
    root = index_url if index_url.endswith("/") else index_url + "/"
    own = fetcher is None
    fetcher = fetcher or Fetcher()
    try:
        lines = discover_lines(fetcher.get(root))
        if not lines:
            raise UpstreamUnreadable(f"no CUDA line (cuNNN link) on {root}")
        combos: set[Combo] = set()
        warnings = []
        floor = vtuple(policy.min_cuda)
        for cuda in lines:
            if vtuple(cuda) < floor:      # never fetched: their pages need not exist
                continue
            url = f"{root}{cuda_tag(cuda)}/torch/"
            found = parse_line_page(cuda, fetcher.get(url))
            if not found:
                if cuda in policy.supported_cudas:
                    raise UpstreamUnreadable(f"{url} lists no target torch wheel for supported CUDA {cuda}")
                warnings.append(f"new CUDA line {cuda} ({url}) has no target torch wheel yet "
                                f"(only pre-releases or non-CUDA wheels); not in the matrix")
            combos |= found
        for cuda in policy.supported_cudas:
            if cuda not in lines:
                warnings.append(f"supported CUDA {cuda} is not linked from {root}")
        return Scrape(Pcwm.of(combos, source_label), tuple(warnings), fetcher.count)
    finally:
        if own:
            fetcher.close()


def write_pcwm(pcwm: Pcwm, path: Path) -> bool:
    """Atomic write; returns whether the bytes changed."""
    text = pcwm.to_json()
    path = Path(path)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    write_atomic(path, text)
    return True
