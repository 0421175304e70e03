"""The ten-line baseline a modeller would write: scikit-learn's LogisticRegression on a one-hot
encoding of the same IDs (our vocabularies, OOV buckets and hash buckets, read from the preprocessed
shards) plus the same transformed dense features, C chosen on the validation split, scored once on
eval. Same split, same features, no embeddings: what our models must beat."""
from __future__ import annotations

import numpy as np

from recpipe.features.canonical import LABEL_KEY
from recpipe.features.config import Config
from recpipe.common.metrics import log_loss, roc_auc
from recpipe.features.preprocessed import PreprocessedData
from recpipe.bench.common import TF_IN_PROCESS
from recpipe.trainers.data import make_dataset

__all__ = ["design_matrix", "sklearn_logistic"]

C_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)


def design_matrix(cfg: Config, data_dir: str, split: str):
    """(X: csr [rows, one column per ID of every feature + one per dense feature], y) of one split.
    A multivalent feature spreads its row's weight over its items (its combiner: mean or sum). A feature
    sharing another's table (a history of the items a row's candidate is one of) gets columns of its own:
    a weight for "item 7 is the candidate" and one for "item 7 is in the history"."""
    import scipy.sparse as sp
    artifact = PreprocessedData(data_dir).transform()
    sizes = artifact.table_sizes()
    offsets, start = {}, 0
    for f in cfg.features.sparse:
        offsets[f.name], start = start, start + sizes[cfg.table_owner(f).name]
    dense = [d.name for d in cfg.features.dense]
    rows_, cols_, vals_, labels = [], [], [], []
    base = 0
    for batch in make_dataset(cfg, data_dir, split, 65_536, training=False):
        n = int(batch[LABEL_KEY].shape[0])
        for f in cfg.features.sparse:
            ids, off = batch[f.name], offsets[f.name]
            if f.multivalent:
                lengths = ids.row_lengths().numpy()
                row = np.repeat(np.arange(n), lengths)
                w = np.ones(len(row)) if f.combiner == "sum" else 1.0 / np.repeat(np.maximum(lengths, 1), lengths)
                rows_.append(base + row), cols_.append(off + ids.flat_values.numpy()), vals_.append(w)
            else:
                rows_.append(base + np.arange(n)), cols_.append(off + ids.numpy()), vals_.append(np.ones(n))
        for j, name in enumerate(dense):
            rows_.append(base + np.arange(n)), cols_.append(np.full(n, start + j)), vals_.append(batch[name].numpy())
        labels.append(batch[LABEL_KEY].numpy())
        base += n
    x = sp.csr_matrix((np.concatenate(vals_), (np.concatenate(rows_), np.concatenate(cols_))),
                      shape=(base, start + len(dense)))
    return x, np.concatenate(labels)


def sklearn_logistic(cfg: Config, data_dir: str, grid: tuple[float, ...] = C_GRID) -> dict:
    """Fit one LogisticRegression per C on train, keep the best on validation, score it on eval."""
    from sklearn.linear_model import LogisticRegression
    with TF_IN_PROCESS:  # tf.data in this process, beside the suite's other threads
        (x_tr, y_tr), (x_va, y_va), (x_ev, y_ev) = (design_matrix(cfg, data_dir, s)
                                                    for s in ("train", "validation", "eval"))
    trials = []
    best = None
    for c in grid:
        model = LogisticRegression(C=c, solver="liblinear", max_iter=1000).fit(x_tr, y_tr)
        auc = roc_auc(y_va, model.predict_proba(x_va)[:, 1])
        trials.append({"C": c, "validation_auc": auc})
        if best is None or auc > best[0]:
            best = (auc, c, model)
    auc_va, c, model = best
    p = model.predict_proba(x_ev)[:, 1]
    return {"C": c, "validation_auc": auc_va, "auc": roc_auc(y_ev, p), "logloss": log_loss(y_ev, p),
            "eval_rows": int(len(y_ev)), "features": int(x_tr.shape[1]), "trials": trials}
