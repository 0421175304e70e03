"""Scores of a built model on one split of the preprocessed data: flat metric dicts.

The eval split is scored once, at the end (trainers.evaluate); the validation split at every
checkpoint while training (trainers.validation). Both read through here, so they never disagree.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from features.canonical import LABEL_KEY
from features.config import Config
from trainers.data import make_dataset
from trainers.errors import TrainError
from trainers.metrics import log_loss, ndcg_at_k, rank_of_true, recall_at_k, roc_auc

__all__ = ["score", "ranking_scores", "retrieval_scores", "candidate_universe", "HIGHER_IS_BETTER"]

# which way each selectable metric improves
HIGHER_IS_BETTER = {"auc": True, "logloss": False, "recall_at_10": True, "ndcg_at_10": True}


def score(cfg: Config, model: tf.keras.Model, data_dir: str, split: str, batch_size: int = 4096) -> dict:
    if cfg.model.task == "retrieval":
        # candidates: those seen up to and including the scored split (eval also sees validation's)
        seen = ("train", "validation", "eval") if split == "eval" else ("train", split)
        return retrieval_scores(cfg, model, data_dir, split, batch_size, candidate_splits=seen)
    return ranking_scores(cfg, model, data_dir, split, batch_size)


def ranking_scores(cfg: Config, model: tf.keras.Model, data_dir: str, split: str, batch_size: int = 4096) -> dict:
    predict = tf.function(lambda b: tf.sigmoid(model(b))[:, 0], reduce_retracing=True)
    labels, probs = [], []
    for batch in make_dataset(cfg, data_dir, split, batch_size, training=False):
        labels.append(batch[LABEL_KEY].numpy())
        probs.append(predict(batch).numpy())
    if not labels:
        raise TrainError(f"{data_dir}/{split}: the {split} split is empty (nothing to score)")
    y, p = np.concatenate(labels), np.concatenate(probs)
    if not np.isfinite(p).all():
        raise TrainError(f"{data_dir}/{split}: the model predicts NaN/inf for {int((~np.isfinite(p)).sum())} rows")
    return {"auc": roc_auc(y, p), "logloss": log_loss(y, p), "examples": int(len(y)),
            "positive_rate": float(y.mean())}


def _candidate_ids(batch: dict, names: list[str]) -> np.ndarray:
    return np.stack([batch[n].numpy() for n in names], axis=1)


def candidate_universe(cfg: Config, data_dir: str, batch_size: int = 4096,
                       splits: tuple[str, ...] = ("train", "validation", "eval")) -> np.ndarray:
    """Every distinct candidate ID tuple in the given splits, [U, len(candidate_features)]."""
    from features.preprocessed import PreprocessedData
    names = list(cfg.model.candidate_features)
    data = PreprocessedData(data_dir)
    seen = [_candidate_ids(b, names) for split in splits if data.shard_files(split)
            for b in make_dataset(cfg, data_dir, split, batch_size, training=False)]
    return np.unique(np.concatenate(seen), axis=0)


def retrieval_scores(cfg: Config, model: tf.keras.Model, data_dir: str, split: str, batch_size: int = 4096,
                     k: int = 10, candidate_splits: tuple[str, ...] = ("train", "validation", "eval")) -> dict:
    """Brute force: score each clicked row's query against ALL candidates seen in `candidate_splits`."""
    names = list(cfg.model.candidate_features)
    universe = candidate_universe(cfg, data_dir, batch_size, candidate_splits)
    index = {tuple(row): i for i, row in enumerate(universe.tolist())}
    cand_fn = tf.function(model.candidate_embedding, reduce_retracing=True)
    query_fn = tf.function(model.query_embedding, reduce_retracing=True)
    cand = np.concatenate([cand_fn({n: tf.constant(universe[i:i + batch_size, j]) for j, n in enumerate(names)}).numpy()
                           for i in range(0, len(universe), batch_size)])
    ranks = []
    for batch in make_dataset(cfg, data_dir, split, batch_size, training=False):
        clicked = batch[LABEL_KEY].numpy() > 0.5
        if not clicked.any():
            continue
        queries = query_fn(batch).numpy()[clicked]
        truth = np.array([index[tuple(r)] for r in _candidate_ids(batch, names)[clicked].tolist()])
        ranks.append(rank_of_true(queries @ cand.T, truth))
    if not ranks:
        raise TrainError(f"{data_dir}/{split}: no clicked rows to score retrieval on")
    r = np.concatenate(ranks)
    return {f"recall_at_{k}": recall_at_k(r, k), f"ndcg_at_{k}": ndcg_at_k(r, k), "examples": int(len(r)),
            "candidates": int(len(universe))}
