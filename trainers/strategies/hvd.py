"""Horovod ring-allreduce training (Gloo on CPU): a custom loop on horovod.tensorflow.

Launchers (recpipe.trainers.strategies.hvd_job, without TensorFlow): `recpipe train --strategy horovod --np N` re-runs itself
under `horovodrun -np N --gloo` on this host (recpipe.trainers.strategies.hvd_launch); across hosts without ssh, every host
runs `recpipe train --strategy horovod --hosts H1[:S],H2[:S] --host-index I` (recpipe.trainers.strategies.hvd_hosts). Where
ssh exists, `horovodrun -H ... recpipe train --strategy horovod` works too. Each rank reads its own part of
the shards (InputContext), uses `batch_size` rows per step (the effective batch is N x batch_size, as in
Horovod's examples), and averages gradients with Horovod's collectives, in train.gradient_groups grouped
ones per step; initial state is broadcast from rank 0, and at the end every rank's weights are checked
equal. Sparse embedding gradients are allgathered as IndexedSlices or densified and allreduced
(train.sparse_gradients). Horovod's background thread cycles every train.horovod_cycle_time_ms
(HOROVOD_CYCLE_TIME, when set, wins). Only rank 0 writes checkpoints, TensorBoard events,
train_state.json and the progress events the launcher shows.
"""
from __future__ import annotations

import contextlib
import math
import os
import socket
from typing import Callable

import tensorflow as tf

from recpipe.features.artifact import TransformArtifact, summary_differences
from recpipe.common.code_identity import code_identity, identity_differences
from recpipe.features.config import Config, config_to_dict
from recpipe.features.preprocessed import PreprocessedData, shard_differences
from recpipe.trainers.advisor import allreduces_table
from recpipe.trainers.allocator import loaded_allocator
from recpipe.trainers.data import make_dataset, synthetic_dataset
from recpipe.trainers.errors import TrainError
from recpipe.trainers.gradients import accumulated_gradients
from recpipe.trainers.health import check_loss
from recpipe.trainers.model_dir import ModelDir, TrainState
from recpipe.trainers.models import compiled_model
from recpipe.trainers.optim import optimizer_for, precision_policy
from recpipe.trainers.options import TrainOptions
from recpipe.trainers.progress import EVENTS_ENV, Reporter
from recpipe.trainers.evaluation.validation import validator_for
from recpipe.trainers.warm_start import apply_warm_start

__all__ = ["run_rank", "horovod_cycle_time_ms"]


def _leaf_differences(a, b, path: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested config dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in _leaf_differences(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))]
    return [] if a == b else [path]


def _check_ranks_train_one_model(ranks: list[dict]) -> None:
    """Every rank (its host, code, --data, transform summary, shards, config and run) must train one model: a host
    holding another copy of the data (a stale one at the same path, another day's) numbers the values otherwise,
    and the averaged gradients would train each row on values that differ by rank; a partial copy of the shards
    (missing files, one cut short) reads rows twice or never (each host checks its own copy against the list
    the job wrote first, recpipe.trainers.data_copy.check_whole_copy; this also covers folders written before that list);
    another --config (a learning rate, a layer) or --steps would make the ranks step apart or wait on each
    other, without a word; and a host with another install (our packages, TensorFlow, Horovod) builds and
    steps the model with its own code."""
    first = ranks[0]
    where = lambda r, x: f"rank {r} (host {x['host']}, {x['data']})"  # noqa: E731
    for r, x in enumerate(ranks):
        code = identity_differences(first["code"], x["code"], "rank 0: ")
        if code:
            raise TrainError(f"{where(r, x)} runs other code than {where(0, first)}: {', '.join(code)}; each rank "
                             f"builds and steps the model with its own host's install, so install the same recpipe "
                             f"(and libraries) on every host")

    def differences(x: dict) -> list[str]:  # "transform": a mapping_summary, or "synthetic input"
        a, b = first["transform"], x["transform"]
        if isinstance(a, dict) and isinstance(b, dict):
            return summary_differences(a, b)
        return [] if a == b else ["the input (synthetic on one of them)"]
    other = [(r, x, d) for r, x in enumerate(ranks) if (d := differences(x))]
    if other:
        named = "; ".join(f"{where(r, x)}: {', '.join(d)} differ" for r, x, d in other[:4])
        raise TrainError(f"the ranks read data of different preprocess runs: {named}, against {where(0, first)}; an "
                         f"ID would stand for other values on different ranks. Give every host a whole copy of one "
                         f"run's output")
    other = [(r, x, d) for r, x in enumerate(ranks) if (d := shard_differences(first["shards"], x["shards"]))]
    if other:
        named = "; ".join(f"{where(r, x)}: {', '.join(d)}" for r, x, d in other[:4])
        raise TrainError(f"the ranks read other copies of the shards: {named}, against {where(0, first)}; each rank "
                         f"reads its share of the shards it lists, so rows would be read twice or never. Give every "
                         f"host a whole copy of one run's output (was a copy still going on?)")
    for r, x in enumerate(ranks):
        keys = _leaf_differences(first["config"], x["config"]) + [k for k in ("steps", "precision")
                                                                    if x[k] != first[k]]
        if keys:
            shown = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
            raise TrainError(f"{where(r, x)} trains with another config or run than {where(0, first)}: {shown} "
                             f"differ; every host must run the same --config, --steps and --precision")


def run_rank(cfg: Config, artifact: TransformArtifact, opts: TrainOptions, total: int,
             say: Callable[[str], None]) -> TrainState:
    """The training loop of one Horovod rank."""
    import horovod.tensorflow as hvd

    cycle_ms = horovod_cycle_time_ms(cfg)
    with _environment({CYCLE_TIME_ENV: f"{cycle_ms:g}"}):  # read once, by hvd.init()'s background thread
        hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model_dir = ModelDir(opts.model_dir)
    peers = [{"host": "", "model_dir": opts.model_dir}]
    if size > 1:
        peers = hvd.allgather_object({
            "host": os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname(),  # the host list's name for it
            "model_dir": os.path.abspath(opts.model_dir), "data": opts.data_dir, "config": config_to_dict(cfg),
            "steps": total, "precision": opts.run.precision,
            "transform": "synthetic input" if opts.synthetic_input else artifact.mapping_summary(),
            "shards": None if opts.synthetic_input else PreprocessedData(opts.data_dir).shard_sizes(),
            "code": code_identity(SAME_SOURCE, SAME_VERSIONS)})
        _check_ranks_train_one_model(peers)

    def rank0_says_stop(flag: bool) -> bool:  # every rank must leave the loop at the same step
        return bool(hvd.broadcast(tf.constant(int(flag)), root_rank=0, name="early_stop").numpy())

    with precision_policy(opts.run.precision):
        tf.keras.utils.set_random_seed(cfg.train.seed)
        model = compiled_model(cfg, artifact, optimizer_for(cfg, opts.run.precision, loss_scale=True))
        optimizer = model.optimizer  # compiled as the local and PS strategies are: the same checkpoint layout
        ckpt, manager = model_dir.checkpoint(model, optimizer)
        # every rank restores the same files (rank 0's step wins below; broadcast keeps the weights identical)
        resumed = model_dir.resume(ckpt, say if rank == 0 else (lambda _: None))
        start = int(optimizer.iterations.numpy())
        if size > 1:  # rank 0's: a host whose own model dir holds no (or an older) checkpoint would loop more
            # steps and wait on collectives no other rank makes; its weights come from rank 0's broadcast below
            start = int(hvd.broadcast(tf.constant(start, tf.int64), root_rank=0, name="start_step").numpy())
        events = os.environ.get(EVENTS_ENV) if rank == 0 else None
        reporter = Reporter(say if rank == 0 else (lambda _: None), total, start, cfg.train.batch_size * size,
                            ranks=size, events_path=events)
        validator = (validator_for(cfg, artifact, opts.data_dir, model_dir, reporter.note)
                     if rank == 0 and not opts.synthetic_input else None)
        if start:
            reporter.note(f"train: resuming from {resumed} at step {start}")
        elif opts.warm_start:
            apply_warm_start(model, cfg, artifact, opts.warm_start, reporter.note)
        stopped = rank0_says_stop(validator is not None and validator.stopped)
        if start >= total or stopped:
            why = f"stopped early at step {start}" if start < total else f"trained {start} >= {total} steps"
            reporter.note(f"train: already {why}; nothing to do")
            reporter.close()
            return TrainState.unchanged(start, "horovod", opts.run.precision, cfg.train.batch_size, opts.data_dir)
        step = _step_function(cfg, model, optimizer)
        ctx = tf.distribute.InputContext(num_input_pipelines=size, input_pipeline_id=rank)
        seed = cfg.train.seed + start + rank
        if opts.synthetic_input:  # benchmarks: each rank's own random batch from memory, no shard parsing
            sizes = {f.name: artifact.id_space_size(f) for f in cfg.features.sparse}
            it = iter(synthetic_dataset(cfg, sizes, cfg.train.batch_size, seed))
        else:
            it = iter(make_dataset(cfg, opts.data_dir, "train", cfg.train.batch_size, training=True,
                                   input_context=ctx, seed=seed))
        writer = tf.summary.create_file_writer(os.path.join(model_dir.logs_dir, "train")) if rank == 0 else None
        every = min(cfg.train.checkpoint_every, total - start)
        auc = next((m for m in model.metrics if m.name == "auc"), None)
        loss = math.nan
        for i in range(start, total):
            loss_t = step(it)
            if i == start:
                hvd.broadcast_variables(model.variables, root_rank=0)
                hvd.broadcast_variables(optimizer.variables(), root_rank=0)
            done = i + 1
            if done % every == 0 or done == total:
                loss = float(hvd.allreduce(loss_t, op=hvd.Average).numpy())
                reporter.interval_end(done)
                check_loss(loss, done, cfg, opts.data_dir)  # every rank sees the same loss: all stop
                if rank == 0:
                    manager.save(checkpoint_number=done)
                    auc_v = float(auc.result().numpy()) if auc is not None else None
                    with writer.as_default():
                        tf.summary.scalar("loss", loss, step=done)
                        if auc_v is not None:
                            tf.summary.scalar("auc", auc_v, step=done)
                    reporter.interval(done, loss, auc_v)
                    stop = validator is not None and validator(done, manager.latest_checkpoint)
                else:
                    stop = False
                    if reporter.first is None:
                        reporter.first = reporter.last
                if rank0_says_stop(stop):
                    total = done
                    break
        reporter.close()
        _check_ranks_agree(model, hvd)  # after rank 0's last save
        if rank != 0 and hvd.local_rank() == 0 and model_dir.latest_step() < total:  # a model dir of this host's own
            model_dir.note_kept_elsewhere(peers[0]["host"], peers[0]["model_dir"], total)
        overall, steady = reporter.rates(total)
        state = TrainState(total, total - start, start, overall, steady, loss, "horovod", opts.run.precision,
                           cfg.train.batch_size, ranks=size, sparse_gradients=cfg.train.sparse_gradients,
                           gradient_groups=cfg.train.gradient_groups, cycle_time_ms=cycle_ms,
                           data_dir=PreprocessedData(opts.data_dir).root,
                           best_step=validator.history.best_step if validator is not None else None,
                           allocator=loaded_allocator())
        if rank == 0:
            model_dir.write_state(state)
        return state


SAME_SOURCE = ("recpipe.common", "recpipe.features", "recpipe.trainers")  # what a rank builds, reads and steps the model with: the same on every host
SAME_VERSIONS = ("tensorflow", "tf-keras", "tensorflow-recommenders", "horovod", "numpy")
CYCLE_TIME_ENV = "HOROVOD_CYCLE_TIME"


def horovod_cycle_time_ms(cfg: Config) -> float:
    """The cycle time of Horovod's background thread for this run: HOROVOD_CYCLE_TIME when the
    environment sets it (horovodrun --cycle-time-ms does), else train.horovod_cycle_time_ms."""
    given = os.environ.get(CYCLE_TIME_ENV)
    if given is None:
        return cfg.train.horovod_cycle_time_ms
    try:
        value = float(given)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise TrainError(f"{CYCLE_TIME_ENV}={given!r}: expected milliseconds >= 0 (or unset it: "
                         f"train.horovod_cycle_time_ms is {cfg.train.horovod_cycle_time_ms:g})")
    return value


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """os.environ with `values` set, as it was afterwards (a rank run in the launcher's own process,
    --np 1, must not leave its settings to the next run there)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _check_ranks_agree(model: tf.keras.Model, hvd) -> None:
    """Every rank must end with the same weights (a missed or mis-grouped exchange lets them drift
    apart without any error): the ranks' sums of squared trainable weights (per variable in its own
    dtype, so no table is copied, then added in float64) are allgathered and must agree."""
    total = tf.add_n([tf.cast(tf.reduce_sum(tf.square(v)), tf.float64) for v in model.trainable_variables])
    sums = hvd.allgather(tf.reshape(total, [1]), name="weights_checksum").numpy()
    if sums.max() - sums.min() > 1e-6 * max(1.0, float(sums.max())):
        raise TrainError(f"Horovod ranks ended with different weights (sums of squared trainable weights per rank: "
                         f"{', '.join(f'{x:.9g}' for x in sums)}); the gradient exchange did not keep them in sync")


def _exchange_dense(mode: str, shape: tf.TensorShape, ranks: int, batch_rows: int) -> bool:
    """Whether a variable's IndexedSlices gradient is densified and allreduced rather than allgathered:
    the advisor's rule (recpipe.trainers.advisor.allreduces_table), so `recpipe advise` predicts the exchange
    this runs."""
    if shape.rank != 2:
        return mode == "dense"
    return allreduces_table(int(shape[0]), int(shape[1]), ranks, batch_rows, mode)


def _step_function(cfg: Config, model: tf.keras.Model, optimizer) -> Callable:
    """One synchronous step on an iterator's next batch: local gradients (accumulated over micro-batches
    if configured), one exchange (allreduce; IndexedSlices allgathered or densified per
    train.sparse_gradients), apply."""
    import horovod.tensorflow as hvd

    as_dense = [_exchange_dense(cfg.train.sparse_gradients, v.shape, hvd.size(), cfg.train.batch_size)
                for v in model.trainable_variables]  # batch_size: rows per rank
    scaled = isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
    accum = cfg.train.tuning.grad_accum_steps
    groups = cfg.train.gradient_groups or None  # None: one collective per tensor

    def reduce(grads: list) -> list:
        """Average over the ranks (IndexedSlices are allgathered), one collective per tensor or, per
        kind (dense tensors, IndexedSlices), `groups` grouped ones. The kinds are grouped apart:
        Horovod 0.28.1's grouped_allreduce mis-pairs the IndexedSlices of a mixed list with the list's
        first tensors (AttributeError: no dense_shape) unless every IndexedSlices comes first."""
        if hvd.size() == 1:  # nothing to average: a collective would only wait for the background thread's cycle
            return grads
        grads = [tf.convert_to_tensor(g) if dense and isinstance(g, tf.IndexedSlices) else g
                 for g, dense in zip(grads, as_dense)]
        if groups is None:
            return [None if g is None else hvd.allreduce(g, op=hvd.Average) for g in grads]
        out = list(grads)
        for sparse in (False, True):
            kind = [i for i, g in enumerate(grads) if g is not None and isinstance(g, tf.IndexedSlices) == sparse]
            for part in (kind[k::groups] for k in range(min(groups, len(kind)))):
                for i, g in zip(part, hvd.grouped_allreduce([grads[i] for i in part], op=hvd.Average)):
                    out[i] = g
        return out

    @tf.function(reduce_retracing=True, autograph=model.autograph)
    def step(iterator):
        batch = next(iterator)  # inside the function, as Keras' fit does: the batch's tensors never reach Python
        if accum > 1:  # accumulate locally over the micro-batches, then ONE exchange per step
            grads, loss = accumulated_gradients(model, batch, accum, optimizer if scaled else None)
            grads = reduce(grads)
        else:
            with tf.GradientTape() as tape:
                loss = model.compute_loss(batch, training=True)
                target = optimizer.get_scaled_loss(loss) if scaled else loss
            grads = reduce(tape.gradient(target, model.trainable_variables))
            if scaled:
                grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return step
