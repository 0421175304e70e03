"""The click log of `recpipe bench embedding`: 26 integer ID columns, each Zipf-skewed over as many values as
its table has rows (a few IDs in most rows, a long tail seen once or never: ID dedup and caches matter as in
real logs), 13 log-normal counts, a timestamp over two days, and a label drawn from a hidden logistic model
of the IDs and counts (so eval AUC says whether a contender learnt). Date-partitioned Parquet, as
`recpipe preprocess` reads it."""
from __future__ import annotations

import datetime as dt
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recpipe.bench.embedding_model import DENSE_FEATURES, EmbeddingHeavySpec, table_rows

__all__ = ["truncated_zipf", "write_zipf_log"]

_EFFECTS = 1 << 16  # hidden per-ID effects (an ID's effect is that of its index modulo this)


def truncated_zipf(rng: np.random.Generator, n: int, values: int, exponent: float) -> np.ndarray:
    """Zipf ranks over 0..values-1: P(rank k) proportional to (k + 1) ** -exponent. The first 4,096 ranks are
    drawn from their exact probabilities; the tail beyond by inverting the continuous power law's CDF (exact to
    well under 1 % there), so no table of `values` probabilities is built.

    Args:
        rng: the generator.
        n: how many draws.
        values: how many distinct ranks.
        exponent: the Zipf exponent (> 0).

    Returns:
        int64 ranks in [0, values), rank 0 the most frequent.

    Raises:
        ValueError: values < 1 or exponent <= 0.
    """
    if values < 1 or exponent <= 0:
        raise ValueError(f"truncated_zipf: values {values} >= 1 and exponent {exponent} > 0 needed")
    k = min(values, 4_096)
    weights = np.arange(1, k + 1, dtype=np.float64) ** -exponent
    a, b = k + 0.5, values + 0.5  # sum_{j=k+1}^{values} j^-s ~ the integral of x^-s over [a, b]
    if abs(exponent - 1.0) < 1e-9:
        tail = np.log(b / a)
    else:
        tail = (b ** (1.0 - exponent) - a ** (1.0 - exponent)) / (1.0 - exponent)
    head = rng.random(n) < weights.sum() / (weights.sum() + tail)
    out = np.empty(n, np.int64)
    cdf = np.cumsum(weights) / weights.sum()
    out[head] = np.minimum(np.searchsorted(cdf, rng.random(int(head.sum())), side="right"), k - 1)
    v = rng.random(n - int(head.sum()))
    if abs(exponent - 1.0) < 1e-9:
        x = a * (b / a) ** v
    else:
        lo, hi = a ** (1.0 - exponent), b ** (1.0 - exponent)
        x = (lo + v * (hi - lo)) ** (1.0 / (1.0 - exponent))
    out[~head] = np.clip(np.rint(x).astype(np.int64) - 1, k, values - 1)
    return out


def _chunk(spec: EmbeddingHeavySpec, rng: np.random.Generator, n: int, effects: np.ndarray,
           day_start: int) -> pa.Table:
    cols: dict[str, pa.Array] = {"ts": pa.array(np.sort(rng.integers(day_start, day_start + 86_400, n)),
                                                pa.timestamp("s"))}
    logit = np.full(n, -1.6)
    for i, rows in enumerate(table_rows(spec)):
        ranks = truncated_zipf(rng, n, rows, spec.exponent)
        logit += effects[i][ranks % _EFFECTS]
        # the raw value: the rank scrambled (an odd multiplier is a bijection modulo 2**40), as logged IDs are
        cols[f"C{i + 1}"] = pa.array((ranks * 0x9E3779B1 + i) % (1 << 40), pa.int64())
    for j in range(DENSE_FEATURES):
        counts = np.floor(rng.lognormal(1.5, 1.5, n))
        if j < 3:
            logit += 0.25 * (np.log1p(counts) - 1.5)
        cols[f"I{j + 1}"] = pa.array(counts.astype(np.int64))
    label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    return pa.table({"label": pa.array(label), **cols})


def write_zipf_log(spec: EmbeddingHeavySpec, out: str, days: int = 2, file_rows: int = 250_000) -> str:
    """Write spec.log_rows rows as out/dt=YYYY-MM-DD/part-NNNNN.parquet (written elsewhere, then renamed).

    Args:
        spec: the model and the log's size, skew and seed.
        out: the log's folder (replaced).
        days: the rows are spread evenly over this many days from 2026-01-01.
        file_rows: rows per Parquet file at most.

    Returns:
        `out`.
    """
    rng = np.random.default_rng(spec.seed)
    # each ID's hidden effect: N(0, 0.45) for the column's first 64k ranks (its head, seen often enough to learn)
    effects = rng.normal(0.0, 0.45, (spec.tables, _EFFECTS))
    tmp = f"{out}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    per_day = -(-spec.log_rows // days)
    start = dt.date(2026, 1, 1)
    for d in range(days):
        day = start + dt.timedelta(days=d)
        folder = os.path.join(tmp, f"dt={day.isoformat()}")
        os.makedirs(folder)
        day_rows = min(per_day, spec.log_rows - d * per_day)
        epoch = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.timezone.utc).timestamp())
        for part, first in enumerate(range(0, day_rows, file_rows)):
            n = min(file_rows, day_rows - first)
            chunk = _chunk(spec, rng, n, effects, epoch)
            pq.write_table(chunk, os.path.join(folder, f"part-{part:05d}.parquet"))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
