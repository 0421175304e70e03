"""EASE (Steck, WWW 2019): the closed-form item-to-item model a retrieval model is compared with.

B = I - P diag(1/diag(P)), P = (XᵀX + λI)⁻¹, X the binary query x candidate matrix of the clicks a query had
before the split scored; a query's scores are its row of X times B (its own clicks never score themselves:
B's diagonal is 0). λ is chosen on the validation split, never on eval.

With fewer queries than candidates P is never formed: by Woodbury, P = (I - XᵀKX)/λ with K = (XXᵀ + λI)⁻¹, so
applying B costs a queries-sized inverse instead of a candidates-sized one (the Instacart sample: 593 users,
13,550 products). Both ways give the same scores.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse as sp

__all__ = ["LAMBDAS", "MAX_INVERSE", "MAX_DENSE", "ease_weights", "Ease", "fits", "ease_scorer"]

LAMBDAS = (1.0, 10.0, 100.0, 300.0, 1000.0, 3000.0)
# Each λ inverts one dense matrix of min(queries with a click, candidates) rows: 5,000 take 4.3 s on 2 cores
# (13,550 took 75 s); and keeps one dense matrix of candidates² (or queries x candidates) floats: 25M are
# 200 MB. Beyond either the baseline is left out (n³ time, n² memory).
MAX_INVERSE = 5_000
MAX_DENSE = 25_000_000


def _check(lam: float) -> None:
    if not lam > 0:
        raise ValueError(f"EASE needs λ > 0, got {lam}")


def _spd_inverse(a: np.ndarray) -> np.ndarray:
    """The inverse of a symmetric positive definite matrix (Cholesky); `a` is overwritten."""
    factor = scipy.linalg.cho_factor(a, lower=True, overwrite_a=True, check_finite=False)
    return scipy.linalg.cho_solve(factor, np.eye(len(a)), check_finite=False)


def ease_weights(user_item: sp.spmatrix, lam: float) -> np.ndarray:
    """EASE's item-to-item weights, from the candidates-sized inverse.

    Args:
        user_item: binary [queries, candidates] clicks (X).
        lam: the L2 weight λ > 0 on B.

    Returns:
        B, float64 [candidates, candidates], with a zero diagonal.

    Raises:
        ValueError: λ is not positive.
    """
    _check(lam)
    x = sp.csr_matrix(user_item, dtype=np.float64)
    gram = (x.T @ x).toarray()
    gram[np.diag_indices_from(gram)] += lam
    p = _spd_inverse(gram)
    b = p / -np.diag(p)
    b[np.diag_indices_from(b)] = 0.0
    return b


def _clicked_rows(user_item: sp.spmatrix) -> sp.csr_matrix:
    x = sp.csr_matrix(user_item, dtype=np.float64)
    return x[np.diff(x.indptr) > 0]


def fits(user_item: sp.spmatrix) -> str | None:
    """Whether EASE can be fitted on these clicks within MAX_INVERSE and MAX_DENSE.

    Args:
        user_item: binary [queries, candidates] clicks.

    Returns:
        None when it can, else why not (for the report).
    """
    queries, n = _clicked_rows(user_item).shape[0], user_item.shape[1]
    side, dense = (queries, queries * n) if queries < n else (n, n * n)
    if side > MAX_INVERSE or dense > MAX_DENSE:
        return (f"{queries:,} queries with clicks x {n:,} candidates: EASE inverts a dense {side:,}-sized matrix "
                f"and keeps {dense:,} floats; it runs up to {MAX_INVERSE:,} and {MAX_DENSE:,}")
    return None


class Ease:
    """EASE fitted on clicks, scoring history rows (history @ B), through the smaller of the two inverses.

    Args:
        user_item: binary [queries, candidates] clicks (X); queries without a click are dropped.
        lam: the L2 weight λ > 0.

    Attributes:
        lam: λ.
        woodbury: whether B is applied through the queries-sized inverse (fewer queries than candidates).

    Raises:
        ValueError: λ is not positive.
    """

    def __init__(self, user_item: sp.spmatrix, lam: float):
        _check(lam)
        x = _clicked_rows(user_item)
        self.lam = lam
        self.woodbury = x.shape[0] < x.shape[1]
        if self.woodbury:
            inner = (x @ x.T).toarray()
            inner[np.diag_indices_from(inner)] += lam
            self._x = x
            self._kx = np.asarray(_spd_inverse(inner) @ x)  # K X: queries x candidates, dense
            self._diag = (1.0 - np.asarray(x.multiply(self._kx).sum(axis=0)).ravel()) / lam  # diag(P)
        else:
            self._b = ease_weights(x, lam)

    def scores(self, history: sp.spmatrix) -> np.ndarray:
        """Scores of every candidate for each history row.

        Args:
            history: binary [rows, candidates]: what each row's query clicked before.

        Returns:
            [rows, candidates] float64: history @ B.
        """
        h = sp.csr_matrix(history, dtype=np.float64)
        if not self.woodbury:
            return np.asarray(h @ self._b)
        dense = h.toarray()
        hp = (dense - (h @ self._x.T).toarray() @ self._kx) / self.lam  # history @ P (one BLAS product)
        return dense - hp / self._diag[None, :]


def ease_scorer(history: sp.csr_matrix, model: Ease, queries: np.ndarray, popularity: np.ndarray):
    """A scorer for scoring.scored_metrics: a slice of rows -> [rows, candidates] EASE scores of their queries.

    Args:
        history: binary [queries, candidates]: what each query clicked before the split scored.
        model: Ease fitted on the clicks it learns from.
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
        idx = np.flatnonzero(known)[with_history]
        if len(idx):
            out[idx] = model.scores(h[with_history]) + tie
        return out
    return score
