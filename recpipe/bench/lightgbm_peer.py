"""LightGBM as the quality bench's ranking peer: gradient-boosted trees on the same split and the same features,
run in the peer environment (recpipe.bench.peer_env; the script is recpipe/bench/peers/lightgbm_fit.py).

Columns, read from the preprocessed shards: each single-valued sparse feature's integer ID (our vocabulary, OOV
and hash buckets) as a LightGBM categorical column; each dense feature's transformed value; each multivalent
feature (a genre list, a history of items) as its length, a count, since LightGBM has no list-valued column
(an item's own attributes are already carried by the item ID's category). Tuning: a small grid of
num_leaves x learning_rate x min_data_in_leaf, each fit with early stopping on validation AUC; the best on
validation is fit once per seed (bagging 0.8 and feature_fraction 0.8 make the seeds differ). The eval split is
exported without labels; its AUC and logloss are computed here, with the functions our models are scored by.
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import numpy as np

from recpipe.common.metrics import log_loss, roc_auc
from recpipe.features.canonical import LABEL_KEY
from recpipe.features.config import Config
from recpipe.bench.common import TF_IN_PROCESS
from recpipe.bench.peer_env import run_peer

__all__ = ["GRID", "QUICK_GRID", "Column", "lightgbm_columns", "column_values", "write_columns", "export_columns",
           "lightgbm_peer"]

GRID = {"num_leaves": (15, 63), "learning_rate": (0.03, 0.1), "min_data_in_leaf": (20, 100, 300)}
QUICK_GRID = {"num_leaves": (31,), "learning_rate": (0.1,), "min_data_in_leaf": (20, 100)}  # quick: a smoke grid
MAX_ROUNDS = 3000
EARLY_STOPPING_ROUNDS = 50
MAX_CATEGORY = 2**31 - 2  # LightGBM casts categories to int32


@dataclass(frozen=True)
class Column:
    """One column of the LightGBM matrix.

    Attributes:
        name: the feature it comes from.
        kind: "categorical" (a single-valued sparse feature's ID), "count" (a multivalent feature's length) or
            "dense" (a dense feature's transformed value).
    """
    name: str
    kind: str


def lightgbm_columns(cfg: Config) -> list[Column]:
    """The columns LightGBM gets for a config: its sparse features, then its dense ones.

    Args:
        cfg: a ranking config.

    Returns:
        One Column per feature.
    """
    return ([Column(f.name, "count" if f.multivalent else "categorical") for f in cfg.features.sparse]
            + [Column(d.name, "dense") for d in cfg.features.dense])


def column_values(columns: list[Column], arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """One batch as a LightGBM matrix (float64 holds every ID below 2**53 exactly).

    Args:
        columns: lightgbm_columns'.
        arrays: per column name, a [rows] array: the IDs (categorical), the lengths (count) or the values (dense).

    Returns:
        [rows, len(columns)] float64.

    Raises:
        ValueError: a categorical ID that is negative or beyond LightGBM's int32 categories, or arrays of
            different lengths.
    """
    out = np.column_stack([np.asarray(arrays[c.name], dtype=np.float64).reshape(-1) for c in columns])
    for j, c in enumerate(columns):
        ids = out[:, j]
        if c.kind == "categorical" and len(ids) and (ids.min() < 0 or ids.max() > MAX_CATEGORY):
            raise ValueError(f"LightGBM columns: {c.name} has IDs in [{ids.min():.0f}, {ids.max():.0f}]; a "
                             f"category must lie in [0, {MAX_CATEGORY}]")
    return out


def _read_split(cfg: Config, data_dir: str, split: str, columns: list[Column]) -> tuple[np.ndarray, np.ndarray]:
    from recpipe.trainers.data import make_dataset  # TensorFlow: only when reading shards
    parts, labels = [], []
    for batch in make_dataset(cfg, data_dir, split, 65_536, training=False):
        arrays = {c.name: (batch[c.name].row_lengths() if c.kind == "count" else batch[c.name]).numpy()
                  for c in columns}
        parts.append(column_values(columns, arrays))
        labels.append(batch[LABEL_KEY].numpy())
    if not parts:
        raise ValueError(f"{data_dir}/{split}: the {split} split is empty")
    return np.concatenate(parts), np.concatenate(labels).astype(np.float64)


def write_columns(path: str, splits: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """The file the LightGBM peer reads: x_SPLIT for every split, y_SPLIT for all but eval (the peer never
    sees an eval label).

    Args:
        path: the .npz to write.
        splits: per split name, (x, y) as column_values and the labels.
    """
    arrays = {}
    for split, (x, y) in splits.items():
        arrays[f"x_{split}"] = x
        if split != "eval":
            arrays[f"y_{split}"] = y
    np.savez(path, **arrays)


def export_columns(cfg: Config, data_dir: str, columns: list[Column], path: str) -> dict[str, np.ndarray]:
    """Write train, validation and eval as LightGBM columns into one .npz (write_columns).

    Args:
        cfg: the config the data was preprocessed with.
        data_dir: the preprocessed data (with a validation split).
        columns: lightgbm_columns(cfg).
        path: the .npz to write.

    Returns:
        The labels of validation and eval, by split.

    Raises:
        ValueError: a split is empty, or an ID cannot be a LightGBM category.
    """
    with TF_IN_PROCESS:  # tf.data in this process, beside the suite's other threads
        splits = {split: _read_split(cfg, data_dir, split, columns) for split in ("train", "validation", "eval")}
    write_columns(path, splits)
    return {split: splits[split][1] for split in ("validation", "eval")}


def lightgbm_peer(cfg: Config, data_dir: str, work: str, seeds: list[int], grid: Optional[dict] = None,
                  max_rounds: int = MAX_ROUNDS, say: Optional[Callable[[str], None]] = None) -> dict:
    """Tune LightGBM on validation, fit it once per seed, score it on eval.

    Args:
        cfg: a ranking config.
        data_dir: its preprocessed data, with a validation split.
        work: a folder for the exchanged files.
        seeds: the seeds of the final fits (the first also fits the grid).
        grid: {num_leaves, learning_rate, min_data_in_leaf: values} (default GRID).
        max_rounds: the most boosting rounds of a fit (early stopping ends it sooner).
        say: progress messages.

    Returns:
        {auc_mean, auc_sd, logloss_mean, logloss_sd, "params" (the choice), "trials" (each configuration's
        validation AUC and rounds), "runs" (per seed: auc, logloss, validation_auc, best_iteration), "columns"
        (how many of each kind), "seconds"}.

    Raises:
        RuntimeError: the peer failed.
        ValueError: a split is empty, or an ID cannot be a LightGBM category.
    """
    t0 = time.perf_counter()
    grid = grid or GRID
    os.makedirs(work, exist_ok=True)
    columns = lightgbm_columns(cfg)
    labels = export_columns(cfg, data_dir, columns, os.path.join(work, "columns.npz"))
    request = {"data": os.path.join(work, "columns.npz"), "columns": [c.name for c in columns],
               "categorical": [j for j, c in enumerate(columns) if c.kind == "categorical"],
               "configs": [dict(zip(grid, values)) for values in itertools.product(*grid.values())],
               "seeds": seeds, "max_rounds": max_rounds, "early_stopping_rounds": EARLY_STOPPING_ROUNDS,
               "threads": 1, "predictions": os.path.join(work, "predictions.npz"),
               "report": os.path.join(work, "report.json")}
    path = os.path.join(work, "request.json")
    with open(path, "w") as fh:
        json.dump(request, fh, indent=1)
    run_peer("lightgbm_fit", path, say=say)
    with open(request["report"]) as fh:
        report = json.load(fh)
    runs = []
    with np.load(request["predictions"]) as p:
        for r in report["runs"]:
            seed = r["seed"]
            ev = np.clip(p[f"eval_{seed}"], 0.0, 1.0)
            runs.append({"seed": seed, "auc": roc_auc(labels["eval"], ev), "logloss": log_loss(labels["eval"], ev),
                         "validation_auc": roc_auc(labels["validation"], p[f"validation_{seed}"]),
                         "best_iteration": r["best_iteration"]})

    def sd(key: str) -> float:
        return statistics.pstdev(r[key] for r in runs) if len(runs) > 1 else 0.0
    return {"auc_mean": statistics.fmean(r["auc"] for r in runs), "auc_sd": sd("auc"),
            "logloss_mean": statistics.fmean(r["logloss"] for r in runs), "logloss_sd": sd("logloss"),
            "params": report["chosen"], "trials": report["trials"], "runs": runs,
            "columns": {k: sum(c.kind == k for c in columns) for k in ("categorical", "count", "dense")},
            "lightgbm": report["version"], "seconds": round(time.perf_counter() - t0, 1)}
