"""Pure analysis functions over canonical Arrow columns (no Beam): the combiners' building blocks.

The Beam job (recpipe.pipeline.transforms) and the single-process benchmark baseline both use them.
"""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recpipe.features.canonical import as_string, dense_prenorm, times
from recpipe.features.config import Config

__all__ = ["ts_histogram", "split_sizes", "split_cutoffs_from_histogram", "split_cutoffs_by_row",
           "user_last_orders", "merge_last_orders", "user_split_masks",
           "COUNT_SCHEMA", "token_count_tables", "merge_count_tables",
           "select_vocabulary_table", "select_vocabulary",
           "batch_moments", "moment_stats", "add_moments", "boundaries_from_quantiles", "merge_dense_stats"]


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
        if owner.vocab is None:
            continue
        arr = cols[f.name]
        if pa.types.is_list(arr.type):
            arr = pc.list_flatten(arr)
        counts = pc.value_counts(arr.cast(pa.string()))
        yield owner.name, pa.Table.from_arrays([counts.field("values"), counts.field("counts").cast(pa.int64())],
                                               schema=COUNT_SCHEMA)


def merge_count_tables(tables: list[pa.Table]) -> pa.Table:
    """One count table: the counts of equal values summed."""
    if not tables:
        return COUNT_SCHEMA.empty_table()
    if len(tables) == 1:
        return tables[0]
    summed = pa.concat_tables(tables).group_by("value").aggregate([("count", "sum")])
    return pa.Table.from_arrays([summed.column("value"), summed.column("count_sum")], schema=COUNT_SCHEMA)


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


def batch_moments(cols: dict[str, pa.Array], cfg: Config) -> dict[str, tuple[int, float, float]]:
    out = {}
    for d in cfg.features.dense:
        if d.transform == "bucketize":
            continue
        x = dense_prenorm(cols[d.name].to_numpy(zero_copy_only=False), d.transform, d.fill).astype(np.float64)
        out[d.name] = (len(x), float(x.sum()), float((x * x).sum()))
    return out


def moment_stats(acc: dict[str, tuple[int, float, float]]) -> dict[str, dict]:
    stats = {}
    for k, (n, s, ss) in acc.items():
        mean = s / n if n else 0.0
        var = max(ss / n - mean * mean, 0.0) if n else 1.0
        stats[k] = {"mean": mean, "std": math.sqrt(var), "count": n}
    return stats


def add_moments(a: tuple, b: tuple) -> tuple:
    return tuple(x + y for x, y in zip(a, b))


def boundaries_from_quantiles(qs: list[float], num_buckets: int) -> list[float]:
    """num_buckets - 1 inner boundaries picked from evenly spaced quantiles (min ... max)."""
    step = (len(qs) - 1) / num_buckets
    return sorted({float(qs[round(i * step)]) for i in range(1, num_buckets)})


def merge_dense_stats(previous: dict[str, dict], current: dict[str, dict]) -> dict[str, dict]:
    """Running statistics over days: moments add up; bucket boundaries stay the previous ones."""
    out = dict(current)
    for name, prev in previous.items():
        cur = current.get(name)
        if cur is None:
            continue
        if "boundaries" in prev:
            out[name] = prev
            continue
        moments = [(s["count"], s["mean"] * s["count"], (s["std"] ** 2 + s["mean"] ** 2) * s["count"])
                   for s in (prev, cur)]
        out[name] = moment_stats({name: add_moments(*moments)})[name]
    return out
