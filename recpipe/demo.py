"""`recpipe demo`: the whole chain on one machine, nothing to start by hand.

real Criteo sample (or a generated log) -> preprocess (Beam DirectRunner) -> train (local) ->
evaluate -> export -> `recpipe serve` in its own process on 127.0.0.1 -> a few raw rows over
REST -> scores and AUC printed -> server shut down.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pyarrow.parquet as pq

__all__ = ["DemoOptions", "run_demo", "find_criteo_sample", "repo_configs", "rest_rows", "free_port", "wait_healthy"]

MARKER = ".recpipe-demo"
SYNTHETIC_DEMO_STEPS = 800  # ~15 epochs of the 54k-row demo log; keeps the demo near a minute


@dataclass(frozen=True)
class DemoOptions:
    workdir: str = "demo_out"
    rows: int = 60_000
    steps: Optional[int] = None
    synthetic: bool = False
    sample_rows: int = 5


def repo_configs() -> Path:
    path = Path(__file__).resolve().parents[1] / "configs"
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: shipped configs not found (install the project with `pip install -e .`)")
    return path


def find_criteo_sample() -> Optional[Path]:
    """The real Criteo sample in ../shared/data, looked up from the repo and the working directory."""
    env = os.environ.get("RECPIPE_CRITEO_CSV")
    if env:
        return Path(env) if Path(env).is_file() else None
    for base in (Path(__file__).resolve().parents[1], Path.cwd()):
        candidate = base.parent / "shared" / "data" / "criteo_sample" / "criteo_10k.csv"
        if candidate.is_file():
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rest_rows(parquet_path: str, columns: list[str], n: int, from_end: bool = True) -> tuple[list[dict], list[int]]:
    """n raw rows of a log file as TF Serving 'instances' (lists joined with '|') and their labels."""
    pf = pq.ParquetFile(parquet_path)
    table = pf.read(columns=[*columns, "label"]) if "label" not in columns else pf.read(columns=columns)
    table = table.slice(max(table.num_rows - n, 0) if from_end else 0, n)
    rows = []
    for r in table.to_pylist():
        inst = {}
        for c in columns:
            v = r[c]
            if isinstance(v, list):
                v = "|".join(str(x) for x in v)
            if v is not None:
                inst[c] = v
        rows.append(inst)
    return rows, [int(x) for x in table.column("label").to_pylist()]


def _post(url: str, body: dict, timeout: float = 30.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Block until the model server in `proc` answers /healthz on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"model server exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.5)
    raise TimeoutError(f"model server not healthy on port {port} after {timeout:.0f}s")


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
    from features.config import load_config
    from pipeline.criteo import criteo_csv_to_parquet
    from pipeline.preprocess import run_preprocess
    from pipeline.synthetic import GenerateSpec, generate_log
    from recpipe.cli import DEFAULT_BEAM_ARGS
    from serving.export import export_model
    from trainers.evaluate import evaluate
    from trainers.train import TrainOptions, train

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
    run_preprocess(cfg, str(work / "log"), str(work / "preprocessed"), list(DEFAULT_BEAM_ARGS), progress=say)
    stage("preprocess", t0)

    t0 = time.perf_counter()
    say("demo: 3/7 train (local strategy)")
    steps = opts.steps if opts.steps is not None else (None if criteo else SYNTHETIC_DEMO_STEPS)
    train(TrainOptions(data_dir=str(work / "preprocessed"), model_dir=str(work / "model"),
                       config_path=str(config_path), steps=steps), say=say)
    stage("train", t0)

    t0 = time.perf_counter()
    say("demo: 4/7 evaluate on the eval split (the last part of the log by time)")
    metrics = evaluate(str(work / "model"), str(work / "preprocessed"), str(work / "metrics.json"))
    say(f"demo: eval {json.dumps(metrics)}")
    stage("evaluate", t0)

    t0 = time.perf_counter()
    say("demo: 5/7 export (SavedModel, raw columns in, score out)")
    version_dir = export_model(str(work / "model"), str(work / "export"))
    skew = json.loads((Path(version_dir) / "skew_check.json").read_text())
    say(f"demo: exported {version_dir}; skew check: {skew['rows']} raw eval rows scored through the SavedModel "
        f"and the Beam/trainer path, max |diff| {skew['max_abs_diff']:.2g} (limit {skew['tolerance']:g})")
    stage("export", t0)

    t0 = time.perf_counter()
    port, grpc_port = free_port(), free_port()
    say(f"demo: 6/7 starting `recpipe serve` on 127.0.0.1:{port} (REST) / {grpc_port} (gRPC)")
    proc = subprocess.Popen([sys.executable, "-m", "recpipe.cli", "serve", "--model-base", str(work / "export"),
                             "--model-name", cfg.name, "--rest-port", str(port), "--grpc-port", str(grpc_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(port, proc)
        columns = sorted({f.column for f in [*cfg.features.sparse, *cfg.features.dense]})
        rows, labels = rest_rows(log_files[-1], columns, opts.sample_rows)
        say(f"demo: 7/7 POST /v1/models/{cfg.name}:predict with {len(rows)} raw rows from the end of the log")
        resp = _post(f"http://127.0.0.1:{port}/v1/models/{cfg.name}:predict", {"instances": rows})
        scores = resp["predictions"]
        for i, (s, y) in enumerate(zip(scores, labels)):
            say(f"demo:   row {i}: score {s:.4f}  (clicked: {y})")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    stage("serve", t0)
    total = time.perf_counter() - t_start
    summary = {"data": "criteo_10k" if criteo else f"synthetic_{opts.rows}", "auc": metrics["auc"],
               "logloss": metrics["logloss"], "eval_examples": metrics["examples"], "scores": scores,
               "stage_seconds": timings, "total_seconds": round(total, 1)}
    (work / "demo_summary.json").write_text(json.dumps(summary, indent=1))
    say(f"demo: AUC {metrics['auc']:.4f}, logloss {metrics['logloss']:.4f} on {metrics['examples']} eval rows; "
        f"server stopped; total {total:.0f}s (stages: {timings})")
    return summary
