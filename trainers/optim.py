"""Optimizer and precision set-up shared by every training loop (Keras fit and Horovod's)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import tensorflow as tf

from recpipe.features.config import Config
from recpipe.trainers import row_reads

__all__ = ["PRECISION_POLICIES", "optimizer_for", "precision_policy", "sparse_grads_are_unique"]

PRECISION_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def optimizer_for(cfg: Config, precision: str = "fp32", loss_scale: bool = False,
                  legacy: bool = False, own_step: bool = False, shared: bool = False) -> tf.keras.optimizers.Optimizer:
    """train.optimizer at train.learning_rate; with loss_scale and fp16, wrapped for loss scaling
    (Keras' compile wraps it itself; a custom loop asks for it). legacy: the pre-2.11 Keras optimizer
    (what Horovod 0.28's Keras DistributedOptimizer wraps). own_step: the optimizer of recpipe's own Keras
    train step (not a peer's, not Horovod's loop, where neither lever below measured any gain: its step is
    the exchange's): Adagrad applies its updates in fewer or faster ops (_adagrad_update),
    and where sparse_grads_are_unique(cfg) the sparse gradients are not made unique again (_own_step_kind).
    shared: several workers update the same variables at once (ParameterServerStrategy): a table's rows are
    then updated inside one kernel (_adagrad_update_in_place), never read by one op and written by a later
    one, which would overwrite what another worker wrote in between."""
    lr = cfg.train.learning_rate
    kinds = tf.keras.optimizers.legacy if legacy else tf.keras.optimizers
    kind = {"adagrad": kinds.Adagrad, "adam": kinds.Adam, "sgd": kinds.SGD}[cfg.train.optimizer]
    if own_step and not legacy:
        kind = _own_step_kind(kind, trust_unique=sparse_grads_are_unique(cfg), shared=shared)
    # the ops measured in _adagrad_update, not XLA's (which tf-keras turns on where a GPU is)
    ours = getattr(kind, "update_step", None) in (_adagrad_update, _adagrad_update_in_place)
    opt = kind(lr, jit_compile=False) if ours else kind(lr)
    if loss_scale and precision == "fp16":
        opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)
    return opt


def sparse_grads_are_unique(cfg: Config) -> bool:
    """Whether every sparse (IndexedSlices) gradient of a step has unique indices: with ID dedup each model
    looks every table up once per step, at its distinct IDs (SparseEmbeddings), unless a retrieval model
    draws uniform negatives (a second lookup, whose gradient the tape concatenates with the first's) or
    gradients are accumulated (micro-batches' rows concatenated). Not for Horovod, which allgathers the
    ranks' rows (recpipe.trainers.strategies.hvd builds its own optimizer)."""
    t = cfg.train.tuning
    second_lookup = cfg.model.task == "retrieval" and cfg.model.uniform_negatives > 0
    return t.dedup_ids and t.grad_accum_steps == 1 and not second_lookup


def _own_step_kind(kind: type, trust_unique: bool, shared: bool = False) -> type:
    """`kind` (a tf-keras optimizer) as recpipe's own Keras train step uses it: Adagrad in fewer or faster
    ops (_adagrad_update; with shared, _adagrad_update_in_place), and with trust_unique without its per-step
    re-deduplication of sparse gradients (a Unique and an unsorted segment sum per table,
    `_deduplicate_sparse_grad`): 1.08x the default DCN-v2's compiled fp32 step and 1.11x in bf16 (11
    alternating rounds each, won 9 of 11).
    tf-keras 2.21 calls that method from apply_gradients only, before update_step; a test checks it still
    exists and that steps update every weight as the stock optimizer does."""
    body, name = {}, kind.__name__
    if kind is tf.keras.optimizers.Adagrad:
        update = _adagrad_update_in_place if shared else _adagrad_update
        body["update_step"], body["build"], name = update, _adagrad_build, f"Own{name}"
    if trust_unique:
        body["_deduplicate_sparse_grad"], name = (lambda self, grads: grads), f"UniqueSparse{name}"
    return type(name, (kind,), body) if body else kind


def _adagrad_build(self, var_list) -> None:
    """tf-keras Adagrad's build, each accumulator's initial value a callable that tf.Variable runs where the
    accumulator is placed. The stock build fills every accumulator on the calling device first: under
    ParameterServerStrategy that is the coordinator, which then sends each table shard's accumulator to its PS
    task, where the received copy stayed resident beside the variable (0.5x a task's state)."""
    tf.keras.optimizers.Optimizer.build(self, var_list)
    if getattr(self, "_built", False):
        return
    self._built = True
    self._accumulators = []
    value = self.initial_accumulator_value
    for var in var_list:
        dtype = getattr(var, "true_dtype", var.dtype)
        def fill(shape=var.shape, dtype=dtype):
            return tf.fill(shape, tf.cast(value, dtype))
        self._accumulators.append(self.add_variable_from_reference(var, "accumulator", initial_value=fill))


def _adagrad_update(self, grad, variable) -> None:
    """tf-keras Adagrad's update_step, with the same arithmetic in fewer or faster ops. var -= lr * g /
    (sqrt(acc) + eps) after acc += g * g: epsilon is added after the square root, as in tf.compat.v1 and
    Keras' legacy Adagrad, where tf-keras adds it under it (sqrt(acc + eps)); with accumulators from 0.1 up
    the updates differ by about 1e-7 of themselves.
    - A dense weight: one fused kernel (ResourceApplyAdagradV2) where the stock step runs five ops.
    - A table's rows (IndexedSlices): the accumulator's rows are gathered, both slots' rows updated as whole
      [rows, width] tensors and scattered back, where the stock step runs a scatter-add of the squared rows
      into the accumulator, a gather of them back, a square root, a division and a second scatter-add. The
      table's rows are the ones the step's forward pass read where it read exactly these (row_reads), else
      gathered again: on the embedding-heavy DLRM `recpipe train` ran at 86,700 ex/s against 78,100 with
      the second gather (medians of 4 alternating pairs, each pair won). The fused sparse kernel
      (ResourceSparseApplyAdagradV2, _adagrad_update_in_place) updates row after row on one thread: on the
      embedding-heavy DLRM's 13,068 unique rows of 26 tables per step it took 3.4 ms against 1.7 for this
      (9 alternating rounds).
    The rows are written, not added, so the gradient's indices must be unique: tf-keras' own dedup makes them
    so before update_step, or sparse_grads_are_unique(cfg) finds they are."""
    if not isinstance(grad, tf.IndexedSlices):
        _adagrad_update_in_place(self, grad, variable)
        return
    lr = tf.cast(self.learning_rate, variable.dtype)
    epsilon = tf.cast(self.epsilon, variable.dtype)
    accumulator = self._accumulators[self._index_dict[self._var_key(variable)]]
    g, rows = tf.cast(grad.values, variable.dtype), grad.indices
    acc = accumulator.sparse_read(rows) + g * g
    accumulator.scatter_update(tf.IndexedSlices(acc, rows))
    step = lr * g / (tf.sqrt(acc) + epsilon)
    current = row_reads.rows_read(variable, rows)  # the forward pass's read of these rows, if it made one
    if current is None:
        current = variable.sparse_read(rows)
    variable.scatter_update(tf.IndexedSlices(current - step, rows))


def _adagrad_update_in_place(self, grad, variable) -> None:
    """_adagrad_update's arithmetic, each variable's update one fused kernel (ResourceSparseApplyAdagradV2 for
    a table's rows, ResourceApplyAdagradV2 for a dense weight), which reads and writes each row in turn. The
    kernel applies repeated indices one after another, not summed: the indices must be unique, as there."""
    lr = tf.cast(self.learning_rate, variable.dtype)
    epsilon = tf.cast(self.epsilon, variable.dtype)
    accumulator = self._accumulators[self._index_dict[self._var_key(variable)]]
    if isinstance(grad, tf.IndexedSlices):
        tf.raw_ops.ResourceSparseApplyAdagradV2(var=variable.handle, accum=accumulator.handle, lr=lr,
                                                epsilon=epsilon, grad=grad.values, indices=grad.indices)
    else:
        tf.raw_ops.ResourceApplyAdagradV2(var=variable.handle, accum=accumulator.handle, lr=lr, epsilon=epsilon,
                                          grad=grad)


@contextlib.contextmanager
def precision_policy(precision: str) -> Iterator[None]:
    """Keras' global dtype policy for the models built inside; float32 again afterwards."""
    tf.keras.mixed_precision.set_global_policy(PRECISION_POLICIES[precision])
    try:
        yield
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
