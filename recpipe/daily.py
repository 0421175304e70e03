"""One day of the scheduled pipeline, step by step (`recpipe daily STEP --project P --day YYYY-MM-DD`).

Every step is idempotent: outputs of a day live under WORK/<day>/ and are published atomically, a
step whose output is complete does nothing, and push never exports the same day's model twice.
The Airflow DAG (airflow_dags/recpipe_daily.py) only calls these steps.

    ready       exit 0 when LOG/dt=<day>/ is complete: its writer's _SUCCESS marker and Parquet files
                (the sensor's probe)
    preprocess  LOG/dt=<day> -> WORK/<day>/preprocessed, extending the previous day's vocabularies
    train       -> WORK/<day>/model, warm-started from the previous day's model
    evaluate    -> WORK/<day>/metrics.json
    bless       -> WORK/<day>/blessing.json: the new model vs the served one on the same eval rows
    push        export into EXPORT_BASE as the next version, only if blessed

`ready` is the sensor's probe, run every few minutes: it must not pay for importing Beam or
TensorFlow, so the steps that need them import them when they run.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from recpipe.common import fsio
from recpipe.common.typed_yaml import build_typed, read_yaml
from recpipe.features.config import ConfigError, load_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.k8s_resources import ResourcesSpec
from recpipe.serving.version import ExportBase
from recpipe.trainers.options import RunOptions, TrainOptions

__all__ = ["DailyConfig", "DayDir", "auc_verdict", "loses_to_baseline", "load_daily_config", "run_step", "STEPS",
           "train_allocator"]

STEPS = ("ready", "preprocess", "train", "evaluate", "bless", "push")


@dataclass(frozen=True)
class DailyConfig:
    log_root: str                   # LOG/dt=YYYY-MM-DD/*.parquet
    work_root: str                  # WORK/YYYY-MM-DD/{preprocessed, model, metrics.json, blessing.json}
    export_base: str                # the served export base (TF Serving layout)
    config: str                     # the feature/model/train config
    train: RunOptions = field(default_factory=RunOptions)  # how `recpipe train` runs (strategy, precision, ...)
    bless_tolerance: float = 0.005  # the new AUC may be this much below the served model's
    # the file a partition's writer adds last (Spark's, Hive's and Hadoop's committers write _SUCCESS):
    # `ready` waits for it, so a day still being written is never trained on; null: ready at the first
    # Parquet file, for writers that leave no marker
    ready_marker: Optional[str] = "_SUCCESS"
    # what each pod of `recpipe cluster render` requests (cpu, memory per role); null values: the role's default
    resources: ResourcesSpec = field(default_factory=ResourcesSpec)


def load_daily_config(path: str) -> DailyConfig:
    data = read_yaml(path, "project config")
    try:
        dc = build_typed(DailyConfig, data)
    except (ConfigError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from None
    base = Path(path).resolve().parent
    resolve = lambda p: str(p if os.path.isabs(p) or "://" in p else base / p)  # noqa: E731
    return dataclasses.replace(dc, log_root=resolve(dc.log_root), work_root=resolve(dc.work_root),
                               export_base=resolve(dc.export_base), config=resolve(dc.config))


@dataclass(frozen=True)
class DayDir:
    """WORK/<day>/: one day's artifacts."""
    root: str

    @property
    def data(self) -> PreprocessedData:
        return PreprocessedData(os.path.join(self.root, "preprocessed"))

    model_root = fsio.SubPath("model")  # a recpipe.trainers.model_dir.ModelDir
    metrics_path = fsio.SubPath("metrics.json")
    blessing_path = fsio.SubPath("blessing.json")


def _day(day: str) -> str:
    try:
        return dt.date.fromisoformat(day).isoformat()
    except ValueError:
        raise ConfigError(f"--day {day!r}: expected YYYY-MM-DD") from None


def _partition(dc: DailyConfig, day: str) -> str:
    return os.path.join(dc.log_root, f"dt={day}")


def _day_dir(dc: DailyConfig, day: str) -> DayDir:
    return DayDir(os.path.join(dc.work_root, day))


def _previous_day(dc: DailyConfig, day: str) -> Optional[str]:
    """The latest earlier day that has a log partition (its outputs must exist: days run in order)."""
    if not os.path.isdir(dc.log_root):
        return None
    days = sorted(d[3:] for d in os.listdir(dc.log_root) if d.startswith("dt=") and d[3:] < day)
    return days[-1] if days else None


def step_ready(dc: DailyConfig, day: str, say) -> int:
    """0 when the day's partition holds the Parquet files preprocess would read (sub-partitions too) and,
    unless ready_marker is null, its writer's marker: a partition still being written is not ready."""
    from recpipe.pipeline.sources import InputError, list_input_files  # pyarrow only: no Beam, no TensorFlow
    part = _partition(dc, day)
    try:
        files = list_input_files(part) if os.path.isdir(part) else []
    except InputError:
        files = []
    marked = dc.ready_marker is None or os.path.exists(os.path.join(part, dc.ready_marker))
    waiting = "" if marked else (f", no {dc.ready_marker} yet (its writer adds it last; project ready_marker: "
                                 f"null starts without one)")
    say(f"daily ready: {part}: {len(files)} Parquet file(s){waiting}")
    return 0 if files and marked else 1


def step_preprocess(dc: DailyConfig, day: str, say, beam_args: Optional[list[str]] = None) -> int:
    from recpipe.pipeline.preprocess import run_preprocess
    d = _day_dir(dc, day)
    if d.data.is_complete():
        say(f"daily preprocess: {d.data.root} is complete; nothing to do")
        return 0
    prev = _previous_day(dc, day)
    previous = _day_dir(dc, prev).data if prev else None
    if previous and not previous.is_complete():
        raise RuntimeError(f"daily preprocess {day}: the previous day {prev} is not preprocessed yet "
                           f"({previous.root}); days must run in order")
    os.makedirs(d.root, exist_ok=True)
    run_preprocess(load_config(dc.config), _partition(dc, day), d.data.root, beam_args, say=say,
                   previous_transform=previous.root if previous else None, day=day)
    return 0


def step_train(dc: DailyConfig, day: str, say) -> int:
    from recpipe.trainers.strategies.hvd_job import launch_job, launches_ranks
    d = _day_dir(dc, day)
    prev = _previous_day(dc, day)
    warm = _day_dir(dc, prev).model_root if prev else None
    opts = TrainOptions(d.data.root, d.model_root, dc.config, run=dc.train,
                        warm_start=warm if warm is not None and os.path.isdir(warm) else None)
    if launches_ranks(opts.run):  # a Horovod launcher: its ranks import TensorFlow, the task's process does not
        launch_job(opts, say=say)
    else:
        from recpipe.trainers.train import train
        train(opts, say=say)
    return 0


def train_launches_ranks(project: str) -> bool:
    """Whether the project's train step only launches Horovod ranks (and so never imports TensorFlow)."""
    from recpipe.trainers.strategies.hvd_job import launches_ranks
    return launches_ranks(load_daily_config(project).train)


def train_allocator(project: str) -> str:
    """train.tuning.allocator of the project's config: the step's process re-executes itself with it
    before TensorFlow is imported, as `recpipe train` does (recpipe.trainers.allocator.reexec_with)."""
    return load_config(load_daily_config(project).config).train.tuning.allocator


def step_evaluate(dc: DailyConfig, day: str, say) -> int:
    from recpipe.trainers.evaluation.evaluate import evaluate
    d = _day_dir(dc, day)
    metrics = evaluate(d.model_root, d.data.root, d.metrics_path)
    for name, why in metrics.get("undefined", {}).items():
        say(f"daily evaluate: WARNING: {name} is null: {why}")
    say(f"daily evaluate: {json.dumps(metrics)}")
    return 0


def step_bless(dc: DailyConfig, day: str, say) -> int:
    """The new model and the served SavedModel on the SAME raw eval rows of this day (eval_sample), as
    TFX's Evaluator compares a candidate with its baseline: ranking by AUC; retrieval by recall@k of the
    rows' clicks, each model recommending from its own candidate index (the served version's k)."""
    import pyarrow.parquet as pq
    import tensorflow as tf

    from recpipe.common.metrics import roc_auc
    from recpipe.features.records import read_single_batch
    from recpipe.serving.export.savedmodel import same_rows_recall, sample_auc
    from recpipe.trainers.model_dir import ModelDir
    d = _day_dir(dc, day)
    model_dir = ModelDir(d.model_root)
    checkpoint = os.path.basename(model_dir.latest_checkpoint() or "")
    if os.path.exists(d.blessing_path) and fsio.read_json(d.blessing_path).get("model_checkpoint") == checkpoint:
        say(f"daily bless: {day}'s model ({checkpoint}) was judged already; keeping that verdict")
        return 0
    versions = ExportBase(dc.export_base).versions()
    served = versions[-1] if versions else None
    cfg, artifact, model = model_dir.load_trained()
    new_metrics = fsio.read_json(d.metrics_path)
    if served is None:
        verdict = {"blessed": True, "reason": "no model is served yet"}
    elif cfg.model.task == "ranking":
        sample = pq.read_table(d.data.eval_sample_parquet)
        batch = read_single_batch(cfg, d.data.eval_sample_records)
        labels = sample.column(cfg.label.column).to_numpy(zero_copy_only=False).astype(float)
        new_auc = roc_auc(labels, tf.sigmoid(model(batch))[:, 0].numpy())
        verdict = {**auc_verdict(labels, new_auc, sample_auc(served, sample), dc.bless_tolerance),
                   "served_version": served.path}
    else:
        recall = same_rows_recall(served, cfg, artifact, model, d.data.root, pq.read_table(d.data.eval_sample_parquet))
        verdict = {**recall_verdict(recall, dc.bless_tolerance), "served_version": served.path}
    lost = loses_to_baseline(cfg.model.task, new_metrics)
    if lost:  # TFX's Evaluator value threshold: never pushed, the first version included
        verdict = {**verdict, "blessed": False, "baseline": lost[1],
                   "reason": f"{lost[0]}; {verdict['reason']}" if verdict["blessed"] else
                             f"{verdict['reason']}; also {lost[0]}"}
    verdict["day"] = day
    verdict["model_checkpoint"] = checkpoint
    fsio.write_json(d.blessing_path, verdict, only_if_changed=True)
    say(f"daily bless: {'BLESSED' if verdict['blessed'] else 'NOT blessed'}: {verdict['reason']}")
    return 0


def loses_to_baseline(task: str, metrics: dict) -> Optional[tuple[str, dict]]:
    """(why, figures) when the model's eval metrics (recpipe evaluate's) are no better than the trivial
    model's beside them: ranking, a logloss no lower than predicting train's click rate; retrieval, a
    recall@10 no higher than recommending the most popular candidates. None when it beats it. A model that
    loses to it learnt nothing a constant does not know (a broken label, features or training), and the
    first day has no served model to lose to."""
    if task == "retrieval":
        new = metrics.get("recall_at_10")
        base = metrics.get("baselines", {}).get("most_popular", {}).get("recall_at_10")
        if new is None or base is None or new > base:
            return None
        return (f"the new model's eval recall@10 {new:.4f} is no higher than recommending the most popular "
                f"candidates ({base:.4f})", {"metric": "recall_at_10", "model": new, "most_popular": base})
    new, base = metrics.get("logloss"), metrics.get("baselines", {}).get("constant_rate", {}).get("logloss")
    if new is None or base is None or new < base:
        return None
    return (f"the new model's eval logloss {new:.4f} is no lower than predicting train's click rate ({base:.4f})",
            {"metric": "logloss", "model": new, "constant_rate": base})


def recall_verdict(recall: dict, tolerance: float) -> dict:
    """Bless the new retrieval model when its recall@k on the day's eval-sample clicks is at most `tolerance`
    below the served model's on the same rows (recpipe.serving.export.savedmodel.same_rows_recall); with no click in the
    sample the models cannot be compared, and the served one stays."""
    k, rows = recall["k"], recall["rows"]
    out = {"metric": f"recall_at_{k}", "new": recall["new"], "served": recall["served"], "tolerance": tolerance,
           "rows": rows}
    if not rows:
        return {**out, "blessed": False, "reason": "the day's eval sample holds no click: the models cannot be "
                                                   "compared; the served one stays"}
    return {**out, "blessed": bool(recall["new"] >= recall["served"] - tolerance),
            "reason": f"new recall@{k} {recall['new']:.4f} vs served {recall['served']:.4f} on the same {rows} "
                      f"eval clicks"}


def auc_verdict(labels, new_auc: float, served_auc: float, tolerance: float) -> dict:
    """Bless the new model when its AUC on the day's eval sample is at most `tolerance` below the served
    model's on the same rows. A sample of one class has no AUC: not blessed, and the reason says so rather
    than comparing 'new AUC nan vs served nan' (a low click rate can leave a day's sample so)."""
    rows, positives = len(labels), sum(1 for v in labels if v > 0.5)
    out = {"metric": "auc", "new": new_auc, "served": served_auc, "tolerance": tolerance, "rows": rows}
    if positives in (0, rows):
        return {**out, "blessed": False,
                "reason": f"AUC undefined: all {rows} eval-sample rows have label {int(positives > 0)}, so the "
                          f"models cannot be compared; the served one stays"}
    return {**out, "blessed": bool(new_auc >= served_auc - tolerance),
            "reason": f"new AUC {new_auc:.4f} vs served {served_auc:.4f} on the same {rows} eval rows"}


def step_push(dc: DailyConfig, day: str, say) -> int:
    from recpipe.serving.export.savedmodel import EXPORT_LOCK_WAIT_S, export_model
    d = _day_dir(dc, day)
    verdict = fsio.read_json(d.blessing_path)
    if not verdict["blessed"]:
        say(f"daily push: {day} not blessed ({verdict['reason']}); the model stays in {d.model_root}, not pushed")
        return 0
    base = ExportBase(dc.export_base)
    with base.writer_lock(wait_s=EXPORT_LOCK_WAIT_S):  # a push started twice: the second waits, then finds it done
        pushed = base.find_model_dir(d.model_root)
        if pushed is not None:
            say(f"daily push: {day}'s model is already version {pushed.version}; nothing to do")
            return 0
        path = export_model(d.model_root, dc.export_base, data_dir=d.data.root,
                            metrics=fsio.read_json(d.metrics_path))
    say(f"daily push: exported {path}")
    return 0


def run_step(step: str, project: str, day: str, say: Callable[[str], None] = print,
             beam_args: Optional[list[str]] = None) -> int:
    """beam_args: Beam options for the preprocess step (e.g. --runner dask --dask-address ADDR)."""
    dc = load_daily_config(project)
    day = _day(day)
    if step == "preprocess":
        return step_preprocess(dc, day, say, beam_args)
    return {"ready": step_ready, "train": step_train, "evaluate": step_evaluate, "bless": step_bless,
            "push": step_push}[step](dc, day, say)
