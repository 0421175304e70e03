"""The embedding-heavy DLRM of `recpipe bench embedding`: its table sizes, its recpipe config, and the sizes that
make it embedding-heavy (parameters of the tables against those of the dense layers, and the bytes of the
training state: weights and Adagrad accumulators).

Every contender of the suite trains this model: 26 hashed tables of one width over a Zipf-skewed log, a bottom
MLP mapping the 13 dense features to that width, DLRM's pairwise dot interaction and a top MLP, with Adagrad on
every weight, fp32, the same batch and threads.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["EmbeddingHeavySpec", "table_rows", "bench_config", "param_counts", "state_bytes"]

DENSE_FEATURES = 13


@dataclass(frozen=True)
class EmbeddingHeavySpec:
    """The model, the log and the run every contender shares.

    Attributes:
        total_rows: embedding rows of the 26 tables together.
        tables: how many tables (one sparse feature each).
        dim: every table's width (DLRM's dot interaction needs one width).
        smallest: rows of the smallest table; the others grow geometrically up to the largest.
        log_rows: rows of the generated log (the last 10 % by time are the eval split).
        exponent: the Zipf exponent of every ID column.
        bottom_layers: the dense features' MLP (its output is `dim` wide).
        deep_layers: the top MLP's widths (a logit follows).
        batch_size: rows per step, for every contender.
        learning_rate: Adagrad's step size, for tables and dense layers alike.
        threads: intra- and inter-op threads of every contender.
        seed: the log's and the models' seed.
    """
    total_rows: int = 10_400_000
    tables: int = 26
    dim: int = 32
    smallest: int = 1_000
    log_rows: int = 1_000_000
    exponent: float = 1.05
    bottom_layers: list = field(default_factory=lambda: [64])
    deep_layers: list = field(default_factory=lambda: [256, 128])
    batch_size: int = 1024
    learning_rate: float = 0.05
    threads: int = 2
    seed: int = 7


def table_rows(spec: EmbeddingHeavySpec) -> list[int]:
    """Each table's rows: a geometric profile from `smallest` up, scaled so they sum to `total_rows`
    (Criteo's 26 columns span 4 to 40M values on such a profile).

    Args:
        spec: the model.

    Returns:
        `tables` row counts, ascending, summing to `total_rows`.

    Raises:
        ValueError: total_rows cannot hold `tables` tables of at least `smallest` rows.
    """
    if spec.total_rows < spec.tables * spec.smallest:
        raise ValueError(f"embedding bench: {spec.total_rows:,} rows cannot hold {spec.tables} tables of at least "
                         f"{spec.smallest:,}")
    shape = np.geomspace(1.0, 3_000.0, spec.tables)
    rest = spec.total_rows - spec.tables * spec.smallest
    rows = spec.smallest + np.floor(rest * (shape - 1) / (shape - 1).sum()).astype(np.int64)
    rows[-1] += spec.total_rows - int(rows.sum())
    return [int(r) for r in rows]


def bench_config(spec: EmbeddingHeavySpec) -> dict:
    """The recpipe config of the model (what `recpipe preprocess` and `recpipe train` read).

    Args:
        spec: the model.

    Returns:
        A config dict: C1..C26 hashed into `table_rows(spec)` buckets, I1..I13 log/z-scored, model.type dlrm.
    """
    sparse = [{"name": f"C{i + 1}", "column": f"C{i + 1}", "hash_buckets": rows, "embedding_dim": spec.dim}
              for i, rows in enumerate(table_rows(spec))]
    dense = [{"name": f"I{i + 1}", "column": f"I{i + 1}", "transform": "log_zscore", "fill": 0}
             for i in range(DENSE_FEATURES)]
    return {"name": "embedding_heavy_dlrm", "input": {"timestamp": "ts"}, "split": {"eval_fraction": 0.1},
            "label": {"column": "label"}, "features": {"sparse": sparse, "dense": dense},
            "model": {"task": "ranking", "type": "dlrm", "bottom_layers": list(spec.bottom_layers),
                      "deep_layers": list(spec.deep_layers)},
            "train": {"batch_size": spec.batch_size, "learning_rate": spec.learning_rate, "optimizer": "adagrad",
                      "seed": spec.seed,
                      "tuning": {"intra_op_threads": spec.threads, "inter_op_threads": spec.threads}}}


def _mlp_params(widths: list[int]) -> int:
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def param_counts(spec: EmbeddingHeavySpec) -> dict:
    """Parameters of the tables and of the dense layers. The top MLP reads the bottom MLP's output and the
    F(F-1)/2 dot products of distinct features (recpipe's DLRM, TorchRec's and the TFRS default's).

    Args:
        spec: the model.

    Returns:
        {"embedding": n, "dense": n, "embedding_vs_dense": ratio}.
    """
    f = spec.tables + 1  # the tables and the bottom MLP's output
    dense = (_mlp_params([DENSE_FEATURES, *spec.bottom_layers, spec.dim])
             + _mlp_params([spec.dim + f * (f - 1) // 2, *spec.deep_layers, 1]))
    embedding = spec.total_rows * spec.dim
    return {"embedding": embedding, "dense": dense, "embedding_vs_dense": embedding / dense}


def state_bytes(spec: EmbeddingHeavySpec) -> int:
    """Bytes of the training state recpipe's model holds: every fp32 weight and its Adagrad accumulator.

    Args:
        spec: the model.

    Returns:
        2 x 4 x (embedding + dense parameters).
    """
    p = param_counts(spec)
    return 8 * (p["embedding"] + p["dense"])
