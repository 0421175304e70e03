"""This CPU's large-matmul ceiling in fp32 and bf16 (TensorFlow, all cores), in GFLOP/s.

`python -m recpipe.flops [N] [REPS] [SECONDS]` prints JSON {"fp32": [..], "bf16": [..]} (one figure per rep).
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

__all__ = ["matmul_gflops"]


def matmul_gflops(dtype: str, n: int = 2048, reps: int = 3, seconds: float = 1.5) -> list[float]:
    import tensorflow as tf
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


if __name__ == "__main__":
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 1.5
    print(json.dumps({d: matmul_gflops(d, size, reps, seconds) for d in ("fp32", "bf16")}))
