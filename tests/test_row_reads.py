"""The tables' Adagrad reuses the rows the forward pass read (recpipe.trainers.row_reads), with the same result."""
import numpy as np
import pytest
import tensorflow as tf

from recpipe.trainers import optim, row_reads
from recpipe.trainers.layers import SparseEmbeddings

pytestmark = pytest.mark.unit  # one small layer stepped in this process

TABLES = {"item": {"rows": 20, "dim": 4}, "user": {"rows": 9, "dim": 4}}
FEATURES = [{"name": "user", "table": "user", "multivalent": False, "combiner": "mean"},
            {"name": "item", "table": "item", "multivalent": False, "combiner": "mean"},
            {"name": "other_item", "table": "item", "multivalent": False, "combiner": "mean"}]
BATCHES = [{"user": tf.constant([1, 2, 1, 8], tf.int64), "item": tf.constant([3, 3, 9, 0], tf.int64),
            "other_item": tf.constant([9, 4, 19, 3], tf.int64)},
           {"user": tf.constant([0, 0, 5, 2], tf.int64), "item": tf.constant([7, 3, 3, 3], tf.int64),
            "other_item": tf.constant([1, 1, 2, 7], tf.int64)}]


def _train(steps: int, dedup: bool = True) -> tuple[dict, list[bool]]:
    """Each table and its accumulator after `steps` steps of the own-step Adagrad, and for each traced
    step whether every table's update found the forward pass's read."""
    tf.keras.utils.set_random_seed(7)
    layer = SparseEmbeddings(TABLES, FEATURES, dedup=dedup)
    layer(BATCHES[0])
    kind = optim._own_step_kind(tf.keras.optimizers.Adagrad, trust_unique=dedup)
    opt = kind(0.5, jit_compile=False)
    weights = {name: tf.constant(np.linspace(-1, 1, 4 * 4).reshape(4, 4), tf.float32)
               for name in ("user", "item", "other_item")}
    found: list[bool] = []

    @tf.function(autograph=False)
    def step(batch):
        variables = layer.trainable_variables
        with tf.GradientTape() as tape:
            out = layer(batch)
            loss = tf.add_n([tf.reduce_sum(tf.square(out[n] - weights[n])) for n in weights])
        grads = tape.gradient(loss, variables)
        found.append(all(row_reads.rows_read(v, g.indices) is not None for v, g in zip(variables, grads)))
        opt.apply_gradients(zip(grads, variables))

    for i in range(steps):
        step(BATCHES[i % 2])
    state = {f"table {t}": layer.tables[t].embeddings.numpy() for t in TABLES}
    by_ref = {v.ref(): a for v, a in zip(layer.trainable_variables, opt._accumulators)}
    state.update({f"accumulator {t}": by_ref[layer.tables[t].embeddings.ref()].numpy() for t in TABLES})
    return state, found


def test_adagrad_updates_the_rows_the_forward_pass_read():
    reused, found = _train(4)
    assert found and all(found)  # in every trace, every table's update used the forward read
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(row_reads, "rows_read", lambda table, indices: None)
        gathered, _ = _train(4)
    assert reused.keys() == gathered.keys()
    for name in reused:
        np.testing.assert_array_equal(reused[name], gathered[name], err_msg=name)


def test_rows_read_finds_nothing_for_other_indices_or_outside_a_function():
    table = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), [6, 2]))
    eager = tf.constant([4, 1], tf.int64)  # captured by the function below: a value, not a traced tensor
    seen = []

    @tf.function(autograph=False)
    def f():
        ids, _ = tf.unique(tf.constant([4, 1, 4], tf.int64))
        row_reads.record(table, ids, table.sparse_read(ids))
        other = tf.identity(ids)
        seen.extend([row_reads.rows_read(table, ids) is not None,
                     row_reads.rows_read(table, tf.reshape(ids, [-1])) is not None,
                     row_reads.rows_read(table, other) is None,
                     row_reads.rows_read(table, eager) is None])
        return ids

    f()
    assert seen == [True, True, True, True]
    assert row_reads.rows_read(table, tf.constant([4, 1], tf.int64)) is None  # eager: never


def test_without_dedup_adagrad_gathers_the_rows_itself():
    _, found = _train(2, dedup=False)
    assert found and not any(found)  # each feature looks its table up itself: no read is noted to reuse
