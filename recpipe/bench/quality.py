"""Eval quality on the shared real Criteo sample's time split: DCN-v2 under each strategy, and
logistic regression, trained by `recpipe train` and scored by `recpipe evaluate`."""
from __future__ import annotations

import json
import os
import subprocess
from typing import Callable

import yaml

from recpipe.bench.common import CLI, preprocess_once
from recpipe.bench.train_runs import TrainRuns
from recpipe.samples import repo_configs

__all__ = ["criteo_quality"]


def criteo_quality(criteo_csv: str, work: str, say: Callable[[str], None], quick: bool = False) -> dict:
    """Eval AUC on the shared Criteo sample's time split: DCN-v2 with each strategy, and logistic regression."""
    cfg_path = str(repo_configs() / "criteo.yaml")
    with open(cfg_path) as fh:
        base = yaml.safe_load(fh)
    parquet = os.path.join(work, "criteo_parquet")
    if not os.path.isdir(parquet):
        subprocess.run([*CLI, "criteo-to-parquet", "--csv", criteo_csv, "--output", parquet], check=True,
                       capture_output=True)
    pre = preprocess_once(cfg_path, parquet, os.path.join(work, "criteo_pre"))
    steps = base["train"]["steps"] if not quick else 100
    runs = TrainRuns(work, 1, say)
    lr = runs.config("criteo_logistic", base, model={"task": "ranking", "type": "logistic"})
    out = {}
    for name, cfg, flags in (("local", cfg_path, ()), ("logistic", lr, ()),
                             ("ps", cfg_path, ("--strategy", "ps")),
                             ("horovod", cfg_path, ("--strategy", "horovod", "--np", "2"))):
        runs.run(f"criteo_{name}", pre, cfg, steps, *flags, keep=True)
        model_dir = os.path.join(work, "models", f"criteo_{name}-0")
        ev = subprocess.run([*CLI, "evaluate", "--model-dir", model_dir, "--data", pre], check=True,
                            capture_output=True, text=True).stdout
        metrics = json.loads(ev.strip().splitlines()[-1])
        out[name] = {"auc": metrics["auc"], "logloss": metrics["logloss"], "eval_rows": metrics["examples"],
                     "steps": steps, "examples_per_s": runs.median(f"criteo_{name}")}
        say(f"bench train: criteo {name}: AUC {metrics['auc']:.4f} logloss {metrics['logloss']:.4f}")
    return out
