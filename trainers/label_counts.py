"""Whether the train and validation splits hold enough labels to learn from and to score on: a warning per split
too thin, from the per-split positives `recpipe preprocess` counts (the artifact's row_counts["positives"]),
said when training starts. A log with 51 positives in train otherwise trains its 2,000 steps to a validation AUC
below 0.5 without a word.

The thresholds:
- train: fewer than max(MIN_POSITIVES, POSITIVES_PER_FEATURE x the model's input features) of the scarcer label
  (ranking) or of positives (retrieval, which learns from its positive rows only). 10 per feature is the
  events-per-variable floor of logistic regression (Peduzzi et al., J Clin Epidemiol 1996: below about 10
  events per predictor, coefficients are biased and their intervals wrong); a model with an embedding per ID
  has far more weights than features, so this is a floor, not a target, and 100 keeps a config of a few
  features from passing on a few dozen positives.
- validation: fewer than MIN_POSITIVES. Its metric then cannot choose between checkpoints: at AUC 0.5 with P
  positives and N negatives, the AUC's standard error is sqrt((P + N + 1) / (12 P N)) (Hanley & McNeil 1982),
  about 1 / sqrt(12 P) when N >> P: 0.029 at 100 positives, a 95 % interval of +-0.057, wider than what
  separates two checkpoints; a recall@10's is up to 0.5 / sqrt(P), the same 0.05 at 100.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from recpipe.features.schema import Config

__all__ = ["MIN_POSITIVES", "POSITIVES_PER_FEATURE", "input_features", "label_count_warnings"]

MIN_POSITIVES = 100         # below this in train or validation, a warning (see the module's docstring)
POSITIVES_PER_FEATURE = 10  # train: the events-per-variable floor of logistic regression


def input_features(cfg: Config) -> int:
    """How many features the model takes as inputs.

    Args:
        cfg: the config.

    Returns:
        Ranking: every sparse and dense feature; retrieval: those the query and candidate towers list.
    """
    if cfg.model.task == "retrieval":
        return len(cfg.model.query_features) + len(cfg.model.candidate_features)
    return len(cfg.features.sparse) + len(cfg.features.dense)


def _half_width(task: str, scarce: int, other: int) -> float:
    """The 95 % half-width of the validation metric's sampling noise at chance (AUC 0.5) or, for retrieval, at
    the worst recall (0.5)."""
    if task == "retrieval":
        return 1.96 * 0.5 / math.sqrt(scarce)
    return 1.96 * math.sqrt((scarce + other + 1) / (12 * scarce * other)) if other else math.inf


def label_count_warnings(cfg: Config, row_counts: Mapping[str, Any]) -> list[str]:
    """The warnings for a train or validation split with too few labels to learn from or to score on.

    Args:
        cfg: the config trained (its task, and its features for the train threshold).
        row_counts: the preprocessed data's row counts (TransformArtifact.row_counts): the rows per split, and
            "positives": the rows labelled 1 per split (an artifact written before they were counted lacks
            them: then no warning).

    Returns:
        One line per split too thin ("train: WARNING: ..."), naming its counts and the threshold; [] when
        both have enough, or the counts are not known. A split with no rows is left out (an empty train split
        stops training elsewhere; no validation split is no validation).
    """
    positives = row_counts.get("positives") or {}
    task = cfg.model.task
    features = input_features(cfg)
    need = {"train": max(MIN_POSITIVES, POSITIVES_PER_FEATURE * features), "validation": MIN_POSITIVES}
    out = []
    for split in ("train", "validation"):
        rows, pos = int(row_counts.get(split) or 0), positives.get(split)
        if not rows or pos is None:
            continue
        pos, neg = int(pos), rows - int(pos)
        # ranking learns from both labels: the scarcer one is what limits it; retrieval from positives only
        label, scarce, other = ("negatives", neg, pos) if task == "ranking" and neg < pos else ("positives", pos, neg)
        if scarce >= need[split]:
            continue
        counts = f"the {split} split holds {scarce:,} {label} of {rows:,} rows ({100 * scarce / rows:.2f} %)"
        if split == "train":
            why = (f"a {task} model of {features} input feature{'s' if features != 1 else ''} needs at least "
                   f"{need[split]:,} to learn from ({POSITIVES_PER_FEATURE} per feature, {MIN_POSITIVES} at least); "
                   f"it would train its steps and score near chance: preprocess more of the log")
        else:
            metric = "recall@10" if task == "retrieval" else "AUC"
            noise = f"+-{_half_width(task, scarce, other):.2f}" if scarce else "undefined"
            why = (f"fewer than {MIN_POSITIVES}, its {metric} is noise ({noise} at 95 % from sampling alone) and "
                   f"cannot choose between checkpoints: give split.validation_fraction more rows, or preprocess more "
                   f"of the log")
        out.append(f"train: WARNING: {counts}: {why}")
    return out
