"""The feature transform in TensorFlow ops: the graph the trainer and the serving export run.

`FeatureTransform` maps canonical tensors (see recpipe.features.canonical) to model inputs:
  sparse  -> int64 IDs [B] (vocabulary + OOV buckets, or FarmHash fingerprint buckets)
  multivalent -> int64 RaggedTensor [B, None]
  dense   -> float32 [B] (fill, optional log1p, z-score or bucket index / num buckets)
The serving export embeds it in the SavedModel behind `canonicalize_request`, which builds canonical
tensors from raw request tensors. The Beam job applies recpipe.features.batch_transform.BatchTransform to
whole Arrow record batches: the same transform without TensorFlow, tested equal and checked against
the graph by every export's skew check.
"""
from __future__ import annotations

import zlib
from typing import Mapping

import numpy as np
import pyarrow as pa
import tensorflow as tf

from recpipe.features.artifact import TransformArtifact
from recpipe.features.batch_transform import zscore_std
from recpipe.features.canonical import (CROSS_SEPARATOR, DEFAULT_SEPARATOR, FLOAT32_MAX, list_parts, list_separator,
                                        numeric, splits_back, unsplittable_reason)
from recpipe.features.config import Config

__all__ = ["FeatureTransform", "PackedVocabularies", "canonical_to_tensors", "canonicalize_request", "request_spec",
           "request_from_arrow", "int64_nulls", "string_ids", "INTEGER_ID_DTYPES", "example_spec",
           "request_from_examples", "examples_from_arrow"]


_KEY_SEPARATOR = "\x1f"  # vocabulary table keys "<owner index>\x1f<value>": an index holds no separator
_BYTE_SHIFTS = [8 * i for i in range(8)]


def _per_column(values: list, columns: list[int], dtype: tf.DType) -> tf.Tensor:
    """[K] constant of values[columns[k]]: one parameter per column, broadcast over [B, K]."""
    return tf.constant([values[i] for i in columns], dtype)


def _fingerprint64(tokens: tf.Tensor) -> tf.Tensor:
    """FarmHash Fingerprint64 of every string, uint64 of tokens' shape: what to_hash_bucket_fast takes
    modulo its bucket count. tf.fingerprint gives 8 little-endian bytes per string; they are assembled
    arithmetically, so the graph means the same on a host of either byte order."""
    parts = tf.cast(tf.fingerprint(tf.reshape(tokens, [-1])), tf.uint64)
    return tf.reshape(tf.reduce_sum(tf.bitwise.left_shift(parts, _BYTE_SHIFTS), axis=1), tf.shape(tokens))


class PackedVocabularies(tf.lookup.KeyValueTensorInitializer):
    """The initializer of the one vocabulary table: keys "<prefix><value>", values the IDs. Stored in
    the SavedModel as zlib-compressed serialized tensors of the values (without their owner's prefix)
    and of the ID deltas (mostly 1), unpacked by the initializer's own graph at load: a quarter to a
    sixth of the bytes of a key and an ID constant per value (Criteo sample 135 -> 36 KB)."""

    def __init__(self, prefixes: list[str], kept: list[list[tuple[int, str]]]):
        # the base's (key, value dtype) only: the keys and IDs are built by initialize()
        super(tf.lookup.KeyValueTensorInitializer, self).__init__(tf.string, tf.int64)
        self._name = "packed_vocabularies"
        ids = np.array([j for owner in kept for j, _ in owner], np.int64)
        self._packed_values = tf.constant(zlib.compress(
            tf.make_tensor_proto([v for owner in kept for _, v in owner], tf.string).SerializeToString(), 9))
        self._packed_deltas = tf.constant(zlib.compress(
            tf.make_tensor_proto(np.diff(ids, prepend=0)).SerializeToString(), 9))
        self._prefixes = tf.constant(prefixes, tf.string)
        self._counts = tf.constant([len(owner) for owner in kept], tf.int64)

    def initialize(self, table):
        values = tf.io.parse_tensor(tf.io.decode_compressed(self._packed_values, "ZLIB"), tf.string)
        keys = tf.strings.join([tf.repeat(self._prefixes, self._counts), values])
        ids = tf.cumsum(tf.io.parse_tensor(tf.io.decode_compressed(self._packed_deltas, "ZLIB"), tf.int64))
        return tf.raw_ops.LookupTableImportV2(table_handle=table.resource_handle, keys=keys, values=ids)


class FeatureTransform(tf.Module):
    """The graph is vectorised across features, because a serving call's time is mostly TF's per-op
    cost, not arithmetic: every single-valued sparse feature of a call is looked up, hashed and
    mapped in one [B, K] pass (one table over every vocabulary, keyed by owner and value; OOV buckets
    from _fingerprint64 modulo a per-column bucket count), each
    multivalent feature in one pass of its flat values, and every dense feature in one [B, D] pass."""

    def __init__(self, artifact: TransformArtifact, name: str = "feature_transform"):
        super().__init__(name=name)
        cfg = self._cfg = artifact.config
        stats = artifact.dense_stats
        owners = [f for f in cfg.features.sparse if f.share_embedding_with is None]
        self._owner_index = {f.name: i for i, f in enumerate(owners)}
        self._prefix = [f"{i}{_KEY_SEPARATOR}" for i in range(len(owners))]
        # OOV ID of a token: slots + FarmHash64 % buckets (vocabularies; their free slots count), else the hash bucket
        self._slots = [0 if f.vocab is None else len(artifact.vocabularies[f.name]) for f in owners]
        self._buckets = [f.hash_buckets if f.vocab is None else f.vocab.oov_buckets for f in owners]
        kept = [[(j, v) for j, v in enumerate(artifact.vocabularies[f.name]) if v is not None]  # None: a free slot
                if f.vocab is not None else [] for f in owners]
        self._table = None if not any(kept) else tf.lookup.StaticHashTable(  # empty: every token is OOV
            PackedVocabularies(self._prefix, kept), default_value=-1)
        dense = cfg.features.dense
        self._dense_fill = [float(d.fill) for d in dense]
        self._dense_log = [d.transform == "log_zscore" for d in dense]
        self._dense_mean = [0.0 if d.transform == "bucketize" else float(stats[d.name]["mean"]) for d in dense]
        self._dense_std = [1.0 if d.transform == "bucketize" else zscore_std(stats[d.name]) for d in dense]
        self._boundaries = {d.name: [float(b) for b in stats[d.name]["boundaries"]]
                            for d in dense if d.transform == "bucketize"}

    def _ids(self, owners: list[int], tokens: tf.Tensor) -> tf.Tensor:
        """IDs of tokens [N, K], column k read by owner table owners[k]: the vocabulary ID, else
        slots + FarmHash64(token) % buckets (what TF's StaticVocabularyTable does, with the slot
        count, free slots included, as the vocabulary size); a hashed feature has 0 slots."""
        bucket = tf.math.floormod(_fingerprint64(tokens), _per_column(self._buckets, owners, tf.uint64))
        oov = _per_column(self._slots, owners, tf.int64) + tf.cast(bucket, tf.int64)
        if self._table is None:
            return oov
        prefixes = tf.broadcast_to(_per_column(self._prefix, owners, tf.string), tf.shape(tokens))
        keys = tf.strings.join([prefixes, tokens])
        found = self._table.lookup(keys)
        return tf.where(found >= 0, found, oov)

    def _dense(self, columns: list[int], x: tf.Tensor) -> list[tf.Tensor]:
        """Dense features [B, D] (column k is dense feature columns[k]) -> D tensors [B]."""
        dense = self._cfg.features.dense
        x = tf.where(tf.math.is_nan(x), _per_column(self._dense_fill, columns, tf.float32), x)
        filled = x
        if any(self._dense_log[i] for i in columns):
            x = tf.where(_per_column(self._dense_log, columns, tf.bool), tf.math.log1p(tf.maximum(x, 0.0)), x)
        mean = _per_column(self._dense_mean, columns, tf.float32)
        out = tf.unstack((x - mean) / _per_column(self._dense_std, columns, tf.float32), num=len(columns), axis=1)
        for k, i in enumerate(columns):
            if dense[i].transform == "bucketize":
                boundaries = self._boundaries[dense[i].name]
                idx = tf.raw_ops.Bucketize(input=filled[:, k], boundaries=boundaries)
                out[k] = tf.cast(idx, tf.float32) / float(max(len(boundaries), 1))
        return out

    def __call__(self, canonical: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Transforms the features present in `canonical` (all of them, or e.g. a query tower's)."""
        out: dict[str, tf.Tensor] = {}
        single: list[tuple[str, int]] = []
        for f in self._cfg.features.sparse:
            if f.name not in canonical:
                continue
            owner = self._owner_index[self._cfg.table_owner(f).name]
            x = canonical[f.name]
            if isinstance(x, tf.RaggedTensor):
                out[f.name] = x.with_flat_values(self._ids([owner], x.flat_values[:, None])[:, 0])
            else:
                single.append((f.name, owner))
        if single:
            ids = self._ids([o for _, o in single], tf.stack([canonical[n] for n, _ in single], axis=1))
            out.update(zip([n for n, _ in single], tf.unstack(ids, num=len(single), axis=1)))
        columns = [i for i, d in enumerate(self._cfg.features.dense) if d.name in canonical]
        if columns:
            x = tf.stack([canonical[self._cfg.features.dense[i].name] for i in columns], axis=1)
            out.update(zip([self._cfg.features.dense[i].name for i in columns], self._dense(columns, x)))
        order = [f.name for f in (*self._cfg.features.sparse, *self._cfg.features.dense)]
        return {name: out[name] for name in order if name in out}


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
_REQUEST_DTYPES = {"string": tf.string, "int": tf.int64, "uint64": tf.uint64, "float": tf.float32,
                   "list<string>": tf.string, "list<int>": tf.string, "list<uint64>": tf.string}
INTEGER_ID_DTYPES = (tf.int64, tf.uint64)  # integer ID inputs, as logged; the transform reads their decimal strings


def request_spec(artifact: TransformArtifact, features: list[str] | None = None) -> dict[str, tf.TensorSpec]:
    """One [None] input per raw log column a feature reads, named after the column: strings and
    int64 (uint64 for a column logged so) for sparse columns as logged, float32 for dense ones (NaN = missing).

    Multivalent columns arrive as one string per row joined by the feature's separator (list columns
    too: a list row's items joined by it), because TF Serving's JSON/gRPC batches must be rectangular.
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
    """Raw request tensors -> the canonical tensors recpipe.features.canonical builds from Arrow, for every
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
            out[f.name] = _split(x, list_separator(f))
        else:
            out[f.name] = x
    for f in cfg.crosses:  # the strings recpipe.features.canonical joins for the Beam job
        if all(s in out for s in f.cross):
            out[f.name] = tf.strings.join([out[s] for s in f.cross], separator=CROSS_SEPARATOR)
    dense = [d for d in cfg.features.dense if d.column in inputs]
    for d in dense:
        x = tf.cast(inputs[d.column], tf.float32)
        out[d.name] = tf.clip_by_value(x, -FLOAT32_MAX, FLOAT32_MAX) if d.out_of_range == "clip" else x
    checked = [d for d in dense if d.out_of_range != "clip"]
    if checked:
        out.update(zip([d.name for d in checked], _finite([out[d.name] for d in checked],
                                                          [d.column for d in checked])))
    return out


def _split(joined: tf.Tensor, separator: str) -> tf.RaggedTensor:
    """Joined rows [B] -> their non-empty tokens [B, None], split literally as recpipe.features.canonical
    splits a string column (no pattern, no trimming)."""
    tokens = tf.strings.split(joined, sep=separator)
    return tf.ragged.boolean_mask(tokens, tf.not_equal(tokens, ""))


def _finite(columns: list[tf.Tensor], names: list[str]) -> list[tf.Tensor]:
    """Dense request columns as the trainer's data has them: a value that is inf (or was beyond float32
    before the cast) is an InvalidArgumentError naming its columns, as the Beam job dead-letters such
    rows; NaN stays NaN, a missing value. In the graph, so TF Serving itself refuses them too. One check
    for all columns: one per column makes a call of the default model 10 % slower."""
    bad = tf.reduce_any(tf.math.is_inf(tf.stack(columns, axis=1)), axis=0)
    check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [
        "dense input(s) with a value that is inf or beyond float32 (the trainer's data dead-letters such rows):",
        tf.boolean_mask(tf.constant(names), bad)])
    with tf.control_dependencies([check]):
        return [tf.identity(c) for c in columns]


def request_from_arrow(table: pa.Table, specs: dict[str, tf.TensorSpec],
                       separators: Mapping[str, str] | None = None) -> dict[str, tf.Tensor]:
    """Raw log rows as the serving signature takes them.

    Lists are joined by their column's separator, dense values parsed as the Beam job parses them
    (recpipe.features.canonical.numeric: a number in a string column too; null or blank is NaN), null IDs
    become "" (an int64 input cannot carry one: int64_nulls() finds such rows; string_ids() makes specs
    that can).

    Args:
        table: raw log rows.
        specs: the signature's inputs (request_spec).
        separators: {column: separator} (recpipe.features.canonical.list_separators(cfg)); a list column
            not in it is joined by DEFAULT_SEPARATOR, what a feature without `separator` splits on.

    Returns:
        {input: tensor [rows]}.

    Raises:
        ValueError: a null in an integer input's column, or a list row that does not split back
            (canonical.splits_back: the Beam job dead-letters it), naming the column and row.
    """
    request = {}
    for name, spec in specs.items():
        values = table.column(name).to_pylist()
        if spec.dtype == tf.string:
            sep = (separators or {}).get(name, DEFAULT_SEPARATOR)
            values = [["" if x is None else _token(x) for x in v] if isinstance(v, list) else v
                      for v in values]  # a null item: an empty token, dropped
            bad = next((i for i, v in enumerate(values) if isinstance(v, list) and not splits_back(v, sep)), None)
            if bad is not None:
                raise ValueError(f"column {name!r} row {bad}: {unsplittable_reason(sep)} (the Beam job "
                                 f"dead-letters such a row: list_item_has_separator)")
            values = ["" if v is None else sep.join(v) if isinstance(v, list) else _token(v) for v in values]
        elif spec.dtype == tf.float32:  # parsed as the Beam job parses it: a blank string is missing too
            values = numeric(table.column(name))[0]
        elif None in values:
            raise ValueError(f"column {name!r} row {values.index(None)}: null, which the {spec.dtype.name} input "
                             f"{name!r} cannot carry (a tf.Example can leave it out)")
        request[name] = tf.constant(values, spec.dtype)
    return request


def _token(v) -> str:
    """A raw ID as the Beam job writes it: a bool as the integer it is ("1", as recpipe.features.canonical reads it)."""
    return str(int(v)) if isinstance(v, bool) else str(v)


def int64_nulls(table: pa.Table, specs: dict[str, tf.TensorSpec]) -> np.ndarray:
    """Rows with a null in a column the signature takes as int64 (an integer ID column): a log may hold
    them (the Beam job reads a null ID as ""), a request to an int64 input cannot."""
    bad = np.zeros(table.num_rows, dtype=bool)
    for name, spec in specs.items():
        if spec.dtype in INTEGER_ID_DTYPES:
            bad |= np.asarray(table.column(name).is_null().to_numpy(zero_copy_only=False), dtype=bool)
    return bad


def string_ids(specs: dict[str, tf.TensorSpec]) -> dict[str, tf.TensorSpec]:
    """`specs` with integer ID inputs taken as the strings canonicalize_request makes of them ("" for
    a missing one)."""
    return {name: tf.TensorSpec(s.shape, tf.string, name=name) if s.dtype in INTEGER_ID_DTYPES else s
            for name, s in specs.items()}


# ------------------------------------------------------------------ tf.Example requests
_INT64_LIST_KINDS = ("int", "list<int>", "uint64", "list<uint64>")
# A tf.Example has no uint64 list: a uint64 column's values travel in its int64_list as their bit
# pattern (value - 2**64 from 2**63 on, as numpy's view and every protobuf int64 field read them).
_UNSIGNED_KINDS = ("uint64", "list<uint64>")


def example_spec(cfg: Config, raw_schema: dict[str, str]) -> dict[str, tf.io.RaggedFeature]:
    """How a serialized tf.Example carries the raw columns request_spec names (TF Serving's
    classify/regress clients send these): an ID column as bytes_list (string columns) or int64_list
    (integer columns; a uint64 column's values as their int64 bit pattern), a list column as a
    bytes_list/int64_list of its items (or one joined string
    when the log stores it joined), a dense column as float_list. Every feature may be absent: a
    missing value, as a null in the log. cfg, raw_schema: a transform artifact's, or an export's meta."""
    spec: dict[str, tf.io.RaggedFeature] = {}
    for f in cfg.column_sparse:
        kind = raw_schema[f.column]
        spec[f.column] = tf.io.RaggedFeature(tf.int64 if kind in _INT64_LIST_KINDS else tf.string)
    for d in cfg.features.dense:
        spec.setdefault(d.column, tf.io.RaggedFeature(tf.float32))
    return spec


def _one_value_each(columns: list[str], values: list[tf.RaggedTensor], default) -> list[tf.Tensor]:
    """[B] per column from parsed [B, None] columns of one dtype: the value, or `default` where absent.
    One pass over all K columns (their flat values and row splits concatenated, one check, one
    gather), so the op count does not grow with K. More than one value in a row is an error naming
    every column that has one."""
    k = len(columns)
    flat = tf.concat([v.flat_values for v in values], axis=0)
    if flat.dtype != tf.string and isinstance(default, str):
        flat = tf.strings.as_string(flat)
    flat = tf.concat([flat, tf.constant([default], flat.dtype)], axis=0)  # the last item: the default
    splits = tf.cast(tf.reshape(tf.concat([v.row_splits for v in values], axis=0), [k, -1]), tf.int64)  # [K, B+1]
    lengths = splits[:, 1:] - splits[:, :-1]
    several = tf.reduce_any(lengths > 1, axis=1)
    named = tf.strings.reduce_join(tf.boolean_mask(tf.constant([repr(c) for c in columns]), several), separator=", ")
    message = tf.strings.join(["each of these features takes at most one value per example: ", named])
    check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(several)), [message])
    starts = splits[:, :-1] + tf.expand_dims(tf.cumsum(splits[:, -1], exclusive=True), 1)  # into flat
    with tf.control_dependencies([check]):
        at = tf.where(lengths > 0, starts, tf.shape(flat, out_type=tf.int64)[0] - 1)
    return tf.unstack(tf.gather(flat, at), num=k, axis=0)


def request_from_examples(parsed: dict[str, tf.RaggedTensor], artifact: TransformArtifact) -> dict[str, tf.Tensor]:
    """Parsed Examples (example_spec) -> the raw request tensors canonicalize_request takes: ID
    columns as strings ("" when absent, as a null in the log), list columns joined by the feature's
    separator, dense values as float32 (NaN when absent). The single-valued columns of each dtype
    are densified together (_one_value_each). A list that does not split back (canonical.splits_back:
    the Beam job dead-letters it) fails the call, naming the column and the first such example."""
    cfg = artifact.config
    out: dict[str, tf.Tensor] = {}
    single: dict[tf.DType, list[str]] = {}  # parsed dtype -> its single-valued columns
    parsed = {c: v.with_flat_values(tf.bitcast(v.flat_values, tf.uint64))
              if artifact.raw_schema.get(c) in _UNSIGNED_KINDS else v for c, v in parsed.items()}
    for f in cfg.column_sparse:
        values = parsed[f.column]
        if f.multivalent and artifact.raw_schema[f.column].startswith("list"):
            if values.dtype != tf.string:
                values = tf.strings.as_string(values)
            out[f.column] = _joined_back(values, list_separator(f), f.column)
        elif f.column not in out:
            out[f.column] = None  # filled below, in the column order of the config
            single.setdefault(values.dtype, []).append(f.column)
    for d in cfg.features.dense:
        if d.column not in out:
            out[d.column] = None
            single.setdefault(tf.float32, []).append(d.column)
    for dtype, columns in single.items():  # ID columns become strings, "" when absent; dense ones NaN
        default = float("nan") if dtype == tf.float32 else ""
        out.update(zip(columns, _one_value_each(columns, [parsed[c] for c in columns], default)))
    return out


def _joined_back(values: tf.RaggedTensor, separator: str, column: str) -> tf.Tensor:
    """List rows [B, None] -> their non-empty items joined by `separator` [B], checked to split back into
    those items (canonical.splits_back, the rule the Beam job dead-letters by): else an InvalidArgumentError
    naming the column and the first example that does not."""
    if len(separator) == 1:  # one character: exactly the rows with an item holding it, in fewer ops
        joined = tf.strings.reduce_join(values, axis=1, separator=separator)
        holds = tf.strings.split(values.flat_values, sep=separator).row_lengths() > 1
        bad = tf.reduce_any(values.with_flat_values(holds), axis=1)
    else:
        items = tf.ragged.boolean_mask(values, tf.not_equal(values, ""))
        joined = tf.strings.reduce_join(items, axis=1, separator=separator)
        again = _split(joined, separator)
        width = tf.maximum(tf.cast(items.bounding_shape(axis=1), tf.int64), again.bounding_shape(axis=1))
        shape = tf.stack([tf.cast(items.nrows(), tf.int64), width])
        bad = tf.reduce_any(tf.not_equal(items.to_tensor("", shape=shape), again.to_tensor("", shape=shape)), axis=1)
    first = tf.argmax(tf.concat([tf.cast(bad, tf.int32), [1]], axis=0), output_type=tf.int64)  # [1]: no rows
    message = tf.strings.join([f"input {column!r} row ", tf.strings.as_string(first),
                               f": {unsplittable_reason(separator)}"])
    with tf.control_dependencies([tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [message])]):
        return tf.identity(joined)


def examples_from_arrow(table: pa.Table, cfg: Config, raw_schema: dict[str, str]) -> list[bytes]:
    """Raw log rows as serialized tf.Examples in the example_spec layout (nulls left out, null list items
    too: the Beam job drops them; dense values parsed as the Beam job parses them, missing ones left out)."""
    spec = example_spec(cfg, raw_schema)
    columns = {name: [None if np.isnan(x) else x for x in numeric(table.column(name))[0].tolist()]
               if fs.dtype == tf.float32 else table.column(name).to_pylist() for name, fs in spec.items()}
    out = []
    for i in range(table.num_rows):
        feature = {}
        for name, fs in spec.items():
            v = columns[name][i]
            if v is None:
                continue
            items = [x for x in v if x is not None] if isinstance(v, list) else [v]  # null items: no tokens
            if fs.dtype == tf.int64:  # uint64 values as their bit pattern (_UNSIGNED_KINDS)
                feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(
                    value=[int(x) - (1 << 64) if int(x) >= 1 << 63 else int(x) for x in items]))
            elif fs.dtype == tf.float32:
                feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(x) for x in items]))
            else:
                feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[x if isinstance(x, bytes) else str(x).encode("utf-8") for x in items]))
        out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return out
