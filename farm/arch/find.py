"""Coverage over the grid, and `farm find`: which channels serve a given GPU (design.md §3.7, §3.9).

Both walk the same channel list: every grid row with a pin on the platform,
restricted by a recipe's torch range and platforms when a package is named.
"""

from __future__ import annotations

from dataclasses import dataclass

from farm import settings
from farm.arch.coverage import DEAD, JIT, NATIVE, CellVerdict, cell_verdict, rank
from farm.arch.resolve import NO_OVERRIDES, resolve
from farm.policy import Defaults, Gpu
from farm.versions import cuda_tag, vtuple

PYPI_SIMPLE = "https://pypi.org/simple"


def index_base() -> str:
    """Where the farm's index is served (the channels live below it)."""
    return settings.INDEX_URL.value().rstrip("/") + "/"


@dataclass(frozen=True)
class Channel:
    cuda: str
    torch: str
    platform: str
    pythons: tuple[str, ...]

    @property
    def path(self) -> str:
        return f"{cuda_tag(self.cuda)}/torch{self.torch}/"


def channels(defaults: Defaults, grid, platform: str | None = None, recipe=None,
             cuda: str | None = None, torch: str | None = None) -> list[Channel]:
    """Channels that exist for a platform: a grid row with a pin there (ARM only where the policy has a row)."""
    out = []
    for row in grid.rows:
        for plat in ([platform] if platform else defaults.grid_policy.platforms):
            if row.pin(plat) is None or (cuda and row.cuda != cuda) or (torch and row.torch != torch):
                continue
            if plat == "linux_aarch64" and row.cuda not in defaults.arch_policy.aarch64:
                continue
            if recipe is not None and not _recipe_builds(recipe, row, plat):
                continue
            pythons = tuple(p for p in row.pythons if not grid.is_phantom(row.cuda, row.torch, p, plat))
            out.append(Channel(row.cuda, row.torch, plat, pythons))
    return out


def _recipe_builds(recipe, row, platform: str) -> bool:
    if platform not in recipe.platforms:
        return False
    if recipe.min_torch and vtuple(row.torch) < vtuple(recipe.min_torch):
        return False
    return not (recipe.max_torch and vtuple(row.torch) > vtuple(recipe.max_torch))


def channel_verdict(device: Gpu, channel: Channel, defaults: Defaults, recipe=None,
                    driver: int | None = None) -> CellVerdict:
    overrides = recipe.arch if recipe is not None else NO_OVERRIDES
    where = str(recipe.path) if recipe is not None else "<policy>"
    arch = resolve(channel.cuda, channel.torch, channel.platform, defaults, overrides, where=where)
    links_torch = recipe.links_torch if recipe is not None else True
    return cell_verdict(device, channel.cuda, channel.torch, channel.platform, arch.arch_list, defaults,
                        links_torch=links_torch, driver=driver)


@dataclass(frozen=True)
class Offer:
    channel: Channel
    verdict: CellVerdict
    command: str           # pip
    uv_command: str        # uv searches --extra-index-url first and stops at the first index with the name


@dataclass(frozen=True)
class FindAnswer:
    device: Gpu
    platform: str
    python: str
    offers: tuple[Offer, ...]          # serving channels, best first
    notes: tuple[str, ...]             # fallbacks taken and why
    why_none: str | None               # set when nothing serves the device


def exact_pin(channel: Channel, recipe=None) -> str:
    if recipe is None:
        return f"<package>==<version>+{cuda_tag(channel.cuda)}torch{channel.torch}"
    label = cuda_tag(channel.cuda) + (f"torch{channel.torch}" if recipe.links_torch else "")
    return f"{recipe.name}=={recipe.version or '<version>'}+{label}"


def pip_words(channel_url: str, pin: str) -> list[str]:
    """pip: the channel as the index, PyPI as extra; the exact pin decides, whatever PyPI offers.
    The one spelling of the install line: pages, `farm find`, `farm serve` and `farm check-install`
    (which runs it) all take it from here."""
    return ["pip", "install", "--index-url", channel_url, "--extra-index-url", PYPI_SIMPLE, pin]


def uv_words(channel_url: str, pin: str) -> list[str]:
    """uv gives --extra-index-url priority, so the channel goes there and PyPI is the index."""
    return ["uv", "pip", "install", "--index-url", PYPI_SIMPLE, "--extra-index-url", channel_url, pin]


def command_line(words: list[str]) -> str:
    """The words as one line to type, the pin (last) in single quotes: `==` and `+` stay literal."""
    return " ".join(words[:-1]) + f" '{words[-1]}'"


def install_command(channel: Channel, recipe=None) -> str:
    return command_line(pip_words(index_base() + channel.path, exact_pin(channel, recipe)))


def uv_install_command(channel: Channel, recipe=None) -> str:
    return command_line(uv_words(index_base() + channel.path, exact_pin(channel, recipe)))


def find(device: Gpu, platform: str, python: str, defaults: Defaults, grid, *, driver: int | None = None,
         torch: str | None = None, recipe=None) -> FindAnswer:
    """Channels serving `device`, native first, then JIT-only; newest torch, then newest CUDA, first."""
    candidates = [c for c in channels(defaults, grid, platform, recipe) if python in c.pythons]
    notes: list[str] = []

    def serving(chans):
        judged = [(c, channel_verdict(device, c, defaults, recipe, driver)) for c in chans]
        good = [(c, v) for c, v in judged if v.status in (NATIVE, JIT)]
        good.sort(key=lambda cv: (rank(cv[1].status), tuple(-x for x in vtuple(cv[0].torch)),
                                  tuple(-x for x in vtuple(cv[0].cuda))))
        return good, judged

    chosen = candidates
    if torch is not None:
        chosen = [c for c in candidates if c.torch == torch]
        good, judged = serving(chosen)
        if not good:
            fb_cuda, fb_torch = defaults.grid_policy.fallback.get(platform, (None, None))
            reason = (f"torch {torch} has no channel for {platform} / Python {python}" if not chosen else
                      f"no torch {torch} channel serves {device.name} ({judged[0][1].reason})")
            notes.append(f"{reason}; falling back to the {platform} fallback cu{fb_cuda.replace('.', '')}/torch{fb_torch} "
                         f"(install torch {fb_torch} from the CUDA {fb_cuda} index with it)" if fb_cuda else reason)
            chosen = [c for c in candidates if (c.cuda, c.torch) == (fb_cuda, fb_torch)]
    good, judged = serving(chosen)
    why_none = None
    if not good:
        why_none = _why_none(device, platform, python, judged)
    offers = tuple(Offer(c, v, install_command(c, recipe), uv_install_command(c, recipe)) for c, v in good)
    return FindAnswer(device, platform, python, offers, tuple(notes), why_none)


def _why_none(device: Gpu, platform: str, python: str, judged: list[tuple[Channel, CellVerdict]]) -> str:
    cc = f"{device.cc[0]}.{device.cc[1]}"
    if not judged:
        return f"no channel exists for {platform} / Python {python}"
    reasons = sorted({v.reason for _, v in judged if v.status == DEAD})
    head = f"no channel serves {device.name} (sm {cc}) on {platform}"
    if device.tegra:
        head += (": it is a Tegra (Jetson) GPU, which runs only cubins built for its own compute capability, "
                 f"and no channel's torch carries an sm_{device.cc[0]}{device.cc[1]} cubin or PTX at or below {cc}; "
                 "Jetson users need NVIDIA's JetPack torch")
    unknown = [c for c, v in judged if v.status not in (NATIVE, JIT, DEAD)]
    tail = f" ({len(unknown)} channel(s) unknown: torch's list not in the PAM)" if unknown else ""
    return f"{head}{tail}. Examples: " + " | ".join(reasons[:2])


def coverage_rows(defaults: Defaults, grid, *, recipe=None, cuda=None, torch=None, platform=None,
                  driver: int | None = None):
    """Per channel: {device cc text: CellVerdict} over the devices that live on its platform."""
    for channel in channels(defaults, grid, platform, recipe, cuda, torch):
        devices = [d for d in defaults.gpus.devices if channel.platform in d.platforms]
        yield channel, {d.cc_text: channel_verdict(d, channel, defaults, recipe, driver) for d in devices}
