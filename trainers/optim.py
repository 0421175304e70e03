"""Optimizer and precision set-up shared by every training loop (Keras fit and Horovod's)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import tensorflow as tf

from features.config import Config

__all__ = ["PRECISION_POLICIES", "optimizer_for", "precision_policy"]

PRECISION_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def optimizer_for(cfg: Config, precision: str = "fp32", loss_scale: bool = False,
                  legacy: bool = False) -> tf.keras.optimizers.Optimizer:
    """train.optimizer at train.learning_rate; with loss_scale and fp16, wrapped for loss scaling
    (Keras' compile wraps it itself; a custom loop asks for it). legacy: the pre-2.11 Keras optimizer
    (what Horovod 0.28's Keras DistributedOptimizer wraps)."""
    lr = cfg.train.learning_rate
    kinds = tf.keras.optimizers.legacy if legacy else tf.keras.optimizers
    opt = {"adagrad": kinds.Adagrad, "adam": kinds.Adam, "sgd": kinds.SGD}[cfg.train.optimizer](lr)
    if loss_scale and precision == "fp16":
        opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)
    return opt


@contextlib.contextmanager
def precision_policy(precision: str) -> Iterator[None]:
    """Keras' global dtype policy for the models built inside; float32 again afterwards."""
    tf.keras.mixed_precision.set_global_policy(PRECISION_POLICIES[precision])
    try:
        yield
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
