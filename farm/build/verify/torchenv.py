"""The cell's torch environment as the gate sees it: its interpreter, where torch lives, and the
sonames torch and its nvidia-* wheels provide (what a wheel may leave to them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from farm.build.repair import torch_env_sonames
from farm.errors import GateCannotRun
from farm.process import run

_PROBE = """
import importlib.util as u, json
def where(name):
    try:
        s = u.find_spec(name)
    except (ImportError, ValueError):
        return []
    return list(s.submodule_search_locations or []) if s else []
print(json.dumps({"torch": where("torch")[:1], "nvidia": where("nvidia")}))
"""


@dataclass(frozen=True)
class TorchEnv:
    """A Python environment holding the cell's torch (a venv or prefix, or its python executable)."""

    python: Path
    torch_dir: Path | None
    nvidia_dirs: tuple[Path, ...] = ()   # its `nvidia/` folders: where NVIDIA's runtime wheels installed

    @staticmethod
    def python_of(where: Path) -> Path:
        """The interpreter of an environment (a venv or prefix), or `where` itself when it is one."""
        where = Path(where)
        if where.is_file():
            return where
        python = next((p for p in (where / "bin" / "python", where / "bin" / "python3",
                                   where / "Scripts" / "python.exe", where / "python.exe") if p.exists()), None)
        if python is None:
            raise GateCannotRun(f"{where}: no Python interpreter in this torch environment (bin/python)")
        return python

    @classmethod
    def locate(cls, where: Path) -> TorchEnv:
        python = cls.python_of(where)
        probe = run([python, "-c", _PROBE], env=child_env_base())
        if probe.returncode != 0:
            raise GateCannotRun(f"{python}: cannot run it: {probe.stderr.strip()[-200:]}")
        found = json.loads(probe.stdout)
        return cls(python, Path(found["torch"][0]) if found["torch"] else None,
                   tuple(Path(p) for p in found["nvidia"]))

    def sonames(self) -> list[str]:
        """Every shared library torch and its nvidia-* wheels provide: what the repair step excludes,
        read the same way (design.md §6.6); a torch-free environment's nvidia-* wheels count as well."""
        homes = ([self.torch_dir] if self.torch_dir is not None else []) + list(self.nvidia_dirs)
        return torch_env_sonames(dict.fromkeys(home.parent for home in homes))   # their site-packages


def child_env_base() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env

