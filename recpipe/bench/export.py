"""Export benchmark: smaller served models. One trained model per log (the real Criteo sample with
`configs/criteo.yaml`, and the synthetic log), exported with its weights stored as float32, bfloat16
and int8 (recpipe.serving.export.quantize; "int8_embeddings": int8 tables, float32 Dense kernels), side by side:

- SavedModel bytes (the whole version folder: graph, vocabularies and weights) and weight bytes
  (its variables/) ÷ float32's;
- in-process serving QPS of one-row requests ÷ float32's, the options measured round-robin, median
  of `reps`;
- eval AUC − float32's, on the whole eval split, scored by the trained model holding the same stored
  weights (the export's skew check proves the served graph scores exactly like it).

Ratio keys: export_{bf16,int8}_bytes_vs_fp32, export_{bf16,int8}_weight_bytes_vs_fp32,
export_{bf16,int8}_qps_vs_fp32, export_{bf16,int8}_auc_delta_abs: the worst of the two logs (the quick run:
the synthetic log alone).
"""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from typing import Callable, Optional

import pyarrow.parquet as pq

from recpipe.features.preprocessed import PreprocessedData
from recpipe.features.transform import request_from_arrow
from recpipe.bench.common import CLI, generate_once, preprocess_once
from recpipe.samples import find_criteo_sample, repo_configs
from recpipe.serving.export.savedmodel import export_model
from recpipe.serving.export.quantize import quantize_model
from recpipe.serving.server.registry import load_version
from recpipe.trainers.model_dir import load_trained
from recpipe.trainers.options import RunOptions, TrainOptions
from recpipe.trainers.evaluation.scoring import score
from recpipe.trainers.train import train

__all__ = ["OPTIONS", "bench_export", "markdown", "folder_bytes", "measure_qps"]

# option -> (embedding dtype, Dense kernel dtype)
OPTIONS = {"float32": ("float32", "float32"), "bfloat16": ("bfloat16", "bfloat16"),
           "int8_embeddings": ("int8", "float32"), "int8": ("int8", "int8")}
_KEYS = {"bfloat16": "bf16", "int8": "int8"}  # the options with ratio keys


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def measure_qps(fn, requests: list[dict], seconds: float) -> float:
    n, stop, i = 0, time.perf_counter() + seconds, 0
    t0 = time.perf_counter()
    while time.perf_counter() < stop:
        fn(**requests[i % len(requests)])
        n, i = n + 1, i + 1
    return n / (time.perf_counter() - t0)


def _one_log(work: str, name: str, cfg_path: str, data: str, steps: Optional[int], reps: int,
             seconds: float, options: list[str], say: Callable[[str], None]) -> dict:
    model_dir, export_base = os.path.join(work, name, "model"), os.path.join(work, name, "export")
    for done in (model_dir, export_base):  # a rerun in the same workdir trains and exports afresh
        shutil.rmtree(done, ignore_errors=True)
    say(f"bench export: {name}: training")
    train(TrainOptions(data, model_dir, cfg_path, run=RunOptions(steps=steps) if steps else RunOptions()),
          say=lambda _: None)
    out: dict = {}
    versions = {}
    for i, option in enumerate(options, start=1):
        emb, dense = OPTIONS[option]
        say(f"bench export: {name}: {option}")
        path = export_model(model_dir, export_base, version=i, embedding_dtype=emb, dense_dtype=dense)
        cfg, _, model = load_trained(model_dir)
        quantize_model(model, emb, dense)
        out[option] = {"embedding_dtype": emb, "dense_dtype": dense, "bytes": folder_bytes(path),
                       "weight_bytes": folder_bytes(os.path.join(path, "variables")),
                       "auc": score(cfg, model, data, "eval")["auc"]}
        versions[option] = load_version(path, i)
    sample = pq.read_table(PreprocessedData(data).eval_sample_parquet)
    specs = versions["float32"].inputs
    separators = versions["float32"].list_inputs  # each list column's separator, from the export's metadata
    requests = [request_from_arrow(sample.slice(i, 1), specs, separators) for i in range(min(64, sample.num_rows))]
    qps: dict[str, list[float]] = {o: [] for o in options}
    for _ in range(reps):  # round-robin: every option sees the same machine load
        for option, lv in versions.items():
            qps[option].append(measure_qps(lv.fn, requests, seconds))
    for option in options:
        out[option]["qps"] = statistics.median(qps[option])
        out[option]["qps_reps"] = qps[option]
    return out


def bench_export(work: str, say: Callable[[str], None], quick: bool = False, reps: int = 3,
                 synthetic: Optional[tuple[str, str]] = None) -> dict:
    """synthetic: (raw log, preprocessed) of the preprocess suite to reuse, else a log of 100k rows (5k
    quick) is generated. Quick: the synthetic log only, fewer steps, no int8_embeddings option."""
    configs = repo_configs()
    criteo = None if quick else find_criteo_sample()
    logs = {}
    if criteo is not None:
        parquet = os.path.join(work, "criteo_parquet")
        if not os.path.isdir(parquet):
            subprocess.run([*CLI, "criteo-to-parquet", "--csv", str(criteo), "--output", parquet], check=True,
                           capture_output=True)
        cfg = str(configs / "criteo.yaml")
        logs["criteo"] = (cfg, preprocess_once(cfg, parquet, os.path.join(work, "criteo_pre")), None)
    cfg = str(configs / "synthetic.yaml")
    if synthetic is None:
        log = generate_once(5_000 if quick else 100_000, os.path.join(work, "synthetic_log"))
        synthetic = (log, preprocess_once(cfg, log, os.path.join(work, "synthetic_pre")))
    logs["synthetic"] = (cfg, synthetic[1], 20 if quick else 300)
    options = [o for o in OPTIONS if not quick or o != "int8_embeddings"]  # quick: the options with ratio keys
    results = {name: _one_log(work, name, c, data, steps, reps, 0.3 if quick else 2.0, options, say)
               for name, (c, data, steps) in logs.items()}
    ratios = {}
    for option, key in _KEYS.items():
        per_log = [(r[option], r["float32"]) for r in results.values()]
        ratios[f"export_{key}_bytes_vs_fp32"] = max(o["bytes"] / f["bytes"] for o, f in per_log)
        ratios[f"export_{key}_weight_bytes_vs_fp32"] = max(o["weight_bytes"] / f["weight_bytes"] for o, f in per_log)
        ratios[f"export_{key}_qps_vs_fp32"] = min(o["qps"] / f["qps"] for o, f in per_log)
        ratios[f"export_{key}_auc_delta_abs"] = max(abs(o["auc"] - f["auc"]) for o, f in per_log)
    return {"suite": "export", "quick": quick, "logs": results, "ratios": ratios,
            "settings": {"reps": reps, "steps": {n: s or "the config's" for n, (_, _, s) in logs.items()}}}


def markdown(r: dict) -> str:
    lines = ["# Export benchmark: stored weight dtypes (`recpipe export --embedding-dtype/--dense-dtype`)", "",
             "Bytes: the whole SavedModel version folder (graph, vocabularies, weights); weights: its variables/. "
             "QPS: in-process, one-row requests, median of "
             f"{r['settings']['reps']} round-robin runs. AUC: the whole eval split, the trained model holding the "
             "same stored weights.", "",
             "| log | option | embeddings | Dense kernels | MB | ÷ float32 | weights MB | ÷ float32 | QPS | ÷ float32 "
             "| eval AUC | Δ AUC |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, options in r["logs"].items():
        f = options["float32"]
        for option, o in options.items():
            lines.append(f"| {name} | {option} | {o['embedding_dtype']} | {o['dense_dtype']} | "
                         f"{o['bytes'] / 1e6:.2f} | {o['bytes'] / f['bytes']:.3f} | {o['weight_bytes'] / 1e6:.2f} | "
                         f"{o['weight_bytes'] / f['weight_bytes']:.3f} | {o['qps']:,.0f} | {o['qps'] / f['qps']:.2f} | "
                         f"{o['auc']:.4f} | {o['auc'] - f['auc']:+.4f} |")
    lines += ["", *[f"- **{k}**: {v:.4g}" for k, v in r["ratios"].items()], "",
              "Reproduce: `.venv/bin/recpipe bench export`.", ""]
    return "\n".join(lines)
