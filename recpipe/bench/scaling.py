"""`recpipe bench scaling`: how the cost of `recpipe preprocess` grows with the log's rows and the cost of
`recpipe train` with the embedding tables' rows. One measured run per point, each a fresh process tree:
  - preprocess: a Criteo-shaped log (recpipe.bench.criteo_like, 26 string IDs, 13 counts) under
    configs/criteo.yaml (26 vocabularies), with the default DirectRunner (in_memory, one process) and on a
    local dask.distributed cluster of 2 single-threaded workers started by the same command;
  - train: the embedding-heavy DLRM of recpipe.bench.embedding_model at several total table rows, one narrow
    width and a fixed number of steps, each on its own small Zipf log (recpipe.bench.zipf_log) preprocessed
    for its tables.
Every point records wall time, rows/s (ex/s), the peak RSS of the whole process tree and the bytes on disk
(the log and the shards; the model dir). Each point's data is generated when it runs and deleted after it,
so the disk holds one point at a time. recpipe.bench.scaling_report fits the slopes and writes the report.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from typing import Callable, Optional

import yaml

from recpipe.bench.criteo_like import write_criteo_like
from recpipe.bench.common import CLI
from recpipe.bench.embedding_model import EmbeddingHeavySpec, bench_config, state_bytes
# the preprocess suite's measured commands: the DirectRunner's and the local Dask cluster's, and the
# process-tree sampler (RSS of every process the command starts)
from recpipe.bench.preprocess import preprocess_command, measured_tree, two_core_command
from recpipe.bench.scaling_report import ratios
from recpipe.bench.zipf_log import write_zipf_log

__all__ = ["ScalingBenchOptions", "options_for", "tree_bytes", "bench_scaling"]

RUNNERS = ("direct", "dask")


@dataclass(frozen=True)
class ScalingBenchOptions:
    """The points of `recpipe bench scaling`.

    Attributes:
        quick: the smoke run's sizes (set by options_for).
        log_rows: log rows of the DirectRunner's points.
        dask_rows: log rows of the Dask runner's points (a subset of log_rows: the logs are shared).
        dask_workers: single-threaded workers of the local Dask cluster.
        table_rows: total embedding-table rows of the training points.
        dim: the width of every table (weights + Adagrad slots: 8 x rows x dim bytes).
        steps: training steps of every training point.
        train_log_rows: rows of each training point's log.
    """
    quick: bool = False
    log_rows: tuple = (1_000_000, 10_000_000, 50_000_000)
    dask_rows: tuple = (1_000_000, 10_000_000, 50_000_000)
    dask_workers: int = 2
    table_rows: tuple = (1_000_000, 10_000_000, 50_000_000)
    dim: int = 8
    steps: int = 300
    train_log_rows: int = 400_000


def options_for(quick: bool, steps: Optional[int] = None) -> ScalingBenchOptions:
    """The full run's points, or the quick run's.

    Args:
        quick: the smoke run: 20k and 60k log rows, 100k and 300k table rows, 10 steps.
        steps: training steps (default: 10 quick, 300 full).

    Returns:
        The options.
    """
    if quick:
        return ScalingBenchOptions(quick=True, log_rows=(20_000, 60_000), dask_rows=(20_000, 60_000),
                                   table_rows=(100_000, 300_000), steps=steps or 10, train_log_rows=20_000)
    return ScalingBenchOptions(steps=steps or 300)


def tree_bytes(path: str) -> int:
    """Bytes of the files under a folder (or of one file).

    Args:
        path: a file or a folder.

    Returns:
        The sum of the files' sizes (0 for a missing path).
    """
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _preprocess_point(runner: str, rows: int, cfg_path: str, log: str, work: str, workers: int) -> dict:
    """One measured `recpipe preprocess` of the log with a runner; its output is deleted after."""
    out = os.path.join(work, f"pre_{runner}")
    shutil.rmtree(out, ignore_errors=True)
    command = preprocess_command("beam", cfg_path, log, out) if runner == "direct" else \
        two_core_command("beam_dask", cfg_path, log, out, workers)
    wall, largest, tree, cpu = measured_tree(command)
    point = {"rows": rows, "wall_s": wall, "rows_per_s": rows / wall, "peak_rss_mb": tree,
             "largest_process_rss_mb": largest, "cpu_s": cpu, "input_bytes": tree_bytes(log),
             "output_bytes": tree_bytes(out)}
    shutil.rmtree(out, ignore_errors=True)
    return point


def _preprocess_points(o: ScalingBenchOptions, work: str, say: Callable[[str], None]) -> dict:
    """Every runner's points, one log at a time (generated, preprocessed by each runner, deleted)."""
    from recpipe.samples import repo_configs
    cfg_path = str(repo_configs() / "criteo.yaml")
    points: dict = {runner: [] for runner in RUNNERS}
    generate_s = {}
    for rows in sorted(set(o.log_rows) | set(o.dask_rows)):
        log = os.path.join(work, "log")
        shutil.rmtree(log, ignore_errors=True)
        t0 = time.perf_counter()
        write_criteo_like(rows, log)
        generate_s[str(rows)] = time.perf_counter() - t0
        for runner in RUNNERS:
            if rows not in (o.log_rows if runner == "direct" else o.dask_rows):
                continue
            point = _preprocess_point(runner, rows, cfg_path, log, work, o.dask_workers)
            points[runner].append(point)
            say(f"bench scaling: preprocess {runner}, {rows:,} rows: {point['wall_s']:.0f} s, "
                f"{point['rows_per_s']:,.0f} rows/s, peak RSS {point['peak_rss_mb']:,.0f} MB")
        shutil.rmtree(log, ignore_errors=True)
    return {"config": os.path.basename(cfg_path), "dask_workers": o.dask_workers, "generate_s": generate_s,
            "points": points}


def _train_point(o: ScalingBenchOptions, total: int, work: str, say: Callable[[str], None]) -> dict:
    """One measured `recpipe train` with `total` table rows on its own log; its files are deleted after."""
    spec = EmbeddingHeavySpec(total_rows=total, dim=o.dim, log_rows=o.train_log_rows,
                              smallest=100 if o.quick else 1_000)
    cfg = bench_config(spec)
    cfg["train"]["checkpoint_every"] = max(o.steps // 2, 1)  # the steady rate is the second interval's
    point_dir = os.path.join(work, f"train_{total}")
    shutil.rmtree(point_dir, ignore_errors=True)
    os.makedirs(point_dir)
    cfg_path = os.path.join(point_dir, "config.yaml")
    with open(cfg_path, "w") as fh:
        yaml.safe_dump(cfg, fh)
    log, pre, model_dir = (os.path.join(point_dir, name) for name in ("log", "pre", "model"))
    write_zipf_log(spec, log)
    pre_wall, _, _, _ = measured_tree(preprocess_command("beam", cfg_path, log, pre))
    shutil.rmtree(log, ignore_errors=True)
    wall, largest, tree, cpu = measured_tree([*CLI, "train", "--data", pre, "--model-dir", model_dir, "--config",
                                               cfg_path, "--steps", str(o.steps)])
    from recpipe.trainers.model_dir import ModelDir
    state = ModelDir(model_dir).state()
    point = {"table_rows": total, "wall_s": wall, "examples_per_s": o.steps * spec.batch_size / wall,
             "examples_per_s_steady": state.examples_per_sec_steady, "peak_rss_mb": tree,
             "largest_process_rss_mb": largest, "cpu_s": cpu, "state_mb": state_bytes(spec) / 2**20,
             "model_dir_bytes": tree_bytes(model_dir), "preprocess_s": pre_wall}
    shutil.rmtree(point_dir, ignore_errors=True)
    say(f"bench scaling: train, {total:,} table rows: {wall:.0f} s, {point['examples_per_s']:,.0f} ex/s "
        f"({point['examples_per_s_steady']:,.0f} steady), peak RSS {tree:,.0f} MB, model dir "
        f"{point['model_dir_bytes'] / 2**20:,.0f} MB")
    return point


def bench_scaling(o: ScalingBenchOptions, work: str, say: Callable[[str], None]) -> dict:
    """Run the suite.

    Args:
        o: the points.
        work: a work folder (one point's log, shards and model dir at a time).
        say: progress messages.

    Returns:
        The suite's result: options, the preprocess points per runner, the training points, the fitted
        slopes and the ratios.

    Raises:
        ValueError: a Dask point without a DirectRunner point of the same rows.
    """
    if not set(o.dask_rows) <= set(o.log_rows):
        raise ValueError(f"bench scaling: Dask rows {o.dask_rows} must be among the log rows {o.log_rows}")
    os.makedirs(work, exist_ok=True)
    t0 = time.perf_counter()
    preprocess = _preprocess_points(o, work, say)
    train = {"dim": o.dim, "steps": o.steps, "batch_size": EmbeddingHeavySpec().batch_size,
             "log_rows": o.train_log_rows, "points": [_train_point(o, n, work, say) for n in o.table_rows]}
    result = {"suite": "scaling", "quick": o.quick, "options": dataclasses.asdict(o), "preprocess": preprocess,
              "train": train, "left_out": {"dask": [n for n in o.log_rows if n not in o.dask_rows]},
              "elapsed_s": time.perf_counter() - t0}
    result.update(ratios(result))
    return result
