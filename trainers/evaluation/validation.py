"""Model selection on the validation split while training: every checkpoint is scored on it, the
best weights are kept apart (the checkpoint manager deletes old checkpoints), and training stops
after `train.early_stopping.patience` checkpoints without improvement.

The scoring model is a plain float32 copy built outside any distribution strategy; it restores the
checkpoint just written, so the local, PS and Horovod loops all select the same way. The eval split
is never read here.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import tensorflow as tf

from recpipe.common import fsio
from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import Config
from recpipe.trainers.model_dir import ModelDir
from recpipe.trainers.selection import selection_metric
from recpipe.trainers.models import build_model, dummy_batch
from recpipe.trainers.evaluation.scoring import HIGHER_IS_BETTER, retrieval_clicks, score, selected, undefined_metrics

__all__ = ["ValidationHistory", "Validator", "validator_for"]


@dataclass
class ValidationHistory:
    """ROOT/validation.json of a model dir: each checkpoint's validation scores and the best one."""
    metric: str
    history: list[dict] = field(default_factory=list)  # {"step": n, <metric>: v, ...} per scored checkpoint
    best_step: Optional[int] = None
    best: Optional[float] = None
    stopped_early_at: Optional[int] = None

    @classmethod
    def read(cls, path: str) -> Optional["ValidationHistory"]:
        return cls(**fsio.read_json(path)) if fsio.exists(path) else None

    def write(self, path: str) -> None:
        fsio.write_json(path, asdict(self), sort_keys=False)

    def better(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        return value > self.best if HIGHER_IS_BETTER[self.metric] else value < self.best

    def since_best(self) -> int:
        """Scored checkpoints after the best one."""
        return sum(1 for h in self.history if self.best_step is not None and h["step"] > self.best_step)


class Validator:
    """Called after each checkpoint is written: scores it, keeps the best, says whether to stop."""

    def __init__(self, cfg: Config, artifact: TransformArtifact, data_dir: str, history_path: str,
                 best_prefix: str, say: Callable[[str], None]):
        self.cfg, self.artifact, self.data_dir, self.say = cfg, artifact, data_dir, say
        self.history_path, self.best_prefix = history_path, best_prefix
        self.history = ValidationHistory.read(history_path) or ValidationHistory(selection_metric(cfg))
        self._clicks = None  # retrieval: candidates and click histories, read at the first checkpoint
        # Built now, before training: Keras runs callbacks inside the strategy's scope, where a new
        # model's variables would be placed on the PS tasks.
        if tf.distribute.has_strategy():
            raise RuntimeError("Validator: build it outside the distribution strategy's scope")
        policy = tf.keras.mixed_precision.global_policy()
        tf.keras.mixed_precision.set_global_policy("float32")
        try:
            self._model = build_model(cfg, artifact)
            self._model(dummy_batch(cfg))
        finally:
            tf.keras.mixed_precision.set_global_policy(policy)

    @property
    def stopped(self) -> bool:
        return self.history.stopped_early_at is not None

    def __call__(self, step: int, checkpoint: str) -> bool:
        """Score `checkpoint` (written at `step`); True when training should stop."""
        if any(h["step"] == step for h in self.history.history):
            return self.stopped  # a rerun that re-saves the same step
        model = self._model
        tf.train.Checkpoint(model=model).restore(checkpoint).expect_partial().assert_existing_objects_matched()
        if self.cfg.model.task == "retrieval" and self._clicks is None:  # the shards do not change: read once
            self._clicks = retrieval_clicks(self.cfg, self.data_dir, "validation")
        scores = score(self.cfg, model, self.data_dir, "validation", clicks=self._clicks)
        h = self.history
        value = selected(scores, h.metric, "validation")
        seen_excluded = {f"seen_excluded_{k}": v for k, v in scores.get("seen_excluded", {}).items()
                         if isinstance(v, float)}
        h.history.append({"step": step, **{k: v for k, v in scores.items() if isinstance(v, float)}, **seen_excluded})
        improved = h.better(value)
        if improved:
            best = tf.train.Checkpoint(model=model)
            _ = best.save_counter  # created, so the weights restore like any checkpoint (all objects matched)
            best.write(self.best_prefix)
            h.best_step, h.best = step, value
        patience = self.cfg.train.early_stopping.patience
        stop = bool(patience) and h.since_best() >= patience
        if stop:
            h.stopped_early_at = step
        h.write(self.history_path)
        mark = "  (best)" if improved else f"  (best {h.best:.4f} at step {h.best_step})" if h.best is not None else ""
        self.say(f"train: step {step}: validation {h.metric} {value:.4f}{mark}")
        why = undefined_metrics(scores, "validation").get(h.metric)
        if why and len(h.history) == 1:  # said once: the split does not change while training
            self.say(f"train: WARNING: validation {h.metric} is undefined: {why}; no checkpoint can be chosen by "
                     "it, so the last one is the model kept")
        if stop:
            self.say(f"train: early stop at step {step}: no better validation {h.metric} in {patience} "
                     f"checkpoints; the best, step {h.best_step}, is the model kept")
        return stop


    def still_improving(self, last_step: int) -> bool:
        """Whether the run's last scored checkpoint, at `last_step`, was its best after at least two were scored:
        training stopped at its step cap while the validation metric still improved."""
        h = self.history
        return not self.stopped and len(h.history) >= 2 and h.best_step == last_step


def validator_for(cfg: Config, artifact: TransformArtifact, data_dir: str, model_dir: ModelDir,
                  say: Callable[[str], None]) -> Optional[Validator]:
    """The run's Validator, or None when the data has no validation split (then the latest
    checkpoint is the model, as before split.validation_fraction existed)."""
    if not artifact.row_counts.get("validation"):
        if cfg.train.early_stopping.patience:
            say("train: WARNING: train.early_stopping.patience is set but the data has no validation split "
                "(preprocess with split.validation_fraction > 0); training runs all its steps")
        return None
    return Validator(cfg, artifact, data_dir, model_dir.validation_path, model_dir.best_prefix, say)
