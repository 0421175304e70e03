"""The feature transform in TensorFlow ops: ONE implementation for Beam, trainer and serving.

`FeatureTransform` maps canonical tensors (see features.canonical) to model inputs:
  sparse  -> int64 IDs [B] (vocabulary + OOV buckets, or FarmHash fingerprint buckets)
  multivalent -> int64 RaggedTensor [B, None]
  dense   -> float32 [B] (fill, optional log1p, z-score or bucket index / num buckets)
The Beam job calls it eagerly on whole record batches; the serving export embeds it in the
SavedModel behind `canonicalize_request`, which builds canonical tensors from raw request tensors.
"""
from __future__ import annotations


import numpy as np
import pyarrow as pa
import tensorflow as tf

from features.artifact import TransformArtifact
from features.canonical import DEFAULT_SEPARATOR

__all__ = ["FeatureTransform", "canonical_to_tensors", "canonicalize_request", "request_spec", "request_from_arrow"]

_MIN_STD = 1e-6


class FeatureTransform(tf.Module):
    def __init__(self, artifact: TransformArtifact, name: str = "feature_transform"):
        super().__init__(name=name)
        self._cfg = artifact.config
        self._stats = artifact.dense_stats
        self._tables: dict[str, tf.lookup.StaticVocabularyTable] = {}
        for f in self._cfg.features.sparse:
            if f.vocab is None or f.share_embedding_with is not None:
                continue
            values = artifact.vocabularies[f.name]
            init = tf.lookup.KeyValueTensorInitializer(
                tf.constant(values, dtype=tf.string, shape=[len(values)]),
                tf.range(len(values), dtype=tf.int64))
            self._tables[f.name] = tf.lookup.StaticVocabularyTable(init, num_oov_buckets=f.vocab.oov_buckets)

    def _ids(self, owner_name: str, tokens: tf.Tensor) -> tf.Tensor:
        owner = self._cfg.sparse_by_name[owner_name]
        if owner.hash_buckets is not None:
            return tf.strings.to_hash_bucket_fast(tokens, owner.hash_buckets)
        return self._tables[owner_name].lookup(tokens)

    def _dense(self, name: str, transform: str, fill: float, x: tf.Tensor) -> tf.Tensor:
        x = tf.where(tf.math.is_nan(x), tf.constant(fill, tf.float32), x)
        stats = self._stats[name]
        if transform == "bucketize":
            boundaries = [float(b) for b in stats["boundaries"]]
            idx = tf.raw_ops.Bucketize(input=x, boundaries=boundaries)
            return tf.cast(idx, tf.float32) / float(max(len(boundaries), 1))
        if transform == "log_zscore":
            x = tf.math.log1p(tf.maximum(x, 0.0))
        std = float(stats["std"]) if float(stats["std"]) > _MIN_STD else 1.0
        return (x - float(stats["mean"])) / std

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
            offsets = arr.offsets.to_numpy().astype(np.int64)
            values = arr.values.slice(offsets[0], offsets[-1] - offsets[0]) if len(arr) else arr.values.slice(0, 0)
            flat = tf.constant(values.to_numpy(zero_copy_only=False).astype(object), dtype=tf.string,
                               shape=[len(values)])
            out[name] = tf.RaggedTensor.from_row_splits(flat, offsets - offsets[0], validate=False)
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
    cols: dict[str, tf.TensorSpec] = {}
    for f in cfg.features.sparse:
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
    for f in cfg.features.sparse:
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
