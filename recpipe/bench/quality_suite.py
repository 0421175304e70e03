"""`recpipe bench quality`: does the shipped ranking default beat the baselines a modeller would try
first, on the real Criteo sample, by more than the run-to-run spread?

Same time split for every model (configs/criteo.yaml: the last 10 % eval, the 10 % before it
validation): the default model and the project's own `logistic` model over several seeds (mean ±
sd of eval AUC, each at its best checkpoint on validation), and scikit-learn's LogisticRegression on
a one-hot of the same IDs with C chosen on validation (deterministic). Ratio keys: the default's
AUC margin over each baseline divided by the spread (the combined sd of the two).
"""
from __future__ import annotations

import copy
import json
import math
import os
import statistics
import subprocess
from typing import Callable

import yaml

from features.config import load_config
from recpipe.bench.common import CLI, preprocess_once
from recpipe.bench.sklearn_peer import sklearn_logistic
from recpipe.samples import find_criteo_sample, repo_configs

__all__ = ["bench_quality", "markdown"]

MIN_SPREAD = 1e-3  # a margin is never judged against less than this (one seed, or identical runs)


def _train_and_evaluate(work: str, name: str, cfg: dict, data: str, seed: int, steps: int | None) -> dict:
    cfg = copy.deepcopy(cfg)
    cfg["train"]["seed"] = seed
    model_dir = os.path.join(work, "models", f"{name}-{seed}")
    subprocess.run(["rm", "-rf", model_dir], check=True)
    os.makedirs(model_dir)
    path = os.path.join(work, f"{name}-{seed}.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(cfg, fh)
    flags = ["--steps", str(steps)] if steps else []
    subprocess.run([*CLI, "train", "--data", data, "--model-dir", model_dir, "--config", path, *flags], check=True,
                   capture_output=True)
    out = subprocess.run([*CLI, "evaluate", "--model-dir", model_dir, "--data", data], check=True,
                         capture_output=True, text=True).stdout
    metrics = json.loads(out.strip().splitlines()[-1])
    with open(os.path.join(model_dir, "validation.json")) as fh:
        validation = json.load(fh)
    return {"auc": metrics["auc"], "logloss": metrics["logloss"], "best_step": validation["best_step"],
            "validation_auc": validation["best"], "stopped_early_at": validation["stopped_early_at"]}


def _summary(runs: list[dict]) -> dict:
    aucs = [r["auc"] for r in runs]
    return {"auc_mean": statistics.fmean(aucs), "auc_sd": statistics.pstdev(aucs) if len(aucs) > 1 else 0.0,
            "logloss_mean": statistics.fmean(r["logloss"] for r in runs), "runs": runs}


def _margin_over_spread(a: dict, b: dict) -> float:
    spread = max(math.hypot(a["auc_sd"], b["auc_sd"]), MIN_SPREAD)
    return (a["auc_mean"] - b["auc_mean"]) / spread


def bench_quality(work: str, say: Callable[[str], None], quick: bool = False, seeds: int = 3) -> dict:
    criteo = find_criteo_sample()
    if criteo is None:
        raise FileNotFoundError("bench quality: the real Criteo sample (../shared/data/criteo_sample) is missing")
    cfg_path = str(repo_configs() / "criteo.yaml")
    with open(cfg_path) as fh:
        base = yaml.safe_load(fh)
    parquet = os.path.join(work, "criteo_parquet")
    if not os.path.isdir(parquet):
        subprocess.run([*CLI, "criteo-to-parquet", "--csv", str(criteo), "--out", parquet], check=True,
                       capture_output=True)
    data = preprocess_once(cfg_path, parquet, os.path.join(work, "criteo_pre"))
    logistic = copy.deepcopy(base)
    logistic["model"] = {"task": "ranking", "type": "logistic"}
    steps = 100 if quick else None
    seed_list = list(range(1, 2 if quick else seeds + 1))
    models = {}
    for name, cfg in (("default", base), ("logistic", logistic)):
        runs = [_train_and_evaluate(work, name, cfg, data, s, steps) for s in seed_list]
        models[name] = _summary(runs)
        say(f"bench quality: criteo {name} ({base['model']['type'] if name == 'default' else 'logistic'}): eval AUC "
            f"{models[name]['auc_mean']:.4f} ± {models[name]['auc_sd']:.4f} over {len(runs)} seed(s)")
    sk = sklearn_logistic(load_config(cfg_path), data)
    models["sklearn_logistic"] = {"auc_mean": sk["auc"], "auc_sd": 0.0, "logloss_mean": sk["logloss"], "fit": sk}
    say(f"bench quality: criteo scikit-learn LogisticRegression (C={sk['C']} on validation): eval AUC {sk['auc']:.4f}")
    d = models["default"]
    ratios = {"quality_criteo_margin_over_spread_vs_logistic": _margin_over_spread(d, models["logistic"]),
              "quality_criteo_margin_over_spread_vs_sklearn_lr": _margin_over_spread(d, models["sklearn_logistic"])}
    dataset = {"criteo": str(criteo), "config": cfg_path, "seeds": seed_list, "steps": steps or base["train"]["steps"]}
    return {"suite": "quality", "quick": quick, "dataset": dataset, "criteo": models, "ratios": ratios}


def markdown(r: dict) -> str:
    c = r["criteo"]
    lines = ["# bench quality", "",
             f"Real Criteo sample, time split of `configs/criteo.yaml` (train / validation / eval by row order), "
             f"seeds {r['dataset']['seeds']}, each model at its best checkpoint on validation.", "",
             "| model | eval AUC (mean ± sd) | logloss |", "|---|---|---|",
             *[f"| {name} | {m['auc_mean']:.4f} ± {m['auc_sd']:.4f} | {m['logloss_mean']:.4f} |"
               for name, m in c.items()],
             "", "| ratio (AUC margin ÷ spread) | value |", "|---|---|",
             *[f"| {k} | {v:.2f} |" for k, v in sorted(r["ratios"].items())], "",
             "Reproduce: `.venv/bin/recpipe bench quality`.", ""]
    return "\n".join(lines)
