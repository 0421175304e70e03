"""Evaluate a trained model on the eval split: flat metrics JSON."""
from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from features import fsio
from features.canonical import LABEL_KEY
from features.preprocessed import PreprocessedData
from trainers.data import make_dataset
from trainers.errors import TrainError
from trainers.metrics import log_loss, ndcg_at_k, rank_of_true, recall_at_k, roc_auc
from trainers.model_dir import check_data_matches, load_trained

__all__ = ["evaluate", "candidate_universe"]


def evaluate(model_dir: str, data_dir: str, out_path: str | None = None, batch_size: int = 4096) -> dict:
    """Eval-split metrics as flat keys: auc, logloss, examples (ranking) or recall_at_10, ndcg_at_10,
    examples (retrieval, against every candidate in the data)."""
    cfg, _, model = load_trained(model_dir)
    artifact = check_data_matches(cfg, PreprocessedData(data_dir), f"the model in {model_dir}")
    if artifact.row_counts.get("eval") == 0:
        raise TrainError(f"{data_dir}: the eval split is empty (nothing to evaluate on)")
    if cfg.model.task == "retrieval":
        metrics = _retrieval(cfg, model, data_dir, batch_size)
    else:
        metrics = _ranking(cfg, model, data_dir, batch_size)
    if out_path:
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        fsio.write_json(out_path, metrics, sort_keys=False, only_if_changed=True)  # reruns leave it untouched
    return metrics


def _ranking(cfg, model, data_dir: str, batch_size: int) -> dict:
    predict = tf.function(lambda b: tf.sigmoid(model(b))[:, 0], reduce_retracing=True)
    labels, probs = [], []
    for batch in make_dataset(cfg, data_dir, "eval", batch_size, training=False):
        labels.append(batch[LABEL_KEY].numpy())
        probs.append(predict(batch).numpy())
    if not labels:
        raise TrainError(f"{data_dir}/eval: the eval split is empty (nothing to evaluate on)")
    y, p = np.concatenate(labels), np.concatenate(probs)
    return {"auc": roc_auc(y, p), "logloss": log_loss(y, p), "examples": int(len(y)),
            "positive_rate": float(y.mean())}


def _candidate_ids(batch: dict, names: list[str]) -> np.ndarray:
    return np.stack([batch[n].numpy() for n in names], axis=1)


def candidate_universe(cfg, data_dir: str, batch_size: int = 4096) -> np.ndarray:
    """Every distinct candidate ID tuple in the train and eval splits, [U, len(candidate_features)]."""
    names = list(cfg.model.candidate_features)
    seen = [_candidate_ids(b, names) for split in ("train", "eval")
            for b in make_dataset(cfg, data_dir, split, batch_size, training=False)]
    return np.unique(np.concatenate(seen), axis=0)


def _retrieval(cfg, model, data_dir: str, batch_size: int, k: int = 10) -> dict:
    """Brute force: score each clicked eval row's query against ALL candidates seen in train+eval."""
    names = list(cfg.model.candidate_features)
    universe = candidate_universe(cfg, data_dir, batch_size)
    index = {tuple(row): i for i, row in enumerate(universe.tolist())}
    cand_fn = tf.function(model.candidate_embedding, reduce_retracing=True)
    query_fn = tf.function(model.query_embedding, reduce_retracing=True)
    cand = np.concatenate([cand_fn({n: tf.constant(universe[i:i + batch_size, j]) for j, n in enumerate(names)}).numpy()
                           for i in range(0, len(universe), batch_size)])
    ranks = []
    for batch in make_dataset(cfg, data_dir, "eval", batch_size, training=False):
        clicked = batch[LABEL_KEY].numpy() > 0.5
        if not clicked.any():
            continue
        queries = query_fn(batch).numpy()[clicked]
        truth = np.array([index[tuple(r)] for r in _candidate_ids(batch, names)[clicked].tolist()])
        ranks.append(rank_of_true(queries @ cand.T, truth))
    if not ranks:
        raise TrainError(f"{data_dir}/eval: no clicked rows to evaluate retrieval on")
    r = np.concatenate(ranks)
    return {f"recall_at_{k}": recall_at_k(r, k), f"ndcg_at_{k}": ndcg_at_k(r, k), "examples": int(len(r)),
            "candidates": int(len(universe))}
