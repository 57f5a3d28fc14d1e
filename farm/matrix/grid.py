"""The PCWM as loaded data, and the grid derived from it (design.md §2.4-2.7).

Spellings:
- In memory every version is dotted: CUDA '12.9', torch minor '2.10', exact
  torch '2.10.0', Python '3.12'; platforms use the farm spelling (`linux`,
  `windows`, `linux_aarch64`, see farm.platforms).
- `defaults/scraped_torch_matrix.json` (the PCWM) spells x86 Linux
  `linux_x86_64`, as observed; it is converted on load.
- `defaults/grid.generated.yml`: one row per line,
  `{cuda: "12.9", torch: "2.9", pytorch: "2.9.1", pytorch_windows: "2.9.0",
  pytorch_aarch64: "2.9.1", pythons: ["3.10", ...]}`; a pin key is absent
  when that platform has no wheel of the minor.
- `defaults/phantom_combos.json`: a JSON list of
  `[cuda_short, torch_minor, python_short, platform]` such as
  `["cu129", "2.10", "312", "windows"]`, sorted numerically (CUDA, torch,
  Python, platform); in memory `Grid.phantoms` holds the dotted form
  `("12.9", "2.10", "3.12", "windows")`.

Deriving (`derive`) is pure; writing (`write_grid`) and loading
(`load_grid`, `load_pcwm`) are separate. Loaders validate and are cached per
folder (and per file state, so a rewrite in the same process is seen).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

from packaging.version import InvalidVersion, Version

from farm import settings
from farm.errors import BadInput, FarmError
from farm.platforms import PLATFORMS, from_pcwm, to_pcwm
from farm.policy import GridPolicy
from farm.versions import cuda_from_tag, cuda_tag, minor_of, python_from_tag, python_tag, vtuple
from farm.yamlio import load_yaml, write_atomic

PCWM_FILE = "scraped_torch_matrix.json"
GRID_FILE = "grid.generated.yml"
PHANTOMS_FILE = "phantom_combos.json"
DEFAULT_SOURCE = "https://download.pytorch.org/whl/"

# grid.generated.yml key of each platform's pin
PIN_KEYS = MappingProxyType({"linux": "pytorch", "windows": "pytorch_windows", "linux_aarch64": "pytorch_aarch64"})
X86_PLATFORMS = ("linux", "windows")


def torch_key(version: str) -> Version:
    """Sort key of an exact torch version ('2.10.0' after '2.9.1'; '.postN' allowed)."""
    return Version(version)


# ---------------------------------------------------------------- PCWM

class Combo(NamedTuple):
    """One published wheel combination; platform in farm spelling."""

    cuda: str
    torch: str
    python: str
    platform: str

    def sort_key(self):
        return vtuple(self.cuda), torch_key(self.torch), vtuple(self.python), to_pcwm(self.platform)


@dataclass(frozen=True)
class Pcwm:
    """Every (CUDA, exact torch, Python, platform) the index publishes: observation, no policy."""

    combos: tuple[Combo, ...]
    source: str = DEFAULT_SOURCE

    @classmethod
    def of(cls, combos: Iterable[Combo], source: str = DEFAULT_SOURCE) -> Pcwm:
        """Deduplicated and sorted (design.md §2.4)."""
        return cls(tuple(sorted(set(combos), key=Combo.sort_key)), source)

    @functools.cached_property
    def _index(self) -> frozenset[Combo]:
        return frozenset(self.combos)

    def has(self, cuda: str, torch: str, python: str, platform: str) -> bool:
        """Whether upstream ships exactly this wheel (design.md §2.6: recipes' own combinations)."""
        return Combo(cuda, torch, python, platform) in self._index

    @property
    def cudas(self) -> tuple[str, ...]:
        return tuple(sorted({c.cuda for c in self.combos}, key=vtuple))

    def torches(self, cuda: str, platform: str | None = None) -> tuple[str, ...]:
        """Exact torch versions of a line (optionally on one platform), oldest first."""
        found = {c.torch for c in self.combos if c.cuda == cuda and (platform is None or c.platform == platform)}
        return tuple(sorted(found, key=torch_key))

    def newest(self, cuda: str, torch_minor: str, platform: str, python: str | None = None) -> str | None:
        """The newest patch of `torch_minor` with a wheel on `platform` (for `python`, when given)."""
        found = [c.torch for c in self.combos
                 if c.cuda == cuda and c.platform == platform and minor_of(c.torch) == torch_minor
                 and (python is None or c.python == python)]
        return max(found, key=torch_key, default=None)

    def to_json(self) -> str:
        """The file's bytes: no timestamp, no address read, so equal upstreams give equal bytes."""
        summary: dict[tuple[str, str], tuple[set, set]] = {}
        for c in self.combos:
            pys, plats = summary.setdefault((c.cuda, c.torch), (set(), set()))
            pys.add(c.python)
            plats.add(to_pcwm(c.platform))
        rows = [{"cuda": cuda, "torch": torch, "pythons": sorted(pys, key=vtuple), "platforms": sorted(plats)}
                for (cuda, torch), (pys, plats) in summary.items()]
        combos = [{"cuda": c.cuda, "torch": c.torch, "python": c.python, "platform": to_pcwm(c.platform)}
                  for c in self.combos]

        def lines(items):
            return ",\n".join("    " + json.dumps(item) for item in items)

        return (
            "{\n"
            f'  "source": {json.dumps(self.source)},\n'
            f'  "cuda_versions": {json.dumps(list(self.cudas))},\n'
            f'  "total": {len(self.combos)},\n'
            f'  "summary": [\n{lines(rows)}\n  ],\n'
            f'  "combos": [\n{lines(combos)}\n  ]\n'
            "}\n"
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> Pcwm:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInput(where, None, None, f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadInput(where, None, None, "expected an object with source and combos")
        source = data.get("source")
        if not isinstance(source, str):
            raise BadInput(where, "source", source, "expected the canonical source label")
        raw = data.get("combos")
        if not isinstance(raw, list) or not raw:
            raise BadInput(where, "combos", raw if not isinstance(raw, list) else "[]", "expected a non-empty list")
        combos = []
        for i, item in enumerate(raw):
            key = f"combos[{i}]"
            if not isinstance(item, dict) or set(item) != {"cuda", "torch", "python", "platform"}:
                raise BadInput(where, key, item, "expected {cuda, torch, python, platform}")
            for field in ("cuda", "python"):
                try:
                    vtuple(item[field])
                except ValueError:
                    raise BadInput(where, f"{key}.{field}", item[field], "not a dotted version") from None
            try:
                torch_key(item["torch"])
            except (InvalidVersion, TypeError):
                raise BadInput(where, f"{key}.torch", item["torch"], "not a torch version") from None
            try:
                platform = from_pcwm(item["platform"])
            except (KeyError, TypeError):
                raise BadInput(where, f"{key}.platform", item["platform"],
                               "expected linux_x86_64, windows or linux_aarch64") from None
            combos.append(Combo(item["cuda"], item["torch"], item["python"], platform))
        return cls.of(combos, source)


def load_pcwm(defaults_dir: Path | str | None = None) -> Pcwm:
    """defaults/scraped_torch_matrix.json, validated; cached per folder and file state."""
    return load_pcwm_file(Path(defaults_dir or settings.defaults_dir()) / PCWM_FILE)


def load_pcwm_file(path: Path | str) -> Pcwm:
    """A PCWM file anywhere (e.g. a scrape kept by `watch` or a test)."""
    path = Path(path).resolve()
    return _load_pcwm(path, _state(path))


@functools.lru_cache(maxsize=8)
def _load_pcwm(path: Path, state) -> Pcwm:
    if state is None:
        raise BadInput(settings.display(path), None, None, "file not found (run `make matrix`)")
    return Pcwm.from_json(path.read_text(encoding="utf-8"), settings.display(path))


def _state(path: Path):
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


# ---------------------------------------------------------------- grid

@dataclass(frozen=True)
class GridRow:
    """One (CUDA line, torch minor) of the grid with its per-platform pins (design.md §2.5)."""

    cuda: str                    # '12.8'
    torch: str                   # '2.9' (the minor: channel and cell id)
    pins: Mapping[str, str]      # platform -> exact newest patch with a wheel there; absent when none
    pythons: tuple[str, ...]     # '3.10', ... (policy floor applied)

    def pin(self, platform: str) -> str | None:
        return self.pins.get(platform)

    def __hash__(self) -> int:
        return hash((self.cuda, self.torch, tuple(sorted(self.pins.items())), self.pythons))


@dataclass(frozen=True)
class Grid:
    rows: tuple[GridRow, ...]
    phantoms: frozenset[tuple[str, str, str, str]]   # (cuda, torch minor, python, platform), dotted

    @functools.cached_property
    def _by_key(self) -> Mapping[tuple[str, str], GridRow]:
        return {(r.cuda, r.torch): r for r in self.rows}

    def row(self, cuda: str, torch: str) -> GridRow | None:
        return self._by_key.get((cuda, torch))

    def is_phantom(self, cuda: str, torch: str, python: str, platform: str) -> bool:
        return (cuda, torch, python, platform) in self.phantoms

    def has_cell(self, cuda: str, torch: str, python: str, platform: str) -> bool:
        """A grid cell upstream really shipped: its row has the Python and it is not a phantom."""
        r = self.row(cuda, torch)
        return r is not None and python in r.pythons and not self.is_phantom(cuda, torch, python, platform)

    @property
    def cudas(self) -> tuple[str, ...]:
        return tuple(sorted({r.cuda for r in self.rows}, key=vtuple))


def unsupported_lines(pcwm: Pcwm, policy: GridPolicy) -> tuple[str, ...]:
    """PCWM lines derive skips because `supported_cudas` does not name them (design.md §2.5)."""
    return tuple(c for c in pcwm.cudas if c not in policy.supported_cudas)


def derive(pcwm: Pcwm, policy: GridPolicy) -> Grid:
    """Rows, pins and phantoms from the PCWM and the owned policy (design.md §2.5, §2.6). Pure.

    The Python floor and the pre-release list apply first: a wheel for a
    Python the farm never targets neither makes a row nor moves a pin.
    """
    def eligible(python: str) -> bool:
        return vtuple(python) >= vtuple(policy.python_min) and python not in policy.prerelease_pythons

    platforms = [p for p in PLATFORMS if p in policy.platforms]
    kept = [c for c in pcwm.combos
            if c.cuda in policy.supported_cudas and c.platform in platforms and eligible(c.python)]
    pythons_of: dict[tuple[str, str, str], set[str]] = {}   # (cuda, exact torch, platform) -> Pythons
    for c in kept:
        pythons_of.setdefault((c.cuda, c.torch, c.platform), set()).add(c.python)
    newest: dict[tuple[str, str, str], str] = {}            # (cuda, minor, platform) -> pin
    for cuda, torch, platform in pythons_of:
        key = (cuda, minor_of(torch), platform)
        if key not in newest or torch_key(torch) > torch_key(newest[key]):
            newest[key] = torch
    rows, phantoms = [], set()
    for cuda, minor in sorted({(k[0], k[1]) for k in newest}, key=lambda k: (vtuple(k[0]), vtuple(k[1]))):
        pins = {p: newest[(cuda, minor, p)] for p in platforms if (cuda, minor, p) in newest}
        pythons = set()
        for p in X86_PLATFORMS:
            if p in pins:
                pythons |= pythons_of[(cuda, pins[p], p)]
        if not pythons:      # ARM-only minor: no x86 wheel, no row
            continue
        row = GridRow(cuda, minor, MappingProxyType(pins), tuple(sorted(pythons, key=vtuple)))
        rows.append(row)
        for python in row.pythons:
            for p in platforms:
                if p not in pins or python not in pythons_of[(cuda, pins[p], p)]:
                    phantoms.add((cuda, minor, python, p))
    return Grid(tuple(rows), frozenset(phantoms))


def cell_key(cell):
    """Numeric order of (cuda, torch minor, python, platform) cells: 2.9 before 2.10."""
    cuda, torch, python, platform = cell
    return vtuple(cuda), vtuple(torch), vtuple(python), platform


def render_grid_yaml(grid: Grid) -> str:
    lines = [
        "# GENERATED by `farm matrix derive` from scraped_torch_matrix.json and the owned",
        "# python_cuda_torch_os_policy.yml. Never edit by hand: run `make matrix`.",
        "# One row per (CUDA line, torch minor); pytorch / pytorch_windows / pytorch_aarch64 are",
        "# the newest patch of the minor with a wheel on that platform (absent: none).",
        "rows:",
    ]
    for r in grid.rows:
        fields = [f"cuda: {json.dumps(r.cuda)}", f"torch: {json.dumps(r.torch)}"]
        fields += [f"{PIN_KEYS[p]}: {json.dumps(r.pins[p])}" for p in PLATFORMS if p in r.pins]
        fields.append(f"pythons: {json.dumps(list(r.pythons))}")
        lines.append("  - {" + ", ".join(fields) + "}")
    return "\n".join(lines) + "\n"


def render_phantoms_json(grid: Grid) -> str:
    cells = [[cuda_tag(c), t, python_tag(py), p] for c, t, py, p in sorted(grid.phantoms, key=cell_key)]
    return "[\n" + ",\n".join("  " + json.dumps(cell) for cell in cells) + ("\n]\n" if cells else "]\n")


def write_grid(grid: Grid, out_dir: Path | str | None = None) -> tuple[Path, Path]:
    """Write grid.generated.yml and phantom_combos.json, each atomically. Refuses zero rows (design.md §2.7)."""
    if not grid.rows:
        raise FarmError("derive produced zero grid rows: refusing to write an empty grid")
    out = Path(out_dir or settings.defaults_dir())
    grid_path, phantoms_path = out / GRID_FILE, out / PHANTOMS_FILE
    write_atomic(phantoms_path, render_phantoms_json(grid))
    write_atomic(grid_path, render_grid_yaml(grid))
    return grid_path, phantoms_path


# ---------------------------------------------------------------- loading the generated files

def load_grid(defaults_dir: Path | str | None = None) -> Grid:
    """defaults/grid.generated.yml + phantom_combos.json, validated; cached per folder and file state."""
    folder = Path(defaults_dir or settings.defaults_dir()).resolve()
    grid_path, phantoms_path = folder / GRID_FILE, folder / PHANTOMS_FILE
    return _load_grid(grid_path, phantoms_path, _state(grid_path), _state(phantoms_path))


@functools.lru_cache(maxsize=8)
def _load_grid(grid_path: Path, phantoms_path: Path, *_states) -> Grid:
    rows = _parse_rows(load_yaml(grid_path), settings.display(grid_path))
    grid = Grid(rows, frozenset())
    return Grid(rows, _parse_phantoms(phantoms_path, grid))


def _version(where: str, key: str, value) -> str:
    if not isinstance(value, str):
        raise BadInput(where, key, value, "expected a quoted version string")
    try:
        vtuple(value)
    except ValueError:
        raise BadInput(where, key, value, "not a dotted version") from None
    return value


def _parse_rows(data, where: str) -> tuple[GridRow, ...]:
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or not data["rows"]:
        raise BadInput(where, "rows", None if not isinstance(data, dict) else data.get("rows"),
                       "expected a non-empty list of rows")
    allowed = {"cuda", "torch", "pythons", *PIN_KEYS.values()}
    rows, seen = [], set()
    for i, item in enumerate(data["rows"]):
        key = f"rows[{i}]"
        if not isinstance(item, dict):
            raise BadInput(where, key, item, "expected a mapping")
        extra = sorted(set(item) - allowed)
        if extra:
            raise BadInput(where, f"{key}.{extra[0]}", item[extra[0]], "unknown key")
        cuda = _version(where, f"{key}.cuda", item.get("cuda"))
        torch = _version(where, f"{key}.torch", item.get("torch"))
        if len(vtuple(torch)) != 2:
            raise BadInput(where, f"{key}.torch", torch, "expected a torch minor like '2.9'")
        if (cuda, torch) in seen:
            raise BadInput(where, key, f"{cuda}/{torch}", "duplicate row")
        seen.add((cuda, torch))
        pins = {}
        for platform, pin_key in PIN_KEYS.items():
            if pin_key in item:
                pin = _version(where, f"{key}.{pin_key}", item[pin_key])
                if minor_of(pin) != torch:
                    raise BadInput(where, f"{key}.{pin_key}", pin, f"pin is not a patch of torch {torch}")
                pins[platform] = pin
        pythons = item.get("pythons")
        if not isinstance(pythons, list) or not pythons:
            raise BadInput(where, f"{key}.pythons", pythons, "expected a non-empty list of Pythons")
        pythons = tuple(_version(where, f"{key}.pythons", p) for p in pythons)
        if not any(p in pins for p in X86_PLATFORMS):
            raise BadInput(where, key, f"{cuda}/{torch}", "a row needs a linux or windows pin")
        rows.append(GridRow(cuda, torch, MappingProxyType(pins), pythons))
    return tuple(rows)


def _parse_phantoms(path: Path, grid: Grid) -> frozenset[tuple[str, str, str, str]]:
    where = settings.display(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(where, None, None, "file not found (run `make matrix`)") from None
    except json.JSONDecodeError as exc:
        raise BadInput(where, None, None, f"not JSON: {exc}") from None
    if not isinstance(data, list):
        raise BadInput(where, None, None, "expected a list of [cuda_short, torch_minor, python_short, platform]")
    out = set()
    for i, item in enumerate(data):
        key = f"[{i}]"
        if not (isinstance(item, list) and len(item) == 4 and all(isinstance(x, str) for x in item)):
            raise BadInput(where, key, item, "expected [cuda_short, torch_minor, python_short, platform]")
        cu, torch, py, platform = item
        try:
            cell = (cuda_from_tag(cu), torch, python_from_tag(py), platform)
            vtuple(cell[2])
        except (ValueError, IndexError):
            raise BadInput(where, key, item, "expected e.g. [\"cu129\", \"2.10\", \"312\", \"windows\"]") from None
        if platform not in PLATFORMS:
            raise BadInput(where, key, item, f"unknown platform (expected one of {', '.join(PLATFORMS)})")
        row = grid.row(cell[0], torch)
        if row is None or cell[2] not in row.pythons:
            raise BadInput(where, key, item, "names no cell of grid.generated.yml (regenerate both: make matrix)")
        out.add(cell)
    return frozenset(out)
