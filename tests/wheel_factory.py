"""Real tiny CUDA wheels for the verify gate's tests, and the reference tools they are compared with.

Modules are built with the system nvcc: one trivial kernel compiled once per
-gencode set (the slow part, ~3 s each), plus a small C file per module name
(the Python init function, compiled by gcc), linked by `nvcc -shared`. Wheels
are zipped here with a correct RECORD unless a test asks for a defect.

Reference tools (cuobjdump from PyPI's nvidia-cuda-cuobjdump 13.x, zig from
PyPI's ziglang for real aarch64 objects) are installed once into
cache_dir()/tools, never into the system.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from collections import Counter
from pathlib import Path

from farm.build.downloads import isolated_pip_env
from farm.cachebudget import flocked
from farm.settings import cache_dir

NVCC = os.environ.get("FARM_TEST_NVCC", "/usr/local/bin/nvcc")
GCC = os.environ.get("CC", "gcc")

KERNEL_CU = r"""
__global__ void farm_probe(int *p) { p[threadIdx.x] = 2 * threadIdx.x; }
extern "C" int farm_probe_launch(int *p) { farm_probe<<<1, 32>>>(p); return (int)cudaGetLastError(); }
"""

INIT_C = r"""
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>
extern int farm_probe_launch(int *p);
%(decl)s
static struct PyModuleDef farm_def = {PyModuleDef_HEAD_INIT, "%(name)s", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_%(name)s(void) {
    %(body)s
    return PyModule_Create(&farm_def);
}
"""

# Twin modules (torch_scatter's _cpu/_cuda kind): each registers the same ops; a second registration
# in one process aborts, as a duplicate torch op registration does.
TWIN_BODY = r"""
    if (PySys_GetObject("_farm_twin_ops_registered") != NULL) {
        fprintf(stderr, "farm twin: ops registered twice in one process\n");
        abort();
    }
    PySys_SetObject("_farm_twin_ops_registered", Py_True);
"""
C10_DECL = "extern int _ZN3c1014farm_probe_c10Ev(void);"   # c10::farm_probe_c10()
C10_BODY = "if (_ZN3c1014farm_probe_c10Ev() < 0) return NULL;"
NOWHERE_DECL = "extern int farm_nowhere(void);"
NOWHERE_BODY = "if (farm_nowhere() < 0) return NULL;"
CUDA_DRIVER_DECL = "extern int cuInit(unsigned int);"
CUDA_DRIVER_BODY = "if (getenv(\"FARM_PROBE_CALL_DRIVER\")) cuInit(0);"


def sass(sm: str) -> str:
    """-gencode for SASS only: sass('90a') -> arch=compute_90a,code=sm_90a."""
    return f"arch=compute_{sm},code=sm_{sm}"


def ptx(sm: str) -> str:
    return f"arch=compute_{sm},code=compute_{sm}"


def host_glibc() -> tuple[int, int]:
    major, minor = os.confstr("CS_GNU_LIBC_VERSION").split()[1].split(".")[:2]
    return int(major), int(minor)


def host_tag() -> str:
    """The honest manylinux tag of a module built on this host (its glibc)."""
    major, minor = host_glibc()
    return f"manylinux_{major}_{minor}_x86_64"


PY_TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"


def run(cmd: list[str], **kw) -> None:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{proc.stdout}\n{proc.stderr}")


class ModuleBuilder:
    """Builds tiny CUDA extension modules into `root`, compiling each -gencode set once."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "kernel.cu").write_text(KERNEL_CU)
        self._libs: dict[str, Path] = {}

    def kernel_object(self, gencodes: tuple[str, ...], compress: str | None = None) -> Path:
        key = hashlib.sha256(repr((gencodes, compress)).encode()).hexdigest()[:12]
        out = self.root / f"kernel-{key}.o"
        if not out.exists():
            cmd = [NVCC, "-c", "-Xcompiler", "-fPIC", "-o", out.with_suffix(".tmp.o"), self.root / "kernel.cu"]
            for g in gencodes:
                cmd += ["-gencode", g]
            if compress:
                cmd += [f"--compress-mode={compress}"]
            run(cmd)
            out.with_suffix(".tmp.o").rename(out)
        return out

    def helper_lib(self, name: str, source: str, cxx: bool = False, soname: str | None = None) -> Path:
        """A small shared library the tests link against (a fake libc10.so, a lib nobody ships)."""
        if name not in self._libs:
            d = self.root / "libs"
            d.mkdir(exist_ok=True)
            src = d / (name + (".cpp" if cxx else ".c"))
            src.write_text(source)
            out = d / f"lib{name}.so"
            run(["g++" if cxx else GCC, "-shared", "-fPIC", *([f"-Wl,-soname,{soname}"] if soname else []),
                 "-o", out, src])
            self._libs[name] = out
        return self._libs[name]

    def fake_libc10(self) -> Path:
        return self.helper_lib("c10", "namespace c10 { int farm_probe_c10() { return 1; } }\n", cxx=True)

    def nowhere_lib(self) -> Path:
        return self.helper_lib("farm_nowhere", "int farm_nowhere(void) { return 1; }\n")

    def cuda_link_stub(self) -> Path:
        """libcuda.so (soname libcuda.so.1) to LINK against: this machine has no driver and no toolkit stub.

        It is never on the loader path; the gate brings its own stub for verify.needs_driver.
        """
        return self.helper_lib("cuda", "int cuInit(unsigned int flags) { return 100; }\n", soname="libcuda.so.1")

    def module(self, name: str, gencodes: tuple[str, ...], *, compress: str | None = "none", decl: str = "",
               body: str = "", link: tuple[str, ...] = (), out_name: str | None = None) -> Path:
        """An importable extension module `name` with a fatbin for `gencodes`.

        compress defaults to "none" so that only the test that wants compressed entries gets them
        (nvcc 13 compresses PTX with zstd by default).
        """
        key = hashlib.sha256(repr((name, gencodes, compress, decl, body, link)).encode()).hexdigest()[:12]
        out = self.root / key / (out_name or f"{name}.so")
        if out.exists():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        init_c = out.parent / f"{name}_init.c"
        init_c.write_text(INIT_C % {"name": name, "decl": decl, "body": body})
        init_o = out.parent / f"{name}_init.o"
        run([GCC, "-c", "-fPIC", "-O1", f"-I{sysconfig.get_paths()['include']}", "-o", init_o, init_c])
        # The link step gets the same -gencode set: nvcc adds a device-link container for them (with
        # no -gencode it would add one for its default arch, an extra arch the module was not built for).
        gen = [x for g in gencodes for x in ("-gencode", g)]
        run([NVCC, "-shared", "-Xcompiler", "-fPIC", *gen, "-o", out, self.kernel_object(gencodes, compress),
             init_o, *link])
        return out


def ext_name(module: str) -> str:
    """The extension file name this interpreter imports: _probe -> _probe.cpython-311-x86_64-linux-gnu.so."""
    return module + sysconfig.get_config_var("EXT_SUFFIX")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(out_dir: Path, name: str, version: str, files: dict[str, bytes | Path], *,
               tag: str | None = None, requires_dist: tuple[str, ...] = (), metadata_version: str | None = None,
               tamper: str | None = None, top_level: tuple[str, ...] | None = None) -> Path:
    """A wheel as a build backend writes it: files, METADATA, WHEEL, top_level.txt, RECORD (hashed).

    metadata_version: a different Version in METADATA than in the file name.
    tamper: a member whose bytes change after RECORD was written (a RECORD mismatch).
    """
    tag = tag or f"{PY_TAG}-{PY_TAG}-{host_tag()}"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dist = re.sub(r"[-_.]+", "_", name)
    dist_info = f"{dist}-{version}.dist-info"
    content: dict[str, bytes] = {k: (v.read_bytes() if isinstance(v, Path) else v) for k, v in files.items()}
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {metadata_version or version}"]
    meta += [f"Requires-Dist: {r}" for r in requires_dist]
    content[f"{dist_info}/METADATA"] = ("\n".join(meta) + "\n\n").encode()
    pure = tag.endswith("-any")
    content[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: farm-tests\nRoot-Is-Purelib: "
                                     f"{'true' if pure else 'false'}\nTag: {tag}\n\n").encode()
    tops = top_level if top_level is not None else sorted({k.split("/", 1)[0] for k in files if "/" in k})
    content[f"{dist_info}/top_level.txt"] = ("\n".join(tops) + "\n").encode()
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for member, data in content.items():
        writer.writerow([member, _record_hash(data), len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    content[f"{dist_info}/RECORD"] = buf.getvalue().encode()
    if tamper:
        content[tamper] = content[tamper] + b"\0tampered"
    path = out_dir / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for member, data in content.items():
            z.writestr(member, data)
    return path


# ---------------------------------------------------------------- reference tools (cached, not system-wide)

def pip_tool(requirement: str, folder: str) -> Path:
    """pip install --target cache_dir()/tools/<folder> (once, under a lock); returns the folder."""
    dest = cache_dir() / "tools" / folder
    dest.parent.mkdir(parents=True, exist_ok=True)
    with flocked(dest.parent / f".{folder}.lock"):
        if not (dest / ".complete").exists():
            cert = ["--cert", os.environ["PIP_CERT"]] if os.environ.get("PIP_CERT") else []
            run([sys.executable, "-m", "pip", "install", "--isolated", *cert, "--no-deps", "--quiet",
                 "--upgrade", "--target", dest, requirement], env=isolated_pip_env())
            (dest / ".complete").write_text(requirement + "\n")
    return dest


def cuobjdump() -> Path:
    return pip_tool("nvidia-cuda-cuobjdump>=13,<14", "cuobjdump-13") / "nvidia" / "cu13" / "bin" / "cuobjdump"


def zig() -> Path:
    return pip_tool("ziglang>=0.13", "ziglang") / "ziglang" / "zig"


_CUOBJ_LINE = re.compile(r"^(ELF|PTX) file\s+\d+: .*\.sm_(\d+)([af]?)\.(cubin|ptx)$")


def cuobjdump_entries(path: Path) -> Counter:
    """cuobjdump --list-elf --list-ptx as a multiset of (kind, sm, variant)."""
    proc = subprocess.run([str(cuobjdump()), "--list-elf", "--list-ptx", str(path)], capture_output=True, text=True)
    if proc.returncode != 0 and "does not contain device code" not in proc.stderr and "No " not in proc.stderr:
        raise RuntimeError(f"cuobjdump failed on {path}: {proc.stderr}")
    out: Counter = Counter()
    for line in proc.stdout.splitlines():
        m = _CUOBJ_LINE.match(line.strip())
        if m:
            out[("SASS" if m.group(1) == "ELF" else "PTX", int(m.group(2)), m.group(3))] += 1
    return out


def as_cuobjdump_sees(entries) -> Counter:
    """Our entries spelt as cuobjdump lists them: it drops the `f` of family SASS (sm_100f -> sm_100)."""
    return Counter((e.kind, e.sm, "" if (e.kind == "SASS" and e.variant == "f") else e.variant)
                   for e in entries if e.kind in ("SASS", "PTX"))


def assert_folder_agrees_with_cuobjdump(folder: Path) -> int:
    """Every .so under `folder` lists the same entries (as cuobjdump spells them) in both readers."""
    from farm.arch.fatbin import read_fatbin

    checked = 0
    for so in sorted(Path(folder).rglob("*.so")):
        assert as_cuobjdump_sees(read_fatbin(so).entries) == cuobjdump_entries(so), so
        checked += 1
    return checked


def object_with_fatbin(fatbin: Path, out: Path, target: str = "aarch64-linux-gnu") -> Path:
    """A real shared object for another machine (linked by zig) whose fatbin section holds `fatbin`.

    aarch64-linux-gnu: an ELF .so with `.nv_fatbin`; x86_64-windows-gnu: a DLL with `.nv_fatb`
    (the section nvcc uses on Windows, whose PE section names have 8 characters).
    """
    data = fatbin.read_bytes()
    section = ".nv_fatb" if "windows" in target else ".nv_fatbin"
    src = out.with_suffix(".c")
    body = ",".join(str(b) for b in data)
    export = "__declspec(dllexport) " if "windows" in target else ""
    src.write_text(f'__attribute__((section("{section}"), aligned(8), used))\n'
                   f"static const unsigned char farm_fatbin[{len(data)}] = {{{body}}};\n"
                   f"{export}int farm_marker(void) {{ return (int)sizeof farm_fatbin; }}\n")
    env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": str(cache_dir() / "tools" / "zig-cache")}
    run([zig(), "cc", "-target", target, "-shared", "-fPIC" if "linux" in target else "-O1", "-o", out, src],
        env=env)
    return out


def fatbin_file(gencodes: tuple[str, ...], out: Path) -> Path:
    """nvcc -fatbin: the bare fatbin nvcc would embed."""
    src = out.with_suffix(".cu")
    src.write_text(KERNEL_CU)
    cmd = [NVCC, "-fatbin", "-o", out, src]
    for g in gencodes:
        cmd += ["-gencode", g]
    run(cmd)
    return out


# ---------------------------------------------------------------- shared by the test files

# Every -gencode set the gate's tests compile (tests/test_fatbin.py compares each with cuobjdump).
GENCODE_SETS = {
    "8.0+8.9+PTX": (sass("80"), sass("89"), ptx("89")),
    "8.0": (sass("80"),),
    "8.0+PTX": (sass("80"), ptx("80")),
    "9.0": (sass("90"),),
    "9.0a": (sass("90a"),),
    "a+f": (sass("80"), sass("90a"), sass("100f"), ptx("90"), ptx("120f")),
}


def session_builder(tmp_path_factory) -> ModuleBuilder:
    """One module folder per pytest session, shared by every test file (each -gencode set compiles once)."""
    return ModuleBuilder(tmp_path_factory.getbasetemp() / "cuda-modules")


def torch_cuda_wheel() -> Path:
    """PyPI's torch 2.13.0 for CUDA 13.0, x86_64, cp311 (downloaded once into cache_dir()/downloads)."""
    from farm.build.downloads import download

    got = download(["torch==2.13.0"], python="3.11", platform="linux", no_deps=True)
    wheel = got.file_for("torch")
    assert wheel is not None and "+cpu" not in wheel.name, got.files
    return wheel
