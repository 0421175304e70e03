"""Pure analysis functions over canonical Arrow columns (no Beam): the combiners' building blocks.

The Beam job (recpipe.pipeline.transforms) and the single-process benchmark baseline both use them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recpipe.features.canonical import as_string, dense_prenorm, is_id_dictionary, times
from recpipe.features.config import Config

__all__ = ["ts_histogram", "split_sizes", "split_cutoffs_from_histogram", "split_cutoffs_by_row",
           "user_last_orders", "merge_last_orders", "user_split_masks",
           "COUNT_SCHEMA", "token_count_tables", "TokenCounts", "merge_count_tables",
           "select_vocabulary_table", "select_vocabulary",
           "Moments", "moments_of", "batch_moments", "moment_stats", "add_moments", "QuantileSketch",
           "sketch_boundaries", "batch_dense_stats", "dense_stats", "boundaries_from_quantiles", "merge_dense_stats"]


def ts_histogram(table: pa.Table, column: str) -> dict[float, int]:
    values, counts = np.unique(times(table.column(column))[0], return_counts=True)
    return dict(zip(values.tolist(), counts.tolist()))


def split_sizes(total: int, eval_fraction: float, validation_fraction: float) -> tuple[int, int]:
    """(rows before the validation part, rows before the eval part) of `total` rows in time order."""
    before_eval = total - math.floor(eval_fraction * total)
    return before_eval - math.floor(validation_fraction * before_eval), before_eval


def split_cutoffs_from_histogram(hist: dict[int, int], eval_fraction: float,
                                 validation_fraction: float = 0.0) -> tuple[float, float]:
    """(validation cutoff, eval cutoff) from a histogram of time keys: rows with key > eval cutoff are
    eval, rows with validation cutoff < key <= eval cutoff are validation. Each cutoff is the smallest
    key leaving at least its share of rows before it (ties stay together, on the earlier side)."""
    if not hist:
        return math.inf, math.inf
    need_fit, need_train = split_sizes(sum(hist.values()), eval_fraction, validation_fraction)
    keys = sorted(hist)
    cumulative = np.cumsum([hist[k] for k in keys])

    def first_reaching(n: int) -> float:
        i = int(np.searchsorted(cumulative, n, side="left"))
        return float(keys[min(i, len(keys) - 1)])
    return first_reaching(need_fit), first_reaching(need_train)


def split_cutoffs_by_row(total: int, eval_fraction: float, validation_fraction: float = 0.0) -> tuple[float, float]:
    """The same cutoffs over global row numbers (a log without a timestamp is in time order)."""
    need_fit, need_train = split_sizes(total, eval_fraction, validation_fraction)
    return float(need_fit - 1), float(need_train - 1)


# ------------------------------------------------------------------ the per-user (leave-last-out) split
LAST_ORDERS = 3  # distinct order values kept per user: eval's, validation's, and one to prove train is not empty


def user_last_orders(table: pa.Table, user: str, order: str) -> dict[str, list[float]]:
    """{user: their largest distinct order values in this batch, descending, at most LAST_ORDERS}."""
    users = np.asarray(as_string(table.column(user)).to_numpy(zero_copy_only=False), dtype=object)
    values = times(table.column(order))[0]
    sort = np.lexsort((-values, users))
    out: dict[str, list[float]] = {}
    for u, v in zip(users[sort].tolist(), values[sort].tolist()):
        kept = out.setdefault(u, [])
        if len(kept) < LAST_ORDERS and (not kept or kept[-1] != v):
            kept.append(v)
    return out


def merge_last_orders(a: list[float], b: list[float]) -> list[float]:
    return sorted(set(a) | set(b), reverse=True)[:LAST_ORDERS]


def user_split_masks(table: pa.Table, user: str, order: str, last_orders: dict[str, list[float]],
                     validation: bool) -> tuple[np.ndarray, np.ndarray]:
    """(is_validation, is_eval) row masks: a row is eval when its order is its user's last and the user
    has an earlier one; validation (if asked) when it is the one before, and the user has a third."""
    users = as_string(table.column(user))
    values = times(table.column(order))[0]
    distinct = pc.unique(users)
    orders = [last_orders.get(u, []) for u in distinct.to_pylist()]
    eval_at = np.array([o[0] if len(o) >= 2 else np.inf for o in orders], dtype=np.float64)
    val_at = np.array([o[1] if validation and len(o) >= 3 else np.inf for o in orders], dtype=np.float64)
    idx = pc.index_in(users, distinct).to_numpy(zero_copy_only=False)
    is_eval = values >= eval_at[idx]
    is_validation = (values == val_at[idx]) & ~is_eval
    return is_validation, is_eval


COUNT_SCHEMA = pa.schema([("value", pa.string()), ("count", pa.int64())])


def token_count_tables(cols: dict[str, pa.Array], cfg: Config) -> Iterable[tuple[str, pa.Table]]:
    """(vocabulary owner, table of distinct values and their counts) per vocabulary feature of one
    batch: one element per feature and batch, counted by Arrow, never one element per token."""
    for f in cfg.features.sparse:
        owner = cfg.table_owner(f)
        if owner.vocab is not None:
            arr = cols[f.name]
            yield owner.name, _entry_table(arr.dictionary, _entry_counts(arr)) if is_id_dictionary(arr) \
                else _count_table(arr)


def _count_table(arr: pa.Array) -> pa.Table:
    """A plain (or list) column's count table, counted by Arrow."""
    if pa.types.is_list(arr.type):
        arr = pc.list_flatten(arr)
    counts = pc.value_counts(arr.cast(pa.string()))
    return pa.Table.from_arrays([counts.field("values"), counts.field("counts").cast(pa.int64())], schema=COUNT_SCHEMA)


def _entry_counts(arr: pa.DictionaryArray) -> np.ndarray:
    """A canonical dictionary-encoded column's rows per dictionary entry (no string hashed)."""
    return np.bincount(np.asarray(arr.indices), minlength=len(arr.dictionary))


def _entry_table(dictionary: pa.Array, counts: np.ndarray) -> pa.Table:
    """The count table of a dictionary's entries counted at least once. Arrow builds a dictionary it reads
    from Parquet (or unifies on concatenation) through a memo table, so its values are distinct."""
    seen = counts > 0
    return pa.Table.from_arrays([dictionary.filter(pa.array(seen)), pa.array(counts[seen], pa.int64())],
                                schema=COUNT_SCHEMA)


class TokenCounts:
    """A worker's token counts of canonical batches per vocabulary owner, summed as the batches come
    (workers' tables then merge with merge_count_tables).

    A dictionary-encoded column is counted per dictionary entry, summed over batches while its dictionary
    stays equal (Parquet gives each batch of a row group a copy of the row group's): one table per row
    group. Other columns are counted by Arrow, a table per batch; an owner's tables are merged once they
    pass `compact_rows` rows.
    """

    def __init__(self, cfg: Config, compact_rows: int = 1 << 20):
        self._cfg, self._compact_rows = cfg, compact_rows
        self._tables: dict[str, list[pa.Table]] = {}
        self._open: dict[str, tuple[str, pa.Array, np.ndarray]] = {}  # feature -> (owner, dictionary, counts)

    def add(self, cols: dict[str, pa.Array]) -> None:
        """Count one canonical batch."""
        for f in self._cfg.features.sparse:
            owner = self._cfg.table_owner(f)
            if owner.vocab is None:
                continue
            arr = cols[f.name]
            if not is_id_dictionary(arr):
                self._append(owner.name, _count_table(arr))
                continue
            counts, last = _entry_counts(arr), self._open.get(f.name)
            if last is not None and len(last[1]) == len(arr.dictionary) and last[1].equals(arr.dictionary):
                last[2][:] += counts
                continue
            if last is not None:
                self._close(f.name)
            self._open[f.name] = (owner.name, arr.dictionary, counts)

    def tables(self) -> list[tuple[str, pa.Table]]:
        """(owner, its count table) for each owner counted since the last call, which starts again."""
        for feature in list(self._open):
            self._close(feature)
        tables, self._tables = self._tables, {}
        return [(owner, merge_count_tables(owned)) for owner, owned in tables.items()]

    def _close(self, feature: str) -> None:
        owner, dictionary, counts = self._open.pop(feature)
        self._append(owner, _entry_table(dictionary, counts))

    def _append(self, owner: str, table: pa.Table) -> None:
        tables = self._tables.setdefault(owner, [])
        tables.append(table)
        if len(tables) > 1 and sum(t.num_rows for t in tables) > self._compact_rows:
            tables[:] = [merge_count_tables(tables)]


def merge_count_tables(tables: list[pa.Table]) -> pa.Table:
    """One count table: the counts of equal values summed."""
    if not tables:
        return COUNT_SCHEMA.empty_table()
    if len(tables) == 1:
        return tables[0]
    summed = pa.concat_tables(tables).group_by("value").aggregate([("count", "sum")])
    # one chunk per column: group_by's chunks share their buffers, and pickling (how a Beam runner moves the
    # table between stages) writes the shared buffers once per chunk, 9x the table for 40 merged batches
    return pa.Table.from_arrays([summed.column("value").combine_chunks(), summed.column("count_sum").combine_chunks()],
                                schema=COUNT_SCHEMA)


def select_vocabulary_table(counts: pa.Table, min_count: int, max_size: int | None) -> tuple[pa.Array, pa.Array]:
    """select_vocabulary over a count table, vectorised (same order: count descending, ties by value);
    the values and counts as Arrow arrays."""
    kept = counts.filter(pc.greater_equal(counts.column("count"), min_count))
    kept = kept.sort_by([("count", "descending"), ("value", "ascending")])
    if max_size is not None:
        kept = kept.slice(0, max_size)
    return kept.column("value").combine_chunks(), kept.column("count").combine_chunks()


def select_vocabulary(counts: Iterable[tuple[str, int]], min_count: int, max_size: int | None
                      ) -> tuple[list[str], list[int]]:
    """Values with count >= min_count, most frequent first, ties by value; at most max_size."""
    kept = sorted(((v, c) for v, c in counts if c >= min_count), key=lambda vc: (-vc[1], vc[0]))
    if max_size is not None:
        kept = kept[:max_size]
    return [v for v, _ in kept], [c for _, c in kept]


# ------------------------------------------------------------------ dense statistics, exact
# A runner splits the train batches into bundles and merges their partial results in an order of its own, and
# a float sum depends on that grouping. So the statistics are reduced exactly: integer sums and counts, the
# same whatever the grouping and order, turned into floats once, at the end.
_UNIT_BITS = 346  # sums are integers in units of 2**-346, of which every float32 and its square are multiples
_CHUNK = 1 << 15  # values summed at a time: small arrays stay cheap to allocate (2**17: 1.7x the time); <= 2**17
_BAND = 6  # exponents summed together (_band_sums)


@dataclass(frozen=True)
class Moments:
    """The count, sum and sum of squares of float32 values, exactly.

    The sums are Python ints in units of 2**-_UNIT_BITS (every float32 and its float64 square, which is
    exact, is a whole multiple of it), so `+` is exact: any grouping and order of the same values gives
    equal Moments. Non-finite values are counted, and their float sum kept apart in `nonfinite` (0.0 when
    there is none; else inf, -inf or nan, whatever the order)."""
    count: int = 0
    total: int = 0
    squares: int = 0
    nonfinite: float = 0.0

    def __add__(self, other: "Moments") -> "Moments":
        return Moments(self.count + other.count, self.total + other.total, self.squares + other.squares,
                       self.nonfinite + other.nonfinite)


def moments_of(values: np.ndarray) -> Moments:
    """The exact Moments of float32 values, vectorised: about 3 ns a value (7 when their magnitudes span
    over 2**6 within a chunk), where numpy's float sums take 0.7.

    Args:
        values: a 1-D float32 array.

    Returns:
        Their count, and their sum and sum of squares in units of 2**-_UNIT_BITS.

    Raises:
        TypeError: `values` is not float32 (a float64's square is not exact in float64).
    """
    if values.dtype != np.float32:
        raise TypeError(f"moments_of takes float32 values, not {values.dtype}")
    total = squares = 0
    nonfinite = 0.0
    for start in range(0, len(values), _CHUNK):
        v = values[start:start + _CHUNK]
        finite = np.isfinite(v)
        if not finite.all():
            nonfinite += float(v[~finite].astype(np.float64).sum())  # inf, -inf or nan: the same in any order
            v = v[finite]
        tiny = (np.abs(v) < np.finfo(np.float32).tiny) & (v != 0)
        if tiny.any():  # subnormals, scaled by 2**64 into normal numbers (exactly), their sums scaled back
            t, q = _exact_sums(v[tiny] * np.float32(2.0 ** 64))
            total, squares = total + (t >> 64), squares + (q >> 128)
            v = v[~tiny]
        t, q = _exact_sums(v)
        total, squares = total + t, squares + q
    return Moments(len(values), total, squares, nonfinite)


def _exact_sums(v: np.ndarray) -> tuple[int, int]:
    """(sum of v, sum of v*v) in units of 2**-_UNIT_BITS, for at most _CHUNK finite normal float32 values (or 0):
    by plain float64 sums when their exponents span fewer than _BAND (3 ns a value), else per exponent (7 ns)."""
    if not len(v):
        return 0, 0
    exponent = np.frexp(v)[1]
    low = int(exponent.min())
    if int(exponent.max()) - low < _BAND:
        return _band_sums(v, low)
    return _sums_by_exponent(v.astype(np.float64), exponent, low)


def _sums_by_exponent(x: np.ndarray, exponent: np.ndarray, low: int) -> tuple[int, int]:
    """_exact_sums of float32 values x (as float64) with their exponents e (x = f * 2**e) and the lowest.

    f is a multiple of 2**-24 below 1, so per exponent the float64 sums of the f, of the whole parts of
    f*f*2**24 (f*f: exact, 48 bits) and of their fractions (multiples of 2**-24 below 1) are exact for up
    to 2**28 values; the few per-exponent sums then add up as Python ints."""
    f = np.frexp(x)[0]
    idx = (exponent - low).astype(np.intp)
    sum_f = np.bincount(idx, weights=f)
    f *= f
    f *= 16777216.0  # f*f * 2**24, in [2**22, 2**24) or 0
    whole = np.floor(f)
    sum_whole = np.bincount(idx, weights=whole)
    f -= whole
    sum_frac = np.bincount(idx, weights=f)
    total = squares = 0
    for k in np.flatnonzero(sum_whole).tolist():  # the exponents present (a nonzero value has whole >= 2**22)
        e = k + low
        total += int(sum_f[k] * 16777216.0) << (e - 24 + _UNIT_BITS)
        squares += ((int(sum_whole[k]) << 24) + int(sum_frac[k] * 16777216.0)) << (2 * e - 48 + _UNIT_BITS)
    return total, squares


def _band_sums(v: np.ndarray, b: int) -> tuple[int, int]:
    """(sum of v, sum of v*v) in units of 2**-_UNIT_BITS, exactly, for at most _CHUNK normal float32 values (or
    0) whose exponents e (|v| < 2**e) lie in [b, b + _BAND).

    A value is a multiple of 2**(e - 24), so of 2**(b - 24), and below 2**(b + 6): 30 bits, and float64 sums
    of 2**17 of them are exact in any order (30 + 17 <= 53). A square is h*h + 2*h*l + l*l, h the value's
    top 12 significant bits (a multiple of 2**(b - 12) below 2**(b + 6)) and l the rest (a multiple of
    2**(b - 24) below 2**(b - 6)): h*h, h*l and l*l are exact in float64 and span 36 bits each (multiples of
    2**(2b - 24), 2**(2b - 36), 2**(2b - 48) below 2**(2b + 12), 2**(2b), 2**(2b - 12)), so their sums are
    exact too (36 + 17 <= 53)."""
    x = v.astype(np.float64)
    h = (v.view(np.uint32) & np.uint32(0xFFFFF000)).view(np.float32).astype(np.float64)  # 12 significant bits
    total = int(math.ldexp(float(x.sum()), 24 - b)) << (b - 24 + _UNIT_BITS)
    x -= h  # the rest, l
    # np.dot: no product arrays; its order, blocking or FMA cannot round a sum that is exact
    hh, hl, ll = (int(math.ldexp(float(np.dot(p, q)), 48 - 2 * b)) for p, q in ((h, h), (h, x), (x, x)))
    return total, (hh + 2 * hl + ll) << (2 * b - 48 + _UNIT_BITS)


def batch_moments(cols: dict[str, pa.Array], cfg: Config) -> dict[str, Moments]:
    """{dense feature with moments (not bucketized): the exact Moments of its values} of one canonical
    batch, as its statistics see them (recpipe.features.canonical.dense_prenorm, missing values filled)."""
    return {d.name: moments_of(dense_prenorm(cols[d.name].to_numpy(zero_copy_only=False), d.transform, d.fill))
            for d in cfg.features.dense if d.transform != "bucketize"}


def moment_stats(acc: dict[str, Moments]) -> dict[str, dict]:
    """{feature: {"mean", "std", "count"}} from merged Moments, exact until each is rounded once: the
    same floats for the same values, however they were grouped and ordered. No value: mean 0, std 1."""
    stats = {}
    for k, m in acc.items():
        if m.count and m.nonfinite != 0.0:  # an inf or nan among the values (nan != 0.0 too)
            stats[k] = {"mean": m.nonfinite, "std": math.nan, "count": m.count}
        else:
            stats[k] = _stats(m.count, Fraction(m.total, 1 << _UNIT_BITS), Fraction(m.squares, 1 << _UNIT_BITS))
    return stats


def _stats(n: int, total: Fraction, squares: Fraction) -> dict:
    """Mean and standard deviation of n values from their exact sum and sum of squares: the variance
    squares/n - mean**2 is exact (so never negative), rounded once, then its square root."""
    if not n:
        return {"mean": 0.0, "std": 1.0, "count": 0}
    mean = total / n
    return {"mean": float(mean), "std": math.sqrt(float(squares / n - mean * mean)), "count": n}


def add_moments(a: Moments, b: Moments) -> Moments:
    return a + b


# ------------------------------------------------------------------ bucket boundaries, from exact counts
# A quantile sketch that collapses buffers as it is fed (Beam's ApproximateQuantiles) depends on the bundles
# too. Exact counts of values on a fixed grid (like DDSketch's) do not: they are merged by adding.
_SKETCH_DROP = 12  # low bits of a value's order-preserving 32-bit key dropped: bins 2**-11 of the value wide


@dataclass(frozen=True, eq=False)
class QuantileSketch:
    """How many float32 values fall in each bin of a fixed grid: a value's order-preserving bit pattern
    with its low _SKETCH_DROP bits dropped (sign, exponent and the top 11 bits of the significand), so a
    bin holds the values that have the same 12 significant bits, cut toward zero. The counts are exact and
    merged by adding, so any grouping and order of the same values gives the same sketch."""
    bins: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))   # ascending
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # > 0, one per bin

    @classmethod
    def of(cls, values: np.ndarray) -> "QuantileSketch":
        """The sketch of float32 values (-0.0 counts as 0.0).

        Args:
            values: a 1-D float32 array without NaN.

        Returns:
            The counts of its values per bin.

        Raises:
            TypeError: `values` is not float32.
            ValueError: a value is NaN (it has no place in an order).
        """
        if values.dtype != np.float32:
            raise TypeError(f"QuantileSketch.of takes float32 values, not {values.dtype}")
        if not len(values):
            return cls()
        if np.isnan(values).any():
            raise ValueError("QuantileSketch.of: a value is NaN")
        bins = _order_keys(values) >> np.uint32(_SKETCH_DROP)
        low = int(bins.min())
        if int(bins.max()) - low > 4 * len(bins):  # bins far apart (values of both signs): sort instead
            present, counts = np.unique(bins, return_counts=True)
            return cls(present.astype(np.uint32), counts.astype(np.int64))
        counts = np.bincount((bins - np.uint32(low)).astype(np.intp))
        present = np.flatnonzero(counts)
        return cls((present + low).astype(np.uint32), counts[present].astype(np.int64))

    def __add__(self, other: "QuantileSketch") -> "QuantileSketch":
        bins = np.concatenate([self.bins, other.bins])
        if not len(bins):
            return QuantileSketch()
        order = np.argsort(bins, kind="stable")
        bins, counts = bins[order], np.concatenate([self.counts, other.counts])[order]
        starts = np.flatnonzero(np.concatenate([[True], bins[1:] != bins[:-1]]))
        return QuantileSketch(bins[starts], np.add.reduceat(counts, starts))

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def at_ranks(self, ranks: list[int]) -> list[float]:
        """The values at these 0-based ranks in ascending order, each cut toward zero to 12 significant bits
        (its bin's value nearest zero: off by under 2**-11 of it, exact when it has no more bits)."""
        cumulative = np.cumsum(self.counts)
        found = np.searchsorted(cumulative, np.asarray(ranks, np.int64), side="right")
        return [_nearest_zero(int(self.bins[i])) for i in found.tolist()]


def _order_keys(values: np.ndarray) -> np.ndarray:
    """float32 values -> uint32 keys in the same order (-0.0 as 0.0)."""
    bits = (values + np.float32(0.0)).view(np.uint32)  # -0.0 + 0.0 is 0.0
    return np.where(bits >> np.uint32(31) != 0, ~bits, bits | np.uint32(0x80000000))


def _nearest_zero(b: int) -> float:
    """The float32 value of bin b nearest zero: its lowest key for a positive bin, its highest for a negative."""
    key = b << _SKETCH_DROP
    bits = key ^ 0x80000000 if key & 0x80000000 else ~(key | ((1 << _SKETCH_DROP) - 1)) & 0xFFFFFFFF
    return float(np.array([bits], np.uint32).view(np.float32)[0])


def sketch_boundaries(sketch: QuantileSketch, num_buckets: int) -> list[float]:
    """num_buckets - 1 inner bucket boundaries, deduplicated: the values at the i/num_buckets quantiles,
    0-based rank (i * n - 1) // num_buckets of the n values (the ranks ApproximateQuantiles targets).

    Args:
        sketch: the feature's values.
        num_buckets: buckets wanted (>= 1).

    Returns:
        The ascending boundaries; [] when the sketch holds no value.
    """
    n = sketch.count
    if not n:
        return []
    return sorted(set(sketch.at_ranks([(i * n - 1) // num_buckets for i in range(1, num_buckets)])))


def batch_dense_stats(cols: dict[str, pa.Array], cfg: Config) -> dict[str, "Moments | QuantileSketch"]:
    """{dense feature: its exact Moments, or for a bucketized one its QuantileSketch} of one canonical batch;
    merged across batches with `+`, then finished by dense_stats."""
    out: dict = batch_moments(cols, cfg)
    for d in cfg.features.dense:
        if d.transform == "bucketize":
            out[d.name] = QuantileSketch.of(dense_prenorm(cols[d.name].to_numpy(zero_copy_only=False),
                                                          d.transform, d.fill))
    return out


def dense_stats(acc: dict[str, "Moments | QuantileSketch"], cfg: Config) -> dict[str, dict]:
    """The dense statistics from batch_dense_stats merged: {feature: {mean, std, count}} or, bucketized,
    {feature: {boundaries}} (every bucketized feature, [] without a value)."""
    stats = moment_stats({k: v for k, v in acc.items() if isinstance(v, Moments)})
    for d in cfg.features.dense:
        if d.transform == "bucketize":
            stats[d.name] = {"boundaries": sketch_boundaries(acc.get(d.name, QuantileSketch()), d.num_buckets)}
    return stats


def boundaries_from_quantiles(qs: list[float], num_buckets: int) -> list[float]:
    """num_buckets - 1 inner boundaries picked from evenly spaced quantiles (min ... max)."""
    step = (len(qs) - 1) / num_buckets
    return sorted({float(qs[round(i * step)]) for i in range(1, num_buckets)})


def merge_dense_stats(previous: dict[str, dict], current: dict[str, dict]) -> dict[str, dict]:
    """Running statistics over days: moments add up; bucket boundaries stay the previous ones.

    Args:
        previous: the previous artifact's dense statistics.
        current: this run's.

    Returns:
        `current` with each feature both have combined: bucket boundaries the previous ones; mean, std and
        count those of the two days' values together, computed exactly from the floats (one rounding each).
    """
    out = dict(current)
    for name, prev in previous.items():
        cur = current.get(name)
        if cur is None:
            continue
        if "boundaries" in prev:
            out[name] = prev
            continue
        days = (prev, cur)
        if not all(math.isfinite(s["mean"]) and math.isfinite(s["std"]) for s in days):
            out[name] = {"mean": math.nan, "std": math.nan, "count": prev["count"] + cur["count"]}
            continue
        total = sum(Fraction(s["mean"]) * s["count"] for s in days)
        squares = sum((Fraction(s["std"]) ** 2 + Fraction(s["mean"]) ** 2) * s["count"] for s in days)
        out[name] = _stats(prev["count"] + cur["count"], total, squares)
    return out
