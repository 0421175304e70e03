"""`model.type: auto`: train the task's candidate types and keep the best on the validation split.

The candidates are recpipe.features.schema.CANDIDATES[task] (ranking: DCN-v2 and the logistic model; retrieval: the
two towers and, where it applies, item_to_item, recpipe.trainers.item_to_item). Each is a
whole `recpipe train` (any strategy: the run flags are passed through) into MODEL_DIR/candidates/TYPE, with the
config's model section narrowed to the keys that type reads (MODEL_DIR/candidates/TYPE.yaml), and each keeps its
best checkpoint on validation as any run does. The candidate with the best validation score on the selection
metric (train.early_stopping.metric) wins; its files are linked into MODEL_DIR, so evaluate, export and warm start
read MODEL_DIR as any model dir, and MODEL_DIR/selection.json records every candidate's score, best step and time.
The eval split is never read.

Under a TF_CONFIG PS cluster the chief selects; the worker and PS tasks serve each candidate's run in turn.
One type is trained, directly into MODEL_DIR, when there is nothing to select on: a task with one candidate, data
without a validation split, --synthetic-input, or --warm-start (the type of the model it starts from).
A rerun resumes every candidate and selects again.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

from recpipe.common import fsio
from recpipe.common.metrics import HIGHER_IS_BETTER
from recpipe.features.config import Config, dump_config, load_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.features.schema import candidate_types
from recpipe.trainers.errors import TrainError
from recpipe.trainers.item_to_item import unfit_reason
from recpipe.trainers.model_dir import ModelDir, TrainState
from recpipe.trainers.options import TrainOptions, run_flags
from recpipe.trainers.strategies.tf_config import tf_config

__all__ = ["SELECTION_FILE", "CandidateResult", "Selection", "requested_config", "types_to_train", "with_type",
           "pick", "select", "selection_metric", "serves_the_chief", "train_subprocess"]

SELECTION_FILE = "selection.json"
_CANDIDATES = "candidates"


@dataclass(frozen=True)
class CandidateResult:
    """One candidate's training run.

    Attributes:
        type: its model.type.
        validation: its best validation score on the selection metric (None: it failed or kept none).
        best_step: the step of that checkpoint.
        steps_done: the steps it trained.
        seconds: wall time of its `recpipe train` (resumed runs: of this run).
        status: "ok", or "failed: " and the run's last line.
    """
    type: str
    validation: Optional[float]
    best_step: Optional[int]
    steps_done: Optional[int]
    seconds: float
    status: str


@dataclass(frozen=True)
class Selection:
    """MODEL_DIR/selection.json: what `model.type: auto` trained and which candidate it kept.

    Attributes:
        metric: the selection metric (validation split).
        winner: the type kept in MODEL_DIR.
        candidates: every candidate's result, in training order.
    """
    metric: str
    winner: str
    candidates: list[CandidateResult]

    def write(self, path: str) -> None:
        fsio.write_json(path, asdict(self), sort_keys=False)

    @classmethod
    def read(cls, path: str) -> Optional["Selection"]:
        """The selection recorded at `path`, or None when there is none."""
        if not fsio.exists(path):
            return None
        d = fsio.read_json(path)
        return cls(d["metric"], d["winner"], [CandidateResult(**c) for c in d["candidates"]])


def requested_config(opts: TrainOptions) -> Config:
    """The config a run of `opts` trains with: --config, else the model dir's own, else the data's.

    Args:
        opts: the train options.

    Returns:
        The Config (its model.type may be auto).

    Raises:
        ConfigError, ArtifactError: the config or the data's transform cannot be read.
    """
    if opts.config_path:
        return load_config(opts.config_path)
    own = ModelDir(opts.model_dir)
    return own.config() if own.has_config() else PreprocessedData(opts.data_dir).transform().config


def types_to_train(cfg: Config, opts: TrainOptions, say: Callable[[str], None]) -> tuple[str, ...]:
    """The model types a run of `cfg` trains: its type, or for auto the candidates when it can select among them.

    Args:
        cfg: the requested config.
        opts: the train options (warm start, synthetic input, data dir).
        say: notes on why a single candidate is trained.

    Returns:
        One type (train it directly), or several (select among them).

    Raises:
        TrainError: --warm-start names a folder that is not a model dir.
    """
    types = candidate_types(cfg.model)
    if len(types) == 1:
        return types
    if opts.warm_start:
        start = ModelDir(opts.warm_start)
        if not start.has_config():
            raise TrainError(f"--warm-start {opts.warm_start}: not a model directory (no config.yaml)")
        warm = start.config().model.type
        say(f"train: model.type auto with --warm-start: training {warm}, the type of {opts.warm_start}")
        return (warm,)
    why = None
    if opts.synthetic_input:
        why = "--synthetic-input has no validation split"
    elif not PreprocessedData(opts.data_dir).transform().row_counts.get("validation"):
        why = f"{opts.data_dir} has no validation split (split.validation_fraction)"
    if why:
        say(f"train: model.type auto: {why} to select on; training {types[0]}")
        return types[:1]
    if "item_to_item" in types:
        unfit = unfit_reason(cfg, PreprocessedData(opts.data_dir).transform())
        if unfit:
            say(f"train: model.type auto: not training item_to_item: {unfit}")
            types = tuple(t for t in types if t != "item_to_item")
    return types


def with_type(cfg: Config, model_type: str) -> Config:
    """The config with model.type set (keys the type does not read are then left out of its dump).

    Args:
        cfg: a config.
        model_type: a concrete model type of cfg's task.

    Returns:
        The new Config.
    """
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, type=model_type))


def pick(results: list[CandidateResult], metric: str) -> CandidateResult:
    """The candidate with the best validation score (the first of equals: the order of CANDIDATES).

    Args:
        results: every candidate's result.
        metric: the selection metric (HIGHER_IS_BETTER's keys).

    Returns:
        The winner.

    Raises:
        TrainError: no candidate has a validation score.
    """
    scored = [r for r in results if r.validation is not None]
    if not scored:
        raise TrainError("model.type auto: no candidate has a validation score: "
                         + "; ".join(f"{r.type} {r.status}" for r in results))
    sign = 1.0 if HIGHER_IS_BETTER[metric] else -1.0
    return max(scored, key=lambda r: sign * r.validation)


def select(opts: TrainOptions, say: Callable[[str], None], train_one: Callable[[TrainOptions], TrainState]
           ) -> Optional[TrainState]:
    """Train a `model.type: auto` config: one type directly, or every candidate and keep the best.

    Args:
        opts: the train options.
        say: progress.
        train_one: trains a concrete config in this process (recpipe.trainers.train.train).

    Returns:
        The kept model's TrainState; None when the requested config names its type (nothing to select).

    Raises:
        TrainError: MODEL_DIR holds a model not trained by selection, or every candidate failed.
    """
    if serves_the_chief(opts):  # a TF_CONFIG worker or PS task serves every candidate
        return None
    cfg = requested_config(opts)
    if cfg.model.type != "auto":
        return None
    model_dir = ModelDir(opts.model_dir)
    folder = os.path.join(opts.model_dir, _CANDIDATES)
    types = types_to_train(cfg, opts, say)
    selection_path = os.path.join(opts.model_dir, SELECTION_FILE)
    if len(types) > 1 and model_dir.has_config() and not fsio.exists(selection_path):
        raise TrainError(f"{opts.model_dir}: holds a model not trained by model.type auto; use a new --model-dir")
    os.makedirs(folder, exist_ok=True)
    paths = {}
    for t in types:
        paths[t] = os.path.join(folder, f"{t}.yaml")
        fsio.write_text(paths[t], dump_config(with_type(cfg, t)))
    if len(types) == 1:
        return train_one(dataclasses.replace(opts, config_path=paths[types[0]]))
    metric = selection_metric(cfg)
    say(f"train: model.type auto: training {', '.join(types)} and keeping the best on validation {metric}")
    with model_dir.writer_lock():
        results = [train_subprocess(t, paths[t], opts.data_dir, os.path.join(folder, t), run_flags(opts.run), say)
                   for t in types]
        winner = pick(results, metric)
        _publish(os.path.join(folder, winner.type), opts.model_dir)
        Selection(metric, winner.type, results).write(selection_path)
    say(f"train: model.type auto: kept {winner.type} (validation {metric} {winner.validation:.4f}; "
        + ", ".join(f"{r.type} {_score(r)}" for r in results) + ")")
    state = model_dir.state()
    if state is None:
        raise TrainError(f"{opts.model_dir}: the kept candidate {winner.type} wrote no train state")
    return state


def serves_the_chief(opts: TrainOptions) -> bool:
    """Whether this process is a TF_CONFIG PS cluster's worker or PS task, which serves the chief's job and
    reads no config of its own.

    Args:
        opts: the train options.

    Returns:
        True under --strategy ps with a TF_CONFIG naming a task other than the chief.
    """
    cluster = tf_config() if opts.run.strategy == "ps" else None
    return cluster is not None and cluster.task_type != "chief"


def selection_metric(cfg: Config) -> str:
    """The validation metric checkpoints and candidates are selected by.

    Args:
        cfg: the config.

    Returns:
        train.early_stopping.metric; for auto, auc (ranking) or recall_at_10 (retrieval).
    """
    metric = cfg.train.early_stopping.metric
    if metric == "auto":
        return "recall_at_10" if cfg.model.task == "retrieval" else "auc"
    return metric


def _score(r: CandidateResult) -> str:
    return f"{r.validation:.4f}" if r.validation is not None else r.status


def train_subprocess(label: str, config_path: str, data_dir: str, model_dir: str, flags: list[str],
                     say: Callable[[str], None]) -> CandidateResult:
    """One `recpipe train` in its own process, scored by its best checkpoint on validation.

    Args:
        label: what the run is (a model type, a trial), naming its output lines and its result.
        config_path: the config to train.
        data_dir: the preprocessed data.
        model_dir: the run's model dir.
        flags: further `recpipe train` flags (e.g. run_flags of the run options).
        say: each line of the run's output, as "[LABEL] line".

    Returns:
        Its CandidateResult (type = label); status "failed: " and the run's last line when it failed, or
        "failed: no validation score" when it kept none.
    """
    cmd = [sys.executable, "-m", "recpipe.cli", "train", "--config", config_path, "--data", data_dir,
           "--model-dir", model_dir, *flags]
    t0 = time.perf_counter()
    last = ""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            line = line.rstrip()
            if line:
                last = line
                say(f"[{label}] {line}")
    seconds = round(time.perf_counter() - t0, 1)
    run_dir = ModelDir(model_dir)
    history = fsio.read_json(run_dir.validation_path) if fsio.exists(run_dir.validation_path) else {}
    state = run_dir.state()
    steps = state.steps_done if state else None
    if proc.returncode != 0 or history.get("best") is None:
        status = f"failed: {last}" if proc.returncode != 0 else "failed: no validation score"
        return CandidateResult(label, None, None, steps, seconds, status)
    return CandidateResult(label, float(history["best"]), history.get("best_step"), steps, seconds, "ok")


def _publish(source: str, target: str) -> None:
    """Make `target` hold the files of the model dir `source` (hard links where the file system allows, else
    copies), leaving its candidates, its selection record and its lock; what it held before is removed."""
    keep = {_CANDIDATES, SELECTION_FILE, os.path.basename(ModelDir(target).lock_path)}
    for name in os.listdir(target):
        if name not in keep:
            path = os.path.join(target, name)
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    for name in os.listdir(source):
        if name == os.path.basename(ModelDir(source).lock_path):
            continue
        src, dst = os.path.join(source, name), os.path.join(target, name)
        if os.path.isdir(src):
            shutil.copytree(src, dst, copy_function=_link_or_copy)
        else:
            _link_or_copy(src, dst)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
