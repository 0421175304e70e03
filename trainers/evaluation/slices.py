"""Per-slice evaluation: the eval metric per value (or per train-activity bucket) of a sparse feature.

A slice is declared in the config's `evaluate.slices`: `{feature: NAME, by: value}` groups rows by the
feature's value (its `top` most frequent values in the split, the rest "other"); `{feature: NAME,
by: activity}` by how often the value occurs in train (the vocabulary counts the Beam job keeps):
"unseen", "1", "2-3", "4-7", ... (e.g. per user-activity bucket). Ranking slices report AUC and
logloss, retrieval slices recall@10.
"""
from __future__ import annotations

import numpy as np

from recpipe.features.artifact import TransformArtifact
import dataclasses

from recpipe.common.typed_yaml import literal_choices
from recpipe.features.config import Config, ConfigError, EvaluateSpec, SliceSpec, check_config
from recpipe.common.metrics import log_loss, recall_at_k, roc_auc

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


def _bucket_low(name: str) -> int:
    return 0 if name == "unseen" else int(name.split("-")[0])


def slice_labels(cfg: Config, artifact: TransformArtifact, spec: SliceSpec, ids: np.ndarray
                 ) -> tuple[np.ndarray, list[str]]:
    """The slice each row (by its ID of spec.feature) falls in, as strings, and the slices in reading
    order: activity buckets from the least active up; values by rows, "other" last."""
    owner = cfg.table_owner(cfg.sparse_by_name[spec.feature])
    vocab = artifact.vocabularies.get(owner.name) if owner.vocab is not None else None
    if spec.by == "activity":
        counts = np.asarray(artifact.vocab_counts.get(owner.name, []), dtype=np.int64)
        known = ids < len(counts)
        per_row = np.zeros(len(ids), dtype=np.int64)
        per_row[known] = counts[ids[known]]
        labels = np.array([_activity_bucket(c) for c in per_row.tolist()], dtype=object)
        return labels, sorted(set(labels.tolist()), key=_bucket_low)
    values, freq = np.unique(ids, return_counts=True)
    ranked = values[np.argsort(-freq, kind="stable")[:spec.top]].tolist()

    def name(i: int) -> str:
        if vocab is None:
            return f"#{i}"
        return vocab[i] if i < len(vocab) else f"OOV bucket {i - len(vocab)}"
    names = {i: name(i) for i in ranked}
    labels = np.array([names.get(i, "other") for i in ids.tolist()], dtype=object)
    return labels, [names[i] for i in ranked] + (["other"] if len(values) > len(ranked) else [])


def ranking_slices(labels: np.ndarray, order: list[str], y: np.ndarray, p: np.ndarray) -> list[dict]:
    out = []
    for name in order:
        m = labels == name
        out.append({"slice": name, "rows": int(m.sum()), "positive_rate": float(y[m].mean()),
                    "auc": roc_auc(y[m], p[m]), "logloss": log_loss(y[m], p[m])})
    return out


def retrieval_slices(labels: np.ndarray, order: list[str], ranks: np.ndarray, k: int = 10) -> list[dict]:
    return [{"slice": name, "rows": int((labels == name).sum()),
             f"recall_at_{k}": recall_at_k(ranks[labels == name], k)} for name in order]
