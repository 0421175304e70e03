"""Where one training step of recpipe's DLRM goes, part by part, on fixed in-memory batches: the parts
TorchRec's script times the same way (recpipe/bench/peers/torchrec_dlrm.py), each alone, compiled:
  - input: batches of the real input pipeline (shards, parsing, shuffling) per step, read on their own;
  - lookup_forward: the embedding lookups (with ID dedup) of a batch, no gradient;
  - interaction: the pairwise dot products, forward and backward, on fixed embeddings;
  - mlp: the bottom MLP and the top MLP with its logit, forward and backward, on fixed inputs;
  - dense_optimizer: Adagrad's update of the dense weights from fixed gradients;
  - sparse_optimizer: Adagrad's update of the tables' rows from a fixed step's sparse gradients (reported
    apart; it is inside the rest);
  - step: the compiled train step (no input); what it has beyond the parts above is the rest: the lookups'
    backward, the tables' Adagrad and the loss.
Every part is built and warmed up first, then timed round-robin (`rounds` rounds of `steps` calls). The parts
alone run without the rest of the step beside them; inside the step they share the two threads. So the step is
also profiled (`steps` calls under TensorFlow's profiler, recpipe.bench.op_profile): its kernels' time per step,
summed over threads, by group (dlrm_group; recpipe.bench.embedding.STEP_GROUPS says what each holds).

    python -m recpipe.bench.embedding_parts DATA CONFIG [STEPS] [ROUNDS]   -> one JSON line on stdout
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Callable

import tensorflow as tf

from recpipe.bench.op_profile import grouped, profile_kernels
from recpipe.features.config import Config, load_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.trainers.data import make_dataset
from recpipe.trainers.layers import pairwise_dots
from recpipe.trainers.models import compiled_model
from recpipe.trainers.optim import optimizer_for

__all__ = ["dlrm_group", "embedding_parts"]


def dlrm_group(embeddings: str, interaction: str, bottom: set[str], dense: set[str], optimizer: str
               ) -> Callable[[list[str], str, bool], str]:
    """The group of a kernel of recpipe's DLRM train step (a key of recpipe.bench.embedding.STEP_GROUPS), from the
    model's layer names.

    Args:
        embeddings: the SparseEmbeddings layer's name.
        interaction: the DotInteractionBlock's name.
        bottom: its bottom MLP layers' names.
        dense: the top MLP's and the logit's layer names.
        optimizer: the optimizer's name (its update ops' scope).

    Returns:
        (scope components, op type, backward) -> group (recpipe.bench.op_profile.grouped's argument).
    """
    def group(scope: list[str], kind: str, backward: bool) -> str:
        top = scope[0] if scope else ""
        if top == optimizer:
            return "dense_adagrad" if kind.startswith("ResourceApply") else "tables_adagrad"
        if top == embeddings:
            return "lookup_backward" if backward else "lookup_forward"
        if top == interaction:
            if len(scope) > 1 and scope[1] in bottom:
                return "mlps"
            return "interaction_products" if "BatchMatMul" in kind else "interaction_layout"
        return "mlps" if top in dense else "loss_metrics_other"
    return group


def _timed(fn: Callable[[int], object], steps: int) -> float:
    t0 = time.perf_counter()
    out = None
    for i in range(steps):
        out = fn(i)
    if isinstance(out, dict):
        float(tf.reduce_sum(next(iter(out.values()))))
    elif out is not None:
        float(tf.reduce_sum(out))
    return 1000 * (time.perf_counter() - t0) / steps


def _functions(cfg: Config, data_dir: str) -> tuple[dict[str, Callable[[int], object]], dict[str, object],
                                                    Callable[[list[str], str, bool], str]]:
    """(each part's call for step i, each part's tf.function, the step's kernel grouping): a tf.function takes
    tensors or nothing, never the step's Python int, which would trace it once per value (and time the tracing)."""
    model = compiled_model(cfg, PreprocessedData(data_dir).transform(), optimizer_for(cfg, own_step=True))
    it = iter(make_dataset(cfg, data_dir, "train", cfg.train.batch_size, training=False))
    batches = [next(it) for _ in range(4)]
    block, opt = model.interaction, model.optimizer
    tables = {v.ref() for v in model.embeddings.trainable_variables}
    dense_vars = [v for v in model.trainable_variables if v.ref() not in tables]
    table_vars = [v for v in model.trainable_variables if v.ref() in tables]
    by_name = model.embeddings(batches[0])
    embedded = [tf.Variable(by_name[f["name"]]) for f in model.embeddings.feature_specs]
    dense_in = model._dense(batches[0])
    bottom = dense_in
    for layer in block.bottom:
        bottom = layer(bottom)
    bottom_v = tf.Variable(bottom)
    top_in = tf.Variable(block(list(embedded), dense_in))

    @tf.function
    def interaction():
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(pairwise_dots([bottom_v, *embedded]))
        return tf.add_n([tf.reduce_sum(g) for g in tape.gradient(y, [bottom_v, *embedded])])

    mlp_vars = [w for layer in [*block.bottom, *model.deep, model.logit] for w in layer.trainable_weights]

    @tf.function
    def mlp():
        with tf.GradientTape() as tape:
            x = dense_in
            for layer in block.bottom:
                x = layer(x)
            y = top_in
            for layer in model.deep:
                y = layer(y)
            y = tf.reduce_sum(model.logit(y)) + tf.reduce_sum(x)
        return tf.add_n([tf.reduce_sum(g) for g in tape.gradient(y, [top_in, *mlp_vars])])

    with tf.GradientTape() as tape:  # one real step's gradients, held fixed for the optimizer parts
        loss = model.compute_loss(batches[0], training=True)
    grads = tape.gradient(loss, model.trainable_variables)
    by_ref = {v.ref(): g for v, g in zip(model.trainable_variables, grads)}
    dense_grads = [by_ref[v.ref()] for v in dense_vars]
    table_grads = [by_ref[v.ref()] for v in table_vars]
    lookup = tf.function(lambda b: tf.add_n([tf.reduce_sum(v) for v in model.embeddings(b).values()]))
    train_step = tf.function(model.train_step)
    dense_optimizer = tf.function(lambda: opt.apply_gradients(zip(dense_grads, dense_vars)))
    sparse_optimizer = tf.function(lambda: opt.apply_gradients(zip(table_grads, table_vars)))
    pipeline = iter(make_dataset(cfg, data_dir, "train", cfg.train.batch_size, training=True,
                                 seed=cfg.train.seed))
    traced = {"lookup_forward": lookup, "interaction": interaction, "mlp": mlp, "dense_optimizer": dense_optimizer,
              "sparse_optimizer": sparse_optimizer, "step": train_step}
    return {"input": lambda i: next(pipeline)[f"{cfg.features.sparse[0].name}"],
            "lookup_forward": lambda i: lookup(batches[i % 4]),
            "interaction": lambda i: interaction(), "mlp": lambda i: mlp(),
            "dense_optimizer": lambda i: dense_optimizer(), "sparse_optimizer": lambda i: sparse_optimizer(),
            "step": lambda i: train_step(batches[i % 4])}, traced, dlrm_group(
                model.embeddings.name, block.name, {layer.name for layer in block.bottom},
                {layer.name for layer in [*model.deep, model.logit]}, opt.name)


def embedding_parts(data_dir: str, cfg: Config, steps: int = 30, rounds: int = 3) -> dict:
    """ms per step of each part (median over the rounds) and the rest of the step beyond them.

    Args:
        data_dir: a `recpipe preprocess` output folder of a dlrm config.
        cfg: its config.
        steps: calls per part per round.
        rounds: round-robin rounds.

    Returns:
        {"parts_ms": {part: ms}, "rounds_ms": {part: [ms per round]}, "traces": {part: times its function was
        traced}, "step_kernel_ms": {dlrm_group's group: the step's kernels' ms per step}, "steps", "rounds",
        "batch_size"}.

    Raises:
        ValueError: not a dlrm config.
        RuntimeError: a part's function was traced again while timed (its time would include tracing).
    """
    if cfg.model.type != "dlrm":
        raise ValueError("embedding_parts: a dlrm config")
    t = cfg.train.tuning
    if t.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(t.intra_op_threads)
    if t.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(t.inter_op_threads)
    tf.keras.utils.set_random_seed(cfg.train.seed)
    fns, traced, group = _functions(cfg, data_dir)
    for fn in fns.values():  # trace and warm up
        for i in range(4):
            fn(i)
    warm = {name: f.experimental_get_tracing_count() for name, f in traced.items()}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(_timed(fn, steps))
    traces = {name: f.experimental_get_tracing_count() for name, f in traced.items()}
    retraced = sorted(name for name in traced if traces[name] != warm[name])
    if retraced:
        raise RuntimeError(f"embedding_parts: {', '.join(retraced)} traced again while timed: {traces}")
    ms = {name: statistics.median(v) for name, v in times.items()}
    ms["lookup_backward_sparse_update_loss"] = ms["step"] - sum(
        ms[k] for k in ("lookup_forward", "interaction", "mlp", "dense_optimizer"))
    step_cpu = grouped(profile_kernels(fns["step"], steps), group)
    return {"parts_ms": ms, "rounds_ms": times, "traces": traces, "step_kernel_ms": step_cpu, "steps": steps,
            "rounds": rounds, "batch_size": cfg.train.batch_size}


def main(argv: list[str]) -> None:
    """`python -m recpipe.bench.embedding_parts DATA CONFIG [STEPS] [ROUNDS]`: one JSON line on stdout.

    Args:
        argv: DATA CONFIG [STEPS] [ROUNDS].
    """
    steps, rounds = (int(argv[2]) if len(argv) > 2 else 30), (int(argv[3]) if len(argv) > 3 else 3)
    print(json.dumps(embedding_parts(argv[0], load_config(argv[1]), steps, rounds)))


if __name__ == "__main__":
    main(sys.argv[1:])
