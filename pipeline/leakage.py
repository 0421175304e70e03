"""Features that give the label away: a column recorded after the click (time to click, a conversion
value, a 'clicked' flag joined in from the outcome table) orders the rows by their label almost
perfectly. A model trained with it scores near 1.0 in evaluation and fails in serving, where the value
is not known yet; nothing else in the pipeline would say so.

Pure logic over the raw eval sample preprocess writes (up to 1,000 rows, eval_sample.parquet): each
single-column feature alone, as a score, against the label, by AUC. A dense column scores by its value
(a missing value lowest, so a column filled only after a click is caught too); a single-valued sparse
column by each value's click rate within the sample, only when its values have at least
ROWS_PER_VALUE rows each on average (an ID of a row or two would sort its own rows perfectly by chance).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from recpipe.features.canonical import numeric
from recpipe.features.config import Config
from recpipe.common.metrics import roc_auc

__all__ = ["leak_warnings", "LEAK_AUC"]

LEAK_AUC = 0.99        # a feature that alone reaches this AUC (or 1 - it) is named
MIN_PER_LABEL = 10     # rows of each label the sample needs before anything is named
ROWS_PER_VALUE = 20    # sparse columns: the sample's rows per distinct value, at least


def leak_warnings(cfg: Config, sample: pa.Table) -> list[str]:
    """One message per column-fed feature that alone orders `sample`'s rows by their label with an AUC of
    LEAK_AUC or more (a dense one either way). Retrieval logs (clicks only) and samples with fewer than
    MIN_PER_LABEL rows of either label are not judged, nor features whose preprocess.features[] entry sets
    leak_check: false."""
    if cfg.model.task == "retrieval" or sample.num_rows == 0:
        return []
    clicked = numeric(sample.column(cfg.label.column))[0] > 0.5
    n, pos = len(clicked), int(clicked.sum())
    if min(pos, n - pos) < MIN_PER_LABEL:
        return []
    why = ("is it recorded after the click, or derived from the label? A model trained on it scores near 1.0 in "
           "evaluation and fails in serving, where the value is not known yet")
    out, seen = [], set()
    for d in cfg.features.dense:
        if d.column in seen or not cfg.preprocess.leak_checked(d.name):
            continue
        seen.add(d.column)
        x = numeric(sample.column(d.column))[0]
        missing = np.isnan(x)
        auc = roc_auc(clicked, np.where(missing, -np.inf, x))
        if max(auc, 1 - auc) >= LEAK_AUC:
            where = f", {missing.mean():.0%} of them without a value (scored lowest)" if missing.any() else ""
            out.append(f"dense feature {d.name!r} (column {d.column!r}) alone orders the {n:,} eval-sample rows "
                       f"by their label (column {cfg.label.column!r}) with AUC {auc:.3f}{where}: {why}")
    for f in cfg.column_sparse:
        if f.multivalent or f.column in seen or not cfg.preprocess.leak_checked(f.name):
            continue
        seen.add(f.column)
        tokens = np.array(["" if v is None else str(v) for v in sample.column(f.column).to_pylist()], dtype=object)
        values, inverse = np.unique(tokens, return_inverse=True)
        if len(values) < 2 or len(values) * ROWS_PER_VALUE > n:
            continue
        rate = np.bincount(inverse, weights=clicked) / np.bincount(inverse)
        auc = roc_auc(clicked, rate[inverse])
        if auc >= LEAK_AUC:
            out.append(f"feature {f.name!r} (column {f.column!r}): its {len(values)} values alone sort the {n:,} "
                       f"eval-sample rows by their label (column {cfg.label.column!r}), AUC {auc:.3f} from each "
                       f"value's click rate: {why}")
    return out
