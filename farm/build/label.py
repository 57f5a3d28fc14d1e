"""Build step 5, label (design.md §6.5): rewrite a built wheel into the farm's name and metadata.

- local version `+cu128torch2.8` (torch-free: `+cu128`) in the file name, METADATA
  `Version`, the `.dist-info` (and `.data`) folder names, and RECORD;
- an optional build number (`name-ver-<N>-cpXY-cpXY-plat.whl`, and `Build:` in WHEEL);
- the torch family never in Requires-Dist (a resolver must not pull torch from
  PyPI over the user's CUDA build); the recipe's `requires_dist`, when given,
  replaces Requires-Dist and Provides-Extra;
- `farm_build.json` in the `.dist-info`; WHEEL `Tag:` lines equal to the file
  name's tags; RECORD rewritten last with fresh hashes;
- the same bytes for the same input: entries sorted by name (the payload, then
  the `.dist-info`, RECORD last), every entry stamped with the source's
  SOURCE_DATE_EPOCH (design.md §6.5).

The input wheel is only read; the output is written to a temporary file in the
output folder and renamed into place.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import tempfile
import time
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from farm.errors import BadInput, WheelError
from farm.wheelhouse.names import BUILD_INFO_NAME

TORCH_FAMILY = frozenset({"torch", "torchvision", "torchaudio"})
_PLACEHOLDER = re.compile(r"\{(LOCAL|VER)(?::([^{}]*))?\}")
_LOCAL = re.compile(r"[a-z0-9]+(\.[a-z0-9]+)*")   # fullmatch
_EXTRA_MARKER = re.compile(r"""\bextra\s*==\s*["']([^"']+)["']""")


# ------------------------------------------------------------ requires_dist


def substitute_requires(
    requirements: Sequence[str],
    local_label: str,
    versions: Mapping[str, str],
    labels: Mapping[str, str],
    where: str = "recipe",
) -> list[str]:
    """Fill a recipe's `requires_dist` placeholders.

    `{LOCAL}` -> this wheel's label (`cu128torch2.8`, no '+'); `{LOCAL:x}` ->
    the label recipe x's wheel carries for the same CUDA/torch (`labels[x]`;
    a torch-free sibling has `cu128`); `{VER:x}` -> recipe x's version
    (`versions[x]`). A placeholder with no value is a recipe mistake.
    """
    own = local_label.lstrip("+")
    out = []
    for i, req in enumerate(requirements):
        key = f"requires_dist[{i}]"

        def fill(m: re.Match[str], req: str = req, key: str = key) -> str:
            kind, arg = m.group(1), m.group(2)
            if kind == "LOCAL" and arg is None:
                return own
            table = labels if kind == "LOCAL" else versions
            if not arg or arg not in table:
                problem = "{VER} needs a recipe name, e.g. {VER:cumesh}" if not arg else \
                    f"no {'label' if kind == 'LOCAL' else 'version'} known for recipe {arg!r}"
                raise BadInput(where, key, req, problem)
            return str(table[arg]).lstrip("+") if kind == "LOCAL" else str(table[arg])

        text = _PLACEHOLDER.sub(fill, req)
        if "{" in text or "}" in text:
            raise BadInput(where, key, req, "unknown placeholder (known: {LOCAL}, {LOCAL:<recipe>}, {VER:<recipe>})")
        out.append(text)
    return out


def requirement_name(req: str) -> str | None:
    """The canonical project name a Requires-Dist line names (None when unreadable)."""
    try:
        return canonicalize_name(Requirement(req).name)
    except InvalidRequirement:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        return canonicalize_name(m.group(1)) if m else None


def is_torch_family(req: str) -> bool:
    return requirement_name(req) in TORCH_FAMILY


def _extras_of(reqs: Sequence[str]) -> list[str]:
    seen: list[str] = []
    for req in reqs:
        for extra in _EXTRA_MARKER.findall(req):
            if extra not in seen:
                seen.append(extra)
    return seen


def _checked_recipe_requires(reqs: Sequence[str], where: str) -> list[str]:
    for i, req in enumerate(reqs):
        if not isinstance(req, str):
            raise BadInput(where, f"requires_dist[{i}]", req, "expected a requirement string")
        try:
            Requirement(req)
        except InvalidRequirement as exc:
            raise BadInput(where, f"requires_dist[{i}]", req, f"not a valid requirement: {exc}") from None
        if is_torch_family(req):
            raise BadInput(where, f"requires_dist[{i}]", req,
                           "the torch family (torch, torchvision, torchaudio) may not be listed")
    return list(reqs)


# -------------------------------------------------------------------- wheel


def split_wheel_name(filename: str) -> dict[str, Any]:
    """'n-1.0-1-cp311-cp311-linux_x86_64.whl' -> its parts (name as written, build or None)."""
    if not filename.endswith(".whl"):
        raise WheelError(f"{filename}: not a .whl file name")
    parts = filename[: -len(".whl")].split("-")
    if len(parts) == 5:
        name, version, py, abi, plat = parts
        build = None
    elif len(parts) == 6:
        name, version, build, py, abi, plat = parts
        if not build[:1].isdigit():
            raise WheelError(f"{filename}: build tag {build!r} must start with a digit")
    else:
        raise WheelError(f"{filename}: not a wheel file name (name-version[-build]-py-abi-plat.whl)")
    return {"name": name, "version": version, "build": build, "py": py, "abi": abi, "plat": plat}


def expand_tags(py: str, abi: str, plat: str) -> list[str]:
    """Compressed tag sets (cp311.cp312) -> every `py-abi-plat` they stand for."""
    return [f"{p}-{a}-{pl}" for p in py.split(".") for a in abi.split(".") for pl in plat.split(".")]


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def find_dist_info(names: Sequence[str], filename: str) -> str:
    found = sorted({n.split("/", 1)[0] for n in names
                    if n.count("/") == 1 and n.split("/", 1)[0].endswith(".dist-info") and n.endswith("/METADATA")})
    if len(found) != 1:
        raise WheelError(f"{filename}: expected one .dist-info folder with METADATA, found {len(found)}")
    return found[0]


def _split_headers(text: str) -> tuple[list[list[str]], str]:
    """METADATA -> (header fields, each a list of its physical lines, the body after the blank line)."""
    head, sep, body = text.partition("\n\n")
    fields: list[list[str]] = []
    for line in head.split("\n"):
        if line[:1] in (" ", "\t") and fields:
            fields[-1].append(line)  # a continuation line
        elif line:
            fields.append([line])
    return fields, body if sep else ""


def _field_name(field: list[str]) -> str:
    return field[0].split(":", 1)[0].strip().lower()


def rewrite_metadata(text: str, version: str, requires_dist: Sequence[str] | None) -> str:
    """New METADATA text: Version replaced, the torch family stripped; with `requires_dist`,
    Requires-Dist and Provides-Extra replaced. Other fields and the body are kept byte for byte."""
    fields, body = _split_headers(text.replace("\r\n", "\n"))
    out: list[list[str]] = []
    insert_at: int | None = None
    for field in fields:
        name = _field_name(field)
        if name == "version":
            out.append([f"Version: {version}"])
        elif name == "requires-dist":
            if insert_at is None:
                insert_at = len(out)
            value = "\n".join(field).split(":", 1)[1].strip()
            if requires_dist is None and not is_torch_family(value):
                out.append(field)
        elif name == "provides-extra" and requires_dist is not None:
            if insert_at is None:
                insert_at = len(out)
        else:
            out.append(field)
    if requires_dist is not None:
        new = [[f"Provides-Extra: {e}"] for e in _extras_of(requires_dist)]
        new += [[f"Requires-Dist: {r}"] for r in requires_dist]
        at = len(out) if insert_at is None else insert_at
        out[at:at] = new
    head = "\n".join("\n".join(f) for f in out)
    return head + "\n\n" + body if body else head + "\n"


def add_requires_dist(text: str, requires: Sequence[str]) -> str:
    """METADATA text with `requires` appended as Requires-Dist fields (after the last one, else
    at the end of the headers); every other field and the body are kept byte for byte."""
    fields, body = _split_headers(text.replace("\r\n", "\n"))
    last = max((i for i, f in enumerate(fields) if _field_name(f) == "requires-dist"), default=len(fields) - 1)
    fields[last + 1:last + 1] = [[f"Requires-Dist: {r}"] for r in requires]
    head = "\n".join("\n".join(f) for f in fields)
    return head + "\n\n" + body if body else head + "\n"


def rewrite_wheel_file(text: str, tags: Sequence[str], build: str | None) -> str:
    """WHEEL: Tag lines equal to the file name's tags; Build present exactly when numbered."""
    lines = [ln for ln in text.replace("\r\n", "\n").split("\n")
             if ln and not ln.lower().startswith(("tag:", "build:"))]
    lines += [f"Tag: {t}" for t in tags]
    if build is not None:
        lines.append(f"Build: {build}")
    return "\n".join(lines) + "\n"


def labelled_version(version: str, local_label: str) -> str:
    """'1.2.0' or '1.2.0+cpu' -> '1.2.0+cu128torch2.8' (any local part is replaced)."""
    label = local_label.lstrip("+").lower()
    if not _LOCAL.fullmatch(label):
        raise WheelError(f"local label {local_label!r} is not a PEP 440 local version segment")
    try:
        return str(Version(f"{Version(version).public}+{label}"))
    except InvalidVersion:
        raise WheelError(f"version {version!r} is not a PEP 440 version") from None


def label_wheel(
    wheel: Path,
    out_dir: Path,
    *,
    local_label: str,
    build_number: int | None = None,
    requires_dist: Sequence[str] | None = None,
    build_info: Mapping[str, Any] | None = None,
    where: str = "recipe",
    source_date_epoch: int | None = None,
) -> Path:
    """Write the labelled copy of `wheel` into `out_dir` and return its path.

    `local_label`: 'cu128torch2.8' or 'cu128' (a leading '+' is accepted).
    `build_number`: None for a first build, N >= 1 for a rebuild.
    `requires_dist`: the recipe's list, placeholders already filled
    (substitute_requires), or None to keep the wheel's own minus the torch family.
    `build_info`: written as .dist-info/farm_build.json (cell, build key, arch list, ...).
    `source_date_epoch`: the time every entry gets (design.md §6.5); None keeps the input's times.
    """
    wheel, out_dir = Path(wheel), Path(out_dir)
    parts = split_wheel_name(wheel.name)
    if build_number is not None and (not isinstance(build_number, int) or build_number < 1):
        raise WheelError(f"build number must be a positive integer, not {build_number!r}")
    reqs = None if requires_dist is None else _checked_recipe_requires(requires_dist, where)
    build = None if build_number is None else str(build_number)

    with zipfile.ZipFile(wheel) as zin:
        infos = zin.infolist()
        old_di = find_dist_info([i.filename for i in infos], wheel.name)
        meta = zin.read(f"{old_di}/METADATA").decode("utf-8")
        m = re.search(r"^Version:\s*(\S+)\s*$", meta, re.MULTILINE)
        if not m:
            raise WheelError(f"{wheel.name}: METADATA has no Version")
        version = labelled_version(m.group(1), local_label)
        dist_name = old_di[: -len(".dist-info")].rsplit("-", 1)[0]
        new_di = f"{dist_name}-{version}.dist-info"
        old_data = old_di[: -len(".dist-info")] + ".data"
        new_data = f"{dist_name}-{version}.data"
        new_name = "-".join(
            [parts["name"], version.replace("-", "_")] + ([build] if build else [])
            + [parts["py"], parts["abi"], parts["plat"]]
        ) + ".whl"
        target = out_dir / new_name
        if target.resolve() == wheel.resolve():
            raise WheelError(f"{wheel.name}: labelling would overwrite its input; use another output folder")

        def renamed(name: str) -> str:
            top, sep, rest = name.partition("/")
            if top == old_di:
                return f"{new_di}{sep}{rest}"
            if top == old_data:
                return f"{new_data}{sep}{rest}"
            return name

        replaced = {
            f"{old_di}/METADATA": rewrite_metadata(meta, version, reqs).encode("utf-8"),
            f"{old_di}/WHEEL": rewrite_wheel_file(
                zin.read(f"{old_di}/WHEEL").decode("utf-8"),
                expand_tags(parts["py"], parts["abi"], parts["plat"]), build,
            ).encode("utf-8"),
        }
        dropped = {f"{old_di}/{BUILD_INFO_NAME}"}   # written anew below

        kept: list[tuple[str, zipfile.ZipInfo | None]] = [
            (renamed(i.filename), i) for i in infos if not i.is_dir() and i.filename not in dropped]
        if build_info is not None:
            kept.append((f"{new_di}/{BUILD_INFO_NAME}", None))
        # Payload first, the .dist-info last (RECORD at the very end), as installers expect; by name within
        # each, whatever order the backend zipped them in.
        kept.sort(key=lambda item: (item[0].startswith(f"{new_di}/"), item[0]))

        def members() -> Iterator[tuple[zipfile.ZipInfo | None, str, bytes]]:
            for name, info in kept:
                if info is None:
                    text = json.dumps(dict(build_info or {}), indent=2, sort_keys=True, default=str) + "\n"
                    yield None, name, text.encode("utf-8")
                else:
                    data = replaced.get(info.filename)
                    yield info, name, zin.read(info) if data is None else data

        write_wheel(target, members(), new_di, date_time=zip_time(source_date_epoch))
    return target


def zip_time(epoch: int | None) -> tuple[int, int, int, int, int, int] | None:
    """A zip entry's time for SOURCE_DATE_EPOCH `epoch` (UTC, as wheel and auditwheel read it; never before
    1980, which a zip cannot hold); None for None."""
    if epoch is None:
        return None
    return max(time.gmtime(int(epoch))[:6], (1980, 1, 1, 0, 0, 0))


def write_wheel(target: Path, members: Iterable[tuple[zipfile.ZipInfo | None, str, bytes]], dist_info: str,
                date_time: tuple[int, int, int, int, int, int] | None = None) -> None:
    """Write a wheel atomically (temporary name, then rename): `members` in their order, each
    (original ZipInfo or None, name, bytes), then `<dist_info>/RECORD` with fresh hashes. A RECORD
    or RECORD signature among `members` is left out (signatures cannot survive a rewrite).
    `date_time`: every entry's time (zip_time of SOURCE_DATE_EPOCH); None keeps each member's own
    (1980-01-01 for a new one)."""
    first = (1980, 1, 1, 0, 0, 0)
    stale = {f"{dist_info}/RECORD", f"{dist_info}/RECORD.jws", f"{dist_info}/RECORD.p7s"}
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        records: list[tuple[str, str, str]] = []
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info, name, data in members:
                if name in stale:
                    continue
                zi = zipfile.ZipInfo(name, date_time=date_time or (info.date_time if info else first))
                zi.external_attr = info.external_attr if info else (0o644 << 16)
                zi.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(zi, data)
                records.append((name, record_hash(data), str(len(data))))
            record_name = f"{dist_info}/RECORD"
            records.append((record_name, "", ""))
            zi = zipfile.ZipInfo(record_name, date_time=date_time or first)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(zi, _record_text(records))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _record_text(rows: Sequence[tuple[str, str, str]]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue()


def installed_path(member: str) -> str:
    """Where a wheel member lands relative to site-packages (`<name>.data/platlib/x` -> `x`)."""
    return re.sub(r"^[^/]+\.data/(?:purelib|platlib)/", "", member)


def read_wheel_metadata(wheel: Path) -> tuple[str, str]:
    """(METADATA text, dist-info folder) of a wheel: for checks and tests."""
    with zipfile.ZipFile(wheel) as z:
        di = find_dist_info(z.namelist(), Path(wheel).name)
        return z.read(f"{di}/METADATA").decode("utf-8"), di
