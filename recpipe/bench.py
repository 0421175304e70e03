"""`recpipe bench`: throughput of each stage in ONE run on this machine -> JSON + markdown.

Stages: generate (rows/s), preprocess on the DirectRunner (rows/s, peak RSS of the job), training
ex/s for fp32 vs bf16 on the same data and model, and SavedModel predict throughput from raw rows.
Ratios are only meaningful within one run (shared, noisy machines).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Optional

__all__ = ["BenchOptions", "run_bench", "run_measured"]


@dataclass(frozen=True)
class BenchOptions:
    rows: int = 200_000
    steps: int = 200
    out_dir: str = "bench/results"
    workdir: Optional[str] = None
    name: str = "pipeline"


def run_measured(cmd: list[str]) -> tuple[float, float, str]:
    """Run a command; return (wall seconds, peak RSS MB of that child, stdout). Output is spooled to
    temp files, so a chatty child cannot fill a pipe and block."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage, not all children's
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... failed: {stderr.strip().splitlines()[-1:]}")
    return wall, usage.ru_maxrss / 1024.0, stdout


def run_bench(opts: BenchOptions, say: Callable[[str], None] = print) -> dict:
    from recpipe.demo import repo_configs
    work = opts.workdir or tempfile.mkdtemp(prefix="recpipe-bench-")
    os.makedirs(work, exist_ok=True)
    cfg_path = str(repo_configs() / "synthetic.yaml")
    log, pre = os.path.join(work, "log"), os.path.join(work, "pre")
    cli = [sys.executable, "-m", "recpipe.cli"]
    results: dict = {"rows": opts.rows, "steps": opts.steps, "machine": {
        "cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}}

    say(f"bench: generate {opts.rows} rows")
    wall, _, _ = run_measured([*cli, "generate", "--rows", str(opts.rows), "--days", "3", "--out", log])
    results["generate_rows_per_s"] = opts.rows / wall

    say("bench: preprocess (DirectRunner in_memory)")
    wall, peak, _ = run_measured([*cli, "preprocess", "--config", cfg_path, "--input", log, "--output", pre])
    results["preprocess_rows_per_s"] = opts.rows / wall
    results["preprocess_wall_s"] = wall
    results["preprocess_peak_rss_mb"] = peak

    for precision in ("fp32", "bf16"):
        say(f"bench: train {opts.steps} steps, {precision}")
        _, _, out = run_measured([*cli, "train", "--config", cfg_path, "--data", pre, "--model-dir",
                                        os.path.join(work, f"model_{precision}"), "--steps", str(opts.steps),
                                        "--precision", precision])
        state = json.load(open(os.path.join(work, f"model_{precision}", "train_state.json")))
        results[f"train_{precision}_examples_per_s"] = state["examples_per_sec_last_run"]
    results["train_bf16_over_fp32"] = results["train_bf16_examples_per_s"] / results["train_fp32_examples_per_s"]

    say("bench: export + SavedModel predict from raw rows")
    run_measured([*cli, "export", "--model-dir", os.path.join(work, "model_fp32"), "--export-base",
                        os.path.join(work, "export"), "--version", "1"])
    results.update(_predict_throughput(os.path.join(work, "export", "1"), log))

    os.makedirs(opts.out_dir, exist_ok=True)
    json_path = os.path.join(opts.out_dir, f"{opts.name}.json")
    with open(json_path, "w") as fh:
        json.dump(results, fh, indent=1, sort_keys=True)
    md_path = os.path.join(opts.out_dir, f"{opts.name}.md")
    with open(md_path, "w") as fh:
        fh.write(_markdown(results))
    say(f"bench: wrote {json_path} and {md_path}")
    say(_markdown(results))
    return results


def _predict_throughput(version_dir: str, log_dir: str) -> dict:
    import glob

    import pyarrow.parquet as pq
    import tensorflow as tf

    from features.transform import request_from_arrow
    fn = tf.saved_model.load(version_dir).signatures["serving_default"]
    specs = dict(fn.structured_input_signature[1])
    table = pq.read_table(sorted(glob.glob(os.path.join(log_dir, "*", "*.parquet")))[-1]).slice(0, 1024)
    request = request_from_arrow(table, specs)
    out = {}
    for batch in (1, 256):
        sub = {k: v[:batch] for k, v in request.items()}
        fn(**sub)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 3.0:
            fn(**sub)
            n += 1
        secs = time.perf_counter() - t0
        out[f"predict_b{batch}_rows_per_s"] = n * batch / secs
        out[f"predict_b{batch}_ms_per_call"] = 1000 * secs / n
    return out


def _markdown(r: dict) -> str:
    return "\n".join([
        f"# recpipe pipeline benchmark ({r['rows']:,} generated rows, {r['machine']['cpus']} cores, one run)",
        "",
        "| stage | figure |",
        "|---|---|",
        f"| generate | {r['generate_rows_per_s']:,.0f} rows/s |",
        f"| preprocess (Beam DirectRunner, in_memory; wall time incl. start-up) | {r['preprocess_rows_per_s']:,.0f} rows/s, "
        f"peak RSS {r['preprocess_peak_rss_mb']:,.0f} MB |",
        f"| train DCN-v2 fp32 | {r['train_fp32_examples_per_s']:,.0f} ex/s |",
        f"| train DCN-v2 bf16 (mixed_bfloat16) | {r['train_bf16_examples_per_s']:,.0f} ex/s "
        f"({r['train_bf16_over_fp32']:.2f}x fp32) |",
        f"| SavedModel predict, raw rows, batch 1 | {r['predict_b1_ms_per_call']:.2f} ms/call |",
        f"| SavedModel predict, raw rows, batch 256 | {r['predict_b256_rows_per_s']:,.0f} rows/s |",
        "",
        "Reproduce: `make bench` (or `.venv/bin/recpipe bench --rows N --steps S`).",
        "",
    ])
