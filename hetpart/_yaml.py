"""YAML for untrusted input files: the C parser where available, no aliases, no duplicate keys, bounded size.

An alias (``*a``) lets a 1 KB file name a structure of hundreds of millions of elements (the
"billion laughs"); hetpart's input files never need one, so any alias or merge key is refused while
the parsed node tree is checked, before anything is built or printed. A mapping that repeats a key
is refused too: PyYAML silently keeps the last value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hetpart import _validate as v
from hetpart.errors import HetpartError

__all__ = ["MAX_YAML_BYTES", "load_yaml_file", "load_yaml_text"]

MAX_YAML_BYTES = 1 * 2**20
"""Input YAML files (clusters, suites, configs) are a few KB; a larger one is a wrong path or an attack."""

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser when PyYAML was built with it (about 10x faster than the pure-Python one)."""


def load_yaml_file(exc: type[HetpartError], path: Path, what: str) -> Any:
    """The data of the YAML file ``path``; ``exc`` with the file, line and fix on anything wrong."""
    path = Path(path)
    try:
        size = path.stat().st_size if path.is_file() else 0
    except OSError:
        size = 0
    if size > MAX_YAML_BYTES:
        raise exc(f"{path}: {what} is {size:,} bytes, more than the {MAX_YAML_BYTES:,} byte limit for YAML input; "
                  "check the path")
    return load_yaml_text(exc, v.read_text(exc, path, what), str(path))


def load_yaml_text(exc: type[HetpartError], text: str, source: str) -> Any:
    """Parse ``text`` (from ``source``) refusing aliases, merge keys and duplicate keys."""
    if len(text) > MAX_YAML_BYTES:
        raise exc(f"{source}: {len(text):,} characters, more than the {MAX_YAML_BYTES:,} limit for YAML input")
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_tree(exc, node, source, text)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "malformed YAML"
        raise exc(f"{source}: invalid YAML{at}: {problem}; fix the syntax") from None
    except RecursionError:
        raise exc(f"{source}: YAML nested too deeply; simplify the file") from None
    except ValueError as err:  # e.g. an integer with more digits than Python converts
        raise exc(f"{source}: unreadable value in YAML ({v.show(str(err), 120)}); fix the file") from None
    finally:
        loader.dispose()


def _at(node: yaml.Node) -> str:
    mark = node.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _check_tree(exc: type[HetpartError], root: yaml.Node, source: str, text: str) -> None:
    """Refuse a node reached twice (an alias), a merge key and a repeated mapping key; visits each node once."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            raise exc(f"{source}: YAML alias at {_first_alias(text) or _at(node)}: aliases (*name) are not accepted "
                      "in hetpart input; write the value out")
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: dict[Any, yaml.Node] = {}
            for key, value in node.value:
                if key.tag == "tag:yaml.org,2002:merge":
                    raise exc(f"{source}: YAML merge key '<<' at {_at(key)} is not accepted in hetpart input; "
                              "write the keys out")
                if isinstance(key, yaml.ScalarNode):
                    if key.value in keys:
                        raise exc(f"{source}: duplicate key {v.show(key.value)} at {_at(key)} (first at "
                                  f"{_at(keys[key.value])}); keep one")
                    keys[key.value] = key
                stack += [key, value]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value


def _first_alias(text: str) -> str | None:
    """Where the first alias of ``text`` is (the node tree only knows where the anchored value is)."""
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent):
            mark = event.start_mark
            return f"line {mark.line + 1}, column {mark.column + 1}"
    return None
