"""The build record's one schema (design.md §4.5): what a build writes and every reader accepts.

A build record is a JSON object. `farm build` writes it (build/<cell>/build.json, the wheel's own
`.dist-info/farm_build.json`, and with --record recipes/records/<name>.json); `farm publish --record`,
`farm index merge` and `farm index recover` (from a wheel's farm_build.json) carry it into the
wheelhouse, where its cell, build key and arch list reach the journal and packages.json. Every one of
them checks it here, writer and readers alike: a key the table below names must have that key's form;
any other key may hold any JSON value, but a string is one line of printable text and a number is finite.

Here, in the recipes stage, because cell ids and build keys are this stage's (design.md §5.2, §5.4),
and the build and the wheelhouse below it import it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from farm.errors import BadInput
from farm.yamlio import write_atomic

RECORD_TIERS = ("full", "smoke", "flags", "failed", "blocked")

# design.md §5.2: <name>-cu<NNN>[-torch<M.m>]-<py<XY>|abi3|py3|pure>[-aarch64|-win]; the name is a recipe
# name, or a wheel's normalized project name (a cell id derived from a file name has hyphens there).
CELL_ID = re.compile(r"[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?-cu\d{2,4}(?:-torch\d{1,3}\.\d{1,3})?"
                     r"-(?:py\d{2,4}|abi3|py3|pure)(?:-aarch64|-win)?")
BUILD_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")        # a sha256 hex digest, as the build writes it
ARCH_TOKEN = re.compile(r"\d{1,2}\.\d(?:[af]|\+PTX)?")              # design.md §3.1
ARCH_LIST = re.compile(rf"{ARCH_TOKEN.pattern}(?: {ARCH_TOKEN.pattern})*")   # TORCH_CUDA_ARCH_LIST, single spaces
WHEEL_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]{0,254}\.whl")
CUDA = re.compile(r"\d{1,2}\.\d{1,2}")
VERSION = re.compile(r"[0-9][0-9A-Za-z.+!_-]{0,63}")                 # a torch pin, a farm version
PYTHON = re.compile(r"3\.\d{1,2}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
FLOOR_TAG = re.compile(r"manylinux_\d{1,2}_\d{1,3}")                 # a floor: no machine (design.md §7.8)
PLATFORM_TAG = re.compile(r"[a-z0-9_]{1,64}(?:\.[a-z0-9_]{1,64}){0,7}")   # manylinux_2_34_x86_64, or a set

Check = Callable[[object], str | None]   # None when the value is good, else what is expected


def _matching(pattern: re.Pattern, expected: str, optional: bool = False) -> Check:
    def check(value: object) -> str | None:
        if value is None and optional:
            return None
        return None if isinstance(value, str) and pattern.fullmatch(value) else expected
    return check


def _arch_list(value: object) -> str | None:
    expected = "an arch list like '8.0 9.0+PTX' (or a list of its tokens)"
    if isinstance(value, list):
        return None if value and all(isinstance(t, str) and ARCH_TOKEN.fullmatch(t) for t in value) else expected
    return _matching(ARCH_LIST, expected)(value)


def _number(low: float, whole: bool = False, optional: bool = True) -> Check:
    expected = f"{'a whole number' if whole else 'a number'} >= {low:g}"

    def check(value: object) -> str | None:
        if value is None and optional:
            return None
        good = (isinstance(value, int) or (isinstance(value, float) and not whole and math.isfinite(value))) \
            and not isinstance(value, bool) and value >= low
        return None if good else expected
    return check


def _one_of(*types: type, what: str) -> Check:
    return lambda value: None if isinstance(value, types) else what


def _list_of(pattern: re.Pattern, example: str) -> Check:
    return lambda value: None if isinstance(value, list) and all(isinstance(v, str) and pattern.fullmatch(v)
                                                                  for v in value) else f"a list like {example}"


def _floor(value: object) -> str | None:
    """The floor a build was held to, as farm.floor.Floor.record() writes it."""
    expected = "a floor {tag, torch, source, text} with manylinux_X_Y tags and one-line texts"
    if not isinstance(value, dict) or set(value) != {"tag", "torch", "source", "text"}:
        return expected
    tags = (value["tag"], value["torch"]) if value["torch"] is not None else (value["tag"],)
    good = all(isinstance(t, str) and FLOOR_TAG.fullmatch(t) for t in tags) and \
        all(isinstance(value[k], str) and _TEXT.fullmatch(value[k]) for k in ("source", "text"))
    return None if good else expected


_TEXT = re.compile(r"[^\x00-\x1f\x7f]*")
_MAPPING = _one_of(dict, type(None), what="a JSON object")
_LIST = _one_of(list, type(None), what="a list")

# key -> its check: every key the build writes whose form is fixed (other keys: _generic).
FIELDS: dict[str, Check] = {
    "cell": _matching(CELL_ID, "a cell id like drtk-cu128-torch2.8-py311"),
    "build_key": _matching(BUILD_KEY, "a build key: letters, digits, '.', '_' or '-' (a sha256 as the build writes)"),
    "arch_list": _arch_list,
    "wheel": _matching(WHEEL_FILE, "a wheel file name (no folder)", optional=True),
    "pythons": _list_of(PYTHON, "['3.10', '3.11']"),
    "cuda": _matching(CUDA, "a CUDA line like '12.8'"),
    "torch": _matching(VERSION, "a torch version like '2.8.0'", optional=True),
    "farm_version": _matching(VERSION, "a version like '0.1.0'"),
    "tier": lambda v: None if v in RECORD_TIERS else f"one of {', '.join(RECORD_TIERS)}",
    "recipe": _matching(re.compile(r"[a-z0-9](?:[a-z0-9_]*[a-z0-9])?"), "a recipe name"),
    "sass": _list_of(re.compile(r"sm_\d{2,3}[af]?"), "['sm_80', 'sm_90']"),
    "ptx": _list_of(re.compile(r"compute_\d{2,3}[af]?"), "['compute_90']"),
    **{k: _number(1, whole=True) for k in ("cores", "max_jobs", "max_jobs_recipe", "nvcc_threads")},
    "build_number": _number(0, whole=True),
    **{k: _number(0) for k in ("seconds", "wall_s", "peak_mb", "peak_process_mb", "wheel_bytes")},
    "dev_only": _one_of(bool, what="true or false"),
    "floor": _floor,
    "tag": _matching(PLATFORM_TAG, "a wheel's platform tag like manylinux_2_34_x86_64", optional=True),
    **{k: _MAPPING for k in ("source", "steps", "runner_info", "compiler_cache", "flags", "image_layer")},
    "toolkit": _one_of(dict, str, type(None), what="a toolkit version or a JSON object"),
    **{k: _LIST for k in ("build_requires_farm", "grafted", "verify_warnings", "gate_warnings", "patches")},
}


def _generic(value: object) -> str | None:
    if isinstance(value, str):
        return None if _TEXT.fullmatch(value) else "one line of printable text"
    if isinstance(value, float) and not math.isfinite(value):
        return "a finite number"
    return None


def check_build_record(where: str, record: object, prefix: str = "") -> dict:
    """`record` when it is a build record of this schema, else BadInput naming where, the key and the
    value (cut short). `prefix` names the record's place in a bigger one (`last_build.`)."""
    if not isinstance(record, Mapping):
        raise BadInput(where, prefix.rstrip(".") or None, record, "a build record is a JSON object")
    for key, value in record.items():
        if not isinstance(key, str) or _CONTROL.search(key):
            raise BadInput(where, None, key, "a build record's key is one line of text")
        problem = FIELDS.get(key, _generic)(value)
        if problem:
            raise BadInput(where, prefix + key, value, f"expected {problem}")
    return dict(record)


def write_record(path: Path, record: dict, where: str | None = None) -> Path:
    """Check `record` (a build writes only what its readers accept), then write it atomically."""
    check_build_record(where or str(path), record)
    write_atomic(Path(path), json.dumps(record, indent=2, sort_keys=True) + "\n")
    return Path(path)
