"""Smaller served models: a trained model's weights stored as bfloat16 or int8 in the export.

`quantize_model(model, embedding_dtype, dense_dtype)` swaps, in place, every SparseEmbeddings layer
(recpipe.trainers.layers: the model's embedding tables) and every `Dense` layer of a trained model for a
layer that keeps its weights in the smaller dtype and dequantizes them to float32 when called, so
the SavedModel stores (and the server holds) 1 or 2 bytes per weight instead of 4. The model's own
code runs unchanged around them, which is why the export's skew check — the served graph against
this same model on the Beam job's records — stays exact: both sides read the same quantized weights.

A SparseEmbeddings layer's tables of one width are packed into one store (`PackedTables`: one codes
variable, one scales variable; each table a row range of it), and its single-valued features are
looked up together: one gather per store for the whole request instead of a gather, a cast and a
scale per table. Unpacked, Criteo's 26 tables and 26 one-wide wide-logit tables would be 104 variables,
and the graph that saves, restores and reads them one by one would take more of the SavedModel than the
int8 weights; serving would run a few ops per table per request. Every lookup checks its IDs against their
own table's rows, so an out-of-range ID fails (naming the layer) instead of reading a neighbouring table.

int8 rules (symmetric, zero maps to zero):
- an embedding table of width >= MIN_ROW_WIDTH has one scale per row: the smallest power of two
  >= max |row| / 127, stored as its int8 exponent (one byte a row, OCP Microscaling's E8M0 scale;
  a bfloat16 scale would cost two). A code never exceeds 127, a row's largest |code| is at least 64 (at
  most one bit of precision below a free scale), and the stored scale is exactly the one used;
  narrower tables (the one-wide tables of logistic regression and
  of a wide logit) have one float32 scale per table (a constant of the graph), since a per-row
  scale would cost more than the row;
- a Dense kernel has one float32 scale per output column (TFLite's dynamic-range weight
  quantization), applied to the matmul's output; biases stay float32.
bfloat16 keeps the top 16 bits of each float32 weight (round to nearest even).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf

from recpipe.serving.version import WEIGHT_DTYPES
from recpipe.trainers.layers import SparseEmbeddings, flat_ids, pooled_features

__all__ = ["MIN_ROW_WIDTH", "MIN_EXPONENT", "pow2_exponents", "quantize_int8", "quantize_model", "PackedTables",
           "PackedEmbeddings", "QuantizedDense"]

MIN_ROW_WIDTH = 4


MIN_EXPONENT = -126  # float32's smallest normal power of two: the scale of an all-zero row


def pow2_exponents(peak: np.ndarray) -> np.ndarray:
    """The smallest integer e >= MIN_EXPONENT with 127 * 2**e >= peak (peak >= 0), as int8: the
    power-of-two scale of a slice whose largest |value| is peak."""
    peak = np.asarray(peak, np.float64)
    with np.errstate(divide="ignore"):
        e = np.ceil(np.log2(peak / 127.0))
    e = np.clip(np.nan_to_num(e, neginf=MIN_EXPONENT), MIN_EXPONENT, 127).astype(np.int64)
    e += np.ldexp(127.0, e) < peak                              # log2's rounding, either way
    e -= (np.ldexp(127.0, e - 1) >= peak) & (e > MIN_EXPONENT)
    return e.astype(np.int8)


def quantize_int8(w: np.ndarray, axis: int | None, pow2_scale: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(int8 codes, float32 scales) with w ≈ codes * scales; one scale per slice along `axis` (kept
    as a size-1 dimension, so the scales broadcast), or one for the whole array (axis None).
    pow2_scale: each scale the smallest power of two that fits the slice (an all-zero slice 2**MIN_EXPONENT)."""
    w = np.asarray(w, np.float32)
    if not np.all(np.isfinite(w)):
        raise ValueError("cannot quantize non-finite weights")
    peak = np.max(np.abs(w), axis=axis, keepdims=True) if axis is not None else np.max(np.abs(w), keepdims=True)
    if pow2_scale:
        scale = np.ldexp(1.0, pow2_exponents(peak).astype(np.int64)).astype(np.float32)
    else:
        scale = (peak / 127.0).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
    codes = np.clip(np.rint(w / safe), -127, 127).astype(np.int8)
    return codes, scale


class PackedTables(tf.Module):
    """Embedding tables of one width stored in bfloat16 or int8, stacked into one codes variable
    [rows, width] (`offsets[k]`: table k's first row). int8 scales: tables of width >= MIN_ROW_WIDTH
    one power of two per row, stored as its int8 exponent (`exponent` [rows, 1]: OCP Microscaling's
    E8M0 scale, one byte a row); narrower tables one float32 per table (`table_scales`, constants of
    the graph)."""

    def __init__(self, tables: list[np.ndarray], dtype_name: str, name: str = "packed_tables"):
        super().__init__(name=name)
        widths = {int(t.shape[1]) for t in tables}
        if len(widths) != 1 or dtype_name not in ("bfloat16", "int8"):
            raise ValueError(f"PackedTables: tables of one width, bfloat16 or int8 (got widths {sorted(widths)}, "
                             f"{dtype_name!r})")
        self.weight_dtype, self.width = dtype_name, widths.pop()
        self.rows = [int(t.shape[0]) for t in tables]
        self.offsets = [0, *np.cumsum(self.rows)[:-1].tolist()]
        self.per_row = dtype_name == "int8" and self.width >= MIN_ROW_WIDTH
        self.exponent, self.table_scales = None, None
        if dtype_name == "int8":
            parts = [quantize_int8(t, axis=1 if self.per_row else None, pow2_scale=self.per_row) for t in tables]
            self.codes = tf.Variable(np.concatenate([c for c, _ in parts]), trainable=False, name="codes")
            if self.per_row:  # the scales are exact powers of two: their exponents are exact integers
                exponents = np.rint(np.log2(np.concatenate([sc for _, sc in parts]))).astype(np.int8)
                self.exponent = tf.Variable(exponents, trainable=False, name="exponent")
            else:
                self.table_scales = [float(sc.reshape(())) for _, sc in parts]
        else:
            self.codes = tf.Variable(tf.cast(np.concatenate(tables), tf.bfloat16), trainable=False, name="codes")

    def lookup(self, tables: list[int], ids: tf.Tensor, what: str) -> tf.Tensor:
        """ids [..., len(tables)]: the last axis' i-th ID is in table tables[i]; -> float32 [..., len(tables), width].
        An ID outside [0, rows) of its table raises InvalidArgumentError naming `what`."""
        ids = tf.cast(ids, tf.int64)
        rows = [self.rows[k] for k in tables]
        inside = tf.reduce_all(tf.cast(ids, tf.uint64) < tf.constant(rows, tf.uint64))  # negative: huge unsigned
        ok = tf.debugging.Assert(inside, [f"{what}: an embedding ID outside its table's rows {rows}"])
        with tf.control_dependencies([ok]):
            at = ids + tf.constant([self.offsets[k] for k in tables], tf.int64)
        values = tf.cast(tf.gather(self.codes, at), tf.float32)
        if self.exponent is not None:  # 2**e built from its bits: (e + 127) << 23 is float32's 2**e, exactly
            e = tf.cast(tf.gather(self.exponent, at), tf.int32)
            return values * tf.bitcast(tf.bitwise.left_shift(e + 127, 23), tf.float32)
        if self.table_scales is not None:
            return values * tf.constant([[self.table_scales[k]] for k in tables], tf.float32)
        return values


class PackedEmbeddings(tf.keras.layers.Layer):
    """A SparseEmbeddings layer's tables in PackedTables stores (one per width); returns what it returned.
    The single-valued features of a store are looked up together (one gather), each multivalent one
    on its own; no ID dedup (a training knob)."""

    def __init__(self, layer: SparseEmbeddings, dtype_name: str):
        super().__init__(dtype=layer.dtype_policy, name=layer.name)
        self.feature_specs, self.table_specs = layer.feature_specs, layer.table_specs
        by_width: dict[int, list[str]] = {}
        for table, t in layer.tables.items():
            by_width.setdefault(int(t.embeddings.shape[1]), []).append(table)
        self.stores, self.where = [], {}
        for width, names in sorted(by_width.items()):
            self.where.update({n: (len(self.stores), k) for k, n in enumerate(names)})
            self.stores.append(PackedTables([layer.tables[n].embeddings.numpy() for n in names], dtype_name,
                                            name=f"{layer.name}_{dtype_name}_{width}"))
        self.table_count = len(self.where)

    def call(self, features: dict) -> dict[str, tf.Tensor]:
        present = [f for f in self.feature_specs if f["name"] in features]
        vectors = {}
        for s, store in enumerate(self.stores):
            mine = [f for f in present if self.where[f["table"]][0] == s]
            single = [f for f in mine if not isinstance(features[f["name"]], tf.RaggedTensor)]
            if single:
                ids = tf.stack([tf.cast(features[f["name"]], tf.int64) for f in single], axis=-1)
                rows = store.lookup([self.where[f["table"]][1] for f in single], ids, self.name)
                vectors.update(zip([f["name"] for f in single], tf.unstack(rows, len(single), axis=-2)))
            for f in mine:
                if f not in single:
                    ids = flat_ids(features[f["name"]])[:, None]
                    k = self.where[f["table"]][1]
                    vectors[f["name"]] = store.lookup([k], ids, f"{self.name}/{f['name']}")[:, 0]
        return pooled_features(present, features, vectors, self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "features": self.feature_specs, "tables": self.table_specs}


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
            self.scale = tf.Variable(scale[0], trainable=False, name="scale")  # [units]
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
            out = out * tf.cast(self.scale, dtype)
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
        if isinstance(value, SparseEmbeddings) and embedding_dtype != "float32":
            packed = PackedEmbeddings(value, embedding_dtype)
            counts["embedding_tables"] += packed.table_count
            return packed
        if type(value) is tf.keras.layers.Dense and dense_dtype != "float32" and value.built:
            counts["dense_layers"] += 1
            return QuantizedDense(value, dense_dtype)
        return value

    if embedding_dtype != "float32" or dense_dtype != "float32":
        for layer in list(model._flatten_layers(include_self=True, recursive=True)):  # noqa: SLF001
            _replace_in(layer, swap)
    return {**counts, "embedding_dtype": embedding_dtype, "dense_dtype": dense_dtype}
