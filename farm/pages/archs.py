"""The `archs/` page: what the farm compiles for, what torch itself carries, and who each channel serves.

Three sections, static HTML, every string escaped, no scripts:
- the arch policy per CUDA line (x86 lane and ARM lane) and its exceptions (design.md §3);
- the PAM: torch's own arch list per (torch, CUDA, platform) (design.md §3.8);
- coverage: per platform, a row per device and a column per channel, each cell native / JIT-only /
  unknown / dead by design.md §3.7's rules (farm.arch.find.coverage_rows), with the deciding reason as a tooltip;
  devices marked current that a channel leaves dead are flagged.
"""

from __future__ import annotations

from farm.pages.matrix import _e
from farm.platforms import PLATFORMS
from farm.versions import cuda_tag, vtuple

SHORT = {"native": "N", "jit-only": "J", "unknown": "?", "dead": "\u2717"}
_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#222}
table{border-collapse:collapse;margin:0 0 2rem}
th,td{border:1px solid #ccc;padding:.15rem .4rem;text-align:center;font-variant-numeric:tabular-nums}
td.list,th[scope=row]{text-align:left;white-space:nowrap}
code{font-family:ui-monospace,monospace}
.native{background:#d9f2d9}.jit-only{background:#fff0c2}.unknown{background:#e8e8e8}.dead{background:#f8d0d0}
.flag{outline:2px solid #c00}
thead th{position:sticky;top:0;background:#fafafa}
.vertical{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap}
nav a{margin-right:.8rem}
"""


def _policy(defaults) -> list[str]:
    ap = defaults.arch_policy
    cudas = sorted(set(ap.x86) | set(ap.aarch64), key=vtuple)
    out = ['<h2 id="policy">Arch policy (what the farm compiles for)</h2>', '<table id="policy-table">',
           '<thead><tr><th scope="col">CUDA</th><th scope="col">x86 lane (linux, windows)</th>'
           '<th scope="col">ARM lane (linux_aarch64)</th></tr></thead><tbody>']
    for cuda in cudas:
        x86, arm = ap.x86.get(cuda), ap.aarch64.get(cuda)
        out.append(f'<tr><th scope="row">{_e(cuda)} ({_e(cuda_tag(cuda))})</th>'
                   f'<td class="list"><code>{_e(x86 if x86 is not None else "-")}</code></td>'
                   f'<td class="list"><code>{_e(arm if arm is not None else "no ARM row")}</code></td></tr>')
    out.append("</tbody></table>")
    if ap.exceptions:
        out += ['<table id="exceptions"><thead><tr><th scope="col">combo</th><th scope="col">adds (x86 lane)</th>'
                "</tr></thead><tbody>"]
        for (cuda, torch), tokens in sorted(ap.exceptions.items(), key=lambda kv: (vtuple(kv[0][0]), vtuple(kv[0][1]))):
            out.append(f'<tr><th scope="row">CUDA {_e(cuda)} / torch {_e(torch)}</th>'
                       f'<td class="list"><code>{_e(" ".join(str(t) for t in tokens))}</code></td></tr>')
        out.append("</tbody></table>")
    return out


def _pam(defaults) -> list[str]:
    pam = defaults.pam
    out = ['<h2 id="pam">PAM: what torch itself is compiled for</h2>', '<table id="pam-table">',
           '<thead><tr><th scope="col">torch</th><th scope="col">CUDA</th><th scope="col">platform</th>'
           '<th scope="col">torch\'s arch list</th></tr></thead><tbody>']
    rows = [(t, c, "linux", lst) for (t, c), lst in pam.x86.items()]
    rows += [(t, c, "linux_aarch64", lst) for (t, c), lst in pam.aarch64.items()]
    rows += [("every", c, "windows", lst) for c, lst in pam.windows.items()]
    rows.sort(key=lambda r: (vtuple(r[1]), (0,) if r[0] == "every" else vtuple(r[0]), PLATFORMS.index(r[2])))
    for torch, cuda, platform, lst in rows:
        out.append(f'<tr><th scope="row">{_e(torch)}</th><td>{_e(cuda)}</td><td>{_e(platform)}</td>'
                   f'<td class="list"><code>{_e(lst)}</code></td></tr>')
    out.append("</tbody></table>")
    return out


def _coverage(defaults, grid) -> list[str]:
    from farm.arch.find import coverage_rows

    out = ['<h2 id="coverage">Coverage per device</h2>',
           "<p>Each cell: the verdict of the policy's arch list on that channel for that device "
           "(N native, J JIT-only, ? unknown: torch's own list not known, \u2717 dead). Hover for the reason. "
           "A red outline marks a current device the channel leaves dead. Package recipes can differ: "
           "<code>farm coverage --package NAME</code>.</p>"]
    by_platform: dict[str, list] = {p: [] for p in PLATFORMS}
    for channel, verdicts in coverage_rows(defaults, grid):
        by_platform[channel.platform].append((channel, verdicts))
    for platform, rows in by_platform.items():
        if not rows:
            continue
        rows.sort(key=lambda cv: (vtuple(cv[0].cuda), vtuple(cv[0].torch)))
        devices = [d for d in defaults.gpus.devices if platform in d.platforms]
        out.append(f'<h3 id="coverage-{_e(platform)}">{_e(platform)}</h3>')
        out.append(f'<table class="coverage" id="coverage-table-{_e(platform)}"><thead><tr><th scope="col">device</th>'
                   + "".join(f'<th scope="col"><span class="vertical">{_e(cuda_tag(c.cuda))}/torch{_e(c.torch)}</span></th>'
                             for c, _ in rows) + "</tr></thead><tbody>")
        for d in devices:
            cells = []
            for _, verdicts in rows:
                v = verdicts.get(d.cc_text)
                if v is None:
                    cells.append("<td></td>")
                    continue
                flag = " flag" if d.current and v.status == "dead" else ""
                cells.append(f'<td class="{_e(v.status)}{flag}" title="{_e(v.reason)}">{_e(SHORT[v.status])}</td>')
            name = f"{d.name} (sm {d.cc_text}{', Jetson' if d.tegra else ''})"
            out.append(f'<tr><th scope="row">{_e(name)}</th>{"".join(cells)}</tr>')
        out.append("</tbody></table>")
    return out


def render_archs(defaults, grid) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>Arch lists and coverage</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>Arch lists and coverage</h1>",
        '<nav><a href="../">find your wheel</a><a href="../matrix/">PyTorch wheel matrix</a>'
        '<a href="#policy">policy</a><a href="#pam">PAM</a><a href="#coverage">coverage</a></nav>',
        *_policy(defaults),
        *_pam(defaults),
        *_coverage(defaults, grid),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
