"""Small real wheels for the label and repair tests: a C extension compiled by gcc, packed by
`pip wheel` through setuptools (build_wheel) or, faster, by hand (pack_ext_wheel)."""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from collections.abc import Sequence
from pathlib import Path

EXT_C = """\
#include <Python.h>
{decls}
static PyObject *answer(PyObject *self, PyObject *args) {{ return PyLong_FromLong({call}); }}
static PyMethodDef methods[] = {{{{"answer", answer, METH_NOARGS, NULL}}, {{NULL, NULL, 0, NULL}}}};
static struct PyModuleDef mod = {{PyModuleDef_HEAD_INIT, "_ext", NULL, -1, methods}};
PyMODINIT_FUNC PyInit__ext(void) {{ return PyModule_Create(&mod); }}
"""


def build_shared_lib(folder: Path, name: str, soname: str | None = None, value: int = 42) -> Path:
    """lib<name>.so exporting `int <name>_answer(void)`, built with gcc, with its soname set
    (default: the file name; torch's CUDA libraries carry versioned ones like libcublas.so.13)."""
    folder.mkdir(parents=True, exist_ok=True)
    c = folder / f"{name}.c"
    c.write_text(f"int {name}_answer(void) {{ return {value}; }}\n")
    soname = soname or f"lib{name}.so"
    out = folder / soname
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", f"-Wl,-soname,{soname}", "-o", str(out), str(c)],
                   check=True)
    c.unlink()
    if soname != f"lib{name}.so":  # the link-time name, as a -dev package would provide
        (folder / f"lib{name}.so").symlink_to(soname)
    return out


def build_wheel(
    workdir: Path,
    *,
    name: str = "demo-pkg",
    version: str = "1.2.0",
    install_requires: list[str] | None = None,
    extras_require: dict | None = None,
    link: list[tuple[Path, str, bool]] = (),
) -> Path:
    """Build a cp wheel with one extension `demo._ext`.

    `link`: (library folder, library name, with_rpath) per library the extension
    calls (`int <name>_answer(void)`); with_rpath puts the folder on the RPATH.
    """
    src = workdir / "src"
    (src / "demo").mkdir(parents=True)
    (src / "demo" / "__init__.py").write_text("from ._ext import answer\n")
    decls = "\n".join(f"int {lib}_answer(void);" for _, lib, _ in link)
    call = " + ".join(f"{lib}_answer()" for _, lib, _ in link) or "7"
    (src / "demo" / "ext.c").write_text(EXT_C.format(decls=decls, call=call))
    (src / "setup.py").write_text(textwrap.dedent(f"""\
        from setuptools import Extension, setup
        setup(
            name={name!r}, version={version!r}, packages=["demo"],
            ext_modules=[Extension("demo._ext", ["demo/ext.c"],
                libraries={[lib for _, lib, _ in link]!r},
                library_dirs={[str(d) for d, _, _ in link]!r},
                runtime_library_dirs={[str(d) for d, _, rp in link if rp]!r})],
            install_requires={install_requires or []!r},
            extras_require={extras_require or {}!r},
        )
    """))
    out = workdir / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        check=True, capture_output=True,
    )
    (wheel,) = out.glob("*.whl")
    return wheel


def pack_ext_wheel(
    workdir: Path,
    *,
    name: str = "demo_ext",
    version: str = "1.0",
    link: Sequence[tuple[Path, str, bool]] = (),
    extra_c: str = "",
    rpath: str = "",
) -> Path:
    """Like build_wheel, but fast: gcc builds the extension and the wheel is packed here
    (the wheel format by hand: METADATA, WHEEL, RECORD). `extra_c` is appended to the C file;
    `rpath` is set as the extension's RUNPATH as given (e.g. `$ORIGIN/../demo_ext.libs`)."""
    build = workdir / "pack"
    (build / "demo").mkdir(parents=True)
    decls = "\n".join(f"int {lib}_answer(void);" for _, lib, _ in link)
    call = " + ".join(f"{lib}_answer()" for _, lib, _ in link) or "7"
    c = build / "ext.c"
    c.write_text(EXT_C.format(decls=decls, call=call) + extra_c)
    so = build / "demo" / f"_ext{sysconfig.get_config_var('EXT_SUFFIX')}"
    cmd = ["gcc", "-shared", "-fPIC", "-O0", f"-I{sysconfig.get_paths()['include']}", "-o", str(so), str(c)]
    for folder, lib, with_rpath in link:
        cmd += [f"-L{folder}", f"-l{lib}"] + ([f"-Wl,-rpath,{folder}"] if with_rpath else [])
    if rpath:
        cmd.append(f"-Wl,-rpath,{rpath}")
    subprocess.run(cmd, check=True)
    (build / "demo" / "__init__.py").write_text("from ._ext import answer\n")
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    di = f"{name}-{version}.dist-info"
    files = {
        "demo/__init__.py": (build / "demo" / "__init__.py").read_bytes(),
        f"demo/{so.name}": so.read_bytes(),
        f"{di}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{di}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}-{tag}-{plat}\n".encode(),
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()
    ) + f"{di}/RECORD,,\n"
    out = workdir / f"{name}-{version}-{tag}-{tag}-{plat}.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, (2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
            z.writestr(info, data)
        z.writestr(f"{di}/RECORD", record)
    return out


def demo_extension(wheel: Path, dest: Path) -> Path:
    """Extract farm_demo's compiled `_C` module from a built demo wheel into `dest`; its path."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if re.fullmatch(r"farm_demo/_C\..*\.so", n))
        z.extract(name, dest)
    return dest / name
