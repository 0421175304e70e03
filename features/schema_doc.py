"""The feature spec's reference, generated from its one source, the dataclasses of recpipe.features.schema:
each key's type and default from the annotations, its meaning from the comment beside or above the field.
json_schema() gives a JSON Schema an editor's YAML language server can check a config with as it is typed;
reference_markdown() gives the reference page (docs/config.md)."""
from __future__ import annotations

import dataclasses
import inspect
import io
import json
import tokenize
import types
import typing
from typing import Any, Literal

from recpipe.common.typed_yaml import FLOAT_STRING_PATTERN
from recpipe.features.schema import Config

__all__ = ["field_docs", "json_schema", "reference_markdown", "SCHEMA_ID"]

SCHEMA_ID = "https://recpipe.dev/schemas/config.json"


def field_docs(cls: type) -> dict[str, str]:
    """Each field's meaning, read from the class's source: the comment after the field on its line, else the
    comment lines right above it.

    Args:
        cls: a dataclass of the schema.

    Returns:
        Field name -> its comment text (empty when it has none).
    """
    source = inspect.getsource(cls)
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    field_lines: set[int] = set()  # lines starting with a name at the class body's indentation
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.start[1] == 4:
            field_lines.add(tok.start[0])
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.add(tok.start[0])
    lines = source.splitlines()
    names = {f.name for f in dataclasses.fields(cls)}
    out = {}
    for number, line in enumerate(lines, start=1):
        head = line.strip().split(":", 1)[0]
        if head not in names or head in out or number not in field_lines:
            continue
        if number in comments:
            out[head] = comments[number]
            continue
        above, k = [], number - 1
        while k in comments and k not in code_lines:
            above.insert(0, comments[k])
            k -= 1
        out[head] = " ".join(above)
    attributes = _docstring_attributes(cls)
    return {name: out.get(name) or attributes.get(name, "") for name in names}


def _docstring_attributes(cls: type) -> dict[str, str]:
    """The `Attributes:` section of a Google-style class docstring: name -> text."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    if "Attributes:" not in doc:
        return {}
    out: dict[str, str] = {}
    current = None
    for line in doc.split("Attributes:", 1)[1].splitlines():
        if not line.strip():
            continue
        if not line.startswith("    "):
            break
        head, sep, rest = line.strip().partition(": ")
        if sep and not line.startswith("        ") and head.isidentifier():
            current = head
            out[head] = rest.strip()
        elif current:
            out[current] += " " + line.strip()
    return out


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return dataclasses.MISSING
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def _type_schema(tp: Any, defs: dict) -> dict:
    if tp is Any:
        return {}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return {"anyOf": [_type_schema(args[0], defs), {"type": "null"}]}
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin is list:
        return {"type": "array", "items": _type_schema(typing.get_args(tp)[0], defs)}
    if dataclasses.is_dataclass(tp):
        _define(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:  # YAML 1.1 reads 1e-9 as a string; the loader takes it as a number
        return {"anyOf": [{"type": "number"}, {"type": "string", "pattern": FLOAT_STRING_PATTERN}]}
    if tp is str:
        return {"type": "string", "minLength": 1}
    raise TypeError(f"no JSON Schema for {tp!r}")


def _define(cls: type, defs: dict) -> None:
    if cls.__name__ in defs:
        return
    defs[cls.__name__] = {}  # placeholder: a class that refers to itself stops here
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    properties, required = {}, []
    for f in dataclasses.fields(cls):
        prop = dict(_type_schema(hints[f.name], defs))
        if docs[f.name]:
            prop["description"] = docs[f.name]
        default = _default(f)
        if default is dataclasses.MISSING:
            required.append(f.name)
        else:
            prop["default"] = default
        properties[f.name] = prop
    out: dict = {"type": "object", "additionalProperties": False, "properties": properties}
    if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}("):
        out["description"] = " ".join(inspect.cleandoc(cls.__doc__).split("Attributes:")[0].split())
    if required:
        out["required"] = required
    defs[cls.__name__] = out


def json_schema() -> dict:
    """A JSON Schema (draft 2020-12) of the feature spec YAML.

    It checks keys, types and choices; the checks across fields (unique names, crosses, retrieval towers)
    are load_config's.

    Returns:
        The schema as plain data (json.dumps it).
    """
    defs: dict = {}
    _define(Config, defs)
    root = defs.pop("Config")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "recpipe config", **root, "$defs": defs}


def _type_text(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return f"{_type_text(args[0])} or null"
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_text(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return {int: "integer", float: "number", str: "string", bool: "true/false"}.get(tp, "any")


def _rows(cls: type, prefix: str, out: list[str], seen: set) -> list[tuple[str, type]]:
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    nested = []
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{prefix}{f.name}"
        inner = typing.get_args(tp)[0] if typing.get_origin(tp) is list else tp
        if typing.get_origin(inner) in (typing.Union, types.UnionType):
            inner = next(a for a in typing.get_args(inner) if a is not type(None))
        default = _default(f)
        shown = ("required" if default is dataclasses.MISSING else
                 "see below" if dataclasses.is_dataclass(inner) and default not in (None, []) else
                 f"`{json.dumps(default)}`")
        out.append(f"| `{key}` | {_type_text(tp)} | {shown} | {docs[f.name] or ''} |")
        if dataclasses.is_dataclass(inner) and inner not in seen:
            seen.add(inner)
            nested.append((f"{key}[]." if typing.get_origin(tp) is list else f"{key}.", inner))
    return nested


def reference_markdown() -> str:
    """The config reference page: one table per section, each key with its type, default and meaning.

    Returns:
        Markdown text (docs/config.md).
    """
    lines = ["# Config reference", "",
             "Generated by `recpipe config reference` from `features/schema.py`; do not edit by hand. Every key is",
             "checked when a config loads, and an error names the key as a dotted path "
             "(`features.sparse[2].vocab.min_count`).",
             "`recpipe config schema` prints the same keys as a JSON Schema: point your editor's YAML language "
             "server at it",
             "with a first line `# yaml-language-server: $schema=PATH/TO/config.schema.json` in the config.", ""]
    queue, seen = [("", Config)], {Config}
    while queue:
        prefix, cls = queue.pop(0)
        title = prefix.rstrip(".") or "top level"
        lines += [f"## `{title}`", ""]
        if cls.__doc__ and not cls.__doc__.startswith(f"{cls.__name__}("):
            lines += [" ".join(inspect.cleandoc(cls.__doc__).split("Attributes:")[0].split()), ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        body: list[str] = []
        queue += _rows(cls, prefix, body, seen)
        lines += body + [""]
    return "\n".join(lines)
