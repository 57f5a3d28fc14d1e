"""The wheelhouse's front page: find your wheel (design.md §3.7, §10).

The farm decides, the page only looks up. `find.json`, written beside the
page, holds every channel (from the grid) and, for the policy's arch lists
and for each recipe, every device's verdict on every channel, computed by
farm.arch.find / farm.arch.coverage with design.md §3.7's rules. The page's inline script
filters those by platform, Python, GPU (name or sm), CUDA and torch, orders
them as `farm find` does (native first, then JIT-only; newest torch, then
newest CUDA), falls back as `farm find` does when an installed torch has no
channel, and prints the exact-pin command. When a package is chosen it also
reads `packages/<project>.json` (written by every publish) to pin the version
that is really in the channel. No external scripts, styles or fonts.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from farm.errors import FarmError
from farm.platforms import LABELS, PLATFORMS
from farm.versions import cuda_tag
from farm.wheelhouse.index import write_files

CODES = {"native": "n", "jit-only": "j", "unknown": "u", "dead": "d"}
NOT_BUILT = "x"      # the recipe does not build this channel
NOT_THERE = "-"      # the device does not live on the channel's platform


def find_data(defaults, grid, recipes: dict | None = None) -> dict:
    """Everything the find page shows, as plain data: channels, devices, verdicts, reasons, fallbacks."""
    from farm.arch.find import PYPI_SIMPLE, channel_verdict, channels

    all_channels = channels(defaults, grid)
    index = {(c.cuda, c.torch, c.platform): i for i, c in enumerate(all_channels)}
    devices = list(defaults.gpus.devices)
    reasons: dict[str, int] = {}

    def verdict_rows(recipe) -> tuple[list[str], list[list[int]]]:
        codes = [NOT_BUILT * len(devices)] * len(all_channels)
        why: list[list[int]] = [[] for _ in all_channels]
        for c in channels(defaults, grid, None, recipe):
            i = index[(c.cuda, c.torch, c.platform)]
            row, rs = [], []
            for d in devices:
                if c.platform not in d.platforms:
                    row.append(NOT_THERE)
                    rs.append(-1)
                    continue
                try:
                    v = channel_verdict(d, c, defaults, recipe)
                except FarmError as exc:  # the recipe cannot resolve an arch list here: it does not build it
                    row.append(NOT_BUILT)
                    rs.append(reasons.setdefault(f"not built: {exc}", len(reasons)))
                    continue
                row.append(CODES[v.status])
                rs.append(reasons.setdefault(v.reason, len(reasons)))
            codes[i] = "".join(row)
            why[i] = rs
        return codes, why

    tables = {"": verdict_rows(None)}
    packages = {}
    for name, recipe in sorted((recipes or {}).items()):
        tables[name] = verdict_rows(recipe)
        packages[name] = {"version": recipe.version, "links_torch": recipe.links_torch,
                          "platforms": list(recipe.platforms)}
    return {
        "pypi": PYPI_SIMPLE,
        "platforms": [{"id": p, "label": LABELS[p]} for p in PLATFORMS],
        "devices": [{"cc": d.cc_text, "alias": f"{d.alias[0]}.{d.alias[1]}" if d.alias else None,
                     "name": d.name, "products": list(d.products), "platforms": list(d.platforms),
                     "tegra": d.tegra, "current": d.current} for d in devices],
        "channels": [{"cuda": c.cuda, "torch": c.torch, "platform": c.platform, "pythons": list(c.pythons),
                      "path": c.path, "label": cuda_tag(c.cuda) + f"torch{c.torch}"} for c in all_channels],
        "fallback": {p: {"cuda": c, "torch": t} for p, (c, t) in defaults.grid_policy.fallback.items()},
        "packages": packages,
        "verdicts": {name: codes for name, (codes, _) in tables.items()},
        "why": {name: why for name, (_, why) in tables.items()},
        "reasons": sorted(reasons, key=reasons.__getitem__),
    }


_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5rem;max-width:72rem;color:#222}
form{display:grid;grid-template-columns:repeat(auto-fill,minmax(13rem,1fr));gap:.6rem 1rem;margin:1rem 0}
label{display:flex;flex-direction:column;font-size:.9rem;gap:.2rem}
input,select{font:inherit;padding:.25rem}
code,pre{font-family:ui-monospace,monospace}
pre{background:#f4f4f4;padding:.6rem;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;margin:.5rem 0}
th,td{border:1px solid #ccc;padding:.2rem .5rem;text-align:left}
.native{color:#070}.jit-only{color:#a60}.note{background:#fff6d5;padding:.5rem}.none{background:#fde;padding:.5rem}
nav a{margin-right:.8rem}
"""

_SCRIPT = r"""
(function () {
  const $ = (id) => document.getElementById(id);
  const STATUS = {n: "native", j: "jit-only", u: "unknown", d: "dead"};
  let data = null;
  const houseCache = {};
  const squash = (s) => s.toLowerCase().replace(/[^a-z0-9]/g, "");
  const vkey = (v) => v.split(".").map(Number);
  const vcmp = (a, b) => { const x = vkey(a), y = vkey(b);
    for (let i = 0; i < Math.max(x.length, y.length); i++) { const d = (x[i] || 0) - (y[i] || 0); if (d) return d; }
    return 0; };
  function option(sel, value, text) { const o = document.createElement("option"); o.value = value; o.textContent = text; sel.appendChild(o); }

  function device(text) {
    const t = text.trim();
    if (!t) return null;
    const m = t.toLowerCase().match(/^(?:sm[_ ]?)?(\d{1,2})\.?(\d)$/);
    if (m) {
      const cc = m[1] + "." + m[2];
      return data.devices.findIndex((d) => d.cc === cc || d.alias === cc);
    }
    const want = squash(t.replace(/\s*\(sm [\d.]+\)$/, ""));
    let i = data.devices.findIndex((d) => d.products.some((p) => squash(p) === want));
    if (i >= 0) return i;
    const loose = data.devices.map((d, k) => [d, k]).filter(([d]) => d.products.some((p) => squash(p).includes(want)));
    return loose.length === 1 ? loose[0][1] : -1;
  }

  function pin(pkg, ch, version) {
    const info = pkg ? data.packages[pkg] : null;
    const label = (info && !info.links_torch) ? ch.label.replace(/torch.*$/, "") : ch.label;
    if (!pkg) return "<package>==<version>+" + label;
    if (version) return pkg + "==" + version;
    return pkg + "==" + (info.version || "<version>") + "+" + label;
  }

  function published(pkg, ch, python) {
    const wheels = houseCache[pkg] || [];
    const hits = wheels.filter((w) => !w.yanked && w.platform === ch.platform && w.channels.includes(ch.path) &&
                                      (w.pythons || []).includes(python));
    const pub = (w) => w.version.split("+")[0];   // numeric order: 0.10.0 after 0.9.0
    hits.sort((a, b) => vcmp(pub(b), pub(a)));
    return hits.length ? hits[0].version : null;
  }

  function render() {
    const out = $("result");
    out.textContent = "";
    const platform = $("platform").value, python = $("python").value, pkg = $("package").value;
    const cuda = $("cuda").value, torch = $("torch").value;
    const di = device($("gpu").value);
    if (di === null) { out.innerHTML = "<p>Choose a GPU (a name like <i>RTX 4090</i> or an sm like <i>8.9</i>).</p>"; return; }
    if (di < 0) { const p = document.createElement("p"); p.className = "none"; p.id = "verdict";
      p.textContent = "No GPU called \u201c" + $("gpu").value + "\u201d in the farm's table."; out.appendChild(p); return; }
    const dev = data.devices[di];
    const table = data.verdicts[pkg] || data.verdicts[""], why = data.why[pkg] || data.why[""];
    const code = (i) => table[i][di];
    let candidates = data.channels.map((c, i) => [c, i]).filter(([c, i]) =>
      c.platform === platform && c.pythons.includes(python) && code(i) !== "x" && (!cuda || c.cuda === cuda));
    const notes = [];
    // farm find's order (native, newest torch, newest CUDA); with a package, channels that hold its wheel first.
    const held = (c) => (pkg && published(pkg, c, python) ? 0 : 1);
    const serving = (list) => list.filter(([, i]) => code(i) === "n" || code(i) === "j").sort(([a, i], [b, k]) =>
      held(a) - held(b) || (code(i) === "n" ? 0 : 1) - (code(k) === "n" ? 0 : 1) || vcmp(b.torch, a.torch) ||
      vcmp(b.cuda, a.cuda));
    let chosen = candidates;
    if (torch) {
      chosen = candidates.filter(([c]) => c.torch === torch);
      if (!serving(chosen).length) {
        const fb = data.fallback[platform];
        const reason = chosen.length ? "no torch " + torch + " channel serves " + dev.name :
          "torch " + torch + " has no channel for " + platform + " / Python " + python;
        if (fb) {
          notes.push(reason + "; falling back to the " + platform + " fallback cu" + fb.cuda.replace(".", "") +
                     "/torch" + fb.torch + " (install torch " + fb.torch + " from the CUDA " + fb.cuda + " index with it)");
          chosen = candidates.filter(([c]) => c.cuda === fb.cuda && c.torch === fb.torch);
        } else notes.push(reason);
      }
    }
    const good = serving(chosen);
    for (const n of notes) { const p = document.createElement("p"); p.className = "note"; p.textContent = n; out.appendChild(p); }
    if (!good.length) {
      const p = document.createElement("p"); p.className = "none"; p.id = "verdict";
      const dead = chosen.map(([, i]) => why[i][di]).filter((r) => r >= 0).map((r) => data.reasons[r]);
      let text = "No channel serves " + dev.name + " (sm " + dev.cc + ") on " + platform + " / Python " + python + ".";
      if (dev.tegra) text += " It is a Tegra (Jetson) GPU: it runs only cubins built for its own compute capability, " +
                             "and no channel's torch carries one or PTX at or below it. Jetson users need NVIDIA's JetPack torch.";
      if (!chosen.length) text += " No channel exists for that choice.";
      else if (dead.length) text += " For example: " + dead[0];
      p.textContent = text; out.appendChild(p); return;
    }
    const [best, bi] = good[0];
    const url = new URL(best.path, document.baseURI).href;
    const version = pkg ? published(pkg, best, python) : null;
    const pinned = pin(pkg, best, version);
    const h = document.createElement("h2"); h.textContent = "Install"; out.appendChild(h);
    const cmd = document.createElement("pre"); cmd.id = "command";
    cmd.textContent = "pip install --index-url " + url + " --extra-index-url " + data.pypi + " '" + pinned + "'";
    out.appendChild(cmd);
    const uv = document.createElement("pre"); uv.id = "command-uv";
    uv.textContent = "uv pip install --index-url " + data.pypi + " --extra-index-url " + url + " '" + pinned + "'";
    out.appendChild(uv);
    const p = document.createElement("p"); p.id = "verdict";
    p.textContent = dev.name + " (sm " + dev.cc + ") is " + STATUS[code(bi)] + " on " + best.path + ": " + data.reasons[why[bi][di]] +
      (pkg && !version ? ". Not published in this wheelhouse yet." : "");
    out.appendChild(p);
    const t = document.createElement("table"); t.id = "channels";
    t.innerHTML = "<thead><tr><th>channel</th><th>CUDA</th><th>torch</th><th>verdict</th><th>published</th></tr></thead>";
    const body = document.createElement("tbody");
    for (const [c, i] of good) {
      const tr = document.createElement("tr");
      const cells = [c.path, c.cuda, c.torch, STATUS[code(i)], pkg ? (published(pkg, c, python) || "not yet") : ""];
      cells.forEach((v, k) => { const td = document.createElement("td"); td.textContent = v;
        if (k === 3) td.className = STATUS[code(i)]; if (k === 0) td.title = data.reasons[why[i][di]]; tr.appendChild(td); });
      body.appendChild(tr);
    }
    t.appendChild(body); out.appendChild(t);
  }

  function refill() {
    const platform = $("platform").value;
    const keep = $("python").value, keepCuda = $("cuda").value, keepTorch = $("torch").value;
    const chs = data.channels.filter((c) => c.platform === platform);
    const pys = [...new Set(chs.flatMap((c) => c.pythons))].sort(vcmp);
    $("python").textContent = ""; pys.forEach((p) => option($("python"), p, "Python " + p));
    $("python").value = pys.includes(keep) ? keep : pys[pys.length - 1] || "";
    $("cuda").textContent = ""; option($("cuda"), "", "any");
    [...new Set(chs.map((c) => c.cuda))].sort(vcmp).forEach((c) => option($("cuda"), c, "CUDA " + c));
    $("cuda").value = keepCuda;
    $("torch").textContent = ""; option($("torch"), "", "any (the torch I have is not fixed)");
    // every torch of any channel: an installed torch without a channel here is what the fallback is for
    [...new Set(data.channels.map((c) => c.torch))].sort(vcmp).forEach((t) => option($("torch"), t, "torch " + t));
    $("torch").value = keepTorch;
  }

  function loadPackage() {
    const pkg = $("package").value;
    if (!pkg || houseCache[pkg]) { render(); return; }
    const project = pkg.toLowerCase().replace(/[-_.]+/g, "-");
    fetch("packages/" + encodeURIComponent(project) + ".json").then((r) => r.ok ? r.json() : [])
      .catch(() => []).then((w) => { houseCache[pkg] = w; render(); });
  }

  fetch("find.json").then((r) => r.json()).then((d) => {
    data = d;
    d.platforms.forEach((p) => option($("platform"), p.id, p.label));
    d.devices.forEach((dev) => option($("gpus"), dev.name + " (sm " + dev.cc + ")", ""));
    option($("package"), "", "any package");
    Object.keys(d.packages).forEach((p) => option($("package"), p, p));
    refill();
    ["platform"].forEach((id) => $(id).addEventListener("change", () => { refill(); render(); }));
    ["python", "cuda", "torch"].forEach((id) => $(id).addEventListener("change", render));
    $("gpu").addEventListener("input", render);
    $("package").addEventListener("change", loadPackage);
    document.body.dataset.ready = "1";
    render();
  });
})();
"""


def render_find(title: str = "Find your CUDA wheel") -> str:
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{_STYLE}</style></head><body>
<h1>{escape(title)}</h1>
<nav><a href="matrix/">PyTorch wheel matrix</a><a href="install/">what installs</a><a href="archs/">arch lists and coverage</a><a href="simple/">simple index</a><a href="packages.json">packages.json</a></nav>
<p>Pick your platform, Python and GPU (and the torch you have, if any). The answer is a channel of this
index and an exact pin, so a same-named project on PyPI with a higher version can never win.</p>
<form id="find" onsubmit="return false">
<label>Platform <select id="platform"></select></label>
<label>Python <select id="python"></select></label>
<label>GPU (name or sm) <input id="gpu" list="gpus" placeholder="RTX 4090 or 8.9" autocomplete="off"><datalist id="gpus"></datalist></label>
<label>Installed torch <select id="torch"></select></label>
<label>CUDA <select id="cuda"></select></label>
<label>Package <select id="package"></select></label>
</form>
<div id="result" aria-live="polite"></div>
<script>{_SCRIPT}</script>
</body></html>
"""


def write_site(wheelhouse, defaults=None, grid=None, recipes=None, pcwm=None) -> list[Path]:
    """The wheelhouse's human pages: index.html + find.json, matrix/, archs/, install/ (design.md §10).

    They depend on the policy, the grid and the recipes, not on the wheels
    (the find page reads packages/<project>.json live), so publishing never
    rewrites them; `farm index pages` does.
    """
    from farm.matrix.grid import load_grid, load_pcwm
    from farm.pages.archs import render_archs
    from farm.pages.installmatrix import PAGE as INSTALL_PAGE
    from farm.pages.installmatrix import load_matrix, render_install_page
    from farm.pages.matrix import render_matrix
    from farm.policy import load_defaults
    from farm.recipes.reader import load_recipes

    defaults = defaults or load_defaults()
    grid = grid or load_grid(defaults.folder)
    pcwm = pcwm or load_pcwm(defaults.folder)
    recipes = load_recipes(defaults=defaults) if recipes is None else recipes
    data = find_data(defaults, grid, recipes)
    root = Path(wheelhouse)
    files = [("find.json", (json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n").encode()),
             ("index.html", render_find().encode()),
             (INSTALL_PAGE, render_install_page(load_matrix(root)).encode()),
             ("matrix/index.html", render_matrix(pcwm, grid).encode()),
             ("archs/index.html", render_archs(defaults, grid).encode())]
    write_files(root, files)
    return [root / rel for rel, _ in files]
