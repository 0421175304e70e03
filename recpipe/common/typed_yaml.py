"""Typed YAML: dataclasses built from parsed YAML and checked against their annotations, with errors that
name the key as a dotted path (``train.steps``, ``features.sparse[2].vocab``), and a YAML reader that
refuses duplicate keys. Used by the feature spec, the run options and the daily project file."""
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

__all__ = ["build_typed", "check_typed", "literal_choices", "read_yaml", "FLOAT_STRING_PATTERN"]

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


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path, what: str = "config") -> Any:
    """Read a YAML file, refusing a mapping with the same key twice (PyYAML would keep the last).

    Args:
        path: the file.
        what: what the file is, for the messages ("config", "project file").

    Returns:
        The parsed YAML.

    Raises:
        ConfigError: the file cannot be read or is not valid YAML, naming the file.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
