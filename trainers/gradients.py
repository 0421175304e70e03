"""Gradients over micro-batches (train.tuning.grad_accum_steps): one optimizer step per batch, the
activation memory of batch/k rows. Shared by Keras' train_step and the Horovod loop."""
from __future__ import annotations

import tensorflow as tf

from recpipe.features.canonical import LABEL_KEY

__all__ = ["micro_batches", "accumulated_gradients"]


def micro_batches(batch: dict, k: int) -> list[dict]:
    """Split a batch into k equal micro-batches (k divides the batch size; checked by the config)."""
    if k == 1:
        return [batch]
    n = tf.shape(batch[LABEL_KEY])[0] // k
    return [{key: v[i * n:(i + 1) * n] for key, v in batch.items()} for i in range(k)]


def _add(a, b):
    if a is None or b is None:
        return a if b is None else b
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0),
                                a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)


def accumulated_gradients(model: tf.keras.Model, batch: dict, k: int, optimizer=None) -> tuple[list, tf.Tensor]:
    """Gradients of the mean loss over `batch`, computed over k micro-batches one after another.
    Sparse (IndexedSlices) gradients are concatenated, not densified. With a LossScaleOptimizer the
    loss is scaled and the gradients unscaled. Returns (gradients, mean loss)."""
    scaled = optimizer is not None and hasattr(optimizer, "get_scaled_loss")
    grads, loss_sum = None, tf.constant(0.0)
    for mb in micro_batches(batch, k):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(mb, training=True) / k
            total = loss + tf.reduce_sum(model.losses) / k if model.losses else loss
            target = optimizer.get_scaled_loss(total) if scaled else total
        g = tape.gradient(target, model.trainable_variables)
        if scaled:
            g = optimizer.get_unscaled_gradients(g)
        grads = g if grads is None else [_add(x, y) for x, y in zip(grads, g)]
        loss_sum += tf.cast(loss, tf.float32)
    return grads, loss_sum
