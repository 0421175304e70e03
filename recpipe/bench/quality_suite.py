"""`recpipe bench quality`: do the shipped defaults beat the baselines a modeller would try first, on
real logs, by more than the run-to-run spread?

Ranking, the real Criteo sample:
Same time split for every model (configs/criteo.yaml: the last 10 % eval, the 10 % before it
validation): the default model and the project's own `logistic` model over several seeds (mean ±
sd of eval AUC, each at its best checkpoint on validation), scikit-learn's LogisticRegression on
a one-hot of the same IDs with C chosen on validation (deterministic), and LightGBM with native categoricals,
its grid chosen on validation and early stopping on validation AUC, over the same seeds
(recpipe.bench.lightgbm_peer). Ratio keys: the default's AUC margin over each logistic baseline divided by the
spread (the combined sd of the two), and its mean AUC over LightGBM's.

The same for a second real ranking log of another schema: MovieLens-100K's six categorical columns
(recpipe.pipeline.movielens, configs/movielens.yaml: the Criteo model and train sections but the learning rate).

Retrieval, on the real Instacart sample (recpipe.pipeline.instacart; leave-last-out per user) and on
MovieLens-100K (users with attributes, movies with genres; time split): the config's model over seeds (both
configs name no type: `recpipe train` keeps the two towers or item_to_item on validation) against the
most-popular and co-occurrence baselines on the same split, recall@10 against every candidate, and again on the rows whose candidate is new to the user, with the user's earlier ones
removed; beside them the peers a practitioner would run, learnt from the train clicks and tuned on
validation's seen-excluded recall@10: EASE (closed-form item-item, the evaluation's own `baselines.ease`,
recpipe.trainers.evaluation.ease) and implicit's ALS over seeds (recpipe.bench.als_peer). Ratio keys: the
model's recall@10 over popularity's, and their seen-excluded recall@10 over EASE's and ALS's.

The peers that are not numpy (LightGBM, implicit) run in an environment of their own (recpipe.bench.peer_env),
created once and cached: the project's stack does not change.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import os
import statistics
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import yaml

from recpipe.features.config import load_config
from recpipe.bench.als_peer import ALS_GRID, QUICK_ALS_GRID, als_peer
from recpipe.bench.common import CLI, TF_IN_PROCESS, evaluate_model, preprocess_once
from recpipe.bench.lightgbm_peer import GRID as LIGHTGBM_GRID
from recpipe.bench.lightgbm_peer import QUICK_GRID as QUICK_LIGHTGBM_GRID
from recpipe.bench.lightgbm_peer import lightgbm_peer
from recpipe.bench.peer_clicks import read_peer_clicks, recall_summary
from recpipe.bench.peer_env import PEER_REQUIREMENTS, ensure_peer_env
from recpipe.bench.report import kept_types
from recpipe.bench.sklearn_peer import C_GRID, sklearn_logistic
from recpipe.samples import find_criteo_sample, repo_configs

__all__ = ["bench_quality", "markdown"]

# quick: the C values the logs' validation splits chose (criteo 0.1, movielens 0.3) and one more
QUICK_C_GRID = (0.1, 0.3, 1.0)
MIN_SPREAD = 1e-3  # a margin is never judged against less than this (one seed, or identical runs)
# retrieval baselines (recpipe.trainers.evaluation.scoring.baselines); history co-occurrence only with a history feature
BASELINES = ("most_popular", "cooccurrence", "history_cooccurrence")


def _train_and_evaluate(work: str, name: str, cfg: dict, data: str, seed: int, steps: int | None) -> dict:
    """Train one seed (`recpipe train`, its own process) and evaluate it as `recpipe evaluate` does: the eval
    metrics (and their baselines) and the validation history."""
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
    metrics = evaluate_model(model_dir, data)
    with open(os.path.join(model_dir, "validation.json")) as fh:
        validation = json.load(fh)
    kept = metrics.get("selection", {}).get("winner") or cfg["model"].get("type")  # model.type auto: the winner
    return {**metrics, "best_step": validation["best_step"], "validation_best": validation["best"],
            "stopped_early_at": validation["stopped_early_at"], "kept": kept}


def _ranking_run(work: str, name: str, cfg: dict, data: str, seed: int, steps: int | None) -> dict:
    m = _train_and_evaluate(work, name, cfg, data, seed, steps)
    return {"auc": m["auc"], "logloss": m["logloss"], "best_step": m["best_step"],
            "validation_auc": m["validation_best"],
            "stopped_early_at": m["stopped_early_at"]}


def _summary(runs: list[dict]) -> dict:
    aucs = [r["auc"] for r in runs]
    return {"auc_mean": statistics.fmean(aucs), "auc_sd": statistics.pstdev(aucs) if len(aucs) > 1 else 0.0,
            "logloss_mean": statistics.fmean(r["logloss"] for r in runs), "runs": runs}


def _margin_over_spread(a: dict, b: dict) -> float:
    spread = max(math.hypot(a["auc_sd"], b["auc_sd"]), MIN_SPREAD)
    return (a["auc_mean"] - b["auc_mean"]) / spread


def _ranking(work: str, say: Callable[[str], None], name: str, cfg_path: str, log: str, seed_list: list[int],
             steps: int | None, quick: bool = False) -> dict:
    """The config's model and our logistic model over seeds, scikit-learn's on the same split (C chosen from
    a grid on validation) and LightGBM over the same seeds (its grid chosen on validation); quick: smaller
    grids."""
    with open(cfg_path) as fh:
        base = yaml.safe_load(fh)
    data = preprocess_once(cfg_path, log, os.path.join(work, f"{name}_pre"))
    logistic = copy.deepcopy(base)
    logistic["model"] = {"task": "ranking", "type": "logistic"}
    models = {}
    for label, cfg in (("default", base), ("logistic", logistic)):
        runs = [_ranking_run(work, f"{name}-{label}", cfg, data, s, steps) for s in seed_list]
        models[label] = _summary(runs)
        say(f"bench quality: {name} {label} ({cfg['model']['type']}): eval AUC {models[label]['auc_mean']:.4f} ± "
            f"{models[label]['auc_sd']:.4f} over {len(runs)} seed(s)")
    sk = sklearn_logistic(load_config(cfg_path), data, QUICK_C_GRID if quick else C_GRID)
    models["sklearn_logistic"] = {"auc_mean": sk["auc"], "auc_sd": 0.0, "logloss_mean": sk["logloss"], "fit": sk}
    say(f"bench quality: {name} scikit-learn LogisticRegression (C={sk['C']} on validation): eval AUC {sk['auc']:.4f}")
    lgb = lightgbm_peer(load_config(cfg_path), data, os.path.join(work, f"{name}_lightgbm"), seed_list,
                        QUICK_LIGHTGBM_GRID if quick else LIGHTGBM_GRID, say=say)
    models["lightgbm"] = lgb
    say(f"bench quality: {name} LightGBM ({_chosen(lgb['params'])} on validation): eval AUC {lgb['auc_mean']:.4f} ± "
        f"{lgb['auc_sd']:.4f} over {len(lgb['runs'])} seed(s)")
    return models


def _chosen(params: dict) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in params.items())


def _als(work: str, say: Callable[[str], None], name: str, cfg_path: str, data: str, seed_list: list[int],
         quick: bool) -> dict:
    """{"als": ALS on the retrieval log}, or {} when it has no query key (ALS learns from each query's clicks)."""
    with TF_IN_PROCESS:  # tf.data in this process, beside the suite's other threads
        clicks = read_peer_clicks(load_config(cfg_path), data)
    if clicks is None:
        say(f"bench quality: {name} has no query key: no ALS")
        return {}
    als = als_peer(clicks, os.path.join(work, f"{name}_als"), seed_list, QUICK_ALS_GRID if quick else ALS_GRID,
                   say=say)
    say(f"bench quality: {name} ALS ({_chosen(als['config'])} on validation): seen-excluded recall@10 "
        f"{als['new_recall_at_10_mean']:.4f} ± {als['new_recall_at_10_sd']:.4f} over {len(als['runs'])} seed(s)")
    return {"als": als}


def _ease(b: dict) -> dict:
    """The evaluation's EASE baseline as the bench reports it: {"ease": figures}, {"ease_skipped": why} or {}."""
    if "ease" not in b:
        return {}
    e = b["ease"]
    if "skipped" in e:
        return {"ease_skipped": e["skipped"]}
    return {"ease": {**recall_summary(e), "lambda": e["lambda"],
                     "validation_new_recall_at_10": e["validation_seen_excluded_recall_at_10"][str(e["lambda"])]}}


def _retrieval(work: str, say: Callable[[str], None], name: str, cfg_path: str, log: str, seed_list: list[int],
               steps: int | None, quick: bool = False) -> dict:
    """The config's model (for type auto, the candidate kept on validation) over seeds against the most-popular
    and co-occurrence baselines and the EASE and ALS peers, recall@10 over every candidate, again on the rows whose candidate is new to the user
    (`new_*`), and on the rows whose user clicked anything before the split (`history_*`; the rest are
    cold-start users). `ease_applies`: a per-user (leave-last-out) split with a query key."""
    with open(cfg_path) as fh:
        cfg = yaml.safe_load(fh)
    data = preprocess_once(cfg_path, log, os.path.join(work, f"{name}_pre"))
    runs = [_train_and_evaluate(work, name, cfg, data, s, steps) for s in seed_list]

    def stats(key: str, values: list[float]) -> dict:
        return {f"{key}_mean": statistics.fmean(values),
                f"{key}_sd": statistics.pstdev(values) if len(values) > 1 else 0.0}

    def history(r: dict) -> float:  # recall@10 on the rows whose user clicked before (nan: no such row)
        return r["with_history"].get("recall_at_10", float("nan"))
    model = {**stats("recall_at_10", [r["recall_at_10"] for r in runs]),
             **stats("new_recall_at_10", [r["seen_excluded"]["recall_at_10"] for r in runs]),
             **stats("history_recall_at_10", [history(r) for r in runs]),
             "runs": [{**{k: r[k] for k in ("recall_at_10", "recall_at_100", "ndcg_at_10", "best_step",
                                            "stopped_early_at", "kept")},
                       "new_recall_at_10": r["seen_excluded"]["recall_at_10"],
                       "history_recall_at_10": history(r)} for r in runs]}
    b = runs[0]["baselines"]  # deterministic: the same for every seed
    out = {"model": model, "examples": runs[0]["examples"],
           "new_examples": runs[0]["seen_excluded"]["examples"],
           "history_examples": runs[0]["with_history"]["examples"], "candidates": runs[0]["candidates"],
           "config": cfg_path}
    for baseline in [k for k in BASELINES if k in b]:
        out[baseline] = recall_summary(b[baseline])
    out.update(_ease(b))
    out.update(_als(work, say, name, cfg_path, data, seed_list, quick))
    out["ease_applies"] = "ease" in out and load_config(cfg_path).split.by == "user"
    say(f"bench quality: {name} {kept_types(model)} recall@10 {model['recall_at_10_mean']:.4f} ± "
        f"{model['recall_at_10_sd']:.4f} over {len(runs)} seed(s); most popular "
        f"{out['most_popular']['recall_at_10']:.4f}, co-occurrence {out['cooccurrence']['recall_at_10']:.4f}"
        + (f", history co-occurrence {out['history_cooccurrence']['recall_at_10']:.4f}"
           if "history_cooccurrence" in out else ""))
    return out


def bench_quality(work: str, say: Callable[[str], None], quick: bool = False, seeds: int = 3) -> dict:
    from recpipe.pipeline.instacart import instacart_to_parquet
    from recpipe.pipeline.movielens import movielens_to_parquet
    criteo = find_criteo_sample()
    if criteo is None:
        raise FileNotFoundError("bench quality: the real Criteo sample (../shared/data/criteo_sample) is missing")
    logs = {"criteo": os.path.join(work, "criteo_parquet"), "movielens": os.path.join(work, "movielens_parquet"),
            "instacart": os.path.join(work, "instacart_parquet")}
    if not os.path.isdir(logs["criteo"]):
        subprocess.run([*CLI, "criteo-to-parquet", "--csv", str(criteo), "--output", logs["criteo"]], check=True,
                       capture_output=True)
    if not os.path.isdir(logs["movielens"]):
        movielens_to_parquet(logs["movielens"], say=say)
    if not os.path.isdir(logs["instacart"]):
        instacart_to_parquet(logs["instacart"], say=say)
    configs = repo_configs()
    steps = 100 if quick else None
    seed_list = list(range(1, 2 if quick else seeds + 1))
    ensure_peer_env(say=say)  # once, before the jobs that run the peers in it
    # the four datasets two at a time: their runs are separate processes that report AUC and recall, not
    # speed, and one after another they left a core idle through each process's start-up
    rank_job, retrieval_job = (functools.partial(fn, quick=quick) for fn in (_ranking, _retrieval))
    jobs = {"criteo": (rank_job, "criteo"), "movielens": (rank_job, "movielens"),
            "instacart": (retrieval_job, "instacart"), "movielens_retrieval": (retrieval_job, "movielens")}
    with ThreadPoolExecutor(2) as pool:
        started = {name: pool.submit(fn, work, say, name, str(configs / f"{name}.yaml"), logs[log], seed_list, steps)
                   for name, (fn, log) in jobs.items()}
        done = {name: job.result() for name, job in started.items()}
    ranking = {name: done[name] for name in ("criteo", "movielens")}
    retrieval = {name: done[name] for name in ("instacart", "movielens_retrieval")}
    ratios = {}
    for name, models in ranking.items():
        for peer, key in (("logistic", "logistic"), ("sklearn_logistic", "sklearn_lr")):
            ratios[f"quality_{name}_margin_over_spread_vs_{key}"] = _margin_over_spread(models["default"], models[peer])
        ratios[f"quality_{name}_auc_vs_lightgbm"] = models["default"]["auc_mean"] / models["lightgbm"]["auc_mean"]
    for name, r in retrieval.items():
        ratios[f"quality_{name}_recall10_vs_popularity"] = (r["model"]["recall_at_10_mean"] /
                                                            r["most_popular"]["recall_at_10"])
        new = r["model"]["new_recall_at_10_mean"]  # seen-excluded: under leave-last-out plain rewards repeats
        if "ease" in r:
            ratios[f"quality_{name}_recall10_vs_ease"] = _ratio(new, r["ease"]["new_recall_at_10"])
        if "als" in r:
            ratios[f"quality_{name}_recall10_vs_als"] = _ratio(new, r["als"]["new_recall_at_10_mean"])
    dataset = {"criteo": str(criteo), "seeds": seed_list, "steps": steps or "the configs' train.steps",
               "peer_requirements": list(PEER_REQUIREMENTS)}
    return {"suite": "quality", "quick": quick, "dataset": dataset, "ranking": ranking, "retrieval": retrieval,
            "ratios": ratios}


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")  # nan: written as null, a missed target


_SOURCES = {"criteo": "real Criteo sample, `configs/criteo.yaml`: train / validation / eval by row order",
            "movielens": "real MovieLens-100K, six categorical columns, the movie's genres and the user's last 10 "
                         "rated movies (logged with each rating), rating ≥ 4 as the label, `configs/movielens.yaml` "
                         "(the Criteo model and train sections but the learning rate, and the two list features, "
                         "chosen on validation): split by time",
            "instacart": "real Instacart sample, `configs/instacart.yaml`: each user's last order as eval",
            "movielens_retrieval": "real MovieLens-100K, users with 3 attributes and the movies they rated last "
                                   "(logged with each rating), movies with their genre list, rating ≥ 4 as the click, "
                                   "`configs/movielens_retrieval.yaml`: the last 10 % by time as eval"}


def _tuned(label: str, m: dict) -> str:
    """What a ranking model chose on validation, for the table."""
    if label == "sklearn_logistic":
        return f"C {m['fit']['C']:g}"
    if label == "lightgbm":
        rounds = statistics.fmean(run["best_iteration"] for run in m["runs"])
        return f"{_chosen(m['params'])}; {rounds:.0f} rounds"
    return "best checkpoint"


def _peer_rows(i: dict) -> list[str]:
    """The retrieval table's EASE and ALS rows (those the log has)."""
    rows = []
    if "ease" in i:
        e = i["ease"]
        rows.append(f"| EASE (λ {e['lambda']:g}) | {e['recall_at_10']:.4f} | {e['new_recall_at_10']:.4f} | "
                    f"{e['history_recall_at_10']:.4f} |")
    if "als" in i:
        a = i["als"]

        def pm(key: str) -> str:
            return f"{a[f'{key}_mean']:.4f} ± {a[f'{key}_sd']:.4f}"
        rows.append(f"| ALS ({_chosen(a['config'])}) | {pm('recall_at_10')} | {pm('new_recall_at_10')} | "
                    f"{pm('history_recall_at_10')} |")
    return rows


_PEERS_TEXT = ("Peers, each tuned on the validation split only: **LightGBM** on the same features (each single-valued "
               "sparse feature's ID a native categorical column, dense features as transformed, a list feature as "
               "its length), a grid of num_leaves × learning_rate × min_data_in_leaf with early stopping on "
               "validation AUC, then the chosen values over the seeds (bagging and feature_fraction 0.8). **EASE** "
               "(`recpipe evaluate`'s `baselines.ease`): the closed-form item-item model fitted on the train "
               "clicks, λ chosen on validation's seen-excluded recall@10. **ALS** (implicit): factors × "
               "regularization × alpha chosen the same way, then over the seeds. EASE and ALS score a query from "
               "its clicks before the split (train and validation for eval); a query without any gets the "
               "most-popular ranking. LightGBM and implicit run in an environment of their own "
               "(`recpipe.bench.peer_env`).")


def markdown(r: dict) -> str:
    lines = ["# bench quality", "",
             f"Seeds {r['dataset']['seeds']}; every model at its best checkpoint on its validation split (the eval "
             f"split is read once).", "", _PEERS_TEXT, ""]
    for name, models in r["ranking"].items():
        lines += [f"## {name} (ranking)", "", _SOURCES.get(name, name) + ".", "",
                  "| model | eval AUC (mean ± sd) | logloss | chosen on validation |", "|---|---|---|---|",
                  *[f"| {label} | {m['auc_mean']:.4f} ± {m['auc_sd']:.4f} | {m['logloss_mean']:.4f} | "
                    f"{_tuned(label, m)} |" for label, m in models.items()], ""]
    for name, i in r["retrieval"].items():
        t = i["model"]
        lines += [f"## {name} (retrieval)", "",
                  f"{_SOURCES.get(name, name)}: {i['examples']} clicked eval rows ranked against all "
                  f"{i['candidates']} candidates; \"new only\": the {i['new_examples']} rows whose candidate the user "
                  f"had not clicked before, with the user's earlier candidates removed; \"users with history\": "
                  f"the {i['history_examples']} rows whose user clicked anything before the eval split (the others "
                  f"are users new to the model). History co-occurrence, where the config has a history feature: "
                  f"candidates co-clicked in train with those in the row's logged history.", "",
                  "| model | recall@10 | recall@10, new only | recall@10, users with history |", "|---|---|---|---|",
                  f"| the config ({kept_types(t)}) | {t['recall_at_10_mean']:.4f} ± {t['recall_at_10_sd']:.4f} | "
                  f"{t['new_recall_at_10_mean']:.4f} ± {t['new_recall_at_10_sd']:.4f} | "
                  f"{t['history_recall_at_10_mean']:.4f} ± {t['history_recall_at_10_sd']:.4f} |",
                  *[f"| {b.replace('_', ' ')} | {i[b]['recall_at_10']:.4f} | {i[b]['new_recall_at_10']:.4f} | "
                    f"{i[b]['history_recall_at_10']:.4f} |" for b in BASELINES if b in i], *_peer_rows(i), ""]
    lines += ["| ratio | value |", "|---|---|",
              *[f"| {k} | {v:.3f} |" for k, v in sorted(r["ratios"].items())], "",
              "Ratios: `*_margin_over_spread_*`: the config's eval AUC margin over the baseline ÷ the combined sd; "
              "`*_auc_vs_lightgbm`: the config's mean eval AUC ÷ LightGBM's; `*_recall10_vs_popularity`: recall@10 "
              "÷ the most-popular baseline's; `*_recall10_vs_ease` and `*_recall10_vs_als`: the config's model's "
              "seen-excluded recall@10 (\"new only\") ÷ the peer's. The EASE target holds where EASE applies: a "
              "per-user leave-last-out split with a query key"
              + " (" + ", ".join(f"{n}: {'yes' if i.get('ease_applies') else 'no'}" for n, i in r["retrieval"].items())
              + "); ALS is reported without a target.", "",
              "Reproduce: `.venv/bin/recpipe bench quality`.", ""]
    return "\n".join(lines)
