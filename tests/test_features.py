"""Canonicalisation (Arrow), the TF transform, and the shard record format."""
import dataclasses
import math

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

from recpipe.features.artifact import TransformArtifact, summary_differences
from recpipe.features.canonical import (LABEL_KEY, SchemaError, canonicalize, check_schema, dense_prenorm, numeric,
                                times, validate_batch)
from recpipe.features.config import parse_config
from recpipe.features.batch_transform import BatchTransform
from recpipe.features.hashing import hash_buckets
from recpipe.features.record_codec import Ragged, RecordError, count_rows, encode_batch, read_records, write_records
from recpipe.features.records import parse_record
from recpipe.features.transform import FeatureTransform, canonical_to_tensors, canonicalize_request, request_spec

pytestmark = pytest.mark.unit


def _cfg():
    return parse_config({
        "name": "t",
        "features": {
            "sparse": [
                {"name": "a", "column": "a", "vocab": {"min_count": 1, "oov_buckets": 2}},
                {"name": "n", "column": "n", "hash_buckets": 50},
                {"name": "tags", "column": "tags", "multivalent": True, "separator": ",", "share_embedding_with": "a"},
                {"name": "lst", "column": "lst", "multivalent": True, "hash_buckets": 10},
                {"name": "a_x_n", "cross": ["a", "n"], "hash_buckets": 1000},
            ],
            "dense": [
                {"name": "x", "column": "x", "transform": "log_zscore", "fill": 0},
                {"name": "z", "column": "x", "transform": "zscore", "fill": 2},
                {"name": "b", "column": "x", "transform": "bucketize", "num_buckets": 3},
            ],
        },
    })


def _table():
    return pa.table({
        "label": pa.array([1, 0, None, 3, 0], pa.int64()),
        "a": pa.array(["p", None, "q", "p", "zz"]),
        "n": pa.array([7, None, 12, 7, 0], pa.int64()),
        "tags": pa.array(["p,q", "", None, ",p,,", "r"]),
        "lst": pa.array([[1, 2], [], None, [3], [1]], pa.list_(pa.int64())),
        "x": pa.array([1.0, None, 3.0, float("inf"), 10.0]),
    })


def _artifact(cfg):
    return TransformArtifact(config=cfg, raw_schema=check_schema(_table().schema, cfg, "mem"),
                             vocabularies={"a": ["p", "q"]}, vocab_counts={"a": [3, 1]},
                             dense_stats={"x": {"mean": 1.0, "std": 2.0}, "z": {"mean": 0.0, "std": 0.0},
                                          "b": {"boundaries": [1.5, 5.0]}})


def test_schema_errors_name_file_and_column():
    cfg = _cfg()
    with pytest.raises(SchemaError, match=r"f.parquet: column 'x' required by the config is missing"):
        check_schema(_table().drop(["x"]).schema, cfg, "f.parquet")
    with pytest.raises(SchemaError, match=r"f.parquet: column 'a' \(list<string>\) cannot feed sparse feature 'a'"):
        check_schema(_table().set_column(1, "a", pa.array([["x"]] * 5)).schema, cfg, "f.parquet")
    with pytest.raises(SchemaError, match=r"column 'x' \(list<int>\) cannot feed dense feature"):
        check_schema(_table().set_column(5, "x", pa.array([[1]] * 5)).schema, cfg, "f.parquet")
    # string-typed numbers are fine at schema level: they are parsed row by row
    assert check_schema(_table().set_column(5, "x", pa.array(["1"] * 5)).schema, cfg, "f.parquet")["x"] == "string"
    # uint64 is a kind of its own (served as uint64); with int64 files of the same column it is int, as before
    assert check_schema(_table().set_column(5, "x", pa.array([1] * 5, pa.uint64())).schema, cfg, "f")["x"] == "uint64"
    assert check_schema(_table().set_column(5, "x", pa.array([1] * 5, pa.uint32())).schema, cfg, "f")["x"] == "int"
    from recpipe.features.canonical import NULL_KIND, merged_kind
    assert [merged_kind(a, b) for a, b in [("int", "uint64"), ("uint64", "int"), ("list<uint64>", "list<int>"),
                                           ("uint64", NULL_KIND), (NULL_KIND, "uint64"), ("uint64", "string")]] == [
        "int", "int", "list<int>", "uint64", "uint64", None]


def test_numeric_parses_strings_row_by_row():
    values, bad = numeric(pa.array([" 1.5", "x", None, "", "2e3", "inf", "-.5", "1,0"]))
    assert bad.tolist() == [False, True, False, False, False, False, False, True]
    assert values[0] == 1.5 and values[4] == 2000.0 and np.isinf(values[5]) and values[6] == -0.5
    assert np.isnan(values[[1, 2, 3, 7]]).all()
    values, bad = numeric(pa.array([1, None, 3]))
    assert not bad.any() and np.isnan(values[1])


def test_times_read_numbers_and_iso_8601_strings_as_epoch_seconds():
    """A timestamp column of strings: epoch seconds, or ISO 8601 dates and date-times (UTC unless the
    value carries an offset); anything else is unparsable, null and "" are missing."""
    values, bad = times(pa.array(["1767225694", "2026-01-01T00:01:34Z", "2026-01-01 00:01:34",
                                  "2026-01-01T02:01:34+02:00", " 2026-01-01T00:01:34.5 ", "2026-01-01",
                                  "2026-13-01", "yesterday", None, ""]))
    assert values[:4].tolist() == [1_767_225_694.0] * 4
    assert values[4] == 1_767_225_694.5 and values[5] == 1_767_225_600.0
    assert bad.tolist() == [False] * 6 + [True, True, False, False]
    assert np.isnan(values[6:]).all()
    values, bad = times(pa.array([1, None, 3]))
    assert values[0] == 1 and np.isnan(values[1]) and not bad.any()


def test_string_numbers_validate_and_canonicalize():
    cfg = _cfg()
    t = _table().set_column(0, "label", pa.array(["1", "0", "yes", " 0 ", None]))
    t = t.set_column(5, "x", pa.array(["1.0", "", "3", "abc", "10"]))
    good, bad = validate_batch(t, cfg)
    assert bad.indices.tolist() == [2, 3, 4]
    assert bad.reasons == ["label_unparsable", "dense_unparsable", "null_label"]
    assert bad.fields == ["label", "x", "label"]
    c = canonicalize(t.filter(pa.array(good)), cfg)
    assert c[LABEL_KEY].to_pylist() == [1.0, 0.0]
    assert c["x"].to_pylist()[0] == 1.0 and math.isnan(c["x"].to_pylist()[1])


def test_validate_batch_reasons():
    good, bad = validate_batch(_table(), _cfg())
    assert good.tolist() == [True, True, False, False, True]
    assert bad.indices.tolist() == [2, 3]
    assert bad.reasons == ["null_label", "label_not_0_1"]  # first failing check wins
    assert bad.fields == ["label", "label"]


def test_invalid_utf8_found_in_ascii_unicode_sliced_and_list_columns():
    raw = [b"p", b"\xff\xfe", "caf\u00e9".encode(), b"q", b"p"]
    bad_bytes = pa.array(raw, pa.binary()).cast(pa.string(), safe=False)
    t = _table().set_column(1, "a", bad_bytes)
    _, bad = validate_batch(t, _cfg())
    assert (bad.indices.tolist(), bad.reasons[0], bad.fields[0]) == ([1, 2, 3], "invalid_utf8", "a")
    _, bad = validate_batch(t.slice(2), _cfg())  # the bad row sliced off: valid UTF-8 ("café") is kept
    assert bad.reasons == ["null_label", "label_not_0_1"]
    items = pa.array([[b"ok"], [], [b"\xc3"], [b"x"], [b"\xe2\x82\xac"]], pa.list_(pa.binary()))
    t = pa.table({"label": pa.array([1, 0, 0, 1, 0]), "lst": items.cast(pa.list_(pa.string()), safe=False)})
    cfg = parse_config({"name": "t", "features": {"sparse": [
        {"name": "lst", "column": "lst", "multivalent": True, "hash_buckets": 10}]}})
    _, bad = validate_batch(t, cfg)
    assert (bad.indices.tolist(), bad.reasons) == ([2], ["invalid_utf8"])


def test_canonicalize_types_nulls_and_tokens():
    t = _table().take([0, 1, 4])
    c = canonicalize(t, _cfg())
    assert c["a"].to_pylist() == ["p", "", "zz"]
    assert c["n"].to_pylist() == ["7", "", "0"]
    assert c["tags"].to_pylist() == [["p", "q"], [], ["r"]]
    assert c["lst"].to_pylist() == [["1", "2"], [], ["1"]]
    x = c["x"].to_pylist()
    assert x[0] == 1.0 and math.isnan(x[1]) and x[2] == 10.0
    assert c[LABEL_KEY].to_pylist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("values, type_", [
    ([3, None, 2 ** 24 + 1, 2 ** 53, -2 ** 53, 0], pa.int64()),
    ([3, None, 2 ** 53 + 1, 2 ** 62 + 2 ** 38 + 1, -2 ** 62 - 2 ** 38 - 1, 0], pa.int64()),  # double rounding
    ([2 ** 64 - 1, None, 2 ** 63 + 2 ** 39 + 1, 1, 0, 0], pa.uint64()),
    ([None] * 6, pa.int64()),
    ([-128, None, 127, 0, 1, 2], pa.int8()),
])
def test_integer_dense_columns_round_as_through_float64(values, type_):
    """canonicalize's float32 of an integer column is numeric()'s float64 rounded to float32, whichever
    way it is worked out (Arrow's direct cast only where float64 holds every value exactly)."""
    cfg = parse_config({"name": "t", "features": {"sparse": [{"name": "a", "column": "a", "hash_buckets": 5}],
                                                  "dense": [{"name": "x", "column": "x", "fill": 0}]}})
    t = pa.table({"label": pa.array([0] * 6, type_), "a": ["p"] * 6, "x": pa.array(values, type_)})
    c = canonicalize(t, cfg)
    expected = numeric(t.column("x"))[0].astype(np.float32)
    assert c["x"].type == pa.float32() and c["x"].null_count == 0
    np.testing.assert_array_equal(c["x"].to_numpy(), expected)
    np.testing.assert_array_equal(c[LABEL_KEY].to_numpy(), np.zeros(6, np.float32))


def test_dense_prenorm():
    v = np.array([np.nan, -3, 0, np.e - 1], np.float32)
    assert dense_prenorm(v, "zscore", 5.0).tolist() == pytest.approx([5, -3, 0, np.e - 1])
    assert dense_prenorm(v, "log_zscore", 0.0).tolist() == pytest.approx([0, 0, 0, 1])


def test_transform_ids_and_dense():
    cfg = _cfg()
    ft = FeatureTransform(_artifact(cfg))
    c = canonicalize(_table().take([0, 1, 4]), cfg)
    out = ft(canonical_to_tensors({k: v for k, v in c.items() if k != LABEL_KEY}))
    a = out["a"].numpy()
    assert a[0] == 0 and 2 <= a[1] < 4 and 2 <= a[2] < 4  # "" and "zz" are OOV: ids 2..3
    assert out["tags"].to_list()[0] == [0, 1]  # shares a's vocabulary
    n = out["n"].numpy()
    assert n.min() >= 0 and n.max() < 50
    assert n[0] == tf.strings.to_hash_bucket_fast(["7"], 50).numpy()[0]  # FarmHash: stable across runs
    x = out["x"].numpy()
    assert x[0] == pytest.approx((np.log1p(1.0) - 1.0) / 2.0)
    assert x[1] == pytest.approx((0.0 - 1.0) / 2.0)  # missing -> fill 0
    assert out["z"].numpy().tolist() == pytest.approx([1.0, 2.0, 10.0])  # std 0 -> divide by 1; fill 2
    assert out["b"].numpy().tolist() == pytest.approx([0.0, 0.0, 1.0])  # bucket / len(boundaries)


def test_request_path_equals_arrow_path():
    """The serving graph's canonicalisation yields the same IDs/values as the Beam path."""
    cfg = _cfg()
    art = _artifact(cfg)
    ft = FeatureTransform(art)
    rows = _table().take([0, 1, 4])
    via_arrow = ft(canonical_to_tensors({k: v for k, v in canonicalize(rows, cfg).items() if k != LABEL_KEY}))
    spec = request_spec(art)
    assert spec["n"].dtype == tf.int64 and spec["x"].dtype == tf.float32 and spec["lst"].dtype == tf.string
    request = {
        "a": tf.constant(["p", "", "zz"]), "n": tf.constant([7, 0, 0], tf.int64),
        "tags": tf.constant(["p,q", "", "r"]), "lst": tf.constant(["1|2", "", "1"]),
        "x": tf.constant([1.0, float("nan"), 10.0]),
    }
    via_request = ft(canonicalize_request(request, art))
    for k in ("a", "tags", "lst", "x", "z", "b"):
        left, right = via_arrow[k], via_request[k]
        if isinstance(left, tf.RaggedTensor):
            assert left.to_list() == right.to_list(), k
        else:
            np.testing.assert_allclose(left.numpy(), right.numpy(), rtol=0, atol=0, err_msg=k)
    assert via_arrow["n"].numpy()[0] == via_request["n"].numpy()[0]
    # the cross hashes the same joined strings on both paths (row 1's null n is "" in the log, 0 in the request)
    assert "a_x_n" not in spec
    assert via_arrow["a_x_n"].numpy()[[0, 2]].tolist() == via_request["a_x_n"].numpy()[[0, 2]].tolist()
    want = tf.strings.to_hash_bucket_fast(["p\x1f7", "zz\x1f0"], 1000).numpy().tolist()
    assert via_request["a_x_n"].numpy()[[0, 2]].tolist() == want


def test_record_round_trip():
    cfg = _cfg()
    cols = {
        "a": tf.constant([1, 2, 3], tf.int64), "n": tf.constant([4, 5, 6], tf.int64),
        "a_x_n": np.array([7, 8, 1 << 62]), "tags": Ragged(np.array([1, 2, 3]), np.array([1, 0, 2])),
        "lst": Ragged(np.array([9]), np.array([0, 0, 1])),
        "x": tf.constant([0.5, 1.5, 2.5]), "z": np.array([0.0, 0.0, -1e30], np.float32), "b": np.zeros(3, np.float32),
        LABEL_KEY: np.array([1, 0, 1], np.float32),
    }
    back = parse_record(cfg)(tf.constant(encode_batch(cols)))
    assert back["tags"].to_list() == [[1], [], [2, 3]] == cols["tags"].to_list()
    assert back["lst"].to_list() == [[], [], [9]]
    assert back["a"].numpy().tolist() == [1, 2, 3] and back["a_x_n"].numpy().tolist() == [7, 8, 1 << 62]
    assert back["z"].numpy().tolist() == [0.0, 0.0, float(np.float32(-1e30))]
    assert back[LABEL_KEY].numpy().tolist() == [1.0, 0.0, 1.0]
    empty = parse_record(cfg)(tf.constant(encode_batch({k: (Ragged(np.zeros(0, np.int64), np.zeros(0, np.int64))
                                                             if isinstance(v, Ragged) else np.asarray(v)[:0])
                                                         for k, v in cols.items()})))
    assert empty[LABEL_KEY].shape == [0] and empty["tags"].to_list() == []
    with pytest.raises(TypeError, match="1-D float32 or int64"):
        encode_batch({"a": np.zeros(3, np.float64)})


def test_record_files_are_tfrecord_both_ways(tmp_path):
    """Files written without TF read in tf.data, TF's files read here; both CRCs are checked."""
    records = [encode_batch({LABEL_KEY: np.ones(n, np.float32)}) for n in (3, 0, 70_000)]
    ours, theirs = str(tmp_path / "ours.tfrecord"), str(tmp_path / "theirs.tfrecord")
    write_records(ours, records)
    with tf.io.TFRecordWriter(theirs) as w:
        for r in records:
            w.write(r)
    assert [r.numpy() for r in tf.data.TFRecordDataset(ours)] == records
    assert list(read_records(theirs)) == records
    assert count_rows([ours, theirs]) == 2 * 70_003
    data = bytearray(open(ours, "rb").read())
    data[40] ^= 1  # a flipped bit in the first record's data
    (tmp_path / "bad.tfrecord").write_bytes(bytes(data))
    with pytest.raises(RecordError, match="bad.tfrecord: record data fails its CRC"):
        count_rows([str(tmp_path / "bad.tfrecord")])
    (tmp_path / "cut.tfrecord").write_bytes(open(ours, "rb").read()[:-10])
    with pytest.raises(RecordError, match="cut.tfrecord: truncated record"):
        count_rows([str(tmp_path / "cut.tfrecord")])


def test_hash_buckets_are_tfs_farmhash_buckets():
    tokens = ["", "a", "ü", "日本語", "a b", "x" * 17, "y" * 33, "z" * 65, "q" * 300, "\x1f", "12345678901234567890"]
    for buckets in (1, 7, 1 << 20, (1 << 63) - 1):
        want = tf.strings.to_hash_bucket_fast(tokens, buckets).numpy()
        np.testing.assert_array_equal(hash_buckets(pa.array(tokens), buckets), want)
    assert hash_buckets(pa.array([], pa.string()), 3).shape == (0,)


def test_artifact_round_trip(tmp_path):
    cfg = _cfg()
    art = _artifact(cfg)
    art.write(str(tmp_path / "t"))
    back = TransformArtifact.read(str(tmp_path / "t"))
    assert back.vocabularies == {"a": ["p", "q"]}
    assert back.id_space_size(cfg.sparse_by_name["tags"]) == 4  # 2 values + 2 OOV, shared with a
    assert back.table_sizes() == {"a": 4, "n": 50, "lst": 10, "a_x_n": 1000}


def test_mapping_differences_are_ids_and_normalisations_not_counts():
    """What makes another run's rows other model inputs: a value under another ID (an evicted value's
    free slot too) or other dense statistics. Counts, lifecycle state, row counts and float noise a
    re-run's summing order leaves do not."""
    cfg = _cfg()
    a = _artifact(cfg)
    same = dataclasses.replace(a, vocab_counts={"a": [9, 9]}, vocab_last_seen={"a": [1, 2]}, row_counts={"train": 7},
                               dense_stats={**a.dense_stats, "x": {"mean": 1.0 + 1e-13, "std": 2.0, "count": 99}})
    assert a.mapping_differences(same, "A", "B") == []
    freed = dataclasses.replace(a, vocabularies={"a": ["p", None, "r"]})
    assert a.mapping_differences(freed, "A's", "B's") == [
        "feature 'a': 1 of the 2 IDs both vocabularies hold stand for other values (ID 1: 'q' in A's, a free slot in "
        "B's); A's holds 2 values, B's 3"]
    shifted = dataclasses.replace(a, dense_stats={**a.dense_stats, "b": {"boundaries": [1.5, 6.0]}})
    assert a.mapping_differences(shifted, "A's", "B's") == [
        "dense feature 'b' is normalised with boundaries [1.5, 5] in A's transform and boundaries [1.5, 6] in B's"]
    assert len(a.mapping_differences(dataclasses.replace(freed, dense_stats=shifted.dense_stats), "A", "B",
                                     limit=1)) == 2  # the first, and "and 1 more"
    # what Horovod's ranks send each other instead of whole vocabularies: the same verdicts
    assert summary_differences(a.mapping_summary(), same.mapping_summary()) == []
    assert summary_differences(a.mapping_summary(), freed.mapping_summary()) == ["the vocabularies"]
    assert summary_differences(a.mapping_summary(), shifted.mapping_summary()) == [
        "the statistics of dense feature 'b' (boundaries [1.5, 5] against boundaries [1.5, 6])"]


@pytest.mark.parametrize("free_slots", [False, True])
def test_batch_transform_equals_the_graph_transform(free_slots):
    """The Beam job's path without TF (BatchTransform) gives exactly FeatureTransform's IDs, and its
    dense values to float32 rounding (numpy's and Eigen's log1p round apart in the last bit):
    in-vocabulary, OOV buckets, hashed, shared and multivalent features, dense transforms, on a
    batch with many distinct tokens (unicode, empty strings and an empty vocabulary included), also
    when the vocabulary has free slots (evicted values: they map to OOV, and no token maps to the slot)."""
    rng = np.random.default_rng(5)
    cfg = parse_config({"name": "t", "features": {
        "sparse": [{"name": "a", "column": "a", "vocab": {"min_count": 1, "oov_buckets": 7}},
                   {"name": "e", "column": "e", "vocab": {"min_count": 1, "oov_buckets": 3}},
                   {"name": "n", "column": "n", "hash_buckets": 97},
                   {"name": "tags", "column": "tags", "multivalent": True, "share_embedding_with": "a"},
                   {"name": "lst", "column": "lst", "multivalent": True, "hash_buckets": 10},
                   {"name": "a_x_e_x_n", "cross": ["a", "e", "n"], "hash_buckets": 5000}],
        "dense": [{"name": "x", "column": "x", "transform": "log_zscore", "fill": 0},
                  {"name": "z", "column": "x", "transform": "zscore", "fill": 2},
                  {"name": "b", "column": "x", "transform": "bucketize", "num_buckets": 3}]}})
    tokens = [f"t{i}" for i in range(300)] + ["", "ü", "日本", "a b"]
    n = 2_000
    table = pa.table({
        "label": pa.array(rng.integers(0, 2, n)),
        "a": pa.array([tokens[i] for i in rng.integers(0, len(tokens), n)]),
        "e": pa.array([tokens[i] for i in rng.integers(0, len(tokens), n)]),
        "n": pa.array(rng.integers(0, 10_000, n)),
        "tags": pa.array(["|".join(tokens[i] for i in rng.integers(0, len(tokens), rng.integers(0, 4)))
                          for _ in range(n)]),
        "lst": pa.array([list(map(int, rng.integers(0, 50, rng.integers(0, 3)))) for _ in range(n)],
                        pa.list_(pa.int64())),
        "x": pa.array(np.where(rng.random(n) < 0.1, np.nan, rng.lognormal(1, 2, n)))})
    vocab_a = tokens[:150:3] + ["ü"]
    freed = set(range(0, 51, 5)) if free_slots else set()
    vocab_a = [None if i in freed else v for i, v in enumerate(vocab_a)]
    art = TransformArtifact(config=cfg, raw_schema=check_schema(table.schema, cfg, "mem"),
                            vocabularies={"a": vocab_a, "e": []}, vocab_counts={"a": [1] * 51, "e": []},
                            dense_stats={"x": {"mean": 1.0, "std": 2.0}, "z": {"mean": 0.5, "std": 3.0},
                                         "b": {"boundaries": [1.5, 5.0]}})
    cols = {k: v for k, v in canonicalize(table, cfg).items() if k != LABEL_KEY}
    graph = FeatureTransform(art)(canonical_to_tensors(cols))
    batch = BatchTransform(art)(cols)
    assert set(batch) == set(graph)
    for k, want in graph.items():
        got = batch[k]
        if isinstance(want, tf.RaggedTensor):
            assert got.to_list() == want.to_list(), k
        elif want.dtype == tf.float32:
            assert got.dtype == np.float32, k
            # log1p's last bit, scaled by the z-score (no ulp bound: a value near the mean cancels)
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6, err_msg=k)
        else:
            assert got.dtype == want.numpy().dtype, k
            np.testing.assert_array_equal(got, want.numpy(), err_msg=k)
    assert (batch["a"] >= 51).any() and (batch["a"] < 51).any() and (batch["e"] >= 0).all()
    assert not set(batch["a"].tolist()) & freed  # an evicted value (t0, t15, ...) is OOV now
    if free_slots:
        assert batch["a"][np.asarray(cols["a"].to_pylist()) == "t0"].min() >= 51


def _wide_artifact(k: int, vocab_size: int = 2) -> TransformArtifact:
    """k vocabulary, k hashed and k dense features, one column each."""
    cfg = parse_config({"name": "t", "features": {
        "sparse": [{"name": f"s{i}", "column": f"s{i}", "vocab": {"min_count": 1, "oov_buckets": 3}}
                   for i in range(k)] + [{"name": f"h{i}", "column": f"h{i}", "hash_buckets": 7 + i}
                                         for i in range(k)],
        "dense": [{"name": f"d{i}", "column": f"d{i}", "transform": "log_zscore" if i % 2 else "zscore"}
                  for i in range(k)]}})
    raw = pa.table({"label": [0], **{f"s{i}": ["v"] for i in range(k)}, **{f"h{i}": ["v"] for i in range(k)},
                    **{f"d{i}": [1.0] for i in range(k)}})
    vocab = ["v", *(f"w{j}" for j in range(1, vocab_size))]
    return TransformArtifact(config=cfg, raw_schema=check_schema(raw.schema, cfg, "mem"),
                             vocabularies={f"s{i}": vocab for i in range(k)},
                             vocab_counts={f"s{i}": [1] * vocab_size for i in range(k)},
                             dense_stats={f"d{i}": {"mean": 0.5, "std": 2.0} for i in range(k)})


def _ops(graph) -> int:
    return sum(op.type not in ("Placeholder", "Identity") for op in graph.get_operations())


def test_the_graph_transform_costs_the_same_ops_for_2_or_20_features():
    """A serving call's time is mostly TF's per-op cost: the transform handles every single-valued
    sparse feature in one [B, K] pass and every dense one in one [B, D] pass, so its op count does
    not grow with the number of features."""
    def ops(k: int) -> int:
        ft = FeatureTransform(_wide_artifact(k))
        spec = {**{f"s{i}": tf.TensorSpec([None], tf.string) for i in range(k)},
                **{f"h{i}": tf.TensorSpec([None], tf.string) for i in range(k)},
                **{f"d{i}": tf.TensorSpec([None], tf.float32) for i in range(k)}}
        graph = tf.function(ft.__call__).get_concrete_function(spec).graph
        out = ft({n: tf.constant(["v", "w1", "x"]) if n[0] != "d" else tf.constant([1.0, float("nan"), 3.0])
                  for n in spec})
        assert out["s1"].numpy().tolist()[:2] == [0, 1] and out["s1"].numpy()[2] >= 2
        return _ops(graph)

    assert ops(20) <= ops(2) + 4


def test_tf_example_requests_cost_the_same_ops_for_2_or_20_columns():
    """predict_examples' parsing densifies the single-valued columns of each dtype together, so its
    op count does not grow with the columns either; absent values become "" / NaN, and a second value
    is an error naming every column that has one."""
    from recpipe.features.transform import example_spec, request_from_examples

    def parse(art, serialized):
        return request_from_examples(tf.io.parse_example(serialized, example_spec(art.config, art.raw_schema)), art)

    def ops(k: int) -> int:
        art = _wide_artifact(k)
        graph = tf.function(lambda s: parse(art, s)).get_concrete_function(tf.TensorSpec([None], tf.string)).graph
        return _ops(graph)

    assert ops(20) <= ops(2)
    art = _wide_artifact(3)
    one = tf.train.Example(features=tf.train.Features(feature={
        "s1": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"w1"])),
        "d2": tf.train.Feature(float_list=tf.train.FloatList(value=[2.5]))}))
    out = parse(art, [one.SerializeToString(), b""])
    assert out["s1"].numpy().tolist() == [b"w1", b""] and out["s0"].numpy().tolist() == [b"", b""]
    assert out["d2"].numpy()[0] == 2.5 and np.isnan(out["d2"].numpy()[1]) and np.isnan(out["d0"].numpy()).all()
    two = tf.train.Example(features=tf.train.Features(feature={
        name: tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a", b"b"])) for name in ("s0", "h2")}))
    with pytest.raises(tf.errors.InvalidArgumentError, match="at most one value per example: 's0', 'h2'"):
        parse(art, [one.SerializeToString(), two.SerializeToString()])


def test_raw_rows_become_requests_as_the_beam_job_reads_them():
    """The export's checks build requests from raw eval rows as the Beam job reads them: a null ID is ""
    (and an error for an int64 input, which cannot carry it), a null list item no token, a bool ID its
    integer, a dense string parsed (blank: missing) and missing values absent from a tf.Example."""
    from recpipe.features.transform import examples_from_arrow, int64_nulls, request_from_arrow
    t = pa.table({"s": pa.array(["a", None, "c"]), "b": pa.array([True, None, False]),
                  "l": pa.array([["x", None, "y"], None, []]), "d": pa.array([" 2.5 ", "", None]),
                  "i": pa.array([7, None, 9], pa.int64())})
    specs = {"s": tf.TensorSpec([None], tf.string), "b": tf.TensorSpec([None], tf.string),
             "l": tf.TensorSpec([None], tf.string), "d": tf.TensorSpec([None], tf.float32)}
    r = {k: v.numpy().tolist() for k, v in request_from_arrow(t, specs).items()}
    assert r["s"] == [b"a", b"", b"c"] and r["b"] == [b"1", b"", b"0"] and r["l"] == [b"x||y", b"", b""]
    assert r["d"][0] == 2.5 and np.isnan(r["d"][1:]).all()
    ints = {"i": tf.TensorSpec([None], tf.int64)}
    assert int64_nulls(t, ints).tolist() == [False, True, False]
    with pytest.raises(ValueError, match="column 'i' row 1: null, which the int64 input 'i' cannot carry"):
        request_from_arrow(t, ints)
    cfg = parse_config({"name": "t", "label": {"column": "y"}, "features": {
        "sparse": [{"name": "l", "column": "l", "multivalent": True, "hash_buckets": 10},
                   {"name": "i", "column": "i", "hash_buckets": 10}],
        "dense": [{"name": "d", "column": "d"}]}, "model": {"task": "ranking", "type": "logistic"}})
    examples = [tf.train.Example.FromString(e) for e in
                examples_from_arrow(t, cfg, {"l": "list<string>", "i": "int", "d": "string"})]
    first, second = (e.features.feature for e in examples[:2])
    assert list(first["l"].bytes_list.value) == [b"x", b"y"] and first["d"].float_list.value == [2.5]
    assert list(first["i"].int64_list.value) == [7] and set(second) == set()


def test_saved_vocabularies_are_packed_and_reloaded(tmp_path):
    """The vocabulary table's keys and IDs are stored compressed (PackedVocabularies) and rebuilt
    by the SavedModel's own initializer at load: the loaded graph maps every value as before."""
    art = _wide_artifact(4, vocab_size=5_000)
    art.vocabularies["s2"] = [None if j % 7 == 3 else v for j, v in enumerate(art.vocabularies["s2"])]  # freed
    module = tf.Module()
    module.transform = FeatureTransform(art)
    spec = {f"s{i}": tf.TensorSpec([None], tf.string) for i in range(4)}
    module.f = tf.function(lambda x: module.transform(x), input_signature=[spec])
    tf.saved_model.save(module, str(tmp_path / "m"))
    plain_bytes = 4 * 5_000 * (len("0\x1fw1234") + 2 + 8)  # a string key and an int64 ID per value
    assert (tmp_path / "m" / "saved_model.pb").stat().st_size < plain_bytes / 3
    loaded = tf.saved_model.load(str(tmp_path / "m"))
    tokens = tf.constant(["v", "w1", "w3", "w12", "w4999", "nope"])
    out = loaded.f({f"s{i}": tokens for i in range(4)})
    assert out["s0"].numpy().tolist()[:5] == [0, 1, 3, 12, 4999] and out["s0"].numpy()[5] >= 5_000
    assert out["s2"].numpy().tolist()[:2] == [0, 1] and out["s2"].numpy()[2] >= 5_000  # w3 was freed: OOV
    assert out["s2"].numpy().tolist()[3:5] == [12, 4999]
    direct = module.transform({f"s{i}": tokens for i in range(4)})
    assert all(out[k].numpy().tolist() == direct[k].numpy().tolist() for k in spec)


def test_cross_config_checks():
    from recpipe.features.config import ConfigError
    base = {"name": "t", "features": {"sparse": [{"name": "a", "column": "a", "hash_buckets": 9},
                                                 {"name": "m", "column": "m", "hash_buckets": 9, "multivalent": True}]}}

    def with_cross(**cross):
        d = {**base, "features": {"sparse": [*base["features"]["sparse"], {"name": "c", **cross}]}}
        return parse_config(d)
    with pytest.raises(ConfigError, match=r"features.sparse\[2\].column: required key is missing \(or give cross"):
        with_cross(hash_buckets=9)
    with pytest.raises(ConfigError, match=r"features.sparse\[2\]: give exactly one of column, cross"):
        with_cross(column="a", cross=["a", "m"], hash_buckets=9)
    with pytest.raises(ConfigError, match=r"features.sparse\[2\].cross: a cross is hashed"):
        with_cross(cross=["a", "a2"], vocab={"min_count": 1})
    with pytest.raises(ConfigError, match=r"features.sparse\[2\].cross: name two or more different"):
        with_cross(cross=["a", "a"], hash_buckets=9)
    with pytest.raises(ConfigError, match=r"features.sparse\[2\].cross\[1\]: 'm' must be a single-valued"):
        with_cross(cross=["a", "m"], hash_buckets=9)
    cfg = parse_config({**base, "features": {"sparse": [*base["features"]["sparse"],
                                                        {"name": "b", "column": "b", "hash_buckets": 9},
                                                        {"name": "c", "cross": ["a", "b"], "hash_buckets": 9}]}})
    assert cfg.raw_columns() == ["label", "a", "m", "b"] and [f.name for f in cfg.crosses] == ["c"]
