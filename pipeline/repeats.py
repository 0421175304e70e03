"""Rows read more than once (pure, vectorised; no Beam): every column a run reads hashed into one 64-bit
value per row, and rows of equal value found.

Copies of a file's bytes are named at launch (recpipe.pipeline.sources.same_files). What that cannot see: the
same rows written again as another file (a re-run's output beside the first run's, by another writer or
with another row-group layout, in another order), or rows repeated within files (a join that fanned out
upstream, an appended retry). Each such row is trained on once per copy, and in a time split the copies
of an eval row may sit in train too.

Hashes, not values, are compared: two different rows share one with probability about 2**-64, so among
n rows some pair does with probability about n**2 / 2**65 (2e-7 at 2M rows, 3 % at 1e9).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import farmhash
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recpipe.features.canonical import is_id_dictionary, one_array
from recpipe.features.dictionaries import DictionaryMemo

__all__ = ["row_hashes", "bucketed", "pairs_bytes", "pairs_from_bytes", "find_repeats", "Repeats", "BUCKET_ROWS"]

BUCKET_ROWS = 4_000_000  # rows per bucket (at least 16 buckets): what one worker sorts at the end
_EXAMPLES = 5
_BY_VALUE_MIN_ROWS = 8_192  # a string column this long is hashed once per distinct value when ...
_BY_VALUE_SAMPLE = 2_048  # ... at most half the rows of its first _BY_VALUE_SAMPLE are distinct
_U = np.uint64
_M1, _M2, _K = _U(0xBF58476D1CE4E5B9), _U(0x94D049BB133111EB), _U(0x9E3779B97F4A7C15)
_NULL = _U(0x5BD1E9955BD1E995)
# the low `i` bytes of a word: a string shorter than 8 bytes reads its neighbour's bytes past its end
_LOW_BYTES = np.array([(1 << (8 * i)) - 1 for i in range(8)] + [(1 << 64) - 1], np.uint64)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, in place: every input bit moves about half the output bits."""
    x ^= x >> _U(30)
    x *= _M1
    x ^= x >> _U(27)
    x *= _M2
    x ^= x >> _U(31)
    return x


def _string_word(arr: pa.Array) -> np.ndarray:
    """Per string: its first 8 bytes and its length, plus its last 8 bytes when longer than 8, plus
    FarmHash's fingerprint of it when longer than 16 (neither word holds its middle bytes), read from
    Arrow's buffers (a part a string does not have adds nothing, so the word does not depend on its batch)."""
    n = len(arr)
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    odt = np.dtype(np.int64 if wide else np.int32)
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], odt, n + 1, arr.offset * odt.itemsize).astype(np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = np.zeros(hi - lo + 16, np.uint8)  # 8 zero bytes either side: no read leaves the buffer
    if hi > lo:
        data[8:8 + hi - lo] = np.frombuffer(buffers[2], np.uint8, hi - lo, lo)
    words = np.ndarray((hi - lo + 9,), np.uint64, buffer=data, strides=(1,))  # a word at every byte
    lengths = np.diff(offsets)
    start = offsets[:-1] + (8 - lo)
    word = np.take(words, start)  # take: a quarter faster than indexing a strided view, here
    word &= _LOW_BYTES[np.minimum(lengths, 8)]
    word += lengths.astype(np.uint64) * _K
    longest = int(lengths.max()) if n else 0
    if longest > 8:
        last = np.take(words, start + lengths - 8)
        last *= lengths > 8
        _mix(last)
        word += last
    if longest > 16:
        long = np.flatnonzero(lengths > 16)
        tokens = arr.take(pa.array(long)).cast(pa.large_binary() if wide else pa.binary()).to_pylist()
        word[long] += np.fromiter(map(farmhash.fingerprint64, tokens), np.uint64, len(long)) * _M2
    return word


def _column_word(arr: pa.Array) -> np.ndarray:
    """One uint64 per value that tells it from any other value of the column's type, a null included."""
    if not len(arr):  # a list column's items when every list is empty: its buffers may be absent
        return np.zeros(0, np.uint64)
    tp = arr.type
    if pa.types.is_dictionary(tp):
        arr, tp = arr.dictionary_decode(), tp.value_type
    if _is_plain_string(tp):
        word = _string_word(arr)
    elif pa.types.is_list(tp) or pa.types.is_large_list(tp):
        word = _list_word(arr)
    elif pa.types.is_boolean(tp):
        word = np.asarray(pc.fill_null(arr, False)).astype(np.uint64)
    elif pa.types.is_integer(tp) or pa.types.is_floating(tp):
        kind = "f" if pa.types.is_floating(tp) else "u" if pa.types.is_unsigned_integer(tp) else "i"
        dtype = np.dtype(f"{kind}{tp.bit_width // 8}")
        values = np.frombuffer(arr.buffers()[1], dtype, len(arr), arr.offset * dtype.itemsize)
        word = values.astype(np.float64 if kind == "f" else np.int64).view(np.uint64).copy()
    else:  # any other type, through Python: slow, and no config reads one today
        word = np.fromiter((farmhash.fingerprint64(json.dumps(v, default=str, sort_keys=True))
                            for v in arr.to_pylist()), np.uint64, len(arr))
    if arr.null_count:  # a null's slot holds any bytes: a null is one word of its own
        null = np.asarray(arr.is_null())
        word[null] = _NULL
    return word


def _placed(word: np.ndarray, place: int) -> np.ndarray:
    """A column's words mixed with the column's place in the row, in place. A row's hash is the sum of its
    columns' placed words: equal rows sum equal, and rows that differ in one column never do (the mix is
    a bijection); two values trading places give other words."""
    word += _U((place + 1) * int(_K) % (1 << 64))
    return _mix(word)


def _list_word(arr: pa.Array) -> np.ndarray:
    """One word per list: its length and its items in order (each item's word mixed with its place)."""
    offsets = np.asarray(arr.offsets).astype(np.int64)
    start, lengths = offsets[:-1], np.diff(offsets)
    items = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    item = _placed(_column_word(items), 0)
    place = np.arange(len(items), dtype=np.int64) - np.repeat(start - offsets[0], lengths)
    item += place.astype(np.uint64) * _M1
    _mix(item)
    sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(item, dtype=np.uint64)])
    return (sums[start - offsets[0] + lengths] - sums[start - offsets[0]]) + lengths.astype(np.uint64) * _K


def _is_plain_string(tp: pa.DataType) -> bool:
    return pa.types.is_string(tp) or pa.types.is_large_string(tp) or pa.types.is_binary(tp) \
        or pa.types.is_large_binary(tp)


def _words_by_value(arr: pa.Array) -> np.ndarray | None:
    """_column_word of a string column, worked out once per distinct value (Arrow's dictionary encoding, in
    C++, then a gather): the same words, at about half the cost when values repeat as IDs in a click log do.
    None when a sample of its rows is more than half distinct (the encoding would cost more than it saves)."""
    sample = arr.slice(0, _BY_VALUE_SAMPLE)
    if 2 * len(pc.unique(sample)) > len(sample):
        return None
    encoded = pc.dictionary_encode(arr)
    if len(encoded.dictionary) == 0:  # every row null
        return np.full(len(arr), _NULL, np.uint64)
    indices = encoded.indices
    word = np.take(_string_word(encoded.dictionary), np.asarray(pc.fill_null(indices, 0)))
    if indices.null_count:
        word[np.asarray(indices.is_null())] = _NULL
    return word


def _dictionary_placed(arr: pa.DictionaryArray, place: int, memo: DictionaryMemo, key: str) -> np.ndarray:
    """_placed(_column_word) of a dictionary-encoded string column, worked out once per dictionary entry (once
    per row group, through `memo`) and gathered: the words its decoded strings would give."""
    null = _placed(np.array([_NULL], np.uint64), place)[0]
    if not len(arr.dictionary):  # every row null
        return np.full(len(arr), null, np.uint64)
    entries = memo.get((key, place), arr.dictionary, lambda values: _placed(_string_word(values), place))
    indices = np.asarray(arr.indices.fill_null(0))
    word = np.take(entries, indices)
    if arr.null_count:
        word[np.asarray(arr.is_null())] = null
    if arr.dictionary.null_count:  # a null entry is a null row too
        word[np.asarray(arr.dictionary.is_null())[indices]] = null
    return word


def row_hashes(table: pa.Table, memo: DictionaryMemo | None = None) -> np.ndarray:
    """One uint64 per row over every column in the table's order: equal rows hash equal, whatever the
    batch, file, slice, chunking, row-group layout or encoding (plain or dictionary) they were read in.
    The sum of each column's placed words (_placed); a long string column's words come whole from
    _words_by_value when its values repeat, a dictionary-encoded one's from its dictionary (`memo`: kept
    from the batch before while the dictionary is the same; a caller hashing a file's batches in turn
    passes one)."""
    n = table.num_rows
    memo = memo if memo is not None else DictionaryMemo()
    h = np.zeros(n, np.uint64)
    for place, (name, column) in enumerate(zip(table.column_names, table.columns)):
        arr = one_array(column)
        if is_id_dictionary(arr):
            h += _dictionary_placed(arr, place, memo, name)
            continue
        word = _words_by_value(arr) if n >= _BY_VALUE_MIN_ROWS and _is_plain_string(arr.type) else None
        h += _placed(word if word is not None else _column_word(arr), place)
    return h


_PAIR = np.dtype([("hash", "<u8"), ("row", "<i8")])


def pairs_bytes(hashes: np.ndarray, positions: np.ndarray) -> bytes:
    """(row hash, global row number) pairs as 16 bytes each, for a staged bucket file."""
    pairs = np.empty(len(hashes), _PAIR)
    pairs["hash"], pairs["row"] = hashes, positions
    return pairs.tobytes()


def pairs_from_bytes(parts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The hashes and row numbers of staged pairs_bytes parts, concatenated."""
    pairs = np.frombuffer(b"".join(parts), _PAIR)
    return np.ascontiguousarray(pairs["hash"]), np.ascontiguousarray(pairs["row"])


def bucketed(hashes: np.ndarray, positions: np.ndarray, buckets: int) -> list[tuple[int, tuple]]:
    """(bucket, (hashes, positions)) per bucket a batch's rows fall in: equal rows meet in one bucket."""
    which = (hashes >> _U(40)) % _U(buckets)
    order = np.argsort(which, kind="stable")
    which, hashes = which[order], hashes[order]  # gathered once: each bucket's arrays are views
    positions = positions[order].astype(np.int64, copy=False)
    bounds = np.flatnonzero(np.diff(which)) + 1
    return [(int(which[s]), (hashes[s:e], positions[s:e])) for s, e in zip([0, *bounds], [*bounds, len(which)])
            if e > s]


@dataclass
class Repeats:
    """Rows equal in every column read to an earlier row (global row numbers: files in path order).
    pairs: (file of the first such row, file of the repeat) -> how many repeats; examples: per pair, its
    first few (repeat, first) global row numbers."""
    pairs: dict[tuple[int, int], int] = field(default_factory=dict)
    examples: dict[tuple[int, int], list[tuple[int, int]]] = field(default_factory=dict)

    @property
    def repeats(self) -> int:
        return sum(self.pairs.values())

    def merge(self, other: "Repeats") -> "Repeats":
        pairs, examples = dict(self.pairs), dict(self.examples)
        for k, n in other.pairs.items():
            pairs[k] = pairs.get(k, 0) + n
            examples[k] = sorted(examples.get(k, []) + other.examples.get(k, []))[:_EXAMPLES]
        return Repeats(pairs, examples)

    def to_json(self) -> dict:
        return {"pairs": [[a, b, n, [list(e) for e in self.examples.get((a, b), [])]]
                          for (a, b), n in sorted(self.pairs.items())]}

    @classmethod
    def from_json(cls, d: dict) -> "Repeats":
        return cls({(a, b): n for a, b, n, _ in d["pairs"]},
                   {(a, b): [tuple(e) for e in shown] for a, b, _, shown in d["pairs"]})


def find_repeats(hashes: np.ndarray, positions: np.ndarray, file_starts: np.ndarray) -> Repeats:
    """The repeats among one bucket's rows; file_starts: each input file's first global row, ascending."""
    if len(hashes) < 2:
        return Repeats()
    order = np.lexsort((positions, hashes))
    h, pos = hashes[order], positions[order]
    repeat = np.concatenate([[False], h[1:] == h[:-1]])
    if not repeat.any():
        return Repeats()
    group_start = np.maximum.accumulate(np.where(~repeat, np.arange(len(h)), 0))
    copies, firsts = pos[repeat], pos[group_start[repeat]]
    copy_file = np.searchsorted(file_starts, copies, side="right") - 1
    first_file = np.searchsorted(file_starts, firsts, side="right") - 1
    out = Repeats()
    by_pair = np.lexsort((copies, copy_file, first_file))
    pair_keys = np.stack([first_file[by_pair], copy_file[by_pair]])
    starts = np.flatnonzero(np.concatenate([[True], (pair_keys[:, 1:] != pair_keys[:, :-1]).any(axis=0)]))
    for s, e in zip(starts, [*starts[1:], len(by_pair)]):
        key = (int(pair_keys[0, s]), int(pair_keys[1, s]))
        out.pairs[key] = int(e - s)
        out.examples[key] = [(int(copies[i]), int(firsts[i])) for i in by_pair[s:min(e, s + _EXAMPLES)]]
    return out
