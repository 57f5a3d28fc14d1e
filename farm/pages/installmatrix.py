"""The `install/` page: what installs from this index, as `farm check-install` found it (design.md §10.4).

Like PyG's wheel pages, a table says which Pythons each channel serves; below it, per channel, the
lines to type and, per package and Python, whether pip and uv installed and imported it, each failure
with its first line. Static HTML from install-matrix.json (written beside it by the same command), every
string escaped; its one script only puts the page's own address into the install lines.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from farm.pages.matrix import _e
from farm.platforms import LABELS
from farm.versions import vtuple

MATRIX_FILE = "install-matrix.json"
PAGE = "install/index.html"
WORKS = "installs and imports"
_PLACE = "\0"   # where the index's address goes in a line, until the page's script knows it

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;max-width:80rem;color:#222}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}
th,td{border:1px solid #ccc;padding:.2rem .5rem;text-align:center;font-variant-numeric:tabular-nums}
th[scope=row],td.name{text-align:left;white-space:nowrap}
pre{background:#f4f4f4;padding:.5rem;white-space:pre-wrap;word-break:break-all;font-family:ui-monospace,monospace}
.works{background:#d9f2d9}.fails{background:#f8d0d0}.none{color:#bbb}.skip{background:#eee}
ul.errors li{font-family:ui-monospace,monospace;font-size:.85rem;margin:.2rem 0}
nav a{margin-right:.8rem}
"""
_SCRIPT = ("<script>const base = new URL('../', location.href).href;"
           "for (const e of document.querySelectorAll('.here')) e.textContent = base;</script>")


def load_matrix(root: Path) -> dict | None:
    """The house's install-matrix.json, or None when no check has run (or the file is not one)."""
    try:
        data = json.loads((Path(root) / MATRIX_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("cells"), list) else None


def _line(words: list[str]) -> str:
    from farm.arch.find import command_line

    text = _e(command_line(words))
    return text.replace(_e(_PLACE), '<span class="here">&lt;index&gt;/</span>')


def _cell_status(matrix: dict, cell_id: str) -> str:
    """works / fails / none for one cell over every package and installer."""
    seen = [entry[i]["status"] for by_cell in matrix["results"].values() if (entry := by_cell.get(cell_id))
            for i in matrix["installers"] if i in entry]
    if not seen:
        return "none"
    return "works" if all(s == WORKS for s in seen) else "fails"


def render_install_page(matrix: dict | None) -> str:
    """install/index.html; with no matrix, a page saying how to make one."""
    head = ['<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>What installs from this index</title>", f"<style>{_STYLE}</style></head><body>",
            "<h1>What installs from this index</h1>",
            '<nav><a href="../">find your wheel</a><a href="../matrix/">PyTorch wheel matrix</a>'
            '<a href="../install-matrix.json">install-matrix.json</a></nav>']
    if matrix is None:
        return "\n".join([*head, '<p id="none">No install check has run on this index yet: '
                                 "<code>farm check-install</code> writes this page.</p>", "</body></html>"]) + "\n"
    from farm.arch.find import pip_words, uv_words

    cells = matrix["cells"]
    skipped = {s["cell"]: s["reason"] for s in matrix.get("not_checked", [])}
    channels: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for c in cells:
        channels[(c["channel"], c["cuda"], c["torch"])].append(c)
    pythons = sorted({c["python"] for c in cells}, key=vtuple)
    out = [*head,
           f'<p>Checked {_e(matrix["generated"])} with {_e(" and ".join(matrix["installers"]))}, each in a fresh '
           f'venv per channel and Python, through this index; torch came from {_e(matrix["torch_from"])}. '
           f'{matrix["counts"]["works"]} installed and imported, {matrix["counts"]["fails"]} failed.</p>',
           "<h2>Which Pythons each channel serves</h2>", '<table id="pythons"><thead><tr><th scope="col">channel</th>'
           + "".join(f'<th scope="col">Python {_e(p)}</th>' for p in pythons) + "</tr></thead><tbody>"]
    ordered = sorted(channels.items(), key=lambda kv: (vtuple(kv[0][1]), vtuple(kv[0][2])))
    for (path, _, _), group in ordered:
        row = [f'<tr><th scope="row"><a href="#{_e(path.strip("/").replace("/", "-"))}">{_e(path)}</a></th>']
        for python in pythons:
            here = [c for c in group if c["python"] == python]
            if not here:
                row.append('<td class="none">&middot;</td>')
                continue
            marks = []
            for c in here:
                state = "skip" if c["id"] in skipped else _cell_status(matrix, c["id"])
                text = {"works": "\u2713", "fails": "\u2717", "skip": "not checked", "none": "?"}[state]
                title = skipped.get(c["id"], LABELS.get(c["platform"], c["platform"]))
                marks.append(f'<span class="{state}" title="{_e(title)}">{text} {_e(LABELS.get(c["platform"], ""))}</span>')
            state = "skip" if all(c["id"] in skipped for c in here) else _cell_status(matrix, here[0]["id"])
            row.append(f'<td class="{state}">{"<br>".join(marks)}</td>')
        out.append("".join(row) + "</tr>")
    out += ["</tbody></table>",
            "<p>A Python or platform a channel does not serve finds no wheel there: pip says "
            "&quot;from versions: none&quot;. Install the channel's torch first, then type the line of your channel.</p>"]
    for (path, cuda, torch), group in ordered:
        anchor = path.strip("/").replace("/", "-")
        served = ", ".join(f"{c['python']} ({LABELS.get(c['platform'], c['platform'])})"
                           for c in sorted(group, key=lambda c: vtuple(c["python"])))
        out += [f'<h2 id="{_e(anchor)}">{_e(path)}: CUDA {_e(cuda)}, torch {_e(torch)}</h2>',
                f"<p>Serves Python {_e(served)}. Torch {_e(group[0].get('torch_pin') or torch)} first, then:</p>"]
        projects = sorted({p for c in group for p in c["packages"]})
        for project in projects:
            version = next((matrix["results"].get(project, {}).get(c["id"], {}).get("version") for c in group
                            if c["id"] in matrix["results"].get(project, {})), None)
            if version is None:
                continue
            pin = f"{project}=={version}"
            out.append(f'<pre class="install">{_line(pip_words(_PLACE + path, pin))}\n'
                       f'{_line(uv_words(_PLACE + path, pin))}</pre>')
        out.append('<table class="results"><thead><tr><th scope="col">package</th>'
                   + "".join(f'<th scope="col">{_e(i)} py{_e(c["python"])}</th>'
                             for c in sorted(group, key=lambda c: vtuple(c["python"])) for i in matrix["installers"])
                   + "</tr></thead><tbody>")
        errors = []
        for project in projects:
            tds = []
            for c in sorted(group, key=lambda c: vtuple(c["python"])):
                entry = matrix["results"].get(project, {}).get(c["id"])
                for i in matrix["installers"]:
                    if c["id"] in skipped:
                        tds.append(f'<td class="skip" title="{_e(skipped[c["id"]])}">not checked</td>')
                    elif entry is None or i not in entry:
                        tds.append('<td class="none">&middot;</td>')
                    elif entry[i]["status"] == WORKS:
                        tds.append(f'<td class="works">{_e(WORKS)}</td>')
                    else:
                        tds.append(f'<td class="fails" title="{_e(entry[i].get("error", ""))}">fails</td>')
                        errors.append(f"<li>{_e(project)} on {_e(c['id'])} with {_e(i)}: {_e(entry[i].get('error', ''))}</li>")
            out.append(f'<tr><td class="name">{_e(project)}</td>{"".join(tds)}</tr>')
        out.append("</tbody></table>")
        if errors:
            out += ['<ul class="errors">', *errors, "</ul>"]
    if skipped:
        out += ["<h2>Not checked here</h2>", "<ul>", *(f"<li>{_e(c)}: {_e(r)}</li>" for c, r in skipped.items()), "</ul>"]
    out += [_SCRIPT, "</body></html>"]
    return "\n".join(out) + "\n"
