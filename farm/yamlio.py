"""YAML reading with one-line errors, and atomic text writes.

Every YAML file the farm reads goes through `load_yaml`: libyaml's safe loader (fast), plus
checks on the composed node graph before anything is constructed, so that a hostile file gets
one line naming where, never a traceback or an exploding value:
- the text must be UTF-8 (a leading BOM is accepted: editors on Windows write one);
- a key written twice in one mapping is refused (YAML would keep the last one silently);
- a mapping key must be a plain value, not a list or a mapping;
- a date must exist (`2024-13-45` makes PyYAML raise ValueError), a whole number must be short;
- a value its tag cannot make (`!!int abc`, `!!timestamp hello`) is refused where construction fails;
- nesting is bounded, and aliases may not expand the document far beyond its own size (a "billion laughs" file is
  refused by arithmetic over shared nodes, never expanded), and may not contain themselves.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from farm.errors import BadInput, shorten
from farm.settings import display

# libyaml's parser when PyYAML has it (its wheels do): ~5x faster on the recipes every process reads.
# Typed Any: which class it is is known only at run time, and _Loader derives from it.
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# What aliases may add on top of the text itself, in nodes plus scalar characters. A document
# without aliases weighs at most ~2x its length; no farm file uses anchors beyond a few rows.
MAX_ALIAS_GROWTH = 1_000_000
MAX_DEPTH = 64             # nesting levels: farm files use < 10; ~1000 makes repr() of a value raise RecursionError
MAX_DIGITS = 100           # digits of a whole number: far beyond any range the farm accepts (4301 raise in int())
_YAML_TAG = "tag:yaml.org,2002:"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_INT = "tag:yaml.org,2002:int"
_CHECKED_TAGS = (_TIMESTAMP, _INT)


class _Unconstructable(Exception):
    """A node whose value its tag cannot make (`!!int abc`, `!!timestamp hello`)."""

    def __init__(self, node):
        self.node = node


class _Loader(_SAFE_LOADER):
    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, AttributeError, OverflowError, KeyError, IndexError):   # what PyYAML raises
            raise _Unconstructable(node) from None


def load_yaml(path: Path) -> object:
    """The parsed YAML document at `path` (None when empty), or BadInput naming the file."""
    where = display(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise BadInput(where, None, None, "file not found") from None
    except IsADirectoryError:
        raise BadInput(where, None, None, "a folder, not a file") from None
    except OSError as exc:
        raise BadInput(where, None, None, f"cannot read it: {exc.strerror or exc}") from None
    return parse_yaml(raw, where)


def top_mapping(data: object, where: str, what: str) -> dict:
    """The document `data` of the file `where` when it is a mapping, as every farm file is.

    Anything else is not a `what` at all (a recipe linked to a system file, say): the line says
    what it found, never the text itself (design.md §12)."""
    if not isinstance(data, dict):
        kind = {str: "text", list: "a list", type(None): "nothing"}.get(type(data), type(data).__name__)
        raise BadInput(where, None, None, f"not a {what}: a {what} is a YAML mapping, this file holds {kind}")
    return data


def parse_yaml(raw: bytes, where: str) -> object:
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(where, None, None, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): "
                                          "save it as UTF-8") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        # Without an anchor ('&') there is no alias: nothing to weigh.
        _inspect(node, where, limit=2 * len(text) + MAX_ALIAS_GROWTH, aliases="&" in text)
        return loader.construct_document(node)
    except _Unconstructable as exc:
        bad = exc.node
        tag = bad.tag.removeprefix(_YAML_TAG)
        raise BadInput(_at(where, bad), _key_path(node, bad), bad.value if bad.id == "scalar" else None,
                       f"not a valid {'!!' if tag != bad.tag else ''}{tag} value") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BadInput(at, None, None, f"YAML syntax error: {shorten(problem)}") from None
    finally:
        loader.dispose()


def _at(where: str, node) -> str:
    return f"{where}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def _key_path(root, target) -> str | None:
    """The key path (`a.b[2]`) of the first occurrence of node `target` under `root`, None at the top."""
    seen: set[int] = set()
    stack = [(root, "")]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path or None
        if id(node) in seen or node.id == "scalar":
            continue
        seen.add(id(node))
        if node.id == "sequence":
            stack.extend((item, f"{path}[{i}]") for i, item in reversed(list(enumerate(node.value))))
        else:
            for key, value in reversed(node.value):
                child = f"{path}.{key.value}" if path else str(key.value)
                stack.extend([(value, child), (key, child)])
    return None


def _inspect(root, where: str, limit: int, aliases: bool) -> None:
    """Walk each distinct node once (aliases share nodes), iteratively, naming the key path of the
    first occurrence. With `aliases` (the text has an anchor), also `weight`: a node's size once every
    alias under it is expanded, 1 per node plus a scalar's length, summed over shared children
    without visiting them again."""
    weight: dict[int, int] = {}
    open_nodes: set[int] = set()      # the current node's ancestors: meeting one again is a cycle
    # Nodes are PyYAML's (ScalarNode, SequenceNode, MappingNode), which carry no type information.
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]     # depth -1: the node's children are done
    while stack:
        node, path, depth = stack.pop()
        if depth < 0:
            open_nodes.discard(id(node))
            children = node.value if node.id == "sequence" else [n for pair in node.value for n in pair]
            total = 1 + sum(weight.get(id(c)) or 1 + len(c.value) for c in children)
            if total > limit:
                raise BadInput(_at(where, node), path or None, None,
                               f"aliases expand this to more than {limit:,} nodes and characters "
                               "(an alias bomb?): refused without expanding it")
            weight[id(node)] = total
            continue
        if aliases:
            if id(node) in weight:
                continue
            if id(node) in open_nodes:
                raise BadInput(_at(where, node), path or None, None, "an alias refers to a node that contains it")
        if node.id == "scalar":
            if node.tag in _CHECKED_TAGS:
                _check_scalar(node, where, path)
            if aliases:
                weight[id(node)] = 1 + len(node.value)
            continue
        if depth == MAX_DEPTH:
            raise BadInput(_at(where, node), path or None, None, f"nested more than {MAX_DEPTH} levels deep")
        if aliases:
            open_nodes.add(id(node))
            stack.append((node, path, -1))
        depth += 1
        if node.id == "sequence":
            stack.extend((item, f"{path}[{i}]", depth) for i, item in reversed(list(enumerate(node.value))))
            continue
        seen: set[str] = set()
        children = []
        for key_node, value_node in node.value:
            if key_node.id != "scalar":
                raise BadInput(_at(where, key_node), path or None, None,
                               f"a key written as {'a list' if key_node.id == 'sequence' else 'a mapping'}: "
                               "keys must be plain strings")
            key = key_node.value
            child = f"{path}.{key}" if path else key
            if key in seen and key != "<<":
                raise BadInput(_at(where, key_node), child, None, "written twice in one mapping")
            seen.add(key)
            if key_node.tag in _CHECKED_TAGS:
                _check_scalar(key_node, where, child)
            children.append((value_node, child, depth))
        stack.extend(reversed(children))


def _check_scalar(node, where: str, path: str) -> None:
    if node.tag == _TIMESTAMP:
        if not yaml.constructor.SafeConstructor.timestamp_regexp.match(node.value):
            return   # not shaped like a date at all (`!!timestamp hello`): construction refuses it
        try:
            yaml.constructor.SafeConstructor.construct_yaml_timestamp(_NO_CONSTRUCTOR, node)
        except ValueError as exc:
            raise BadInput(_at(where, node), path or None, node.value,
                           f"not a real date ({exc}); quote it if it is not meant as a date") from None
    elif node.tag == _INT and len(node.value) > MAX_DIGITS:
        raise BadInput(_at(where, node), path or None, node.value,
                       f"a number of {len(node.value)} characters: far beyond any range the farm accepts")


# construct_yaml_timestamp reads nothing from its constructor but the node.
_NO_CONSTRUCTOR = yaml.constructor.SafeConstructor()


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
