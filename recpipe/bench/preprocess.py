"""The preprocess suite: the Beam job against the single-process baseline (recpipe.bench.baseline)
at 1x and 10x rows, peak RSS of each, and the shard format (columnar record batches vs one
tf.train.Example per row); against DuckDB doing the same transform, and against itself without the
repeated-rows check (what finding rows read twice costs).
"""
from __future__ import annotations

import collections
import json
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

__all__ = ["bench_preprocess", "bench_peers", "bench_shard_formats", "peer_ratios", "report_markdown",
           "preprocess_command", "two_core_command", "measured_tree"]


_JOBS = {  # job -> (module, function) of the Python API the non-Beam jobs run
    "baseline": ("recpipe.bench.baseline", "baseline_preprocess"),
    "duckdb": ("recpipe.bench.duckdb_peer", "duckdb_preprocess"),
}


_PEER_NAMES = {"beam": "`recpipe preprocess` (the default: DirectRunner in_memory, one process; Parquet decoding and "
                       "validation, row hashing, analysis and the transform run on threads of their own)",
               "beam_multi_processing": "`recpipe preprocess --direct_running_mode=multi_processing "
                                        "--direct_num_workers=2`",
               "beam_multi_threading": "`recpipe preprocess --direct_running_mode=multi_threading "
                                       "--direct_num_workers=2`",
               "beam_dask": "`recpipe preprocess --runner dask` on a local dask.distributed cluster of 2 workers "
                            "x 1 thread, started by the command",
               "duckdb": "DuckDB (recpipe.bench.duckdb_peer)",
               "beam_unchecked": "`recpipe preprocess` without the repeated-rows check"}

# The Beam configurations that spread the job over as many workers as DuckDB gets threads (`{n}`), each against the
# same log and config. The fastest of them and the default (one process whose reading, analysis, transform and row
# hashing run on threads of their own, so it uses every core too), by median rows/s in the run, is
# `preprocess_beam_vs_duckdb`'s numerator.
_TWO_CORE = {"beam_multi_processing": ["--direct_running_mode=multi_processing", "--direct_num_workers={n}"],
             "beam_multi_threading": ["--direct_running_mode=multi_threading", "--direct_num_workers={n}"],
             "beam_dask": []}  # the command starts its own LocalCluster: _dask_local_command

# `recpipe preprocess` on a LocalCluster of N single-threaded worker processes started by the same command, so
# the cluster's start-up is in the measured wall time as DuckDB's and the DirectRunner's are.
_DASK_LOCAL = ("import sys\nif __name__ == '__main__':\n"
               "    from dask.distributed import LocalCluster\n"
               "    from recpipe.cli import main\n"
               "    with LocalCluster(n_workers=int(sys.argv[1]), threads_per_worker=1, dashboard_address=None) as c:\n"
               "        sys.exit(main([*sys.argv[2:], '--runner', 'dask', '--dask-address', c.scheduler_address]))\n")


def preprocess_command(job: str, cfg_path: str, log: str, out: str, threads: int | None = None) -> list[str]:
    """The command line of one measured preprocessing run: `recpipe preprocess` for "beam", else the
    job's function in a fresh Python process (so each pays its own start-up, as a user would)."""
    if job == "beam":
        return [*CLI, "preprocess", "--config", cfg_path, "--input", log, "--output", out]
    module, fn = _JOBS[job]
    extra = ", int(sys.argv[4])" if threads is not None else ""
    return [sys.executable, "-c", f"import sys; from recpipe.features.config import load_config; from {module} import {fn}; "
            f"print({fn}(load_config(sys.argv[1]), sys.argv[2], sys.argv[3]{extra}))", cfg_path, log, out,
            *([str(threads)] if threads is not None else [])]


def two_core_command(job: str, cfg_path: str, log: str, out: str, threads: int) -> list[str]:
    """The measured command of one job of the peers comparison (`threads`: DuckDB's threads, the 2-core
    Beam configurations' workers)."""
    if job == "duckdb":
        return preprocess_command(job, cfg_path, log, out, threads)
    if job == "beam_dask":
        beam = preprocess_command("beam", cfg_path, log, out)
        return [sys.executable, "-c", _DASK_LOCAL, str(threads), *beam[len(CLI):]]
    return preprocess_command("beam", cfg_path, log, out) + [a.format(n=threads) for a in _TWO_CORE.get(job, [])]


def measured_tree(command: list[str]) -> tuple[float, float, float, float]:
    """run_measured, plus the peak of the summed RSS of every process the command started (sampled every
    0.1 s: the largest process's peak understates a job of several) and the CPU seconds of all of them.
    Returns (wall s, largest process's peak RSS MB, all processes' peak RSS MB, CPU s)."""
    import threading

    import psutil

    done, peak = threading.Event(), [0]
    me = psutil.Process()

    def sample() -> None:
        while not done.wait(0.1):
            total = 0
            for proc in me.children(recursive=True):
                try:
                    total += proc.memory_info().rss
                except psutil.Error:
                    pass
            peak[0] = max(peak[0], total)

    sampler = threading.Thread(target=sample, daemon=True)
    cpu0 = os.times()
    sampler.start()
    try:
        wall, largest, _ = run_measured(command)
    finally:
        done.set()
        sampler.join()
    cpu1 = os.times()
    cpu = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    return wall, largest, max(peak[0] / 2 ** 20, largest), cpu


def _artifact_without_shard_bytes(out: str) -> dict:
    """transform.json of a `recpipe preprocess` output without row_counts.shard_bytes (which lists each bundle's
    shards, so it differs with the number of workers): what must be equal across runners."""
    meta = PreprocessedData(out).transform_dir
    with open(os.path.join(meta, "transform.json")) as fh:
        doc = json.load(fh)
    doc.get("row_counts", {}).pop("shard_bytes", None)
    return doc


def peer_ratios(rows_per_s: dict[str, float]) -> tuple[str, dict[str, float]]:
    """From each job's median rows/s: the fastest of the default and the `_TWO_CORE` configurations, and the
    ratios to DuckDB.

    `preprocess_beam_vs_duckdb` is that fastest job (every one uses as many cores as DuckDB's threads, like for
    like); `preprocess_beam_1proc_vs_duckdb` the default single-process job, reported beside it."""
    best = max((j for j in ("beam", *_TWO_CORE) if j in rows_per_s), key=lambda j: rows_per_s[j])
    duck = rows_per_s["duckdb"]
    ratios = {"preprocess_beam_vs_duckdb": rows_per_s[best] / duck,
              "preprocess_beam_1proc_vs_duckdb": rows_per_s["beam"] / duck}
    if "beam_unchecked" in rows_per_s:  # what finding rows read twice costs (recpipe.pipeline.repeats)
        ratios["preprocess_repeats_check_vs_unchecked"] = rows_per_s["beam"] / rows_per_s["beam_unchecked"]
    return best, ratios


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
                wall, peak, _ = run_measured(preprocess_command(job, cfg_path, log, out))
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
    """`recpipe preprocess` against DuckDB with `threads` threads doing the same transform
    (recpipe.bench.duckdb_peer) on the same Criteo-shaped Parquet log, round robin: the default (one
    process) and each Beam configuration using `threads` cores (`_TWO_CORE`), whose fastest is the
    like-for-like ratio. Every Beam run's transform.json must equal the default's (shard_bytes aside)."""
    log = write_criteo_like(rows, os.path.join(work, "criteo_like"))
    unchecked = os.path.join(work, "criteo_unchecked.yaml")  # the same config without the repeated-rows check
    with open(cfg_path) as fh:
        cfg = yaml.safe_load(fh)
    cfg.setdefault("preprocess", {})["max_repeated_row_fraction"] = 1
    with open(unchecked, "w") as fh:
        yaml.safe_dump(cfg, fh)
    jobs = ("beam", *_TWO_CORE, "duckdb", "beam_unchecked")
    walls: dict = collections.defaultdict(list)
    rss: dict = collections.defaultdict(list)
    rss_all: dict = collections.defaultdict(list)
    cpu: dict = collections.defaultdict(list)
    artifacts: dict = {}
    for rep in range(reps):
        for job in jobs:
            out = os.path.join(work, f"peer_{job}")
            shutil.rmtree(out, ignore_errors=True)
            say(f"bench preprocess: peers, {job}, {rows:,} Criteo-shaped rows (rep {rep + 1}/{reps})")
            command = preprocess_command("beam", unchecked, log, out) if job == "beam_unchecked" else \
                two_core_command(job, cfg_path, log, out, threads)
            wall, peak, peak_all, seconds = measured_tree(command)
            walls[job].append(wall)
            rss[job].append(peak)
            rss_all[job].append(peak_all)
            cpu[job].append(seconds)
            if job == "beam" or job in _TWO_CORE:
                artifacts[job] = _artifact_without_shard_bytes(out)
            shutil.rmtree(out, ignore_errors=True)
    rps = {job: summary([rows / w for w in v]) for job, v in walls.items()}
    best, ratios = peer_ratios({job: v["median"] for job, v in rps.items()})
    result = {"rows": rows, "reps": reps, "duckdb_threads": threads, "config": os.path.basename(cfg_path),
            "rows_per_s": rps, "wall_s": {k: summary(v) for k, v in walls.items()},
            "peak_rss_mb": {k: summary(v) for k, v in rss.items()},
            "peak_rss_all_processes_mb": {k: summary(v) for k, v in rss_all.items()},
            "cpu_s": {k: summary(v) for k, v in cpu.items()},
            "same_artifact_as_default": {j: artifacts[j] == artifacts["beam"] for j in _TWO_CORE},
            "beam_two_core_best": best, "ratios": ratios}
    result["why"] = peers_why(result)  # REPORT.md quotes it when the target is missed
    return result


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
        lines += _peers_markdown(peers, cell)
    return "\n".join(lines)


def _peers_markdown(peers: dict, cell: Callable[..., str]) -> list[str]:
    """The DuckDB section: every job's figures, the two ratios, and why the like-for-like one is what it is."""
    from recpipe.bench.targets import TARGETS

    pr, pw, pm = peers["rows_per_s"], peers["wall_s"], peers["peak_rss_mb"]
    every, cpu = peers.get("peak_rss_all_processes_mb", {}), peers.get("cpu_s", {})
    ratios, n = peers["ratios"], peers["duckdb_threads"]
    op, target = TARGETS["preprocess_beam_vs_duckdb"]
    same = peers.get("same_artifact_as_default", {})
    lines = [
        f"## Against DuckDB ({peers['rows']:,} Criteo-shaped rows, `configs/{peers['config']}`; "
        f"median (min–max) of {peers['reps']} round-robin runs)", "",
        "Same Parquet, same config, same work: time split, 26 vocabularies (min_count, max_size) over the "
        f"train rows, IDs with OOV buckets, log/z-score dense features; DuckDB with {n} threads writes Parquet, "
        f"Beam writes its TFRecord shards. Beam runs once as `recpipe preprocess` runs by default (one process) "
        f"and once in each configuration spreading it over {n} workers; the fastest of these runs (the default "
        f"included: its reading and validation, row hashing, analysis and transform run on threads of their "
        f"own) is the like-for-like "
        "ratio. Wall "
        "time of the whole command (Python and library start-up, and a Dask cluster's, included); CPU s of all its "
        "processes; peak RSS of its largest process and of all its processes together (sampled every 0.1 s).", "",
        "| job | rows/s | wall s | CPU s | peak RSS MB (largest process) | peak RSS MB (all processes) | "
        "transform.json = the default's |", "|---|---|---|---|---|---|---|",
        *[f"| {_PEER_NAMES[k]} | {cell(pr[k])} | {cell(pw[k], '.1f')} | "
          f"{cell(cpu[k], '.1f') if k in cpu else ''} | {cell(pm[k])} | {cell(every[k]) if k in every else ''} | "
          f"{'' if k not in same else 'yes' if same[k] else '**no**'} |" for k in _PEER_NAMES if k in pr], "",
        f"- **preprocess_beam_vs_duckdb**: **{ratios['preprocess_beam_vs_duckdb']:.2f}** (target {op} {target:g}; "
        f"Beam on {n} cores: {_PEER_NAMES.get(peers.get('beam_two_core_best'), 'the default')})"]
    if "preprocess_beam_1proc_vs_duckdb" in ratios:
        lines.append(f"- preprocess_beam_1proc_vs_duckdb: {ratios['preprocess_beam_1proc_vs_duckdb']:.2f} (the "
                     f"default, one process; no target)")
    if (checked := ratios.get("preprocess_repeats_check_vs_unchecked")) is not None:
        lines.append(f"- preprocess_repeats_check_vs_unchecked: {checked:.2f} (against the job without finding rows "
                     f"read twice, `preprocess.max_repeated_row_fraction: 1`)")
    why = peers.get("why") or peers_why(peers)
    return lines + ([f"- Why: {why}"] if why else []) + [""]


def peers_why(peers: dict) -> str:
    """Why the like-for-like ratio is where it is, from the run's own figures ('' for a run before
    the 2-core configurations were measured)."""
    best, med = peers.get("beam_two_core_best"), {k: v["median"] for k, v in peers["rows_per_s"].items()}
    cpu = {k: v["median"] for k, v in peers.get("cpu_s", {}).items()}
    wall = {k: v["median"] for k, v in peers["wall_s"].items()}
    if not best or not cpu:
        return ""
    n = peers["duckdb_threads"]

    def cores(job: str) -> str:
        return f"{cpu[job] / wall[job]:.2f} cores ({cpu[job]:.1f} CPU s in {wall[job]:.1f} s)"

    others = ", ".join(f"{k[len('beam_'):]} {med[k]:,.0f} rows/s with {cores(k)}" for k in _TWO_CORE if k in med)
    best_two = max((k for k in _TWO_CORE if k in med), key=lambda k: med[k])
    faster = med[best_two] > med["beam"]
    return (f"the default job keeps {cores('beam')} busy, for {med['beam']:,.0f} rows/s: each Parquet batch is "
            f"decoded (by Arrow) and validated on a thread of its own, one batch ahead, the rows' hashes are worked "
            f"out on another, and a batch's token counts, dense statistics or transform on others while the next "
            f"goes down the stages; what stays on one core is the Python between Arrow's "
            f"calls, under one interpreter lock. Spreading the job over {n} workers adds work instead of dividing "
            f"it — {others}: a worker process (multi_processing, Dask) starts its own Python, Beam and Arrow and "
            f"every element crossing a stage boundary is encoded and decoded, Dask runs a scheduler and a nanny per "
            f"worker beside the job, and multi_threading's threads share one interpreter lock. "
            + (f"The fastest, {best_two[len('beam_'):]}, is {med[best_two] / med['beam']:.2f}x the default. "
               if faster else
               f"None beats the default ({best_two[len('beam_'):]}, the fastest, is "
               f"{med[best_two] / med['beam']:.2f}x it), so `recpipe preprocess` keeps one in_memory process by "
               f"default. ")
            + f"DuckDB does the same rows in {wall['duckdb']:.1f} s with {cores('duckdb')}: C++ from the Parquet "
            f"reader to the writer, with no Python per batch and one read of the log where Beam's job reads it "
            f"twice (analysis, then transform: memory stays bounded as the log grows). Beyond the cores used, "
            f"CPU seconds count: the default spends {cpu['beam'] / cpu['duckdb']:.2f}x DuckDB's"
            + (f", {cpu['beam'] - cpu['beam_unchecked']:.1f} s of them finding rows read twice (the job without "
               f"that check: {cpu['beam_unchecked']:.1f} CPU s, {med['beam_unchecked']:,.0f} rows/s), which "
               f"DuckDB does not do" if 'beam_unchecked' in cpu else "") + ".")
