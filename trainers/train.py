"""Training (local or ParameterServerStrategy): checkpoints every N steps, resume on rerun, TensorBoard.

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

import dataclasses  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Callable, Optional  # noqa: E402

import tensorflow as tf  # noqa: E402

from features.artifact import TransformArtifact  # noqa: E402
from features.config import Config, config_to_dict, dump_config, load_config, parse_config  # noqa: E402
from trainers.data import make_dataset, synthetic_dataset  # noqa: E402
from trainers.models import build_model, dummy_batch  # noqa: E402
from trainers.progress import ProgressBar  # noqa: E402

__all__ = ["TrainError", "TrainOptions", "TrainResult", "train", "load_trained", "apply_warm_start",
           "optimizer_for", "PRECISION_POLICIES"]

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
    ps_workers: int = 2   # --strategy ps without TF_CONFIG: tasks started on 127.0.0.1
    ps_servers: int = 2
    ps_task_threads: int = 0
    np: int = 2           # --strategy horovod: ranks on this host
    threads: int = 0      # intra- and inter-op threads of this process (0: TensorFlow's default)
    warm_start: Optional[str] = None  # a previous model dir to initialise a NEW model from
    synthetic_input: bool = False     # benchmarks: one random in-memory batch instead of the shards


@dataclass
class TrainResult:
    steps_done: int
    steps_this_run: int
    examples_per_sec: float
    final_loss: float
    resumed_from: int


def optimizer_for(cfg: Config) -> tf.keras.optimizers.Optimizer:
    lr = cfg.train.learning_rate
    return {"adagrad": lambda: tf.keras.optimizers.Adagrad(lr),
            "adam": lambda: tf.keras.optimizers.Adam(lr),
            "sgd": lambda: tf.keras.optimizers.SGD(lr)}[cfg.train.optimizer]()


def _resolve_config(opts: TrainOptions, artifact: TransformArtifact) -> Config:
    """--config, else the model dir's own config (a rerun resumes), else the preprocessing config."""
    if opts.config_path is None:
        own = os.path.join(opts.model_dir, "config.yaml")
        return load_config(own) if os.path.exists(own) else artifact.config
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
        # Unique temp names: several Horovod ranks may prepare the same model dir at once.
        tmp = f"{art_dir}.tmp-{os.getpid()}"
        shutil.copytree(os.path.join(opts.data_dir, "transform"), tmp)
        try:
            os.rename(tmp, art_dir)
        except OSError:  # another process published it first
            shutil.rmtree(tmp, ignore_errors=True)
    text = dump_config(cfg)
    if not os.path.exists(cfg_path) or open(cfg_path).read() != text:  # a rerun leaves the file untouched
        with open(f"{cfg_path}.tmp-{os.getpid()}", "w") as fh:
            fh.write(text)
        os.replace(f"{cfg_path}.tmp-{os.getpid()}", cfg_path)
    return cfg, TransformArtifact.read(art_dir)


class _Progress(tf.keras.callbacks.Callback):
    """Checkpoint + progress line at each epoch end (an epoch = `every` steps), and a terminal
    progress bar. Under ParameterServerStrategy batch-level hooks are not allowed (they would sync
    every step), so there the bar moves once per epoch."""

    def __init__(self, total: int, batch_size: int, start: int, manager: tf.train.CheckpointManager,
                 say: Callable[[str], None], per_batch: bool):
        super().__init__()
        self.total, self.batch_size, self.say, self.manager = total, batch_size, say, manager
        self.start_step = start
        self.t0 = time.perf_counter()
        self.last_logs: dict = {}
        self.bar = ProgressBar(total, start, batch_size)
        self.step = start
        # (step, time) after the first epoch's checkpoint and before the last one's: the steady window
        self.first_epoch: tuple[int, float] | None = None
        self.last_epoch: tuple[int, float] | None = None
        self._supports_tf_logs = True  # the bar never reads the logs, so Keras need not fetch them
        if per_batch and self.bar.enabled:
            self.on_train_batch_end = self._batch_end

    def _batch_end(self, batch, logs=None):
        self.step += 1
        self.bar.update(self.step)

    def on_epoch_end(self, epoch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        self.step = step
        self.last_epoch = (step, time.perf_counter())
        self.manager.save(checkpoint_number=step)
        if self.first_epoch is None:
            self.first_epoch = (step, time.perf_counter())
        self.last_logs = {k: _scalar(v) for k, v in (logs or {}).items()}
        rate = (step - self.start_step) * self.batch_size / max(time.perf_counter() - self.t0, 1e-9)
        auc = f" auc {self.last_logs['auc']:.4f}" if "auc" in self.last_logs else ""
        self.bar.clear()
        self.say(f"train: step {step}/{self.total} loss {self.last_logs.get('loss', float('nan')):.4f}{auc} "
                 f"({rate:,.0f} ex/s)")
        self.bar.update(step, self.last_logs.get("loss"), force=True)

    def on_train_end(self, logs=None):
        if self.step >= self.total:
            self.bar.close()


def apply_warm_start(model, cfg: Config, artifact: TransformArtifact, previous: str,
                     say: Callable[[str], None]) -> None:
    """Warm-start `model` from a previous model dir and say what was copied."""
    from trainers.warm_start import warm_start
    report = warm_start(model, cfg, artifact, previous)
    rows = ", ".join(f"{t}:{n}" for t, n in sorted(report["rows_copied"].items())[:6])
    say(f"train: warm start from {previous}: {report['copied']} weights copied (embedding rows kept: {rows}"
        f"{', ...' if len(report['rows_copied']) > 6 else ''})")


def _scalar(v) -> float:
    """A log value as a float; under ParameterServerStrategy logs are RemoteValues to fetch."""
    if hasattr(v, "fetch"):
        v = v.fetch()
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _checkpoint(model: tf.keras.Model, model_dir: str) -> tuple[tf.train.Checkpoint, tf.train.CheckpointManager]:
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    return ckpt, tf.train.CheckpointManager(ckpt, os.path.join(model_dir, "checkpoints"), max_to_keep=3)


def train(opts: TrainOptions, say: Callable[[str], None] = print) -> TrainResult:
    if opts.strategy not in ("local", "ps", "horovod", "auto"):
        raise TrainError(f"--strategy {opts.strategy}: use local, ps, horovod or auto")
    if opts.precision not in PRECISION_POLICIES:
        raise TrainError(f"--precision {opts.precision}: use one of {', '.join(PRECISION_POLICIES)}")
    cfg, artifact = _prepare_model_dir(opts)
    _set_threads(opts.threads or cfg.train.tuning.intra_op_threads, opts.threads or cfg.train.tuning.inter_op_threads)
    total = opts.steps if opts.steps is not None else cfg.train.steps
    if total <= 0:
        raise TrainError(f"--steps {total}: must be > 0")
    if opts.strategy == "auto":
        from trainers.advisor import advise
        advice = advise(cfg, artifact, opts.data_dir, workers=opts.np, ps_tasks=opts.ps_servers)
        for line in advice.table().splitlines():
            say(line.replace("advise:", "train: advisor:", 1))
        opts = dataclasses.replace(opts, strategy=advice.strategy)
    if opts.strategy == "horovod":
        return _horovod(cfg, artifact, opts, total, say)
    if opts.strategy == "local":
        return _fit(cfg, artifact, opts, total, tf.distribute.get_strategy(), say)
    from trainers.ps import LocalPSCluster, cluster_from_tf_config, make_strategy
    cluster = cluster_from_tf_config()
    if cluster is not None:
        say(f"train: PS cluster from TF_CONFIG: {len(cluster.workers)} workers, {len(cluster.ps)} PS")
        return _fit(cfg, artifact, opts, total, make_strategy(cluster), say)
    with LocalPSCluster(opts.ps_workers, opts.ps_servers, opts.ps_task_threads, say=say) as local:
        return _fit(cfg, artifact, opts, total, make_strategy(local.cluster), say)


def _set_threads(intra: int, inter: int) -> None:
    """TensorFlow's thread pools; they can be set only before TensorFlow's runtime starts."""
    for n, setter, getter in ((intra, tf.config.threading.set_intra_op_parallelism_threads,
                               tf.config.threading.get_intra_op_parallelism_threads),
                              (inter, tf.config.threading.set_inter_op_parallelism_threads,
                               tf.config.threading.get_inter_op_parallelism_threads)):
        if n and getter() != n:
            try:
                setter(n)
            except RuntimeError as e:  # the runtime already started in this process (e.g. in tests)
                raise TrainError(f"threads={n}: TensorFlow is already initialised in this process ({e}); "
                                 f"set it in a fresh `recpipe train`") from None


def _horovod(cfg: Config, artifact: TransformArtifact, opts: TrainOptions, total: int,
             say: Callable[[str], None]) -> TrainResult:
    from trainers import hvd
    if hvd.inside_horovod_job() or opts.np == 1:  # one rank needs no launcher: hvd.init() alone gives size 1
        try:
            state = hvd.run_rank(cfg, artifact, opts, total, say)
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")
        return TrainResult(state["steps_done"], state["steps_this_run"], state.get("examples_per_sec_last_run", 0.0),
                           state.get("final_loss", float("nan")), state.get("resumed_from", state["steps_done"]))
    if opts.np < 1:
        raise TrainError(f"--np {opts.np}: must be >= 1")
    hvd.launch(opts, say)
    with open(os.path.join(opts.model_dir, "train_state.json")) as fh:
        state = json.load(fh)
    return TrainResult(state["steps_done"], state["steps_this_run"], state["examples_per_sec_last_run"],
                       state["final_loss"], state["resumed_from"])


def _fit(cfg: Config, artifact: TransformArtifact, opts: TrainOptions, total: int,
         strategy: tf.distribute.Strategy, say: Callable[[str], None]) -> TrainResult:
    ps = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
    tf.keras.mixed_precision.set_global_policy(PRECISION_POLICIES[opts.precision])
    tf.keras.utils.set_random_seed(cfg.train.seed)
    try:
        with strategy.scope():
            model = build_model(cfg, artifact)
            model.compile(optimizer=optimizer_for(cfg), steps_per_execution=cfg.train.tuning.steps_per_execution)
            model(dummy_batch(cfg))  # create every variable, so restore checks them all
        ckpt, manager = _checkpoint(model, opts.model_dir)
        start = 0
        if manager.latest_checkpoint:
            ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
            start = int(model.optimizer.iterations.numpy())
            say(f"train: resuming from {manager.latest_checkpoint} at step {start}")
        elif opts.warm_start:
            apply_warm_start(model, cfg, artifact, opts.warm_start, say)
        if start >= total:
            say(f"train: already trained {start} >= {total} steps; nothing to do")
            return TrainResult(start, 0, 0.0, float("nan"), start)

        remaining = total - start
        every = min(cfg.train.checkpoint_every, remaining)
        seed = cfg.train.seed + start

        sizes = {f.name: artifact.id_space_size(f) for f in cfg.features.sparse}

        def dataset_fn(input_context=None):
            if opts.synthetic_input:
                return synthetic_dataset(cfg, sizes, cfg.train.batch_size, seed)
            return make_dataset(cfg, opts.data_dir, "train", cfg.train.batch_size, training=True,
                                input_context=input_context, seed=seed)

        data = tf.keras.utils.experimental.DatasetCreator(dataset_fn) if ps else dataset_fn()
        progress = _Progress(total, cfg.train.batch_size, start, manager, say, per_batch=not ps)
        tensorboard = tf.keras.callbacks.TensorBoard(os.path.join(opts.model_dir, "logs"), update_freq="epoch",
                                                     write_graph=False, profile_batch=0)
        # Epochs of `every` steps (a checkpoint at each end), then one short epoch for the rest.
        model.fit(data, steps_per_epoch=every, epochs=remaining // every, verbose=0,
                  callbacks=[progress, tensorboard])
        if remaining % every:
            model.fit(data, steps_per_epoch=remaining % every, epochs=1, verbose=0, callbacks=[progress, tensorboard])
        done = int(model.optimizer.iterations.numpy())
        if manager.latest_checkpoint is None or not manager.latest_checkpoint.endswith(f"-{done}"):
            manager.save(checkpoint_number=done)
        elapsed = time.perf_counter() - progress.t0
        rate = (done - start) * cfg.train.batch_size / max(elapsed, 1e-9)
        result = TrainResult(done, done - start, rate, progress.last_logs.get("loss", float("nan")), start)
        with open(os.path.join(opts.model_dir, "train_state.json"), "w") as fh:
            json.dump({"steps_done": done, "precision": opts.precision, "strategy": opts.strategy,
                       "examples_per_sec_last_run": rate,
                       "examples_per_sec_steady": steady_rate(progress.first_epoch, progress.last_epoch,
                                                              cfg.train.batch_size, rate),
                       "batch_size": cfg.train.batch_size,
                       "data_dir": os.path.abspath(opts.data_dir)}, fh, indent=1)
        return result
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")


def steady_rate(first: tuple[int, float] | None, last: tuple[int, float] | None, examples_per_step: int,
                overall: float) -> float:
    """ex/s between the end of the first checkpoint interval (after its save) and the end of the last
    (before its save): no graph tracing, XLA compiling, warm-up or first/last checkpoint writes in it.
    The overall rate when the run had a single interval."""
    if first is None or last is None or last[0] <= first[0]:
        return overall
    return (last[0] - first[0]) * examples_per_step / max(last[1] - first[1], 1e-9)


def load_trained(model_dir: str) -> tuple[Config, TransformArtifact, tf.keras.Model]:
    """Rebuild the model of MODEL_DIR (fp32) and restore its latest checkpoint."""
    cfg_path = os.path.join(model_dir, "config.yaml")
    if not os.path.exists(cfg_path):
        raise TrainError(f"{model_dir}: not a model directory (no config.yaml; run `recpipe train`)")
    cfg = load_config(cfg_path)
    artifact = TransformArtifact.read(os.path.join(model_dir, "transform"))
    model = build_model(cfg, artifact)  # no optimizer: evaluation and export need only the weights
    latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    if latest is None:
        raise TrainError(f"{model_dir}: no checkpoint found (run `recpipe train`)")
    model(dummy_batch(cfg))
    tf.train.Checkpoint(model=model).restore(latest).expect_partial().assert_existing_objects_matched()
    return cfg, artifact, model
