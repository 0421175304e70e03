"""Lifecycle benchmark: the Airflow daily DAG (real Airflow, `dag.test` per day) over consecutive days
of a generated log whose item population drifts (recpipe.pipeline.synthetic `item_drift`: new items appear,
old ones stop), with the item vocabulary admitting over a window and evicting unseen items
(recpipe.pipeline.lifecycle), against the same DAG without eviction on the same log and with eviction on a
drift-free log. Every day is pushed (bless tolerance 1), so every day's export runs its skew check.
The runs go at once, each DAG in its own Airflow home (they report sizes and AUCs, not speed).

One more run, on the drifting log, has no lifecycle at all: its item table is hashed (HASHED_ITEM_ROWS
buckets, several times the whole catalogue), so every item has a row from its first row on, with
no admission, eviction or slot reuse: what the lifecycle costs is the drifting runs' AUC difference.

In the full run, the evicting runs on the drifting and the drift-free logs also go on a second pair of
logs whose items keep one popularity for life (recpipe.pipeline.synthetic item_popularity="lifelong": the items that
stop take a random share of the clicks, where in the first pair they are the most clicked):
lifecycle_auc_gap_vs_no_drift_lifelong (reported, no target) says whether the gap comes with which items stop
or with the churn itself.

Per run and day: the item table's slots and live values, the day's eval AUC, the skew check.
Ratio keys: lifecycle_item_slots_vs_max_size (the largest table with eviction ÷ max_size, <= 1),
lifecycle_auc_gap_vs_no_drift (the largest |AUC with drift and eviction − AUC without drift| over the
days), lifecycle_auc_gap_vs_no_lifecycle (the largest |AUC with the lifecycle − AUC with the hashed
item table|, both on the drifting log), lifecycle_no_evict_slots_vs_evict (how much larger the table
grows without eviction).

Pruned exports (`recpipe export --prune-unseen-days 1`): each run's last model is exported in full and
with the values not seen on its last day pruned, side by side: SavedModel and weight bytes, in-process
one-row QPS (round-robin, median of `reps`) and AUC on the day's raw eval sample through each SavedModel.
Keys, of the drifting run with eviction: export_prune_{bytes,weight_bytes,qps}_vs_fp32,
export_prune_auc_delta_abs.

Oracle AUCs: the logs carry each row's true click probability (recpipe.pipeline.synthetic `truth_column`), so
each day's eval rows (split as the Beam job splits them) are also scored by the hidden model itself:
the best AUC any model reaches on them. The drifting and drift-free logs are different rows from
different hidden item weights, and their oracle AUCs differ per day too; lifecycle_auc_gap_beyond_oracle
is the largest |(AUC gap between the runs) − (oracle AUC gap between their logs)| over the days: what
the lifecycle itself loses or gains against the drift-free run, the logs' own difference taken out
(reported, no target).

Memory growth (recpipe.bench.lifecycle_memory): peak trainer RSS against table size over 10 days
(2 quick), with and without eviction, measured while the DAG runs go (peak RSS is per process).

The quick run (CI's smoke run) goes over 2 days, and the drift-free and hashed runs over the first alone:
the ratios compare the days both runs have, and only the evicting drifting run's second day has values to prune.
"""
from __future__ import annotations

import copy
import datetime as dt
import os
import shutil
import statistics
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
import pyarrow.parquet as pq
import yaml

from recpipe.common import fsio
from recpipe.features.artifact import TransformArtifact
from recpipe.common.metrics import auc_standard_error, roc_auc
from recpipe.features.preprocessed import PreprocessedData
from recpipe.features.transform import request_from_arrow
from recpipe.pipeline.analysis import split_cutoffs_from_histogram, ts_histogram
from recpipe.pipeline.synthetic import TRUTH_COLUMN
from recpipe.airflow_local import LocalAirflow
from recpipe.bench.common import generate_once
from recpipe.bench.export import folder_bytes, measure_qps
from recpipe.bench.lifecycle_memory import bench_memory_growth
from recpipe.bench.lifecycle_memory import markdown as memory_markdown
from recpipe.serving.export.savedmodel import export_model, sample_auc
from recpipe.serving.server.registry import load_version
from recpipe.serving.version import ExportBase

__all__ = ["bench_lifecycle", "markdown", "lifecycle_config"]

START = dt.date(2026, 3, 1)
PRUNE_DAYS = 1
HASHED_ITEM_ROWS = 16_384  # the no-lifecycle run's item table: 4.6x the full run's 3,600-item catalogue
# Adagrad's rate: at 0.05 the day-1 model reached eval AUC 0.58 and the runs' AUCs were still climbing
# their learning curves by day 5 (0.70), so the gap between two logs measured where each run was on its
# curve; at 0.2 day 1 reaches 0.67 and the drift-free run levels off near 0.74
LEARNING_RATE = 0.2


def lifecycle_config(steps: int, max_size: int, evict: bool, eval_fraction: float = 0.2,
                     hashed_items: int | None = None) -> dict:
    """A compact synthetic-log config whose item vocabulary admits over 2 days and evicts items unseen
    for 2 days (evict=False: the plain growing vocabulary, for comparison; hashed_items: no vocabulary,
    the item table hashed into that many rows); the last `eval_fraction` of each day is its eval split."""
    item_vocab = {"min_count": 2, "oov_buckets": 4}
    if evict:
        item_vocab.update(window_days=2, evict_unseen_days=2, max_size=max_size)
    item = {"name": "item_id", "column": "item_id", "embedding_dim": 8}
    item.update({"hash_buckets": hashed_items} if hashed_items else {"vocab": item_vocab})
    return {
        "name": "lifecycle_ctr", "input": {"timestamp": "ts"}, "split": {"eval_fraction": eval_fraction},
        "label": {"column": "label"},
        "features": {
            "sparse": [{"name": "user_id", "column": "user_id", "hash_buckets": 2000, "embedding_dim": 8},
                       item,
                       {"name": "hist", "column": "hist_items", "multivalent": True,
                        "share_embedding_with": "item_id"},
                       *[{"name": f"C{i}", "column": f"C{i}", "vocab": {"min_count": 2, "oov_buckets": 1},
                          "embedding_dim": 8} for i in range(1, 7)]],
            "dense": [{"name": f"I{i}", "column": f"I{i}", "transform": "log_zscore", "fill": 0} for i in (1, 2, 3)]},
        "model": {"task": "ranking", "type": "dcn_v2", "cross_layers": 1, "deep_layers": [64, 32]},
        "train": {"batch_size": 256, "learning_rate": LEARNING_RATE, "optimizer": "adagrad", "steps": steps,
                  "checkpoint_every": steps},
    }


def _run(work: str, name: str, log: str, cfg: dict, days: list[str], say: Callable[[str], None]) -> list[dict]:
    """The daily DAG over `days` for one config, in its own Airflow home (its own metadata DB), so the
    runs can go at once: two dag.test runs of one DAG and logical day would collide in one DB."""
    root = os.path.join(work, name)
    os.makedirs(root, exist_ok=True)
    airflow = LocalAirflow(os.path.join(root, "airflow_home")).migrate()
    cfg_path, project = os.path.join(root, "config.yaml"), os.path.join(root, "project.yaml")
    with open(cfg_path, "w") as fh:
        yaml.safe_dump(cfg, fh)
    with open(project, "w") as fh:
        yaml.safe_dump({"log_root": log, "work_root": os.path.join(root, "work"),
                        "export_base": os.path.join(root, "serving"), "config": cfg_path, "bless_tolerance": 1.0}, fh)
    out = []
    for day in days:
        say(f"bench lifecycle: {name}: {day}")
        r = airflow.run_day(project, day)
        if r["state"] != "success":
            raise RuntimeError(f"bench lifecycle: {name} {day}: the DAG run ended {r['state']}: {r['tasks']}")
        day_dir = os.path.join(root, "work", day)
        art = TransformArtifact.read(os.path.join(day_dir, "preprocessed", "transform"))
        values = art.vocabularies.get("item_id")  # None: the item table is hashed (no lifecycle)
        newest = ExportBase(os.path.join(root, "serving")).versions()[-1]
        skew = newest.skew_report()
        metrics = fsio.read_json(os.path.join(day_dir, "metrics.json"))
        positives = round(metrics["examples"] * metrics["positive_rate"])
        out.append({"day": day, "item_slots": None if values is None else len(values),
                    "item_live": None if values is None else sum(v is not None for v in values),
                    "item_table_rows": art.table_sizes()["item_id"], "auc": metrics["auc"],
                    "eval_examples": metrics["examples"],
                    "auc_se": auc_standard_error(metrics["auc"], positives, metrics["examples"] - positives),
                    "skew_passed": bool(skew["passed"]), "skew_max_abs_diff": skew["max_abs_diff"],
                    "version": newest.version})
    return out


def _pruned_export(root: str, day: str, reps: int, seconds: float, say: Callable[[str], None]) -> dict:
    """The run's model of `day` exported as version 1 in full and as version 2 pruned (PRUNE_DAYS), compared."""
    day_dir, base = os.path.join(root, "work", day), os.path.join(root, "pruned_export")
    model_dir, data = os.path.join(day_dir, "model"), PreprocessedData(os.path.join(day_dir, "preprocessed"))
    shutil.rmtree(base, ignore_errors=True)
    say(f"bench lifecycle: {os.path.basename(root)}: exporting {day} in full and pruned")
    export_model(model_dir, base, version=1, data_dir=data.root)
    export_model(model_dir, base, version=2, data_dir=data.root, prune_unseen_days=PRUNE_DAYS)
    versions = dict(zip(("full", "pruned"), ExportBase(base).versions()))
    sample = pq.read_table(data.eval_sample_parquet)
    loaded = {k: load_version(v.path, v.version) for k, v in versions.items()}
    requests = [request_from_arrow(sample.slice(i, 1), loaded["full"].inputs, loaded["full"].list_inputs)
                for i in range(min(64, sample.num_rows))]
    qps: dict[str, list[float]] = {k: [] for k in loaded}
    for _ in range(reps):  # round-robin, as the export suite
        for k, lv in loaded.items():
            qps[k].append(measure_qps(lv.fn, requests, seconds))
    table = versions["pruned"].meta().weights["pruned"]["tables"]["item_id"]
    out = {k: {"bytes": folder_bytes(v.path), "weight_bytes": folder_bytes(os.path.join(v.path, "variables")),
               "sample_auc": sample_auc(v, sample), "qps": statistics.median(qps[k]), "qps_reps": qps[k]}
           for k, v in versions.items()}
    out["full"]["item_rows"], out["pruned"]["item_rows"] = table["rows_before"], table["rows_after"]
    out["sample_rows"] = sample.num_rows
    return out


def oracle_aucs(log: str, days: list[str], eval_fraction: float) -> list[float]:
    """Per day: the AUC of the hidden model's own probabilities on the day's eval rows (the last
    eval_fraction by timestamp, cut as the Beam job cuts them: recpipe.pipeline.analysis)."""
    out = []
    for day in days:
        t = pq.read_table(os.path.join(log, f"dt={day}"), columns=["ts", "label", TRUTH_COLUMN])
        _, cutoff = split_cutoffs_from_histogram(ts_histogram(t, "ts"), eval_fraction)
        eval_rows = t.column("ts").to_numpy() > cutoff
        out.append(roc_auc(t.column("label").to_numpy()[eval_rows].astype(np.float64),
                           t.column(TRUTH_COLUMN).to_numpy()[eval_rows]))
    return out


def auc_gap_ratios(results: dict[str, list[dict]]) -> dict[str, float]:
    """The largest |per-day difference| of the evicting drifting run's eval AUC from the drift-free run's
    and from the hashed (no lifecycle) run's, and from the drift-free run's beyond the oracles' own gap, over
    the days both runs have."""
    def per_day(other: str, key: str = "auc") -> list[float]:
        return [a[key] - b[key] for a, b in zip(results["drift_evict"], results[other])]
    gaps, truth = per_day("stable_evict"), per_day("stable_evict", "oracle_auc")
    out = {"lifecycle_auc_gap_vs_no_drift": max(map(abs, gaps)),
           "lifecycle_auc_gap_vs_no_lifecycle": max(map(abs, per_day("drift_hashed"))),
           "lifecycle_auc_gap_beyond_oracle": max(abs(g - t) for g, t in zip(gaps, truth))}
    if "drift_evict_lifelong" in results:  # the same pair of runs on logs whose items keep their popularity
        pairs = zip(results["drift_evict_lifelong"], results["stable_evict_lifelong"])
        out["lifecycle_auc_gap_vs_no_drift_lifelong"] = max(abs(a["auc"] - b["auc"]) for a, b in pairs)
    return out


def bench_lifecycle(work: str, say: Callable[[str], None], quick: bool = False, reps: int = 3) -> dict:
    n_days = 2 if quick else 5
    # the full run judges AUC gaps of 0.01 between two logs' days: 80,000 eval rows a day put the standard
    # error of such a difference near 0.003 (with 4,000 it was 0.012, the band itself inside the noise);
    # the 20,000 train rows a day are about what they were (16,000)
    per_day, eval_fraction = (3_000, 0.2) if quick else (100_000, 0.8)
    num_items, drift = (300, 60) if quick else (2_000, 400)
    max_size = int(num_items * 1.25)
    steps = 10 if quick else 300
    days = [(START + dt.timedelta(days=i)).isoformat() for i in range(n_days)]
    # quick: the runs the evicting drifting run is compared with go over its first day only (the ratios compare
    # the days both ran); its own second day is the one whose export has values to prune
    compared = days[:1] if quick else days
    kinds = [("drift", drift, "window"), ("stable", 0, "window")]
    if not quick:  # and the same pair of logs whose items keep one popularity for life (recpipe.pipeline.synthetic)
        kinds += [("drift_lifelong", drift, "lifelong"), ("stable_lifelong", 0, "lifelong")]
    logs = {name: generate_once(per_day * n_days, os.path.join(work, f"log_{name}"), seed=5, days=n_days,
                                start_date=START, num_users=2_000, num_items=num_items, item_drift=item_drift,
                                truth_column=True, item_popularity=popularity)
            for name, item_drift, popularity in kinds}
    evicting = lifecycle_config(steps, max_size, evict=True, eval_fraction=eval_fraction)
    runs = {"drift_evict": (logs["drift"], evicting, days),
            "stable_evict": (logs["stable"], copy.deepcopy(evicting), compared),
            "drift_hashed": (logs["drift"], lifecycle_config(steps, max_size, evict=False, eval_fraction=eval_fraction,
                                                             hashed_items=HASHED_ITEM_ROWS), compared)}
    if not quick:
        runs["drift_no_evict"] = (logs["drift"], lifecycle_config(steps, max_size, evict=False,
                                                                  eval_fraction=eval_fraction), days)
        for name in ("drift", "stable"):
            runs[f"{name}_evict_lifelong"] = (logs[f"{name}_lifelong"], copy.deepcopy(evicting), days)
    # the runs at once, and the memory growth runs beside them: they share nothing but the (read-only)
    # logs, and what they report is table sizes, AUCs, skew checks and each process's own peak RSS, not
    # speed; one after another they were most of the suite's time. The pruned exports' QPS is measured
    # after all of them, alone.
    with ThreadPoolExecutor(len(runs) + 1) as pool:
        growth = pool.submit(bench_memory_growth, work, say, quick)
        started = {name: pool.submit(_run, work, name, log, cfg, run_days, say)
                   for name, (log, cfg, run_days) in runs.items()}
        results = {name: job.result() for name, job in started.items()}
        memory = growth.result()
    oracle = {log: oracle_aucs(log, days, eval_fraction) for log in logs.values()}
    for name, (log, _, _) in runs.items():
        for d, auc in zip(results[name], oracle[log]):
            d["oracle_auc"] = auc
    # every run over all the days with item values (a hashed table has none)
    pruned = {name: _pruned_export(os.path.join(work, name), days[-1], reps, 0.3 if quick else 2.0, say)
              for name in results if results[name][-1]["item_slots"] is not None and len(results[name]) == n_days}
    ratios = {"lifecycle_item_slots_vs_max_size": max(d["item_slots"] for d in results["drift_evict"]) / max_size,
              **auc_gap_ratios(results),
              "lifecycle_skew_checks_passed": sum(d["skew_passed"] for r in results.values() for d in r)
              / sum(len(r) for r in results.values())}
    p = pruned["drift_evict"]
    ratios.update({"export_prune_bytes_vs_fp32": p["pruned"]["bytes"] / p["full"]["bytes"],
                   "export_prune_weight_bytes_vs_fp32": p["pruned"]["weight_bytes"] / p["full"]["weight_bytes"],
                   "export_prune_qps_vs_fp32": p["pruned"]["qps"] / p["full"]["qps"],
                   "export_prune_auc_delta_abs": abs(p["pruned"]["sample_auc"] - p["full"]["sample_auc"])})
    ratios.update(memory["ratios"])
    if "drift_no_evict" in results:
        ratios["lifecycle_no_evict_slots_vs_evict"] = (results["drift_no_evict"][-1]["item_slots"]
                                                       / results["drift_evict"][-1]["item_slots"])
    return {"suite": "lifecycle", "quick": quick, "runs": results, "pruned_exports": pruned,
            "memory_growth": memory, "ratios": ratios,
            "settings": {"prune_unseen_days": PRUNE_DAYS, "reps": reps, "days": days, "rows_per_day": per_day,
                         "eval_fraction": eval_fraction,
                         "items_per_day": num_items, "item_drift": drift, "max_size": max_size, "window_days": 2,
                         "evict_unseen_days": 2, "steps_per_day": steps, "learning_rate": LEARNING_RATE,
                         "hashed_item_rows": HASHED_ITEM_ROWS,
                         "item_popularity": {name: popularity for name, _, popularity in kinds}}}


def markdown(r: dict) -> str:
    s = r["settings"]
    lines = [f"# Lifecycle benchmark: the Airflow daily DAG over {len(s['days'])} days of a drifting item population",
             "",
             f"{s['rows_per_day']:,} rows a day (the last {s.get('eval_fraction', 0.2):.0%} of each day its eval "
             f"split); {s['items_per_day']:,} active items a day, {s['item_drift']:,} new "
             f"ones a day (as many stop); item vocabulary: min_count 2 over window_days {s['window_days']}, "
             f"evict_unseen_days {s['evict_unseen_days']}, max_size {s['max_size']:,}; {s['steps_per_day']} "
             f"warm-started steps a day (Adagrad, learning rate {s.get('learning_rate', 0.05)}); every day pushed "
             f"and skew-checked. drift_hashed: the drifting log with no lifecycle, its item table hashed."
             + (" *_lifelong: logs whose items keep one popularity from their first day to their last (the items "
                "that stop take a random share of the clicks), where the others' items are Zipf-ranked from the "
                "day's window start (the items that stop are the most clicked)."
                if "drift_evict_lifelong" in r["runs"] else ""), "",
             "| run | day | item slots | live items | eval AUC | oracle AUC (the hidden model) | "
             "skew check (max abs diff) |",
             "|---|---|---|---|---|---|---|"]
    for name, days in r["runs"].items():
        for d in days:
            oracle = f"{d['oracle_auc']:.4f}" if "oracle_auc" in d else "n/a"
            slots, live = ((f"{d['item_slots']:,}", f"{d['item_live']:,}") if d["item_slots"] is not None
                           else (f"hashed: {s['hashed_item_rows']:,} rows", "n/a"))  # written with drift_hashed
            lines.append(f"| {name} | {d['day']} | {slots} | {live} | {d['auc']:.4f} | "
                         f"{oracle} | {'passed' if d['skew_passed'] else 'FAILED'} ({d['skew_max_abs_diff']:.2g}) |")
    if r.get("pruned_exports"):
        lines += ["", f"Each run's last model exported in full and with `--prune-unseen-days {s['prune_unseen_days']}` "
                  f"(item values not seen on the last day map to OOV): bytes of the SavedModel folder and of its "
                  f"variables/, in-process one-row QPS (median of {s['reps']} round-robin runs), AUC of each "
                  f"SavedModel on the day's raw eval sample.", "",
                  "| run | export | item table rows | MB | ÷ full | weights MB | ÷ full | QPS | ÷ full | sample AUC "
                  "| Δ AUC |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, p in r["pruned_exports"].items():
            f = p["full"]
            for kind in ("full", "pruned"):
                o = p[kind]
                lines.append(f"| {name} | {kind} | {o['item_rows']:,} | {o['bytes'] / 1e6:.2f} | "
                             f"{o['bytes'] / f['bytes']:.3f} | {o['weight_bytes'] / 1e6:.2f} | "
                             f"{o['weight_bytes'] / f['weight_bytes']:.3f} | {o['qps']:,.0f} | "
                             f"{o['qps'] / f['qps']:.2f} | {o['sample_auc']:.4f} | "
                             f"{o['sample_auc'] - f['sample_auc']:+.4f} |")
    if r.get("memory_growth"):
        lines += ["", memory_markdown(r["memory_growth"])]
    lines += ["", *[f"- **{k}**: {v:.4g}" for k, v in r["ratios"].items()], "",
              "Reproduce: `.venv/bin/recpipe bench lifecycle`.", ""]
    return "\n".join(lines)
