"""Small real wheels and loopback servers for the wheelhouse tests.

The wheels are built here, byte by byte: a pure module (optionally a real
compiled .so when a C compiler is at hand), METADATA with Requires-Python,
WHEEL, RECORD with sha256 of every member. pip and uv install them for real.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FARM = [sys.executable, "-m", "farm"]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(folder: Path, name: str = "drtk", version: str = "0.1.0+cu128torch2.8",
               tags: str = "cp311-cp311-manylinux_2_34_x86_64", requires_python: str | None = ">=3.9",
               build: str | None = None, payload: str = "", so: bytes | None = None,
               metadata_extra: str = "") -> Path:
    """A valid wheel `<name>-<version>[-build]-<tags>.whl` with a module named after the project."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dist = re.sub(r"[-_.]+", "_", name)
    module = dist.lower()
    dist_info = f"{dist}-{version}.dist-info"
    files: dict[str, bytes] = {
        f"{module}/__init__.py": f'__version__ = "{version}"\n{payload}'.encode(),
    }
    if so is not None:
        files[f"{module}/_ext.so"] = so
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if requires_python:
        meta += f"Requires-Python: {requires_python}\n"
    meta += metadata_extra + "Summary: a farm test wheel\n\nLong description.\n"
    files[f"{dist_info}/METADATA"] = meta.encode()
    py, abi, plat = tags.split("-")
    wheel_txt = "Wheel-Version: 1.0\nGenerator: farm-tests\nRoot-Is-Purelib: false\n"
    wheel_txt += "".join(f"Tag: {p}-{abi}-{plat}\n" for p in py.split("."))
    if build:
        wheel_txt += f"Build: {build}\n"
    files[f"{dist_info}/WHEEL"] = wheel_txt.encode()
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items())
    record += f"{dist_info}/RECORD,,\n"
    files[f"{dist_info}/RECORD"] = record.encode()
    file = f"{dist}-{version}{'-' + build if build else ''}-{tags}.whl"
    path = folder / file
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in files.items():
            info = zipfile.ZipInfo(n, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, d, zipfile.ZIP_DEFLATED)
    return path


def rezip(wheel: Path, out: Path, change=None, record: bool = True, links: tuple[str, ...] = ()) -> Path:
    """A copy of `wheel` at `out` with its members passed through `change(dict name -> bytes)`; RECORD
    rewritten to match (unless `record` is False: then the old one stays); `links` become symlink members."""
    with zipfile.ZipFile(wheel) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    rec_name = next(n for n in files if n.endswith(".dist-info/RECORD"))
    if change:
        files = change(files)
    if record:
        files.pop(rec_name, None)
        files[rec_name] = ("".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items())
                           + f"{rec_name},,\n").encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in files.items():
            info = zipfile.ZipInfo(n, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = ((0o120777 if n in links else 0o100644) << 16)
            zf.writestr(info, d)
    return out


def compiled_so(tmp: Path) -> bytes | None:
    """A tiny real shared object, when a C compiler is available."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    src = tmp / "ext.c"
    src.write_text("int farm_answer(void) { return 42; }\n")
    out = tmp / "ext.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O0", "-o", str(out), str(src)], check=True)
    return out.read_bytes()


def run_farm(*args, env=None, check=True, cwd=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([*FARM, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd or REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"farm {' '.join(map(str, args))} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def clean_env(**extra) -> dict:
    """An environment where this machine's pip/uv configuration cannot interfere (find-links, constraints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", UV_NO_CONFIG="1",
               PIP_NO_INPUT="1", NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    env.update(extra)
    return env


@contextlib.contextmanager
def served(wheelhouse: Path, access_log: Path, negotiate: bool = True):
    """`farm serve`'s server in a thread on a free loopback port; yields the base URL."""
    from farm.wheelhouse.serve import make_server

    server = make_server(wheelhouse, "127.0.0.1", 0, access_log=access_log, negotiate=negotiate)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def comfy_env_matches(html: str, cuda_short: str, torch_mm: str, py_tag: str, platform: str) -> list[tuple[str, str]]:
    """comfy-env's matching rule as the issue states it: anchor text with +cu<NNN>torch<M.m>, cp<XY> and the
    platform; href ending in .whl with no fragment. Returns (href, anchor) pairs that match."""
    links = re.findall(r'<a[^>]+href="([^"]+\.whl)"[^>]*>([^<]+)</a>', html, re.IGNORECASE)
    out = []
    for href, text in links:
        if (f"+cu{cuda_short}torch{torch_mm}" in text and py_tag in text and platform in text
                and re.search(r"(linux|win_amd64)", text)):
            out.append((href, text))
    return out
