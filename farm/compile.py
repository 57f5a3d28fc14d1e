"""The compile step (SPEC 8.1 step 4): one PEP 517 `build_wheel` with an environment that says everything.

`compile_environment()` builds the whole variable set from the cell's resolved
arch list, toolkit and torch environment, starting from a small allow-list of
the caller's variables (never the machine's PIP_* configuration).
`compile_wheel()` calls the source's build backend in the torch environment with
it (what `pip wheel . --no-build-isolation --no-deps` does, minus pip's separate
metadata hook: that hook runs setup.py, and so imports torch, a second time) and
returns the one wheel it made.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .archlist import ArchList
from .errors import BadInput, FarmError
from .toolkit import Toolkit

# Caller variables a build may legitimately need; everything else starts clean.
PASS_THROUGH = ("HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TERM", "TMPDIR", "TZ", "SOURCE_DATE_EPOCH",
                "CCACHE_DIR", "CCACHE_BASEDIR", "CC", "CXX", "CUDAHOSTCXX", "NVCC_CCBIN", "http_proxy",
                "https_proxy", "no_proxy")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PLACEHOLDER = re.compile(r"\{(ARCHS_TORCH|ARCHS_CMAKE|CUDA_HOME|CUDA)\}")


class CompileFailed(FarmError):
    exit_code = 1


def _expand(value: str, names: Mapping[str, str], key: str) -> str:
    """Recipe env values may use {ARCHS_TORCH} {ARCHS_CMAKE} {CUDA} {CUDA_HOME}; no shell expansion."""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise BadInput("recipe", f"env.{key}", value, "expected a string")
    text = str(value)
    unknown = [m for m in re.findall(r"(?<!\$)\{([A-Z][A-Z_]*)\}", text) if m not in names]
    if unknown:
        raise BadInput("recipe", f"env.{key}", value,
                       f"unknown placeholder {{{unknown[0]}}} (known: {', '.join('{' + n + '}' for n in names)})")
    return _PLACEHOLDER.sub(lambda m: names[m.group(1)], text)


def _join(*parts) -> str:
    out: list[str] = []
    for p in parts:
        for item in (p if isinstance(p, (list, tuple)) else [p]):
            s = str(item) if item else ""
            for piece in s.split(os.pathsep) if s else []:
                if piece and piece not in out:
                    out.append(piece)
    return os.pathsep.join(out)


def compile_environment(*, arch_list: ArchList, toolkit: Toolkit, torch_env=None, cuda: str | None = None,
                        max_jobs: int = 3, nvcc_threads: int = 1, nvcc_flags: str | Sequence[str] = "",
                        recipe_env: Mapping[str, object] | None = None, exported: Mapping[str, str] | None = None,
                        base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every variable the compile step sets (SPEC 8.1 step 4), as one dict.

    torch_env: a farm.environments.TorchEnv (its bin goes first on PATH; its nvidia/*/include
    on CPATH, where torch's CUDA headers need cusparse.h/cublas_v2.h/cusolverDn.h).
    recipe_env: the recipe's `env` (placeholders expanded); exported: what pre_build wrote to $FARM_ENV.
    """
    if max_jobs < 1 or nvcc_threads < 1:
        raise BadInput("recipe", "max_jobs" if max_jobs < 1 else "nvcc_threads",
                       max_jobs if max_jobs < 1 else nvcc_threads, "must be at least 1")
    base = os.environ if base is None else base
    env = {k: base[k] for k in PASS_THROUGH if k in base}
    flags = nvcc_flags if isinstance(nvcc_flags, str) else " ".join(shlex.quote(f) for f in nvcc_flags)
    # --threads goes LAST: nvcc takes the last occurrence, which beats a setup.py hardcode.
    append = " ".join(p for p in (flags.strip(), f"--threads={nvcc_threads}") if p)
    cuda_line = cuda or toolkit.line
    torch_bin = [str(Path(torch_env.python).parent)] if torch_env is not None else []
    includes = [str(p) for p in torch_env.nvidia_include_dirs()] if torch_env is not None else []
    stubs = [str(p) for p in toolkit.stub_dirs()]
    env.update({
        "PATH": _join(torch_bin, str(toolkit.home / "bin"), SYSTEM_PATH),
        "TORCH_CUDA_ARCH_LIST": arch_list.torch(),
        "CUDAARCHS": arch_list.cmake(),
        "CMAKE_CUDA_ARCHITECTURES": arch_list.cmake(),
        "MAX_JOBS": str(max_jobs),
        "CMAKE_BUILD_PARALLEL_LEVEL": str(max_jobs),
        "NVCC_APPEND_FLAGS": append,
        "FORCE_CUDA": "1",
        "CFLAGS": "-g0",
        "CXXFLAGS": "-g0",
        "LIBRARY_PATH": _join(stubs, str(toolkit.lib_dir)),
        "CPATH": _join(includes),
        # pip must not read this machine's config (find-links with a CPU torch) nor reach an index.
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONNOUSERSITE": "1",
    })
    env.update(toolkit.env())
    if torch_env is not None:
        env["VIRTUAL_ENV"] = str(torch_env.path)
    names = {"ARCHS_TORCH": arch_list.torch(), "ARCHS_CMAKE": arch_list.cmake(), "CUDA": cuda_line,
             "CUDA_HOME": str(toolkit.home)}
    for key, value in (recipe_env or {}).items():
        env[str(key)] = _expand(value, names, str(key))
    for key, value in (exported or {}).items():
        env[str(key)] = str(value)
    return {k: v for k, v in env.items() if v != ""}


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
    try:
        import tomllib
    except ImportError:   # Python 3.10
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
                  timeout: float | None = None) -> Path:
    """The build backend's `build_wheel` in `source_dir`, run by `env_python` (no build isolation, no
    dependencies installed: the torch environment is the build environment); the wheel in `out_dir`.

    Output (stdout and stderr) goes to `log`. argv_prefix wraps the command (e.g. a network
    namespace: ['unshare', '--net', '--map-root-user']). Exactly one wheel must come out.
    """
    source_dir, out_dir, log = Path(source_dir), Path(out_dir), Path(log)
    out_dir.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".farm-wheel-", dir=out_dir) as tmp:
        backend, backend_path = build_backend(source_dir)
        cmd = [*argv_prefix, str(env_python), "-c", PEP517_BUILD, json.dumps([backend, backend_path, tmp])]
        t0 = time.monotonic()
        with open(log, "a", encoding="utf-8") as fh:
            shown = [c if c != PEP517_BUILD else "<farm.compile.PEP517_BUILD>" for c in cmd]
            fh.write(f"$ cd {source_dir} && {' '.join(shlex.quote(c) for c in shown)}\n")
            for k in ("TORCH_CUDA_ARCH_LIST", "CUDA_HOME", "MAX_JOBS", "NVCC_APPEND_FLAGS", "CPATH", "LIBRARY_PATH"):
                fh.write(f"#   {k}={compile_env.get(k, '')}\n")
            fh.flush()
            try:
                proc = subprocess.run(cmd, cwd=source_dir, env=dict(compile_env), stdout=fh,
                                      stderr=subprocess.STDOUT, timeout=timeout)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            fh.write(f"# exit {rc} after {time.monotonic() - t0:.1f}s\n")
        if rc != 0:
            raise CompileFailed(f"compile failed (exit {rc}) in {source_dir}: {_last_error(log)} (log: {log})")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise CompileFailed(f"build_wheel made {len(wheels)} wheels in {source_dir}, expected 1 (log: {log})")
        final = out_dir / wheels[0].name
        if final.exists():
            final.unlink()
        shutil.move(str(wheels[0]), final)
    return final


def _last_error(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"\berror\b|Error:|fatal", ln) and not ln.startswith("#"):
            return ln[:300]
    own = [ln for ln in lines if not ln.startswith("#")]   # not the frontend's own '# exit' notes
    return own[-1][:300] if own else "no output"
