"""Memory growth across days: peak trainer RSS against the embedding tables' size, day by day over a
drifting log (recpipe.pipeline.synthetic `item_drift`), with the item vocabulary evicting unseen items and
without (it then only grows).

Each chain: `recpipe preprocess` of each day's partition extending the previous day's transform, then
each day's `recpipe train` warm-started from the previous day's model, run under recpipe.bench.measure so
its peak RSS is its own. The two runs (with and without eviction) go at once, beside the lifecycle
suite's DAG runs: each process's peak RSS is its own whatever runs beside it, and this reports
memory, not speed (`train_wall_s` is each day's wall time with the others beside it). Table MB:
every embedding table's rows × width × 4 bytes × 2 (float32 weights and the Adagrad accumulator).

Ratio keys: lifecycle_train_rss_no_evict_vs_evict (the last day's peak RSS without eviction ÷ with),
lifecycle_rss_mb_per_table_mb (least-squares slope of peak RSS on table MB over the days of both runs),
lifecycle_warm_day_rss_vs_bound (the largest, over both runs' warm-started days, of peak RSS ÷ (1.3 x table MB +
800 MB): recpipe.bench.memory_bound).
"""
from __future__ import annotations

import datetime as dt
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np
import yaml

from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import parse_config
from recpipe.bench.common import CLI, generate_once, run_measured
from recpipe.bench.memory_bound import BASE_MB, PER_STATE, bound_mb, rss_vs_bound
from recpipe.trainers.memory import state_size

__all__ = ["MemorySettings", "bench_memory_growth", "memory_config", "memory_settings", "preprocess_chain",
           "item_table_rows", "table_mb", "warm_day_vs_bound", "warm_day_text", "merge_memory_growth", "markdown"]

START = dt.date(2026, 5, 1)
ITEM_DIM = 64
CHAINS = {True: "evict", False: "no_evict"}  # evict -> the chain's name


def memory_config(steps: int, max_size: int, evict: bool, evict_unseen_days: int = 2) -> dict:
    """Item IDs admitted at their first row (min_count 1), ITEM_DIM wide: the item table is most of the state."""
    item_vocab: dict = {"min_count": 1, "oov_buckets": 4}
    if evict:
        item_vocab.update(evict_unseen_days=evict_unseen_days, max_size=max_size)
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
    """Embedding weights + Adagrad accumulators of every table, float32, in MB: the state recpipe.trainers.memory
    weighs before training."""
    return state_size(artifact.config, artifact).total / 2 ** 20


@dataclass(frozen=True)
class MemorySettings:
    """What the suite runs: a log of `days` (rows_per_day a day over items_per_day active items, item_drift new
    ones a day), the evicting chain's evict_unseen_days, and the trainings' steps a day."""
    days: tuple[str, ...]
    rows_per_day: int
    items_per_day: int
    item_drift: int
    evict_unseen_days: int
    steps_per_day: int

    @property
    def max_size(self) -> int:
        return int(self.items_per_day * 1.25)


def memory_settings(quick: bool) -> MemorySettings:
    """10 days, or quick 2 whose evicting chain evicts the items unseen on the day (1 day), so that it holds
    fewer item rows than the other chain from day 2 on."""
    n_days = 2 if quick else 10
    days = tuple((START + dt.timedelta(days=i)).isoformat() for i in range(n_days))
    if quick:
        return MemorySettings(days, rows_per_day=4_000, items_per_day=2_000, item_drift=1_000, evict_unseen_days=1,
                              steps_per_day=20)
    return MemorySettings(days, rows_per_day=150_000, items_per_day=100_000, item_drift=50_000, evict_unseen_days=2,
                          steps_per_day=100)


def _memory_log(work: str, s: MemorySettings) -> str:
    """The drifting log of the settings' days in WORK/memory_log, written once (common.generate_once)."""
    return generate_once(s.rows_per_day * len(s.days), os.path.join(work, "memory_log"), seed=9, days=len(s.days),
                         start_date=START, num_users=2_000, num_items=s.items_per_day, item_drift=s.item_drift)


def preprocess_chain(work: str, evict: bool, quick: bool, say: Callable[[str], None]) -> list[str]:
    """The chain's preprocessing, afresh in WORK/memory_evict or WORK/memory_no_evict (a rerun in the same workdir
    starts over): `recpipe preprocess` of each day's partition of the suite's log (generated once in WORK),
    extending the previous day's transform. Returns the days' preprocessed dirs."""
    s = memory_settings(quick)
    log = _memory_log(work, s)
    root = os.path.join(work, f"memory_{CHAINS[evict]}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    cfg = memory_config(s.steps_per_day, s.max_size, evict, s.evict_unseen_days)
    parse_config(cfg)  # fail here, not in the first subprocess
    cfg_path = os.path.join(root, "config.yaml")
    with open(cfg_path, "w") as fh:
        yaml.safe_dump(cfg, fh)
    out: list[str] = []
    for day in s.days:
        say(f"bench lifecycle memory: {CHAINS[evict]}: preprocessing {day}")
        data = os.path.join(root, day, "preprocessed")
        previous = ["--previous-transform", out[-1]] if out else []
        run_measured([*CLI, "preprocess", "--config", cfg_path, "--input", os.path.join(log, f"dt={day}"),
                      "--output", data, *previous])
        out.append(data)
    return out


def item_table_rows(data: str) -> int:
    """The item table's rows of a preprocessed dir."""
    return TransformArtifact.read(os.path.join(data, "transform")).table_sizes()["item_id"]


def _run(work: str, evict: bool, quick: bool, say: Callable[[str], None]) -> list[dict]:
    """One chain: its preprocessing (preprocess_chain), then each day's `recpipe train` warm-started from the
    previous day's model, its peak RSS measured."""
    out, previous = [], None
    for data in preprocess_chain(work, evict, quick, say):
        day_dir = os.path.dirname(data)
        say(f"bench lifecycle memory: {CHAINS[evict]}: training {os.path.basename(day_dir)}")
        model = os.path.join(day_dir, "model")
        warm = ["--warm-start", previous] if previous else []
        wall, peak, _ = run_measured([*CLI, "train", "--data", data, "--model-dir", model, *warm])
        art = TransformArtifact.read(os.path.join(data, "transform"))
        out.append({"day": os.path.basename(day_dir), "item_table_rows": item_table_rows(data),
                    "table_rows": sum(art.table_sizes().values()), "table_mb": table_mb(art),
                    "train_peak_rss_mb": peak, "train_wall_s": wall})
        previous = model
    return out


def warm_day_vs_bound(runs: dict[str, list[dict]]) -> tuple[float, str, str]:
    """The warm-started day furthest over the memory bound (every day of a chain but its first).

    Args:
        runs: {chain: [{"day", "table_mb", "train_peak_rss_mb"}, ...]} in day order.

    Returns:
        (peak RSS / (1.3 x table MB + 800 MB), its chain, its day); (nan, "", "") when no chain has a second day.
    """
    worst = (float("nan"), "", "")
    for chain, days in sorted(runs.items()):
        for d in days[1:]:
            ratio = rss_vs_bound(d["train_peak_rss_mb"], d["table_mb"])
            if not ratio <= worst[0]:  # nan at first
                worst = (ratio, chain, d["day"])
    return worst


def bench_memory_growth(work: str, say: Callable[[str], None], quick: bool = False) -> dict:
    s = memory_settings(quick)
    _memory_log(work, s)  # before the chains' threads, which only read it
    with ThreadPoolExecutor(2) as pool:
        started = {name: pool.submit(_run, work, evict, quick, say) for evict, name in CHAINS.items()}
        runs = {name: job.result() for name, job in started.items()}
    points = [(d["table_mb"], d["train_peak_rss_mb"]) for r in runs.values() for d in r]
    x, y = (np.array(v, dtype=np.float64) for v in zip(*points))
    slope = float(np.polyfit(x, y, 1)[0]) if np.ptp(x) > 0 else float("nan")
    warm, warm_chain, warm_day = warm_day_vs_bound(runs)
    ratios = {"lifecycle_train_rss_no_evict_vs_evict": runs["no_evict"][-1]["train_peak_rss_mb"]
              / runs["evict"][-1]["train_peak_rss_mb"],
              "lifecycle_rss_mb_per_table_mb": slope, "lifecycle_warm_day_rss_vs_bound": warm}
    return {"runs": runs, "ratios": ratios, "warm_day_worst": {"chain": warm_chain, "day": warm_day},
            "settings": {"days": list(s.days), "rows_per_day": s.rows_per_day, "items_per_day": s.items_per_day,
                         "item_drift": s.item_drift, "max_size": s.max_size, "evict_unseen_days": s.evict_unseen_days,
                         "steps_per_day": s.steps_per_day, "item_dim": ITEM_DIM}}


def merge_memory_growth(result: dict, memory: dict, machine: dict) -> dict:
    """A lifecycle suite's result with its memory part measured again alone (bench_memory_growth), the DAG runs'
    figures kept: the memory part names its own run (machine, date, commit).

    Args:
        result: the lifecycle suite's result (recpipe.bench.lifecycle.bench_lifecycle, with "machine").
        memory: bench_memory_growth's result.
        machine: recpipe.bench.common.machine_info() of the memory run.

    Returns:
        A new result: memory_growth replaced (with "machine"), its ratio keys updated.
    """
    return {**result, "memory_growth": {**memory, "machine": machine},
            "ratios": {**result.get("ratios", {}), **memory["ratios"]}}


def markdown(r: dict) -> str:
    s = r["settings"]
    lines = [f"Memory growth over {len(s['days'])} days ({s['rows_per_day']:,} rows a day, {s['items_per_day']:,} "
             f"active items, {s['item_drift']:,} new a day; items admitted at their first row, {s['item_dim']} wide, "
             f"the evicting chain's evicted after {s['evict_unseen_days']} day(s) unseen; "
             f"{s['steps_per_day']} warm-started steps a day). Table MB: weights + Adagrad state of every table."
             + (f" Measured alone on {r['machine'].get('date')} (commit {str(r['machine'].get('git_commit'))[:10]}), "
                f"apart from the DAG runs above." if r.get("machine") else ""), "",
             "| day | item rows, evicting | table MB | peak train RSS MB | item rows, not evicting | table MB | "
             "peak train RSS MB |", "|---|---|---|---|---|---|---|"]
    for a, b in zip(r["runs"]["evict"], r["runs"]["no_evict"]):
        lines.append(f"| {a['day']} | {a['item_table_rows']:,} | {a['table_mb']:.1f} | {a['train_peak_rss_mb']:,.0f} | "
                     f"{b['item_table_rows']:,} | {b['table_mb']:.1f} | {b['train_peak_rss_mb']:,.0f} |")
    if "lifecycle_warm_day_rss_vs_bound" in r["ratios"]:
        lines += ["", f"- **lifecycle_warm_day_rss_vs_bound** = {r['ratios']['lifecycle_warm_day_rss_vs_bound']:.3f}: "
                      f"{warm_day_text(r)}"]
    return "\n".join(lines)


def warm_day_text(r: dict) -> str:
    """The warm-started day furthest over the memory bound, in words.

    Args:
        r: bench_memory_growth's result.

    Returns:
        Its peak RSS against 1.3 x its table MB + 800 MB.
    """
    worst = r.get("warm_day_worst") or {}
    day = next((d for d in r["runs"].get(worst.get("chain", ""), []) if d["day"] == worst.get("day")), None)
    if day is None:
        return "no warm-started day was run."
    return (f"the worst warm-started day, {worst['day']} of the {worst['chain']} run, peaked at "
            f"{day['train_peak_rss_mb']:,.0f} MB against {PER_STATE} × {day['table_mb']:.1f} MB of tables + "
            f"{BASE_MB:,.0f} MB = {bound_mb(day['table_mb']):,.0f} MB; above the tables it held "
            f"{day['train_peak_rss_mb'] - day['table_mb']:,.0f} MB: TensorFlow and its libraries (about 740 MB "
            f"before the model is built), the warm start's read of the previous day's tables, the first step's "
            f"trace and the input pipeline.")
