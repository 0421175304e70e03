"""Training-shard records: one TFRecord record = one column-wise batch of transformed rows.

Each record is a tf.train.Example whose features are serialized TensorProtos, one per column
(``NAME`` for [n] columns, ``NAME/values`` + ``NAME/row_lengths`` for ragged ones). Writing
is vectorised (no per-row Example); reading is `tf.io.parse_tensor` + `unbatch`, all in
tf.data's C++ runtime. The Beam job writes them; trainers.data reads them.
"""
from __future__ import annotations


import numpy as np
import tensorflow as tf

from features.canonical import LABEL_KEY
from features.config import Config

__all__ = ["encode_batch", "column_specs", "parse_record", "read_single_batch", "count_rows"]


def _proto_bytes(arr: np.ndarray) -> bytes:
    return tf.make_tensor_proto(arr).SerializeToString()


def encode_batch(columns: dict[str, tf.Tensor | tf.RaggedTensor | np.ndarray]) -> bytes:
    feature = {}
    for name, t in columns.items():
        if isinstance(t, tf.RaggedTensor):
            parts = {f"{name}/values": t.flat_values.numpy(), f"{name}/row_lengths": t.row_lengths().numpy()}
        else:
            parts = {name: t.numpy() if isinstance(t, tf.Tensor) else np.asarray(t)}
        for key, arr in parts.items():
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[_proto_bytes(arr)]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def column_specs(cfg: Config) -> dict[str, tuple[tf.DType, bool]]:
    """Column name -> (dtype, ragged) of a transformed record."""
    specs = {f.name: (tf.int64, f.multivalent) for f in cfg.features.sparse}
    specs.update({d.name: (tf.float32, False) for d in cfg.features.dense})
    specs[LABEL_KEY] = (tf.float32, False)
    return specs


def parse_record(cfg: Config):
    """A tf.data map function: serialized record -> dict of [n] tensors / [n, None] ragged."""
    specs = column_specs(cfg)
    keys = {}
    for name, (_, ragged) in specs.items():
        for key in ([f"{name}/values", f"{name}/row_lengths"] if ragged else [name]):
            keys[key] = tf.io.FixedLenFeature([], tf.string)

    def parse(serialized: tf.Tensor) -> dict:
        raw = tf.io.parse_single_example(serialized, keys)
        out = {}
        for name, (dtype, ragged) in specs.items():
            if ragged:
                values = tf.io.parse_tensor(raw[f"{name}/values"], dtype)
                lengths = tf.io.parse_tensor(raw[f"{name}/row_lengths"], tf.int64)
                values.set_shape([None])
                lengths.set_shape([None])
                out[name] = tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)
            else:
                t = tf.io.parse_tensor(raw[name], dtype)
                t.set_shape([None])
                out[name] = t
        return out

    return parse


def read_single_batch(cfg: Config, path: str) -> dict:
    """The one record of a single-batch file (e.g. the Beam job's eval_sample.tfrecord), parsed."""
    records = list(tf.data.TFRecordDataset(path))
    if len(records) != 1:
        raise FileNotFoundError(f"{path}: expected one record batch, found {len(records)}")
    return parse_record(cfg)(records[0])


def count_rows(paths: list[str]) -> int:
    """The rows in shard files, from each record's label column only (what is on disk, not what a
    runner reported)."""
    if not paths:
        return 0
    keys = {LABEL_KEY: tf.io.FixedLenFeature([], tf.string)}

    def rows(serialized: tf.Tensor) -> tf.Tensor:
        label = tf.io.parse_tensor(tf.io.parse_single_example(serialized, keys)[LABEL_KEY], tf.float32)
        return tf.cast(tf.size(label), tf.int64)

    ds = tf.data.TFRecordDataset(paths).map(rows, num_parallel_calls=tf.data.AUTOTUNE)
    return int(ds.reduce(tf.constant(0, tf.int64), lambda total, n: total + n))
