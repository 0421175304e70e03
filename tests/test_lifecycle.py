"""Embedding lifecycle across days (recpipe.pipeline.lifecycle, `vocab: {window_days, evict_unseen_days}`):
admission over a window of days, eviction of values unseen for days, freed slots reused while kept
values keep their IDs, the max_size rule; the same rules through day-by-day Beam runs, evicted values
mapping to OOV in the one transform, warm start following values into their new slots, and exports
that prune the values unseen for days (`recpipe export --prune-unseen-days`)."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
import yaml

from conftest import IN_MEMORY
from recpipe.features.artifact import TransformArtifact
from recpipe.features.canonical import LABEL_KEY, canonicalize
from recpipe.features.config import VocabSpec, config_to_dict, parse_config
from recpipe.common.days import day_name, day_number
from recpipe.features.batch_transform import BatchTransform
from recpipe.pipeline.analysis import select_vocabulary
from recpipe.pipeline.lifecycle import VocabState, advance_vocabulary
from recpipe.pipeline.preprocess import PreprocessError, run_preprocess
from recpipe.serving.export.prune import PruneError, prune_vocabularies
from recpipe.serving.version import ExportBase


@pytest.mark.unit
def test_admission_counts_the_window_of_days():
    spec = VocabSpec(min_count=3, window_days=2)
    d0 = advance_vocabulary(None, [("x", 2), ("y", 5)], 10, spec)
    assert d0.values == ["y"] and d0.pending == [("x", 10, 2)]
    d1 = advance_vocabulary(d0, [("x", 1)], 11, spec)
    assert d1.values == ["y", "x"] and d1.counts == [5, 3] and d1.last_seen == [10, 11] and d1.pending == []
    late = advance_vocabulary(d0, [("x", 1)], 12, spec)  # day 10 left the window: 1 row counts
    assert late.values == ["y"] and late.pending == [("x", 12, 1)]
    one_day = advance_vocabulary(advance_vocabulary(None, [("x", 2)], 10, VocabSpec(min_count=3)), [("x", 1)], 11,
                                 VocabSpec(min_count=3))
    assert one_day.values == [] and one_day.pending == []  # window_days 1 keeps nothing pending


@pytest.mark.unit
def test_runs_without_days_extend_a_plain_vocabulary():
    """No dt= partition and no --day (allowed when nothing evicts or admits over a window): a second run
    extends the first run's vocabulary; it used to fail with a TypeError on the missing day."""
    first = advance_vocabulary(None, [("a", 3), ("b", 1)], None, VocabSpec(min_count=2))
    second = advance_vocabulary(first, [("b", 2), ("c", 5)], None, VocabSpec(min_count=2))
    assert first.values == ["a"] and second.values == ["a", "c", "b"] and second.day is None


@pytest.mark.unit
def test_eviction_frees_slots_that_new_values_reuse_and_kept_ids_never_change():
    spec = VocabSpec(min_count=1, max_size=3, evict_unseen_days=2)
    s = advance_vocabulary(None, [("a", 5), ("b", 4), ("c", 3)], 0, spec)
    assert s.values == ["a", "b", "c"]
    s = advance_vocabulary(s, [("a", 1), ("c", 1)], 1, spec)
    assert s.values == ["a", "b", "c"] and s.last_seen == [1, 0, 1]  # b unseen for 1 day: kept
    s = advance_vocabulary(s, [("a", 1), ("d", 5)], 2, spec)
    assert s.values == ["a", "d", "c"] and s.counts == [7, 5, 4] and s.last_seen == [2, 2, 1]  # b out, d in
    s = advance_vocabulary(s, [("b", 3), ("a", 1), ("d", 1)], 3, spec)
    assert s.values == ["a", "d", "b"] and s.counts == [8, 6, 3]  # c evicted; b readmitted, into c's slot
    s = advance_vocabulary(s, [], 6, spec)
    assert s.values == [None, None, None] and s.counts == [0, 0, 0] and s.live() == 0


@pytest.mark.unit
def test_max_size_keeps_old_values_and_admits_new_ones_by_count_then_value():
    spec = VocabSpec(min_count=2, max_size=4, evict_unseen_days=1)
    s = VocabState(["k1", "k2", "k3"], [1, 1, 1], [4, 4, 4], day=4)
    s = advance_vocabulary(s, [("k1", 1), ("k3", 1), ("n1", 9), ("n2", 50), ("n3", 9), ("n4", 1)], 5, spec)
    # k2 is evicted; two slots (k2's, then a new one) go to the two most seen new values
    assert s.values == ["k1", "n2", "k3", "n1"] and s.counts == [2, 50, 2, 9]
    kept = advance_vocabulary(VocabState(["k"], [1], [5], day=5), [("k", 1), ("n", 99)], 6,
                              VocabSpec(min_count=1, max_size=1))
    assert kept.values == ["k"]  # a kept value is never displaced, however popular a new one is


@pytest.mark.unit
def test_first_day_and_plain_days_match_the_plain_vocabulary():
    rng = np.random.default_rng(3)
    counts = [(f"v{i}", int(c)) for i, c in enumerate(rng.integers(1, 9, 300))]
    for min_count, max_size in ((1, None), (4, None), (3, 50)):
        s = advance_vocabulary(None, counts, 0, VocabSpec(min_count=min_count, max_size=max_size))
        assert (s.values, s.counts) == select_vocabulary(counts, min_count, max_size)
    assert day_name(day_number("2026-11-23")) == "2026-11-23" and day_number("1970-01-02") == 1


def _day_log(root: str, day: str, items: dict[str, int]) -> None:
    """One day's partition: `n` rows of each item (label alternating), row order = time order."""
    names = [v for v, n in items.items() for _ in range(n)]
    folder = os.path.join(root, f"dt={day}")
    os.makedirs(folder)
    pq.write_table(pa.table({"label": pa.array([i % 2 for i in range(len(names))], pa.int64()),
                             "item": pa.array(names, pa.string()),
                             "user": pa.array([f"u{i % 3}" for i in range(len(names))], pa.string())}),
                   os.path.join(folder, "part.parquet"))


def _cfg(**vocab):
    spec = {"min_count": 3, "max_size": 4, "oov_buckets": 2, "window_days": 2, "evict_unseen_days": 2, **vocab}
    return parse_config({"name": "life", "split": {"eval_fraction": 0.05}, "label": {"column": "label"},
                         "features": {"sparse": [{"name": "item", "column": "item", "embedding_dim": 4,
                                                  "vocab": spec}]},
                         "model": {"wide": True, "cross_layers": 1, "deep_layers": [8]},  # a deep and a wide table
                         "train": {"batch_size": 8, "steps": 10, "checkpoint_every": 10}})


# Each day's last row (z) is its eval split (5 % of 20-37 rows: one row), so never counted.
DAYS = {"2026-01-01": {"a": 9, "b": 9, "x": 2, "z": 1},
        "2026-01-02": {"a": 9, "c": 9, "x": 1, "z": 1},
        "2026-01-03": {"a": 9, "c": 9, "d": 9, "e": 9, "z": 1},
        "2026-01-04": {"a": 9, "b": 9, "f": 1, "z": 1}}


@pytest.fixture(scope="module")
def four_days(tmp_path_factory):
    base = tmp_path_factory.mktemp("lifecycle")
    cfg, log = _cfg(), str(base / "log")
    for day, items in DAYS.items():
        _day_log(log, day, items)
    outs, prev = [], None
    for day in DAYS:
        out = str(base / day)
        run_preprocess(cfg, os.path.join(log, f"dt={day}"), out, IN_MEMORY, say=lambda _: None,
                       previous_transform=prev)
        outs.append(out)
        prev = out
    return cfg, log, outs, [TransformArtifact.read(os.path.join(o, "transform")) for o in outs]


@pytest.mark.integration
def test_day_by_day_runs_admit_evict_and_reuse_slots(four_days):
    cfg, _, _, arts = four_days
    v = [a.vocabularies["item"] for a in arts]
    assert [a.day for a in arts] == list(DAYS)  # read from the dt= partitions
    assert v[0] == ["a", "b"] and arts[0].vocab_pending["item"] == [["x", day_number("2026-01-01"), 2]]
    assert v[1] == ["a", "b", "c", "x"]  # x: 2 + 1 rows over the 2-day window; c first by count
    # day 3: b (last seen day 1) is evicted; d and e compete for its slot, d wins the tie by value
    assert v[2] == ["a", "d", "c", "x"] and arts[2].vocab_pending["item"] == [["e", day_number("2026-01-03"), 9]]
    # day 4: x (last seen day 2) is evicted; b comes back, into x's slot: a new ID for b
    assert v[3] == ["a", "d", "c", "b"] and arts[3].vocab_last_seen["item"] == [day_number(d) for d in
                                                                                ("2026-01-04", "2026-01-03",
                                                                                 "2026-01-03", "2026-01-04")]
    assert {a.table_sizes()["item"] for a in arts[1:]} == {6}  # 4 slots + 2 OOV buckets: bounded
    ids = BatchTransform(arts[3])({k: c for k, c in canonicalize(
        pa.table({"label": [0, 0, 0, 0], "item": ["a", "b", "x", "e"]}), cfg).items() if k != LABEL_KEY})["item"]
    assert ids[:2].tolist() == [0, 3] and (ids[2:] >= 4).all()  # x evicted and e not admitted: OOV


@pytest.mark.integration
def test_a_lifecycle_vocabulary_needs_the_runs_day_in_order(tmp_path, four_days):
    cfg, log, outs, _ = four_days
    flat = str(tmp_path / "flat.parquet")
    pq.write_table(pq.read_table(os.path.join(log, "dt=2026-01-02", "part.parquet")), flat)
    with pytest.raises(PreprocessError, match="give the run's --day"):
        run_preprocess(cfg, flat, str(tmp_path / "o1"), IN_MEMORY, say=lambda _: None)
    with pytest.raises(PreprocessError, match="previous transform is of 2026-01-02"):
        run_preprocess(cfg, flat, str(tmp_path / "o2"), IN_MEMORY, say=lambda _: None, previous_transform=outs[1],
                       day="2026-01-02")
    res = run_preprocess(_cfg(window_days=1, evict_unseen_days=None), flat, str(tmp_path / "o3"), IN_MEMORY,
                         say=lambda _: None)  # no lifecycle: no day needed
    assert TransformArtifact.read(os.path.join(res.output, "transform")).day is None
    run_preprocess(cfg, flat, str(tmp_path / "o4"), IN_MEMORY, say=lambda _: None, day="2026-02-01")
    assert TransformArtifact.read(str(tmp_path / "o4" / "transform")).day == "2026-02-01"


@pytest.mark.integration
def test_warm_start_rows_follow_the_values(four_days):
    from recpipe.trainers.warm_start import _row_map
    cfg, _, _, arts = four_days
    today, earlier = _row_map(cfg, arts[1], arts[3], "item", 6, 6)  # [a, b, c, x] -> [a, d, c, b]
    assert today.tolist() == [0, 2, 3] and earlier.tolist() == [0, 2, 1]  # b moved from ID 1 to 3; d is new: fresh
    today, earlier = _row_map(cfg, arts[2], arts[3], "item", 6, 6)  # [a, d, c, x] -> [a, d, c, b]
    assert today.tolist() == earlier.tolist() == [0, 1, 2]  # b reuses x's slot: initialised fresh


@pytest.mark.integration
def test_prune_keeps_the_values_seen_in_the_last_days_and_compacts_the_table(four_days):
    _, _, _, arts = four_days
    p = prune_vocabularies(arts[3], 1)  # day 4: [a, d, c, b], d and c last seen on day 3
    assert p.artifact.vocabularies["item"] == ["a", "b"] and arts[3].vocabularies["item"] == ["a", "d", "c", "b"]
    assert p.rows["item"].tolist() == [0, 3, 4, 5]  # the kept values' rows, then the 2 OOV buckets' rows
    assert p.id_map["item"].tolist() == [0, -1, -1, 1, 2, 3]
    assert p.artifact.table_sizes()["item"] == 4 and p.report["tables"]["item"]["pruned"] == 2
    assert prune_vocabularies(arts[3], 2).artifact.vocabularies["item"] == ["a", "d", "c", "b"]
    assert prune_vocabularies(arts[2], 1).artifact.vocabularies["item"] == ["a", "d", "c"]  # x: day 2
    with pytest.raises(PruneError, match="expected a number of days >= 1"):
        prune_vocabularies(arts[3], 0)
    dayless = TransformArtifact(config=arts[3].config, raw_schema=arts[3].raw_schema,
                                vocabularies=arts[3].vocabularies)
    with pytest.raises(PruneError, match="has no day"):
        prune_vocabularies(dayless, 1)


@pytest.mark.system
def test_pruned_export_maps_unseen_values_to_oov_and_passes_the_skew_check(tmp_path, four_days):
    from recpipe.serving.export.savedmodel import export_model
    from recpipe.serving.server.registry import load_version
    from recpipe.trainers.model_dir import load_trained
    from recpipe.trainers.options import TrainOptions
    from recpipe.trainers.train import train
    _, _, outs, _ = four_days
    model_dir = str(tmp_path / "m")
    train(TrainOptions(data_dir=outs[3], model_dir=model_dir), say=lambda _: None)
    path = export_model(model_dir, str(tmp_path / "export"), version=1, prune_unseen_days=1)
    version = ExportBase(str(tmp_path / "export")).versions()[0]
    assert version.skew_report()["passed"]
    pruned = version.meta().weights["pruned"]
    assert pruned["tables"]["item"] == {"slots": 4, "kept": 2, "pruned": 2, "free_slots_dropped": 0,
                                        "rows_before": 6, "rows_after": 4}
    stored = [tuple(v.shape) for v in tf.saved_model.load(path).weights]
    assert (4, 1) in stored and (4, 4) in stored and not [s for s in stored if s[:1] == (6,)]  # both tables pruned
    # the served scores of a, b, d, c against the trained model's at the IDs they now have
    tokens = ["a", "b", "d", "c"]
    served = load_version(path, 1).fn(item=tf.constant(tokens))["score"].numpy()
    _, _, model = load_trained(model_dir)
    assert sorted(tuple(v.shape) for v in model.weights if v.shape[:1] == (6,)) == [(6, 1), (6, 4)]
    oov = 4 + tf.strings.to_hash_bucket_fast(tf.constant(tokens[2:]), 2).numpy()
    trained = tf.sigmoid(model({"item": tf.constant([0, 3, *oov], tf.int64)}))[:, 0].numpy()
    np.testing.assert_allclose(served, trained, atol=1e-6)  # d and c: OOV tokens now, with the trained OOV rows


@pytest.mark.system
def test_pruned_retrieval_export_leaves_stale_candidates_out_of_the_index(tmp_path, four_days):
    """Two towers over the same four days: the day-4 export with --prune-unseen-days 1 recommends only
    the items seen on day 4 (a, b), and its skew check passes; so does an index read from the data
    (two candidate features), whose kept candidates are scored as the pruned model scores them."""
    from recpipe.serving.export.savedmodel import export_model
    from recpipe.serving.server.registry import load_version
    from recpipe.trainers.options import TrainOptions
    from recpipe.trainers.train import train
    _, log, _, _ = four_days
    d = config_to_dict(_cfg())
    d["features"]["sparse"] += [{"name": "user", "column": "user", "hash_buckets": 4, "embedding_dim": 4},
                                {"name": "item_hash", "column": "item", "hash_buckets": 4, "embedding_dim": 4}]
    d["model"] = {"task": "retrieval", "type": "two_tower", "query_features": ["user"],
                  "candidate_features": ["item"], "tower_layers": [4]}
    cfg, prev = parse_config(d), None
    for day in DAYS:
        out = str(tmp_path / day)
        run_preprocess(cfg, os.path.join(log, f"dt={day}"), out, IN_MEMORY, say=lambda _: None,
                       previous_transform=prev)
        prev = out
    model_dir = str(tmp_path / "m")
    train(TrainOptions(data_dir=prev, model_dir=model_dir, config_path=None), say=lambda _: None)
    path = export_model(model_dir, str(tmp_path / "export"), version=1, prune_unseen_days=1)
    version = ExportBase(str(tmp_path / "export")).versions()[0]
    assert version.skew_report()["passed"]
    assert version.meta().weights["pruned"]["tables"]["item"]["kept"] == 2
    served = load_version(path, 1).fn(user=tf.constant(["u0", "u1"]))
    assert {c.decode() for c in served["candidates"].numpy().ravel()} <= {"a", "b"}
    assert served["candidates"].shape == (2, 2)  # the index holds the two values seen on day 4
    d["model"]["candidate_features"] = ["item", "item_hash"]  # the index is then read from the data
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(d))
    train(TrainOptions(data_dir=prev, model_dir=str(tmp_path / "m2"), config_path=str(tmp_path / "two.yaml")),
          say=lambda _: None)
    pruned = load_version(export_model(str(tmp_path / "m2"), str(tmp_path / "e2"), version=1,
                                       prune_unseen_days=1), 1)
    assert ExportBase(str(tmp_path / "e2")).versions()[0].skew_report()["passed"]
    full = load_version(export_model(str(tmp_path / "m2"), str(tmp_path / "e3"), version=1), 1)

    def scored(lv):
        out = lv.fn(user=tf.constant(["u0"]))
        return dict(zip([c.decode() for c in out["candidates"].numpy()[0]], out["scores"].numpy()[0].tolist()))
    # day 4's data holds a, b and OOV items, none pruned: the same candidates with the same scores, though
    # b's ID moved from 3 to 1 (the pruned index is renumbered with the pruned tables)
    want, got = scored(full), scored(pruned)
    assert {"a", "b"} <= set(got) and {"c", "d"}.isdisjoint(got)
    assert {k for k in want if not k.isdigit()} == {k for k in got if not k.isdigit()}
    for label in ("a", "b"):
        assert abs(want[label] - got[label]) < 1e-5, (label, want, got)


@pytest.mark.unit
def test_pruned_candidates_leave_the_index_and_attributes_are_renumbered():
    """pruned_candidates: a candidate whose own value was pruned leaves the index; the kept ones' IDs
    and attribute IDs (multivalent too) are the pruned graph's, a pruned attribute value its OOV bucket."""
    from recpipe.serving.export.prune import pruned_candidates
    from recpipe.trainers.evaluation.candidates import Candidates
    cfg = parse_config({"name": "c", "label": {"column": "label"}, "features": {"sparse": [
        {"name": "item", "column": "item", "vocab": {"min_count": 1, "oov_buckets": 2}},
        {"name": "tags", "column": "tags", "multivalent": True, "vocab": {"min_count": 1, "oov_buckets": 3}},
        {"name": "user", "column": "user", "hash_buckets": 4}]},
        "model": {"task": "retrieval", "type": "two_tower", "query_features": ["user"],
                  "candidate_features": ["item", "tags"]}})
    day = day_number("2026-01-04")
    art = TransformArtifact(config=cfg, raw_schema={"item": "string", "tags": "list<string>", "user": "string",
                                                               "label": "int"},
                            vocabularies={"item": ["a", "d", "c", "b"], "tags": ["x", "y", "z"]},
                            vocab_counts={"item": [1] * 4, "tags": [1] * 3}, dense_stats={}, day="2026-01-04",
                            vocab_last_seen={"item": [day, day - 1, day - 1, day], "tags": [day, day - 2, day]})
    pruning = prune_vocabularies(art, 1)  # kept: items a, b (-> 0, 1); tags x, z (-> 0, 1)
    candidates = Candidates(ids=np.array([0, 1, 3, 5]), features={
        "item": [0, 1, 3, 5], "tags": [np.array([0, 1]), np.array([2]), np.array([1, 2]), np.array([], np.int64)]})
    out = pruned_candidates(pruning, ["item", "tags"], candidates)
    y_bucket = 2 + int(tf.strings.to_hash_bucket_fast(["y"], 3).numpy()[0])  # y pruned: 2 kept tags + its bucket
    assert out.ids.tolist() == [0, 1, 3] and out.features["item"] == [0, 1, 3]  # d left; OOV row 5 -> 3
    assert [t.tolist() for t in out.features["tags"]] == [[0, y_bucket], [y_bucket, 1], []]  # z: 2 -> 1


@pytest.mark.unit
def test_the_truth_column_changes_nothing_else_and_scores_each_days_eval_rows(tmp_path):
    """recpipe.pipeline.synthetic's `truth_column` adds each row's click probability and leaves every other
    column as it was; the lifecycle bench's oracle AUC scores the day's eval rows (those after the
    Beam job's time cutoff) with it."""
    from recpipe.common.metrics import roc_auc
    from recpipe.pipeline.synthetic import TRUTH_COLUMN, GenerateSpec, generate_log
    from recpipe.bench.lifecycle import oracle_aucs
    spec = dict(rows=6_000, days=2, seed=7, num_users=200, num_items=100, item_drift=20)
    generate_log(GenerateSpec(**spec), str(tmp_path / "plain"))
    generate_log(GenerateSpec(**spec, truth_column=True), str(tmp_path / "truth"))
    plain, truth = (pq.read_table(tmp_path / name / "dt=2026-01-02") for name in ("plain", "truth"))
    assert truth.column_names == [*plain.column_names, TRUTH_COLUMN]
    assert truth.drop_columns([TRUTH_COLUMN]).equals(plain)
    p, label = truth.column(TRUTH_COLUMN).to_numpy(), truth.column("label").to_numpy()
    assert 0 < p.min() and p.max() < 1 and abs(p.mean() - label.mean()) < 0.03  # labels drawn with p
    aucs = oracle_aucs(str(tmp_path / "truth"), ["2026-01-01", "2026-01-02"], 0.2)
    ts = truth.column("ts").to_numpy()
    cutoff = np.sort(ts)[len(ts) - int(0.2 * len(ts)) - 1]  # the key leaving 80 % of the rows at or before it
    assert aucs[1] == pytest.approx(roc_auc(label[ts > cutoff].astype(float), p[ts > cutoff]))
    assert all(0.7 < a < 1 for a in aucs), aucs  # the hidden model itself: what a trained model aims at


@pytest.mark.unit
def test_lifelong_popularity_keeps_each_items_rank_and_day_one_of_the_drift_free_log(tmp_path):
    """recpipe.pipeline.synthetic's item_popularity="lifelong": every day's window holds every Zipf rank once, an item
    keeps its rank from its first day to its last (the stopping items take random ranks, not the top ones as
    with "window"), and the drifting log's first day is the drift-free log's."""
    from recpipe.pipeline.synthetic import GenerateSpec, _items_of_ranks, generate_log
    n, drift, days = 50, 10, 4
    spec = GenerateSpec(rows=1, days=days, seed=3, num_items=n, item_drift=drift, item_popularity="lifelong")
    held = [_items_of_ranks(spec, np.arange(n), d * drift) for d in range(days)]  # held[d][rank] = item
    for d, items in enumerate(held):
        assert sorted(items.tolist()) == list(range(d * drift, d * drift + n))
    for d in range(days - 1):
        rank_today = {int(item): r for r, item in enumerate(held[d])}
        rank_next = {int(item): r for r, item in enumerate(held[d + 1])}
        assert all(rank_next[i] == r for i, r in rank_today.items() if i in rank_next)
        stopping = sorted(r for i, r in rank_today.items() if i not in rank_next)
        assert len(stopping) == drift and stopping != list(range(drift))  # "window" stops ranks 0..drift-1
        assert sorted(rank_next[i] for i in rank_next if i not in rank_today) == stopping  # new items take them
    small = dict(rows=4_000, days=2, seed=3, num_users=100, num_items=n, item_popularity="lifelong")
    generate_log(GenerateSpec(**small, item_drift=drift), str(tmp_path / "drift"))
    generate_log(GenerateSpec(**small), str(tmp_path / "stable"))
    first = [pq.read_table(tmp_path / name / "dt=2026-01-01") for name in ("drift", "stable")]
    assert first[0].equals(first[1])
    second = [pq.read_table(tmp_path / name / "dt=2026-01-02") for name in ("drift", "stable")]
    assert not second[0].column("item_id").equals(second[1].column("item_id"))
    with pytest.raises(ValueError, match="item_popularity must be one of window, lifelong .got 'rising'."):
        generate_log(GenerateSpec(rows=10, item_popularity="rising"), str(tmp_path / "bad"))
