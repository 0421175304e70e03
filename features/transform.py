"""The feature transform in TensorFlow ops: the graph the trainer and the serving export run.

`FeatureTransform` maps canonical tensors (see features.canonical) to model inputs:
  sparse  -> int64 IDs [B] (vocabulary + OOV buckets, or FarmHash fingerprint buckets)
  multivalent -> int64 RaggedTensor [B, None]
  dense   -> float32 [B] (fill, optional log1p, z-score or bucket index / num buckets)
The serving export embeds it in the SavedModel behind `canonicalize_request`, which builds canonical
tensors from raw request tensors. The Beam job applies features.batch_transform.BatchTransform to
whole Arrow record batches: the same transform without TensorFlow, tested equal and checked against
the graph by every export's skew check.
"""
from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import tensorflow as tf

from features.artifact import TransformArtifact
from features.batch_transform import zscore_std
from features.canonical import CROSS_SEPARATOR, DEFAULT_SEPARATOR, list_parts

__all__ = ["FeatureTransform", "canonical_to_tensors", "canonicalize_request", "request_spec",
           "request_from_arrow", "example_spec", "request_from_examples", "examples_from_arrow"]


class FeatureTransform(tf.Module):
    def __init__(self, artifact: TransformArtifact, name: str = "feature_transform"):
        super().__init__(name=name)
        self._cfg = artifact.config
        self._stats = artifact.dense_stats
        self._tables: dict[str, tf.lookup.StaticHashTable] = {}
        self._slots: dict[str, int] = {}
        for f in self._cfg.features.sparse:
            if f.vocab is None or f.share_embedding_with is not None:
                continue
            values = artifact.vocabularies[f.name]
            self._slots[f.name] = len(values)
            ids = [i for i, v in enumerate(values) if v is not None]  # a None is a free slot: it maps no value
            if not ids:  # nothing reached min_count: every token is OOV (a table cannot be empty)
                continue
            init = tf.lookup.KeyValueTensorInitializer(
                tf.constant([values[i] for i in ids], dtype=tf.string, shape=[len(ids)]),
                tf.constant(ids, dtype=tf.int64, shape=[len(ids)]))
            self._tables[f.name] = tf.lookup.StaticHashTable(init, default_value=-1)

    def _ids(self, owner_name: str, tokens: tf.Tensor) -> tf.Tensor:
        """Vocabulary IDs, and for OOV tokens slots + FarmHash64(token) % oov_buckets (what TF's
        StaticVocabularyTable does, with the slot count, free slots included, as the vocabulary size)."""
        owner = self._cfg.sparse_by_name[owner_name]
        if owner.hash_buckets is not None:
            return tf.strings.to_hash_bucket_fast(tokens, owner.hash_buckets)
        oov = self._slots[owner_name] + tf.strings.to_hash_bucket_fast(tokens, owner.vocab.oov_buckets)
        if owner_name not in self._tables:
            return oov
        ids = self._tables[owner_name].lookup(tokens)
        return tf.where(ids >= 0, ids, oov)

    def _dense(self, name: str, transform: str, fill: float, x: tf.Tensor) -> tf.Tensor:
        x = tf.where(tf.math.is_nan(x), tf.constant(fill, tf.float32), x)
        stats = self._stats[name]
        if transform == "bucketize":
            boundaries = [float(b) for b in stats["boundaries"]]
            idx = tf.raw_ops.Bucketize(input=x, boundaries=boundaries)
            return tf.cast(idx, tf.float32) / float(max(len(boundaries), 1))
        if transform == "log_zscore":
            x = tf.math.log1p(tf.maximum(x, 0.0))
        return (x - float(stats["mean"])) / zscore_std(stats)

    def __call__(self, canonical: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Transforms the features present in `canonical` (all of them, or e.g. a query tower's)."""
        out: dict[str, tf.Tensor] = {}
        for f in self._cfg.features.sparse:
            if f.name not in canonical:
                continue
            owner = self._cfg.table_owner(f).name
            x = canonical[f.name]
            if isinstance(x, tf.RaggedTensor):
                out[f.name] = x.with_flat_values(self._ids(owner, x.flat_values))
            else:
                out[f.name] = self._ids(owner, x)
        for d in self._cfg.features.dense:
            if d.name in canonical:
                out[d.name] = self._dense(d.name, d.transform, d.fill, canonical[d.name])
        return out


def canonical_to_tensors(columns: dict[str, pa.Array]) -> dict[str, tf.Tensor]:
    """Canonical Arrow columns -> tensors (RaggedTensor for list columns)."""
    out: dict[str, tf.Tensor] = {}
    for name, arr in columns.items():
        if pa.types.is_list(arr.type):
            values, splits = list_parts(arr)
            flat = tf.constant(values.to_numpy(zero_copy_only=False).astype(object), dtype=tf.string,
                               shape=[len(values)])
            out[name] = tf.RaggedTensor.from_row_splits(flat, splits, validate=False)
        elif pa.types.is_string(arr.type):
            out[name] = tf.constant(arr.to_numpy(zero_copy_only=False).astype(object), dtype=tf.string,
                                    shape=[len(arr)])
        else:
            out[name] = tf.constant(arr.to_numpy(zero_copy_only=False).astype(np.float32), dtype=tf.float32)
    return out


# ------------------------------------------------------------------ serving-side raw inputs
_REQUEST_DTYPES = {"string": tf.string, "int": tf.int64, "float": tf.float32,
                   "list<string>": tf.string, "list<int>": tf.string}


def request_spec(artifact: TransformArtifact, features: list[str] | None = None) -> dict[str, tf.TensorSpec]:
    """One [None] input per raw log column a feature reads, named after the column: strings and
    int64 for sparse columns as logged, float32 for dense ones (NaN = missing).

    Multivalent columns arrive as one string per row joined by the feature's separator
    (``|`` for list columns), because TF Serving's JSON/gRPC batches must be rectangular.
    """
    cfg = artifact.config
    wanted = set(features) if features is not None else None
    if wanted is not None:  # a cross needs its sources' columns
        wanted |= {s for f in cfg.crosses if f.name in wanted for s in f.cross}
    cols: dict[str, tf.TensorSpec] = {}
    for f in cfg.column_sparse:
        if wanted is None or f.name in wanted:
            kind = artifact.raw_schema[f.column]
            cols[f.column] = tf.TensorSpec([None], _REQUEST_DTYPES[kind], name=f.column)
    for d in cfg.features.dense:  # float32 for int columns too: NaN is how a request says "missing"
        if wanted is None or d.name in wanted:
            cols.setdefault(d.column, tf.TensorSpec([None], tf.float32, name=d.column))
    return cols


def canonicalize_request(inputs: dict[str, tf.Tensor], artifact: TransformArtifact) -> dict[str, tf.Tensor]:
    """Raw request tensors -> the canonical tensors features.canonical builds from Arrow, for every
    feature whose column the request carries."""
    cfg = artifact.config
    out: dict[str, tf.Tensor] = {}
    for f in cfg.column_sparse:
        if f.column not in inputs:
            continue
        x = inputs[f.column]
        if x.dtype != tf.string:
            x = tf.strings.as_string(x)
        if f.multivalent:
            tokens = tf.strings.split(x, sep=f.separator or DEFAULT_SEPARATOR)
            out[f.name] = tf.ragged.boolean_mask(tokens, tf.not_equal(tokens, ""))
        else:
            out[f.name] = x
    for f in cfg.crosses:  # the strings features.canonical joins for the Beam job
        if all(s in out for s in f.cross):
            out[f.name] = tf.strings.join([out[s] for s in f.cross], separator=CROSS_SEPARATOR)
    for d in cfg.features.dense:
        if d.column in inputs:
            out[d.name] = tf.cast(inputs[d.column], tf.float32)
    return out


def request_from_arrow(table: pa.Table, specs: dict[str, tf.TensorSpec]) -> dict[str, tf.Tensor]:
    """Raw log rows as the serving signature takes them: lists joined by '|', null floats as NaN."""
    request = {}
    for name, spec in specs.items():
        values = table.column(name).to_pylist()
        if spec.dtype == tf.string:
            values = [DEFAULT_SEPARATOR.join(map(str, v)) if isinstance(v, list) else (v or "") for v in values]
        elif spec.dtype == tf.float32:
            values = [np.nan if v is None else float(v) for v in values]
        request[name] = tf.constant(values, spec.dtype)
    return request


# ------------------------------------------------------------------ tf.Example requests
def example_spec(artifact: TransformArtifact) -> dict[str, tf.io.RaggedFeature]:
    """How a serialized tf.Example carries the raw columns request_spec names (TF Serving's
    classify/regress clients send these): an ID column as bytes_list (string columns) or int64_list
    (integer columns), a list column as a bytes_list/int64_list of its items (or one joined string
    when the log stores it joined), a dense column as float_list. Every feature may be absent: a
    missing value, as a null in the log."""
    cfg = artifact.config
    spec: dict[str, tf.io.RaggedFeature] = {}
    for f in cfg.column_sparse:
        kind = artifact.raw_schema[f.column]
        spec[f.column] = tf.io.RaggedFeature(tf.int64 if kind in ("int", "list<int>") else tf.string)
    for d in cfg.features.dense:
        spec.setdefault(d.column, tf.io.RaggedFeature(tf.float32))
    return spec


def _one_value(column: str, values: tf.RaggedTensor, default) -> tf.Tensor:
    check = tf.debugging.assert_less_equal(values.row_lengths(), tf.constant(1, values.row_splits.dtype),
                                           message=f"feature {column!r} takes at most one value per example")
    with tf.control_dependencies([check]):
        return values.to_tensor(default_value=default, shape=[None, 1])[:, 0]


def request_from_examples(parsed: dict[str, tf.RaggedTensor], artifact: TransformArtifact) -> dict[str, tf.Tensor]:
    """Parsed Examples (example_spec) -> the raw request tensors canonicalize_request takes: ID
    columns as strings ("" when absent, as a null in the log), list columns joined by the feature's
    separator, dense values as float32 (NaN when absent)."""
    cfg = artifact.config
    out: dict[str, tf.Tensor] = {}
    for f in cfg.column_sparse:
        values = parsed[f.column]
        if values.dtype != tf.string:
            values = tf.strings.as_string(values)
        if f.multivalent and artifact.raw_schema[f.column].startswith("list"):
            sep = f.separator or DEFAULT_SEPARATOR
            clash = tf.reduce_any(tf.strings.regex_full_match(values.flat_values, f".*{re.escape(sep)}.*"))
            check = tf.debugging.assert_equal(clash, False, message=f"feature {f.column!r}: a list item contains "
                                                                   f"the separator {sep!r}")
            with tf.control_dependencies([check]):
                out[f.column] = tf.strings.reduce_join(values, axis=1, separator=sep)
        else:
            out[f.column] = _one_value(f.column, values, "")
    for d in cfg.features.dense:
        if d.column not in out:
            out[d.column] = _one_value(d.column, parsed[d.column], float("nan"))
    return out


def examples_from_arrow(table: pa.Table, artifact: TransformArtifact) -> list[bytes]:
    """Raw log rows as serialized tf.Examples in the example_spec layout (nulls left out)."""
    spec = example_spec(artifact)
    columns = {name: table.column(name).to_pylist() for name in spec}
    out = []
    for i in range(table.num_rows):
        feature = {}
        for name, fs in spec.items():
            v = columns[name][i]
            if v is None:
                continue
            items = v if isinstance(v, list) else [v]
            if fs.dtype == tf.int64:
                feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in items]))
            elif fs.dtype == tf.float32:
                feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(x) for x in items]))
            else:
                feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[x if isinstance(x, bytes) else str(x).encode("utf-8") for x in items]))
        out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return out
