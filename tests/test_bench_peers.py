"""The quality bench's peers (recpipe.bench.*_peer): the files exchanged with the peer environment, the
environment's cache key, and (bench tier) LightGBM and ALS run in that environment."""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

PEERS = Path(__file__).resolve().parents[1] / "recpipe" / "bench" / "peers"


@pytest.mark.unit
def test_a_peer_scores_known_queries_from_their_history_and_new_ones_by_popularity():
    """Candidate 3 was never clicked in train (not in the peers' catalogue): it ranks last. Query 1 has no
    history: it gets popularity's ranking, and the peer is never asked about it."""
    from recpipe.bench.peer_clicks import ScoredSplit, score_peer
    from recpipe.trainers.evaluation.candidates import Clicks
    seen = sp.csr_matrix((np.ones(1), ([0], [0])), shape=(2, 4))
    scored = ScoredSplit("eval", Clicks(np.array([1, 3, 2]), np.array([0, 0, 1])), seen,
                         np.array([5.0, 1.0, 3.0, 0.0]), np.array([0, 1, 2]), seen[:, [0, 1, 2]].tocsr())
    asked = []

    def item_scores(queries):
        asked.extend(queries.tolist())
        return np.tile([0.0, 10.0, -5.0], (len(queries), 1))
    m = score_peer(scored, item_scores)
    assert asked == [0, 0]
    assert m["mrr_at_10"] == pytest.approx((1 + 1 / 4 + 1 / 2) / 3)  # ranks 0, 3 (last) and 1 (popularity)
    assert m["with_history"]["examples"] == 2 and m["seen_excluded"]["examples"] == 3


def _columns_cfg():
    from recpipe.features.config import parse_config
    return parse_config({
        "name": "t", "label": {"column": "label"}, "split": {"eval_fraction": 0.2, "validation_fraction": 0.2},
        "features": {"sparse": [{"name": "user", "column": "user", "hash_buckets": 1000},
                                {"name": "genres", "column": "genres", "multivalent": True,
                                 "vocab": {"min_count": 1, "oov_buckets": 1}}],
                     "dense": [{"name": "price", "column": "price", "transform": "zscore"}]},
        "model": {"task": "ranking", "type": "logistic"}})


@pytest.mark.unit
def test_lightgbm_columns_round_trip_ids_through_the_peer_file(tmp_path):
    """Single-valued sparse features are categorical IDs, list features their length, dense ones their value;
    the IDs read back by the peer script are the IDs written, up to LightGBM's largest category, and the eval
    split reaches it without labels."""
    from recpipe.bench.peers import lightgbm_fit  # numpy only at import: LightGBM is imported by main()
    from recpipe.bench.lightgbm_peer import MAX_CATEGORY, Column, column_values, lightgbm_columns, write_columns
    columns = lightgbm_columns(_columns_cfg())
    assert columns == [Column("user", "categorical"), Column("genres", "count"), Column("price", "dense")]
    ids = np.array([0, 7, 123_456_789, MAX_CATEGORY], dtype=np.int64)
    x = column_values(columns, {"user": ids, "genres": np.array([0, 2, 1, 3]), "price": np.array([-0.5, 0, 1, 2.25])})
    write_columns(str(tmp_path / "c.npz"), {"train": (x, np.array([0.0, 1, 1, 0])), "eval": (x[:2], np.ones(2))})
    back, y = lightgbm_fit.load_split(str(tmp_path / "c.npz"), "train")
    assert np.array_equal(back[:, 0].astype(np.int64), ids) and list(y) == [0, 1, 1, 0]
    assert list(back[:, 1]) == [0, 2, 1, 3] and list(back[:, 2]) == [-0.5, 0, 1, 2.25]
    assert lightgbm_fit.load_split(str(tmp_path / "c.npz"), "eval")[1] is None
    with pytest.raises(ValueError, match="user has IDs in"):
        column_values(columns, {"user": np.array([-1]), "genres": np.array([1]), "price": np.array([0.0])})


@pytest.mark.unit
def test_the_peer_environment_key_changes_with_the_pins():
    from recpipe.bench.isolated_env import plan_key
    from recpipe.bench.peer_env import PEER_PLAN, PEER_REQUIREMENTS
    key = plan_key(PEER_PLAN, (3, 11))
    assert key.startswith("py311-") and key == plan_key(((tuple(reversed(PEER_REQUIREMENTS)), ()),), (3, 11))
    bumped = tuple(r.replace("lightgbm==4.7.0", "lightgbm==4.6.0") for r in PEER_REQUIREMENTS)
    assert plan_key(((bumped, ()),), (3, 11)) != key
    assert plan_key(PEER_PLAN, (3, 12)) != key
    assert plan_key(((PEER_REQUIREMENTS, ("--no-deps",)),), (3, 11)) != key  # the flags are part of the plan
    assert all("==" in r for r in PEER_REQUIREMENTS)  # pinned: the same environment every time


@pytest.mark.unit
def test_peer_scripts_import_only_numpy_scipy_and_their_library():
    """They run in the peer environment, which has neither recpipe nor TensorFlow."""
    allowed = {"numpy", "scipy", "lightgbm", "implicit", "torch", "torchrec", "fbgemm_gpu", *sys.stdlib_module_names}
    found = {}
    for path in PEERS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found.update({n.split(".")[0]: path.name for n in names})
    assert {"lightgbm", "implicit", "torchrec"} <= found.keys()
    assert {n: f for n, f in found.items() if n not in allowed} == {}


@pytest.mark.bench
def test_lightgbm_runs_in_the_peer_environment(tmp_path, preprocessed_with_validation):
    """The environment is created (or reused from the cache), LightGBM fits every configuration of the grid with
    early stopping on validation, and each seed's eval AUC is computed here from its probabilities."""
    from recpipe.features.config import parse_config
    from recpipe.bench.lightgbm_peer import lightgbm_peer
    data_dir, _, data = preprocessed_with_validation
    fit = lightgbm_peer(parse_config(data), data_dir, str(tmp_path), seeds=[1, 2],
                        grid={"num_leaves": (7, 15), "learning_rate": (0.1,), "min_data_in_leaf": (20,)},
                        max_rounds=200)
    assert len(fit["trials"]) == 2 and fit["params"] in [{"num_leaves": n, "learning_rate": 0.1,
                                                         "min_data_in_leaf": 20} for n in (7, 15)]
    assert [r["seed"] for r in fit["runs"]] == [1, 2] and 0.5 < fit["auc_mean"] <= 1.0
    assert fit["columns"] == {"categorical": 8, "count": 1, "dense": 3}
    with np.load(tmp_path / "columns.npz") as z:
        assert "y_eval" not in z.files and "y_validation" in z.files
    request = json.loads((tmp_path / "request.json").read_text())
    assert request["categorical"] == [0, 1, 3, 4, 5, 6, 7, 8] and request["threads"] == 1  # hist (2) is a count


@pytest.mark.bench
def test_als_runs_in_the_peer_environment(tmp_path):
    """ALS on a hand-made click matrix: users of two groups each click all but one of their group's ten items,
    and that one is their next click. Seen items removed, it leads: recall@10 is 1 over both seeds."""
    from recpipe.bench.als_peer import als_peer
    from recpipe.bench.peer_clicks import PeerClicks, ScoredSplit
    from recpipe.trainers.evaluation.candidates import Clicks
    users, items = 40, 20
    group = np.arange(users) % 2
    truth = group + 2 * ((np.arange(users) // 2) % 10)  # an item of the user's group (i % 2 == group)
    clicked = (np.arange(items)[None, :] % 2 == group[:, None]) & (np.arange(items)[None, :] != truth[:, None])
    train = sp.csr_matrix(clicked.astype(np.float32))

    def split(name: str) -> ScoredSplit:
        return ScoredSplit(name, Clicks(truth, np.arange(users)), train, np.asarray(train.sum(axis=0)).ravel(),
                           np.arange(items), train)
    fit = als_peer(PeerClicks(np.arange(items), train, {"validation": split("validation"), "eval": split("eval")}),
                   str(tmp_path), seeds=[1, 2], grid={"factors": (2, 4), "regularization": (0.1,), "alpha": (1.0,)})
    assert len(fit["trials"]) == 2 and [r["seed"] for r in fit["runs"]] == [1, 2]
    assert fit["new_recall_at_10_mean"] == 1.0  # the group's items lead; the other group's come after


@pytest.mark.unit
def test_the_report_explains_a_missed_peer_target_with_the_per_seed_figures(tmp_path):
    from recpipe.bench.common import save_result
    from recpipe.bench.report import write_report
    seeds = [{"auc": a, "validation_auc": 0.7, "new_recall_at_10": n} for a, n in ((0.74, 0.02), (0.75, 0.03))]
    ranking = {"default": {"auc_mean": 0.745, "auc_sd": 0.005, "runs": seeds},
               "lightgbm": {"auc_mean": 0.76, "auc_sd": 0.001, "params": {"num_leaves": 15}, "runs": seeds}}
    peer = {"recall_at_10": 0.1, "new_recall_at_10": 0.04, "history_recall_at_10": 0.1}
    kept = [{**s, "kept": "two_tower"} for s in seeds]
    instacart = {"model": {"recall_at_10_mean": 0.17, "recall_at_10_sd": 0.0, "new_recall_at_10_mean": 0.025,
                           "new_recall_at_10_sd": 0.005, "runs": kept},
                 "most_popular": peer, "cooccurrence": peer, "new_examples": 1843,
                 "ease": {**peer, "lambda": 300.0, "validation_new_recall_at_10": 0.044},
                 "als": {"new_recall_at_10_mean": 0.036, "new_recall_at_10_sd": 0.001}}
    save_result(str(tmp_path), "quality", {"machine": {"date": "d", "cpus": 2}, "ranking": {"criteo": ranking},
                                           "retrieval": {"instacart": instacart},
                                           "ratios": {"quality_criteo_auc_vs_lightgbm": 0.745 / 0.76,
                                                      "quality_instacart_recall10_vs_ease": 0.025 / 0.04}}, "#\n")
    lines = Path(write_report(str(tmp_path))).read_text().splitlines()
    gbm = next(line for line in lines if line.startswith("- **quality_criteo_auc_vs_lightgbm**"))
    assert "0.7400, 0.7500" in gbm and "num_leaves 15" in gbm and "+0.0150 in LightGBM's favour" in gbm
    ease = next(line for line in lines if line.startswith("- **quality_instacart_recall10_vs_ease**"))
    assert "0.0200, 0.0300 per seed" in ease and "EASE's 0.0400 (λ 300" in ease
