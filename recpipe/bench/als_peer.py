"""implicit's ALS as the quality bench's matrix-factorisation peer for retrieval, run in the peer environment
(recpipe.bench.peer_env; the script is recpipe/bench/peers/als_fit.py).

Fit on the train clicks (the peers' catalogue: items clicked in train); a query's factors are folded in from its
history with the item factors fixed, so eval queries use their train and validation clicks as EASE's do. The grid
(factors x regularization x alpha) is fit with the first seed and scored on validation's seen-excluded
recall@10; the best is fit once per seed and scored on eval, through the evaluation's own scoring
(recpipe.bench.peer_clicks). 15 iterations (implicit's default); alpha scales the clicks' confidence.
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
import time
from typing import Callable, Optional

import numpy as np
import scipy.sparse as sp

from recpipe.bench.peer_clicks import PeerClicks, ScoredSplit, recall_summary, score_peer
from recpipe.bench.peer_env import run_peer

__all__ = ["ALS_GRID", "QUICK_ALS_GRID", "als_peer"]

ALS_GRID = {"factors": (8, 16, 32, 64), "regularization": (1.0, 10.0, 100.0), "alpha": (1.0, 10.0)}
QUICK_ALS_GRID = {"factors": (16,), "regularization": (10.0,), "alpha": (1.0, 10.0)}  # quick: a two-point smoke grid
ITERATIONS = 15


def _fit(data: PeerClicks, folder: str, configs: list[dict], seeds: list[int], splits: tuple[str, ...],
         say: Optional[Callable[[str], None]]) -> np.lib.npyio.NpzFile:
    """Run the peer on `configs` x `seeds`, folding in the histories of `splits`; its factors file."""
    os.makedirs(folder, exist_ok=True)
    sp.save_npz(os.path.join(folder, "train.npz"), data.train)
    histories = {}
    for split in splits:
        histories[split] = os.path.join(folder, f"history_{split}.npz")
        sp.save_npz(histories[split], data.splits[split].history)
    request = {"train": os.path.join(folder, "train.npz"), "histories": histories, "configs": configs,
               "seeds": seeds, "iterations": ITERATIONS, "threads": 1,
               "factors": os.path.join(folder, "factors.npz"), "report": os.path.join(folder, "report.json")}
    path = os.path.join(folder, "request.json")
    with open(path, "w") as fh:
        json.dump(request, fh, indent=1)
    run_peer("als_fit", path, say=say)
    return np.load(request["factors"])


def _score(factors, scored: ScoredSplit, c: int, seed: int) -> dict:
    users, items = factors[f"users_{scored.split}_{c}_{seed}"], factors[f"items_{c}_{seed}"]
    return score_peer(scored, lambda q: users[q].astype(np.float64) @ items.T.astype(np.float64))


def als_peer(data: PeerClicks, work: str, seeds: list[int], grid: Optional[dict] = None,
             say: Optional[Callable[[str], None]] = None) -> dict:
    """Choose ALS's configuration on validation, then fit it once per seed and score it on eval.

    Args:
        data: read_peer_clicks' train clicks and splits.
        work: a folder for the exchanged files.
        seeds: the seeds of the final fits (the first also fits the grid).
        grid: {factors, regularization, alpha: values} (default ALS_GRID).
        say: progress messages.

    Returns:
        {recall_at_10_mean, recall_at_10_sd, new_recall_at_10_mean, ..._sd, history_recall_at_10_mean, ..._sd,
        "config": the choice, "validation_new_recall_at_10": its figure there, "trials", "runs" (per seed),
        "seconds"}.

    Raises:
        RuntimeError: the peer failed.
    """
    t0 = time.perf_counter()
    grid = grid or ALS_GRID
    configs = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    with _fit(data, os.path.join(work, "tune"), configs, seeds[:1], ("validation",), say) as factors:
        trials = []
        for c, config in enumerate(configs):
            m = _score(factors, data.splits["validation"], c, seeds[0])
            trials.append({**config, "validation_recall_at_10": m["recall_at_10"],
                           "validation_new_recall_at_10": m["seen_excluded"]["recall_at_10"]})
    best = max(range(len(configs)), key=lambda c: trials[c]["validation_new_recall_at_10"])
    runs = []
    with _fit(data, os.path.join(work, "final"), [configs[best]], seeds, ("eval",), say) as factors:
        for seed in seeds:
            runs.append({"seed": seed, **recall_summary(_score(factors, data.splits["eval"], 0, seed))})
    out = {}
    for key in ("recall_at_10", "new_recall_at_10", "history_recall_at_10"):
        values = [r[key] for r in runs]
        out[f"{key}_mean"] = statistics.fmean(values)
        out[f"{key}_sd"] = statistics.pstdev(values) if len(values) > 1 else 0.0
    return {**out, "config": configs[best], "validation_new_recall_at_10": trials[best]["validation_new_recall_at_10"],
            "trials": trials, "runs": runs, "seconds": round(time.perf_counter() - t0, 1)}
