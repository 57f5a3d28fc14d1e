"""The compiler cache shared by the cells of a (CUDA, torch) group (design.md §11.3): ccache wrapping nvcc.

What the farm decides, explicitly, and records in every build record (`compiler_cache`):

- nvcc goes through `PYTORCH_NVCC="ccache <the toolkit's nvcc>"` (torch's ninja files read it),
  never `CXX="ccache g++"`, which fails torch's compiler version check;
- C++ files go through `CXX=<work>/ccache-bin/<the compiler's name>`, a script that runs
  `ccache <the real CXX>`. torch before 2.13 calls $CXX bare, so no C++ file of a torch 2.11 or 2.12
  build was ever looked up (measured: nvdiffrec_render's common.cpp and torch_bindings.cpp, in every
  torch 2.11 and 2.12 cell of the slice); torch 2.13 prepends ccache itself (`_wrap_compiler`), which
  the farm turns off (`TORCH_NO_COMPILER_WRAPPER=1`), so that every torch compiles C++ the same way.
  The script's name is the compiler's, which is what torch's compiler check looks for in the path.
  With the cache off the farm sets `TORCH_NO_COMPILER_WRAPPER=1` and `CCACHE_DISABLE=1`: an
  image's ccache never acts silently.
- CMake builds (pyg_lib, a scikit-build-core project) go through `CMAKE_{C,CUDA}_COMPILER_LAUNCHER`
  (CMake 3.17 and later read them from the environment), and their C++ through the same $CXX script:
  they use neither torch's ninja files nor PYTORCH_NVCC, and their compiles were never looked up;
- one CCACHE_DIR per (CUDA, torch) group under cache_dir()/ccache (mounted at
  /farm/cache/ccache in containers): objects of one group never serve another;
- CCACHE_BASEDIR = the cell's work dir, CCACHE_NOHASHDIR, and sloppiness for what changes between
  two builds of the same source: a fresh copy per build (include mtimes/ctimes), __FILE__ and
  __DATE__/__TIME__, the build folder's name;
- CCACHE_STATSLOG per build, so the record carries the per-file hit/miss of that build alone
  (the shared counters mix concurrent builds);
- CCACHE_NAMESPACE from NVCC_APPEND_FLAGS and NVCC_PREPEND_FLAGS: nvcc reads them from its
  environment, and ccache hashes the command line, not the environment, so without it a change of
  them (a recipe's nvcc_flags, the compile's -ffile-prefix-map) is served the object compiled
  under the old ones (measured: `-DVALUE=2` got the `-DVALUE=1` object, a direct hit).

The step expands `{NVCC}` in the environment to the toolkit's nvcc and drops the cache (recording
why) when the runner has no ccache.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from farm import settings
from farm.process import run
from farm.versions import cuda_tag

TOOL = "ccache"
NVCC_PLACEHOLDER = "{NVCC}"
MAX_SIZE = "5G"   # per group; ccache evicts least recently used objects past it
SLOPPINESS = "include_file_mtime,include_file_ctime,time_macros,file_macro,pch_defines,locale"
CMAKE_LAUNCHERS = tuple(f"CMAKE_{language}_COMPILER_LAUNCHER" for language in ("C", "CUDA"))   # C++: $CXX
CXX_WRAPPER_DIR = "ccache-bin"   # in the cell's work folder


def group_name(cuda: str, torch: str | None, links_torch: bool = True) -> str:
    """`cu130-torch2.13`, or `cu130` for torch-free cells."""
    return f"{cuda_tag(cuda)}-torch{torch}" if links_torch and torch else cuda_tag(cuda)


def group_dir(cuda: str, torch: str | None, links_torch: bool = True) -> Path:
    """settings.ccache_dir()/<group>."""
    return settings.ccache_dir() / group_name(cuda, torch, links_torch)


def find_ccache() -> str | None:
    return shutil.which(TOOL)


def ensure_ccache(log: Callable[[str], None] = print) -> str | None:
    """ccache on this host: found on PATH, else `apt-get install -y ccache` when root on a Debian host."""
    found = find_ccache()
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    log("ccache: not installed; apt-get install -y ccache")
    for cmd in (["apt-get", "install", "-y", "-q", TOOL], ["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", TOOL]):
        done = run(cmd, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if cmd[1] == "install" and done.returncode == 0:
            break
    return find_ccache()


def cache_env(*, enabled: bool, ccache_dir: str = "", basedir: str = "", stats_log: str = "") -> dict[str, str]:
    """The variables the compile step adds (paths as the step sees them)."""
    if not enabled:
        return {"TORCH_NO_COMPILER_WRAPPER": "1", "CCACHE_DISABLE": "1"}
    return {
        "PYTORCH_NVCC": f"{TOOL} {NVCC_PLACEHOLDER}",
        **{launcher: TOOL for launcher in CMAKE_LAUNCHERS},
        "TORCH_NO_COMPILER_WRAPPER": "1",   # C++ goes through the farm's $CXX script, for every torch
        "CCACHE_DIR": ccache_dir,
        "CCACHE_BASEDIR": basedir,
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_SLOPPINESS": SLOPPINESS,
        "CCACHE_COMPILERCHECK": "content",
        "CCACHE_MAXSIZE": MAX_SIZE,
        "CCACHE_STATSLOG": stats_log,
        "CCACHE_UMASK": "002",
    }


def decision(enabled: bool, group: str | None = None) -> dict[str, Any]:
    """What the build record says about the cache (before the step adds its findings)."""
    if not enabled:
        return {"enabled": False, "torch_wrapper": "off (TORCH_NO_COMPILER_WRAPPER=1)", "nvcc": "nvcc"}
    return {"enabled": True, "tool": TOOL, "group": group, "nvcc": f"PYTORCH_NVCC={TOOL} <toolkit nvcc>",
            "cmake": f"CMAKE_{{C,CUDA}}_COMPILER_LAUNCHER={TOOL}", "cxx": f"CXX=<work>/{CXX_WRAPPER_DIR}/<c++>",
            "torch_wrapper": "off (TORCH_NO_COMPILER_WRAPPER=1; the farm's $CXX script, for every torch)"}


def resolve_in_step(env: dict[str, str], nvcc: Path | str, work: Path) -> dict[str, Any]:
    """Inside the step: expand {NVCC} and put $CXX through the cache (a script in `work`); without ccache
    in the runner, turn the cache off and say so."""
    if "PYTORCH_NVCC" not in env:
        return {"active": False}
    exe = shutil.which(TOOL, path=env.get("PATH"))
    if exe is None:
        for key in [k for k in env if k.startswith("CCACHE_")] + ["PYTORCH_NVCC", *CMAKE_LAUNCHERS]:
            env.pop(key, None)
        env.update(cache_env(enabled=False))
        return {"active": False, "why": "no ccache on the runner's PATH"}
    env["PYTORCH_NVCC"] = env["PYTORCH_NVCC"].replace(NVCC_PLACEHOLDER, str(nvcc))
    cxx = shutil.which(env.get("CXX") or "c++", path=env.get("PATH"))
    if cxx is not None:
        env["CXX"] = str(cxx_through_cache(exe, cxx, Path(work) / CXX_WRAPPER_DIR))
    env.update(nvcc_namespace(env))
    if env.get("CCACHE_DIR"):
        Path(env["CCACHE_DIR"]).mkdir(parents=True, exist_ok=True)
    if env.get("CCACHE_STATSLOG"):
        Path(env["CCACHE_STATSLOG"]).unlink(missing_ok=True)   # this build's lines only
    version = run([exe, "--version"]).stdout.split("\n")[0]
    return {"active": True, "ccache": exe, "version": version.replace("ccache version ", "").strip(),
            **({"cxx": env["CXX"]} if cxx is not None else {})}


def cxx_through_cache(ccache: str, compiler: str, folder: Path) -> Path:
    """`folder/<compiler's name>`: a script that runs `ccache <compiler>` with its arguments. ccache hashes
    the real compiler (CCACHE_COMPILERCHECK=content), not the script, so cells whose scripts lie in work
    folders of their own still share objects."""
    script = folder / Path(compiler).name
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{script.name}.tmp"
    tmp.write_text(f'#!/bin/sh\nexec {shlex.quote(ccache)} {shlex.quote(compiler)} "$@"\n')
    tmp.chmod(0o755)
    os.replace(tmp, script)
    return script


NVCC_ENV_FLAGS = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")


def nvcc_namespace(env: Mapping[str, str]) -> dict[str, str]:
    """{"CCACHE_NAMESPACE": ...} naming the nvcc flags `env` passes through the environment (ccache mixes
    the namespace into every hash), or {} when it passes none. C++ compiles share the namespace: they
    only split the same way, never hit wrongly."""
    flags = [f"{k}={_without_map_sources(env[k])}" for k in NVCC_ENV_FLAGS if env.get(k)]
    if not flags:
        return {}
    return {"CCACHE_NAMESPACE": "nvcc-" + hashlib.sha256("\n".join(flags).encode()).hexdigest()[:16]}


def _without_map_sources(flags: str) -> str:
    """`flags` with the -ffile-prefix-map flags replaced by one word saying that there are some.

    Which folder a map names, and to what, differs between sibling cells (their work folders, torch
    environments and Python headers differ by Python), yet a map only rewrites paths the compile reads,
    and ccache hashes those already: the siblings share their CUDA objects, as they did before the maps
    (design.md §11.3). The word keeps apart objects compiled without maps, which name host folders."""
    words = flags.split()
    kept = [w for w in words if "-ffile-prefix-map=" not in w]
    return " ".join(kept + ["<prefix maps>"] if len(kept) < len(words) else kept)


HIT_COUNTERS = ("direct_cache_hit", "preprocessed_cache_hit")


def read_stats_log(path: Path | str) -> dict[str, Any]:
    """Per-file outcome of one build from ccache's stats log: {hits, misses, uncacheable, files: {file: outcome}}.

    The log is blocks of `# <source file>` followed by counter names; a block with a *_cache_hit
    counter is a hit, one with cache_miss a miss, anything else an uncacheable call (named by its
    first counter, e.g. called_for_preprocessing). Calls that compile nothing are left out: a link
    and a `g++ -v` (torch's compiler check) go through the $CXX script too.
    """
    files: dict[str, str] = {}
    current: str | None = None
    counters: list[str] = []

    def close() -> None:
        if current is None or counters in (["called_for_link"], ["no_input_file"]):
            return
        if any(c in HIT_COUNTERS for c in counters):
            outcome = "hit"
        elif "cache_miss" in counters:
            outcome = "miss"
        else:
            outcome = f"uncacheable:{counters[0] if counters else '?'}"
        files[current] = outcome

    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        if line.startswith("# "):
            close()
            current, counters = line[2:].strip(), []
        elif line.strip():
            counters.append(line.strip())
    close()
    hits = sum(1 for v in files.values() if v == "hit")
    misses = sum(1 for v in files.values() if v == "miss")
    cacheable = hits + misses
    return {"hits": hits, "misses": misses, "uncacheable": len(files) - cacheable,
            "hit_rate": round(hits / cacheable, 3) if cacheable else None, "files": files}
