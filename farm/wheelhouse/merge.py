"""Merge per-host staging wheelhouses into one wheelhouse (design.md §9.6: several build hosts, one indexer).

Each build host (a CI job, a `farm run --shard` host) publishes into its own staging folder, a
complete wheelhouse of its own. The indexer publishes every staged wheel into the real house with
the staging manifest's record (cell, build key, arch list, Pythons and the other recorded fields;
the building host is kept as `built_on`), through the same crash-safe `publish`. Before anything is
written, every staged wheel is re-hashed against its staging manifest: a damaged artifact stops the
merge with one line. Merging the same staging folder twice is a no-op (same bytes, same names), and
a name already published with other bytes is refused (PublishConflict), never overwritten.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.errors import BadInput
from farm.settings import display
from farm.wheelhouse.index import FILES
from farm.wheelhouse.maintain import file_sha256
from farm.wheelhouse.manifest import read_journal
from farm.wheelhouse.publish import publish


@dataclass
class MergeResult:
    published: list[str] = field(default_factory=list)   # wheel files new in the house
    already: list[str] = field(default_factory=list)     # same bytes were already there
    stagings: int = 0


def staged(staging: Path) -> list[tuple[Path, dict[str, Any], str]]:
    """(wheel path, build record, sha256) of each wheel of one staging wheelhouse, hashes checked."""
    staging = Path(staging)
    if not (staging / "manifest.jsonl").is_file():
        raise BadInput(display(staging), "manifest.jsonl", None, "not a staging wheelhouse (no manifest.jsonl)")
    out = []
    for e in read_journal(staging).entries:
        path = staging / FILES / e.project / e.file
        if not path.is_file():
            raise BadInput(display(staging), "manifest.jsonl", e.file, "listed but the wheel file is missing")
        if file_sha256(path) != e.sha256:
            raise BadInput(display(path), "sha256", e.sha256[:12], "the staged wheel does not match its manifest")
        record = {**e.extra, "wheel": e.file, "cell": e.cell, "pythons": list(e.pythons), "built_on": e.host}
        if e.build_key:
            record["build_key"] = e.build_key
        if e.arch_list:
            record["arch_list"] = e.arch_list
        out.append((path, record, e.sha256))
    return out


def merge(stagings: Iterable[Path | str], wheelhouse: Path | str) -> MergeResult:
    """Publish every wheel of every staging folder into `wheelhouse` in one publish (one lock, one
    page update, all or nothing); every staging folder is checked first. A wheel staged by two hosts
    with the same bytes is published once; with other bytes the merge stops before writing."""
    wheels: dict[str, tuple[Path, dict[str, Any], str]] = {}
    stagings = [Path(s) for s in stagings]
    for staging in stagings:
        for path, record, sha256 in staged(Path(staging)):
            seen = wheels.get(path.name)
            if seen is None:
                wheels[path.name] = (path, record, sha256)
            elif seen[2] != sha256:
                raise BadInput(display(path), "sha256", None,
                               f"{path.name} is also staged in {display(seen[0])} with other bytes")
    result = MergeResult(stagings=len(stagings))
    if wheels:
        done = publish([w for w, _, _ in wheels.values()], wheelhouse, record=[r for _, r, _ in wheels.values()])
        result.published = [e.file for e in done.published]
        result.already = [e.file for e in done.already]
    return result
