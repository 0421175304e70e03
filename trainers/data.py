"""tf.data input: stream the preprocessed shards (features.records) into model batches."""
from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import tensorflow as tf  # noqa: E402

from features.config import Config  # noqa: E402
from features.records import column_specs, parse_record  # noqa: E402

__all__ = ["DataError", "shard_files", "make_dataset"]


class DataError(ValueError):
    pass


def shard_files(data_dir: str, split: str) -> list[str]:
    pattern = os.path.join(data_dir, split, "*.tfrecord")
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise DataError(f"{os.path.join(data_dir, split)}: no *.tfrecord shards (run `recpipe preprocess` first)")
    return files


def make_dataset(cfg: Config, data_dir: str, split: str, batch_size: int, *, training: bool,
                 input_context: tf.distribute.InputContext | None = None, seed: int = 0,
                 shuffle_buffer: int = 16_384) -> tf.data.Dataset:
    """Batches of {feature: [B] or ragged [B, None], LABEL_KEY: [B]}.

    Training: shards are shuffled and interleaved, rows shuffled, repeated forever, and
    incomplete batches dropped. Evaluation: one ordered pass, the last batch kept.
    With an InputContext, each input pipeline reads its own files (or rows, when there are
    fewer files than pipelines) and batch_size is the per-replica size.
    """
    files = shard_files(data_dir, split)
    ds = tf.data.Dataset.from_tensor_slices(files)
    shard_rows = False
    if input_context is not None and input_context.num_input_pipelines > 1:
        if len(files) >= input_context.num_input_pipelines:
            ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        else:
            shard_rows = True
    if training:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 4),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=not training)
    ds = ds.map(parse_record(cfg), num_parallel_calls=tf.data.AUTOTUNE, deterministic=not training)
    ds = ds.unbatch()
    if shard_rows:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    has_ragged = any(ragged for _, ragged in column_specs(cfg).values())
    if has_ragged:
        ds = ds.ragged_batch(batch_size, drop_remainder=training)
    else:
        ds = ds.batch(batch_size, drop_remainder=training)
    return ds.prefetch(tf.data.AUTOTUNE)
