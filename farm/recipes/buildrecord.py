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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from farm.errors import BadInput, shorten
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
    **{k: _number(0) for k in ("seconds", "wall_s", "peak_mb", "peak_process_mb", "wheel_bytes", "compile_cpu_s")},
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


def check_build_record(where: str, record: object, prefix: str = "") -> dict[str, Any]:
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


def write_record(path: Path, record: Mapping[str, Any], where: str | None = None) -> Path:
    """Check `record` (a build writes only what its readers accept), then write it atomically."""
    return BuildRecord(record, where or str(path)).write(path, where)


class BuildRecord(Mapping[str, Any]):
    """One build record, checked against the schema above when it is made: the build makes it
    (farm/build/record.py), `farm publish --record`, `farm index recover` and the status table read it.

    Read-only. Readers take what they need through the fields below, never by key; the mapping form is for
    writing it whole (JSON, a wheelhouse entry's extras) and for the schema's free keys."""

    __slots__ = ("_values",)

    def __init__(self, values: object, where: str = "build record", prefix: str = ""):
        self._values = check_build_record(where, values, prefix)

    @classmethod
    def read(cls, path: Path, where: str | None = None) -> BuildRecord:
        """The record in the JSON file `path`; not JSON, or not this schema: BadInput naming the file."""
        where = where or str(path)
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BadInput(where, None, None, "file not found") from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise BadInput(where, None, None, f"not a JSON build record: {shorten(str(exc), 120)}") from None
        return cls(data, where)

    @classmethod
    def read_recipe(cls, path: Path, where: str, recipe: str) -> BuildRecord:
        """A recipe's record (recipes/records/<recipe>.json, or a cell's <recipe>/<cell>.json): the schema,
        and what a recipe's record must say besides (its recipe, tier, cell, date; a reason when it failed
        or is blocked); a blocked record's last build is checked as a record of its own."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise BadInput(where, None, None, f"not a JSON build record: {shorten(str(exc), 120)}") from None
        if not isinstance(data, dict):
            raise BadInput(where, None, type(data).__name__, "a build record is a JSON object")
        if data.get("recipe") != recipe:
            raise BadInput(where, "recipe", data.get("recipe"), f"the record of {Path(path).name} must name {recipe}")
        if data.get("tier") not in RECORD_TIERS:
            raise BadInput(where, "tier", data.get("tier"), f"expected one of {', '.join(RECORD_TIERS)}")
        for key in ("cell", "date"):
            if not isinstance(data.get(key), str) or not data[key]:
                raise BadInput(where, key, data.get(key), "expected a non-empty string")
        if data["tier"] in ("failed", "blocked") and not (isinstance(data.get("reason"), str) and data["reason"]):
            raise BadInput(where, "reason", data.get("reason"), f"a {data['tier']} record says why in one line")
        return cls(data, where).check_last_build(where)

    def check_last_build(self, where: str) -> BuildRecord:
        """This record, once the last build a blocked one keeps is checked too, named `last_build.<key>`."""
        if self._values.get("last_build") is not None:
            check_build_record(where, self._values["last_build"], prefix="last_build.")
        return self

    def write(self, path: Path, where: str | None = None) -> Path:
        write_atomic(Path(path), json.dumps(self._values, indent=2, sort_keys=True) + "\n")
        return Path(path)

    def to_plain(self) -> dict[str, Any]:
        return dict(self._values)

    def with_(self, where: str = "build record", **more: Any) -> BuildRecord:
        """This record with `more` added or replaced, checked again."""
        return BuildRecord({**self._values, **more}, where)

    def without(self, *keys: str) -> BuildRecord:
        return BuildRecord({k: v for k, v in self._values.items() if k not in keys})

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"BuildRecord({self._values!r})"

    # ----- what the build writes and its readers read (FIELDS above checks each form)

    def _text(self, key: str) -> str | None:
        value = self._values.get(key)
        return value if isinstance(value, str) else None

    def _number(self, key: str) -> float | None:
        value = self._values.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def _object(self, key: str) -> Mapping[str, Any]:
        value = self._values.get(key)
        return value if isinstance(value, Mapping) else {}

    def _texts(self, key: str) -> tuple[str, ...]:
        value = self._values.get(key)
        return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()

    @property
    def cell(self) -> str | None:
        return self._text("cell")

    @property
    def recipe(self) -> str | None:
        return self._text("recipe")

    @property
    def tier(self) -> str | None:
        return self._text("tier")

    @property
    def tier_asked(self) -> str | None:
        return self._text("tier_asked")

    @property
    def date(self) -> str | None:
        return self._text("date")

    @property
    def reason(self) -> str | None:
        return self._text("reason")

    @property
    def build_key(self) -> str | None:
        return self._text("build_key")

    @property
    def arch_list(self) -> str | None:
        """The arch list, as torch spells it (a record may hold it as a list of its tokens)."""
        value = self._values.get("arch_list")
        return " ".join(value) if isinstance(value, list) else value if isinstance(value, str) else None

    @property
    def arch_list_raw(self) -> str | list[str] | None:
        """The arch list as the record holds it (a wheelhouse entry keeps its form)."""
        value = self._values.get("arch_list")
        return value if isinstance(value, (str, list)) else None

    @property
    def cuda(self) -> str | None:
        return self._text("cuda")

    @property
    def torch(self) -> str | None:
        return self._text("torch")

    @property
    def pythons(self) -> tuple[str, ...]:
        return self._texts("pythons")

    @property
    def host(self) -> str | None:
        return self._text("host")

    @property
    def wheel(self) -> str | None:
        return self._text("wheel")

    @property
    def wheel_bytes(self) -> float | None:
        return self._number("wheel_bytes")

    @property
    def tag(self) -> str | None:
        """The platform tag the wheel reached (design.md §7.8); an older record names it only in its wheel."""
        return self._text("tag") or (self.wheel[:-len(".whl")].split("-")[-1] if self.wheel else None)

    @property
    def floor_text(self) -> str | None:
        """The manylinux floor the build was held to, as one line (None: recorded before floors were)."""
        text = self._object("floor").get("text")
        return text if isinstance(text, str) else None

    @property
    def floor(self) -> Mapping[str, Any] | None:
        return self._object("floor") or None

    @property
    def source_commit(self) -> str | None:
        value = self._object("source").get("commit")
        return value if isinstance(value, str) else None

    @property
    def source_sha256(self) -> str | None:
        value = self._object("source").get("sha256")
        return value if isinstance(value, str) else None

    @property
    def patch_files(self) -> tuple[str, ...]:
        patches = self._values.get("patches")
        return tuple(p["file"] for p in patches if isinstance(p, Mapping) and isinstance(p.get("file"), str)) \
            if isinstance(patches, list) else ()

    @property
    def seconds(self) -> float | None:
        """The build's wall time: `seconds` in a build's own record, `wall_s` in a recipe's."""
        return self._number("seconds") if "seconds" in self._values else self._number("wall_s")

    @property
    def wall_s(self) -> float | None:
        return self._number("wall_s")

    @property
    def compile_s(self) -> object:
        """The compile step's seconds, as recorded (checked by its reader); the wall time when not split."""
        steps = self._values.get("steps") or {}
        return steps.get("compile", self.wall_s) if isinstance(steps, Mapping) else None

    @property
    def peak_mb(self) -> float | None:
        return self._number("peak_mb")

    @property
    def cores(self) -> int | None:
        value = self._number("cores")
        return int(value) if value else None

    @property
    def max_jobs(self) -> int | None:
        value = self._number("max_jobs")
        return int(value) if value else None

    @property
    def nvcc_threads(self) -> int | None:
        value = self._number("nvcc_threads")
        return int(value) if value else None

    @property
    def peak_process_mb(self) -> int | None:
        """A build's own record: the largest single process its compile waited for, in MB."""
        value = self._number("peak_process_mb")
        return int(value) if value is not None else None

    @property
    def compile_cpu_s(self) -> float | None:
        """CPU seconds (user + system) the compile's processes took; None in records from before it was kept."""
        return self._number("compile_cpu_s")

    @property
    def compiler_cache(self) -> Mapping[str, Any] | None:
        """What the record says of the compiler cache: its decision and, in a build's own record, the
        compile's `stats`."""
        return self._object("compiler_cache") or None

    @property
    def cache_hits(self) -> int | None:
        """The compiler cache's hits."""
        return self._cache_count("hits")

    @property
    def cache_misses(self) -> int | None:
        """The compiler cache's misses."""
        return self._cache_count("misses")

    def _cache_count(self, key: str) -> int | None:
        """A count of the compiler cache (a build's own record keeps them under its step's `stats`)."""
        cache = self._object("compiler_cache")
        stats = cache.get("stats")
        value = (stats if isinstance(stats, Mapping) else cache).get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def cache_stats(self) -> Mapping[str, Any]:
        """A build's own record: the compiler cache's counts for its compile ({} without a cache)."""
        stats = self._object("compiler_cache").get("stats")
        return stats if isinstance(stats, Mapping) else {}

    @property
    def flags(self) -> Mapping[str, Any] | None:
        """A flags run's report (farm.build.compile.flags_report reads it), None for any other build."""
        return self._object("flags") or None

    @property
    def sass(self) -> tuple[str, ...]:
        return self._texts("sass")

    @property
    def ptx(self) -> tuple[str, ...]:
        return self._texts("ptx")

    @property
    def runner_info(self) -> Mapping[str, Any]:
        """What the runner said of itself (its limits, the image layer the steps ran in)."""
        return self._object("runner_info")

    @property
    def gate(self) -> str | None:
        return self._text("gate")

    @property
    def gate_warnings(self) -> tuple[str, ...]:
        return self._texts("gate_warnings")

    @property
    def last_build(self) -> BuildRecord | None:
        """A blocked record's last measured build."""
        last = self._values.get("last_build")
        return BuildRecord(last, prefix="last_build.") if isinstance(last, Mapping) else None
