"""Smaller served models: a trained model's weights stored as bfloat16 or int8 in the export.

`quantize_model(model, embedding_dtype, dense_dtype)` swaps, in place, every Keras `Embedding`
table and every `Dense` layer of a trained model for a layer that keeps its weights in the smaller
dtype and dequantizes them to float32 when called, so the SavedModel stores (and the server holds)
1 or 2 bytes per weight instead of 4. The model's own code runs unchanged around them, which is why
the export's skew check — the served graph against this same model on the Beam job's records —
stays exact: both sides read the same quantized weights.

int8 rules (symmetric, zero maps to zero):
- an embedding table of width >= MIN_ROW_WIDTH has one scale per row (max |row| / 127), stored as
  bfloat16 and rounded up before the codes are computed, so a code never exceeds 127 and the stored
  scale is exactly the one used; narrower tables (the one-wide tables of logistic regression and
  of a wide logit) share one float32 scale per table, since a per-row scale would cost more than the row;
- a Dense kernel has one float32 scale per output column (TFLite's dynamic-range weight
  quantization), applied to the matmul's output; biases stay float32.
bfloat16 keeps the top 16 bits of each float32 weight (round to nearest even).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

from serving.version import WEIGHT_DTYPES

__all__ = ["MIN_ROW_WIDTH", "quantize_int8", "quantize_model", "QuantizedEmbedding",
           "QuantizedDense"]

MIN_ROW_WIDTH = 4


def _bf16_up(x: np.ndarray) -> np.ndarray:
    """The smallest bfloat16 values >= x (x >= 0), as float32."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    low = bits & np.uint32(0xFFFF)
    up = (bits & np.uint32(0xFFFF0000)) + np.where(low != 0, np.uint32(0x10000), np.uint32(0))
    return up.astype(np.uint32).view(np.float32)


def quantize_int8(w: np.ndarray, axis: int | None, bf16_scale: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(int8 codes, float32 scales) with w ≈ codes * scales; one scale per slice along `axis` (kept
    as a size-1 dimension, so the scales broadcast), or one for the whole array (axis None)."""
    w = np.asarray(w, np.float32)
    if not np.all(np.isfinite(w)):
        raise ValueError("cannot quantize non-finite weights")
    peak = np.max(np.abs(w), axis=axis, keepdims=True) if axis is not None else np.max(np.abs(w), keepdims=True)
    scale = (peak / 127.0).astype(np.float32)
    if bf16_scale:
        scale = _bf16_up(scale)
    safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
    codes = np.clip(np.rint(w / safe), -127, 127).astype(np.int8)
    return codes, scale


def _dequantized(codes, scale):
    values = tf.cast(codes, tf.float32)
    return values if scale is None else values * tf.cast(scale, tf.float32)


class QuantizedEmbedding(tf.keras.layers.Layer):
    """An Embedding table kept in bfloat16 or int8 (+ scales); lookups return float32 rows."""

    def __init__(self, table: np.ndarray, dtype_name: str, **kwargs):
        super().__init__(dtype="float32", **kwargs)
        self.weight_dtype, self.rows, self.width = dtype_name, int(table.shape[0]), int(table.shape[1])
        if dtype_name == "int8":
            per_row = self.width >= MIN_ROW_WIDTH
            codes, scale = quantize_int8(table, axis=1 if per_row else None, bf16_scale=per_row)
            self.codes = tf.Variable(codes, trainable=False, name="codes")
            self.scale = tf.Variable(scale.astype(np.float32) if not per_row else scale,
                                     dtype=tf.bfloat16 if per_row else tf.float32, trainable=False, name="scale")
            self.per_row = per_row
        else:
            self.codes = tf.Variable(tf.cast(table, tf.bfloat16), trainable=False, name="codes")
            self.scale, self.per_row = None, False

    def call(self, ids):
        if ids.dtype not in (tf.int32, tf.int64):
            ids = tf.cast(ids, tf.int64)
        rows = tf.gather(self.codes, ids)
        if self.scale is None:
            return _dequantized(rows, None)
        return _dequantized(rows, tf.gather(self.scale, ids) if self.per_row else self.scale)

    def get_config(self):
        return {**super().get_config(), "weight_dtype": self.weight_dtype, "rows": self.rows, "width": self.width}


class QuantizedDense(tf.keras.layers.Layer):
    """A trained Dense layer whose kernel is kept in bfloat16 or int8 (one scale per output column);
    the bias and the activation are the original's, and so is the compute dtype."""

    def __init__(self, dense: tf.keras.layers.Dense, dtype_name: str, **kwargs):
        super().__init__(dtype=dense.dtype_policy, name=dense.name, **kwargs)
        kernel = dense.kernel.numpy()
        self.weight_dtype, self.activation = dtype_name, dense.activation
        if dtype_name == "int8":
            codes, scale = quantize_int8(kernel, axis=0)
            self.codes = tf.Variable(codes, trainable=False, name="codes")
            self.scale = tf.Variable(scale, trainable=False, name="scale")
        else:
            self.codes = tf.Variable(tf.cast(kernel, tf.bfloat16), trainable=False, name="codes")
            self.scale = None
        self.bias = tf.Variable(dense.bias.numpy(), trainable=False, name="bias") if dense.use_bias else None

    def call(self, inputs):
        dtype = self._compute_dtype_object
        inputs = tf.cast(inputs, dtype)
        kernel = tf.cast(self.codes, dtype)
        out = tf.matmul(inputs, kernel) if inputs.shape.rank == 2 else tf.tensordot(inputs, kernel, [[-1], [0]])
        if self.scale is not None:  # x @ (codes * s) = (x @ codes) * s, s per output column: scale the output
            out = out * tf.cast(self.scale[0], dtype)
        if self.bias is not None:
            out = tf.nn.bias_add(out, tf.cast(self.bias, dtype))
        return self.activation(out) if self.activation is not None else out

    def get_config(self):
        return {**super().get_config(), "weight_dtype": self.weight_dtype}


def _replace_in(layer: tf.keras.layers.Layer, swap: Callable[[object], object]) -> None:
    """Swap the layers `layer` holds directly: as attributes, or in its lists and dicts (given anew,
    as an in-place edit of a tracked list cannot be saved)."""
    for name, value in list(vars(layer).items()):
        if name.startswith("_self_"):
            continue
        if isinstance(value, list):  # Keras' ListWrapper and _DictWrapper pass these checks
            new = [swap(v) for v in value]
            changed = any(a is not b for a, b in zip(new, value))
        elif isinstance(value, dict):
            new = {k: swap(v) for k, v in value.items()}
            changed = any(new[k] is not v for k, v in value.items())
        else:
            new = swap(value)
            changed = new is not value
        if changed:
            setattr(layer, name, new)


def quantize_model(model: tf.keras.Model, embedding_dtype: str = "float32", dense_dtype: str = "float32") -> dict:
    """Swap, in place, the model's Embedding tables for `embedding_dtype` ones and its Dense layers for
    `dense_dtype` ones (float32: left as they are). Returns what was swapped: {"embedding_tables",
    "dense_layers", "embedding_dtype", "dense_dtype"}."""
    for d in (embedding_dtype, dense_dtype):
        if d not in WEIGHT_DTYPES:
            raise ValueError(f"weight dtype {d!r}: expected one of {', '.join(WEIGHT_DTYPES)}")
    counts = {"embedding_tables": 0, "dense_layers": 0}

    def swap(value):
        if isinstance(value, tf.keras.layers.Embedding) and embedding_dtype != "float32":
            counts["embedding_tables"] += 1
            return QuantizedEmbedding(value.embeddings.numpy(), embedding_dtype, name=value.name)
        if type(value) is tf.keras.layers.Dense and dense_dtype != "float32" and value.built:
            counts["dense_layers"] += 1
            return QuantizedDense(value, dense_dtype)
        return value

    if embedding_dtype != "float32" or dense_dtype != "float32":
        for layer in list(model._flatten_layers(include_self=True, recursive=True)):  # noqa: SLF001
            _replace_in(layer, swap)
    return {**counts, "embedding_dtype": embedding_dtype, "dense_dtype": dense_dtype}
