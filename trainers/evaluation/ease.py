"""EASE (Steck, WWW 2019): the closed-form item-to-item model a retrieval model is compared with.

B = I - P diag(1/diag(P)), P = (XᵀX + λI)⁻¹, X the binary user x candidate matrix of the clicks a query had
before the split scored; a query's scores are its row of X times B (its own clicks never score themselves:
B's diagonal is 0). λ is chosen on the validation split, never on eval.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["LAMBDAS", "MAX_CANDIDATES", "ease_weights", "ease_scorer"]

LAMBDAS = (1.0, 10.0, 100.0, 500.0, 2000.0)
# B is a dense candidates x candidates matrix and each λ inverts one: 5,000 candidates take 200 MB and 4.3 s per λ on
# 2 cores (13,550 took 75 s); beyond it the baseline is left out (n³ time, n² memory)
MAX_CANDIDATES = 5_000


def ease_weights(user_item: sp.csr_matrix, lam: float) -> np.ndarray:
    """EASE's item-to-item weights.

    Args:
        user_item: binary [queries, candidates] clicks (X).
        lam: the L2 weight λ > 0 on B.

    Returns:
        B, float64 [candidates, candidates], with a zero diagonal.

    Raises:
        ValueError: λ is not positive.
    """
    if lam <= 0:
        raise ValueError(f"EASE needs λ > 0, got {lam}")
    gram = (user_item.T @ user_item).toarray().astype(np.float64)
    gram[np.diag_indices_from(gram)] += lam
    p = np.linalg.inv(gram)
    b = p / -np.diag(p)
    b[np.diag_indices_from(b)] = 0.0
    return b


def ease_scorer(history: sp.csr_matrix, weights: np.ndarray, queries: np.ndarray, popularity: np.ndarray):
    """A scorer for scoring._scored: a slice of rows -> [rows, candidates] EASE scores of their queries.

    Args:
        history: binary [queries, candidates]: what each query clicked before the split scored.
        weights: ease_weights of the clicks it was fitted on.
        queries: each scored row's query ID (an OOV key, < 0 or beyond `history`, has no history).
        popularity: train clicks per candidate: the ranking of a query without history, and the tie-break.

    Returns:
        The scorer.
    """
    tie = popularity / (popularity.max() + 1.0) * 1e-9  # orders only candidates of equal score

    def score(rows: slice) -> np.ndarray:
        q = queries[rows]
        known = (q >= 0) & (q < history.shape[0])
        out = np.broadcast_to(popularity + tie, (len(q), len(popularity))).copy()
        h = history[q[known]]
        with_history = np.asarray(h.sum(axis=1)).ravel() > 0
        scores = np.asarray(h @ weights) + tie
        idx = np.flatnonzero(known)[with_history]
        out[idx] = scores[with_history]
        return out
    return score
