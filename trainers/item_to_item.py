"""`model.type: item_to_item`: EASE (recpipe.trainers.evaluation.ease) fitted in closed form as a servable
retrieval model (recpipe.trainers.models.ItemToItemModel: a query in, every candidate's score out). This module
holds where it applies and how its weights are made from EASE; recpipe.trainers.item_to_item_fit runs the fit.

The weights B are fitted on the train split's clicks (X: users by the query key x candidates). For each λ of
ease.LAMBDAS, the largest first, the model's weights are set from B_λ, written as a checkpoint ("step" i for the
i-th λ) and scored on validation as any checkpoint is (recpipe.trainers.evaluation.validation.Validator: the
selection metric; the first best is kept, so ties keep the stronger regularisation, as evaluation's EASE
baseline does; every λ is tried, patience does not apply). Two sources of a query's earlier clicks:

- the row's history feature (recpipe.features.schema.history_feature), which the request carries: the model
  holds B itself and scores the listed IDs' rows of it, so a new user with a history is scored from it;
- else the query key: the model holds every user's scores, their clicks times B. The kept model scores each
  user from every click before the eval split, train and validation, with the λ validation chose and B still
  fitted on train: what a served model knows of its users once its data is in.

A query without earlier clicks scores the candidates by popularity (train clicks). The eval split is never
read. It applies where a query key names the user (X's rows), the data has a validation split, and the weights
stay within ease.MAX_DENSE floats (unfit_reason).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import scipy.sparse as sp

from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import Config
from recpipe.features.schema import history_feature, query_key_feature
from recpipe.trainers.evaluation import ease

__all__ = ["TIE", "LAMBDAS_TRIED", "table_rows", "known_ids", "unfit_reason", "score_table", "history_weights"]

# The λ values tried, one "step" each: ease.LAMBDAS, the largest first.
LAMBDAS_TRIED = tuple(sorted(ease.LAMBDAS, reverse=True))

# Popularity (divided by its largest) times this is added to every user's scores: it orders only candidates of
# (nearly) equal score, e.g. those no earlier click of the user co-occurs with. float32 keeps it for scores ~1.
TIE = 1e-6


def table_rows(cfg: Config, artifact: TransformArtifact, feature: str) -> int:
    """Rows of a sparse feature's table (its owner's: vocabulary, OOV buckets and free slots, or hash buckets)."""
    return artifact.table_sizes()[cfg.table_owner(cfg.sparse_by_name[feature]).name]


def known_ids(cfg: Config, artifact: TransformArtifact, feature: str) -> int:
    """How many IDs of a sparse feature stand for known values.

    Args:
        cfg: the config.
        artifact: the data's transform artifact.
        feature: a sparse feature's name.

    Returns:
        Its table's vocabulary size (not the OOV buckets; at least 1), or every hash bucket.
    """
    owner = cfg.table_owner(cfg.sparse_by_name[feature])
    if owner.vocab is not None:
        return max(len(artifact.vocabularies.get(owner.name, [])), 1)
    return artifact.table_sizes()[owner.name]


def unfit_reason(cfg: Config, artifact: TransformArtifact) -> Optional[str]:
    """Why item_to_item cannot be fitted on this config and data, if it cannot.

    Args:
        cfg: a retrieval config.
        artifact: the data's transform artifact (table sizes, split row counts).

    Returns:
        None when it applies; else the reason: no query key, no validation split (λ is chosen on it), or weights
        beyond ease.MAX_DENSE floats (B over the known candidates, with a history feature; else user IDs x
        candidate IDs), which also bounds the fit's inverse, of the smaller side, within ease.MAX_INVERSE.
    """
    key = query_key_feature(cfg)
    if key is None:
        return "no query key names the user (model.query_key, or a single-valued sparse first query feature)"
    if not artifact.row_counts.get("validation"):
        return "no validation split to choose its λ on (split.validation_fraction)"
    first = cfg.model.candidate_features[0]
    if history_feature(cfg):  # B over the known candidates (float64 while fitted)
        known = known_ids(cfg, artifact, first)
        floats, what = known * known, f"{known:,} x {known:,} known candidates"
    else:  # every user's scores
        users, ids = table_rows(cfg, artifact, key), table_rows(cfg, artifact, first)
        floats, what = users * ids, f"{users:,} user IDs x {ids:,} candidate IDs"
    if floats > ease.MAX_DENSE:
        return f"its weights of {what} would hold {floats:,} floats; it runs up to {ease.MAX_DENSE:,}"
    return None


def score_table(model: ease.Ease, history: sp.csr_matrix, popularity: np.ndarray, ids: np.ndarray,
                shape: tuple[int, int], chunk: int = 1024) -> np.ndarray:
    """The ItemToItemModel's table: every user's score of every candidate ID.

    Args:
        model: EASE fitted on the clicks it learns from ([users, len(ids)] columns).
        history: binary [users, len(ids)]: the clicks each user is scored from.
        popularity: clicks per candidate (len(ids)) in the split the model learnt from.
        ids: the candidate ID of each column of `history` and `popularity`.
        shape: (user IDs, candidate IDs) of the table.
        chunk: users scored at a time.

    Returns:
        float32 [users, candidate IDs]: history @ B + TIE x popularity for a user with clicks in `history`,
        popularity / its largest for the others; 0 for a candidate ID not in `ids`.
    """
    out = np.zeros(shape, np.float32)
    share = popularity / max(float(popularity.max()), 1.0)
    out[:, ids] = share.astype(np.float32)
    with_clicks = np.flatnonzero(np.diff(history.indptr) > 0)
    for i in range(0, len(with_clicks), chunk):
        users = with_clicks[i:i + chunk]
        out[np.ix_(users, ids)] = (model.scores(history[users]) + TIE * share).astype(np.float32)
    return out


def history_weights(b: np.ndarray, popularity: np.ndarray, ids: np.ndarray, rows: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The ItemToItemModel's weights when a query lists its history: B over every candidate ID, and the base.

    Args:
        b: EASE's B over the candidates (len(ids) x len(ids)).
        popularity: clicks per candidate (len(ids)) in the split B learnt from.
        ids: the candidate ID of each row and column of `b`.
        rows: candidate IDs in all (the candidate feature's table).

    Returns:
        (float32 [rows, rows]: b at (ids, ids), 0 elsewhere; float32 [rows]: popularity / its largest at ids).
    """
    weights = np.zeros((rows, rows), np.float32)
    weights[np.ix_(ids, ids)] = b
    base = np.zeros(rows, np.float32)
    base[ids] = popularity / max(float(popularity.max()), 1.0)
    return weights, base
