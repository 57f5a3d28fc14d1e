"""The wheelhouse: a manifest-first, crash-safe PEP 503 index with per-(CUDA, torch) channels (design.md §9).

Public API:
  publish(wheels, wheelhouse, record=None) -> PublishResult
  rebuild(wheelhouse, allow_shrink=False) -> RebuildResult
  verify(wheelhouse) -> list[str]                  (problems; empty when sound)
  recover(wheelhouse) -> RecoverResult             (the journal rebuilt from files/, then every page)
  prune(wheelhouse, before) -> PruneResult
  built_keys(wheelhouse) -> set[str]               (for `farm plan --missing`)
  read_journal(wheelhouse).entries -> list[ManifestEntry]
"""

from farm.errors import PublishConflict, ShrinkRefused
from farm.wheelhouse.index import Config, House, channel_root
from farm.wheelhouse.maintain import (
    PruneResult,
    RebuildResult,
    built_keys,
    check_links,
    prune,
    rebuild,
    verify,
)
from farm.wheelhouse.manifest import ManifestEntry, read_journal
from farm.wheelhouse.names import WheelName, normalize, parse_wheel_name
from farm.wheelhouse.publish import PublishResult, publish
from farm.wheelhouse.recover import RecoverResult, recover

__all__ = [
    "Config", "House", "ManifestEntry", "PruneResult", "PublishConflict", "PublishResult", "RebuildResult", "RecoverResult",
    "ShrinkRefused", "WheelName", "built_keys", "channel_root", "check_links", "normalize", "parse_wheel_name",
    "prune", "publish", "read_journal", "rebuild", "recover", "verify",
]
