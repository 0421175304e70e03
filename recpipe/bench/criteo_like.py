"""A Criteo-shaped click log for the preprocessing peers: label, 13 integer counts (10 % missing)
and 26 string IDs whose cardinalities run from 10 to 1M on a geometric scale, Zipf-distributed
(a few very common values, a long tail), in Parquet files of up to 500k rows."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["write_criteo_like"]


def write_criteo_like(rows: int, out: str, seed: int = 0, file_rows: int = 500_000) -> str:
    """Write the log to out/dt=2026-01-01/part-NNNNN.parquet unless it is there already."""
    part_dir = os.path.join(out, "dt=2026-01-01")
    if os.path.isdir(part_dir):
        return out
    tmp = out + ".partial"
    os.makedirs(os.path.join(tmp, "dt=2026-01-01"), exist_ok=True)
    rng = np.random.default_rng(seed)
    cards = np.geomspace(10, 1_000_000, 26).astype(np.int64)
    for part, start in enumerate(range(0, rows, file_rows)):
        n = min(file_rows, rows - start)
        cols = {"label": pa.array((rng.random(n) < 0.25).astype(np.int64))}
        for i in range(13):
            counts = rng.lognormal(2.0, 2.0, n).astype(np.int64)
            cols[f"I{i + 1}"] = pa.array(counts, mask=rng.random(n) < 0.1)
        for i, card in enumerate(cards):
            ids = (rng.zipf(1.2, n) - 1) % card
            cols[f"C{i + 1}"] = pc.cast(pa.array(ids * 2_654_435_761 % (1 << 32)), pa.string())
        pq.write_table(pa.table(cols), os.path.join(tmp, "dt=2026-01-01", f"part-{part:05d}.parquet"))
    os.replace(tmp, out)
    return out
