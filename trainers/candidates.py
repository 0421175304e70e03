"""The candidates of a retrieval evaluation and who clicked what: read once from the preprocessed splits.

A candidate is an ID of the first candidate feature; its other candidate features (item-side
attributes, multivalent ones too, e.g. genres) are taken from its first row in the data. The query
key (whose history "already seen" and co-occurrence use) is the first query feature, when it is a
single-valued sparse feature (e.g. user_id).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from features.canonical import LABEL_KEY
from features.config import Config
from features.preprocessed import PreprocessedData
from trainers.data import make_dataset
from trainers.metrics import rank_of_true

__all__ = ["Candidates", "Clicks", "read_clicks", "ranks", "has_history", "query_key_feature"]


def query_key_feature(cfg: Config) -> Optional[str]:
    first = cfg.model.query_features[0]
    f = cfg.sparse_by_name.get(first)
    return first if f is not None and not f.multivalent else None


@dataclass
class Candidates:
    ids: np.ndarray                  # [U] sorted IDs of the first candidate feature
    features: dict[str, list]        # feature -> per candidate: an ID, or an ID array (multivalent)

    def index_of(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.ids, ids)

    def batch(self, start: int, stop: int, multivalent: set[str]) -> dict[str, tf.Tensor]:
        out = {}
        for name, values in self.features.items():
            part = values[start:stop]
            if name in multivalent:
                lengths = [len(v) for v in part]
                flat = np.concatenate(part).astype(np.int64) if part else np.zeros(0, np.int64)
                out[name] = tf.RaggedTensor.from_row_lengths(flat, np.asarray(lengths, np.int64))
            else:
                out[name] = tf.constant(np.asarray(part, np.int64))
        return out


@dataclass
class Clicks:
    """Clicked rows of some splits: candidate index per row, and the query key per row (or None; -1 for
    an OOV key, which stands for many users and so has no history of its own)."""
    candidate: np.ndarray
    query: Optional[np.ndarray]

    def matrix(self, n_queries: int, n_candidates: int) -> sp.csr_matrix:
        """Binary query x candidate matrix of these clicks."""
        known = self.query >= 0
        m = sp.csr_matrix((np.ones(int(known.sum()), np.float32), (self.query[known], self.candidate[known])),
                          shape=(n_queries, n_candidates))
        m.data[:] = 1.0
        return m


def read_clicks(cfg: Config, data_dir: str, splits: tuple[str, ...], batch_size: int = 65_536
                ) -> tuple[Candidates, dict[str, Clicks]]:
    """Every candidate in `splits` (attributes from its first row), and each split's clicked rows."""
    names = list(cfg.model.candidate_features)
    key = query_key_feature(cfg)
    data = PreprocessedData(data_dir)
    known_keys = None  # query key IDs below this are known values; the OOV buckets above are not users
    if key is not None and cfg.table_owner(cfg.sparse_by_name[key]).vocab is not None:
        known_keys = len(data.transform().vocabularies[cfg.table_owner(cfg.sparse_by_name[key]).name])
    first_rows: dict[str, list] = {n: [] for n in names}
    first_ids: list[np.ndarray] = []
    raw: dict[str, tuple[list, list]] = {}
    seen: set = set()
    for split in splits:
        cand, query = [], []
        for b in (make_dataset(cfg, data_dir, split, batch_size, training=False) if data.shard_files(split) else []):
            ids = b[names[0]].numpy()
            new, where = np.unique(ids, return_index=True)
            fresh = np.array([i not in seen for i in new.tolist()], dtype=bool)
            if fresh.any():
                rows = where[fresh]
                seen.update(new[fresh].tolist())
                first_ids.append(new[fresh])
                for n in names:
                    v = b[n]
                    if isinstance(v, tf.RaggedTensor):
                        first_rows[n].extend(np.asarray(r, np.int64) for r in tf.gather(v, rows).to_list())
                    else:
                        first_rows[n].extend(v.numpy()[rows].tolist())
            clicked = b[LABEL_KEY].numpy() > 0.5
            cand.append(ids[clicked])
            if key is not None:
                query.append(b[key].numpy()[clicked])
        raw[split] = (cand, query)
    all_ids = np.concatenate(first_ids) if first_ids else np.zeros(0, np.int64)
    order = np.argsort(all_ids, kind="stable")
    candidates = Candidates(all_ids[order], {n: [first_rows[n][i] for i in order] for n in names})
    clicks = {}
    for split, (cand, query) in raw.items():
        c = np.concatenate(cand) if cand else np.zeros(0, np.int64)
        q = (np.concatenate(query) if query else np.zeros(0, np.int64)) if key is not None else None
        if q is not None and known_keys is not None:
            q = np.where(q < known_keys, q, -1)
        clicks[split] = Clicks(candidates.index_of(c), q)
    return candidates, clicks


def _known(seen: sp.csr_matrix, queries: np.ndarray) -> np.ndarray:
    """Which query keys are rows of `seen` (-1, an OOV key, and keys beyond it have no history)."""
    return (queries >= 0) & (queries < seen.shape[0])


def has_history(seen: sp.csr_matrix, queries: np.ndarray) -> np.ndarray:
    """Which rows' queries clicked anything in `seen` (query x candidate): the others are cold-start."""
    known = _known(seen, queries)
    out = np.zeros(len(queries), dtype=bool)
    out[known] = np.diff(seen.indptr)[queries[known]] > 0
    return out


def ranks(scores: np.ndarray, truth: np.ndarray, seen: Optional[sp.csr_matrix] = None,
          queries: Optional[np.ndarray] = None) -> np.ndarray:
    """0-based rank of each row's true candidate among all (ties against it). With `seen` (query x
    candidate) and the rows' query keys (-1: unknown, no history): recommending only what a query has
    not clicked before, i.e. its already-clicked candidates removed, scored on the rows whose true
    candidate is new to it."""
    if seen is None:
        return rank_of_true(scores, truth)
    mask = np.zeros(scores.shape, dtype=bool)
    inside = np.flatnonzero(_known(seen, queries))
    if len(inside):
        known = seen[queries[inside]].toarray().astype(bool)
        mask[inside, :known.shape[1]] = known
    new = ~mask[np.arange(len(truth)), truth]
    return rank_of_true(np.where(mask, -np.inf, scores)[new], truth[new])
