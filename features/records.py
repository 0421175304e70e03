"""Training-shard records read by TensorFlow: one TFRecord record = one column-wise batch of
transformed rows, in the layout recpipe.features.record_codec writes (a tf.train.Example of one serialized
TensorProto per column: ``NAME``, or ``NAME/values`` + ``NAME/row_lengths`` when ragged). Reading is
`tf.io.parse_tensor` + `unbatch`, all in tf.data's C++ runtime; recpipe.trainers.data and the export use it.
"""
from __future__ import annotations

import tensorflow as tf

from recpipe.features.canonical import LABEL_KEY
from recpipe.features.config import Config

__all__ = ["column_specs", "parse_record", "read_single_batch"]


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
