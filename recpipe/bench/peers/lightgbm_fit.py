"""LightGBM on the columns the quality bench exported (recpipe.bench.lightgbm_peer), run in the peer environment.

Every configuration of the request (a grid, e.g. num_leaves x learning_rate x min_data_in_leaf) is fit on train
with early stopping on validation AUC, with the request's first seed; the configuration with the best validation
AUC is kept and fit once per seed (the seed drives bagging and feature_fraction). Writes each seed's validation
and eval probabilities and a JSON report of the trials and the choice. The eval split comes without labels:
nothing here can be chosen on it.

Request (JSON): data (the .npz: x_train, y_train, x_validation, y_validation, x_eval), columns (names),
categorical (indices of the categorical columns), configs ([{param: value}]), seeds, max_rounds,
early_stopping_rounds, threads, predictions (.npz to write), report (.json to write).
"""
from __future__ import annotations

import json
import sys

import numpy as np

# the same for every configuration: subsampling makes the seeds differ; deterministic given a seed
FIXED = {"objective": "binary", "metric": "auc", "feature_fraction": 0.8, "bagging_fraction": 0.8,
         "bagging_freq": 1, "deterministic": True, "force_row_wise": True, "verbosity": -1}


def load_split(path: str, split: str) -> tuple[np.ndarray, np.ndarray | None]:
    """One split of the exported columns.

    Args:
        path: the bench's .npz.
        split: "train", "validation" or "eval".

    Returns:
        (x [rows, columns] float64, y [rows] or None when the split was exported without labels).
    """
    with np.load(path) as z:
        return z[f"x_{split}"], (z[f"y_{split}"] if f"y_{split}" in z.files else None)


def _fit(lgb, request: dict, data: dict, params: dict, seed: int):
    (x_tr, y_tr), (x_va, y_va) = data["train"], data["validation"]
    train = lgb.Dataset(x_tr, label=y_tr, feature_name=request["columns"],
                        categorical_feature=request["categorical"], free_raw_data=False)
    valid = lgb.Dataset(x_va, label=y_va, reference=train)
    booster = lgb.train({**FIXED, **params, "seed": seed, "bagging_seed": seed, "feature_fraction_seed": seed,
                         "num_threads": request["threads"]}, train, num_boost_round=request["max_rounds"],
                        valid_sets=[valid], valid_names=["validation"],
                        callbacks=[lgb.early_stopping(request["early_stopping_rounds"], verbose=False)])
    return booster, int(booster.best_iteration), float(booster.best_score["validation"]["auc"])


def main(argv: list[str]) -> int:
    import lightgbm as lgb
    with open(argv[1]) as fh:
        request = json.load(fh)
    data = {s: load_split(request["data"], s) for s in ("train", "validation", "eval")}
    seeds = request["seeds"]
    trials, best = [], None
    for params in request["configs"]:
        booster, rounds, auc = _fit(lgb, request, data, params, seeds[0])
        trials.append({**params, "best_iteration": rounds, "validation_auc": auc})
        if best is None or auc > best[0]:
            best = (auc, params, booster, rounds)
    _, chosen, booster, rounds = best
    predictions, runs = {}, []
    for seed in seeds:
        if seed != seeds[0]:
            booster, rounds, _ = _fit(lgb, request, data, chosen, seed)
        for split in ("validation", "eval"):
            predictions[f"{split}_{seed}"] = booster.predict(data[split][0], num_iteration=rounds)
        runs.append({"seed": seed, "best_iteration": rounds})
    np.savez(request["predictions"], **predictions)
    with open(request["report"], "w") as fh:
        json.dump({"chosen": chosen, "trials": trials, "runs": runs, "fixed": FIXED, "version": lgb.__version__},
                  fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
