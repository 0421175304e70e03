"""The candidates of a retrieval evaluation and who clicked what: read once from the preprocessed splits.

A candidate is an ID of the first candidate feature; its other candidate features (item-side
attributes, multivalent ones too, e.g. genres) are taken from its first row in the data. The query
key (whose history "already seen" and co-occurrence use) is model.query_key, else the first query
feature when it is a single-valued sparse feature (e.g. user_id). A row's logged history is the first
multivalent query feature in the first candidate feature's table (e.g. `hist` sharing item_id's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from recpipe.features.canonical import LABEL_KEY
from recpipe.features.config import Config
from recpipe.common.metrics import rank_of_true
from recpipe.features.preprocessed import PreprocessedData
from recpipe.features.schema import history_feature, query_key_feature
from recpipe.trainers.data import make_dataset

__all__ = ["Candidates", "Clicks", "read_clicks", "ranks", "has_history", "query_key_feature", "history_feature"]


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
    an OOV key, which stands for many users and so has no history of its own); with a history feature
    (history_feature), `history`: rows x candidates, how often each candidate is in the row's history."""
    candidate: np.ndarray
    query: Optional[np.ndarray]
    history: Optional[sp.csr_matrix] = None

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
    key, listed = query_key_feature(cfg), history_feature(cfg)
    data = PreprocessedData(data_dir)
    vocabularies = data.transform().vocabularies if key is not None or listed is not None else {}
    known_keys = _known_values(cfg, vocabularies, key)  # IDs below it are values; the OOV buckets above are no users
    known_listed = _known_values(cfg, vocabularies, listed)  # nor items the history can name
    first_rows: dict[str, list] = {n: [] for n in names}
    first_ids: list[np.ndarray] = []
    raw: dict[str, tuple[list, list, list]] = {}
    seen: set = set()
    for split in splits:
        cand, query, history = [], [], []
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
            if listed is not None:
                history.append(tf.ragged.boolean_mask(b[listed], clicked))
        raw[split] = (cand, query, history)
    all_ids = np.concatenate(first_ids) if first_ids else np.zeros(0, np.int64)
    order = np.argsort(all_ids, kind="stable")
    candidates = Candidates(all_ids[order], {n: [first_rows[n][i] for i in order] for n in names})
    clicks = {}
    for split, (cand, query, history) in raw.items():
        c = np.concatenate(cand) if cand else np.zeros(0, np.int64)
        q = (np.concatenate(query) if query else np.zeros(0, np.int64)) if key is not None else None
        if q is not None and known_keys is not None:
            q = np.where(q < known_keys, q, -1)
        h = _history_matrix(candidates, history, len(c), known_listed) if listed is not None else None
        clicks[split] = Clicks(candidates.index_of(c), q, h)
    return candidates, clicks


def _known_values(cfg: Config, vocabularies: dict, name: Optional[str]) -> Optional[int]:
    """IDs of feature `name` below this are vocabulary values, the rest OOV buckets (None: no vocab)."""
    if name is None or cfg.table_owner(cfg.sparse_by_name[name]).vocab is None:
        return None
    return len(vocabularies[cfg.table_owner(cfg.sparse_by_name[name]).name])


def _history_matrix(candidates: Candidates, parts: list[tf.RaggedTensor], rows: int,
                    known_values: Optional[int]) -> sp.csr_matrix:
    """rows x candidates: how often each candidate is in each row's history (OOV IDs, which stand for
    many items, and IDs that are no candidate dropped)."""
    ids = np.concatenate([p.flat_values.numpy() for p in parts]) if parts else np.zeros(0, np.int64)
    row = np.concatenate([p.value_rowids().numpy() + offset for p, offset in
                          zip(parts, np.cumsum([0, *(int(p.nrows()) for p in parts)]))]) if parts else ids
    where = np.minimum(candidates.index_of(ids), max(len(candidates.ids) - 1, 0))
    known = (candidates.ids[where] == ids) if len(candidates.ids) else np.zeros(len(ids), bool)
    if known_values is not None:
        known &= ids < known_values
    return sp.csr_matrix((np.ones(int(known.sum()), np.float32), (row[known], where[known])),
                         shape=(rows, len(candidates.ids)))


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
