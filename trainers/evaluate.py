"""Evaluate a trained model on the eval split: flat metrics JSON (auc, logloss, examples)."""
from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import json  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from features.canonical import LABEL_KEY  # noqa: E402
from trainers.data import make_dataset  # noqa: E402
from trainers.metrics import log_loss, roc_auc  # noqa: E402
from trainers.train import load_trained  # noqa: E402

__all__ = ["evaluate"]


def evaluate(model_dir: str, data_dir: str, out_path: str | None = None, batch_size: int = 4096) -> dict:
    cfg, _, model = load_trained(model_dir)
    predict = tf.function(lambda b: tf.sigmoid(model(b))[:, 0], reduce_retracing=True)
    labels, probs = [], []
    for batch in make_dataset(cfg, data_dir, "eval", batch_size, training=False):
        labels.append(batch[LABEL_KEY].numpy())
        probs.append(predict(batch).numpy())
    if not labels:
        raise ValueError(f"{data_dir}/eval: the eval split is empty")
    y, p = np.concatenate(labels), np.concatenate(probs)
    metrics = {"auc": roc_auc(y, p), "logloss": log_loss(y, p), "examples": int(len(y)),
               "positive_rate": float(y.mean())}
    if out_path:
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        with open(out_path, "w") as fh:
            json.dump(metrics, fh, indent=1)
    return metrics
