"""What the retrieval peers (EASE, ALS) learn from and are scored on, read as `recpipe evaluate` reads it.

A peer learns from the train split's query x item clicks (the items clicked in train are its catalogue). It
scores a split as the evaluation scores our models and the baselines (recpipe.trainers.evaluation.scoring):
every clicked row of the split against every candidate known up to it, plain and with the query's earlier
clicks removed, from the query's history (its clicks in the splits before: train for validation, train and
validation for eval). A query without history among the train items gets the most-popular ranking; candidates
never clicked in train rank last, as they do under popularity.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import scipy.sparse as sp

from recpipe.features.config import Config
from recpipe.trainers.evaluation.candidates import Clicks
from recpipe.trainers.evaluation.scoring import retrieval_clicks, scored_metrics, seen_matrix

__all__ = ["ScoredSplit", "PeerClicks", "read_peer_clicks", "score_peer", "recall_summary"]

KS = (10, 50, 100)


@dataclass
class ScoredSplit:
    """One split as the evaluation scores it.

    Attributes:
        split: "validation" or "eval".
        clicks: the split's clicked rows (candidate index, query key).
        seen: queries x candidates, each query's clicks in the splits before.
        popularity: train clicks per candidate (the fallback ranking).
        columns: the candidate index of each train item, in the train items' order.
        history: queries x train items: `seen` on the train items' columns.
    """
    split: str
    clicks: Clicks
    seen: sp.csr_matrix
    popularity: np.ndarray
    columns: np.ndarray
    history: sp.csr_matrix


@dataclass
class PeerClicks:
    """What a retrieval peer learns from and the splits it is scored on.

    Attributes:
        items: the IDs of the candidates clicked in train (sorted): the peers' catalogue.
        train: queries x items, the binary train clicks.
        splits: "validation" and "eval" as ScoredSplit.
    """
    items: np.ndarray
    train: sp.csr_matrix
    splits: dict[str, ScoredSplit]


def read_peer_clicks(cfg: Config, data_dir: str) -> Optional[PeerClicks]:
    """The train clicks and the validation and eval splits, each read as the evaluation reads it for that split
    (validation's candidates are those of train and validation only).

    Args:
        cfg: a retrieval config.
        data_dir: its preprocessed data, with a validation split.

    Returns:
        PeerClicks, or None when the data has no query key (nothing to learn a query's history from).
    """
    items, train, splits = None, None, {}
    for split in ("validation", "eval"):
        candidates, clicks = retrieval_clicks(cfg, data_dir, split)
        seen = seen_matrix(clicks, split, len(candidates.ids))
        if seen is None:
            return None
        clicked = clicks["train"].candidate
        if items is None:
            items = candidates.ids[np.unique(clicked)]
            train = clicks["train"].matrix(seen.shape[0], len(candidates.ids))[:, np.unique(clicked)].tocsr()
        columns = candidates.index_of(items)
        splits[split] = ScoredSplit(split, clicks[split], seen, np.bincount(clicked, minlength=len(candidates.ids))
                                    .astype(np.float64), columns, seen[:, columns].tocsr())
    return PeerClicks(items, train, splits)


def score_peer(scored: ScoredSplit, item_scores: Callable[[np.ndarray], np.ndarray]) -> dict:
    """A peer's rank metrics on a split (recpipe.trainers.evaluation.scoring's, plain and seen-excluded).

    Args:
        scored: the split.
        item_scores: query keys (each with a history among the train items) -> [queries, train items] scores.

    Returns:
        The metrics dict of the evaluation (recall_at_10, ..., seen_excluded, with_history, without_history).
    """
    n = len(scored.popularity)
    with_items = np.diff(scored.history.indptr) > 0

    def rows(c: slice) -> np.ndarray:
        q = scored.clicks.query[c]
        out = np.tile(scored.popularity, (len(q), 1))
        warm = (q >= 0) & (q < len(with_items))
        warm[warm] = with_items[q[warm]]
        if warm.any():
            block = np.full((int(warm.sum()), n), -np.inf)
            block[:, scored.columns] = item_scores(q[warm])
            out[warm] = block
        return out
    return scored_metrics(rows, scored.clicks, scored.seen, KS)


def recall_summary(metrics: dict) -> dict:
    """The figures the quality bench reports of a retrieval model.

    Args:
        metrics: score_peer's (or the evaluation's) metrics dict.

    Returns:
        recall_at_10, recall_at_100, new_recall_at_10 (seen excluded) and history_recall_at_10 (rows whose
        query clicked before; NaN when there is none).
    """
    return {"recall_at_10": metrics["recall_at_10"], "recall_at_100": metrics["recall_at_100"],
            "new_recall_at_10": metrics["seen_excluded"]["recall_at_10"],
            "history_recall_at_10": metrics["with_history"].get("recall_at_10", float("nan"))}
