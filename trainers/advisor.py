"""Strategy advisor: PS or ring-allreduce for this model, from its parameter sizes and a short probe.

Inputs: dense and sparse (embedding) parameter counts of the model built on the artifact; the measured
time of a local training step; the embedding rows a batch touches, counted per table as the ID dedup
sends them (unique IDs, float32 rows + int64 IDs). Per-step time of one worker, for N workers, M PS
tasks and a link bandwidth B (full duplex: what a host sends and receives travel at once):
  allreduce: compute + [2(N-1)/N x dense bytes (ring allreduce) + (N-1) x row bytes (allgather of the
             other ranks' embedding gradients)] / B + overhead
  PS:        compute + max(worker link: dense + row bytes, PS link: N/M x that) / B + overhead, where each
             direction carries one of pull (weights, looked-up rows) and push (their gradients).
`overhead` is per-step time that is neither compute nor bytes over bandwidth: the CPU communication
takes (serialisation, copies, Gloo/gRPC threads) and the round trips. It is 0 unless measured:
`recpipe bench cluster` measures it across hosts on an unshaped link and `recpipe advise
--calibration bench/results/cluster.json` uses it. A full replica (weights + optimizer slots) must fit
one worker for allreduce; if it does not, PS is the only choice. Otherwise the lower step time wins.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

import numpy as np
import tensorflow as tf

from trainers.data import make_dataset
from trainers.layers import ids_by_table
from trainers.models import build_model, dummy_batch
from trainers.optim import optimizer_for

__all__ = ["Advice", "Overheads", "Traffic", "advise", "link_bytes", "predict", "step_times", "traffic"]

BYTES = 4     # float32 parameters and gradients
ID_BYTES = 8  # int64 row IDs travelling with sparse gradients


@dataclass(frozen=True)
class Overheads:
    """Per-step seconds beyond compute and bytes/bandwidth, measured across hosts (0: unknown)."""
    allreduce_s: float = 0.0
    ps_s: float = 0.0


@dataclass(frozen=True)
class Traffic:
    """What one worker's step exchanges, from the model and a real batch."""
    dense_params: int
    sparse_params: int
    batch_size: int
    rows_unique: float          # embedding rows a batch touches, per table (what ID dedup sends)
    rows_occurrences: float     # every looked-up row (without dedup)
    row_bytes_unique: float     # float32 rows + int64 IDs
    row_bytes_occurrences: float

    @property
    def dense_bytes(self) -> float:
        return self.dense_params * BYTES


def traffic(model: tf.keras.Model, batch: dict) -> Traffic:
    tables, features = model.embeddings.table_specs, model.embeddings.feature_specs
    sparse = sum(t["rows"] * t["dim"] for t in tables.values())
    total = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    unique = occurrences = unique_bytes = occurrence_bytes = 0.0
    for table, named in ids_by_table(features, batch).items():
        ids = np.concatenate([flat.numpy() for _, flat in named])
        per_row = tables[table]["dim"] * BYTES + ID_BYTES
        u = len(np.unique(ids))
        unique, occurrences = unique + u, occurrences + len(ids)
        unique_bytes, occurrence_bytes = unique_bytes + u * per_row, occurrence_bytes + len(ids) * per_row
    return Traffic(total - sparse, sparse, int(next(iter(batch.values())).shape[0]), unique, occurrences,
                   unique_bytes, occurrence_bytes)


def link_bytes(dense_bytes: float, row_bytes: float, workers: int, ps_tasks: int) -> tuple[float, float]:
    """(allreduce, PS) bytes one step puts on the busiest link in one direction."""
    n = max(workers, 1)
    allreduce = 2 * (n - 1) / n * dense_bytes + (n - 1) * row_bytes
    per_worker = dense_bytes + row_bytes  # pulled one way, pushed the other
    return allreduce, max(per_worker, n * per_worker / max(ps_tasks, 1))


def step_times(step_s: float, dense_bytes: float, row_bytes: float, workers: int, ps_tasks: int,
               bandwidth_bytes_per_s: float, overheads: Overheads = Overheads()) -> tuple[float, float]:
    """(allreduce step seconds, PS step seconds) for one worker; row_bytes: the embedding-gradient rows
    one worker's step touches, in bytes."""
    allreduce, ps = link_bytes(dense_bytes, row_bytes, workers, ps_tasks)
    distributed = workers > 1
    return (step_s + (overheads.allreduce_s if distributed else 0.0) + allreduce / bandwidth_bytes_per_s,
            step_s + overheads.ps_s + ps / bandwidth_bytes_per_s)


def predict(sparse: int, dense: int, unique_rows: float, dim: float, step_s: float, workers: int, ps_tasks: int,
            bandwidth_gbps: float, overheads: Overheads = Overheads()) -> tuple[float, float]:
    """(allreduce step seconds, PS step seconds) for one worker of this model."""
    return step_times(step_s, dense * BYTES, unique_rows * (dim * BYTES + ID_BYTES), workers, ps_tasks,
                      bandwidth_gbps * 1e9 / 8, overheads)


@dataclass
class Advice:
    strategy: str              # "ps" | "horovod"
    reason: str
    sparse_params: int
    dense_params: int
    unique_rows_per_batch: float
    row_bytes_per_batch: float
    step_compute_s: float
    workers: int
    ps_tasks: int
    bandwidth_gbps: float
    replica_bytes: int
    worker_memory_bytes: int
    allreduce_step_s: float
    ps_step_s: float
    overheads: dict

    def as_dict(self) -> dict:
        return asdict(self)

    def table(self) -> str:
        o = self.overheads
        calibrated = (f" (+ measured overheads: allreduce {o['allreduce_s'] * 1000:.1f} ms, PS {o['ps_s'] * 1000:.1f} ms)"
                      if any(o.values()) else " (bytes over bandwidth only: no --calibration)")
        return "\n".join([
            f"advise: sparse (embedding) parameters {self.sparse_params:,}, dense {self.dense_params:,} "
            f"({self.sparse_params / max(self.sparse_params + self.dense_params, 1):.1%} sparse)",
            f"advise: measured local step {self.step_compute_s * 1000:.1f} ms, "
            f"{self.unique_rows_per_batch:,.0f} unique embedding rows per batch "
            f"({self.row_bytes_per_batch / 2**20:.2f} MB with their IDs)",
            f"advise: predicted step with {self.workers} workers at {self.bandwidth_gbps:g} Gbit/s: "
            f"allreduce {self.allreduce_step_s * 1000:.1f} ms, PS ({self.ps_tasks} PS) {self.ps_step_s * 1000:.1f} ms"
            + calibrated,
            f"advise: -> {self.strategy}: {self.reason}",
        ])


def probe_step(model: tf.keras.Model, cfg, data_dir: str, steps: int = 20) -> tuple[float, dict]:
    """(seconds per local step, a real training batch)."""
    it = iter(make_dataset(cfg, data_dir, "train", cfg.train.batch_size, training=True))
    batch = next(it)
    train_step = tf.function(model.train_step, reduce_retracing=True)
    for _ in range(3):
        train_step(next(it))
    t0 = time.perf_counter()
    for _ in range(steps):
        out = train_step(next(it))
    float(out["loss"])  # wait for the last step
    return (time.perf_counter() - t0) / steps, batch


def advise(cfg, artifact, data_dir: str, workers: int = 8, ps_tasks: int = 2, bandwidth_gbps: float = 10.0,
           worker_memory_bytes: int | None = None, overheads: Overheads = Overheads()) -> Advice:
    model = build_model(cfg, artifact)
    model.compile(optimizer=optimizer_for(cfg))
    model(dummy_batch(cfg))
    step, batch = probe_step(model, cfg, data_dir)
    t = traffic(model, batch)
    row_bytes = t.row_bytes_unique if cfg.train.tuning.dedup_ids else t.row_bytes_occurrences
    if worker_memory_bytes is None:
        worker_memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    replica = (t.sparse_params + t.dense_params) * BYTES * 3  # weights + optimizer slots + gradients, roughly
    t_ar, t_ps = step_times(step, t.dense_bytes, row_bytes, workers, ps_tasks, bandwidth_gbps * 1e9 / 8, overheads)
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
    unique = t.rows_unique if cfg.train.tuning.dedup_ids else t.rows_occurrences
    return Advice(strategy, reason, t.sparse_params, t.dense_params, unique, row_bytes, step, workers, ps_tasks,
                  bandwidth_gbps, replica, int(worker_memory_bytes), t_ar, t_ps, asdict(overheads))
