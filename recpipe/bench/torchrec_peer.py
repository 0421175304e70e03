"""The peer of `train_embedding_heavy_vs_torchrec`: TorchRec's DLRM (recpipe/bench/peers/torchrec_dlrm.py)
on the same data, in an environment of its own (recpipe.bench.isolated_env).

The bench exports the train and eval splits of our shards to .npz (IDs, dense features and labels, in the
shards' order), writes a request naming them, the model and the run, runs the script in the TorchRec
environment, and reads its response and eval predictions back; the AUC is computed here, by the function
`recpipe evaluate` scores our models with.

TorchRec 1.9.x with FBGEMM's CPU build: torch 2.14 is the release fbgemm-gpu-cpu 1.9 is built against. PyPI's
torch 2.14 wheel names CUDA libraries as dependencies and loads them at import (the CPU-only wheels are on
download.pytorch.org, which an offline mirror may not carry), so the plan installs them; torchrec's metadata
names the CUDA `fbgemm-gpu`, so it is installed without dependencies after `fbgemm-gpu-cpu` and its own
pure-Python ones.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Optional

import numpy as np

from recpipe.bench.embedding_model import DENSE_FEATURES, EmbeddingHeavySpec
from recpipe.bench.isolated_env import ensure_env, env_record
from recpipe.common.metrics import roc_auc

__all__ = ["TORCHREC_PLAN", "SCRIPT", "export_split", "torchrec_request", "read_response", "run_torchrec"]

TORCHREC_PLAN = (
    (("torch==2.14.1", "fbgemm-gpu-cpu==1.9.0", "numpy==2.4.6"), ()),
    (("tensordict==0.15.3", "torchmetrics==1.0.3", "tqdm==4.70.1", "pyre-extensions==0.0.32"), ()),
    (("torchrec==1.9.2",), ("--no-deps",)),
)
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "torchrec_dlrm.py")


def export_split(cfg, data_dir: str, split: str, out: str) -> str:
    """One split of a preprocessed folder as .npz: sparse [N, F] int64 (the config's sparse features in
    order), dense [N, 13] float32, label [N] float32, rows in the shards' order.

    Args:
        cfg: the data's Config (single-valued sparse features).
        data_dir: a `recpipe preprocess` output folder.
        split: train, validation or eval.
        out: the .npz path to write.

    Returns:
        `out`.
    """
    from recpipe.features.canonical import LABEL_KEY
    from recpipe.trainers.data import make_dataset
    sparse, dense, label = [], [], []
    for batch in make_dataset(cfg, data_dir, split, 65_536, training=False):
        sparse.append(np.stack([batch[f.name].numpy() for f in cfg.features.sparse], axis=1).astype(np.int64))
        dense.append(np.stack([batch[d.name].numpy() for d in cfg.features.dense], axis=1).astype(np.float32))
        label.append(batch[LABEL_KEY].numpy().astype(np.float32))
    np.savez(out, sparse=np.concatenate(sparse), dense=np.concatenate(dense), label=np.concatenate(label))
    return out


def torchrec_request(spec: EmbeddingHeavySpec, table_rows: list[int], steps: int, work: str, tag: str,
                     optimizer: str = "adagrad", parts: Optional[tuple[int, int]] = None) -> dict:
    """The request the TorchRec script reads.

    Args:
        spec: the model and run (widths, batch, learning rate, threads, seed).
        table_rows: rows of each table, in the sparse features' order (the transform artifact's).
        steps: training steps.
        work: the folder holding train.npz and eval.npz (export_split); outputs are written there too.
        tag: names this run's output and predictions files.
        optimizer: the tables' fused optimizer: "adagrad" (EXACT_ADAGRAD) or "rowwise_adagrad".
        parts: (rounds, steps) to also time each part of a step, or None.

    Returns:
        The request as a JSON-ready dict.

    Raises:
        ValueError: an unknown optimizer, or table_rows not one per table.
    """
    if optimizer not in ("adagrad", "rowwise_adagrad"):
        raise ValueError(f"torchrec peer: optimizer {optimizer!r}: adagrad or rowwise_adagrad")
    if len(table_rows) != spec.tables:
        raise ValueError(f"torchrec peer: {len(table_rows)} table sizes for {spec.tables} tables")
    req = {"train": os.path.join(work, "train.npz"), "eval": os.path.join(work, "eval.npz"),
           "features": [f"C{i + 1}" for i in range(spec.tables)], "tables": [int(r) for r in table_rows],
           "dim": spec.dim, "dense_features": DENSE_FEATURES, "bottom_layers": list(spec.bottom_layers),
           "deep_layers": list(spec.deep_layers), "batch_size": spec.batch_size, "steps": steps,
           "learning_rate": spec.learning_rate, "epsilon": 1e-7, "initial_accumulator": 0.1, "init_range": 0.05,
           "optimizer": optimizer, "threads": spec.threads, "seed": spec.seed,
           "output": os.path.join(work, f"{tag}.json"), "predictions": os.path.join(work, f"{tag}.npy"),
           "parts": parts is not None}
    if parts is not None:
        req["parts_rounds"], req["parts_steps"] = parts
    return req


def read_response(req: dict) -> dict:
    """The script's response, with the eval AUC of its predictions against the eval labels.

    Args:
        req: the request the script ran on.

    Returns:
        Its JSON response plus "auc".

    Raises:
        ValueError: the predictions are not one finite probability per eval row.
    """
    with open(req["output"]) as fh:
        out = json.load(fh)
    p = np.load(req["predictions"])
    y = np.load(req["eval"])["label"]
    if p.shape != y.shape or not np.isfinite(p).all():
        raise ValueError(f"torchrec peer: {p.shape} predictions for {y.shape} eval rows, "
                         f"{int((~np.isfinite(p)).sum())} not finite")
    out["auc"] = roc_auc(y, p)
    return out


def run_torchrec(req: dict, measure: Callable[[list[str]], tuple], say: Optional[Callable[[str], None]] = None,
                 cache: Optional[str] = None) -> dict:
    """Run the script in the TorchRec environment (created when missing) on one request.

    Args:
        req: torchrec_request's dict.
        measure: runs a command and returns (wall s, peak RSS MB, stdout) (recpipe.bench.common.run_measured).
        say: progress messages.
        cache: the folder of environments (default: isolated_env.env_cache()).

    Returns:
        read_response's dict plus "peak_rss_mb" and "env" (the environment's creation record).
    """
    python = ensure_env(TORCHREC_PLAN, cache, say)
    path = req["output"][:-len(".json")] + ".request.json"
    with open(path, "w") as fh:
        json.dump(req, fh)
    cmd = [python, "-I", SCRIPT, path]
    _, peak, _ = measure(cmd)
    out = read_response(req)
    record = env_record(python)
    out.update(peak_rss_mb=peak, env={k: record.get(k) for k in ("created_s", "size_mb")})
    return out

