"""Exact evaluation metrics in NumPy (no threshold bucketing)."""
from __future__ import annotations

import numpy as np

__all__ = ["HIGHER_IS_BETTER", "roc_auc", "auc_standard_error", "log_loss", "rank_of_true", "recall_at_k", "ndcg_at_k",
           "mrr_at_k", "reliability_table"]

# which way each metric a training run can select checkpoints or models by improves
HIGHER_IS_BETTER = {"auc": True, "logloss": False, "recall_at_10": True, "ndcg_at_10": True,
                    "seen_excluded_recall_at_10": True, "seen_excluded_ndcg_at_10": True}


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum formula, ties counted half (infinite scores too). NaN if one
    class."""
    labels = np.asarray(labels, dtype=np.float64).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    # average rank within each run of tied scores
    boundaries = np.flatnonzero(sorted_scores[1:] != sorted_scores[:-1]) + 1  # not np.diff: -inf - -inf is NaN
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(scores)]])
    avg = (starts + ends - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def auc_standard_error(auc: float, positives: int, negatives: int) -> float:
    """The standard error of an AUC measured on `positives` + `negatives` examples (Hanley & McNeil,
    Radiology 1982): how far the same model's AUC moves between eval sets of that size."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = (auc * (1 - auc) + (positives - 1) * (q1 - auc * auc) + (negatives - 1) * (q2 - auc * auc)) \
        / (positives * negatives)
    return float(np.sqrt(max(var, 0.0)))


def log_loss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    labels = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def rank_of_true(scores: np.ndarray, true_index: np.ndarray) -> np.ndarray:
    """0-based rank of each row's true column among all columns (ties count against it)."""
    true_scores = scores[np.arange(len(true_index)), true_index]
    return (scores > true_scores[:, None]).sum(axis=1) + (scores == true_scores[:, None]).sum(axis=1) - 1


def recall_at_k(ranks: np.ndarray, k: int) -> float:
    return float(np.mean(ranks < k)) if len(ranks) else float("nan")


def ndcg_at_k(ranks: np.ndarray, k: int) -> float:
    """One relevant item per query: DCG = 1/log2(rank + 2) when it is in the top k; the ideal DCG is 1."""
    if not len(ranks):
        return float("nan")
    return float(np.mean(np.where(ranks < k, 1.0 / np.log2(ranks + 2.0), 0.0)))


def mrr_at_k(ranks: np.ndarray, k: int) -> float:
    """Mean reciprocal rank, 0 for a true item outside the top k."""
    if not len(ranks):
        return float("nan")
    return float(np.mean(np.where(ranks < k, 1.0 / (ranks + 1.0), 0.0)))


def reliability_table(labels: np.ndarray, probs: np.ndarray, bins: int = 10) -> list[dict]:
    """Calibration by equal-width prediction bins: rows, mean prediction and observed rate per
    non-empty bin (a calibrated model has the two equal)."""
    labels = np.asarray(labels, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    which = np.minimum((probs * bins).astype(int), bins - 1)
    out = []
    for b in range(bins):
        mask = which == b
        if mask.any():
            out.append({"bin": [b / bins, (b + 1) / bins], "rows": int(mask.sum()),
                        "mean_prediction": float(probs[mask].mean()), "observed_rate": float(labels[mask].mean())})
    return out
