"""TF Serving's Classify and Regress APIs over a ranking export's `predict_examples` signature.

The request holds tf.Examples of raw log columns (recpipe.features.transform.example_spec): gRPC sends the
protos (`input.example_list`, or `example_list_with_context` whose context features every example
gets, its own features winning), REST sends them as JSON (`{"examples": [...], "context": {...}}`:
a string is a bytes_list value, `{"b64": ...}` raw bytes, an integer an int64_list value, any other
number a float_list value; a list holds several values). Classify answers, per example, the classes
"0" and "1" with scores 1 - p and p (p: the click probability); Regress answers p.
"""
from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np
from tensorflow.core.example import example_pb2, feature_pb2

from recpipe.serving.errors import RequestError
from recpipe.serving.version import EXAMPLES_SIGNATURE, SIGNATURE

__all__ = ["SIGNATURES", "check_signature", "is_b64", "b64_bytes", "examples_from_json", "examples_from_input",
           "classes", "CLASS_LABELS"]

SIGNATURES = ("", SIGNATURE, EXAMPLES_SIGNATURE)  # what a classify/regress request may name
CLASS_LABELS = ("0", "1")


def check_signature(name: str) -> None:
    if name not in SIGNATURES:
        raise RequestError(f"signature {name!r} not found; classify and regress use {EXAMPLES_SIGNATURE!r}")


def is_b64(value: Any) -> bool:
    """TF Serving's JSON form of raw bytes: {"b64": "<base64>"}."""
    return isinstance(value, dict) and set(value) == {"b64"}


def b64_bytes(value: dict, where: str) -> bytes:
    """The bytes of an is_b64 value; RequestError naming `where` when it is not valid base64."""
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise RequestError(f"{where}: 'b64' is not valid base64") from None


def _feature(name: str, where: str, value: Any) -> feature_pb2.Feature:
    items = value if isinstance(value, list) else [value]
    if not items:
        return feature_pb2.Feature()
    if all(isinstance(x, str) or is_b64(x) for x in items):
        raw = [x.encode("utf-8") if isinstance(x, str) else b64_bytes(x, f"{where}: feature {name!r}") for x in items]
        return feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=raw))
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in items):
        raise RequestError(f"{where}: feature {name!r}: values must be all strings or all numbers, got "
                           f"{str(value)[:80]}")
    if all(isinstance(x, int) for x in items):
        if any(not -(2 ** 63) <= x < 2 ** 63 for x in items):
            raise RequestError(f"{where}: feature {name!r}: integer out of int64 range (an int64_list carries a uint64 "
                               f"value of 2**63 and more as its bit pattern, the value - 2**64)")
        return feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=items))
    return feature_pb2.Feature(float_list=feature_pb2.FloatList(value=[float(x) for x in items]))


def _example(obj: Any, where: str) -> example_pb2.Example:
    if not isinstance(obj, dict):
        raise RequestError(f"{where} must be an object of feature name -> value(s)")
    ex = example_pb2.Example()
    for name, value in obj.items():
        if value is None:
            continue  # absent: a missing value
        ex.features.feature[name].CopyFrom(_feature(name, where, value))
    return ex


def examples_from_json(body: Any) -> list[bytes]:
    """A REST classify/regress body -> serialized tf.Examples (context features merged in)."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    check_signature(body.get("signature_name", ""))
    unknown = sorted(set(body) - {"signature_name", "examples", "context"})
    if unknown:
        raise RequestError(f"unknown key {unknown[0]!r} (a classify/regress body has 'examples' and 'context')")
    rows = body.get("examples")
    if not isinstance(rows, list) or not rows:
        raise RequestError("'examples' must be a non-empty list of objects")
    context = _example(body["context"], "context") if "context" in body else None
    out = []
    for i, row in enumerate(rows):
        ex = _example(row, f"examples[{i}]")
        out.append(_with_context(ex, context).SerializeToString())
    return out


def _with_context(ex: example_pb2.Example, context: example_pb2.Example | None) -> example_pb2.Example:
    if context is None:
        return ex
    merged = example_pb2.Example()
    merged.CopyFrom(context)
    merged.MergeFrom(ex)  # map entries: the example's own features replace the context's
    return merged


def examples_from_input(inp) -> list[bytes]:
    """A tensorflow.serving.Input proto -> serialized tf.Examples."""
    kind = inp.WhichOneof("kind")
    if kind == "example_list":
        return [ex.SerializeToString() for ex in inp.example_list.examples]
    if kind == "example_list_with_context":
        ctx = inp.example_list_with_context.context
        return [_with_context(ex, ctx).SerializeToString() for ex in inp.example_list_with_context.examples]
    raise RequestError("input: give example_list or example_list_with_context")


def classes(scores: np.ndarray) -> list[list[tuple[str, float]]]:
    """Per example: [("0", 1 - p), ("1", p)]."""
    return [[(CLASS_LABELS[0], 1.0 - float(p)), (CLASS_LABELS[1], float(p))] for p in scores]
