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
from trainers.metrics import log_loss, mrr_at_k, ndcg_at_k, rank_of_true, recall_at_k, reliability_table, roc_auc

__all__ = ["score", "ranking_scores", "retrieval_scores", "candidate_universe", "baselines", "HIGHER_IS_BETTER"]

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
    positive_rate = float(y.mean())
    return {"auc": roc_auc(y, p), "logloss": log_loss(y, p), "examples": int(len(y)), "positive_rate": positive_rate,
            # mean prediction / observed rate: 1 when calibrated on average
            "calibration": float(p.mean()) / positive_rate if positive_rate > 0 else float("nan"),
            "reliability": reliability_table(y, p)}


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
                     ks: tuple[int, ...] = (10, 50, 100),
                     candidate_splits: tuple[str, ...] = ("train", "validation", "eval")) -> dict:
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
    return {**_rank_metrics(r, ks), "examples": int(len(r)), "candidates": int(len(universe))}


def _rank_metrics(ranks: np.ndarray, ks: tuple[int, ...]) -> dict:
    out: dict = {}
    for k in ks:
        out.update({f"recall_at_{k}": recall_at_k(ranks, k), f"ndcg_at_{k}": ndcg_at_k(ranks, k),
                    f"mrr_at_{k}": mrr_at_k(ranks, k)})
    return out


def _popularity_ranks(popularity: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """0-based rank of each true candidate when every candidate is scored by its popularity (ties
    count against it, as rank_of_true)."""
    ordered = np.sort(popularity)
    v = popularity[truth]
    above = len(ordered) - np.searchsorted(ordered, v, side="right")
    ties = np.searchsorted(ordered, v, side="right") - np.searchsorted(ordered, v, side="left")
    return above + ties - 1


def baselines(cfg: Config, data_dir: str, split: str = "eval", batch_size: int = 65_536,
              ks: tuple[int, ...] = (10, 50, 100)) -> dict:
    """The trivial models' scores on `split`, learned from the train split, to print beside a model's:
    ranking: the constant prediction of train's click rate (AUC 0.5 by construction; its logloss is
    the reference); retrieval: most-popular candidates (clicks in train)."""
    train = list(make_dataset(cfg, data_dir, "train", batch_size, training=False))
    if cfg.model.task != "retrieval":
        rate = float(np.concatenate([b[LABEL_KEY].numpy() for b in train]).mean())
        y = np.concatenate([b[LABEL_KEY].numpy() for b in make_dataset(cfg, data_dir, split, batch_size,
                                                                         training=False)])
        return {"constant_rate": {"prediction": rate, "auc": 0.5, "logloss": log_loss(y, np.full(len(y), rate))}}
    names = list(cfg.model.candidate_features)
    seen = ("train", "validation", "eval") if split == "eval" else ("train", split)
    universe = candidate_universe(cfg, data_dir, batch_size, seen)
    index = {tuple(row): i for i, row in enumerate(universe.tolist())}
    popularity = np.zeros(len(universe))
    for b in train:
        clicked = b[LABEL_KEY].numpy() > 0.5
        np.add.at(popularity, [index[tuple(r)] for r in _candidate_ids(b, names)[clicked].tolist()], 1.0)
    truth = [index[tuple(r)] for b in make_dataset(cfg, data_dir, split, batch_size, training=False)
             for r in _candidate_ids(b, names)[b[LABEL_KEY].numpy() > 0.5].tolist()]
    return {"most_popular": _rank_metrics(_popularity_ranks(popularity, np.asarray(truth, dtype=np.int64)), ks)}
