"""Choosing a runner: `get_runner("container" | "host" | None, arch=...)`.

Apart from base.py so that the runners import base and this module imports them, one way.
"""

from __future__ import annotations

from typing import Any

from farm.errors import BadInput
from farm.runners.base import RUNNER_KINDS, Runner
from farm.runners.container import ContainerRunner
from farm.runners.engine import Engine
from farm.runners.host import HostRunner


def default_kind() -> str:
    """The runner when none is asked for: container when an engine answers, else host."""
    return "container" if Engine.available() else "host"


def get_runner(kind: str | None = None, arch: str | None = None, **kw: Any) -> Runner:
    """`container` or `host`; None = default_kind()."""
    kind = kind or default_kind()
    if kind == "container":
        return ContainerRunner(arch=arch, **kw)
    if kind == "host":
        return HostRunner(arch=arch, **kw)
    raise BadInput("farm build", "--runner", kind, f"must be one of {', '.join(RUNNER_KINDS)}")
