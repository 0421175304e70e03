"""EASE, the closed-form item-to-item baseline beside every retrieval evaluation."""
import numpy as np
import pytest
import scipy.sparse as sp

from recpipe.trainers.evaluation.ease import ease_scorer, ease_weights


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
def test_an_ease_query_without_history_is_ranked_by_popularity():
    history = sp.csr_matrix(np.array([[1, 0, 0], [0, 0, 0]], np.float32))
    weights = np.array([[0.0, 0.1, 0.9], [0.5, 0.0, 0.2], [0.4, 0.3, 0.0]])
    popularity = np.array([5.0, 9.0, 1.0])
    scores = ease_scorer(history, weights, np.array([0, 1, -1]), popularity)(slice(0, 3))
    assert np.argsort(-scores[0]).tolist() == [2, 1, 0]  # its own click scores 0, then by B
    assert np.argsort(-scores[1]).tolist() == np.argsort(-scores[2]).tolist() == [1, 0, 2]  # none: popularity
