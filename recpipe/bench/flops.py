"""FLOP accounting for the training benchmarks: this CPU's large-matmul ceiling in fp32 and bf16
(TensorFlow, all cores) and the dense FLOPs a ranking model spends per example.

`python -m recpipe.bench.flops [N] [REPS] [SECONDS]` prints JSON {"fp32": [..], "bf16": [..]} (GFLOP/s,
one figure per rep), measured in that fresh process.
"""
from __future__ import annotations

import json
import os
import sys
import time

from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import Config, embedding_dim

__all__ = ["matmul_gflops", "dense_flops_per_example"]


def matmul_gflops(dtype: str, n: int = 2048, reps: int = 3, seconds: float = 1.5) -> list[float]:
    import tensorflow as tf  # in the measuring process only
    a = tf.random.normal([n, n], dtype=tf.float32)
    b = tf.random.normal([n, n], dtype=tf.float32)
    if dtype == "bf16":
        a, b = tf.cast(a, tf.bfloat16), tf.cast(b, tf.bfloat16)

    @tf.function
    def mm(x, y):
        return tf.reduce_sum(tf.cast(tf.matmul(x, y), tf.float32))

    float(mm(a, b))  # warm-up (and oneDNN kernel selection)
    out = []
    for _ in range(reps):
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            float(mm(a, b))
            calls += 1
        out.append(2 * n ** 3 * calls / (time.perf_counter() - t0) / 1e9)
    return out


def dense_flops_per_example(cfg: Config, artifact: TransformArtifact) -> int:
    """Forward FLOPs of the dense part of a ranking model per example (2 per multiply-add of each
    matmul; element-wise ops not counted). Training costs about 3x this (forward + two backward
    matmuls). Embedding lookups are memory traffic, not FLOPs."""
    m = cfg.model
    n_dense = len(cfg.features.dense)
    if m.type == "logistic":
        return 2 * n_dense
    dims = [embedding_dim(cfg, f) for f in cfg.features.sparse]
    width = sum(dims) + n_dense

    def mlp(n_in: int, widths: list[int]) -> tuple[int, int]:
        flops = 0
        for w in widths:
            flops, n_in = flops + 2 * n_in * w, w
        return flops, n_in

    if m.type == "dcn_v2":
        per_cross = 2 * width * width if not m.low_rank else 4 * width * m.low_rank
        deep, last = mlp(width, m.deep_layers)
        return m.cross_layers * per_cross + deep + 2 * last
    if m.type == "dlrm":
        dim = dims[0]
        bottom, _ = mlp(n_dense or 1, [*m.bottom_layers, dim])
        n = len(cfg.features.sparse) + 1
        interaction = 2 * n * n * dim
        top, last = mlp(dim + n * (n - 1) // 2, m.deep_layers)  # the products of distinct features
        return bottom + interaction + top + 2 * last
    raise ValueError(f"model type {m.type!r}: no ranking FLOP count")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 1.5
    print(json.dumps({d: matmul_gflops(d, size, reps, seconds) for d in ("fp32", "bf16")}))
