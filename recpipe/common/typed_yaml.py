"""Typed YAML: dataclasses built from parsed YAML and checked against their annotations, with errors that
name the key as a dotted path (``train.steps``, ``features.sparse[2].vocab``), and a YAML reader that
refuses duplicate keys and hostile YAML (a file over MAX_YAML_BYTES, aliases that expand past
MAX_ALIAS_NODES nodes, nesting past MAX_YAML_DEPTH) before any work. Used by the feature spec, the run
options and the daily project file: every YAML recpipe reads from a user goes through read_yaml or parse_yaml."""
from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from recpipe.common.errors import ConfigError

__all__ = ["build_typed", "check_typed", "literal_choices", "read_yaml", "parse_yaml", "FLOAT_STRING_PATTERN",
           "MAX_YAML_BYTES", "MAX_ALIAS_NODES", "MAX_YAML_DEPTH"]

# The limits on a YAML file recpipe reads from a user (a config, a project file, an artifact's config.yaml).
# A real config is a few KB with a handful of aliases; these refuse an anchor bomb ("billion laughs": nine
# nested anchors of ten aliases each expand to 10**9 nodes) or a generated giant at once, not minutes later.
MAX_YAML_BYTES = 1 << 20    # 1 MiB: a larger file is refused before it is read (PyYAML parses 0.1-1 MB/s)
MAX_ALIAS_NODES = 10_000    # nodes aliases may add in all, each alias counting the whole node it repeats
MAX_YAML_DEPTH = 64         # nested mappings/sequences (PyYAML recurses per level: 500 exhaust the stack)

# PyYAML follows YAML 1.1, where 1e-9 (no dot) is a string; accept such numbers for number keys.
FLOAT_STRING_PATTERN = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"
_FLOAT_STRING = re.compile(FLOAT_STRING_PATTERN)


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(tp, str(tp))


def _coerce(tp: Any, value: Any, path: str) -> Any:
    if tp is Any:  # free-form (tune choices): checked where it is used
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, path)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{path}: {value!r} is not one of {_describe(tp)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected {_describe(tp)}, got {type(value).__name__}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):  # an already-built instance (check_typed): check its fields
            _check_fields(value, path)
            return value
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT_STRING.fullmatch(value.strip()):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{path}: must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: expected a non-empty string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp!r}")


def _build(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{path}." if path else ""
        raise ConfigError(f"{where}{unknown[0]}: unknown key (known keys: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        key_path = f"{path}.{name}" if path else name
        if name in data:
            kwargs[name] = _coerce(hints[name], data[name], key_path)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key_path}: required key is missing")
    return cls(**kwargs)


def build_typed(cls: type, data: Any, path: str = "") -> Any:
    """Build a dataclass from parsed YAML, coercing and checking every field against its annotation.

    Args:
        cls: the dataclass (its fields may be Literal, int, float, str, bool, Optional, list or dataclasses).
        data: the parsed YAML mapping.
        path: the dotted key path of `data` in the file, for the error messages ("" at the top).

    Returns:
        The built instance.

    Raises:
        ConfigError: an unknown or missing key, or a value of the wrong type, named by its key path.
    """
    return _build(cls, data, path)


def _check_fields(obj: Any, path: str) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        _coerce(hints[f.name], getattr(obj, f.name), f"{path}.{f.name}" if path else f.name)


def check_typed(obj: Any) -> Any:
    """Check an already-built dataclass field by field against its annotations.

    Args:
        obj: a dataclass instance (Literal choices, int/float/str/bool, nested dataclasses are checked).

    Returns:
        `obj` itself.

    Raises:
        ConfigError: a field of the wrong type or choice, named by its key path.
    """
    _check_fields(obj, "")
    return obj


def literal_choices(cls: type, name: str) -> tuple:
    """The allowed values of a Literal-typed (or Optional[Literal]) field, e.g. for argparse `choices`.

    Args:
        cls: a dataclass.
        name: one of its fields.

    Returns:
        The Literal's values, or () when the field is not a Literal.
    """
    tp = typing.get_type_hints(cls)[name]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):  # Optional[Literal[...]]
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else ()


class _RefusedYaml(yaml.YAMLError):
    """YAML refused by a limit while composing; read_yaml/parse_yaml prefix the file."""


def _where(event: Any) -> str:
    return f"line {event.start_mark.line + 1}, column {event.start_mark.column + 1}"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last silently), and, while
    composing (before any object is built), aliases that expand past MAX_ALIAS_NODES nodes, an alias to a node
    that contains it, and nesting past MAX_YAML_DEPTH."""

    def __init__(self, stream):
        super().__init__(stream)
        self._composed = 0                 # nodes composed so far, an alias counting the whole node it repeats
        self._alias_nodes = 0              # of which aliases added
        self._aliases = 0
        self._depth = 0
        self._sizes: dict[str, int] = {}   # anchor -> the expanded node count of its node (once composed)

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.anchors:  # (an undefined one is left to PyYAML's own error)
                self._aliases += 1
                size = self._sizes.get(event.anchor)
                if size is None:
                    raise _RefusedYaml(f"alias *{event.anchor} at {_where(event)} repeats a node that contains it "
                                       "(a recursive structure)")
                self._composed += size
                self._alias_nodes += size
                if self._alias_nodes > MAX_ALIAS_NODES:
                    raise _RefusedYaml(f"YAML aliases expand past the limit of {MAX_ALIAS_NODES:,} nodes (at alias "
                                       f"{self._aliases:,}, *{event.anchor} at {_where(event)}; an alias bomb?)")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise _RefusedYaml(f"YAML nested deeper than the limit of {MAX_YAML_DEPTH} levels (at {_where(event)})")
        before = self._composed
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._composed += 1
        if event.anchor is not None:
            self._sizes[event.anchor] = self._composed - before
        return node

    def compose_document(self):
        node = super().compose_document()
        self._sizes = {}  # anchors are per document
        return node

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden here
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _too_big(size: str, what: str) -> str:
    limit = f"{MAX_YAML_BYTES:,}-byte ({MAX_YAML_BYTES / 2**20:g} MiB)"
    return f"refused: {size} bytes, over the {limit} limit for a {what}"


def parse_yaml(text: str, source: str | Path, what: str = "config") -> Any:
    """Parse YAML text read from a user file, refusing duplicate keys and hostile YAML before any work.

    Args:
        text: the file's text.
        source: the file it came from, for the messages.
        what: what the file is, for the messages ("config", "project config").

    Returns:
        The parsed YAML.

    Raises:
        ConfigError: the text is over MAX_YAML_BYTES, its aliases expand past MAX_ALIAS_NODES nodes, it nests
            past MAX_YAML_DEPTH, or it is not valid YAML; one line naming the file (and the alias or line).
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise ConfigError(f"{source}: {_too_big(f'{size:,}', what)}")
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except _RefusedYaml as e:
        raise ConfigError(f"{source}: refused: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML ({' '.join(str(e).split())})") from None


def read_yaml(path: str | Path, what: str = "config") -> Any:
    """Read a YAML file, refusing a mapping with the same key twice (PyYAML would keep the last), and a file over
    MAX_YAML_BYTES (by its size, before reading it) or hostile YAML (see parse_yaml) at once.

    Args:
        path: the file.
        what: what the file is, for the messages ("config", "project file").

    Returns:
        The parsed YAML.

    Raises:
        ConfigError: the file cannot be read, is too big, is refused by a limit or is not valid YAML, naming
            the file.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:
            raise ConfigError(f"{path}: {_too_big(f'{size:,}', what)}")
        with path.open() as fh:
            text = fh.read(MAX_YAML_BYTES + 1)  # bounded: a pipe or a file growing under us has no honest size
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"{path}: {_too_big(f'more than {MAX_YAML_BYTES:,}', what)}")
    return parse_yaml(text, path, what)
