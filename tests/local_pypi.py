"""The farm's demo (examples/farm-demo) as a real sdist, listed on a PEP 503 simple index in a folder that
tests/replay_server.serve puts on 127.0.0.1: a stand-in for PyPI that `FARM_PYPI_URL` points at."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
DEMO = PROJECT / "examples" / "farm-demo"


def demo_sdist(folder: Path, version: str = "0.1.0") -> Path:
    """farm_demo-<version>.tar.gz: the demo's files under farm_demo-<version>/, with the PKG-INFO an sdist
    carries (made by hand: `setup.py sdist` would import torch)."""
    top = f"farm_demo-{version}"
    target = folder / f"{top}.tar.gz"
    folder.mkdir(parents=True, exist_ok=True)
    info = f"Metadata-Version: 2.1\nName: farm_demo\nVersion: {version}\n".encode()
    with tarfile.open(target, "w:gz") as tar:
        for path in sorted(DEMO.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                tar.add(path, f"{top}/{path.relative_to(DEMO).as_posix()}")
        member = tarfile.TarInfo(f"{top}/PKG-INFO")
        member.size = len(info)
        tar.addfile(member, io.BytesIO(info))
    return target


def simple_index(root: Path, sdist: Path, project: str = "farm-demo") -> str:
    """root/simple/<project>/ listing `sdist` (copied beside the page) with its #sha256; returns the sha256."""
    page = root / "simple" / project
    page.mkdir(parents=True, exist_ok=True)
    data = sdist.read_bytes()
    (page / sdist.name).write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    (page / "index.html").write_text(f'<html><body><a href="{sdist.name}#sha256={digest}">{sdist.name}</a></body></html>\n')
    return digest
