"""The cell's torch environment as the gate sees it: its interpreter, where torch lives, and the
sonames torch and its nvidia-* wheels provide (what a wheel may leave to them)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from farm.errors import GateCannotRun
from farm.process import run


@dataclass(frozen=True)
class TorchEnv:
    """A Python environment holding the cell's torch (a venv or prefix, or its python executable)."""

    python: Path
    torch_dir: Path | None

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
        probe = run([python, "-c", "import importlib.util as u; s = u.find_spec('torch'); "
                                   "print(list(s.submodule_search_locations)[0] if s else '')"],
                    env=child_env_base())
        if probe.returncode != 0:
            raise GateCannotRun(f"{python}: cannot run it: {probe.stderr.strip()[-200:]}")
        torch_dir = Path(probe.stdout.strip()) if probe.stdout.strip() else None
        return cls(python, torch_dir)

    def sonames(self) -> list[str]:
        """Every shared library torch and its nvidia-* wheels provide (the repair step excludes the same, design.md §6.6)."""
        if self.torch_dir is None:
            return []
        roots = [self.torch_dir / "lib", self.torch_dir.parent / "nvidia"]
        names = []
        for root in roots:
            if root.is_dir():
                names += [p.name for p in root.rglob("*.so*") if p.is_file() or p.is_symlink()]
        return names


def child_env_base() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_"))}
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env

