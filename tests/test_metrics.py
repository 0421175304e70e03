import numpy as np
import pytest

from recpipe.common.metrics import auc_standard_error, log_loss, roc_auc

pytestmark = pytest.mark.unit


def _pairwise_auc(y, s):
    pos, neg = s[y == 1], s[y == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_matches_pairwise_definition_with_ties(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.random(300) + 0.3 * y, 1)  # many ties
    assert roc_auc(y, s) == pytest.approx(_pairwise_auc(y, s), abs=1e-12)


def test_auc_edges():
    assert roc_auc([0, 1], [0.1, 0.9]) == 1.0
    assert roc_auc([0, 1], [0.9, 0.1]) == 0.0
    assert np.isnan(roc_auc([1, 1], [0.1, 0.9]))
    # infinite scores tie too (the leak check scores a missing value -inf): np.diff made -inf - -inf NaN, a
    # boundary, so tied rows got distinct ranks
    y, s = np.array([1, 1, 0, 0]), np.array([-np.inf, -np.inf, -np.inf, 0.0])
    assert roc_auc(y, s) == pytest.approx(_pairwise_auc(y, s)) == pytest.approx(0.25)  # was 0


def test_log_loss():
    assert log_loss([1, 0], [0.5, 0.5]) == pytest.approx(np.log(2))
    assert np.isfinite(log_loss([1], [0.0]))


def test_rank_recall_ndcg():
    from recpipe.common.metrics import ndcg_at_k, rank_of_true, recall_at_k
    scores = np.array([[0.9, 0.1, 0.5], [0.2, 0.2, 0.1], [0.0, 1.0, 2.0]])
    ranks = rank_of_true(scores, np.array([0, 1, 0]))
    assert ranks.tolist() == [0, 1, 2]  # a tie counts against the true item
    assert recall_at_k(ranks, 1) == pytest.approx(1 / 3) and recall_at_k(ranks, 3) == 1.0
    assert ndcg_at_k(ranks, 2) == pytest.approx((1 + 1 / np.log2(3)) / 3)


def test_auc_standard_error_matches_the_spread_over_eval_sets():
    rng = np.random.default_rng(0)
    aucs = []
    for _ in range(300):  # the same "model" scored on fresh eval sets of 2,000 rows, 25 % positive
        y = rng.random(2_000) < 0.25
        aucs.append(roc_auc(y, rng.normal(size=2_000) + 0.6 * y))
    se = auc_standard_error(float(np.mean(aucs)), 500, 1_500)
    assert 0.85 < np.std(aucs) / se < 1.1  # Hanley & McNeil is slightly conservative for binormal scores
    assert auc_standard_error(0.7, 5_000, 15_000) < se / 2  # 10x the rows: about a third of the spread
