"""The import check (design.md §7.7): the wheel installed into a folder of its own and imported by a
fresh child process of the cell's interpreter with no GPU visible (`ImportChild`), with a libcuda
stub when verify.needs_driver asks for one (`libcuda_stub_dir`).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from farm.build.label import installed_path
from farm.build.verify.declared import Interpreter, hidden_names
from farm.build.verify.expectation import CheckResult, Expectation
from farm.build.verify.torchenv import TorchEnv, child_env_base
from farm.errors import GateCannotRun
from farm.recipes.model import Verify as VerifyKnobs
from farm.wheelhouse.wheelfile import Wheel, names_nvidia_wheel

DEVICE_ERROR = re.compile(r"(?i)cuda|gpu|device|driver|libcuda|nvml")
IMPORT_TIMEOUT = 300


def _module_name(member: str) -> str | None:
    """Dotted module name of a compiled file in an importable place, else None."""
    parts = installed_path(member).split("/")
    if not re.search(r"\.(so|pyd)$", parts[-1]):
        return None
    parts[-1] = parts[-1].split(".", 1)[0]
    if not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def _installed_paths(w: Wheel) -> list[str]:
    """The wheel's members as installed below site-packages (`<name>.data/platlib/x` -> `x`)."""
    return [installed_path(m) for m in w.members]


def _provides(paths: list[str], name: str) -> bool:
    """Whether the installed paths hold module `name` (a package folder, a .py, a compiled module)."""
    base = name.replace(".", "/")
    return any(p.startswith(base + "/") or p == base + ".py" or re.fullmatch(re.escape(base) + r"\.[^/]*(so|pyd)", p)
               for p in paths)


def _top_level(w: Wheel) -> tuple[list[str], list[str]]:
    """(top-level modules, names top_level.txt lists that the wheel does not hold). Build backends
    write an extension's first name component there even when the extension sits in a package
    (cumm lists `core_cc` for cumm/core_cc.so): such a name is no module of this wheel."""
    dist_info = w.dist_info()
    paths = _installed_paths(w)
    if dist_info and f"{dist_info[0]}/top_level.txt" in w.members:
        names = [n.replace("/", ".") for n in w.read(f"{dist_info[0]}/top_level.txt").decode().split() if n]
        return [n for n in names if _provides(paths, n)], [n for n in names if not _provides(paths, n)]
    tops = set()
    for m in paths:
        first = m.split("/", 1)[0]
        if first.endswith((".dist-info", ".data")):
            continue
        if "/" in m and first.isidentifier():
            tops.add(first)
        elif m.endswith(".py") and m[:-3].isidentifier():
            tops.add(m[:-3])
    return sorted(tops), []


def _no_direct(member: str, module: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(member, p) or fnmatch.fnmatch(module, p) for p in patterns)


_CHILD = r"""
import importlib, json, os, sys
def say(**kw):
    sys.stdout.write("FARM-IMPORT " + json.dumps(kw) + "\n"); sys.stdout.flush()
def load(m):
    say(event="begin", module=m)
    try:
        importlib.import_module(m)
        say(event="ok", module=m)
        return True
    except BaseException as exc:
        say(event="error", module=m, error=f"{type(exc).__name__}: {exc}")
        return False
if json.loads(sys.argv[1])["torch"] and not load("torch"):
    sys.exit(3)
line = sys.stdin.readline()   # the plan arrives once the wheel is installed
if not line:
    sys.exit(0)
plan = json.loads(line)
sys.path.insert(0, plan["path"])
class Undeclared:   # names the wheel's Requires-Dist does not reach (farm/build/verify/declared.py)
    def __init__(self, owners):
        self.owners = owners
    def find_spec(self, name, path=None, target=None):
        owner = self.owners.get(name)
        if owner is None:
            return None
        say(event="hidden", module=name, owner=owner)
        raise ModuleNotFoundError(f"No module named {name!r} (the build environment has {owner}, but the "
                                  "wheel's Requires-Dist does not bring it: declare it in the recipe's "
                                  "requires_dist)", name=name)
sys.meta_path.insert(0, Undeclared(plan.get("hidden", {})))
for m in plan["modules"]:
    load(m)
for op in plan["ops"]:
    ns, _, name = op.replace(".", "::", 1).partition("::")
    import torch
    try:
        getattr(getattr(torch.ops, ns), name)
        say(event="op", module=op, ok=True)
    except BaseException as exc:
        say(event="op", module=op, ok=False, error=f"{type(exc).__name__}: {exc}")
say(event="done", module="")
sys.stderr.flush()
# Everything is reported: skip the interpreter's teardown, which takes ~0.7 s once torch is loaded
# and checks nothing the gate asks. A crash during an import still shows (no "done", a signal).
os._exit(0)
"""


class ImportChild:
    """The import check's child process: the cell's interpreter, CUDA_VISIBLE_DEVICES='', an empty
    working folder; it imports torch first (torch-linked wheels only), then waits on stdin for the
    installed target and the modules to import.

    farm.build.steps starts it with the compile step, before the wheel exists, so torch's 2-3 s import
    runs beside the compile, label and repair instead of after them. The check is the same either
    way: a fresh process holding nothing but torch imports the wheel's modules.
    """

    @classmethod
    def for_environment(cls, where: Path, import_torch: bool) -> ImportChild:
        return cls(TorchEnv.python_of(where), import_torch)

    def __init__(self, python: Path, import_torch: bool, library_path: Path | None = None):
        self.python, self.import_torch = Path(python), import_torch
        self.cwd = Path(tempfile.mkdtemp(prefix="farm-import-"))
        env = child_env_base()
        env["CUDA_VISIBLE_DEVICES"] = ""
        if library_path is not None:   # read by the loader at start: it cannot be added later
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(library_path), env.get("LD_LIBRARY_PATH")]))
        self.proc = subprocess.Popen([str(self.python), "-c", _CHILD, json.dumps({"torch": import_torch})],
                                     cwd=self.cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def run(self, target: Path, modules: list[str], ops: list[str], timeout: float,
            hidden: dict[str, str] | None = None) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) once the child has imported `modules` from `target`, with the
        top-level names `hidden` (name -> the distribution that has it) made unimportable."""
        plan = {"path": str(target), "modules": modules, "ops": ops, "hidden": hidden or {}}
        try:
            out, err = self.proc.communicate(json.dumps(plan) + "\n", timeout=timeout)
        finally:
            self.close()
        return self.proc.returncode, out, err

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        shutil.rmtree(self.cwd, ignore_errors=True)


def _fits(w: Wheel, version: tuple[int, int]) -> bool:
    for t in w.tags:
        if t.interpreter.startswith("py"):
            return True
        m = re.fullmatch(r"cp(\d)(\d+)", t.interpreter)
        if m:
            tv = (int(m.group(1)), int(m.group(2)))
            if tv == version or (t.abi == "abi3" and tv <= version):
                return True
    return False


def libcuda_stub_dir(w: Wheel) -> Path:
    """A folder with a libcuda.so.1 stub, for verify.needs_driver (there is no driver here).

    The toolkit's own stub when one is found (CUDA_HOME, /usr/local/cuda, then the farm's PyPI
    toolkits, which farm.build.provision gives one); else one made here by the same maker
    (farm.build.libcudastub.build_libcuda_stub) from every driver function the wheel's modules use, each
    returning CUDA_ERROR_NO_DEVICE (100), so that loading resolves and any call reports no device.
    """
    from farm.build.libcudastub import build_libcuda_stub, find_libcuda_stub
    from farm.build.provision import cached_toolkit_homes
    from farm.errors import ToolkitUnavailable

    d = w.workdir / "libcuda-stub"
    d.mkdir(exist_ok=True)
    link = d / "libcuda.so.1"
    if link.exists():
        return d
    homes = [h for h in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda") if h]
    stub = find_libcuda_stub([*homes, *cached_toolkit_homes()])
    if stub is not None:
        link.symlink_to(stub)
        return d
    try:
        build_libcuda_stub(link, {s for b in w.elf_binaries() for s in b.elf.driver_symbols})
    except ToolkitUnavailable as exc:
        raise GateCannotRun(f"verify.needs_driver: no toolkit libcuda stub, and {exc}") from None
    return d


def install_into(wheel: Path, target: Path, python: Path) -> str | None:
    """Install `wheel` without its dependencies into the folder `target` (what `pip install --no-deps
    --target` does), with pypa's `installer`, the reference wheel installer, in this process: pip
    would cost a second interpreter and ~0.8 s per cell (it probes rustc and lsb_release for its
    user agent). None on success, else the reason."""
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.exceptions import InstallerError
    from installer.sources import WheelFile

    scheme = {"purelib": target, "platlib": target, "headers": target / "include", "scripts": target / "bin",
              "data": target}
    destination = SchemeDictionaryDestination({k: str(v) for k, v in scheme.items()}, interpreter=str(python),
                                              script_kind="win-amd64" if os.name == "nt" else "posix")
    try:
        with WheelFile.open(wheel) as source:
            install(source, destination, additional_metadata={"INSTALLER": b"farm-verify\n"})
    except (InstallerError, ValueError, OSError, zipfile.BadZipFile) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _nvidia_wheels_beside(w: Wheel, target: Path, torch_env: TorchEnv | None) -> None:
    """A torch-free wheel's Requires-Dist on nvidia-* wheels met as pip meets them, beside it: the
    cell's environment holds those wheels (torch needs the same ones), so its `nvidia/` folder is
    linked into the target, where the wheel's RPATH looks for them (design.md §6.6)."""
    if torch_env is None or not torch_env.nvidia_dirs or (target / "nvidia").exists():
        return
    if any(names_nvidia_wheel(r) for r in w.requires_dist()):
        _link_merged(list(torch_env.nvidia_dirs), target / "nvidia")


def _link_merged(sources: list[Path], dest: Path) -> None:
    """`dest` as the union of the folders `sources` (an overlay's `nvidia/` and its base's): a name
    only one of them holds is a symlink to it, a folder several hold is merged the same way below."""
    if len(sources) == 1:
        dest.symlink_to(sources[0], target_is_directory=True)
        return
    dest.mkdir()
    names: dict[str, list[Path]] = {}
    for source in sources:
        for entry in sorted(source.iterdir()):
            names.setdefault(entry.name, []).append(entry)
    for name, entries in names.items():
        folders = [e for e in entries if e.is_dir()]
        if len(folders) > 1:
            _link_merged(folders, dest / name)
        else:
            (dest / name).symlink_to(entries[0], target_is_directory=entries[0].is_dir())   # the first wins


def check_import(w: Wheel, exp: Expectation, torch_env: TorchEnv | None, python: Path | None,
                 started: ImportChild | None = None) -> CheckResult:
    """design.md §7.7. `started`: a child started earlier (see ImportChild), used when it fits this check."""
    knobs = exp.knobs
    if knobs.skip_import:
        reason = knobs.skip_import if isinstance(knobs.skip_import, str) else "verify.skip_import"
        return CheckResult("import", "skip", f"waived: {reason}")
    interpreter = _interpreter(w, exp, torch_env, python)
    python = interpreter.python
    target = w.workdir / "target"
    installed = install_into(w.path, target, python)
    if installed:
        return CheckResult("import", "fail", f"installing the wheel into a target folder failed: {installed}")
    if not exp.links_torch:
        _nvidia_wheels_beside(w, target, torch_env)

    modules, skipped, absent = _modules_to_import(w, knobs)
    hidden = hidden_names(w.requires_dist(), _own_names(w, target), exp.links_torch, interpreter)
    if knobs.needs_driver and exp.platform == "windows":
        raise GateCannotRun("verify.needs_driver: the driver stub the import check loads is a Linux libcuda.so; "
                            "a Windows wheel's import would need the host's nvcuda.dll, which a build host lacks")
    stub = libcuda_stub_dir(w) if knobs.needs_driver else None
    child = started
    if child is None or child.python != python or child.import_torch != exp.links_torch or stub is not None:
        child = ImportChild(python, exp.links_torch, library_path=stub)
    try:
        returncode, stdout, stderr = child.run(target, modules, list(knobs.expect_ops), IMPORT_TIMEOUT, hidden)
    except subprocess.TimeoutExpired:
        return CheckResult("import", "fail", f"imports did not finish in {IMPORT_TIMEOUT}s",
                           {"modules": modules})
    events = [json.loads(ln[len("FARM-IMPORT "):]) for ln in stdout.splitlines()
              if ln.startswith("FARM-IMPORT ")]
    details = {"python": str(python), "modules": modules, "not_imported_directly": skipped,
               "top_level_absent": absent, "events": events, "stderr_tail": stderr.strip().splitlines()[-10:]}
    torch_error = next((e["error"] for e in events if e["module"] == "torch" and e["event"] == "error"), None)
    if torch_error:
        raise GateCannotRun(f"torch does not import in {python}: {torch_error}")
    problems, forgiven = _event_problems(events, knobs.expect_device_error)
    if returncode < 0 or (returncode != 0 and not problems):
        problems.append(_killed(events, returncode))
    details["forgiven"] = forgiven
    imported = [e["module"] for e in events if e["event"] == "ok"]
    if forgiven and not problems:
        return CheckResult("import", "pass", f"imported {len(imported)} module(s); device errors forgiven "
                                             f"(verify.expect_device_error): {'; '.join(forgiven)}", details)
    refused = sorted({e["module"] for e in events if e["event"] == "hidden"})
    details["hidden"] = refused
    ok = f"imported {', '.join(imported) or 'nothing'} with CUDA_VISIBLE_DEVICES=''" + (
        f"; optional imports its Requires-Dist does not bring were hidden: {', '.join(refused)}" if refused else "") + (
        f"; not imported directly (verify.no_direct_import): {', '.join(skipped)}" if skipped else "") + (
        f"; named in top_level.txt but not in the wheel: {', '.join(absent)}" if absent else "")
    return CheckResult.of("import", problems, [], ok, details)


def import_installed(python: Path, links_torch: bool, w: Wheel, knobs: VerifyKnobs,
                     library_path: Path | None = None) -> list[str]:
    """The problems (none: it imports) of importing what wheel `w` installed into `python`'s own
    environment (design.md §9.8: a user's venv after `pip install`), in a fresh child as §7.7 does:
    the same modules, knobs and verdicts, torch first for a torch-linked wheel."""
    modules, _, _ = _modules_to_import(w, knobs)
    child = ImportChild(python, links_torch, library_path=library_path)
    try:
        returncode, stdout, _ = child.run(child.cwd, modules, list(knobs.expect_ops), IMPORT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return [f"imports did not finish in {IMPORT_TIMEOUT}s"]
    events = [json.loads(ln[len("FARM-IMPORT "):]) for ln in stdout.splitlines() if ln.startswith("FARM-IMPORT ")]
    problems, _ = _event_problems(events, knobs.expect_device_error)
    if returncode < 0 or (returncode != 0 and not problems):
        problems.append(_killed(events, returncode))
    return problems


def _own_names(w: Wheel, target: Path) -> set[str]:
    """The top-level names the installed wheel provides (with what was linked beside it)."""
    return {p.split("/", 1)[0].split(".", 1)[0] for p in _installed_paths(w)} | {e.name for e in target.iterdir()}


def _interpreter(w: Wheel, exp: Expectation, torch_env: TorchEnv | None, python: Path | None) -> Interpreter:
    """The Python the wheel is imported with: the torch environment's, else `python`, else this one.
    GateCannotRun when there is none that fits the wheel (or a torch-linked wheel has no torch)."""
    if exp.links_torch and torch_env is None:
        raise GateCannotRun("the import check of a torch-linked wheel needs the cell's torch environment "
                            "(--torch-env), or --skip-import")
    if torch_env is not None:
        python = torch_env.python
    python = Path(python or sys.executable)
    interpreter = Interpreter.probe(python)
    version = interpreter.version
    if not _fits(w, version):
        raise GateCannotRun(f"{w.path.name} does not install on {python} (Python {version[0]}.{version[1]})")
    if exp.links_torch and torch_env is not None and torch_env.torch_dir is None:   # None: refused above
        raise GateCannotRun(f"{python}: no torch in this environment")
    return interpreter


def _modules_to_import(w: Wheel, knobs: VerifyKnobs) -> tuple[list[str], list[str], list[str]]:
    """(modules to import, compiled modules verify.no_direct_import keeps out, top_level.txt names the
    wheel does not hold): the top-level names (or verify.import_names) and extra_imports first, then
    every compiled module of the wheel."""
    modules: list[str] = []
    tops, absent = (list(knobs.import_names), []) if knobs.import_names else _top_level(w)
    for name in tops + list(knobs.extra_imports):
        if name not in modules:
            modules.append(name)
    skipped = []
    for b in w.binaries():
        mod = _module_name(b.member)
        if mod is None or mod in modules:
            continue
        if _no_direct(b.member, mod, knobs.no_direct_import):
            skipped.append(mod)
        else:
            modules.append(mod)
    return modules, skipped, absent


def _event_problems(events: list[dict[str, Any]], expect_device_error: bool | str) -> tuple[list[str], list[str]]:
    """(problems, forgiven device errors) from the child's import and op events."""
    problems, forgiven = [], []
    for e in events:
        if e["event"] == "error":
            if _forgiven(expect_device_error, e["error"]):
                forgiven.append(f"{e['module']}: {e['error']}")
            else:
                problems.append(f"import {e['module']} failed: {e['error']}")
        elif e["event"] == "op" and not e["ok"]:
            problems.append(f"expected op {e['module']} is not registered: {e.get('error', '')}")
    return problems, forgiven


def _killed(events: list[dict[str, Any]], returncode: int) -> str:
    """The problem line of a child that died (a signal, or an exit no import error explains)."""
    begun = [e["module"] for e in events if e["event"] == "begin"]
    last = begun[-1] if begun else "(before any import)"
    try:
        sig = signal.Signals(-returncode).name
    except ValueError:
        sig = f"exit {returncode}"
    hint = (" (twin modules that register the same ops abort the process: list them in "
            "verify.no_direct_import)" if len(begun) > 1 else "")
    return f"importing {last} killed the child process ({sig}){hint}"


def _forgiven(expect: bool | str, error: str) -> bool:
    if expect is True:
        return bool(DEVICE_ERROR.search(error))
    if isinstance(expect, str) and expect:
        return bool(re.search(expect, error)) or expect in error
    return False

