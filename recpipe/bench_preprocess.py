"""Issue-3 benchmarks: the Beam job against a single-process baseline, memory vs rows, shard formats.

The baseline runs the SAME per-batch functions as the Beam job (validate_batch, canonicalize,
value counts, FeatureTransform, encode_batch) in a plain loop over pyarrow record batches, in
one process, with no Beam; so `preprocess_beam_vs_pyarrow` is what Beam's orchestration costs.
"""
from __future__ import annotations

import collections
import glob
import os
import sys
import time
from typing import Callable

import numpy as np

__all__ = ["baseline_preprocess", "bench_preprocess", "bench_shard_formats", "report_markdown"]


def baseline_preprocess(cfg, input_spec: str, out_dir: str, batch_rows: int = 65_536) -> dict:
    """Analyse + transform + write like `recpipe preprocess`, in one process without Beam."""
    import pyarrow as pa
    import tensorflow as tf

    from features.artifact import TransformArtifact
    from features.canonical import LABEL_KEY, canonicalize, dense_prenorm, validate_batch
    from features.records import encode_batch
    from features.transform import FeatureTransform, canonical_to_tensors
    from features.canonical import numeric
    from pipeline.analysis import (add_moments, batch_moments, boundaries_from_quantiles,
                                   eval_cutoff_from_histogram, moment_stats, select_vocabulary, token_counts,
                                   ts_histogram)
    from pipeline.sources import inspect_inputs, list_input_files, open_parquet
    from pipeline.transforms import RawBatch

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
        return numeric(b.table.column(cfg.input.timestamp))[0] if cfg.input.timestamp else b.positions.astype(float)

    if cfg.input.timestamp:
        hist: dict = collections.Counter()
        cols = [c for c in cfg.raw_columns() if c in {cfg.label.column, cfg.input.timestamp,
                                                       *(d.column for d in cfg.features.dense)}]
        for b in batches(cols):
            hist.update(ts_histogram(good(b)[0].table, cfg.input.timestamp))
        cutoff = eval_cutoff_from_histogram(hist, cfg.split.eval_fraction)
    else:
        cutoff = float(total - int(np.floor(cfg.split.eval_fraction * total)) - 1)

    counts: dict = collections.Counter()
    moments: dict = {}
    bucket_values: dict = collections.defaultdict(list)
    buckets = {d.name: d for d in cfg.features.dense if d.transform == "bucketize"}
    for b in batches(cfg.raw_columns()):
        g, _ = good(b)
        train = g.table.filter(pa.array(split_key(g) <= cutoff))
        cols = canonicalize(train, cfg)
        counts.update(dict(token_counts(cols, cfg)))
        for k, v in batch_moments(cols, cfg).items():
            moments[k] = add_moments(moments[k], v) if k in moments else v
        for name, d in buckets.items():
            bucket_values[name].append(dense_prenorm(cols[name].to_numpy(zero_copy_only=False), d.transform, d.fill))
    per_owner = collections.defaultdict(list)
    for (owner, value), c in counts.items():
        per_owner[owner].append((value, c))
    vocabs = {f.name: select_vocabulary(per_owner[f.name], f.vocab.min_count, f.vocab.max_size)
              for f in cfg.features.sparse if f.vocab is not None}
    stats = moment_stats(moments)
    for name, d in buckets.items():
        qs = np.quantile(np.concatenate(bucket_values[name]), np.linspace(0, 1, d.num_buckets + 1)).tolist()
        stats[name] = {"boundaries": boundaries_from_quantiles(qs, d.num_buckets)}
    artifact = TransformArtifact(cfg, raw_schema, {o: v for o, (v, _) in vocabs.items()},
                                 {o: c for o, (_, c) in vocabs.items()}, stats)
    artifact.write(os.path.join(out_dir, "transform"))

    transform = FeatureTransform(artifact)
    n = {"in": 0, "train": 0, "eval": 0, "dead": 0}
    os.makedirs(os.path.join(out_dir, "train"), exist_ok=True)
    os.makedirs(os.path.join(out_dir, "eval"), exist_ok=True)
    writers = {s: tf.io.TFRecordWriter(os.path.join(out_dir, s, "part-0.tfrecord")) for s in ("train", "eval")}
    for b in batches(cfg.raw_columns()):
        n["in"] += b.table.num_rows
        g, bad = good(b)
        n["dead"] += len(bad.indices)
        is_eval = split_key(g) > cutoff
        for s, mask in (("train", ~is_eval), ("eval", is_eval)):
            if mask.any():
                cols = canonicalize(g.table.filter(pa.array(mask)), cfg)
                out = transform(canonical_to_tensors({k: v for k, v in cols.items() if k != LABEL_KEY}))
                out[LABEL_KEY] = cols[LABEL_KEY].to_numpy(zero_copy_only=False)
                writers[s].write(encode_batch(out))
                n[s] += int(mask.sum())
    for w in writers.values():
        w.close()
    return n


def _timed_child(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, this child's peak RSS in MB)."""
    from recpipe.bench import run_measured
    wall, rss, _ = run_measured(cmd)
    return wall, rss


def bench_preprocess(rows: int, work: str, cfg_path: str, say: Callable[[str], None], scale: int = 10,
                     reps: int = 3, quick: bool = False) -> dict:
    """Beam vs baseline rows/s at rows and scale x rows; peak RSS of each; `reps` runs of each
    (quick: no baseline at 1x, which only the throughput-vs-rows plot uses)."""
    import shutil

    from recpipe.bench_train import summary
    cli = [sys.executable, "-m", "recpipe.cli"]
    logs = {1: os.path.join(work, "log_1x"), scale: os.path.join(work, f"log_{scale}x")}
    say(f"bench preprocess: generating {rows:,} and {rows * scale:,} rows")
    for mult, path in logs.items():
        if not os.path.isdir(path):
            from pipeline.synthetic import GenerateSpec, generate_log
            generate_log(GenerateSpec(rows=rows * mult, days=3), path)
    walls: dict = collections.defaultdict(list)
    rss: dict = collections.defaultdict(list)
    for rep in range(reps):
        for mult, log in logs.items():
            for job in ("beam", "baseline") if mult != 1 or not quick else ("beam",):
                out = os.path.join(work, f"{job}_{mult}x" if rep == 0 else f"{job}_{mult}x_rep{rep}")
                shutil.rmtree(out, ignore_errors=True)
                say(f"bench preprocess: {job}, {rows * mult:,} rows (rep {rep + 1}/{reps})")
                cmd = ([*cli, "preprocess", "--config", cfg_path, "--input", log, "--output", out] if job == "beam" else
                       [sys.executable, "-c", "import sys; from features.config import load_config; "
                        "from recpipe.bench_preprocess import baseline_preprocess; "
                        "print(baseline_preprocess(load_config(sys.argv[1]), sys.argv[2], sys.argv[3]))",
                        cfg_path, log, out])
                wall, peak = _timed_child(cmd)
                walls[f"{job}_{mult}x"].append(wall)
                rss[f"{job}_{mult}x"].append(peak)
                if rep:
                    shutil.rmtree(out, ignore_errors=True)
    r: dict = {"rows": rows, "scale": scale, "reps": reps,
               "rows_per_s": {k: summary([rows * int(k.split("_")[1][:-1]) / w for w in v]) for k, v in walls.items()},
               "wall_s": {k: summary(v) for k, v in walls.items()},
               "peak_rss_mb": {k: summary(v) for k, v in rss.items()}}
    med = {k: v["median"] for k, v in r["rows_per_s"].items()}
    mem = {k: v["median"] for k, v in r["peak_rss_mb"].items()}
    r["ratios"] = {"preprocess_beam_vs_pyarrow": med[f"beam_{scale}x"] / med[f"baseline_{scale}x"],
                   "preprocess_rss_10x_vs_1x" if scale == 10 else f"preprocess_rss_{scale}x_vs_1x":
                       mem[f"beam_{scale}x"] / mem["beam_1x"]}
    return r


def bench_shard_formats(pre_dir: str, say: Callable[[str], None], batch_size: int = 1024) -> dict:
    """Columnar-batch records (ours) vs one tf.train.Example per row: write cost and tf.data read rate."""
    import tensorflow as tf

    from features.artifact import TransformArtifact
    from features.canonical import LABEL_KEY
    from features.records import column_specs
    from trainers.data import make_dataset

    cfg = TransformArtifact.read(os.path.join(pre_dir, "transform")).config
    specs = column_specs(cfg)
    rows = [b for b in make_dataset(cfg, pre_dir, "train", 65_536, training=False)]
    n_rows = sum(int(b[LABEL_KEY].shape[0]) for b in rows)
    say(f"bench shards: {n_rows:,} transformed rows")
    ours_bytes = sum(os.path.getsize(f) for f in glob.glob(os.path.join(pre_dir, "train", "*.tfrecord")))

    # Per-row tf.train.Example, written the way a per-row Beam DoFn would build them.
    path = os.path.join(pre_dir, "per_row_examples.tfrecord")
    t0 = time.perf_counter()
    with tf.io.TFRecordWriter(path) as w:
        for b in rows:
            cols = {k: (v.to_list() if isinstance(v, tf.RaggedTensor) else v.numpy().tolist()) for k, v in b.items()}
            for i in range(int(b[LABEL_KEY].shape[0])):
                feat = {}
                for k, (dtype, ragged) in specs.items():
                    val = cols[k][i] if ragged else [cols[k][i]]
                    feat[k] = (tf.train.Feature(int64_list=tf.train.Int64List(value=val)) if dtype == tf.int64
                               else tf.train.Feature(float_list=tf.train.FloatList(value=val)))
                w.write(tf.train.Example(features=tf.train.Features(feature=feat)).SerializeToString())
    per_row_write = n_rows / (time.perf_counter() - t0)

    feature_spec = {k: (tf.io.RaggedFeature(dtype) if ragged else tf.io.FixedLenFeature([], dtype))
                    for k, (dtype, ragged) in specs.items()}

    def rate(ds) -> float:
        it = iter(ds)
        next(it)
        n, t0 = 0, time.perf_counter()
        for b in it:
            n += int(b[LABEL_KEY].shape[0])
        return n / (time.perf_counter() - t0)

    ours_read = rate(make_dataset(cfg, pre_dir, "train", batch_size, training=False))
    per_row = (tf.data.TFRecordDataset(path).batch(batch_size)
               .map(lambda s: tf.io.parse_example(s, feature_spec), num_parallel_calls=tf.data.AUTOTUNE)
               .prefetch(tf.data.AUTOTUNE))
    per_row_read = rate(per_row)
    out = {"rows": n_rows, "columnar_records_read_rows_per_s": ours_read,
           "per_row_examples_read_rows_per_s": per_row_read, "per_row_examples_write_rows_per_s": per_row_write,
           "columnar_records_bytes_per_row": ours_bytes / n_rows,
           "per_row_examples_bytes_per_row": os.path.getsize(path) / n_rows}
    os.remove(path)
    return out


def report_markdown(results: dict) -> str:
    p, s = results["preprocess"], results["shards"]
    scale, n = p["scale"], p["rows"]
    rps, mem, ratios = p["rows_per_s"], p["peak_rss_mb"], p["ratios"]

    def cell(d: dict, fmt: str = ",.0f") -> str:
        return f"{d['median']:{fmt}} ({d['min']:{fmt}}–{d['max']:{fmt}})"

    lines = [
        f"# Preprocessing benchmark ({n:,} and {n * scale:,} generated rows; median (min–max) of {p['reps']} runs; "
        f"{os.cpu_count()} cores)", "",
        "| job | rows | rows/s | peak RSS MB |", "|---|---|---|---|",
        *[f"| {'Beam DirectRunner in_memory' if k.startswith('beam') else 'single-process baseline (no Beam)'} | "
          f"{n * int(k.split('_')[1][:-1]):,} | {cell(rps[k])} | {cell(mem[k])} |" for k in sorted(rps)], "",
        f"- **preprocess_beam_vs_pyarrow** ({n * scale:,} rows): **{ratios['preprocess_beam_vs_pyarrow']:.2f}** "
        f"(target >= 0.5)",
        *[f"- **{k}**: **{v:.2f}** (target <= 1.5)" for k, v in ratios.items() if k.startswith("preprocess_rss")],
        "", "## Shard format (train split of the 1x run)", "",
        "| format | write | tf.data read (batches of 1024) | bytes/row |", "|---|---|---|---|",
        f"| columnar record batches (chosen) | vectorised in the Beam job | "
        f"{s['columnar_records_read_rows_per_s']:,.0f} rows/s | {s['columnar_records_bytes_per_row']:.0f} |",
        f"| one tf.train.Example per row | {s['per_row_examples_write_rows_per_s']:,.0f} rows/s (Python loop) | "
        f"{s['per_row_examples_read_rows_per_s']:,.0f} rows/s | {s['per_row_examples_bytes_per_row']:.0f} |",
        "", "Reproduce: `.venv/bin/recpipe bench preprocess` (`--rows N` sets the 1x size).", ""]
    return "\n".join(lines)
