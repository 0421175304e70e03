"""One day of the scheduled pipeline, step by step (`recpipe daily STEP --project P --day YYYY-MM-DD`).

Every step is idempotent: outputs of a day live under WORK/<day>/ and are published atomically, a
step whose output is complete does nothing, and push never exports the same day's model twice.
The Airflow DAG (airflow_dags/recpipe_daily.py) only calls these steps.

    ready       exit 0 when LOG/dt=<day>/ holds Parquet files (the sensor's probe)
    preprocess  LOG/dt=<day> -> WORK/<day>/preprocessed, extending the previous day's vocabularies
    train       -> WORK/<day>/model, warm-started from the previous day's model
    evaluate    -> WORK/<day>/metrics.json
    bless       -> WORK/<day>/blessing.json: the new model vs the served one on the same eval rows
    push        export into MODEL_BASE as the next version, only if blessed
"""
from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import yaml

from features.config import ConfigError, build_typed

__all__ = ["DailyConfig", "load_daily_config", "run_step", "STEPS"]

STEPS = ("ready", "preprocess", "train", "evaluate", "bless", "push")


@dataclass(frozen=True)
class DailyConfig:
    log_root: str                   # LOG/dt=YYYY-MM-DD/*.parquet
    work_root: str                  # WORK/YYYY-MM-DD/{preprocessed, model, metrics.json, blessing.json}
    model_base: str                 # serving model base (TF Serving layout)
    config: str                     # the feature/model/train config
    strategy: str = "local"
    precision: str = "fp32"
    steps: Optional[int] = None
    np: int = 2
    bless_tolerance: float = 0.005  # the new AUC may be this much below the served model's


def load_daily_config(path: str) -> DailyConfig:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read project config ({e.strerror or e})") from None
    try:
        dc = build_typed(DailyConfig, data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    base = Path(path).resolve().parent
    resolve = lambda p: str(p if os.path.isabs(p) or "://" in p else base / p)  # noqa: E731
    if dc.strategy not in ("local", "ps", "horovod"):
        raise ConfigError(f"{path}: strategy: {dc.strategy!r} is not local | ps | horovod")
    return DailyConfig(resolve(dc.log_root), resolve(dc.work_root), resolve(dc.model_base), resolve(dc.config),
                       dc.strategy, dc.precision, dc.steps, dc.np, dc.bless_tolerance)


def _day(day: str) -> str:
    try:
        return dt.date.fromisoformat(day).isoformat()
    except ValueError:
        raise ConfigError(f"--day {day!r}: expected YYYY-MM-DD") from None


def _partition(dc: DailyConfig, day: str) -> str:
    return os.path.join(dc.log_root, f"dt={day}")


def _previous_day(dc: DailyConfig, day: str) -> Optional[str]:
    """The latest earlier day that has a log partition (its outputs must exist: days run in order)."""
    if not os.path.isdir(dc.log_root):
        return None
    days = sorted(d[3:] for d in os.listdir(dc.log_root) if d.startswith("dt=") and d[3:] < day)
    return days[-1] if days else None


def _paths(dc: DailyConfig, day: str) -> dict[str, str]:
    root = os.path.join(dc.work_root, day)
    return {"root": root, "pre": os.path.join(root, "preprocessed"), "model": os.path.join(root, "model"),
            "metrics": os.path.join(root, "metrics.json"), "blessing": os.path.join(root, "blessing.json")}


def _write_json(path: str, data: dict) -> None:
    """Atomic, and a no-op when the content is unchanged (a rerun of a day changes nothing)."""
    text = json.dumps(data, indent=1, sort_keys=True)
    if os.path.exists(path) and open(path).read() == text:
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def step_ready(dc: DailyConfig, day: str, say) -> int:
    part = _partition(dc, day)
    files = [f for f in os.listdir(part) if f.endswith(".parquet")] if os.path.isdir(part) else []
    say(f"daily ready: {part}: {len(files)} Parquet file(s)")
    return 0 if files else 1


def step_preprocess(dc: DailyConfig, day: str, say) -> int:
    from features.config import load_config
    from pipeline.preprocess import run_preprocess
    from recpipe.cli import DEFAULT_BEAM_ARGS
    p = _paths(dc, day)
    if os.path.exists(os.path.join(p["pre"], "transform", "transform.json")):
        say(f"daily preprocess: {p['pre']} is complete; nothing to do")
        return 0
    prev = _previous_day(dc, day)
    previous = _paths(dc, prev)["pre"] if prev else None
    if previous and not os.path.exists(os.path.join(previous, "transform", "transform.json")):
        raise RuntimeError(f"daily preprocess {day}: the previous day {prev} is not preprocessed yet "
                           f"({previous}); days must run in order")
    os.makedirs(p["root"], exist_ok=True)
    run_preprocess(load_config(dc.config), _partition(dc, day), p["pre"], list(DEFAULT_BEAM_ARGS), progress=say,
                   previous_transform=previous)
    return 0


def step_train(dc: DailyConfig, day: str, say) -> int:
    from trainers.train import TrainOptions, train
    p = _paths(dc, day)
    prev = _previous_day(dc, day)
    warm = _paths(dc, prev)["model"] if prev and os.path.isdir(_paths(dc, prev)["model"]) else None
    train(TrainOptions(p["pre"], p["model"], dc.config, strategy=dc.strategy, precision=dc.precision,
                       steps=dc.steps, np=dc.np, warm_start=warm), say=say)
    return 0


def step_evaluate(dc: DailyConfig, day: str, say) -> int:
    from trainers.evaluate import evaluate
    p = _paths(dc, day)
    metrics = evaluate(p["model"], p["pre"], p["metrics"])
    say(f"daily evaluate: {json.dumps(metrics)}")
    return 0


def _served_version(dc: DailyConfig) -> Optional[str]:
    from serving.export import existing_versions
    versions = existing_versions(dc.model_base)
    return os.path.join(dc.model_base, str(versions[-1])) if versions else None


def _sample_auc_of_saved_model(version_dir: str, sample) -> float:
    import tensorflow as tf

    from features.transform import request_from_arrow
    from trainers.metrics import roc_auc
    fn = tf.saved_model.load(version_dir).signatures["serving_default"]
    scores = fn(**request_from_arrow(sample, dict(fn.structured_input_signature[1])))["score"].numpy()
    return roc_auc(sample.column(_label_column(version_dir)).to_numpy(zero_copy_only=False).astype(float), scores)


def _label_column(version_dir: str) -> str:
    meta = json.load(open(os.path.join(version_dir, "assets.extra", "recpipe.json")))
    return meta["config"]["label"]["column"]


def step_bless(dc: DailyConfig, day: str, say) -> int:
    """Ranking: AUC of the new model and of the served SavedModel on the SAME raw eval rows of this day
    (eval_sample). Retrieval: the day's recall_at_10 against the one recorded for the served model."""
    import pyarrow.parquet as pq

    from trainers.metrics import roc_auc
    from trainers.train import load_trained
    import tensorflow as tf
    p = _paths(dc, day)
    checkpoint = os.path.basename(tf.train.latest_checkpoint(os.path.join(p["model"], "checkpoints")) or "")
    if os.path.exists(p["blessing"]) and json.load(open(p["blessing"])).get("model_checkpoint") == checkpoint:
        say(f"daily bless: {day}'s model ({checkpoint}) was judged already; keeping that verdict")
        return 0
    served = _served_version(dc)
    cfg, _, model = load_trained(p["model"])
    new_metrics = json.load(open(p["metrics"]))
    if served is None:
        verdict = {"blessed": True, "reason": "no model is served yet"}
    elif cfg.model.task == "ranking":
        from features.records import read_single_batch
        sample = pq.read_table(os.path.join(p["pre"], "eval_sample.parquet"))
        batch = read_single_batch(cfg, os.path.join(p["pre"], "eval_sample.tfrecord"))
        labels = sample.column(cfg.label.column).to_numpy(zero_copy_only=False).astype(float)
        new_auc = roc_auc(labels, tf.sigmoid(model(batch))[:, 0].numpy())
        served_auc = _sample_auc_of_saved_model(served, sample)
        ok = new_auc >= served_auc - dc.bless_tolerance
        verdict = {"blessed": bool(ok), "metric": "auc", "new": new_auc, "served": served_auc, "served_version": served,
                   "tolerance": dc.bless_tolerance, "rows": sample.num_rows,
                   "reason": f"new AUC {new_auc:.4f} vs served {served_auc:.4f} on the same {sample.num_rows} eval rows"}
    else:
        meta = json.load(open(os.path.join(served, "assets.extra", "recpipe.json")))
        served_metrics = json.load(open(os.path.join(os.path.dirname(meta["model_dir"]), "metrics.json")))
        new, old = new_metrics["recall_at_10"], served_metrics["recall_at_10"]
        verdict = {"blessed": bool(new >= old - dc.bless_tolerance), "metric": "recall_at_10", "new": new,
                   "served": old, "served_version": served, "tolerance": dc.bless_tolerance,
                   "reason": f"new recall@10 {new:.4f} vs served model's recorded {old:.4f}"}
    verdict["day"] = day
    verdict["model_checkpoint"] = checkpoint
    _write_json(p["blessing"], verdict)
    say(f"daily bless: {'BLESSED' if verdict['blessed'] else 'NOT blessed'}: {verdict['reason']}")
    return 0


def step_push(dc: DailyConfig, day: str, say) -> int:
    from serving.export import existing_versions, export_model
    p = _paths(dc, day)
    verdict = json.load(open(p["blessing"]))
    if not verdict["blessed"]:
        say(f"daily push: {day} not blessed ({verdict['reason']}); the model stays in {p['model']}, not pushed")
        return 0
    model_dir = os.path.abspath(p["model"])
    for v in existing_versions(dc.model_base):
        meta_path = os.path.join(dc.model_base, str(v), "assets.extra", "recpipe.json")
        if os.path.exists(meta_path) and json.load(open(meta_path)).get("model_dir") == model_dir:
            say(f"daily push: {day}'s model is already version {v}; nothing to do")
            return 0
    path = export_model(model_dir, dc.model_base, data_dir=p["pre"])
    say(f"daily push: exported {path}")
    return 0


def run_step(step: str, project: str, day: str, say: Callable[[str], None] = print) -> int:
    dc = load_daily_config(project)
    day = _day(day)
    return {"ready": step_ready, "preprocess": step_preprocess, "train": step_train, "evaluate": step_evaluate,
            "bless": step_bless, "push": step_push}[step](dc, day, say)
