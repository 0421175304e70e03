"""The models' building blocks are Keras-serialisable: each layer and model round-trips through its
config (same outputs with the same weights), and a ranking model survives a SavedModel round trip."""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from conftest import small_config_dict
from recpipe.features.config import parse_config
from recpipe.trainers.layers import CrossStack, DotInteractionBlock, SparseEmbeddings, pairwise_dots
from recpipe.trainers.models import RankingModel, RetrievalModel, build_model, dummy_batch

pytestmark = pytest.mark.unit  # layers and models built and called in this process: nothing trained


def _roundtrip(layer: tf.keras.layers.Layer) -> tf.keras.layers.Layer:
    config = tf.keras.layers.serialize(layer)
    assert config["registered_name"] == f"recpipe>{type(layer).__name__}", config  # registered by name
    return tf.keras.layers.deserialize(config)


def _same(layer, call):
    out = call(layer)
    copy = _roundtrip(layer)
    call(copy)  # build
    copy.set_weights(layer.get_weights())
    out2 = call(copy)
    for a, b in zip(tf.nest.flatten(out), tf.nest.flatten(out2)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    return copy


def test_sparse_embeddings_roundtrip_dedup_and_pooling():
    tables = {"item": {"rows": 10, "dim": 4}, "user": {"rows": 7, "dim": 4}}
    features = [{"name": "user", "table": "user", "multivalent": False, "combiner": "mean"},
                {"name": "item", "table": "item", "multivalent": False, "combiner": "mean"},
                {"name": "hist", "table": "item", "multivalent": True, "combiner": "sum"}]
    batch = {"user": tf.constant([1, 2, 1], tf.int64), "item": tf.constant([3, 3, 9], tf.int64),
             "hist": tf.ragged.constant([[3, 4], [], [9, 9, 1]], tf.int64)}
    for dedup in (False, True):
        layer = SparseEmbeddings(tables, features, dedup=dedup)
        copy = _same(layer, lambda lay: lay(batch))
        assert copy.dedup is dedup and copy.table_specs == tables
    out = layer(batch)
    item = layer.tables["item"].embeddings.numpy()
    np.testing.assert_allclose(out["hist"].numpy()[2], item[9] * 2 + item[1], rtol=1e-6)  # sum combiner
    np.testing.assert_allclose(out["hist"].numpy()[1], 0.0)  # an empty list pools to zeros


@pytest.mark.parametrize("low_rank", [None, 3])
def test_cross_stack_roundtrip(low_rank):
    embedded = [tf.random.normal([5, 4]), tf.random.normal([5, 4])]
    dense = tf.random.normal([5, 3])
    copy = _same(CrossStack(2, low_rank), lambda lay: lay(embedded, dense))
    assert copy.num_layers == 2 and copy.low_rank == low_rank


@pytest.mark.parametrize("low_rank", [None, 3])
def test_cross_layers_compute_in_the_mixed_precision_dtype(tmp_path, low_rank):
    """Under mixed_bfloat16 every cross matmul runs in bfloat16 on float32 variables (TFRS 0.7.7's Cross ran
    them in float32), and a checkpoint of TFRS's own Cross stack loads into ours, value for value."""
    import tensorflow_recommenders as tfrs
    from recpipe.trainers.optim import precision_policy
    embedded = [tf.random.normal([5, 4]), tf.random.normal([5, 4])]
    with precision_policy("bf16"):
        stack = CrossStack(2, low_rank)
        fn = tf.function(lambda: stack([tf.cast(e, tf.bfloat16) for e in embedded]))
        graph = fn.get_concrete_function().graph
    matmuls = [op for op in graph.get_operations() if op.type == "MatMul"]
    assert len(matmuls) == 2 * (1 if low_rank is None else 2)
    assert {op.get_attr("T") for op in matmuls} == {tf.bfloat16}
    assert fn().dtype == tf.bfloat16 and {v.dtype for v in stack.variables} == {tf.float32}

    theirs = [tfrs.layers.dcn.Cross(projection_dim=low_rank) for _ in range(2)]
    x0 = tf.concat(embedded, axis=1)
    for layer in theirs:
        layer(x0, x0)
    ours = CrossStack(2, low_rank)
    ours(embedded)
    path = tf.train.Checkpoint(cross=theirs).save(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(cross=ours.cross).restore(path).assert_consumed()
    for a, b in zip(theirs, ours.cross):
        assert [w.shape for w in a.get_weights()] == [w.shape for w in b.get_weights()]
        for wa, wb in zip(a.get_weights(), b.get_weights()):
            np.testing.assert_array_equal(wa, wb)


def test_dot_interaction_roundtrip():
    embedded = [tf.random.normal([5, 4]) for _ in range(3)]
    dense = tf.random.normal([5, 2])
    layer = DotInteractionBlock([8], 4)
    assert _same(layer, lambda lay: lay(embedded, dense)).bottom_layers == [8]
    assert layer(embedded, dense).shape == (5, 4 + 6)  # bottom output + the dot products of 4 features' 6 pairs


def test_pairwise_dots_are_every_distinct_pair_once():
    features = [tf.random.normal([3, 5], seed=i) for i in range(4)]
    x = np.stack([f.numpy() for f in features], axis=1)
    want = [np.sum(x[:, i] * x[:, j], axis=1) for i in range(4) for j in range(i)]  # lower triangle, by rows
    np.testing.assert_allclose(pairwise_dots(features).numpy(), np.stack(want, axis=1), rtol=1e-5)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_pairwise_dots_gradient_is_autodiffs_of_the_plain_products(dtype):
    # the custom gradient (one batched matmul of the symmetric pair gradients) against autodiff of
    # the products gathered the plain way, for every feature and a weighting that tells pairs apart
    n = 5
    features = [tf.Variable(tf.cast(tf.random.normal([3, 4], seed=i), dtype)) for i in range(n)]
    weights = tf.cast(tf.random.normal([3, n * (n - 1) // 2], seed=99), dtype)
    rows, cols = np.tril_indices(n, -1)

    def plain(fs):
        x = tf.stack(fs, axis=1)
        return tf.gather(tf.reshape(tf.matmul(x, x, transpose_b=True), [3, n * n]), rows * n + cols, axis=1)

    grads = []
    for f in (pairwise_dots, plain):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(f(features) * weights)
        grads.append([g.numpy().astype(np.float32) for g in tape.gradient(loss, features)])
    tol = 1e-6 if dtype == tf.float32 else 2e-2
    for ours, want in zip(*grads):
        np.testing.assert_allclose(ours, want, rtol=tol, atol=tol)


def _artifact(cfg):
    from recpipe.features.artifact import TransformArtifact
    vocabs = {f.name: [f"v{i}" for i in range(20)] for f in cfg.features.sparse
              if f.vocab is not None and f.share_embedding_with is None}
    stats = {d.name: {"mean": 0.0, "std": 1.0, "boundaries": [0.0, 1.0]} for d in cfg.features.dense}
    return TransformArtifact(config=cfg, raw_schema={}, vocabularies=vocabs, dense_stats=stats)


@pytest.mark.parametrize("model", [{"type": "dcn_v2", "cross_layers": 1, "deep_layers": [8]},
                                   {"type": "dlrm", "bottom_layers": [8], "deep_layers": [8]},
                                   {"type": "logistic"},
                                   {"task": "retrieval", "type": "two_tower", "query_features": ["user_id", "hist"],
                                    "candidate_features": ["item_id"], "tower_layers": [8]}])
def test_models_roundtrip_through_config(model):
    d = small_config_dict()
    d["model"] = {"task": "ranking", **model}
    cfg = parse_config(d)
    built = build_model(cfg, _artifact(cfg))
    batch = dummy_batch(cfg, 4)
    out = built(batch)
    cls = RetrievalModel if cfg.model.task == "retrieval" else RankingModel
    copy = cls.from_config(built.get_config())
    copy(batch)
    copy.set_weights(built.get_weights())
    for a, b in zip(tf.nest.flatten(out), tf.nest.flatten(copy(batch))):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)


def test_ranking_model_savedmodel_roundtrip(tmp_path):
    cfg = parse_config(small_config_dict())
    model = build_model(cfg, _artifact(cfg))
    batch = dummy_batch(cfg, 3)
    batch = {**batch, "user_id": tf.constant([1, 5, 7], tf.int64), "I1": tf.constant([0.5, -1.0, 2.0])}
    expected = model(batch).numpy()
    module = tf.Module()
    module.model = model
    module.score = tf.function(lambda b: model(b))
    module.score.get_concrete_function(tf.nest.map_structure(tf.type_spec_from_value, batch))
    tf.saved_model.save(module, str(tmp_path / "m"))
    loaded = tf.saved_model.load(str(tmp_path / "m"))
    np.testing.assert_allclose(loaded.score(batch).numpy(), expected, rtol=1e-6)
    assert os.path.exists(tmp_path / "m" / "saved_model.pb")


def test_table_embedding_is_drawn_in_place_a_block_of_rows_at_a_time():
    """fill_rows draws each block as its own partition (blocks differ), in the initializer's range, over a
    table's every row; TableEmbedding's variable keeps Embedding's name."""
    from recpipe.trainers.layers import TableEmbedding, fill_rows
    table = tf.Variable(tf.zeros((10, 4)))
    fill_rows(table, tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=3), rows_at_once=3)
    got = table.numpy()
    assert np.all(np.abs(got) <= 0.05) and np.all(got != 0)
    assert not np.allclose(got[0:3], got[3:6])  # each block its own draw, not the same one again
    with pytest.raises(ValueError):
        fill_rows(table, tf.keras.initializers.Zeros(), rows_at_once=0)
    emb = TableEmbedding(7, 2, name="emb_x")
    emb.build((None,))
    assert emb.embeddings.name.endswith("embeddings:0") and emb.embeddings.shape == (7, 2)
    assert np.all(np.abs(emb.embeddings.numpy()) <= 0.05) and np.any(emb.embeddings.numpy() != 0)
