"""The `matrix/` pages: the PCWM per CUDA line (design.md §10.2), static HTML.

One table per CUDA line: a row per torch version (newest first), a column per
Python, and in each cell a mark per platform with a wheel (L = linux x86_64,
W = windows, A = linux aarch64). With a grid, the rows that are a grid pin say
for which platforms. No scripts, no external resources; every string escaped.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from farm.matrix.grid import Grid, Pcwm, torch_key
from farm.platforms import PLATFORMS, to_pcwm
from farm.versions import cuda_tag, minor_of, vtuple
from farm.yamlio import write_atomic

MARKS = {"linux": "L", "windows": "W", "linux_aarch64": "A"}
_NONE = '<span class="none">&middot;</span>'

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}
table{border-collapse:collapse;margin:0 0 2rem}
th,td{border:1px solid #ccc;padding:.2rem .5rem;text-align:center;font-variant-numeric:tabular-nums}
th[scope=row]{text-align:left;white-space:nowrap}
.m{display:inline-block;min-width:1.1em;font-weight:600}
.linux{color:#0a5}.windows{color:#06c}.linux_aarch64{color:#a50}
.none{color:#bbb}.pin{font-size:.8em;color:#555;font-weight:normal}
nav a{margin-right:.8rem}
"""


def _e(value) -> str:
    return escape(str(value), quote=True)


def _line_table(pcwm: Pcwm, cuda: str, grid: Grid | None) -> str:
    combos = [c for c in pcwm.combos if c.cuda == cuda]
    pythons = sorted({c.python for c in combos}, key=vtuple)
    have: dict[tuple[str, str], set[str]] = {(c.torch, c.python): set() for c in combos}
    for c in combos:
        have[(c.torch, c.python)].add(c.platform)
    tag = cuda_tag(cuda)
    out = [f'<h2 id="{_e(tag)}">CUDA {_e(cuda)} ({_e(tag)})</h2>', "<table>",
           "<thead><tr><th scope=\"col\">torch</th>"
           + "".join(f'<th scope="col">py{_e(p)}</th>' for p in pythons) + "</tr></thead>", "<tbody>"]
    for torch in sorted({c.torch for c in combos}, key=torch_key, reverse=True):
        row = grid.row(cuda, minor_of(torch)) if grid else None
        pinned = [p for p in PLATFORMS if row is not None and row.pin(p) == torch]
        note = f' <span class="pin">grid pin: {_e(", ".join(pinned))}</span>' if pinned else ""
        cells = []
        for python in pythons:
            platforms = have.get((torch, python), set())
            marks = "".join(f'<span class="m {_e(p)}" title="{_e(to_pcwm(p))}">{_e(MARKS[p])}</span>'
                            for p in PLATFORMS if p in platforms)
            cells.append(f"<td>{marks or _NONE}</td>")
        out.append(f'<tr><th scope="row">{_e(torch)}{note}</th>{"".join(cells)}</tr>')
    out += ["</tbody>", "</table>"]
    return "\n".join(out)


def render_matrix(pcwm: Pcwm, grid: Grid | None = None) -> str:
    """matrix/index.html."""
    nav = " ".join(f'<a href="#{_e(cuda_tag(c))}">{_e(cuda_tag(c))}</a>' for c in pcwm.cudas)
    legend = ", ".join(f'<span class="m {_e(p)}">{_e(m)}</span> {_e(to_pcwm(p))}' for p, m in MARKS.items())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>PyTorch CUDA wheel matrix</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>PyTorch CUDA wheel matrix</h1>",
        f"<p>Every (CUDA, torch, Python, platform) torch wheel published at <code>{_e(pcwm.source)}</code>: "
        f"{len(pcwm.combos)} combinations on {len(pcwm.cudas)} CUDA lines. Marks: {legend}.</p>",
        f"<nav>{nav}</nav>",
        *(_line_table(pcwm, cuda, grid) for cuda in pcwm.cudas),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def write_matrix(out_dir: Path | str, pcwm: Pcwm, grid: Grid | None = None) -> Path:
    """Write <out_dir>/index.html atomically; returns its path."""
    path = Path(out_dir) / "index.html"
    write_atomic(path, render_matrix(pcwm, grid))
    return path
