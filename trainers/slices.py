"""Per-slice evaluation: the eval metric per value (or per train-activity bucket) of a sparse feature.

A slice is declared in the config's `evaluate.slices`: `{feature: NAME, by: value}` groups rows by the
feature's value (its `top` most frequent values in the split, the rest "other"); `{feature: NAME,
by: activity}` by how often the value occurs in train (the vocabulary counts the Beam job keeps):
"unseen", "1", "2-3", "4-7", ... (e.g. per user-activity bucket). Ranking slices report AUC and
logloss, retrieval slices recall@10.
"""
from __future__ import annotations

import numpy as np

from features.artifact import TransformArtifact
import dataclasses

from features.config import Config, ConfigError, EvaluateSpec, SliceSpec, check_config, literal_choices
from trainers.metrics import log_loss, recall_at_k, roc_auc

__all__ = ["slice_labels", "ranking_slices", "retrieval_slices", "slice_name", "parse_slice", "check_slices"]


def parse_slice(text: str) -> SliceSpec:
    """FEATURE[:value|activity[:TOP]] (the CLI's --slice) -> a SliceSpec."""
    parts = text.split(":")
    by = parts[1] if len(parts) > 1 else "value"
    if by not in literal_choices(SliceSpec, "by") or len(parts) > 3 or (len(parts) == 3 and not parts[2].isdigit()):
        raise ConfigError(f"--slice {text!r}: expected FEATURE[:value|activity[:TOP]]")
    return SliceSpec(parts[0], by, int(parts[2]) if len(parts) == 3 else 10)


def check_slices(cfg: Config, slices: list[SliceSpec]) -> Config:
    """cfg with these slices as its evaluate.slices, validated like a config's."""
    return check_config(dataclasses.replace(cfg, evaluate=EvaluateSpec(list(slices))))


def slice_name(spec: SliceSpec) -> str:
    return f"{spec.feature} by {spec.by}"


def _activity_bucket(count: int) -> str:
    if count <= 0:
        return "unseen"
    lo = 1 << (int(count).bit_length() - 1)
    return str(lo) if lo == 1 else f"{lo}-{2 * lo - 1}"


def slice_labels(cfg: Config, artifact: TransformArtifact, spec: SliceSpec, ids: np.ndarray) -> np.ndarray:
    """The slice each row (by its ID of spec.feature) falls in, as strings."""
    owner = cfg.table_owner(cfg.sparse_by_name[spec.feature])
    vocab = artifact.vocabularies.get(owner.name) if owner.vocab is not None else None
    if spec.by == "activity":
        counts = np.asarray(artifact.vocab_counts.get(owner.name, []), dtype=np.int64)
        per_row = np.where(ids < len(counts), counts[np.minimum(ids, max(len(counts) - 1, 0))] if len(counts)
                           else 0, 0)
        return np.array([_activity_bucket(c) for c in per_row.tolist()], dtype=object)
    values, freq = np.unique(ids, return_counts=True)
    top = set(values[np.argsort(-freq, kind="stable")[:spec.top]].tolist())

    def label(i: int) -> str:
        if i not in top:
            return "other"
        if vocab is None:
            return f"#{i}"
        return vocab[i] if i < len(vocab) else f"OOV bucket {i - len(vocab)}"
    return np.array([label(i) for i in ids.tolist()], dtype=object)


def _order(labels: np.ndarray) -> list[str]:
    """Slices in a readable order: activity buckets by size, values by rows (other last)."""
    names, rows = np.unique(labels, return_counts=True)
    def key(item):
        name, n = item
        if name == "unseen":
            return (0, 0, "")
        first = name.split("-")[0]
        if first.isdigit() and (name == first or name[len(first)] == "-"):
            return (1, int(first), "")
        return (2 if name != "other" else 3, -n, name)
    return [n for n, _ in sorted(zip(names.tolist(), rows.tolist()), key=key)]


def ranking_slices(labels: np.ndarray, y: np.ndarray, p: np.ndarray) -> list[dict]:
    out = []
    for name in _order(labels):
        m = labels == name
        out.append({"slice": name, "rows": int(m.sum()), "positive_rate": float(y[m].mean()),
                    "auc": roc_auc(y[m], p[m]), "logloss": log_loss(y[m], p[m])})
    return out


def retrieval_slices(labels: np.ndarray, ranks: np.ndarray, k: int = 10) -> list[dict]:
    return [{"slice": name, "rows": int((labels == name).sum()),
             f"recall_at_{k}": recall_at_k(ranks[labels == name], k)} for name in _order(labels)]
