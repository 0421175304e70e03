"""Scores of a built model on one split of the preprocessed data: flat metric dicts.

The eval split is scored once, at the end (recpipe.trainers.evaluation.evaluate); the validation split at every
checkpoint while training (recpipe.trainers.evaluation.validation). Both read through here, so they never disagree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from recpipe.features.canonical import LABEL_KEY
from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import Config, SliceSpec
from recpipe.common.metrics import (HIGHER_IS_BETTER, log_loss, mrr_at_k, ndcg_at_k, recall_at_k, reliability_table,
                                   roc_auc)
from recpipe.trainers.evaluation import ease
from recpipe.trainers.evaluation.candidates import Candidates, Clicks, has_history, ranks, read_clicks
from recpipe.trainers.data import make_dataset
from recpipe.trainers.errors import TrainError
from recpipe.trainers.evaluation.slices import ranking_slices, retrieval_slices, slice_labels, slice_name

__all__ = ["score", "Slicing", "ranking_scores", "retrieval_clicks", "retrieval_scores", "baselines",
           "HIGHER_IS_BETTER", "selected", "undefined_metrics", "scored_metrics", "seen_matrix"]

_SEEN_EXCLUDED = "seen_excluded_"


def selected(scores: dict, metric: str, split: str) -> float:
    """The value of a selectable metric (HIGHER_IS_BETTER's keys) in `score`'s output.

    Args:
        scores: score()'s dict for `split`.
        metric: e.g. "auc", or "seen_excluded_recall_at_10" for scores["seen_excluded"]["recall_at_10"].
        split: the split scored, named in the error.

    Returns:
        The metric's value.

    Raises:
        TrainError: a seen_excluded metric where the split has none (no query key to know what each query
            clicked before).
    """
    if not metric.startswith(_SEEN_EXCLUDED):
        return scores[metric]
    if "seen_excluded" not in scores:
        raise TrainError(f"train.early_stopping.metric {metric}: the {split} split has no seen-excluded scores: they "
                         f"need a query key (model.query_key, or a single-valued first query feature) to know what "
                         f"each query clicked before; set one, or pick {metric[len(_SEEN_EXCLUDED):]}")
    return scores["seen_excluded"][metric[len(_SEEN_EXCLUDED):]]


def score(cfg: Config, model: tf.keras.Model, data_dir: str, split: str, batch_size: int = 4096,
          slices: Slicing | None = None, clicks: tuple[Candidates, dict[str, Clicks]] | None = None) -> dict:
    """The split's metrics; with `slices`, also per slice (recpipe.trainers.evaluation.slices) under "slices". Retrieval:
    `clicks` = retrieval_clicks(cfg, data_dir, split), read once by a caller that scores the split often."""
    if cfg.model.task == "retrieval":
        return retrieval_scores(cfg, model, data_dir, split, batch_size, slices=slices,
                                clicks=clicks or retrieval_clicks(cfg, data_dir, split))
    return ranking_scores(cfg, model, data_dir, split, batch_size, slices=slices)


def retrieval_clicks(cfg: Config, data_dir: str, split: str) -> tuple[Candidates, dict[str, Clicks]]:
    """What scoring retrieval on `split` reads besides the split itself: the candidates seen up to and
    including it (eval also sees validation's) and the click histories before it (read_clicks)."""
    seen = ("train", "validation", "eval") if split == "eval" else ("train", split)
    return read_clicks(cfg, data_dir, tuple(dict.fromkeys((*seen, *_history(split), split))))


@dataclass(frozen=True)
class Slicing:
    specs: tuple[SliceSpec, ...]
    artifact: TransformArtifact

    def features(self) -> list[str]:
        return list(dict.fromkeys(s.feature for s in self.specs))

    def table(self, cfg: Config, kept: dict[str, list[np.ndarray]], per_slice) -> dict:
        return {slice_name(s): per_slice(*slice_labels(cfg, self.artifact, s, np.concatenate(kept[s.feature])))
                for s in self.specs}


def ranking_scores(cfg: Config, model: tf.keras.Model, data_dir: str, split: str, batch_size: int = 4096,
                   slices: Slicing | None = None) -> dict:
    autograph = getattr(model, "autograph", True)  # recpipe.trainers.models._Model; a peer's model (recpipe.bench) is converted
    predict = tf.function(lambda b: tf.sigmoid(model(b))[:, 0], reduce_retracing=True, autograph=autograph)
    labels, probs = [], []
    kept: dict[str, list] = {f: [] for f in (slices.features() if slices else [])}
    for batch in make_dataset(cfg, data_dir, split, batch_size, training=False):
        labels.append(batch[LABEL_KEY].numpy())
        probs.append(predict(batch).numpy())
        for f in kept:
            kept[f].append(batch[f].numpy())
    if not labels:
        raise TrainError(f"{data_dir}/{split}: the {split} split is empty (nothing to score)")
    y, p = np.concatenate(labels), np.concatenate(probs)
    if not np.isfinite(p).all():
        raise TrainError(f"{data_dir}/{split}: the model predicts NaN/inf for {int((~np.isfinite(p)).sum())} rows")
    positive_rate = float(y.mean())
    out = {"auc": roc_auc(y, p), "logloss": log_loss(y, p), "examples": int(len(y)), "positive_rate": positive_rate,
           # mean prediction / observed rate: 1 when calibrated on average
           "calibration": float(p.mean()) / positive_rate if positive_rate > 0 else float("nan"),
           "reliability": reliability_table(y, p)}
    if slices:
        out["slices"] = slices.table(cfg, kept, lambda labels, order: ranking_slices(labels, order, y, p))
    return out


def _history(split: str) -> tuple[str, ...]:
    """The splits before `split`: what a query has already clicked when `split` is scored."""
    return ("train", "validation") if split == "eval" else ("train",)


def _chunks(n: int, size: int):
    for i in range(0, n, size):
        yield slice(i, min(i + size, n))


def retrieval_scores(cfg: Config, model: tf.keras.Model, data_dir: str, split: str, batch_size: int = 4096,
                     ks: tuple[int, ...] = (10, 50, 100), slices: Slicing | None = None,
                     clicks: tuple[Candidates, dict[str, Clicks]] | None = None) -> dict:
    """Brute force: score each clicked row's query against ALL candidates of `clicks`
    (retrieval_clicks(cfg, data_dir, split) when not given): a two-tower model by its embeddings' dot products,
    an item-to-item one by its scores per candidate ID; with a query key (recpipe.trainers.evaluation.candidates),
    also `seen_excluded`: only candidates new to the query (not clicked in the splits before this
    one) recommended, scored on the rows that clicked a new one, and `with_history` / `without_history`:
    the rows whose query clicked something in those splits, and the cold-start rest."""
    candidates, clicks = clicks or retrieval_clicks(cfg, data_dir, split)
    if hasattr(model, "id_scores"):  # item_to_item: a score per candidate ID, no embeddings
        id_fn = tf.function(model.id_scores, reduce_retracing=True)

        def score_rows(batch, clicked):
            return id_fn(batch).numpy()[clicked][:, candidates.ids]
    else:
        multivalent = {n for n in cfg.model.candidate_features if cfg.sparse_by_name[n].multivalent}
        cand_fn = tf.function(model.candidate_embedding, reduce_retracing=True)
        query_fn = tf.function(model.query_embedding, reduce_retracing=True)
        cand = np.concatenate([cand_fn(candidates.batch(c.start, c.stop, multivalent)).numpy()
                               for c in _chunks(len(candidates.ids), batch_size)])

        def score_rows(batch, clicked):
            return query_fn(batch).numpy()[clicked] @ cand.T
    # the split's clicked rows, in the order read below
    seen, scored = seen_matrix(clicks, split, len(candidates.ids)), clicks[split]
    plain, excluded, history, done = [], [], [], 0
    kept: dict[str, list] = {f: [] for f in (slices.features() if slices else [])}
    for batch in make_dataset(cfg, data_dir, split, batch_size, training=False):
        clicked = batch[LABEL_KEY].numpy() > 0.5
        if not clicked.any():
            continue
        for f in kept:
            kept[f].append(batch[f].numpy()[clicked])
        rows = slice(done, done + int(clicked.sum()))
        done = rows.stop
        scores = score_rows(batch, clicked)
        plain.append(ranks(scores, scored.candidate[rows]))
        if seen is not None:
            excluded.append(ranks(scores, scored.candidate[rows], seen, scored.query[rows]))
            history.append(has_history(seen, scored.query[rows]))
    if not plain:
        raise TrainError(f"{data_dir}/{split}: no clicked rows to score retrieval on")
    all_ranks = np.concatenate(plain)
    out = {**_rank_metrics(all_ranks, ks), "examples": int(len(all_ranks)),
           "candidates": int(len(candidates.ids))}
    if seen is not None:
        r = np.concatenate(excluded)
        out["seen_excluded"] = {**_rank_metrics(r, ks), "examples": int(len(r))}
        _history_split(out, all_ranks, np.concatenate(history), ks)
    if slices:
        out["slices"] = slices.table(cfg, kept, lambda labels, order: retrieval_slices(labels, order, all_ranks))
    return out


def seen_matrix(clicks: dict[str, Clicks], split: str, n_candidates: int) -> sp.csr_matrix | None:
    """What each query clicked in the splits before `split`.

    Args:
        clicks: the clicked rows of the splits read (read_clicks).
        split: the split scored.
        n_candidates: the candidates read with them (a candidate seen only in rows without a click has none).

    Returns:
        Binary [queries, n_candidates]; None without a query key.
    """
    history = [clicks[s] for s in _history(split) if s in clicks]
    if not history or history[0].query is None:
        return None
    merged = Clicks(np.concatenate([c.candidate for c in history]), np.concatenate([c.query for c in history]))
    n_queries = int(max([1, *(int(c.query.max()) + 1 for c in clicks.values() if len(c.query))]))
    return merged.matrix(n_queries, n_candidates)


def _history_split(out: dict, all_ranks: np.ndarray, with_history: np.ndarray, ks: tuple[int, ...]) -> None:
    """out["with_history"] / out["without_history"]: the rank metrics of the rows whose query has
    clicks in the splits before, and of the others (a cold-start query has only its attributes)."""
    for key, mask in (("with_history", with_history), ("without_history", ~with_history)):
        out[key] = {**(_rank_metrics(all_ranks[mask], ks) if mask.any() else {}), "examples": int(mask.sum())}


def _rank_metrics(ranks: np.ndarray, ks: tuple[int, ...]) -> dict:
    out: dict = {}
    for k in ks:
        out.update({f"recall_at_{k}": recall_at_k(ranks, k), f"ndcg_at_{k}": ndcg_at_k(ranks, k),
                    f"mrr_at_{k}": mrr_at_k(ranks, k)})
    return out


def scored_metrics(score_rows, clicks: Clicks, seen: sp.csr_matrix | None, ks: tuple[int, ...],
                   chunk: int = 1024) -> dict:
    """Rank metrics of a scorer on a split's clicked rows, as every retrieval model and baseline is scored.

    Args:
        score_rows: a slice of `clicks`' rows -> [rows, candidates] scores.
        clicks: the split's clicked rows (candidate index, query key).
        seen: seen_matrix of the split, or None (no query key).
        ks: the cut-offs of recall, NDCG and MRR.
        chunk: rows scored at a time.

    Returns:
        recall_at_K, ndcg_at_K, mrr_at_K; with `seen`, also "seen_excluded" (each query's already-clicked
        candidates removed) and "with_history" / "without_history"; {} for a split without rows.
    """
    plain, excluded, history = [], [], []
    for c in _chunks(len(clicks.candidate), chunk):
        queries = clicks.query[c] if clicks.query is not None else None
        scores = score_rows(c)
        plain.append(ranks(scores, clicks.candidate[c]))
        if seen is not None:
            excluded.append(ranks(scores, clicks.candidate[c], seen, queries))
            history.append(has_history(seen, queries))
    if not plain:
        return {}
    all_ranks = np.concatenate(plain)
    out = _rank_metrics(all_ranks, ks)
    if seen is not None:
        r = np.concatenate(excluded)
        out["seen_excluded"] = {**_rank_metrics(r, ks), "examples": int(len(r))}
        _history_split(out, all_ranks, np.concatenate(history), ks)
    return out


def baselines(cfg: Config, data_dir: str, split: str = "eval", batch_size: int = 65_536,
              ks: tuple[int, ...] = (10, 50, 100)) -> dict:
    """The trivial models' scores on `split`, learned from the train split, to print beside a model's:
    ranking: the constant prediction of train's click rate (AUC 0.5 by construction; its logloss is
    the reference); retrieval: most-popular candidates (clicks in train) and, with a query key,
    co-occurrence ("bought together": candidates scored by how many train queries clicked both them
    and one of this query's train candidates; popularity breaks ties, and ranks alone for a query
    without history) and, with a history feature too (recpipe.trainers.evaluation.candidates.history_feature: what the
    row's user had just before it, which the model sees too), history co-occurrence (item-to-item: the same
    counts with the candidates in the row's history, each candidate's sum divided by the square root of
    its popularity), and on eval with a validation split EASE (recpipe.trainers.evaluation.ease: the closed-form
    item-to-item model over the query's earlier clicks, λ chosen on validation), each also with the query's
    already-clicked candidates removed (`seen_excluded`)."""
    if cfg.model.task != "retrieval":
        train = list(make_dataset(cfg, data_dir, "train", batch_size, training=False))
        rate = float(np.concatenate([b[LABEL_KEY].numpy() for b in train]).mean())
        y = np.concatenate([b[LABEL_KEY].numpy() for b in make_dataset(cfg, data_dir, split, batch_size,
                                                                         training=False)])
        return {"constant_rate": {"prediction": rate, "auc": 0.5, "logloss": log_loss(y, np.full(len(y), rate))}}
    splits = ("train", "validation", "eval") if split == "eval" else ("train", split)
    candidates, clicks = read_clicks(cfg, data_dir, splits, batch_size)
    n = len(candidates.ids)
    popularity = np.bincount(clicks["train"].candidate, minlength=n).astype(np.float64)
    seen = seen_matrix(clicks, split, n)
    scored = clicks[split]
    out = {"most_popular": scored_metrics(lambda c: np.broadcast_to(popularity, (c.stop - c.start, n)), scored, seen,
                                          ks)}
    if clicks["train"].query is not None:
        n_queries = seen.shape[0]
        user_item = clicks["train"].matrix(n_queries, n)
        together = (user_item.T @ user_item).tocsr()
        together.setdiag(0)
        tie = popularity / (popularity.max() + 1.0)  # < 1: orders only candidates of equal co-occurrence

        def cooccurrence(c):
            q = scored.query[c]
            known = q >= 0  # an OOV key has no history: popularity alone
            scores = np.broadcast_to(tie, (len(q), n)).copy()
            scores[known] += (user_item[q[known]] @ together).toarray()
            return scores
        out["cooccurrence"] = scored_metrics(cooccurrence, scored, seen, ks)
        if scored.history is not None:
            weight = 1.0 / np.sqrt(np.maximum(popularity, 1.0))
            out["history_cooccurrence"] = scored_metrics(
                lambda c: tie + (scored.history[c] @ together).toarray() * weight, scored, seen, ks)
        if split == "eval" and "validation" in clicks and len(clicks["validation"].candidate):
            out.update(_ease(clicks, user_item, seen, popularity, ks))
    return out


def _ease(clicks: dict[str, Clicks], train: sp.csr_matrix, seen: sp.csr_matrix, popularity: np.ndarray,
          ks: tuple[int, ...]) -> dict:
    """{"ease": eval metrics of EASE fitted on the train clicks (as the model and the other baselines learn
    from train alone) with λ chosen on validation (its seen-excluded recall@10, train clicks as the history);
    eval queries are scored from their train and validation clicks}, or {"ease": {"skipped": why}} beyond
    ease.fits' bounds."""
    too_big = ease.fits(train)
    if too_big:
        return {"ease": {"skipped": too_big}}
    validation = clicks["validation"]
    tried, best = {}, None
    for lam in ease.LAMBDAS:
        model = ease.Ease(train, lam)
        scorer = ease.ease_scorer(train, model, validation.query, popularity)
        tried[lam] = scored_metrics(scorer, validation, train, (10,))["seen_excluded"]["recall_at_10"]
        if best is None or tried[lam] >= tried[best.lam]:  # ties: the stronger regularisation
            best = model
    scored = clicks["eval"]
    metrics = scored_metrics(ease.ease_scorer(seen, best, scored.query, popularity), scored, seen, ks)
    return {"ease": {**metrics, "lambda": best.lam,
                     "validation_seen_excluded_recall_at_10": {str(k): v for k, v in tried.items()}}}


def undefined_metrics(metrics: dict, split: str) -> dict[str, str]:
    """Why each metric that is NaN in `metrics` is undefined on `split` (ranking: AUC needs both labels,
    calibration a click), by metric name; slices of one label by slice name under "slices"."""
    why: dict[str, str] = {}
    if "positive_rate" not in metrics:
        return why
    rows, rate = metrics["examples"], metrics["positive_rate"]
    if math.isnan(metrics["auc"]):
        why["auc"] = (f"every one of the {rows:,} {split} rows has label {int(rate > 0.5)}: AUC needs rows of both "
                      "labels, so the model cannot be judged on this split")
    if math.isnan(metrics["calibration"]):
        why["calibration"] = f"none of the {rows:,} {split} rows has label 1: calibration divides by the click rate"
    one_label = [f"{name} {s['slice']}" for name, table in metrics.get("slices", {}).items() for s in table
                 if math.isnan(s["auc"])]
    if one_label:
        why["slices"] = (f"AUC is null for the {len(one_label)} slices whose rows all have one label: "
                         f"{', '.join(one_label[:5])}{', …' if len(one_label) > 5 else ''}")
    return why
