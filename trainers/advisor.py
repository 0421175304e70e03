"""Strategy advisor: PS or ring-allreduce for this model, from its parameter sizes and a short probe.

Inputs: dense and sparse (embedding) parameter counts of the model built on the artifact; the measured
time of a local training step; the embedding rows a batch touches, counted per table as the ID dedup
sends them (unique IDs, float32 rows + int64 IDs). Per-step time of one worker, for N workers, M PS
tasks and a link bandwidth B (full duplex: what a host sends and receives travel at once):
  allreduce: compute + [2(N-1)/N x ring-allreduced bytes + (N-1) x allgathered bytes] / B + overhead,
             as train.sparse_gradients exchanges them: the dense gradients, and each embedding table
             either whole (densified, ring-allreduced) or as its touched rows + IDs (allgathered);
             `auto` picks per table by allreduces_table(), the rule the Horovod trainer itself runs
  PS:        compute + max(worker link: dense + row bytes, PS link: N/M x that) / B + overhead, where each
             direction carries one of pull (weights, looked-up rows) and push (their gradients).
`overhead` is per-step time that is neither compute nor bytes over bandwidth: the CPU communication
takes (serialisation, copies, Gloo/gRPC threads) and the round trips. It is 0 unless measured:
`recpipe bench cluster` measures it across hosts on an unshaped link and `recpipe advise
--calibration bench/results/cluster.json` uses it. A full replica (weights + optimizer slots) must fit
one worker for allreduce; if it does not, PS is the only choice. Otherwise the lower step time wins.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields

import numpy as np
import tensorflow as tf

from recpipe.common import fsio
from recpipe.trainers.data import make_dataset
from recpipe.trainers.layers import ids_by_table
from recpipe.trainers.models import compiled_model
from recpipe.trainers.optim import optimizer_for

__all__ = ["Advice", "Overheads", "TableTraffic", "Traffic", "advise", "allreduces_table", "link_bytes", "predict",
           "step_times", "traffic"]

BYTES = 4     # float32 parameters and gradients
ID_BYTES = 8  # int64 row IDs travelling with sparse gradients


@dataclass(frozen=True)
class Overheads:
    """Per-step seconds beyond compute and bytes/bandwidth, measured across hosts (0: unknown)."""
    allreduce_s: float = 0.0
    ps_s: float = 0.0

    @classmethod
    def from_calibration(cls, path: str) -> "Overheads":
        """The overheads a `recpipe bench cluster` result (bench/results/cluster.json) measured. Each must be
        a finite number of seconds >= 0: a null one (the bench measured no finite value) is an error naming
        it, not a prediction built on it."""
        try:
            found = fsio.read_json(path)["calibration"]["overheads"]
            values = {f.name: found[f.name] for f in fields(cls)}
        except (KeyError, TypeError):
            raise ValueError(f"{path}: no calibration.overheads.allreduce_s and .ps_s: not a `recpipe bench cluster` "
                             f"result (bench/results/cluster.json)") from None
        for name, v in values.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{path}: calibration.overheads.{name} is {json.dumps(v)}, not a finite number of "
                                 f"seconds >= 0 (null: the bench measured no finite value); rerun "
                                 f"`recpipe bench cluster`")
        return cls(**{k: float(v) for k, v in values.items()})


def allreduces_table(rows: int, dim: int, workers: int, batch_rows: int, sparse_gradients: str = "auto") -> bool:
    """Whether Horovod densifies one embedding table's gradient and ring-allreduces it rather than
    allgathering its rows, under `train.sparse_gradients`: dense / allgather: every table alike; auto:
    when that puts no more bytes on a rank's link than allgathering its rows can: 2(N-1)/N x rows x
    dim x 4 against (N-1) x u x (dim x 4 + 8), u <= min(rows, batch_rows) distinct rows per rank, each
    with its int64 ID. Compared divided by N-1, so it decides at N = 1 too. Static shapes only: every
    rank decides alike. Small tables go dense, large ones stay sparse."""
    if sparse_gradients != "auto":
        return sparse_gradients == "dense"
    return 2 / max(workers, 1) * rows * dim * BYTES <= min(rows, batch_rows) * (dim * BYTES + ID_BYTES)


@dataclass(frozen=True)
class TableTraffic:
    """One embedding table and the rows a batch touches in it."""
    rows: int
    dim: int
    unique: int        # distinct rows (what ID dedup sends)
    occurrences: int   # every looked-up row

    def row_bytes(self, dedup: bool = True) -> float:
        """The touched rows as a sparse gradient: float32 rows + int64 IDs."""
        return (self.unique if dedup else self.occurrences) * (self.dim * BYTES + ID_BYTES)


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
    tables: tuple[TableTraffic, ...] = ()

    @property
    def dense_bytes(self) -> float:
        return self.dense_params * BYTES

    def row_bytes(self, dedup: bool = True) -> float:
        return self.row_bytes_unique if dedup else self.row_bytes_occurrences

    def dense_tables(self, workers: int, sparse_gradients: str = "auto") -> list[bool]:
        """Per table, whether Horovod at `workers` ranks densifies and allreduces its gradient."""
        return [allreduces_table(t.rows, t.dim, workers, self.batch_size, sparse_gradients) for t in self.tables]

    def horovod_bytes(self, workers: int, sparse_gradients: str = "auto", dedup: bool = True) -> tuple[float, float]:
        """(ring-allreduced, allgathered) bytes of one rank's step: the dense gradients and the
        densified tables whole; the other tables' touched rows with their IDs."""
        reduced, gathered = self.dense_bytes, 0.0
        for t, dense in zip(self.tables, self.dense_tables(workers, sparse_gradients)):
            if dense:
                reduced += t.rows * t.dim * BYTES
            else:
                gathered += t.row_bytes(dedup)
        return reduced, gathered


def traffic(model: tf.keras.Model, batch: dict) -> Traffic:
    tables, features = model.embeddings.table_specs, model.embeddings.feature_specs
    sparse = sum(t["rows"] * t["dim"] for t in tables.values())
    total = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    ids = {table: np.concatenate([flat.numpy() for _, flat in named])
           for table, named in ids_by_table(features, batch).items()}
    per_table = tuple(TableTraffic(t["rows"], t["dim"], len(np.unique(ids[name])) if name in ids else 0,
                                   len(ids.get(name, ()))) for name, t in tables.items())
    return Traffic(total - sparse, sparse, int(next(iter(batch.values())).shape[0]),
                   sum(t.unique for t in per_table), sum(t.occurrences for t in per_table),
                   sum(t.row_bytes(True) for t in per_table), sum(t.row_bytes(False) for t in per_table), per_table)


def link_bytes(t: Traffic, workers: int, ps_tasks: int, sparse_gradients: str = "auto",
               dedup: bool = True) -> tuple[float, float]:
    """(allreduce, PS) bytes one step puts on the busiest link in one direction."""
    n = max(workers, 1)
    reduced, gathered = t.horovod_bytes(n, sparse_gradients, dedup)
    allreduce = 2 * (n - 1) / n * reduced + (n - 1) * gathered
    per_worker = t.dense_bytes + t.row_bytes(dedup)  # pulled one way, pushed the other
    return allreduce, max(per_worker, n * per_worker / max(ps_tasks, 1))


def step_times(step_s: float, t: Traffic, workers: int, ps_tasks: int, bandwidth_bytes_per_s: float,
               overheads: Overheads = Overheads(), sparse_gradients: str = "auto",
               dedup: bool = True) -> tuple[float, float]:
    """(allreduce step seconds, PS step seconds) for one worker exchanging `t`."""
    allreduce, ps = link_bytes(t, workers, ps_tasks, sparse_gradients, dedup)
    distributed = workers > 1
    return (step_s + (overheads.allreduce_s if distributed else 0.0) + allreduce / bandwidth_bytes_per_s,
            step_s + overheads.ps_s + ps / bandwidth_bytes_per_s)


def predict(sparse: int, dense: int, unique_rows: int, dim: int, step_s: float, workers: int, ps_tasks: int,
            bandwidth_gbps: float, overheads: Overheads = Overheads(), batch_size: int = 1024,
            sparse_gradients: str = "auto") -> tuple[float, float]:
    """(allreduce step seconds, PS step seconds) for one worker of a model with one embedding table."""
    table = TableTraffic(sparse // dim, dim, unique_rows, unique_rows)
    t = Traffic(dense, sparse, batch_size, unique_rows, unique_rows, table.row_bytes(), table.row_bytes(), (table,))
    return step_times(step_s, t, workers, ps_tasks, bandwidth_gbps * 1e9 / 8, overheads, sparse_gradients)


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
    sparse_gradients: str      # train.sparse_gradients, how Horovod exchanges the embedding gradients
    dense_tables: int          # of `tables`, those Horovod at `workers` ranks allreduces whole
    tables: int

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
            f"advise: Horovod (sparse_gradients {self.sparse_gradients}) allreduces {self.dense_tables} of "
            f"{self.tables} embedding tables whole at {self.workers} workers and allgathers the others' rows",
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
    model = compiled_model(cfg, artifact, optimizer_for(cfg, own_step=True))
    step, batch = probe_step(model, cfg, data_dir)
    t = traffic(model, batch)
    dedup, mode = cfg.train.tuning.dedup_ids, cfg.train.sparse_gradients
    row_bytes = t.row_bytes(dedup)
    if worker_memory_bytes is None:
        worker_memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    replica = (t.sparse_params + t.dense_params) * BYTES * 3  # weights + optimizer slots + gradients, roughly
    t_ar, t_ps = step_times(step, t, workers, ps_tasks, bandwidth_gbps * 1e9 / 8, overheads, mode, dedup)
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
    unique = t.rows_unique if dedup else t.rows_occurrences
    return Advice(strategy, reason, t.sparse_params, t.dense_params, unique, row_bytes, step, workers, ps_tasks,
                  bandwidth_gbps, replica, int(worker_memory_bytes), t_ar, t_ps, asdict(overheads), mode,
                  sum(t.dense_tables(workers, mode)), len(t.tables))
