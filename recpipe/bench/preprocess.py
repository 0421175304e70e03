"""The preprocess suite: the Beam job against the single-process baseline (recpipe.bench.baseline)
at 1x and 10x rows, peak RSS of each, and the shard format (columnar record batches vs one
tf.train.Example per row); against DuckDB doing the same transform, and against itself without the
repeated-rows check (what finding rows read twice costs).
"""
from __future__ import annotations

import collections
import os
import shutil
import sys
import time
from typing import Callable

import tensorflow as tf
import yaml

from recpipe.features.canonical import LABEL_KEY
from recpipe.features.preprocessed import PreprocessedData
from recpipe.features.records import column_specs
from recpipe.bench.common import CLI, generate_once, run_measured, summary
from recpipe.bench.criteo_like import write_criteo_like
from recpipe.trainers.data import make_dataset

__all__ = ["bench_preprocess", "bench_peers", "bench_shard_formats", "report_markdown"]


_JOBS = {  # job -> (module, function) of the Python API the non-Beam jobs run
    "baseline": ("recpipe.bench.baseline", "baseline_preprocess"),
    "duckdb": ("recpipe.bench.duckdb_peer", "duckdb_preprocess"),
}


_PEER_NAMES = {"beam": "`recpipe preprocess` (Beam DirectRunner)", "duckdb": "DuckDB (recpipe.bench.duckdb_peer)",
               "beam_unchecked": "`recpipe preprocess` without the repeated-rows check"}


def _command(job: str, cfg_path: str, log: str, out: str, threads: int | None = None) -> list[str]:
    """The command line of one measured preprocessing run: `recpipe preprocess` for "beam", else the
    job's function in a fresh Python process (so each pays its own start-up, as a user would)."""
    if job == "beam":
        return [*CLI, "preprocess", "--config", cfg_path, "--input", log, "--output", out]
    module, fn = _JOBS[job]
    extra = ", int(sys.argv[4])" if threads is not None else ""
    return [sys.executable, "-c", f"import sys; from recpipe.features.config import load_config; from {module} import {fn}; "
            f"print({fn}(load_config(sys.argv[1]), sys.argv[2], sys.argv[3]{extra}))", cfg_path, log, out,
            *([str(threads)] if threads is not None else [])]


def bench_preprocess(rows: int, work: str, cfg_path: str, say: Callable[[str], None], scale: int = 10,
                     reps: int = 3, quick: bool = False) -> dict:
    """Beam vs baseline rows/s at rows and scale x rows; peak RSS of each; `reps` runs of each
    (quick: no baseline at 1x, which only the throughput-vs-rows plot uses)."""
    logs = {1: os.path.join(work, "log_1x"), scale: os.path.join(work, f"log_{scale}x")}
    say(f"bench preprocess: generating {rows:,} and {rows * scale:,} rows")
    for mult, path in logs.items():
        generate_once(rows * mult, path, seed=0, days=3)
    walls: dict = collections.defaultdict(list)
    rss: dict = collections.defaultdict(list)
    for rep in range(reps):
        for mult, log in logs.items():
            for job in ("beam", "baseline") if mult != 1 or not quick else ("beam",):
                out = os.path.join(work, f"{job}_{mult}x" if rep == 0 else f"{job}_{mult}x_rep{rep}")
                shutil.rmtree(out, ignore_errors=True)
                say(f"bench preprocess: {job}, {rows * mult:,} rows (rep {rep + 1}/{reps})")
                wall, peak, _ = run_measured(_command(job, cfg_path, log, out))
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


def bench_peers(rows: int, work: str, cfg_path: str, say: Callable[[str], None], reps: int = 3,
                threads: int = 2) -> dict:
    """`recpipe preprocess` (Beam DirectRunner) against DuckDB with `threads` threads doing the same
    transform (recpipe.bench.duckdb_peer) on the same Criteo-shaped Parquet log, round robin."""
    log = write_criteo_like(rows, os.path.join(work, "criteo_like"))
    unchecked = os.path.join(work, "criteo_unchecked.yaml")  # the same config without the repeated-rows check
    with open(cfg_path) as fh:
        cfg = yaml.safe_load(fh)
    cfg.setdefault("preprocess", {})["max_repeated_row_fraction"] = 1
    with open(unchecked, "w") as fh:
        yaml.safe_dump(cfg, fh)
    walls: dict = collections.defaultdict(list)
    rss: dict = collections.defaultdict(list)
    for rep in range(reps):
        for job in ("beam", "duckdb", "beam_unchecked"):
            out = os.path.join(work, f"peer_{job}")
            shutil.rmtree(out, ignore_errors=True)
            say(f"bench preprocess: peers, {job}, {rows:,} Criteo-shaped rows (rep {rep + 1}/{reps})")
            command = _command("beam", unchecked, log, out) if job == "beam_unchecked" else \
                _command(job, cfg_path, log, out, threads)
            wall, peak, _ = run_measured(command)
            walls[job].append(wall)
            rss[job].append(peak)
            shutil.rmtree(out, ignore_errors=True)
    rps = {job: summary([rows / w for w in v]) for job, v in walls.items()}
    return {"rows": rows, "reps": reps, "duckdb_threads": threads, "config": os.path.basename(cfg_path),
            "rows_per_s": rps, "wall_s": {k: summary(v) for k, v in walls.items()},
            "peak_rss_mb": {k: summary(v) for k, v in rss.items()},
            "ratios": {"preprocess_beam_vs_duckdb": rps["beam"]["median"] / rps["duckdb"]["median"],
                       # what finding rows read twice costs (recpipe.pipeline.repeats): below 1, slower with it
                       "preprocess_repeats_check_vs_unchecked":
                           rps["beam"]["median"] / rps["beam_unchecked"]["median"]}}


def bench_shard_formats(pre_dir: str, say: Callable[[str], None], batch_size: int = 1024) -> dict:
    """Columnar-batch records (ours) vs one tf.train.Example per row: write cost and tf.data read rate."""
    data = PreprocessedData(pre_dir)
    cfg = data.transform().config
    specs = column_specs(cfg)
    rows = [b for b in make_dataset(cfg, pre_dir, "train", 65_536, training=False)]
    n_rows = sum(int(b[LABEL_KEY].shape[0]) for b in rows)
    say(f"bench shards: {n_rows:,} transformed rows")
    ours_bytes = sum(os.path.getsize(f) for f in data.shard_files("train"))

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
    p, s, peers = results["preprocess"], results["shards"], results.get("peers")
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
    if peers:
        pr, pw, pm = peers["rows_per_s"], peers["wall_s"], peers["peak_rss_mb"]
        ratio = peers["ratios"]["preprocess_beam_vs_duckdb"]
        lines += [
            f"## Against DuckDB ({peers['rows']:,} Criteo-shaped rows, `configs/{peers['config']}`; "
            f"median (min–max) of {peers['reps']} round-robin runs)", "",
            "Same Parquet, same config, same work: time split, 26 vocabularies (min_count, max_size) over the "
            "train rows, IDs with OOV buckets, log/z-score dense features; DuckDB with "
            f"{peers['duckdb_threads']} threads writes Parquet, Beam writes its TFRecord shards. Wall time of the "
            "whole command (Python and library start-up included).", "",
            "| job | rows/s | wall s | peak RSS MB |", "|---|---|---|---|",
            *[f"| {_PEER_NAMES[k]} | {cell(pr[k])} | {cell(pw[k], '.1f')} | {cell(pm[k])} |" for k in _PEER_NAMES
              if k in pr], "",
            f"- **preprocess_beam_vs_duckdb**: **{ratio:.2f}** (target >= 0.5)",
            *([f"- preprocess_repeats_check_vs_unchecked: {checked:.2f} (against the job without finding rows read "
               f"twice, `preprocess.max_repeated_row_fraction: 1`)"]
              if (checked := peers["ratios"].get("preprocess_repeats_check_vs_unchecked")) is not None else []), ""]
    return "\n".join(lines)
