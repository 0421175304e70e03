"""ID columns read dictionary-encoded (recpipe.features.canonical.encoded_columns): validated, hashed, counted
and transformed once per dictionary entry, with the results their decoded strings give, and per-entry work
reused across batches only while their dictionaries are equal."""
import farmhash
import numpy as np
import pyarrow as pa
import pytest

from recpipe.features.artifact import TransformArtifact
from recpipe.features.batch_transform import BatchTransform
from recpipe.features.canonical import (LABEL_KEY, canonicalize, check_schema, encoded_columns, plain_columns,
                                        rows_with_value, validate_batch)
from recpipe.features.config import parse_config
from recpipe.features.dictionaries import DictionaryMemo
from recpipe.features.hashing import hash_buckets
from recpipe.pipeline.analysis import TokenCounts, merge_count_tables, token_count_tables
from recpipe.pipeline.repeats import row_hashes

pytestmark = pytest.mark.unit


def _cfg():
    return parse_config({
        "name": "t",
        "label": {"column": "label"},
        "features": {
            "sparse": [
                {"name": "a", "column": "a", "vocab": {"min_count": 1, "oov_buckets": 2}},
                {"name": "a2", "column": "b", "share_embedding_with": "a"},
                {"name": "h", "column": "h", "hash_buckets": 50},
                {"name": "n", "column": "n", "vocab": {"min_count": 1}},
                {"name": "tags", "column": "tags", "multivalent": True, "separator": ",", "vocab": {"min_count": 1}},
                {"name": "a_x_h", "cross": ["a", "h"], "hash_buckets": 1000},
            ],
            "dense": [{"name": "x", "column": "x", "transform": "log_zscore", "fill": 0}],
        },
    })


A = ["p", None, "q", "p", "", "zz", None, "q"]
B = ["q", "p", "p", None, "r", "r", "q", "zz"]


def _plain_table(a=A, b=B):
    n = len(a)
    return pa.table({
        "label": pa.array([1, 0, 1, 0, 1, 0, 0, 1], pa.int64())[:n],
        "a": pa.array(a), "b": pa.array(b), "h": pa.array(["u", "v", None, "u", "w", "v", "u", "x"][:n]),
        "n": pa.array(list(range(n)), pa.int64()), "tags": pa.array(["p,q", "", None, "q", "r", "p", "q", "q"][:n]),
        "x": pa.array([1.0, None, 3.0, 0.5, 10.0, 2.0, None, 4.0][:n]),
    })


def _encoded(table, values=()):
    """The table with its string ID columns dictionary-encoded as Parquet gives them: each dictionary is
    `values` (entries no row may use, as a row group's dictionary holds for one of its batches) followed by
    the column's other values."""
    out = table
    for name in ("a", "b", "h"):
        rows = table.column(name).to_pylist()
        entries = list(dict.fromkeys([*values, *(v for v in rows if v is not None)]))
        indices = pa.array([None if v is None else entries.index(v) for v in rows], pa.int32())
        out = out.set_column(out.schema.get_field_index(name), name,
                             pa.DictionaryArray.from_arrays(indices, pa.array(entries, pa.string())))
    return out


def _artifact(cfg):
    return TransformArtifact(config=cfg, raw_schema=check_schema(_plain_table().schema, cfg, "mem"),
                             vocabularies={"a": ["p", "q", ""], "n": ["1", "2"], "tags": ["q"]},
                             vocab_counts={"a": [3, 2, 1], "n": [1, 1], "tags": [4]},
                             dense_stats={"x": {"mean": 1.0, "std": 2.0}})


def test_only_string_columns_of_single_valued_id_features_are_read_encoded():
    cfg = _cfg()
    raw = {"label": "int", "a": "string", "b": "string", "h": "string", "n": "int", "tags": "string", "x": "float"}
    assert encoded_columns(cfg, raw) == ["a", "b", "h"]  # not the int ID, the multivalent one, label or dense


def test_plain_columns_keeps_the_named_dictionaries_only():
    table = pa.table({"a": pa.array(["x", "y", "x"]).dictionary_encode(),
                      "bin": pa.array([b"x", b"\xff", b"x"]).dictionary_encode(),
                      "other": pa.array(["x", "y", "x"]).dictionary_encode()})
    plain = plain_columns(table, None, ["a", "bin"])
    assert plain.schema.field("a").type == pa.dictionary(pa.int32(), pa.string())
    assert plain.schema.field("bin").type == pa.dictionary(pa.int32(), pa.string())  # bytes viewed as UTF-8
    assert plain.schema.field("other").type == pa.string()
    assert plain.column("a").to_pylist() == ["x", "y", "x"]


@pytest.mark.parametrize("extra", [(), ("never", "used", "\u00e9")])
def test_an_encoded_batch_canonicalizes_counts_and_transforms_as_its_strings(extra):
    cfg = _cfg()
    plain, encoded = _plain_table(), _encoded(_plain_table(), extra)
    cp, ce = canonicalize(plain, cfg), canonicalize(encoded, cfg)
    assert pa.types.is_dictionary(ce["a"].type) and ce["a"].null_count == 0
    for name in cp:  # nulls read as "", crosses joined alike
        np.testing.assert_equal(ce[name].to_pylist(), cp[name].to_pylist(), err_msg=name)
    assert rows_with_value(ce, cfg) == rows_with_value(cp, cfg)
    by_owner = lambda pairs: {o: merge_count_tables([t for k, t in pairs if k == o]).sort_by("value").to_pylist()
                              for o, _ in pairs}  # noqa: E731
    assert by_owner(list(token_count_tables(ce, cfg))) == by_owner(list(token_count_tables(cp, cfg)))
    transform = BatchTransform(_artifact(cfg))
    features = lambda c: {k: v for k, v in c.items() if k != LABEL_KEY}  # noqa: E731
    got, want = transform(features(ce)), transform(features(cp))
    for name, ids in want.items():
        if not hasattr(ids, "values"):
            assert np.array_equal(got[name], ids), name
    assert np.array_equal(row_hashes(encoded), row_hashes(plain))


def test_a_dictionary_value_that_is_not_utf8_flags_only_its_rows():
    cfg = _cfg()
    dictionary = pa.array([b"p", b"\xff\xfe", b"q"]).view(pa.string())
    a = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 0, 2, 2, 0, 1], pa.int32()), dictionary)
    table = _encoded(_plain_table()).set_column(1, "a", a)
    good, bad = validate_batch(table, cfg)
    assert good.tolist() == [True, False, True, True, True, True, True, False]
    assert bad.reasons == ["invalid_utf8"] * 2 and bad.fields == ["a"] * 2
    # the good rows' dictionary still holds the bad value: their IDs are worked out for every entry
    kept = canonicalize(table.filter(pa.array(good)), cfg)
    ids = BatchTransform(_artifact(cfg))({k: v for k, v in kept.items() if k != LABEL_KEY})["a"]
    assert ids.tolist() == [0, 1, 0, 1, 1, 0]
    assert hash_buckets(pa.array([b"\xff\xfe"]).view(pa.string()), 7).tolist() == \
        [farmhash.fingerprint64(b"\xff\xfe") % 7]


def test_per_entry_work_is_reused_only_while_the_dictionary_is_equal():
    memo, calls = DictionaryMemo(), []

    def work(values):
        calls.append(values.to_pylist())
        return len(calls)

    first = pa.array(["p", "q"])
    assert memo.get("a", first, work) == 1
    assert memo.get("a", pa.array(["p", "q"]), work) == 1  # an equal copy, as the next batch of a row group has
    assert memo.get("a", pa.array(["p", "r"]), work) == 2  # same length, other values
    assert memo.get("b", pa.array(["p", "r"]), work) == 3  # another key
    assert memo.get("a", pa.array(["p", "r", "s"]), work) == 4


def test_a_files_batches_hash_as_their_strings_through_one_memo():
    memo = DictionaryMemo()
    row_group = ["p", "q", "zz", "", "r"]  # two batches of one row group share it; the third has another
    batches = [(A[:4], B[:4], row_group), (A[4:], B[4:], row_group), (A[2:6], B[2:6], ["zz", "q", "p", ""])]
    for a, b, values in batches:
        plain = _plain_table(a, b)
        encoded = _encoded(plain, values)
        assert np.array_equal(row_hashes(encoded, memo), row_hashes(plain))
    nulls = pa.table({"a": pa.DictionaryArray.from_arrays(pa.array([None, None], pa.int32()), pa.array([], pa.string()))})
    assert np.array_equal(row_hashes(nulls, memo), row_hashes(pa.table({"a": pa.array([None, None], pa.string())})))


def test_token_counts_sum_a_row_groups_batches_and_every_other_batch():
    cfg = _cfg()
    counts, per_batch = TokenCounts(cfg), []
    for a, b, values in [(A[:4], B[:4], ["p", "q", "zz", "", "r"]), (A[4:], B[4:], ["p", "q", "zz", "", "r"]),
                         (A[2:6], B[2:6], ["zz", "q", "p", ""])]:
        cols = canonicalize(_encoded(_plain_table(a, b), values), cfg)
        counts.add(cols)
        per_batch += token_count_tables(cols, cfg)
    got = {o: t.sort_by("value").to_pylist() for o, t in counts.tables()}
    want = {o: merge_count_tables([t for k, t in per_batch if k == o]).sort_by("value").to_pylist()
            for o, _ in per_batch}
    assert got == want and sorted(got) == ["a", "n", "tags"]
    assert counts.tables() == []  # it starts again
