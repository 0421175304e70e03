"""Training benchmarks, every ratio against a baseline measured in the same run.

Each measurement is a fresh `recpipe train` process (figures: steady ex/s after the first
checkpoint interval, from train_state.json; peak RSS of the process), repeated `reps` times:
  - real shards vs a synthetic in-memory batch (same model): what the input pipeline costs;
  - ours vs the TFRS-tutorial peer (recpipe.bench.tfrs_peer: the same DCN-v2 as a tfrs.Model with
    Keras Embeddings, data in memory, model.fit), fp32 and bf16, ex/s and eval AUC at equal examples;
  - bf16 vs fp32 on a dense-heavy DCN-v2 (and on the default, embedding-heavy one);
  - every train.tuning knob against the defaults (ex/s and peak RSS);
  - Horovod np=2 vs 2 x np=1, one thread each, vs two independent np=1 runs at once (the box's
    2-process ceiling) and vs plain Horovod (recpipe.bench.horovod_peer: Horovod's Keras example way,
    dense gradients); PS 2 workers + 2 PS vs local with the same threads;
  - peak RSS vs embedding-table rows (and vs data size at a fixed table);
  - the matmul FLOP/s ceiling of this CPU, and the fraction each configuration reaches;
  - where the default model's step goes: cross layers, deep layers, the rest, and the most any implementation
    could lead the TFRS-tutorial peer by: its step over the cross and deep layers alone (recpipe.bench.step_parts);
  - eval AUC on the shared Criteo sample: local/PS/Horovod DCN-v2 and logistic regression;
  - the scale-out model (recpipe.bench.scaleout) fed with these figures.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import yaml

from recpipe.features.config import load_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.bench.common import generate_once, preprocess_once, summary
from recpipe.bench.flops import dense_flops_per_example
from recpipe.bench.quality import criteo_quality
from recpipe.bench.scaleout import scale_out_report
from recpipe.bench.train_runs import TrainRuns

__all__ = ["TrainBenchOptions", "bench_train", "markdown", "KNOBS"]

CLI = [sys.executable, "-m", "recpipe.cli"]

# One variant per knob, each switching ONE train.tuning key away from the defaults.
KNOBS: dict[str, dict] = {
    "dedup_ids_off": {"dedup_ids": False},
    "grad_accum_4": {"grad_accum_steps": 4},
    "jit_dense_on": {"jit_dense": True},
    "steps_per_execution_1": {"steps_per_execution": 1},  # the default, 0, runs 100 steps per call locally
    "data_lean": {"data_ram_budget_mb": 64, "prefetch_batches": 1},
    "threads_1": {"intra_op_threads": 1, "inter_op_threads": 1},
    "inter_op_1": {"inter_op_threads": 1},
    "system_malloc": {"allocator": "system"},  # the default, auto, is tcmalloc where installed
    "jemalloc": {"allocator": "jemalloc"},
}
DENSE_HEAVY = {"task": "ranking", "type": "dcn_v2", "cross_layers": 3, "deep_layers": [1024, 1024, 512, 256]}


@dataclass(frozen=True)
class TrainBenchOptions:
    rows: int = 200_000
    steps: int = 300
    reps: int = 3
    quick: bool = False
    bandwidth_gbps: float = 10.0
    criteo_csv: Optional[str] = None  # the shared Criteo sample (CSV); None skips the quality runs
    data_dir: Optional[str] = None    # already preprocessed data (e.g. the preprocess suite's); else generated


def _module_json(module: str, *args: str) -> dict:
    """The JSON line a measuring module prints, run in a fresh process (this one's thread pools may be set up)."""
    out = subprocess.run([sys.executable, "-m", module, *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _ceiling(reps: int, seconds: float) -> dict:
    """The matmul ceiling (recpipe.bench.flops)."""
    return {k: summary(v) for k, v in _module_json("recpipe.bench.flops", "2048", str(reps), str(seconds)).items()}


def _flops_per_example(cfg_path: str, data: str) -> int:
    """Training FLOPs per example of the dense part (3 x forward)."""
    return 3 * dense_flops_per_example(load_config(cfg_path), PreprocessedData(data).transform())


def bench_train(o: TrainBenchOptions, work: str, cfg_path: str, say: Callable[[str], None]) -> dict:
    os.makedirs(work, exist_ok=True)
    with open(cfg_path) as fh:
        base = yaml.safe_load(fh)
    runs = TrainRuns(work, o.reps, say)
    steps = o.steps
    # Two checkpoint intervals per run: the steady rate is the second (no tracing, XLA compile, warm-up
    # or checkpoint write in it).
    train_cfg = {"checkpoint_every": max(steps // 2, 1)}
    if o.data_dir:
        pre = o.data_dir
        say(f"bench train: data {pre}")
    else:
        say(f"bench train: {o.rows:,} generated rows -> preprocess")
        pre = preprocess_once(cfg_path, generate_once(o.rows, os.path.join(work, "log")), os.path.join(work, "pre"))

    default = runs.config("default", base, train=train_cfg)
    runs.plan("real_fp32", pre, default, steps, auc=True)
    runs.plan_peer("tfrs_fit_fp32", pre, default, steps, "fp32")  # the TFRS-tutorial way, same model and data
    runs.plan("synthetic_fp32", pre, default, steps, "--synthetic-input")
    dense = runs.config("dense_heavy", base, model=DENSE_HEAVY, train=train_cfg)
    runs.plan("dense_fp32", pre, dense, steps)
    runs.plan("dense_bf16", pre, dense, steps, "--precision", "bf16")
    if not o.quick:  # bf16 on the embedding-heavy default, and on the dense-heavy model without input
        runs.plan("real_bf16", pre, default, steps, "--precision", "bf16", auc=True)
        runs.plan_peer("tfrs_fit_bf16", pre, default, steps, "bf16")
        runs.plan("dense_fp32_synthetic", pre, dense, steps, "--synthetic-input")
        runs.plan("dense_bf16_synthetic", pre, dense, steps, "--precision", "bf16", "--synthetic-input")
    knobs = {} if o.quick else KNOBS
    for name, tuning in knobs.items():
        runs.plan(f"knob_{name}", pre, runs.config(f"knob_{name}", base, train={**train_cfg, "tuning": tuning}), steps)

    # Strategies: Horovod one thread per rank; PS workers one thread each vs local with 2 threads.
    runs.plan("horovod_np1", pre, default, steps, "--strategy", "horovod", "--np", "1", "--threads", "1")
    runs.plan("horovod_np2", pre, default, steps, "--strategy", "horovod", "--np", "2", "--threads", "1",
              auc=True)
    runs.plan_horovod_peer("plain_horovod_np2", pre, default, steps, 2)  # Horovod's Keras example way
    if not o.quick:  # what parsing shards costs the ranks (the peer holds its data in memory)
        runs.plan("horovod_np2_synthetic", pre, default, steps, "--strategy", "horovod", "--np", "2", "--threads",
                  "1", "--synthetic-input")
        # the peer with our cycle time (train.horovod_cycle_time_ms), and ours with Horovod's own, 1 ms
        runs.plan_horovod_peer("plain_horovod_np2_same_cycle", pre, default, steps, 2,
                               cycle_time_ms=load_config(default).train.horovod_cycle_time_ms)
        runs.plan("horovod_np2_cycle_1ms", pre, runs.config("horovod_cycle_1ms", base,
                                                            train={**train_cfg, "horovod_cycle_time_ms": 1.0}),
                  steps, "--strategy", "horovod", "--np", "2", "--threads", "1")
    # the same one-thread rank twice at once, nothing exchanged: this box's 2-process ceiling
    runs.plan("independent_np1_x2", pre, default, steps, "--strategy", "horovod", "--np", "1",
              "--threads", "1", copies=2)
    if os.cpu_count() != 2:  # TensorFlow's default pools are the core count: on 2 cores real_fp32 IS this run
        runs.plan("local_threads2", pre, default, steps, "--threads", "2")
    runs.plan("ps_2w_2ps", pre, default, steps, "--strategy", "ps", "--ps-workers", "2", "--ps-servers", "2",
              "--ps-task-threads", "1")
    runs.run_planned()
    if "local_threads2" not in runs.results:
        runs.results["local_threads2"] = runs.results["real_fp32"]

    say("bench train: step parts of the default model (cross layers, deep layers, the rest; the peer's step)")
    parts = _module_json("recpipe.bench.step_parts", pre, default, str(4 if o.quick else 30), str(o.reps))
    rss = _rss_vs_table(o, work, base, runs, say)
    say("bench train: matmul ceiling (fp32, bf16)")
    ceiling = _ceiling(o.reps, 0.5 if o.quick else 1.5)
    flops = {"default": _flops_per_example(default, pre), "dense_heavy": _flops_per_example(dense, pre)}
    fraction = {}
    for name, r in runs.results.items():
        model = "dense_heavy" if name.startswith("dense") else "default"
        if name.startswith(("rss_", "data_")):
            continue
        prec = "bf16" if "bf16" in name else "fp32"
        fraction[name] = r["examples_per_s"]["median"] * flops[model] / (ceiling[prec]["median"] * 1e9)

    quality = criteo_quality(o.criteo_csv, work, say, o.quick) if o.criteo_csv else {}
    scaling = scale_out_report(pre, default, runs.results, o.bandwidth_gbps, say)

    ratios = {
        "train_real_vs_synthetic_input": runs.median("real_fp32") / runs.median("synthetic_fp32"),
        "train_vs_tfrs_fit": runs.median("real_fp32") / runs.median("tfrs_fit_fp32"),
        "train_vs_tfrs_fit_auc": runs.median("real_fp32", "eval_auc") / runs.median("tfrs_fit_fp32", "eval_auc"),
        # the most any implementation of the model could lead the peer by: the peer's compiled step over the
        # model's cross and deep layers alone, forward and backward (recpipe.bench.step_parts)
        "train_vs_tfrs_fit_dense_bound": parts["bound_vs_peer"],
        "train_default_roofline_fraction": fraction["real_fp32"],
        "train_bf16_vs_fp32": runs.median("dense_bf16") / runs.median("dense_fp32"),
        "train_horovod_scaling_2": runs.median("horovod_np2") / (2 * runs.median("horovod_np1")),
        "train_ps_vs_local": runs.median("ps_2w_2ps") / runs.median("local_threads2"),
        "train_horovod_vs_plain_horovod": runs.median("horovod_np2") / runs.median("plain_horovod_np2"),
        "train_two_independent_vs_2x_one": runs.median("independent_np1_x2") / (2 * runs.median("horovod_np1")),
        "train_horovod_np2_vs_two_independent": runs.median("horovod_np2") / runs.median("independent_np1_x2"),
        **{f"train_knob_{n}_speed": runs.median(f"knob_{n}") / runs.median("real_fp32") for n in knobs},
        **{f"train_knob_{n}_rss": runs.median(f"knob_{n}", "peak_rss_mb") / runs.median("real_fp32", "peak_rss_mb")
           for n in knobs},
        **rss.get("ratios", {}),
    }
    if not o.quick:
        ratios["train_bf16_vs_fp32_embedding_heavy"] = runs.median("real_bf16") / runs.median("real_fp32")
        ratios["train_vs_tfrs_fit_bf16"] = runs.median("real_bf16") / runs.median("tfrs_fit_bf16")
        ratios["train_tfrs_fit_bf16_vs_fp32"] = runs.median("tfrs_fit_bf16") / runs.median("tfrs_fit_fp32")
        ratios["train_bf16_vs_fp32_dense_synthetic"] = (runs.median("dense_bf16_synthetic") /
                                                        runs.median("dense_fp32_synthetic"))
        ratios["train_horovod_np2_real_vs_synthetic_input"] = (runs.median("horovod_np2") /
                                                               runs.median("horovod_np2_synthetic"))
        ratios["train_horovod_cycle_vs_1ms"] = runs.median("horovod_np2") / runs.median("horovod_np2_cycle_1ms")
        ratios["train_horovod_vs_plain_horovod_same_cycle"] = (runs.median("horovod_np2") /
                                                               runs.median("plain_horovod_np2_same_cycle"))
    if quality:
        ratios["train_dcn_vs_logistic_auc"] = quality["local"]["auc"] / quality["logistic"]["auc"]
    return {
        "suite": "train", "rows": o.rows, "steps": steps, "reps": o.reps, "quick": o.quick,
        "config": {"default": base.get("model"), "dense_heavy": DENSE_HEAVY, "batch_size": base["train"]["batch_size"],
                   "knobs": knobs},
        "runs": runs.results, "ceiling_gflops": ceiling, "train_flops_per_example": flops,
        "fraction_of_ceiling": fraction, "step_parts": parts, "rss_vs_table": rss, "criteo_quality": quality,
        "scale_out": scaling,
        "ratios": ratios,
    }


def _rss_vs_table(o: TrainBenchOptions, work: str, base: dict, runs: TrainRuns, say: Callable[[str], None]) -> dict:
    """Peak RSS of local training with one hashed table of growing size (same data), and at a fixed
    table with 4x the data: memory should follow the table, not the data."""
    sizes = (100_000, 1_000_000) if o.quick else (100_000, 1_000_000, 4_000_000)
    rows, steps = (5_000, 20) if o.quick else (50_000, 100)
    small = generate_once(rows, os.path.join(work, "rss_log"), seed=11)
    cfg = {**base, "features": {"sparse": [{"name": "user_id", "column": "user_id", "hash_buckets": 0,
                                           "embedding_dim": 32}],
                                "dense": base["features"]["dense"][:2]},
           "model": {"task": "ranking", "type": "dcn_v2", "cross_layers": 1, "deep_layers": [64]},
           "train": {**base["train"], "checkpoint_every": steps // 2}}
    out: dict = {"table_rows": [], "peak_rss_mb": [], "table_mb": []}
    for n in sizes:
        cfg["features"]["sparse"][0]["hash_buckets"] = n
        path = runs.config(f"rss_{n}", cfg)
        data = preprocess_once(path, small, os.path.join(work, f"rss_pre_{n}"), beam=not o.quick)
        r = runs.run(f"rss_{n}", data, path, steps, reps=1)
        out["table_rows"].append(n)
        out["peak_rss_mb"].append(r["peak_rss_mb"]["median"])
        out["table_mb"].append(n * 32 * 4 * 2 / 2**20)  # weights + Adagrad accumulator, float32
    if len(sizes) > 1:
        slope = (out["peak_rss_mb"][-1] - out["peak_rss_mb"][0]) / (out["table_mb"][-1] - out["table_mb"][0])
        out["rss_mb_per_table_mb"] = slope
    if o.quick:
        return out
    # Same table (the smallest), 4x the rows of data.
    big = generate_once(rows * 4, os.path.join(work, "rss_log_4x"), seed=12)
    cfg["features"]["sparse"][0]["hash_buckets"] = sizes[0]
    path = runs.config("data_4x", cfg)
    data = preprocess_once(path, big, os.path.join(work, "rss_pre_4x"))
    r = runs.run("data_4x", data, path, steps, reps=1)
    out["data_4x_peak_rss_mb"] = r["peak_rss_mb"]["median"]
    out["ratios"] = {"train_rss_data_4x_vs_1x": out["data_4x_peak_rss_mb"] / out["peak_rss_mb"][0]}
    out["ratios"]["train_rss_table_40x_vs_1x"] = out["peak_rss_mb"][-1] / out["peak_rss_mb"][0]
    return out


def markdown(r: dict) -> str:
    runs, ratios = r["runs"], r["ratios"]

    def row(name: str, what: str) -> str:
        x, m = runs[name]["examples_per_s"], runs[name]["peak_rss_mb"]["median"]
        frac = r["fraction_of_ceiling"].get(name)
        frac_s = f"{frac:.1%}" if frac is not None else ""
        return f"| {name} | {what} | {x['median']:,.0f} | {x['min']:,.0f}–{x['max']:,.0f} | {m:,.0f} | {frac_s} |"

    what = {"real_fp32": "defaults, real shards", "synthetic_fp32": "synthetic in-memory batch",
            "real_bf16": "mixed_bfloat16", "dense_fp32": "dense-heavy DCN-v2", "dense_bf16": "dense-heavy, bf16",
            "dense_fp32_synthetic": "dense-heavy, synthetic input",
            "dense_bf16_synthetic": "dense-heavy, bf16, synthetic",
            "horovod_np1": "Horovod np=1, 1 thread", "horovod_np2": "Horovod np=2, 1 thread each",
            "horovod_np2_synthetic": "Horovod np=2, 1 thread each, synthetic in-memory batch",
            "horovod_np2_cycle_1ms": "Horovod np=2, 1 thread each, Horovod's default 1 ms cycle time",
            "plain_horovod_np2_same_cycle": "peer: plain Horovod np=2 with our cycle time (horovodrun --cycle-time-ms)",
            "independent_np1_x2": "two np=1 runs at once (no exchange), 1 thread each",
            "local_threads2": "local, 2 threads", "ps_2w_2ps": "PS 2 workers (1 thread) + 2 PS",
            "tfrs_fit_fp32": "peer: TFRS tutorial (Keras Embedding per table, data in memory, model.fit)",
            "tfrs_fit_bf16": "peer: TFRS tutorial, mixed_bfloat16",
            "plain_horovod_np2": "peer: horovod.tensorflow.keras DistributedOptimizer (dense gradients) + fit, "
                                 "np=2, 1 thread each"}
    what.update({f"knob_{k}": f"tuning {v}" for k, v in r["config"]["knobs"].items()})
    c = r["ceiling_gflops"]
    lines = [f"# Training benchmark ({r['rows']:,} generated rows, {r['steps']} steps, median of {r['reps']} runs, "
             f"{r['machine']['cpus']} cores{', QUICK' if r['quick'] else ''})", "",
             f"Matmul ceiling (2048², TensorFlow): fp32 {c['fp32']['median']:,.0f} GFLOP/s, "
             f"bf16 {c['bf16']['median']:,.0f} GFLOP/s. Training FLOPs/example (dense part, 3x forward): "
             f"default {r['train_flops_per_example']['default']:,}, dense-heavy "
             f"{r['train_flops_per_example']['dense_heavy']:,}.", "",
             "| run | what | ex/s (median) | min–max | peak RSS MB | of FLOP/s ceiling |", "|---|---|---|---|---|---|",
             *[row(n, what.get(n, "")) for n in runs if not n.startswith(("rss_", "data_"))], "",
             "## Ratios", "", "| ratio | value |", "|---|---|",
             *[f"| {k} | {v:.3f} |" for k, v in sorted(ratios.items())], ""]
    same = [n for n in ("real_fp32", "tfrs_fit_fp32", "real_bf16", "tfrs_fit_bf16", "horovod_np2",
                        "plain_horovod_np2") if "eval_auc" in runs.get(n, {})]
    lines += ["## Against the peers: eval AUC after the same steps", "",
              "Same config (tables, cross and deep layers, optimizer, batch per rank), same data: the TFRS-tutorial "
              "peer (`recpipe.bench.tfrs_peer`) and plain Horovod (`recpipe.bench.horovod_peer`).", "",
              "| run | eval AUC (median) | min–max |", "|---|---|---|",
              *[f"| {n} | {runs[n]['eval_auc']['median']:.4f} | {runs[n]['eval_auc']['min']:.4f}–"
                f"{runs[n]['eval_auc']['max']:.4f} |" for n in same], ""]
    p = r["step_parts"]
    lines += ["## Where the default model's step goes (ablation, fixed in-memory batches)", "",
              f"`recpipe.bench.step_parts`: the compiled train step, {p['steps']} steps of {p['batch_size']} per "
              "variant; the input pipeline's cost is real_fp32 against synthetic_fp32 above.", "",
              "| part | ms per step | share |", "|---|---|---|",
              *[f"| {k.replace('_', ' ')} | {v:.1f} | {p['parts_share'][k]:.0%} |" for k, v in p["parts_ms"].items()],
              f"| whole step | {p['step_ms']['full']:.1f} | 100% |", "",
              f"Timed round-robin with them: the TFRS-tutorial peer's whole step {p['step_ms']['peer']:.1f} ms, and "
              f"the cross and deep layers and logit alone, forward and backward on the model's own input (no "
              f"lookups, optimizer or input) {p['step_ms']['dense_layers']:.1f} ms. Every implementation of this "
              f"model computes at least those, so none can lead the peer by more than {p['bound_vs_peer']:.2f}x "
              f"(`train_vs_tfrs_fit_dense_bound`).", ""]
    t = r["rss_vs_table"]
    lines += ["## Peak RSS vs embedding-table rows (one 32-wide hashed table, same data)", "",
              "| table rows | table + Adagrad MB | peak RSS MB |", "|---|---|---|",
              *[f"| {n:,} | {mb:,.0f} | {rss:,.0f} |" for n, mb, rss in zip(t["table_rows"], t["table_mb"],
                                                                            t["peak_rss_mb"])],
              (f"\n4x the data at {t['table_rows'][0]:,} rows: {t['data_4x_peak_rss_mb']:,.0f} MB. "
               if "data_4x_peak_rss_mb" in t else "\n") +
              f"Slope: {t.get('rss_mb_per_table_mb', float('nan')):.2f} MB of RSS per MB of table.", ""]
    if r["criteo_quality"]:
        q = r["criteo_quality"]
        lines += ["## Eval quality on the shared Criteo sample (time split)", "",
                  "| model / strategy | eval AUC | logloss | steps |", "|---|---|---|---|",
                  *[f"| {k} | {v['auc']:.4f} | {v['logloss']:.4f} | {v['steps']} |" for k, v in q.items()], ""]
    s = r["scale_out"]
    lines += ["## Scale-out model", "", s["markdown"], "",
              "Reproduce: `.venv/bin/recpipe bench train` (add `--quick` for the smoke run).", ""]
    return "\n".join(lines)
