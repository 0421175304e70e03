"""Strategy advisor: PS or ring-allreduce for this model, from its parameter sizes and a short probe.

Inputs: sparse (embedding) and dense parameter counts from the model built on the artifact; the
measured time of a local training step; the measured unique IDs per batch. Per-step traffic of one
worker, for N workers, M PS tasks and a stated bandwidth:
  allreduce: ring allreduce of the dense gradients, 2(N-1)/N x dense bytes, plus the allgather of
             every rank's embedding gradient rows, (N-1) x unique rows x dim x 4 bytes;
  PS:        pull + push of the dense weights and of the touched embedding rows, 2 x (dense +
             unique rows x dim) x 4 bytes, with the PS tasks' links shared by N workers.
A full replica (weights + optimizer slots) must fit one worker for allreduce; if it does not, PS
is the only choice. Otherwise the lower predicted step time wins.
"""
from __future__ import annotations

import os

import time
from dataclasses import asdict, dataclass

import numpy as np
import tensorflow as tf

from trainers.data import make_dataset
from trainers.layers import flat_ids
from trainers.models import build_model, dummy_batch
from trainers.optim import optimizer_for

__all__ = ["Advice", "advise", "predict", "step_times"]

BYTES = 4  # float32 parameters and gradients


@dataclass
class Advice:
    strategy: str              # "ps" | "horovod"
    reason: str
    sparse_params: int
    dense_params: int
    unique_rows_per_batch: float
    step_compute_s: float
    workers: int
    ps_tasks: int
    bandwidth_gbps: float
    replica_bytes: int
    worker_memory_bytes: int
    allreduce_step_s: float
    ps_step_s: float

    def as_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        return "\n".join([
            f"advise: sparse (embedding) parameters {self.sparse_params:,}, dense {self.dense_params:,} "
            f"({self.sparse_params / max(self.sparse_params + self.dense_params, 1):.1%} sparse)",
            f"advise: measured local step {self.step_compute_s * 1000:.1f} ms, "
            f"{self.unique_rows_per_batch:,.0f} unique embedding rows per batch",
            f"advise: predicted step with {self.workers} workers at {self.bandwidth_gbps:g} Gbit/s: "
            f"allreduce {self.allreduce_step_s * 1000:.1f} ms, PS ({self.ps_tasks} PS) {self.ps_step_s * 1000:.1f} ms",
            f"advise: -> {self.strategy}: {self.reason}",
        ])


def step_times(step_s: float, dense_bytes: float, row_bytes: float, workers: int, ps_tasks: int,
               bandwidth_bytes_per_s: float) -> tuple[float, float]:
    """(allreduce step seconds, PS step seconds) for one worker: compute + traffic / bandwidth, no
    overlap. row_bytes: the embedding-gradient rows one worker's step touches, in bytes."""
    n = max(workers, 1)
    allreduce_bytes = 2 * (n - 1) / n * dense_bytes + (n - 1) * row_bytes
    ps_worker_bytes = 2 * (dense_bytes + row_bytes)
    ps_link_bytes = max(ps_worker_bytes, n * ps_worker_bytes / max(ps_tasks, 1))  # PS links are shared
    return step_s + allreduce_bytes / bandwidth_bytes_per_s, step_s + ps_link_bytes / bandwidth_bytes_per_s


def predict(sparse: int, dense: int, unique_rows: float, dim: float, step_s: float, workers: int, ps_tasks: int,
            bandwidth_gbps: float) -> tuple[float, float]:
    """(allreduce step seconds, PS step seconds) for one worker of this model."""
    return step_times(step_s, dense * BYTES, unique_rows * dim * BYTES, workers, ps_tasks, bandwidth_gbps * 1e9 / 8)


def _probe(model, cfg, data_dir: str, steps: int = 20) -> tuple[float, float, float]:
    """(seconds per local step, unique embedding rows per batch, mean embedding dim)."""
    it = iter(make_dataset(cfg, data_dir, "train", cfg.train.batch_size, training=True))
    batch = next(it)
    uniques, dims = [], []
    tables = model.embeddings.table_specs
    for f in cfg.features.sparse:
        ids = flat_ids(batch[f.name])
        uniques.append(len(np.unique(ids.numpy())))
        dims.append(tables[cfg.table_owner(f).name]["dim"])
    train_step = tf.function(model.train_step, reduce_retracing=True)
    for _ in range(3):
        train_step(next(it))
    t0 = time.perf_counter()
    for _ in range(steps):
        out = train_step(next(it))
    float(out["loss"])  # wait for the last step
    step = (time.perf_counter() - t0) / steps
    dim = float(np.average(dims, weights=uniques)) if uniques else 0.0
    return step, float(sum(uniques)), dim


def advise(cfg, artifact, data_dir: str, workers: int = 8, ps_tasks: int = 2, bandwidth_gbps: float = 10.0,
           worker_memory_bytes: int | None = None) -> Advice:
    model = build_model(cfg, artifact)
    model.compile(optimizer=optimizer_for(cfg))
    model(dummy_batch(cfg))
    sparse = sum(int(np.prod(w.shape)) for w in model.trainable_weights if "/embeddings/emb_" in w.name)
    dense = sum(int(np.prod(w.shape)) for w in model.trainable_weights) - sparse
    step, unique_rows, dim = _probe(model, cfg, data_dir)
    if worker_memory_bytes is None:
        worker_memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    replica = (sparse + dense) * BYTES * 3  # weights + optimizer slots + gradients, roughly
    t_ar, t_ps = predict(sparse, dense, unique_rows, dim, step, workers, ps_tasks, bandwidth_gbps)
    if replica > worker_memory_bytes:
        strategy = "ps"
        reason = (f"a full replica needs ~{replica / 2**30:.1f} GiB, over the {worker_memory_bytes / 2**30:.1f} GiB "
                  f"a worker has: the embedding tables must be sharded over PS tasks")
    elif t_ps < t_ar:
        strategy = "ps"
        reason = (f"sparse-heavy: allgathering {workers - 1} ranks' embedding rows costs more than pulling and "
                  f"pushing only the touched rows ({t_ps * 1000:.1f} vs {t_ar * 1000:.1f} ms per step)")
    else:
        strategy = "horovod"
        reason = (f"dense-heavy or small: synchronous ring-allreduce is cheaper per step "
                  f"({t_ar * 1000:.1f} vs {t_ps * 1000:.1f} ms) and keeps every worker in step")
    return Advice(strategy, reason, sparse, dense, unique_rows, step, workers, ps_tasks, bandwidth_gbps, replica,
                  int(worker_memory_bytes), t_ar, t_ps)
