"""Training (local strategy): checkpoints every N steps, resume on rerun, TensorBoard events.

MODEL_DIR layout (the interface to evaluate/export):
    config.yaml     the config trained with (features identical to the preprocessed data's)
    transform/      copy of the transform artifact, so the model dir is self-contained
    checkpoints/    tf.train.CheckpointManager checkpoints (model + optimizer + step)
    logs/           TensorBoard event files
    train_state.json  steps done, precision, throughput of the last run
"""
from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Callable, Optional  # noqa: E402

import tensorflow as tf  # noqa: E402

from features.artifact import TransformArtifact  # noqa: E402
from features.config import Config, config_to_dict, dump_config, load_config, parse_config  # noqa: E402
from trainers.data import make_dataset  # noqa: E402
from trainers.models import build_model, dummy_batch  # noqa: E402

__all__ = ["TrainError", "TrainOptions", "TrainResult", "train", "load_trained", "PRECISION_POLICIES"]

PRECISION_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


class TrainError(ValueError):
    pass


@dataclass(frozen=True)
class TrainOptions:
    data_dir: str
    model_dir: str
    config_path: Optional[str] = None
    strategy: str = "local"
    precision: str = "fp32"
    steps: Optional[int] = None


@dataclass
class TrainResult:
    steps_done: int
    steps_this_run: int
    examples_per_sec: float
    final_loss: float
    resumed_from: int


def _optimizer(cfg: Config) -> tf.keras.optimizers.Optimizer:
    lr = cfg.train.learning_rate
    return {"adagrad": lambda: tf.keras.optimizers.Adagrad(lr),
            "adam": lambda: tf.keras.optimizers.Adam(lr),
            "sgd": lambda: tf.keras.optimizers.SGD(lr)}[cfg.train.optimizer]()


def _resolve_config(opts: TrainOptions, artifact: TransformArtifact) -> Config:
    if opts.config_path is None:
        return artifact.config
    cfg = load_config(opts.config_path)
    ours, theirs = config_to_dict(cfg), config_to_dict(artifact.config)
    for key in ("features", "label", "input"):
        if ours[key] != theirs[key]:
            raise TrainError(f"{opts.config_path}: '{key}' differs from the config the data in "
                             f"{opts.data_dir} was preprocessed with; re-run `recpipe preprocess`")
    return cfg


def _prepare_model_dir(opts: TrainOptions) -> tuple[Config, TransformArtifact]:
    src = TransformArtifact.read(os.path.join(opts.data_dir, "transform"))
    cfg = _resolve_config(opts, src)
    cfg_path = os.path.join(opts.model_dir, "config.yaml")
    if os.path.exists(cfg_path):
        previous = parse_config(__import__("yaml").safe_load(open(cfg_path)))
        if config_to_dict(previous)["features"] != config_to_dict(cfg)["features"] or \
                config_to_dict(previous)["model"] != config_to_dict(cfg)["model"]:
            raise TrainError(f"{opts.model_dir}: holds a model with other features/model settings; "
                             f"use a new --model-dir")
    os.makedirs(opts.model_dir, exist_ok=True)
    art_dir = os.path.join(opts.model_dir, "transform")
    if not os.path.exists(os.path.join(art_dir, "transform.json")):
        tmp = art_dir + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(os.path.join(opts.data_dir, "transform"), tmp)
        os.replace(tmp, art_dir)
    with open(cfg_path + ".tmp", "w") as fh:
        fh.write(dump_config(cfg))
    os.replace(cfg_path + ".tmp", cfg_path)
    return cfg, TransformArtifact.read(art_dir)


class _Progress(tf.keras.callbacks.Callback):
    def __init__(self, total: int, batch_size: int, start: int, manager: tf.train.CheckpointManager,
                 say: Callable[[str], None], every: int):
        super().__init__()
        self.total, self.batch_size, self.say, self.every = total, batch_size, say, every
        self.manager = manager
        self.start_step = start
        self.t0 = time.perf_counter()
        self.last_logs: dict = {}

    def on_train_begin(self, logs=None):
        self.step = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1  # counted here: reading optimizer.iterations every batch would sync the step
        step = self.step
        self.last_logs = logs or {}
        if step % self.every == 0 or step >= self.total:
            rate = (step - self.start_step) * self.batch_size / max(time.perf_counter() - self.t0, 1e-9)
            self.say(f"train: step {step}/{self.total} loss {float(self.last_logs.get('loss', float('nan'))):.4f} "
                     f"auc {float(self.last_logs.get('auc', float('nan'))):.4f} ({rate:,.0f} ex/s)")
        if step >= self.total:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        self.manager.save(checkpoint_number=int(self.model.optimizer.iterations.numpy()))


def _checkpoint(model: tf.keras.Model, model_dir: str) -> tuple[tf.train.Checkpoint, tf.train.CheckpointManager]:
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    return ckpt, tf.train.CheckpointManager(ckpt, os.path.join(model_dir, "checkpoints"), max_to_keep=3)


def train(opts: TrainOptions, say: Callable[[str], None] = print) -> TrainResult:
    if opts.strategy != "local":
        raise TrainError(f"--strategy {opts.strategy}: only 'local' is available in this version")
    if opts.precision not in PRECISION_POLICIES:
        raise TrainError(f"--precision {opts.precision}: use one of {', '.join(PRECISION_POLICIES)}")
    cfg, artifact = _prepare_model_dir(opts)
    total = opts.steps if opts.steps is not None else cfg.train.steps
    if total <= 0:
        raise TrainError(f"--steps {total}: must be > 0")
    tf.keras.mixed_precision.set_global_policy(PRECISION_POLICIES[opts.precision])
    tf.keras.utils.set_random_seed(cfg.train.seed)
    try:
        model = build_model(cfg, artifact)
        model.compile(optimizer=_optimizer(cfg))
        model(dummy_batch(cfg))  # create every variable, so restore checks them all
        ckpt, manager = _checkpoint(model, opts.model_dir)
        start = 0
        if manager.latest_checkpoint:
            ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
            start = int(model.optimizer.iterations.numpy())
            say(f"train: resuming from {manager.latest_checkpoint} at step {start}")
        if start >= total:
            say(f"train: already trained {start} >= {total} steps; nothing to do")
            return TrainResult(start, 0, 0.0, float("nan"), start)

        every = min(cfg.train.checkpoint_every, total)
        ds = make_dataset(cfg, opts.data_dir, "train", cfg.train.batch_size, training=True,
                          seed=cfg.train.seed + start)
        progress = _Progress(total, cfg.train.batch_size, start, manager, say, every)
        tensorboard = tf.keras.callbacks.TensorBoard(os.path.join(opts.model_dir, "logs"), update_freq=every,
                                                     write_graph=False, profile_batch=0)
        epochs = -(-total // every)
        model.fit(ds, steps_per_epoch=every, epochs=epochs, initial_epoch=start // every, verbose=0,
                  callbacks=[progress, tensorboard])
        done = int(model.optimizer.iterations.numpy())
        if manager.latest_checkpoint is None or not manager.latest_checkpoint.endswith(f"-{done}"):
            manager.save(checkpoint_number=done)
        elapsed = time.perf_counter() - progress.t0
        rate = (done - start) * cfg.train.batch_size / max(elapsed, 1e-9)
        result = TrainResult(done, done - start, rate, float(progress.last_logs.get("loss", float("nan"))), start)
        with open(os.path.join(opts.model_dir, "train_state.json"), "w") as fh:
            json.dump({"steps_done": done, "precision": opts.precision, "strategy": opts.strategy,
                       "examples_per_sec_last_run": rate, "batch_size": cfg.train.batch_size}, fh, indent=1)
        return result
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def load_trained(model_dir: str) -> tuple[Config, TransformArtifact, tf.keras.Model]:
    """Rebuild the model of MODEL_DIR (fp32) and restore its latest checkpoint."""
    cfg_path = os.path.join(model_dir, "config.yaml")
    if not os.path.exists(cfg_path):
        raise TrainError(f"{model_dir}: not a model directory (no config.yaml; run `recpipe train`)")
    cfg = load_config(cfg_path)
    artifact = TransformArtifact.read(os.path.join(model_dir, "transform"))
    model = build_model(cfg, artifact)
    model.compile(optimizer=_optimizer(cfg))
    latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    if latest is None:
        raise TrainError(f"{model_dir}: no checkpoint found (run `recpipe train`)")
    model(dummy_batch(cfg))
    tf.train.Checkpoint(model=model).restore(latest).expect_partial().assert_existing_objects_matched()
    return cfg, artifact, model
