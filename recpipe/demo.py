"""`recpipe demo`: the whole chain on one machine, nothing to start by hand.

real Criteo sample (or a generated log) -> preprocess (Beam DirectRunner) -> train (local) ->
evaluate -> export -> `recpipe serve` in its own process on 127.0.0.1 -> a few raw rows over
REST -> scores and AUC printed -> server shut down.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from recpipe.features.canonical import list_separators
from recpipe.features.config import load_config
from recpipe.pipeline.criteo import criteo_csv_to_parquet
from recpipe.pipeline.preprocess import run_preprocess
from recpipe.pipeline.synthetic import GenerateSpec, generate_log
from recpipe.localserver import free_ports, post_json, rest_rows, start_server, stop_server, wait_healthy
from recpipe.samples import find_criteo_sample, repo_configs
from recpipe.serving.export.savedmodel import export_model
from recpipe.serving.version import ExportBase
from recpipe.trainers.evaluation.evaluate import evaluate
from recpipe.trainers.options import RunOptions, TrainOptions
from recpipe.trainers.train import train

__all__ = ["DemoOptions", "run_demo"]

MARKER = ".recpipe-demo"
SYNTHETIC_DEMO_STEPS = 800  # ~15 epochs of the 54k-row demo log; keeps the demo near a minute


@dataclass(frozen=True)
class DemoOptions:
    workdir: str = "demo_out"
    rows: int = 60_000
    steps: Optional[int] = None
    synthetic: bool = False
    sample_rows: int = 5


def _fresh_workdir(path: str) -> Path:
    work = Path(path)
    if work.exists():
        if not (work / MARKER).exists():
            raise FileExistsError(f"{work}: exists and was not made by `recpipe demo`; pass another --workdir")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / MARKER).write_text("made by recpipe demo; removed by the next demo run\n")
    return work


def run_demo(opts: DemoOptions, say: Callable[[str], None] = print) -> dict:
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    def stage(name: str, t0: float) -> None:
        timings[name] = round(time.perf_counter() - t0, 1)

    work = _fresh_workdir(opts.workdir)
    criteo = None if opts.synthetic else find_criteo_sample()
    t0 = time.perf_counter()
    if criteo is not None:
        say(f"demo: 1/7 real Criteo sample {criteo} -> Parquet")
        log_files = [criteo_csv_to_parquet(str(criteo), str(work / "log"))]
        config_path = repo_configs() / "criteo.yaml"
    else:
        say(f"demo: 1/7 generating a synthetic click log ({opts.rows} rows, 3 days)")
        log_files = generate_log(GenerateSpec(rows=opts.rows, days=3, seed=7), str(work / "log"))
        config_path = repo_configs() / "synthetic.yaml"
    stage("data", t0)
    cfg = load_config(config_path)

    t0 = time.perf_counter()
    say(f"demo: 2/7 preprocess on Beam's DirectRunner ({config_path.name})")
    run_preprocess(cfg, str(work / "log"), str(work / "preprocessed"), say=say)
    stage("preprocess", t0)

    t0 = time.perf_counter()
    say("demo: 3/7 train (local strategy)")
    steps = opts.steps if opts.steps is not None else (None if criteo else SYNTHETIC_DEMO_STEPS)
    train(TrainOptions(data_dir=str(work / "preprocessed"), model_dir=str(work / "model"),
                       config_path=str(config_path), run=RunOptions(steps=steps)), say=say)
    stage("train", t0)

    t0 = time.perf_counter()
    say("demo: 4/7 evaluate on the eval split (the last part of the log by time)")
    metrics = evaluate(str(work / "model"), str(work / "preprocessed"), str(work / "metrics.json"))
    say(f"demo: eval {json.dumps(metrics)}")
    stage("evaluate", t0)

    t0 = time.perf_counter()
    say("demo: 5/7 export (SavedModel, raw columns in, score out)")
    version_dir = export_model(str(work / "model"), str(work / "export"), metrics=metrics)
    skew = ExportBase(str(work / "export")).versions()[-1].skew_report()
    say(f"demo: exported {version_dir}; skew check: {skew['rows']} raw eval rows scored through the SavedModel "
        f"and the Beam/trainer path, max |diff| {skew['max_abs_diff']:.2g} (limit {skew['tolerance']:g})")
    stage("export", t0)

    t0 = time.perf_counter()
    port, grpc_port = free_ports(2)
    say(f"demo: 6/7 starting `recpipe serve` on 127.0.0.1:{port} (REST) / {grpc_port} (gRPC)")
    proc = start_server(str(work / "export"), cfg.name, port, grpc_port)
    try:
        wait_healthy(port, proc)
        columns = sorted({f.column for f in [*cfg.column_sparse, *cfg.features.dense]})
        rows, labels = rest_rows(log_files[-1], columns, opts.sample_rows, separators=list_separators(cfg))
        say(f"demo: 7/7 POST /v1/models/{cfg.name}:predict with {len(rows)} raw rows from the end of the log")
        resp = post_json(f"http://127.0.0.1:{port}/v1/models/{cfg.name}:predict", {"instances": rows})
        scores = resp["predictions"]
        for i, (s, y) in enumerate(zip(scores, labels)):
            say(f"demo:   row {i}: score {s:.4f}  (clicked: {y})")
    finally:
        stop_server(proc)
    stage("serve", t0)
    total = time.perf_counter() - t_start
    summary = {"data": "criteo_10k" if criteo else f"synthetic_{opts.rows}", "auc": metrics["auc"],
               "logloss": metrics["logloss"], "eval_examples": metrics["examples"], "scores": scores,
               "stage_seconds": timings, "total_seconds": round(total, 1)}
    (work / "demo_summary.json").write_text(json.dumps(summary, indent=1))
    say(f"demo: AUC {metrics['auc']:.4f}, logloss {metrics['logloss']:.4f} on {metrics['examples']} eval rows; "
        f"server stopped; total {total:.0f}s (stages: {timings})")
    return summary
