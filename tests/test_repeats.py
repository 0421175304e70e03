"""recpipe.pipeline.repeats: a row's hash depends on its values alone, and tells apart values that differ."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recpipe.pipeline.repeats import Repeats, bucketed, find_repeats, pairs_bytes, pairs_from_bytes, row_hashes

pytestmark = pytest.mark.unit

LONG = "x" * 30


def _table() -> pa.Table:
    return pa.table({
        "s": ["a", "abcdefgh", "abcdefghi", LONG, None, "", "a", "abcdefghijklmnopq", "abcdefghijklmnopr",
              "abcdefghijkl", "abcdXfghijkl", LONG[:20] + "y" + LONG[21:]],
        "i": pa.array([1, 2, None, 4, 5, 6, 1, 7, 7, 2**62 + 1, 2**62 + 1, 4], pa.int64()),
        "l": pa.array([["a", "b"], ["b", "a"], [], None, ["a"], ["a", ""], ["a", "b"], [LONG], [LONG], [], [],
                       None]),
        "f": pa.array([0.5, 1.0, None, 2.0, 3.0, 4.0, 0.5, 1.0, 1.0, 0.0, 0.0, 2.0]),
        "b": pa.array([True, False, None, True, True, True, True, False, False, None, None, True]),
    })


def test_equal_rows_hash_equal_and_others_apart():
    t = _table()
    h = row_hashes(t)
    # rows 0 and 6 are equal; every other row differs in one value somewhere: one byte of a string of 12
    # bytes (rows 9, 10) or of 30 (rows 3, 11), the order of a list (0, 1), null and empty (4, 5)
    assert h[0] == h[6] and len(set(h.tolist())) == len(h) - 1


def test_values_trading_columns_hash_apart():
    """A row's hash is the sum of its columns' words, each mixed with its column's place: two values that
    trade columns, or a value moved to a column of nulls, give another hash."""
    t = pa.table({"a": ["x", "y", "x", None], "b": ["y", "x", None, "x"], "i": pa.array([1, 1, 1, 1], pa.int64())})
    for table in (t, t.set_column(0, "a", t.column("a").dictionary_encode())):
        assert len(set(row_hashes(table).tolist())) == 4


def test_a_rows_hash_does_not_depend_on_its_batch():
    t = _table()
    h = row_hashes(t)
    assert (row_hashes(t.slice(3, 7)) == h[3:10]).all()  # sliced arrays (offsets into shared buffers)
    assert (row_hashes(pa.concat_tables([t.slice(0, 4), t.slice(4)])) == h).all()  # two chunks
    assert (row_hashes(t.take(np.arange(len(h))[::-1])) == h[::-1]).all()
    assert (row_hashes(t.slice(0, 3)) == h[:3]).all()  # a batch without nulls or long strings


def test_the_same_rows_written_in_another_layout_hash_equal(tmp_path):
    t = _table()
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=5)
    pq.write_table(t, tmp_path / "b.parquet", use_dictionary=False)
    a = np.concatenate([row_hashes(pa.Table.from_batches([b]))
                        for b in pq.ParquetFile(tmp_path / "a.parquet").iter_batches(batch_size=4)])
    assert (a == row_hashes(pq.read_table(tmp_path / "b.parquet"))).all()
    dictionary = pq.read_table(tmp_path / "b.parquet", read_dictionary=["s"])
    assert (row_hashes(dictionary) == a).all()


def test_repeats_are_found_across_buckets_and_files():
    hashes = np.array([5, 7, 5, 5, 9, 7, 1], np.uint64) << np.uint64(40)  # the bucket is taken from bit 40 up
    positions = np.arange(7)
    found = Repeats()
    for _, (h, p) in bucketed(hashes, positions, 4):
        found = found.merge(find_repeats(h, p, np.array([0, 3])))
    # rows 2 and 3 repeat row 0 (file 0, file 1), row 5 repeats row 1
    assert found.pairs == {(0, 0): 1, (0, 1): 2} and found.repeats == 3
    assert found.examples == {(0, 0): [(2, 0)], (0, 1): [(3, 0), (5, 1)]}
    assert Repeats.from_json(found.to_json()) == found


def test_a_buckets_staged_files_give_its_rows_back_whole():
    """The check stages each bundle's (hash, row) pairs of a bucket in a file of its own; read back, the
    files give the bucket's rows in their order, and a repeat whose rows sit in two files is found."""
    hashes, rows = np.array([5, 7, 5, 2**64 - 1], np.uint64), np.array([0, 1, 2, 2**40])
    back = pairs_from_bytes([pairs_bytes(hashes[:2], rows[:2]), b"", pairs_bytes(hashes[2:], rows[2:])])
    assert back[0].dtype == np.uint64 and back[1].dtype == np.int64
    assert back[0].tolist() == hashes.tolist() and back[1].tolist() == rows.tolist()
    assert find_repeats(*back, np.array([0, 2])).pairs == {(0, 1): 1}


def test_a_long_string_columns_hashes_do_not_depend_on_how_its_words_are_worked_out():
    """A string column of a long batch is hashed once per distinct value when its values repeat; its rows
    hash as they do in short batches, hashed row by row (nulls, multi-byte and long strings, large strings,
    binary, a column of two chunks, one too distinct for the encoding, one all null, a slice into shared
    buffers)."""
    rng = np.random.default_rng(0)
    n = 40_000
    words = np.array(["", "a", "é", "abcdefgh", "abcdefghi", "日本語のテキスト", LONG, LONG + "z", "0" * 17])
    picked = words[rng.integers(0, len(words), n)].astype(object)
    picked[rng.random(n) < 0.1] = None
    t = pa.table({
        "repeating": pa.array(picked, pa.string()),
        "large": pa.array(picked, pa.large_string()),
        "binary": pa.array([None if v is None else v.encode() for v in picked], pa.binary()),
        "chunked": pa.chunked_array([pa.array(picked[:n // 3], pa.string()), pa.array(picked[n // 3:], pa.string())]),
        "distinct": pa.array([f"id-{i}-{LONG}" if i % 7 else None for i in range(n)], pa.string()),
        "all_null": pa.array([None] * n, pa.string()),
        "i": pa.array(rng.integers(0, 5, n)),
    })
    h = row_hashes(t)
    short = np.concatenate([row_hashes(t.slice(s, 1_000)) for s in range(0, n, 1_000)])
    assert (h == short).all()
    assert (row_hashes(t.slice(5_000, 20_000)) == h[5_000:25_000]).all()
    assert len(set(h.tolist())) == len(set(zip(*(c.to_pylist() for c in t.columns))))
