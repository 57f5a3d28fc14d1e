"""What differs between two wheels that should be byte-identical (design.md §6.5): per zip entry, and
inside an ELF entry per section, down to the strings a string table gained or lost.

Used by `python -m bench reproducible`, which builds one cell twice with the same build key.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ELF_MAGIC = b"\x7fELF"


@dataclass
class EntryDiff:
    """One zip entry that differs: how (`missing in a`/`missing in b`, `time`, `mode`, `bytes`) and, for
    an ELF file, the sections whose bytes differ with their strings present in only one of the two."""

    name: str
    how: list[str]
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [f"{self.name}: {', '.join(self.how)}"]
        for section, info in self.sections.items():
            text = f"  section {section}: {info['size_a']} vs {info['size_b']} bytes, {info['bytes_differ']} differ"
            for side in ("only_a", "only_b"):
                if info.get(side):
                    shown = ", ".join(info[side][:4]) + (f" (+{len(info[side]) - 4})" if len(info[side]) > 4 else "")
                    text += f"; only in {side[-1]}: {shown}"
            out.append(text)
        return out


def compare_wheels(a: Path, b: Path) -> list[EntryDiff]:
    """[] when the two files are byte-identical or differ in nothing a zip entry shows (then the
    zip layer itself: order or headers, reported as one `<zip>` entry)."""
    if Path(a).read_bytes() == Path(b).read_bytes():
        return []
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ia = {i.filename: i for i in za.infolist()}
        ib = {i.filename: i for i in zb.infolist()}
        diffs = []
        for name in sorted(set(ia) | set(ib)):
            if name not in ia or name not in ib:
                diffs.append(EntryDiff(name, ["missing in " + ("a" if name not in ia else "b")]))
                continue
            how = []
            if ia[name].date_time != ib[name].date_time:
                how.append(f"time {ia[name].date_time} vs {ib[name].date_time}")
            if ia[name].external_attr != ib[name].external_attr:
                how.append("mode")
            da, db = za.read(name), zb.read(name)
            sections = {}
            if da != db:
                how.append("bytes")
                if da.startswith(ELF_MAGIC) and db.startswith(ELF_MAGIC):
                    sections = elf_section_differences(da, db)
            if how:
                diffs.append(EntryDiff(name, how, sections))
        if not diffs:
            order = [i.filename for i in za.infolist()] != [i.filename for i in zb.infolist()]
            diffs.append(EntryDiff("<zip>", ["entry order" if order else "zip headers"]))
        return diffs


def elf_section_differences(a: bytes, b: bytes) -> dict[str, dict[str, Any]]:
    """Per section whose bytes differ: sizes, how many bytes differ, and for a string table
    (.strtab, .dynstr, .shstrtab, .comment) the NUL-separated strings found in only one of the two."""
    from elftools.elf.elffile import ELFFile

    fa, fb = ELFFile(io.BytesIO(a)), ELFFile(io.BytesIO(b))
    kinds = {s.name: s.header["sh_type"] for f in (fa, fb) for s in f.iter_sections()}
    sa = {s.name: s.data() for s in fa.iter_sections() if s.header["sh_type"] != "SHT_NOBITS"}
    sb = {s.name: s.data() for s in fb.iter_sections() if s.header["sh_type"] != "SHT_NOBITS"}
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(sa) | set(sb)):
        da, db = sa.get(name, b""), sb.get(name, b"")
        if da == db:
            continue
        info: dict[str, Any] = {"size_a": len(da), "size_b": len(db),
                      "bytes_differ": sum(x != y for x, y in zip(da, db, strict=False)) + abs(len(da) - len(db))}
        if kinds.get(name) == "SHT_STRTAB" or name == ".comment":
            strings_a, strings_b = set(da.split(b"\0")), set(db.split(b"\0"))
            info["only_a"] = sorted(s.decode("utf-8", "replace") for s in strings_a - strings_b)
            info["only_b"] = sorted(s.decode("utf-8", "replace") for s in strings_b - strings_a)
        out[name] = info
    return out


def host_strings(data: bytes, needles: list[str]) -> list[str]:
    """The printable strings (4+ characters, as `strings` finds them) of a binary that contain one of
    `needles`: a folder of the build host a binary must not name (design.md §6.4)."""
    import re

    wanted = [n.encode() for n in needles if n]
    return sorted({m.group(0).decode("ascii", "replace") for m in re.finditer(rb"[\x20-\x7e]{4,}", data)
                   if any(n in m.group(0) for n in wanted)})
