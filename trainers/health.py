"""What a non-finite loss means: which inputs are non-finite, named, before anything is saved."""
from __future__ import annotations

import math

import numpy as np

from recpipe.features.config import Config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.trainers.data import make_dataset
from recpipe.trainers.errors import TrainError

__all__ = ["check_loss"]


def _non_finite_features(cfg: Config, data_dir: str, batches: int = 8) -> dict[str, str]:
    """Dense features whose statistics or whose values in the first train batches are not finite."""
    found: dict[str, str] = {}
    stats = PreprocessedData(data_dir).transform().dense_stats
    for name, s in stats.items():
        if not all(math.isfinite(v) for v in (s.get("mean", 0.0), s.get("std", 0.0), *s.get("boundaries", []))):
            found[name] = f"its statistics are {s}"
    for i, batch in enumerate(make_dataset(cfg, data_dir, "train", cfg.train.batch_size, training=False)):
        if i >= batches:
            break
        for d in cfg.features.dense:
            if d.name not in found and not np.all(np.isfinite(batch[d.name].numpy())):
                found[d.name] = "it has non-finite values in the training shards"
    return found


def check_loss(loss: float, step: int, cfg: Config, data_dir: str) -> None:
    """Raise a TrainError naming the cause when `loss` is not finite (called before a checkpoint is saved)."""
    if math.isfinite(loss):
        return
    culprits = _non_finite_features(cfg, data_dir)
    if culprits:
        named = "; ".join(f"{k}: {v}" for k, v in culprits.items())
        raise TrainError(f"the loss is {loss} at step {step}, so training stopped before saving: dense feature(s) "
                         f"{named} (re-run `recpipe preprocess` on clean data)")
    raise TrainError(f"the loss is {loss} at step {step}, so training stopped before saving; every input is finite, "
                     f"so the optimisation diverged: lower train.learning_rate ({cfg.train.learning_rate:g})")
