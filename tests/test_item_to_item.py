"""item_to_item (recpipe.trainers.item_to_item): where it applies, and the table of user scores it serves."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from conftest import small_config_dict

from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import parse_config
from recpipe.trainers.evaluation import ease
from recpipe.trainers.item_to_item import LAMBDAS_TRIED, TIE, history_weights, score_table, unfit_reason

pytestmark = pytest.mark.unit


def _retrieval(**model):
    d = small_config_dict()
    d["split"]["validation_fraction"] = 0.1
    d["model"] = {"task": "retrieval", "query_features": ["user_id", "hist"], "candidate_features": ["item_id"],
                  **model}
    return parse_config(d)


def _artifact(cfg, items: int = 20, validation: int = 10) -> TransformArtifact:
    vocabs = {f.name: [f"v{i}" for i in range(items if f.name == "item_id" else 5)] for f in cfg.features.sparse
              if f.vocab is not None and f.share_embedding_with is None}
    stats = {d.name: {"mean": 0.0, "std": 1.0, "boundaries": [0.0, 1.0]} for d in cfg.features.dense}
    return TransformArtifact(config=cfg, raw_schema={}, vocabularies=vocabs, vocab_counts={}, dense_stats=stats,
                             row_counts={"train": 100, "validation": validation, "eval": 10})


def test_it_applies_with_a_query_key_a_validation_split_and_weights_within_the_bounds():
    cfg = _retrieval()  # with the history feature `hist`: B, 22 x 22 item IDs
    assert unfit_reason(cfg, _artifact(cfg)) is None
    no_key = _retrieval(query_features=["hist"])
    assert "no query key names the user" in unfit_reason(no_key, _artifact(no_key))
    assert "no validation split" in unfit_reason(cfg, _artifact(cfg, validation=0))
    assert unfit_reason(cfg, _artifact(cfg, items=5_000)) is None  # B over 5,000 items (+ 2 OOV IDs)
    assert "its weights of 6,000 x 6,000 known candidates would hold 36,000,000 floats" in unfit_reason(
        cfg, _artifact(cfg, items=6_000))
    by_key = _retrieval(query_features=["user_id"])  # no history: every user's scores, 1,000 hash buckets
    assert unfit_reason(by_key, _artifact(by_key, items=6_000)) is None
    assert "its weights of 1,000 user IDs x 30,002 candidate IDs would hold 30,002,000 floats" in unfit_reason(
        by_key, _artifact(by_key, items=30_000))
    assert ease.MAX_INVERSE ** 2 >= ease.MAX_DENSE  # within MAX_DENSE, the smaller side is within MAX_INVERSE


def test_the_table_scores_users_with_clicks_by_ease_and_the_others_by_popularity():
    clicks = sp.csr_matrix(np.array([[1, 1, 0, 0], [0, 1, 1, 0], [1, 0, 1, 1], [0, 0, 0, 0]], np.float64))
    model = ease.Ease(clicks, 10.0)
    popularity = np.asarray(clicks.sum(axis=0)).ravel()
    ids = np.array([1, 2, 4, 5])  # the candidates' IDs: 0 and 3 are IDs no candidate has
    table = score_table(model, clicks, popularity, ids, (5, 7), chunk=2)
    assert table.shape == (5, 7) and table.dtype == np.float32
    share = popularity / popularity.max()
    expected = model.scores(clicks[:3]) + TIE * share
    np.testing.assert_allclose(table[:3][:, ids], expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(table[3:][:, ids], np.tile(share, (2, 1)))  # no click (an OOV row): popularity
    assert not table[:, [0, 3, 6]].any()


def test_a_listed_history_is_scored_by_the_rows_of_b_and_an_empty_one_by_popularity():
    import tensorflow as tf

    from recpipe.trainers.models import ItemToItemModel
    clicks = sp.csr_matrix(np.array([[1, 1, 0], [0, 1, 1], [1, 0, 1]], np.float64))
    b = ease.ease_weights(clicks, 1.0)
    popularity = np.asarray(clicks.sum(axis=0)).ravel()
    weights, base = history_weights(b, popularity, np.array([0, 2, 3]), 5)  # IDs 1 and 4: no candidate
    assert weights.shape == (5, 5) and not weights[[1, 4]].any() and not weights[:, [1, 4]].any()
    model = ItemToItemModel("user", "item", users=4, candidates=5, history="hist", tie=TIE)
    model.item_weights.assign(weights)
    model.base.assign(base)
    listed = tf.RaggedTensor.from_row_lengths(tf.constant([0, 2, 3], tf.int64), tf.constant([2, 0, 1], tf.int64))
    got = model.id_scores({"hist": listed}).numpy()
    np.testing.assert_allclose(got[0], weights[0] + weights[2] + TIE * base, rtol=1e-6)
    np.testing.assert_allclose(got[1], base)  # no history: popularity
    np.testing.assert_allclose(got[2], weights[3] + TIE * base, rtol=1e-6)


def test_lambdas_are_tried_strongest_first_so_ties_keep_the_stronger():
    assert LAMBDAS_TRIED == tuple(sorted(ease.LAMBDAS, reverse=True))
