"""The single-process preprocessing baseline: the SAME per-batch functions as the Beam job
(validate_batch, canonicalize, value counts, BatchTransform, encode_batch) in a plain loop over
pyarrow record batches, in one process, with no Beam runner; so `preprocess_beam_vs_pyarrow` is
what Beam's orchestration costs. It writes the same artifact and shards (no dead letter, no eval sample).
"""
from __future__ import annotations

import collections
import os

import numpy as np
import pyarrow as pa

from recpipe.features.artifact import TransformArtifact
from recpipe.features.canonical import LABEL_KEY, canonicalize, dense_prenorm, times, validate_batch
from recpipe.features.preprocessed import SPLITS, PreprocessedData
from recpipe.features.batch_transform import BatchTransform
from recpipe.features.record_codec import encode_batch, frame_record
from recpipe.pipeline.analysis import (add_moments, batch_moments, boundaries_from_quantiles, merge_count_tables,
                               moment_stats, select_vocabulary_table, split_cutoffs_by_row,
                               split_cutoffs_from_histogram, token_count_tables, ts_histogram)
from recpipe.pipeline.sources import inspect_inputs, list_input_files, open_parquet
from recpipe.pipeline.transforms import RawBatch

__all__ = ["baseline_preprocess"]


def baseline_preprocess(cfg, input_spec: str, out_dir: str, batch_rows: int = 65_536) -> dict:
    """Analyse + transform + write like `recpipe preprocess`, in one process without Beam; returns
    the row counts (also recorded in the artifact, which makes the folder complete)."""
    if cfg.split.by != "time":
        raise ValueError("benchmark baseline: only a time split (split.by: time) is implemented")
    raw_schema, files = inspect_inputs(list_input_files(input_spec), cfg)
    total = sum(f.num_rows for f in files)

    def batches(columns):
        for f in files:
            start = 0
            for b in open_parquet(f.path).iter_batches(batch_size=batch_rows, columns=columns):
                yield RawBatch(f.path, start, np.arange(f.first_row + start, f.first_row + start + b.num_rows),
                               pa.Table.from_batches([b]))
                start += b.num_rows

    def good(b):
        mask, bad = validate_batch(b.table, cfg)
        return b if mask.all() else RawBatch(b.source, b.first_row, b.positions[mask], b.table.filter(pa.array(mask))), bad

    def split_key(b):
        return times(b.table.column(cfg.input.timestamp))[0] if cfg.input.timestamp else b.positions.astype(float)

    if cfg.input.timestamp:
        hist: dict = collections.Counter()
        cols = [c for c in cfg.raw_columns() if c in {cfg.label.column, cfg.input.timestamp,
                                                       *(d.column for d in cfg.features.dense)}]
        for b in batches(cols):
            hist.update(ts_histogram(good(b)[0].table, cfg.input.timestamp))
        cutoff, eval_cutoff = split_cutoffs_from_histogram(hist, cfg.split.eval_fraction,
                                                           cfg.split.validation_fraction)
    else:
        cutoff, eval_cutoff = split_cutoffs_by_row(total, cfg.split.eval_fraction, cfg.split.validation_fraction)

    counts: dict = collections.defaultdict(list)
    moments: dict = {}
    bucket_values: dict = collections.defaultdict(list)
    buckets = {d.name: d for d in cfg.features.dense if d.transform == "bucketize"}
    for b in batches(cfg.raw_columns()):
        g, _ = good(b)
        train = g.table.filter(pa.array(split_key(g) <= cutoff))
        cols = canonicalize(train, cfg)
        for owner, table in token_count_tables(cols, cfg):
            counts[owner].append(table)
        for k, v in batch_moments(cols, cfg).items():
            moments[k] = add_moments(moments[k], v) if k in moments else v
        for name, d in buckets.items():
            bucket_values[name].append(dense_prenorm(cols[name].to_numpy(zero_copy_only=False), d.transform, d.fill))
    vocabs = {f.name: [a.to_pylist() for a in select_vocabulary_table(merge_count_tables(counts[f.name]),
                                                                        f.vocab.min_count, f.vocab.max_size)]
              for f in cfg.features.sparse if f.vocab is not None}
    stats = moment_stats(moments)
    for name, d in buckets.items():
        qs = np.quantile(np.concatenate(bucket_values[name]), np.linspace(0, 1, d.num_buckets + 1)).tolist()
        stats[name] = {"boundaries": boundaries_from_quantiles(qs, d.num_buckets)}
    artifact = TransformArtifact(config=cfg, raw_schema=raw_schema, vocabularies={o: v for o, (v, _) in vocabs.items()},
                                 vocab_counts={o: c for o, (_, c) in vocabs.items()}, dense_stats=stats)
    data = PreprocessedData(out_dir)
    artifact.write(data.transform_dir)

    transform = BatchTransform(artifact)
    n = {"in": 0, "train": 0, "validation": 0, "eval": 0, "dead": 0}
    for s in SPLITS:
        os.makedirs(data.split_dir(s), exist_ok=True)
    writers = {s: open(f"{data.shard_prefix(s)}-0.tfrecord", "wb") for s in SPLITS}
    for b in batches(cfg.raw_columns()):
        n["in"] += b.table.num_rows
        g, bad = good(b)
        n["dead"] += len(bad.indices)
        key = split_key(g)
        is_eval = key > eval_cutoff
        is_validation = (key > cutoff) & ~is_eval
        for s, mask in (("train", ~(is_eval | is_validation)), ("validation", is_validation), ("eval", is_eval)):
            if mask.any():
                cols = canonicalize(g.table.filter(pa.array(mask)), cfg)
                out = transform({k: v for k, v in cols.items() if k != LABEL_KEY})
                out[LABEL_KEY] = cols[LABEL_KEY].to_numpy(zero_copy_only=False)
                writers[s].write(frame_record(encode_batch(out)))
                n[s] += int(mask.sum())
    for w in writers.values():
        w.close()
    artifact.row_counts = {"in": n["in"], "train": n["train"], "validation": n["validation"], "eval": n["eval"],
                           "dead_letter": n["dead"]}
    artifact.write_meta(data.transform_dir)
    return n
