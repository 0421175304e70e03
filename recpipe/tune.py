"""`recpipe tune`: search the config space declared under `tune:` on the validation split.

Each trial is a full `recpipe train` (any strategy: the run flags are passed through) in its own
model dir, scored by the best checkpoint on validation (recpipe.trainers.evaluation.validation), so the eval split is
never read. Optuna's TPE sampler proposes the trials (seeded: a rerun proposes the same ones).
Writes OUT/trials.csv and OUT/trials.md (one row per trial: its values, score and best step) and
OUT/best.yaml (the config with the best trial's values), and says which trial won.

Optuna rather than Keras Tuner: Keras Tuner tunes a Keras model built in-process by a hypermodel
function, and its releases have slowed; a trial here is a whole training run under any strategy (PS
and Horovod are separate processes), which Optuna's ask/tell API drives directly, and Optuna is
actively maintained.
"""
from __future__ import annotations

import copy
import csv
import os
import shutil
from typing import Any, Callable

import yaml

from recpipe.common.typed_yaml import read_yaml
from recpipe.features.config import ConfigError, TuneParam, parse_config
from recpipe.common.errors import RecpipeError
from recpipe.features.preprocessed import PreprocessedData
from recpipe.trainers.evaluation.scoring import HIGHER_IS_BETTER
from recpipe.trainers.selection import selection_metric, train_subprocess

__all__ = ["TuneError", "tune", "with_values"]


class TuneError(RecpipeError, RuntimeError):
    pass


def with_values(base: dict, values: dict[str, Any]) -> dict:
    """A copy of the config mapping with each dotted key set (sections created as needed)."""
    out = copy.deepcopy(base)
    for key, value in values.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"tune: {key}: {p!r} is not a section")
        node[leaf] = value
    return out


def _suggest(trial, p: TuneParam):
    if p.choices is not None:
        picked = trial.suggest_categorical(p.key, [yaml.safe_dump(c, default_flow_style=True).strip()
                                                   for c in p.choices])
        return yaml.safe_load(picked)  # choices may be lists or mappings: Optuna keeps them as YAML text
    if p.integer:
        return trial.suggest_int(p.key, int(p.low), int(p.high), log=p.log)
    return trial.suggest_float(p.key, p.low, p.high, log=p.log)


def tune(config_path: str, data_dir: str, out_dir: str, trials: int | None = None, train_flags: tuple = (),
         say: Callable[[str], None] = print) -> dict:
    import optuna

    base = read_yaml(config_path)
    cfg = parse_config(base)
    spec = cfg.tune
    if not spec.params:
        raise TuneError(f"{config_path}: declare the search space under tune.params "
                        f"(e.g. - {{key: model.dropout, low: 0.0, high: 0.5}})")
    if not PreprocessedData(data_dir).transform().row_counts.get("validation"):
        raise TuneError(f"{data_dir}: no validation split to tune on (preprocess with split.validation_fraction > 0)")
    metric = selection_metric(cfg)
    n = trials or spec.trials
    os.makedirs(out_dir, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if HIGHER_IS_BETTER[metric] else "minimize",
                                sampler=optuna.samplers.TPESampler(seed=spec.seed))
    rows: list[dict] = []
    for i in range(n):
        trial = study.ask()
        values = {p.key: _suggest(trial, p) for p in spec.params}
        trial_cfg = with_values(base, values)
        try:
            parse_config(trial_cfg)
        except ConfigError as e:
            raise TuneError(f"{config_path}: trial {i} sets {values}: {e}") from None
        trial_dir = os.path.join(out_dir, "trials", f"{i:03d}")
        model_dir = os.path.join(trial_dir, "model")
        shutil.rmtree(trial_dir, ignore_errors=True)  # a rerun of `tune` starts its trials afresh
        os.makedirs(trial_dir)
        cfg_file = os.path.join(trial_dir, "config.yaml")
        with open(cfg_file, "w") as fh:
            yaml.safe_dump(trial_cfg, fh, sort_keys=False)
        run = train_subprocess(f"trial {i}", cfg_file, data_dir, model_dir, list(train_flags), lambda _: None)
        if run.validation is None:
            why = run.status[len("failed: "):]
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            rows.append({"trial": i, **values, metric: None, "best_step": None, "status": run.status})
            say(f"tune: trial {i}: {values}: FAILED ({why})")
            continue
        study.tell(trial, run.validation)
        rows.append({"trial": i, **values, metric: run.validation, "best_step": run.best_step, "status": "ok"})
        say(f"tune: trial {i}: {values}: validation {metric} {run.validation:.4f} at step {run.best_step}")
    done = [r for r in rows if r["status"] == "ok"]
    if not done:
        raise TuneError(f"every trial failed; see {out_dir}/trials.md")
    best = study.best_trial.number
    winner = next(r for r in rows if r["trial"] == best)
    best_cfg = with_values(base, {p.key: winner[p.key] for p in spec.params})
    with open(os.path.join(out_dir, "best.yaml"), "w") as fh:
        yaml.safe_dump(best_cfg, fh, sort_keys=False)
    _write_table(out_dir, rows, [p.key for p in spec.params], metric)
    say(f"tune: best trial {best}: validation {metric} {winner[metric]:.4f} -> {out_dir}/best.yaml")
    return {"metric": metric, "best_trial": best, "best": winner, "trials": rows}


def _write_table(out_dir: str, rows: list[dict], keys: list[str], metric: str) -> None:
    columns = ["trial", *keys, metric, "best_step", "status"]
    with open(os.path.join(out_dir, "trials.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, columns)
        w.writeheader()
        w.writerows(rows)

    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else "" if v is None else str(v)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
             *["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]]
    with open(os.path.join(out_dir, "trials.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
