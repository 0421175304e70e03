"""Horovod ring-allreduce training (Gloo on CPU): a custom loop on horovod.tensorflow.

`recpipe train --strategy horovod --np N` re-runs itself under `horovodrun -np N --gloo` on this
host (or run `horovodrun ... recpipe train --strategy horovod` yourself for other hosts). Each rank
reads its own part of the shards (InputContext), uses `batch_size` rows per step (the effective
batch is N x batch_size, as in Horovod's examples), and averages gradients with
DistributedGradientTape; initial state is broadcast from rank 0. Sparse embedding gradients are
allgathered as IndexedSlices or densified and allreduced (train.sparse_gradients). Only rank 0
writes checkpoints, TensorBoard events and train_state.json.
"""
from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import importlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Callable  # noqa: E402

import tensorflow as tf  # noqa: E402

from trainers.progress import ProgressBar  # noqa: E402

__all__ = ["inside_horovod_job", "launch", "run_rank"]


def inside_horovod_job() -> bool:
    return "HOROVOD_RANK" in os.environ


def _horovodrun() -> str:
    found = shutil.which("horovodrun", path=os.path.dirname(sys.executable)) or shutil.which("horovodrun")
    try:
        importlib.import_module("horovod.tensorflow")  # built for this TensorFlow?
    except ImportError:
        found = None
    if not found:
        raise RuntimeError("--strategy horovod needs Horovod built for this TensorFlow: run `make horovod` "
                           "(builds 0.28.1 from source, about 10 minutes once, then cached)")
    return found


def launch(opts, say: Callable[[str], None]) -> None:
    """Run `recpipe train --strategy horovod` as opts.np ranks on this host; raise if any rank fails."""
    cmd = [_horovodrun(), "-np", str(opts.np), "-H", f"localhost:{opts.np}", "--gloo",
           sys.executable, "-m", "recpipe.cli", "train", "--strategy", "horovod",
           "--data", opts.data_dir, "--model-dir", opts.model_dir, "--precision", opts.precision,
           "--config", os.path.join(opts.model_dir, "config.yaml")]  # what the launcher resolved
    if opts.steps is not None:
        cmd += ["--steps", str(opts.steps)]
    if opts.threads:
        cmd += ["--threads", str(opts.threads)]
    if opts.warm_start:
        cmd += ["--warm-start", opts.warm_start]
    say(f"train: horovodrun -np {opts.np} --gloo on localhost")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3"))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    tail: list[str] = []
    bar = None
    assert proc.stdout is not None
    for line in proc.stdout:
        # horovodrun prefixes rank output with "[rank]<stdout>:"; show rank 0's progress lines.
        text = line.split(">:", 1)[-1].rstrip("\n")
        tail = (tail + [text])[-20:]
        progress = text.startswith(("train: step ", "train: resuming", "train: warm start"))
        if progress and ("[0]" in line.split(">:", 1)[0] or ">:" not in line):
            if bar is not None:
                bar.clear()
            say(text)
            step = re.match(r"train: step (\d+)/(\d+) loss (\S+)", text)
            if step:  # the terminal bar moves with rank 0's checkpoint lines
                bar = bar or ProgressBar(int(step[2]), 0, 0)
                bar.update(int(step[1]), float(step[3]), force=True)
    if bar is not None:
        bar.close()
    if proc.wait() != 0:
        raise RuntimeError(f"horovodrun exited with {proc.returncode}: " + " | ".join(t for t in tail if t)[-800:])


def run_rank(cfg, artifact, opts, total: int, say: Callable[[str], None]) -> dict:
    """The training loop of one Horovod rank."""
    import horovod.tensorflow as hvd

    from trainers.data import make_dataset
    from trainers.models import accumulated_gradients, build_model, dummy_batch
    from trainers.train import PRECISION_POLICIES, optimizer_for, steady_rate

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tf.keras.mixed_precision.set_global_policy(PRECISION_POLICIES[opts.precision])
    tf.keras.utils.set_random_seed(cfg.train.seed)
    model = build_model(cfg, artifact)
    optimizer = optimizer_for(cfg)
    if opts.precision == "fp16":
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    model.compile(optimizer=optimizer)  # same checkpoint layout as the local and PS strategies
    model(dummy_batch(cfg))
    optimizer.build(model.trainable_variables)
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(ckpt, os.path.join(opts.model_dir, "checkpoints"), max_to_keep=3)
    if manager.latest_checkpoint:  # every rank restores the same files; broadcast keeps them identical
        ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    elif opts.warm_start:
        from trainers.train import apply_warm_start
        apply_warm_start(model, cfg, artifact, opts.warm_start, say if rank == 0 else (lambda _: None))
    start = int(optimizer.iterations.numpy())
    if rank == 0 and start:
        say(f"train: resuming from {manager.latest_checkpoint} at step {start}")
    if start >= total:
        return {"steps_done": start, "steps_this_run": 0}
    sparse_as_dense = cfg.train.sparse_gradients == "dense"
    ctx = tf.distribute.InputContext(num_input_pipelines=size, input_pipeline_id=rank)
    it = iter(make_dataset(cfg, opts.data_dir, "train", cfg.train.batch_size, training=True,
                           input_context=ctx, seed=cfg.train.seed + start + rank))
    scaled = isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)

    accum = cfg.train.tuning.grad_accum_steps

    def reduce(g):
        if sparse_as_dense and isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        return hvd.allreduce(g, op=hvd.Average)  # IndexedSlices: allgathered

    @tf.function(reduce_retracing=True)
    def step(batch):
        if accum > 1:  # accumulate locally over the micro-batches, then ONE exchange per step
            grads, loss = accumulated_gradients(model, batch, accum, optimizer if scaled else None)
            grads = [None if g is None else reduce(g) for g in grads]
        else:
            with tf.GradientTape() as tape:
                loss = model.compute_loss(batch, training=True)
                target = optimizer.get_scaled_loss(loss) if scaled else loss
            tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
            grads = tape.gradient(target, model.trainable_variables)
            if scaled:
                grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    writer = tf.summary.create_file_writer(os.path.join(opts.model_dir, "logs", "train")) if rank == 0 else None
    every = min(cfg.train.checkpoint_every, total - start)
    auc = next((m for m in model.metrics if m.name == "auc"), None)
    t0 = time.perf_counter()
    loss = float("nan")
    first_interval = last_interval = None
    for i in range(start, total):
        loss_t = step(next(it))
        if i == start:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(optimizer.variables(), root_rank=0)
        done = i + 1
        if done % every == 0 or done == total:
            loss = float(hvd.allreduce(loss_t, op=hvd.Average).numpy())
            last_interval = (done, time.perf_counter())
            if rank == 0:
                manager.save(checkpoint_number=done)
                rate = (done - start) * cfg.train.batch_size * size / max(time.perf_counter() - t0, 1e-9)
                auc_v = float(auc.result().numpy()) if auc is not None else None
                auc_s = f" auc {auc_v:.4f}" if auc_v is not None else ""
                say(f"train: step {done}/{total} loss {loss:.4f}{auc_s} ({rate:,.0f} ex/s, {size} ranks)")
                with writer.as_default():
                    tf.summary.scalar("loss", loss, step=done)
                    if auc_v is not None:
                        tf.summary.scalar("auc", auc_v, step=done)
            first_interval = first_interval or (done, time.perf_counter())
    elapsed = time.perf_counter() - t0
    state = {"steps_done": total, "steps_this_run": total - start, "resumed_from": start,
             "examples_per_sec_last_run": (total - start) * cfg.train.batch_size * size / max(elapsed, 1e-9),
             "final_loss": loss, "ranks": size, "sparse_gradients": cfg.train.sparse_gradients}
    state["examples_per_sec_steady"] = steady_rate(first_interval, last_interval, cfg.train.batch_size * size,
                                                   state["examples_per_sec_last_run"])
    if rank == 0:
        with open(os.path.join(opts.model_dir, "train_state.json"), "w") as fh:
            json.dump({**state, "precision": opts.precision, "strategy": "horovod",
                       "batch_size": cfg.train.batch_size, "data_dir": os.path.abspath(opts.data_dir)}, fh, indent=1)
    return state
