"""The model directory `recpipe train` writes: the interface to evaluate, export and warm start.

    ROOT/config.yaml        the config trained with (its features equal the preprocessed data's)
    ROOT/transform/         a copy of the transform artifact: the model dir is self-contained
    ROOT/checkpoints/       tf.train.CheckpointManager checkpoints (model + optimizer + step)
    ROOT/logs/              TensorBoard event files
    ROOT/train_state.json   TrainState of the last run, written by every training loop alike
    ROOT/validation.json    each checkpoint's validation scores (recpipe.trainers.evaluation.validation.ValidationHistory)
    ROOT/best/weights.*     the model weights of the best checkpoint on validation: what evaluate, export
                            and warm start read when present (else the latest checkpoint)
    ROOT/reliability.png    the eval split's reliability curve, written by `recpipe evaluate` (ranking)
    ROOT/slices.png         the eval metric per slice (config evaluate.slices), written by `recpipe evaluate`
    ROOT/.writer.lock       held by the one training run that writes the directory (recpipe.common.dirlock)
"""
from __future__ import annotations

import dataclasses
import glob
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
import sys
from typing import TYPE_CHECKING, Callable, Optional

from recpipe.common import fsio
from recpipe.common.dirlock import DirLock
from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import Config, config_to_dict, dump_config, load_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.trainers.checkpoints import checkpoint_prefixes, remove_temp_saves, restore_newest_whole
from recpipe.trainers.errors import TrainError

if TYPE_CHECKING:
    import tensorflow as tf

# TensorFlow is imported by the methods that write or restore checkpoints, not here: a Horovod launcher
# prepares the model dir and reports its ranks' end through this class without loading TensorFlow (about
# 3 s of CPU and 550 MB of RSS, held while its ranks train).

__all__ = ["TrainState", "ModelDir", "load_trained", "check_data_matches", "check_same_transform"]

MAX_CHECKPOINTS = 3


def _warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class TrainState:
    """What a training run leaves in train_state.json (and what `train` returns)."""
    steps_done: int
    steps_this_run: int
    resumed_from: int
    examples_per_sec_last_run: float    # over the whole run, tracing and checkpoints included
    examples_per_sec_steady: float      # after the first checkpoint interval (see recpipe.trainers.progress)
    final_loss: float
    strategy: str
    precision: str
    batch_size: int                     # per replica / rank
    ranks: int = 1                      # Horovod ranks (1 otherwise)
    sparse_gradients: Optional[str] = None  # Horovod: auto | allgather | dense
    gradient_groups: Optional[int] = None   # Horovod: grouped collectives per step (0: one per tensor)
    cycle_time_ms: Optional[float] = None   # Horovod: its background thread's cycle (HOROVOD_CYCLE_TIME)
    data_dir: str = ""
    best_step: Optional[int] = None     # the checkpoint kept by validation (None: no validation split)
    allocator: str = ""                 # the trainer process's malloc (recpipe.trainers.allocator.loaded_allocator)

    @classmethod
    def unchanged(cls, steps_done: int, strategy: str, precision: str, batch_size: int, data_dir: str) -> "TrainState":
        """A run that found the model already trained to its steps."""
        return cls(steps_done, 0, steps_done, 0.0, 0.0, math.nan, strategy, precision, batch_size,
                   data_dir=PreprocessedData(data_dir).root)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainState":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def check_data_matches(cfg: Config, data: PreprocessedData, what: str) -> TransformArtifact:
    """The data's transform artifact, if it was preprocessed with cfg's features, label and input;
    else a TrainError naming the section (instead of a TensorFlow error deep in the input pipeline)."""
    artifact = data.transform()
    ours, theirs = config_to_dict(cfg), config_to_dict(artifact.config)
    for key in ("features", "label", "input"):
        if ours[key] != theirs[key]:
            raise TrainError(f"{data.root}: preprocessed with another '{key}' section than {what}; use data "
                             f"preprocessed with that config (or re-run `recpipe preprocess` with it)")
    return artifact


def check_same_transform(model: TransformArtifact, data: TransformArtifact, model_root: str, data_root: str,
                         advice: str) -> None:
    """A TrainError when the data's transform gives rows other IDs or dense values than the model's (a
    copy of the one it was trained with): its shards would feed the model IDs that stand for other
    values, in silence when its tables have rows for them, else as a TensorFlow index error."""
    diffs = model.mapping_differences(data, "the model's", "the data's")
    if diffs:
        raise TrainError(f"{data_root}: preprocessed by another run than the data the model in {model_root} was "
                         f"trained on, so its IDs stand for other values: {'; '.join(diffs)}. {advice}")


_ESCAPED = {b"n": b"\n", b"r": b"\r", b"t": b"\t"}


def _unquoted(text: bytes) -> bytes:
    """A protobuf text-format string's bytes, its C escapes undone (\\" \\\\ \\n, octal \\NNN, hex \\xHH)."""
    def one(m: re.Match) -> bytes:
        e = m[1]
        if e[:1].isdigit():
            return bytes([int(e, 8) & 0xFF])
        return bytes([int(e[1:], 16)]) if e[:1] == b"x" else _ESCAPED.get(e, e)
    return re.sub(rb"\\([0-7]{1,3}|x[0-9a-fA-F]{2}|.)", one, text, flags=re.S)


class ModelDir:
    """A model directory (the layout above) on the local file system; nothing is read until a method asks.

    Args:
        root: the directory (--model-dir); it need not exist yet (prepare creates it).

    Attributes:
        root: the directory, as given.
    """

    def __init__(self, root: str):
        self.root = root

    # ------------------------------------------------------------ layout
    config_path = fsio.SubPath("config.yaml")
    transform_dir = fsio.SubPath("transform")
    checkpoints_dir = fsio.SubPath("checkpoints")
    logs_dir = fsio.SubPath("logs")
    state_path = fsio.SubPath("train_state.json")
    validation_path = fsio.SubPath("validation.json")
    best_prefix = fsio.SubPath("best", "weights")
    reliability_png = fsio.SubPath("reliability.png")  # written by `recpipe evaluate` (ranking)
    slices_png = fsio.SubPath("slices.png")  # written by `recpipe evaluate` (config evaluate.slices)
    kept_elsewhere_path = fsio.SubPath("checkpoints_kept_elsewhere.json")  # a Horovod host's own dir: see below
    lock_path = fsio.SubPath(".writer.lock")

    def writer_lock(self) -> DirLock:
        """The lock a training run holds while it writes the directory: a second run on it fails at once.

        Returns:
            A DirLock context manager; entering it raises FolderInUseError naming the holder.
        """
        return DirLock(self.lock_path, f"model dir {self.root}")

    # ------------------------------------------------------------ contents
    def has_config(self) -> bool:
        """Whether the directory holds the config a training run wrote.

        Returns:
            True when ROOT/config.yaml exists.
        """
        return os.path.exists(self.config_path)

    def config(self) -> Config:
        """The config the model was trained with.

        Returns:
            The Config read from ROOT/config.yaml.

        Raises:
            TrainError: the directory holds no config.yaml (it is not a model directory).
            ConfigError: config.yaml is unreadable or invalid.
        """
        if not self.has_config():
            raise TrainError(f"{self.root}: not a model directory (no config.yaml; run `recpipe train`)")
        return load_config(self.config_path)

    def transform(self) -> TransformArtifact:
        """The copy of the transform artifact the model was trained with.

        Returns:
            The TransformArtifact read from ROOT/transform/.

        Raises:
            ArtifactError: ROOT/transform/ holds no readable artifact.
        """
        return TransformArtifact.read(self.transform_dir)

    def latest_checkpoint(self) -> Optional[str]:
        """tf.train.latest_checkpoint(checkpoints_dir), read without TensorFlow (a Horovod launcher names the
        last checkpoint when its ranks die): the newest prefix the checkpoints' state file names (the text
        CheckpointState tf.train.CheckpointManager writes), if its index file exists.

        Returns:
            The checkpoint prefix (e.g. ROOT/checkpoints/ckpt-500), or None when there is no state file, it
            names no checkpoint, or the named checkpoint's .index file is missing.
        """
        try:
            text = Path(self.checkpoints_dir, "checkpoint").read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        found = re.search(rb'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"', text, re.M)
        if not found:
            return None
        # relative, as CheckpointManager writes it (os.path.join keeps an absolute one whole)
        prefix = os.path.join(self.checkpoints_dir, os.fsdecode(_unquoted(found[1])))
        return prefix if os.path.exists(prefix + ".index") else None

    def best_weights(self) -> Optional[str]:
        """The weights kept by validation (a tf.train.Checkpoint prefix), if training kept any.

        Returns:
            ROOT/best/weights when its .index file exists, else None.
        """
        return self.best_prefix if os.path.exists(self.best_prefix + ".index") else None

    def resume_hint(self) -> str:
        """What a rerun of the same command does after a job died: resume from the last checkpoint, or start over.

        Returns:
            A sentence naming the last checkpoint's step and folder, or saying that a rerun starts over.
        """
        step = self.latest_step()
        return (f"the last checkpoint is step {step} in {self.checkpoints_dir}; rerun the same command to resume "
                f"from it" if step else "no checkpoint was written yet; a rerun starts over")

    def stopped(self, cause: str, way_back: str = "", kept_on: Optional[str] = None) -> TrainError:
        """The error of a job that `cause` stopped: the cause, what must happen first, and what a rerun of the
        same command does. The error is returned, not raised.

        Args:
            cause: what stopped the job (a rank or task that died, a host that stopped).
            way_back: what must happen before a rerun, ending in a separator ("" when nothing must).
            kept_on: the host whose Horovod rank 0 keeps the run's checkpoints in its own model dir; used only
                when this directory holds no checkpoint.

        Returns:
            The TrainError to raise.
        """
        if kept_on and not self.latest_step():
            return TrainError(f"{cause}, so the job stopped: {way_back}rank 0 on {kept_on} keeps the run's checkpoints "
                              f"in its own --model-dir; rerun the same command on every host to resume from its last "
                              f"one (a run that wrote none starts over)")
        return TrainError(f"{cause}, so the job stopped: {way_back}{self.resume_hint()}")

    def note_kept_elsewhere(self, host: str, model_dir: str, step: int) -> None:
        """Record, in ROOT/checkpoints_kept_elsewhere.json, that another host keeps this run's checkpoints.

        Written by a Horovod host whose own --model-dir holds no checkpoint of the run it took part in;
        read (by no_checkpoint_error) only where no checkpoint is found.

        Args:
            host: the host of rank 0, which kept the checkpoints.
            model_dir: rank 0's --model-dir on that host.
            step: the step of the run's last checkpoint.
        """
        fsio.write_json(self.kept_elsewhere_path, {"host": host, "model_dir": model_dir, "step": step})

    def no_checkpoint_error(self) -> TrainError:
        """The error for a directory without a checkpoint (returned, not raised).

        Returns:
            A TrainError telling to run `recpipe train`, or, when note_kept_elsewhere left its record, one
            naming the host and model dir that keep the run's checkpoints.
        """
        if not os.path.exists(self.kept_elsewhere_path):
            return TrainError(f"{self.root}: no checkpoint found (run `recpipe train`)")
        kept = fsio.read_json(self.kept_elsewhere_path)
        return TrainError(f"{self.root}: no checkpoint here: this host's Horovod ranks trained with rank 0 on "
                          f"{kept['host']}, which kept the run's checkpoints (step {kept['step']}) in its own "
                          f"--model-dir {kept['model_dir']}; evaluate and export there, or give every host one shared "
                          f"--model-dir")

    def latest_step(self) -> int:
        """The training step of the latest checkpoint.

        Returns:
            The step (the number ending the checkpoint prefix), or 0 when there is no checkpoint.
        """
        latest = self.latest_checkpoint()
        return int(latest.rsplit("-", 1)[1]) if latest else 0

    def state(self) -> Optional[TrainState]:
        """What the last training run left in train_state.json.

        Returns:
            The TrainState, or None when the file does not exist.
        """
        return TrainState.from_dict(fsio.read_json(self.state_path)) if os.path.exists(self.state_path) else None

    def write_state(self, state: TrainState) -> None:
        """Write train_state.json.

        Args:
            state: the TrainState of the run that ends.
        """
        fsio.write_json(self.state_path, dataclasses.asdict(state), sort_keys=False)

    def data_dir(self) -> Optional[str]:
        """The preprocessed data the last run trained on.

        Returns:
            The data folder recorded in train_state.json, or None when there is no state or it names none.
        """
        state = self.state()
        return state.data_dir if state and state.data_dir else None

    def trained_on_hint(self, data_root: str, text: str) -> str:
        """A hint naming the data the last run trained on, for messages about other data.

        Args:
            data_root: the data folder at hand.
            text: a format string whose {} becomes the data folder the last run trained on.

        Returns:
            `text` formatted with that folder, when it is known and is not `data_root`; else "".
        """
        trained_on = self.data_dir()
        return text.format(trained_on) if trained_on and trained_on != data_root else ""

    # ------------------------------------------------------------ training side
    def resolve_config(self, data: PreprocessedData, config_path: Optional[str]) -> tuple[Config, TransformArtifact]:
        """The config to train with: --config, else this dir's own config (a rerun resumes), else the
        preprocessing config; checked against the data's features and this dir's model.

        Args:
            data: the preprocessed data to train on.
            config_path: the --config file, or None.

        Returns:
            (the config, the data's transform artifact).

        Raises:
            TrainError: the data was preprocessed with other features, label or input settings than the config;
                its train split is empty; or this dir holds a model with other features or model settings.
            ConfigError: the config file is unreadable or invalid.
            ArtifactError: the data folder is not a `recpipe preprocess` output.
        """
        if config_path is not None:
            cfg, what = load_config(config_path), config_path
        elif self.has_config():
            cfg, what = self.config(), f"the model in {self.root}"
        else:
            cfg, what = data.transform().config, "itself"
        artifact = check_data_matches(cfg, data, what)
        if artifact.row_counts.get("train") == 0:
            raise TrainError(f"{data.root}: the train split is empty (preprocess kept no training rows); "
                             f"nothing to train on")
        if self.has_config():
            previous, ours = config_to_dict(self.config()), config_to_dict(cfg)
            if previous["features"] != ours["features"] or previous["model"] != ours["model"]:
                raise TrainError(f"{self.root}: holds a model with other features/model settings; "
                                 f"use a new --model-dir")
        return cfg, artifact

    def prepare(self, data: PreprocessedData, config_path: Optional[str]) -> tuple[Config, TransformArtifact]:
        """Create or reuse the dir for training on `data`: check the config (resolve_config), copy the data's
        transform artifact in (once; concurrent Horovod ranks are safe) and write config.yaml when it changed.

        Args:
            data: the preprocessed data to train on.
            config_path: the --config file, or None (see resolve_config).

        Returns:
            (the config, the transform artifact the model is trained with: this dir's copy).

        Raises:
            TrainError: as resolve_config; or the data's transform maps values to other IDs than this dir's
                copy (the data comes from another preprocess run than the one the model was trained on).
        """
        cfg, data_artifact = self.resolve_config(data, config_path)
        os.makedirs(self.root, exist_ok=True)
        if not os.path.exists(os.path.join(self.transform_dir, "transform.json")):
            # Unique temp names: several Horovod ranks may prepare the same model dir at once.
            tmp = f"{self.transform_dir}.tmp-{os.getpid()}"
            shutil.copytree(data.transform_dir, tmp)
            try:
                os.rename(tmp, self.transform_dir)
            except OSError:  # another process published it first (checked below like a rerun's)
                shutil.rmtree(tmp, ignore_errors=True)
        trained_with = self.transform()  # a rerun resumes, so on the same IDs
        check_same_transform(trained_with, data_artifact, self.root, data.root,
                             f"Train on it in a new --model-dir (--warm-start {self.root} carries the rows of the "
                             f"values both know over, by value)"
                             + self.trained_on_hint(data.root, ", or resume on the data this one was trained on ({})"))
        text = dump_config(cfg)
        if not self.has_config() or Path(self.config_path).read_text() != text:  # a rerun leaves the file untouched
            tmp = f"{self.config_path}.tmp-{os.getpid()}"
            with open(tmp, "w") as fh:
                fh.write(text)
            os.replace(tmp, self.config_path)
        return cfg, trained_with

    def checkpoint(self, model: tf.keras.Model,
                   optimizer=None) -> tuple[tf.train.Checkpoint, tf.train.CheckpointManager]:
        """The checkpoint of (model, optimizer) every strategy writes, and its manager.

        Args:
            model: the Keras model.
            optimizer: the optimizer to checkpoint; None: `model.optimizer`.

        Returns:
            (the tf.train.Checkpoint, a tf.train.CheckpointManager writing it to ROOT/checkpoints/ and keeping
            the last MAX_CHECKPOINTS).
        """
        import tensorflow as tf
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer if optimizer is not None else model.optimizer)
        return ckpt, tf.train.CheckpointManager(ckpt, self.checkpoints_dir, max_to_keep=MAX_CHECKPOINTS)

    def resume(self, ckpt: tf.train.Checkpoint, say: Callable[[str], None]) -> Optional[str]:
        """Restore the newest whole checkpoint into `ckpt` (a run resuming), after removing the temporary
        folders of saves that were killed. Call it holding writer_lock().

        Args:
            ckpt: the run's checkpoint (checkpoint()'s first element).
            say: where the warnings about damaged checkpoints go.

        Returns:
            The prefix restored, or None when the directory holds no checkpoint.

        Raises:
            TrainError: checkpoints exist but none restores.
            AssertionError: the checkpoint does not match the model's variables.
        """
        for path in remove_temp_saves(self.checkpoints_dir):
            say(f"train: removed {path}, left by a checkpoint save that was killed")
        prefixes = checkpoint_prefixes(self.checkpoints_dir)
        if not prefixes:
            return None
        return restore_newest_whole(lambda p: ckpt.restore(p).assert_existing_objects_matched(), prefixes,
                                    self.checkpoints_dir, lambda m: say(f"train: {m}"))

    def _weights_candidates(self) -> list[str]:
        """The prefixes evaluation, export and warm start may read, the preferred first: the best weights on
        validation, then the checkpoints newest first."""
        kept = glob.glob(glob.escape(self.best_prefix) + ".*")  # whole or not: a damaged one is named
        return ([self.best_prefix] if kept else []) + checkpoint_prefixes(self.checkpoints_dir)

    def whole_weights(self, say: Callable[[str], None] = _warn) -> str:
        """The weights warm start reads: the best weights on validation when whole, else the newest whole
        checkpoint.

        Args:
            say: where the warnings about damaged checkpoints go.

        Returns:
            A checkpoint prefix whose files are whole (recpipe.trainers.checkpoints.damage).

        Raises:
            TrainError: no checkpoint, or none whole.
        """
        candidates = self._weights_candidates()
        if not candidates:
            raise self.no_checkpoint_error()
        return restore_newest_whole(lambda p: None, candidates, self.root, say)

    # ------------------------------------------------------------ reading side
    def load_trained(self, serving: bool = False,
                     say: Callable[[str], None] = _warn) -> tuple[Config, TransformArtifact, tf.keras.Model]:
        """Rebuild the model (fp32, no optimizer: evaluation and export need only the weights) and
        restore the best weights on validation, else the latest checkpoint; one that is damaged is skipped
        with a warning for the next older one.

        Args:
            serving: build the model for requests of a few rows, without unique-then-gather ID dedup
                (tuning.dedup_ids): it adds three ops per table to every call and saves nothing when the rows
                repeat no ID (the weights and the scores are the same either way).
            say: where the warnings about damaged checkpoints go (default: stderr).

        Returns:
            (the config, the transform artifact, the model with its trained weights restored).

        Raises:
            TrainError: the directory holds no config.yaml, no checkpoint, or none that restores.
            AssertionError: the checkpoint does not match the rebuilt model's variables.
        """
        import tensorflow as tf

        from recpipe.trainers.models import build_model, dummy_batch
        cfg = self.config()
        artifact = self.transform()
        candidates = self._weights_candidates()
        if not candidates:
            raise self.no_checkpoint_error()
        built = cfg
        if serving:
            built = dataclasses.replace(cfg, train=dataclasses.replace(
                cfg.train, tuning=dataclasses.replace(cfg.train.tuning, dedup_ids=False)))
        model = build_model(built, artifact)
        model(dummy_batch(cfg))
        checkpoint = tf.train.Checkpoint(model=model)
        restore_newest_whole(lambda p: checkpoint.restore(p).expect_partial().assert_existing_objects_matched(),
                             candidates, self.root, say)
        return cfg, artifact, model


def load_trained(model_dir: str) -> tuple[Config, TransformArtifact, tf.keras.Model]:
    return ModelDir(model_dir).load_trained()
