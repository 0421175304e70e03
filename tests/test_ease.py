"""EASE, the closed-form item-to-item baseline beside every retrieval evaluation."""
import numpy as np
import pytest
import scipy.sparse as sp

from recpipe.trainers.evaluation.ease import Ease, ease_scorer, ease_weights, fits


@pytest.mark.unit
def test_ease_weights_are_stecks_closed_form_with_a_zero_diagonal():
    x = sp.csr_matrix(np.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 1, 1], [0, 1, 1, 1], [1, 0, 0, 1]], np.float32))
    lam = 2.0
    b = ease_weights(x, lam)
    g = x.T.toarray() @ x.toarray() + lam * np.eye(4)
    # B minimises ||X - XB||² + λ||B||² with diag(B) = 0: the Lagrangian's solution, built another way
    want = np.zeros((4, 4))
    for j in range(4):
        others = [i for i in range(4) if i != j]
        want[others, j] = np.linalg.solve(g[np.ix_(others, others)], g[others, j])
    np.testing.assert_allclose(np.diag(b), 0.0)
    np.testing.assert_allclose(b, want, atol=1e-10)
    with pytest.raises(ValueError, match="λ > 0"):
        ease_weights(x, 0.0)


@pytest.mark.unit
def test_ease_on_a_hand_checkable_matrix():
    """X = three users with two of three items each, λ = 1: XᵀX + I = 2I + J, whose inverse is 0.5I − 0.1J,
    so B = I − P·diag(1/diag P) has 0.1/0.4 = 0.25 off the diagonal and 0 on it."""
    x = sp.csr_matrix(np.array([[1, 1, 0], [1, 0, 1], [0, 1, 1]], dtype=float))
    assert np.allclose(ease_weights(x, 1.0), np.array([[0, 0.25, 0.25], [0.25, 0, 0.25], [0.25, 0.25, 0]]))
    history = sp.csr_matrix(np.array([[1.0, 0, 0], [0, 1, 1]]))
    assert np.allclose(Ease(x, 1.0).scores(history), [[0, 0.25, 0.25], [0.5, 0.25, 0.25]])


@pytest.mark.unit
def test_an_ease_query_without_history_is_ranked_by_popularity():
    clicks = sp.csr_matrix(np.array([[1, 0, 1], [1, 1, 0], [0, 1, 1], [1, 0, 1]], np.float32))
    model = Ease(clicks, 1.0)
    history = sp.csr_matrix(np.array([[1, 0, 0], [0, 0, 0]], np.float32))
    popularity = np.array([5.0, 9.0, 1.0])
    scores = ease_scorer(history, model, np.array([0, 1, -1]), popularity)(slice(0, 3))
    b = ease_weights(clicks, 1.0)
    np.testing.assert_allclose(scores[0], b[0], atol=1e-8)  # history @ B, its own click scoring 0
    assert np.argsort(-scores[1]).tolist() == np.argsort(-scores[2]).tolist() == [1, 0, 2]  # none: popularity


@pytest.mark.unit
def test_ease_through_the_queries_sized_inverse_scores_as_the_candidates_sized_one():
    rng = np.random.default_rng(3)
    clicks = sp.random(30, 80, density=0.1, random_state=rng, format="csr")
    clicks.data[:] = 1.0
    clicks = sp.vstack([clicks, sp.csr_matrix((4, 80))]).tocsr()  # queries without a click are dropped
    history = sp.random(7, 80, density=0.05, random_state=rng, format="csr")
    history.data[:] = 1.0
    for lam in (0.5, 30.0):
        woodbury = Ease(clicks, lam)
        assert woodbury.woodbury  # 30 queries with clicks < 80 candidates
        np.testing.assert_allclose(woodbury.scores(history), history @ ease_weights(clicks, lam), atol=1e-9)
        tall = clicks.T.tocsr()  # 80 queries x 34 candidates: the candidates-sized inverse
        assert not Ease(tall, lam).woodbury
        np.testing.assert_allclose(Ease(tall, lam).scores(tall[:5]), tall[:5] @ ease_weights(tall, lam), atol=1e-9)
    with pytest.raises(ValueError, match="λ > 0"):
        Ease(clicks, -1.0)


@pytest.mark.unit
def test_ease_names_clicks_too_large_to_fit():
    small = sp.csr_matrix(np.eye(6))
    assert fits(small) is None
    wide = sp.csr_matrix((np.ones(6_000), (np.arange(6_000), np.arange(6_000))), shape=(6_000, 7_000))
    why = fits(wide)
    assert "6,000 queries with clicks x 7,000 candidates" in why and "5,000" in why
    tall_and_wide = sp.csr_matrix((np.ones(4_000), (np.arange(4_000), np.arange(4_000))), shape=(4_000, 10_000))
    assert "40,000,000 floats" in fits(tall_and_wide)  # a small inverse, but too much dense state
