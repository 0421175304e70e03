"""Memory growth across days: peak trainer RSS against the embedding tables' size, day by day over a
drifting log (pipeline.synthetic `item_drift`), with the item vocabulary evicting unseen items and
without (it then only grows).

Each day: `recpipe preprocess` of the day's partition extending the previous day's transform, then
`recpipe train` warm-started from the previous day's model, run under recpipe.bench.measure so its
peak RSS is its own. The two runs (with and without eviction) go at once, beside the lifecycle
suite's DAG runs: each process's peak RSS is its own whatever runs beside it, and this reports
memory, not speed (`train_wall_s` is each day's wall time with the others beside it). Table MB:
every embedding table's rows × width × 4 bytes × 2 (float32 weights and the Adagrad accumulator).

Ratio keys: lifecycle_train_rss_no_evict_vs_evict (the last day's peak RSS without eviction ÷ with),
lifecycle_rss_mb_per_table_mb (least-squares slope of peak RSS on table MB over the days of both runs).
"""
from __future__ import annotations

import datetime as dt
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
import yaml

from features.artifact import TransformArtifact
from features.config import parse_config
from recpipe.bench.common import CLI, generate_once, run_measured
from trainers.memory import state_size

__all__ = ["bench_memory_growth", "memory_config", "table_mb", "markdown"]

START = dt.date(2026, 5, 1)
ITEM_DIM = 64


def memory_config(steps: int, max_size: int, evict: bool) -> dict:
    """Item IDs admitted at their first row (min_count 1), ITEM_DIM wide: the item table is most of the state."""
    item_vocab: dict = {"min_count": 1, "oov_buckets": 4}
    if evict:
        item_vocab.update(evict_unseen_days=2, max_size=max_size)
    return {
        "name": "memory_growth", "input": {"timestamp": "ts"}, "split": {"eval_fraction": 0.1},
        "label": {"column": "label"},
        "features": {
            "sparse": [{"name": "user_id", "column": "user_id", "hash_buckets": 2000, "embedding_dim": 8},
                       {"name": "item_id", "column": "item_id", "vocab": item_vocab,
                        "embedding_dim": ITEM_DIM},
                       *[{"name": f"C{i}", "column": f"C{i}", "vocab": {"min_count": 2, "oov_buckets": 1},
                          "embedding_dim": 8} for i in range(1, 4)]],
            "dense": [{"name": "I1", "column": "I1", "transform": "log_zscore", "fill": 0}]},
        "model": {"task": "ranking", "type": "dcn_v2", "cross_layers": 1, "deep_layers": [64]},
        "train": {"batch_size": 256, "learning_rate": 0.05, "optimizer": "adagrad", "steps": steps,
                  "checkpoint_every": steps},
    }


def table_mb(artifact: TransformArtifact) -> float:
    """Embedding weights + Adagrad accumulators of every table, float32, in MB: the state trainers.memory
    weighs before training."""
    return state_size(artifact.config, artifact).total / 2 ** 20


def _run(work: str, name: str, log: str, cfg: dict, days: list[str], say: Callable[[str], None]) -> list[dict]:
    root = os.path.join(work, name)
    shutil.rmtree(root, ignore_errors=True)  # a rerun in the same workdir preprocesses and trains afresh
    os.makedirs(root)
    cfg_path = os.path.join(root, "config.yaml")
    with open(cfg_path, "w") as fh:
        yaml.safe_dump(cfg, fh)
    parse_config(cfg)  # fail here, not in the first subprocess
    out, previous = [], None
    for day in days:
        say(f"bench lifecycle memory: {name}: {day}")
        data, model = os.path.join(root, day, "preprocessed"), os.path.join(root, day, "model")
        pre = [*CLI, "preprocess", "--config", cfg_path, "--input", os.path.join(log, f"dt={day}"), "--output", data]
        train = [*CLI, "train", "--data", data, "--model-dir", model]
        if previous is not None:
            pre += ["--previous-transform", os.path.join(previous, "preprocessed")]
            train += ["--warm-start", os.path.join(previous, "model")]
        run_measured(pre)
        wall, peak, _ = run_measured(train)
        art = TransformArtifact.read(os.path.join(data, "transform"))
        out.append({"day": day, "item_table_rows": art.table_sizes()["item_id"],
                    "table_rows": sum(art.table_sizes().values()), "table_mb": table_mb(art),
                    "train_peak_rss_mb": peak, "train_wall_s": wall})
        previous = os.path.join(root, day)
    return out


def bench_memory_growth(work: str, say: Callable[[str], None], quick: bool = False) -> dict:
    n_days = 3 if quick else 10
    per_day, num_items, drift = (4_000, 2_000, 1_000) if quick else (150_000, 100_000, 50_000)
    steps = 20 if quick else 100
    days = [(START + dt.timedelta(days=i)).isoformat() for i in range(n_days)]
    log = os.path.join(work, "memory_log")
    generate_once(per_day * n_days, log, seed=9, days=n_days, start_date=START, num_users=2_000, num_items=num_items,
                  item_drift=drift)
    max_size = int(num_items * 1.25)
    with ThreadPoolExecutor(2) as pool:
        started = {name: pool.submit(_run, work, f"memory_{name}", log, memory_config(steps, max_size, evict),
                                     days, say) for name, evict in (("evict", True), ("no_evict", False))}
        runs = {name: job.result() for name, job in started.items()}
    points = [(d["table_mb"], d["train_peak_rss_mb"]) for r in runs.values() for d in r]
    x, y = (np.array(v, dtype=np.float64) for v in zip(*points))
    slope = float(np.polyfit(x, y, 1)[0]) if np.ptp(x) > 0 else float("nan")
    ratios = {"lifecycle_train_rss_no_evict_vs_evict": runs["no_evict"][-1]["train_peak_rss_mb"]
              / runs["evict"][-1]["train_peak_rss_mb"],
              "lifecycle_rss_mb_per_table_mb": slope}
    return {"runs": runs, "ratios": ratios,
            "settings": {"days": days, "rows_per_day": per_day, "items_per_day": num_items, "item_drift": drift,
                         "max_size": max_size, "evict_unseen_days": 2, "steps_per_day": steps, "item_dim": ITEM_DIM}}


def markdown(r: dict) -> str:
    s = r["settings"]
    lines = [f"Memory growth over {len(s['days'])} days ({s['rows_per_day']:,} rows a day, {s['items_per_day']:,} "
             f"active items, {s['item_drift']:,} new a day; items admitted at their first row, {s['item_dim']} wide; "
             f"{s['steps_per_day']} warm-started steps a day). Table MB: weights + Adagrad state of every table.", "",
             "| day | item rows, evicting | table MB | peak train RSS MB | item rows, not evicting | table MB | "
             "peak train RSS MB |", "|---|---|---|---|---|---|---|"]
    for a, b in zip(r["runs"]["evict"], r["runs"]["no_evict"]):
        lines.append(f"| {a['day']} | {a['item_table_rows']:,} | {a['table_mb']:.1f} | {a['train_peak_rss_mb']:,.0f} | "
                     f"{b['item_table_rows']:,} | {b['table_mb']:.1f} | {b['train_peak_rss_mb']:,.0f} |")
    return "\n".join(lines)
