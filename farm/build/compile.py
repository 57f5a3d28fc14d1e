"""The compile step (design.md §6.4): one PEP 517 `build_wheel` with an environment that says everything.

`compile_environment()` builds the whole variable set from the cell's resolved
arch list, toolkit and torch environment, starting from a small allow-list of
the caller's variables (never the machine's PIP_* configuration).
`compile_wheel()` calls the source's build backend in the torch environment with
it (what `pip wheel . --no-build-isolation --no-deps` does, minus pip's separate
metadata hook: that hook runs setup.py, and so imports torch, a second time) and
returns the one wheel it made.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path, PurePath
from typing import IO, TYPE_CHECKING, Any

from farm.archlist import ArchList
from farm.build.compilelog import failure_line
from farm.build.hostpaths import nvcc_prefix_map_flags, prefix_map_flags
from farm.build.toolkit import BuildToolkit
from farm.errors import BadInput, CompileFailed, CompileStalled
from farm.process import TimeoutExpired, run, spawn, stop_group
from farm.recipes.buildoutput import by_arch, flags_differences, sample_text, waived_text

if TYPE_CHECKING:
    from farm.build.environments import TorchEnv

# Caller variables a build may legitimately need; everything else starts clean.
PASS_THROUGH = ("HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TERM", "TMPDIR", "TZ", "SOURCE_DATE_EPOCH",
                "CCACHE_DIR", "CCACHE_BASEDIR", "CC", "CXX", "CUDAHOSTCXX", "NVCC_CCBIN", "http_proxy",
                "https_proxy", "no_proxy")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PLACEHOLDER = re.compile(r"\{(ARCHS_TORCH|ARCHS_CMAKE|CUDA_HOME|CUDA)\}")


def _expand(value: object, names: Mapping[str, str], key: str) -> str:
    """Recipe env values may use {ARCHS_TORCH} {ARCHS_CMAKE} {CUDA} {CUDA_HOME}; no shell expansion."""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise BadInput("recipe", f"env.{key}", value, "expected a string")
    text = str(value)
    unknown = [m for m in re.findall(r"(?<!\$)\{([A-Z][A-Z_]*)\}", text) if m not in names]
    if unknown:
        raise BadInput("recipe", f"env.{key}", value,
                       f"unknown placeholder {{{unknown[0]}}} (known: {', '.join('{' + n + '}' for n in names)})")
    return _PLACEHOLDER.sub(lambda m: names[m.group(1)], text)


def _join(*parts: object) -> str:
    out: list[str] = []
    for p in parts:
        for item in (p if isinstance(p, (list, tuple)) else [p]):
            s = str(item) if item else ""
            for piece in s.split(os.pathsep) if s else []:
                if piece and piece not in out:
                    out.append(piece)
    return os.pathsep.join(out)


def linked_includes(dirs: Sequence[str], folder: Path) -> list[str]:
    """`dirs` as links in `folder`, named by their order and package (`00-cu13` for .../nvidia/cu13/include).

    The torch env's nvidia headers (nvtx3, which the toolkit's cub includes, cusparse.h, ...) sit under a
    path that names the env's Python, and the preprocessor writes that path into its output, which ccache
    hashes: no object of one Python then serves another (measured: diso's .cu files, 0 hits across four
    Pythons). The links' path is the same for every Python of a row: a container sees every cell's work
    dir at one mount point, and gcc keeps a shorter path than the link's target."""
    folder.mkdir(parents=True, exist_ok=True)
    return [str(_link(folder / f"{i:02d}-{PurePath(target).parent.name}", target)) for i, target in enumerate(dirs)]


def torch_at_one_path(torch_dir: Path | str, folder: Path) -> str:
    """`folder`, holding one link, `torch`, to the env's torch package: the compile puts it first on PYTHONPATH.

    torch hands a build the paths of its headers from where it was imported (cpp_extension's include
    paths, CMake's Torch_DIR), and the env's path names its Python (.../lib/python3.12/site-packages/
    torch/include): no TU that includes a torch header was ever served to another Python (design.md
    §11.3). Imported through this link, torch gives every Python of a row the same paths in a container,
    where each cell's work dir is at one mount point."""
    _link(folder / "torch", torch_dir)
    return str(folder)


def _link(link: Path, target: Path | str) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.parent / f".{link.name}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target, target_is_directory=True)
    os.replace(tmp, link)   # a rebuild in the same work dir may find the link of another env
    return link


def compile_environment(*, arch_list: ArchList, toolkit: BuildToolkit, torch_env: TorchEnv | None = None, cuda: str | None = None,
                        max_jobs: int = 3, nvcc_threads: int = 1, nvcc_flags: str | Sequence[str] = "",
                        recipe_env: Mapping[str, object] | None = None, exported: Mapping[str, str] | None = None,
                        base: Mapping[str, str] | None = None,
                        host_compiler: Mapping[str, str] | None = None, source_date_epoch: int | None = None,
                        host_folders: Sequence[tuple[str, str]] = ()) -> dict[str, str]:
    """Every variable the compile step sets (design.md §6.4), as one dict.

    torch_env: a farm.build.environments.TorchEnv (its bin goes first on PATH; its nvidia/*/include
    on CPATH, where torch's CUDA headers need cusparse.h/cublas_v2.h/cusolverDn.h).
    recipe_env: the recipe's `env` (placeholders expanded); exported: what pre_build wrote to $FARM_ENV.
    host_compiler: CC, CXX, ... of the image's toolchain (farm.runners.hostcompiler), over the caller's.
    source_date_epoch: the source's date (design.md §6.5), for the backend's own zip times and any
    __DATE__; host_folders: (folder, symbolic name) pairs (farm.build.hostpaths) mapped away in the
    binaries by -ffile-prefix-map, for gcc directly and for nvcc's host compiler.
    """
    if max_jobs < 1 or nvcc_threads < 1:
        raise BadInput("recipe", "max_jobs" if max_jobs < 1 else "nvcc_threads",
                       max_jobs if max_jobs < 1 else nvcc_threads, "must be at least 1")
    base = os.environ if base is None else base
    env = {k: base[k] for k in PASS_THROUGH if k in base}
    flags = nvcc_flags if isinstance(nvcc_flags, str) else " ".join(shlex.quote(f) for f in nvcc_flags)
    prefix_maps = prefix_map_flags(host_folders)
    # --threads goes LAST: nvcc takes the last occurrence, which beats a setup.py hardcode.
    append = " ".join(p for p in (flags.strip(), *nvcc_prefix_map_flags(prefix_maps), f"--threads={nvcc_threads}")
                      if p)
    c_flags = " ".join(["-g0", *prefix_maps])
    cuda_line = cuda or toolkit.line
    torch_bin = [str(d) for d in torch_env.bin_dirs()] if torch_env is not None else []
    includes = [str(p) for p in torch_env.nvidia_include_dirs()] if torch_env is not None else []
    stubs = [str(p) for p in toolkit.stub_dirs()]
    env.update({
        "PATH": _join(torch_bin, str(toolkit.bin_dir), SYSTEM_PATH),
        "TORCH_CUDA_ARCH_LIST": arch_list.torch(),
        "CUDAARCHS": arch_list.cmake(),
        "CMAKE_CUDA_ARCHITECTURES": arch_list.cmake(),
        "MAX_JOBS": str(max_jobs),
        "CMAKE_BUILD_PARALLEL_LEVEL": str(max_jobs),
        "NVCC_APPEND_FLAGS": append,
        "FORCE_CUDA": "1",
        "CFLAGS": c_flags,
        "CXXFLAGS": c_flags,
        "LIBRARY_PATH": _join(stubs, str(toolkit.lib_dir)),
        "CPATH": _join(includes),
        # pip must not read this machine's config (find-links with a CPU torch) nor reach an index.
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONNOUSERSITE": "1",
    })
    if source_date_epoch is not None:
        env["SOURCE_DATE_EPOCH"] = str(source_date_epoch)
    env.update(toolkit.env())
    env.update(host_compiler or {})
    if torch_env is not None:
        env["VIRTUAL_ENV"] = str(torch_env.path)
    names = {"ARCHS_TORCH": arch_list.torch(), "ARCHS_CMAKE": arch_list.cmake(), "CUDA": cuda_line,
             "CUDA_HOME": str(toolkit.home)}
    for key, value in (recipe_env or {}).items():
        env[str(key)] = _expand(value, names, str(key))
    for key, value in (exported or {}).items():
        env[str(key)] = str(value)
    return {k: v for k, v in env.items() if v != ""}


@functools.cache
def _pid_namespace_prefix() -> tuple[str, ...]:
    """`unshare --pid --fork --kill-child --`, when this process may make a pid namespace (root on a Linux
    host), else () (not root; a container without CAP_SYS_ADMIN, which has one of its own; Windows)."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    prefix = (exe, "--pid", "--fork", "--kill-child", "--")
    ok = run([*prefix, "true"]).returncode == 0
    return prefix if ok else ()


def nvcc_in_own_pid_namespace(env: dict[str, str], nvcc: PurePath | str) -> bool:
    """Make every nvcc call of torch's build the first process of a pid namespace of its own (design.md §6.5).

    nvcc names its host-side intermediate file `tmpxft_<its pid>_...`, and gcc derives local symbol names
    from it (`.strtab`): two cold builds of one build key differed there and nowhere else. In a namespace
    of its own each call's pid is the same every time. PYTORCH_NVCC (torch's ninja files read it) gets the
    prefix, around whatever it held (`ccache <nvcc>`), else around `nvcc`. False, and `env` unchanged,
    where no namespace can be made; a CMake build's nvcc is not reached this way."""
    prefix = _pid_namespace_prefix()
    if not prefix:
        return False
    env["PYTORCH_NVCC"] = " ".join([*prefix, env.get("PYTORCH_NVCC") or str(nvcc)])
    return True


# A PEP 517 frontend run by the torch environment's Python in the source folder: the backend's
# build_wheel hook only, called in this very process (as pyproject_hooks' in-process helper does).
# It imports nothing but the backend: importing pip first would switch off setuptools' distutils
# shim on Python 3.10 and fail setup.py. Once the hook has returned, the wheel is written and
# closed: the process leaves without the interpreter's teardown, ~0.7 s once setup.py has
# imported torch.
PEP517_BUILD = r"""
import importlib, json, os, sys

backend, backend_path, wheel_dir = json.loads(sys.argv[1])
sys.path[:0] = backend_path
print(f"farm: PEP 517 build_wheel of {backend}", flush=True)
module, _, attrs = backend.partition(":")
hooks = importlib.import_module(module)
for attr in filter(None, attrs.split(".")):
    hooks = getattr(hooks, attr)
name = hooks.build_wheel(wheel_dir)
print("farm: built " + name, flush=True)
sys.stderr.flush()
os._exit(0)
"""


def build_backend(source_dir: Path) -> tuple[str, list[str]]:
    """The backend pip would choose for `source_dir` (pyproject.toml's build-system, else setuptools'
    legacy one) and its `backend-path` folders, which PEP 517 keeps inside the source tree."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:   # Python 3.10
        import tomli as tomllib

    pyproject = source_dir / "pyproject.toml"
    system = {}
    if pyproject.is_file():
        try:
            system = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("build-system", {})
        except tomllib.TOMLDecodeError as exc:
            raise CompileFailed(f"{pyproject}: not valid TOML: {exc}") from None
    here = source_dir.resolve()
    paths = []
    for entry in system.get("backend-path", []):
        path = (here / entry).resolve()
        if not path.is_relative_to(here):
            raise CompileFailed(f"{pyproject}: backend-path {entry!r} leaves the source tree")
        paths.append(str(path))
    return system.get("build-backend", "setuptools.build_meta:__legacy__"), paths


def compile_wheel(source_dir: Path | str, env_python: Path | str, compile_env: Mapping[str, str],
                  out_dir: Path | str, log: Path | str, *, argv_prefix: Sequence[str] = (),
                  stall: float | None = None, stop_after: float | None = None) -> Path | None:
    """The build backend's `build_wheel` in `source_dir`, run by `env_python` (no build isolation, no
    dependencies installed: the torch environment is the build environment); the wheel in `out_dir`.

    Output (stdout and stderr) goes to `log`. argv_prefix wraps the command (e.g. a network
    namespace: ['unshare', '--net', '--map-root-user']). Exactly one wheel must come out.
    stall: seconds the log may go without growing before the compile is killed as hung
    (CompileStalled; design.md §6.4); stop_after: seconds before it is stopped on purpose (the flags
    tier), returning None instead of a wheel. Either way the whole process group goes (ninja, nvcc,
    cicc), not only the frontend.
    """
    source_dir, out_dir, log = Path(source_dir), Path(out_dir), Path(log)
    out_dir.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".farm-wheel-", dir=out_dir) as tmp:
        backend, backend_path = build_backend(source_dir)
        cmd = [*argv_prefix, str(env_python), "-c", PEP517_BUILD, json.dumps([backend, backend_path, tmp])]
        t0 = time.monotonic()
        with open(log, "a", encoding="utf-8") as fh:
            shown = [c if c != PEP517_BUILD else "<farm.build.compile.PEP517_BUILD>" for c in cmd]
            fh.write(f"$ cd {source_dir} && {' '.join(shlex.quote(c) for c in shown)}\n")
            for k in ("TORCH_CUDA_ARCH_LIST", "CUDA_HOME", "MAX_JOBS", "NVCC_APPEND_FLAGS", "CPATH", "LIBRARY_PATH"):
                fh.write(f"#   {k}={compile_env.get(k, '')}\n")
            fh.flush()
            rc = run_group(cmd, source_dir, compile_env, fh, stop_after, stall)
            if rc == "timeout":
                fh.write(f"# stopped after {time.monotonic() - t0:.1f}s (asked: stop after {stop_after:g}s)\n")
                return None
            if rc == "stalled":
                fh.write(f"# killed after {time.monotonic() - t0:.1f}s: no output for {stall:g}s\n")
                raise CompileStalled(f"compile killed: no output for {stall:g}s (log: {log})")
            fh.write(f"# exit {rc} after {time.monotonic() - t0:.1f}s\n")
        if rc != 0:
            raise CompileFailed(f"compile failed (exit {rc}) in {source_dir}: {failure_line(log)} (log: {log})")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise CompileFailed(f"build_wheel made {len(wheels)} wheels in {source_dir}, expected 1 (log: {log})")
        final = out_dir / wheels[0].name
        if final.exists():
            final.unlink()
        shutil.move(str(wheels[0]), final)
    return final


# Seconds between SIGTERM and SIGKILL when a compile is stopped: a compiler given the time removes its
# temporary files.
STOP_GRACE = 10.0


def run_group(cmd: list[str], cwd: Path, env: Mapping[str, str], out: IO[Any], limit: float | None = None,
              stall: float | None = None) -> int | str:
    """Run `cmd` in its own process group, its output to the file `out`; stop the whole group past `limit`
    seconds ("timeout"), or once `out` has not grown for `stall` seconds ("stalled": hung, design.md §6.4)."""
    proc = spawn(cmd, out, cwd=cwd, env=env)
    start = last = time.monotonic()
    size = -1
    poll = min(1.0, stall / 10) if stall else None   # a test's 2 s limit is seen within 0.2 s
    try:
        while True:
            now = time.monotonic()
            wait = [x for x in (poll, None if limit is None else start + limit - now) if x is not None]
            try:
                return proc.wait(timeout=max(0.0, min(wait)) if wait else None)
            except TimeoutExpired:
                now = time.monotonic()
            if limit is not None and now - start >= limit:
                stop_group(proc, grace=STOP_GRACE)
                return "timeout"
            grown = os.fstat(out.fileno()).st_size
            if grown != size:
                size, last = grown, now
            elif stall is not None and now - last >= stall:
                stop_group(proc, grace=STOP_GRACE)
                return "stalled"
    except BaseException:
        stop_group(proc)
        raise


# ---------------------------------------------------------------- the flags tier: what nvcc was asked to emit
#
# When a full build cannot finish here, the flags tier still proves the arch list reaches the compiler:
# every nvcc call goes through a recording wrapper (first on PATH, PYTORCH_NVCC, CUDACXX and CMake's
# compiler variable), the compile runs for a bounded time, and the targets of every call are compared
# with the cell's list. The compiler cache is off for it: a cache hit would skip the compiler.

NVCC_WRAPPER = """#!/bin/sh
# The farm's flags tier: record this call's arguments (NUL-separated), run the real nvcc, then record
# the CPU time it took (`times`: its second line is nvcc's and its children's user and system time).
# A call the stop kills leaves no cpu file: only finished calls are sampled.
f=$(mktemp {calls}/call.XXXXXX) && printf '%s\\0' "$@" > "$f"
{nvcc} "$@"
rc=$?
b=${{f##*/call.}}
times > {calls}/cpu.$b
exit $rc
"""
_GENCODE = ("-gencode", "--generate-code")
_ARCH = ("-arch", "--gpu-architecture")
_CODE = ("-code", "--gpu-code")
_COMPILES = {"-c", "--compile", "-dc", "--device-c", "-ptx", "--ptx", "-cubin", "--cubin", "-fatbin", "--fatbin"}
# CMake's configure-time try_compile projects (CMakeFiles/cmTC_<hex>.dir/...): its compiler checks see
# the CMAKE_CUDA_ARCHITECTURES the build was given, before the project rewrites it (ggml-cuda turns 120
# into 120a), and nothing they compile reaches the wheel.
_CONFIGURE_PROBE = re.compile(r"CMakeFiles/cmTC_[0-9a-f]+\.dir/")


def record_nvcc_calls(env: dict[str, str], folder: Path, real_nvcc: Path | str) -> Path:
    """Point every way a build finds nvcc at a wrapper that records its calls under `folder`/calls."""
    calls, bin_dir = folder / "calls", folder / "bin"
    shutil.rmtree(folder, ignore_errors=True)
    calls.mkdir(parents=True)
    bin_dir.mkdir()
    wrapper = bin_dir / "nvcc"
    wrapper.write_text(NVCC_WRAPPER.format(calls=shlex.quote(str(calls)), nvcc=shlex.quote(str(real_nvcc))))
    wrapper.chmod(0o755)
    env["PATH"] = _join(str(bin_dir), env.get("PATH", ""))
    for key in ("PYTORCH_NVCC", "CUDACXX", "CUDA_NVCC_EXECUTABLE", "CMAKE_CUDA_COMPILER"):
        env[key] = str(wrapper)
    # torch's distutils backend (no ninja) and many setup.py files run $CUDA_HOME/bin/nvcc itself: a
    # shadow toolkit of symlinks whose bin/nvcc is the wrapper (nvcc finds its own files from its real path)
    home = Path(env.get("CUDA_HOME", ""))
    if env.get("CUDA_HOME") and (home / "bin").is_dir():
        shadow = folder / "cuda"
        (shadow / "bin").mkdir(parents=True)
        for entry in home.iterdir():
            if entry.name != "bin":
                (shadow / entry.name).symlink_to(entry)
        for entry in (home / "bin").iterdir():
            (shadow / "bin" / entry.name).symlink_to(wrapper if entry.name == "nvcc" else entry)
        for key in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
            if key in env:
                env[key] = str(shadow)
    return calls


def _call_files(calls: Path) -> list[Path]:
    return sorted(Path(calls).glob("call.*"), key=lambda p: (p.stat().st_mtime_ns, p.name))


def read_nvcc_calls(calls: Path) -> list[list[str]]:
    """The argument lists the wrapper recorded, oldest first."""
    return [p.read_bytes().decode("utf-8", "replace").split("\0")[:-1] for p in _call_files(calls)]


# `build <outputs>: <rule> <inputs>`; ninja escapes a colon or a space in a path as `$:`, `$ `.
_NINJA_EDGE = re.compile(r"^build\s((?:[^:$]|\$.)*):\s*(\S+)")
_NINJA_PATH = re.compile(r"(?:[^\s$]|\$.)+")


def nvcc_objects(source_dir: Path | str, calls: Sequence[Sequence[str]] = ()) -> int | None:
    """The CUDA objects the build compiles: the outputs of the build's ninja edges whose rule names CUDA
    and compiling (torch's cpp_extension writes one build.ninja per extension, CMake's Ninja generator
    one per build tree: `cuda_compile`, `CUDA_COMPILER__ggml-cuda_unscanned_Release`), together with the
    absolute `-o` of the recorded nvcc `calls`, which still name the objects of an extension built
    earlier into the same folder, whose build.ninja the next extension's replaced (torchao). None when
    neither names one (an extension built after the stop is not counted)."""
    objects: set[str] = set()
    for ninja_file in Path(source_dir).rglob("build.ninja"):
        for line in ninja_file.read_text(errors="replace").splitlines():
            edge = _NINJA_EDGE.match(line)
            if edge and "cuda" in edge.group(2).lower() and "compil" in edge.group(2).lower():
                first = _NINJA_PATH.match(edge.group(1).strip())   # the object; CMake adds implicit outputs
                if first:
                    objects.add(os.path.normpath(ninja_file.parent / re.sub(r"\$(.)", r"\1", first.group(0))))
    for argv in calls:
        if not any(_CONFIGURE_PROBE.search(a) for a in argv) and _COMPILES.intersection(argv):
            objects.update(os.path.normpath(o) for o in _option_values(argv, ("-o", "--output-file"))
                           if os.path.isabs(o))
    return len(objects) or None


_TIMES = re.compile(r"(\d+)m([\d.]+)s")


def read_nvcc_cpu(calls: Path) -> list[float | None]:
    """CPU-seconds of each recorded call (in read_nvcc_calls' order), None for one that did not finish."""
    out: list[float | None] = []
    for call in _call_files(calls):
        cpu = call.with_name("cpu." + call.name.removeprefix("call."))
        lines = cpu.read_text().splitlines() if cpu.is_file() else []
        spans = _TIMES.findall(lines[1]) if len(lines) > 1 else []
        out.append(sum(int(m) * 60 + float(s) for m, s in spans) if len(spans) == 2 else None)
    return out


def _option_values(argv: Sequence[str], names: tuple[str, ...]) -> list[str]:
    """Values of an option given as `-opt value`, `-opt=value` (nvcc accepts both)."""
    values = []
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif "=" in arg and arg.split("=", 1)[0] in names:
            values.append(arg.split("=", 1)[1])
    return values


def _codes(text: str) -> list[str]:
    return [c.strip() for c in text.strip().strip('"').strip("[]").split(",") if c.strip()]


def nvcc_targets(argv: Sequence[str]) -> set[str]:
    """What one nvcc call emits: sm_XX (SASS), compute_XX (PTX), or how it was left to nvcc
    (`-arch=native`, `nvcc default` when a compile names no target at all)."""
    found: set[str] = set()
    for value in _option_values(argv, _GENCODE):
        virtual = re.search(r"arch=([\w]+)", value)
        code = re.search(r"code=(\[[^\]]*\]|\"[^\"]*\"|[^,]+(?:,(?:sm|compute|lto)_\w+)*)", value)
        found.update(_codes(code.group(1)) if code else [virtual.group(1)] if virtual else [])
    codes = [c for v in _option_values(argv, _CODE) for c in _codes(v)]
    for arch in _option_values(argv, _ARCH):
        if arch in ("native", "all", "all-major"):
            found.add(f"-arch={arch}")
        elif codes:
            found.update(codes)
        elif arch.startswith("sm_"):   # -arch=sm_XX is -arch=compute_XX -code=sm_XX,compute_XX
            found.update({arch, "compute_" + arch[3:]})
        else:
            found.add(arch)
    if not found and _COMPILES & set(argv):
        found.add("nvcc default")
    return found


def flags_report(calls: list[list[str]], arch_list: ArchList, cpu: list[float | None] | None = None,
                 objects_total: int | None = None, forgiven: Collection[str] = ()) -> dict[str, Any]:
    """The targets seen across the compiling nvcc calls, against the cell's list (SASS per token,
    PTX per +PTX token): equal, or what is missing and extra; and how many calls differ on their own.
    CMake's configure probes are calls, but compile nothing of the wheel: they count as no target.
    A missing target in `forgiven` (what the recipe's `verify.allow_missing_archs` forgives, by
    farm.build.verify.checks.forgiven_targets) is listed as waived, not missing, as the gate would judge it.

    With `cpu` (per call, None: did not finish) and the compile's CUDA object count, also the sample the
    stop left: the compiling calls that finished, their mean CPU-seconds, and that mean times the object
    count, the CPU-hours of the whole cell (the C++ objects beside them are left out: host-only passes,
    a few percent of a CUDA build)."""
    want = {f"sm_{t.sm}{t.variant}" for t in arch_list} | {f"compute_{t.sm}{t.variant}" for t in arch_list if t.ptx}
    targets = [set() if any(_CONFIGURE_PROBE.search(a) for a in argv) else nvcc_targets(argv) for argv in calls]
    per_call = [t for t in targets if t]
    seen = set().union(*per_call) if per_call else set()
    waived_targets = (want - seen) & set(forgiven)
    want -= waived_targets
    missing, extra = want - seen, seen - want
    report = {"expected": arch_list.torch(), "invocations": len(calls), "compiling_invocations": len(per_call),
              "sass": by_arch(n for n in seen if n.startswith("sm_")),
              "ptx": by_arch(n for n in seen if n.startswith("compute_")),
              "other": by_arch(n for n in seen if not n.startswith(("sm_", "compute_"))),
              "equal": bool(per_call) and not missing and not extra,
              "missing": by_arch(missing), "extra": by_arch(extra), "waived": by_arch(waived_targets),
              "calls_differing": sum(1 for t in per_call if t != want)}
    if cpu is not None:
        finished = [c for t, c in zip(targets, cpu, strict=True) if t and c is not None]
        per_object = sum(finished) / len(finished) if finished else None
        report.update({"finished": len(finished), "objects_total": objects_total,
                       "cpu_s_per_object": round(per_object, 1) if per_object is not None else None,
                       "cpu_h_estimate": round(per_object * objects_total / 3600, 2)
                       if per_object is not None and objects_total else None})
    return report


def flags_summary(report: Mapping[str, Any]) -> str:
    """One line: `flags verified, not built: ...`."""
    seen = " ".join(report["sass"] + report["ptx"] + report["other"]) or "no targets"
    head = f"flags verified, not built: {seen} across {report['compiling_invocations']} nvcc invocation(s)"
    if report["equal"]:
        waived = f" with {waived_text(report)} (verify.allow_missing_archs)" if report.get("waived") else ""
        return f"{head}: equal to the cell's list {report['expected']}{waived}{sample_text(report)}"
    if not report["compiling_invocations"]:
        return f"{head}: no nvcc compile started before the stop"
    return f"{head}: differs from the cell's list {report['expected']} ({flags_differences(report)})"


