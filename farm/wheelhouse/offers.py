"""What each channel serves, said where a user meets it: its root page and `farm serve`'s start-up lines
(design.md §9.7). From the projects' journal summaries, so an incremental publish and a rebuild agree."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from html import escape

from farm.platforms import LABELS, PLATFORMS
from farm.versions import vtuple
from farm.wheelhouse.journalindex import Summary
from farm.wheelhouse.names import channel_root


@dataclass(frozen=True)
class ChannelOffer:
    """What one channel serves (design.md §9.7): its Pythons per platform, and the project whose newest
    wheel the install line shows, so that a user with another Python reads why
    pip finds "from versions: none" instead of only that."""

    cuda: str
    torch: str
    pythons: tuple[tuple[str, tuple[str, ...]], ...]   # (platform or "any", Pythons), in PLATFORMS order
    example: tuple[str, str]                            # (project, version)
    projects: int

    @property
    def path(self) -> str:
        return channel_root(self.cuda, self.torch) + "/"

    def serves(self) -> str:
        """'Linux x86_64: Python 3.11, 3.12; Linux aarch64 (ARM): Python 3.11'."""
        return "; ".join(f"{LABELS.get(p, p)}: Python {', '.join(pys)}" for p, pys in self.pythons)

    def lines(self, base_url: str) -> tuple[str, str]:
        """The pip and the uv install line of the example project, with the channel under `base_url`."""
        from farm.arch.find import command_line, pip_words, uv_words

        url, pin = base_url + self.path, f"{self.example[0]}=={self.example[1]}"
        return command_line(pip_words(url, pin)), command_line(uv_words(url, pin))


def channel_offers(summaries: dict[str, Summary], lines: dict[str, list[str]]) -> dict[str, ChannelOffer]:
    """Channel root (`cu130/torch2.13`) -> what it serves, from the projects' summaries; torch-free
    wheels count in every torch channel of their CUDA line, as the pages list them."""
    from packaging.version import InvalidVersion, Version

    def newer(a: str, b: str) -> bool:
        try:
            return Version(a) > Version(b)
        except InvalidVersion:
            return a > b

    pythons: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    reach: dict[str, dict[str, set[tuple[str, str]]]] = defaultdict(lambda: defaultdict(set))  # project's cells
    newest: dict[tuple[str, str], str] = {}    # (channel, project) -> its newest version
    where: dict[str, tuple[str, str]] = {}
    for project, summary in summaries.items():
        for cuda, torch, platform, python, version in summary.served:
            for minor in ([torch] if torch else lines.get(cuda, ())):
                key = channel_root(cuda, minor)
                where[key] = (cuda, minor)
                pythons[key][platform].add(python)
                reach[key][project].add((platform, python))
                if (key, project) not in newest or newer(version, newest[(key, project)]):
                    newest[(key, project)] = version
    order = {p: i for i, p in enumerate((*PLATFORMS, "any"))}
    offers = {}
    for key in sorted(pythons):
        # the example: the project that serves most of the channel's Pythons, then the first by name
        shown = min(reach[key], key=lambda project: (-len(reach[key][project]), project))
        offers[key] = ChannelOffer(*where[key],
                                   tuple((p, tuple(sorted(pys, key=vtuple)))
                                         for p, pys in sorted(pythons[key].items(), key=lambda kv: order.get(kv[0], 9))),
                                   (shown, newest[(key, shown)]), len(reach[key]))
    return offers


_HERE = ('<script>for (const e of document.querySelectorAll(".here")) '
         'e.textContent = location.href.replace(/[?#].*$/, "").replace(/[^/]*$/, "");</script>')


def offer_body(offer: ChannelOffer) -> list[str]:
    """The channel page's head: what it serves and the line to type (the page's own URL put in by its script)."""
    pip, uv = offer.lines("\0")
    here = f'<span class="here">&lt;index&gt;/{escape(offer.path)}</span>'
    return [f'<p id="serves">CUDA {escape(offer.cuda)}, torch {escape(offer.torch)}: wheels for '
            f'{escape(offer.serves())}. With another Python or platform pip finds no wheel here '
            '(&quot;from versions: none&quot;).</p>',
            f"<p>Install torch {escape(offer.torch)} for CUDA {escape(offer.cuda)} first, then for example:</p>",
            '<pre id="install-pip">' + escape(pip).replace("\0" + escape(offer.path), here) + "</pre>",
            '<pre id="install-uv">' + escape(uv).replace("\0" + escape(offer.path), here) + "</pre>",
            _HERE]
