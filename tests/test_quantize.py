"""Smaller served models (recpipe.serving.export.quantize, `recpipe export --embedding-dtype/--dense-dtype`): int8 codes
stay within half a step of every weight, a quantized model keeps no float32 copy of what it swapped and
scores close to the float one, and an int8 export is served, skew-checked exactly and much smaller."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from recpipe.serving.export.savedmodel import export_model
from recpipe.serving.export.quantize import (MIN_EXPONENT, MIN_ROW_WIDTH, PackedEmbeddings, PackedTables, QuantizedDense,
                              pow2_exponents, quantize_int8, quantize_model)
from recpipe.trainers.layers import SparseEmbeddings
from recpipe.serving.server.registry import load_version
from recpipe.serving.server.rest import parse_predict_body
from recpipe.serving.version import ExportBase
from recpipe.trainers.model_dir import load_trained

from helpers import raw_rows


@pytest.mark.unit
def test_int8_codes_are_within_half_a_step_of_every_weight():
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.05, (50, 16)).astype(np.float32)
    w[3] = 0.0                      # an untouched row
    w[7, 2] = 4.0                   # an outlier only costs its own row precision
    for pow2 in (False, True):
        codes, scale = quantize_int8(w, axis=1, pow2_scale=pow2)
        assert codes.dtype == np.int8 and scale.shape == (50, 1)
        assert np.abs(codes.astype(np.int32)).max() <= 127
        assert np.all(np.abs(codes * scale - w) <= scale / 2 + 1e-9)
        assert not codes[3].any()
        assert np.abs(codes[7] * scale[7] - w[7]).max() > np.abs(codes[8] * scale[8] - w[8]).max()
    _, free = quantize_int8(w, axis=1)
    assert free[3, 0] == 0.0
    codes, scale = quantize_int8(w, axis=1, pow2_scale=True)
    exponents = np.log2(scale)
    assert np.all(exponents == np.rint(exponents)) and exponents[3, 0] == MIN_EXPONENT  # exact powers of two
    peaks = np.abs(codes.astype(np.int32)).max(axis=1)
    assert np.all(np.delete(peaks, 3) >= 64)  # the smallest power of two that fits: at most one bit lost
    nonzero = np.delete(np.arange(50), 3)
    assert np.all((scale[nonzero] >= free[nonzero]) & (scale[nonzero] < 2 * free[nonzero]))
    edge = np.array([127 * 2.0 ** -7, np.nextafter(np.float32(127 * 2.0 ** -7), np.float32(1)), 0.0])
    assert pow2_exponents(edge).tolist() == [-7, -6, MIN_EXPONENT]  # exactly 127 * 2**e still fits 2**e
    codes, scale = quantize_int8(w, axis=None)
    assert scale.shape == (1, 1) and np.abs(codes).max() == 127
    with pytest.raises(ValueError, match="non-finite"):
        quantize_int8(np.array([[np.nan, 1.0]]), axis=1)


def _variable_bytes(model) -> int:
    return sum(v.shape.num_elements() * v.dtype.size for v in model.variables)


def _batch(cfg, n=64, seed=0):
    from recpipe.trainers.models import dummy_batch
    rng = np.random.default_rng(seed)
    batch = dummy_batch(cfg, n)
    for f in cfg.features.sparse:
        ids = tf.constant(rng.integers(0, 5, n), tf.int64)
        batch[f.name] = tf.RaggedTensor.from_row_lengths(ids, tf.ones([n], tf.int64)) if f.multivalent else ids
    for d in cfg.features.dense:
        batch[d.name] = tf.constant(rng.normal(size=n), tf.float32)
    return batch


@pytest.mark.integration
def test_quantize_model_swaps_every_table_and_dense_layer(trained):
    cfg, _, model = load_trained(trained)
    batch = _batch(cfg)
    before, size = tf.sigmoid(model(batch)).numpy(), _variable_bytes(model)
    tables = sum(len(layer.tables) for layer in model._flatten_layers() if hasattr(layer, "tables"))
    dense = sum(type(layer) is tf.keras.layers.Dense for layer in model._flatten_layers())
    info = quantize_model(model, "int8", "int8")
    assert info["embedding_tables"] == tables > 0 and info["dense_layers"] == dense > 0
    layers = list(model._flatten_layers())
    assert not [x for x in layers if isinstance(x, (SparseEmbeddings, tf.keras.layers.Dense))]
    packed = [x for x in layers if isinstance(x, PackedEmbeddings)]
    assert sum(len(store.rows) for x in packed for store in x.stores) == tables
    assert sum(isinstance(x, QuantizedDense) for x in layers) == dense
    assert {v.dtype for v in model.variables if v.shape.rank == 2 and v.shape[0] > 1} <= {tf.int8, tf.bfloat16,
                                                                                         tf.float32}
    assert _variable_bytes(model) < 0.35 * size  # no float32 copy of a swapped weight is left behind
    after = tf.sigmoid(model(batch)).numpy()
    assert np.abs(after - before).max() < 5e-3
    with pytest.raises(ValueError, match="int4"):
        quantize_model(model, "int4")


@pytest.mark.unit
def test_packed_tables_look_up_their_own_rows_and_narrow_tables_share_one_scale():
    a, b = np.linspace(-1, 1, 20, dtype=np.float32).reshape(20, 1), np.full((3, 1), 0.5, np.float32)
    narrow = PackedTables([a, b], "int8")
    assert narrow.exponent is None and len(narrow.table_scales) == 2 and MIN_ROW_WIDTH > 1
    assert narrow.codes.shape == (23, 1) and narrow.offsets == [0, 20]
    got = narrow.lookup([0, 1], tf.constant([[0, 2], [19, 0]]), "t").numpy()[..., 0]
    np.testing.assert_allclose(got, [[-1.0, 0.5], [1.0, 0.5]], atol=1e-6)
    for bad in ([[20, 0]], [[0, 3]], [[-1, 0]]):  # past a table's end is the next table's row: refused
        with pytest.raises(tf.errors.InvalidArgumentError, match="t: an embedding ID outside its table's rows"):
            narrow.lookup([0, 1], tf.constant(bad), "t")
    wide = PackedTables([np.ones((3, MIN_ROW_WIDTH), np.float32), np.zeros((2, MIN_ROW_WIDTH), np.float32)], "int8")
    assert wide.exponent.shape == (5, 1) and wide.exponent.dtype == tf.int8 and wide.codes.dtype == tf.int8
    np.testing.assert_array_equal(wide.lookup([1, 0], tf.constant([[1, 2]]), "t").numpy()[0, :, 0], [0.0, 1.0])
    rows = PackedTables([np.ones((3, MIN_ROW_WIDTH), np.float32)], "bfloat16")
    assert rows.codes.dtype == tf.bfloat16 and rows.lookup([0], tf.constant([[2]]), "t").dtype == tf.float32
    with pytest.raises(ValueError, match="one width"):
        PackedTables([np.ones((3, 4), np.float32), np.ones((3, 8), np.float32)], "int8")


@pytest.mark.integration
def test_int8_export_is_smaller_skew_checked_and_served(tmp_path, trained, exported, small_log, small_cfg):
    base = str(tmp_path / "exp")
    path = export_model(trained, base, version=3, embedding_dtype="int8", dense_dtype="int8")
    report = json.loads(Path(os.path.join(path, "skew_check.json")).read_text())
    assert report["passed"] and report["max_abs_diff"] <= 1e-5  # against the model holding the same int8 weights
    meta = ExportBase(base).versions()[0].meta()
    assert meta.weights["embedding_dtype"] == meta.weights["dense_dtype"] == "int8"
    assert meta.weights["embedding_tables"] > 0 and meta.weights["dense_layers"] > 0

    def weight_bytes(p):
        folder = os.path.join(p, "variables")
        return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    assert weight_bytes(path) < 0.35 * weight_bytes(exported[1])
    rows, _ = raw_rows(small_log, small_cfg, 6)
    int8, fp32 = load_version(path, 3), load_version(exported[1], 1)
    request = parse_predict_body({"instances": rows}, fp32.inputs)[0]
    a, b = np.asarray(int8.predict(request)["score"]), np.asarray(fp32.predict(request)["score"])
    assert a.shape == (6,) and np.abs(a - b).max() < 5e-3
