"""Training benchmarks (issue 4), every ratio against a baseline measured in the same run.

Each measurement is a fresh `recpipe train` process (figures: steady ex/s after the first
checkpoint interval, from train_state.json; peak RSS of the process), repeated `reps` times:
  - real shards vs a synthetic in-memory batch (same model): what the input pipeline costs;
  - bf16 vs fp32 on a dense-heavy DCN-v2 (and on the default, embedding-heavy one);
  - every train.tuning knob against the defaults (ex/s and peak RSS);
  - Horovod np=2 vs 2 x np=1, one thread each; PS 2 workers + 2 PS vs local with the same threads;
  - peak RSS vs embedding-table rows (and vs data size at a fixed table);
  - the matmul FLOP/s ceiling of this CPU, and the fraction each configuration reaches;
  - eval AUC on the shared Criteo sample: local/PS/Horovod DCN-v2 and logistic regression;
  - the scale-out model (recpipe.scaleout) fed with these figures.
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import yaml

__all__ = ["TrainBenchOptions", "bench_train", "summary", "markdown", "KNOBS"]

CLI = [sys.executable, "-m", "recpipe.cli"]

# One variant per knob, each switching ONE train.tuning key away from the defaults.
KNOBS: dict[str, dict] = {
    "dedup_ids_off": {"dedup_ids": False},
    "grad_accum_4": {"grad_accum_steps": 4},
    "jit_dense_on": {"jit_dense": True},
    "steps_per_execution_10": {"steps_per_execution": 10},
    "data_lean": {"data_ram_budget_mb": 64, "prefetch_batches": 1},
    "threads_1": {"intra_op_threads": 1, "inter_op_threads": 1},
    "inter_op_1": {"inter_op_threads": 1},
    "tcmalloc": {"allocator": "tcmalloc"},
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


def summary(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "values": values}


class _Runs:
    """`recpipe train` runs in fresh model dirs; results keyed by name."""

    def __init__(self, work: str, reps: int, say: Callable[[str], None]):
        self.work, self.reps, self.say = work, reps, say
        self.results: dict[str, dict] = {}
        self.planned: list[tuple] = []

    def config(self, name: str, base: dict, **overrides) -> str:
        cfg = copy.deepcopy(base)
        for section, values in overrides.items():
            if isinstance(values, dict) and isinstance(cfg.get(section), dict) and section != "model":
                cfg[section] = {**cfg[section], **values}
            else:
                cfg[section] = values
        path = os.path.join(self.work, f"{name}.yaml")
        with open(path, "w") as fh:
            yaml.safe_dump(cfg, fh)
        return path

    def _once(self, name: str, data: str, cfg_path: str, steps: int, flags: tuple, keep: bool) -> tuple[float, float]:
        """One `recpipe train` in a fresh model dir: (steady ex/s, peak RSS MB)."""
        from recpipe.bench import run_measured
        model_dir = os.path.join(self.work, "models", name)
        shutil.rmtree(model_dir, ignore_errors=True)
        _, peak, _ = run_measured([*CLI, "train", "--data", data, "--model-dir", model_dir, "--config", cfg_path,
                                   "--steps", str(steps), *flags])
        state = json.load(open(os.path.join(model_dir, "train_state.json")))
        if not keep:
            shutil.rmtree(model_dir, ignore_errors=True)
        return state.get("examples_per_sec_steady", state["examples_per_sec_last_run"]), peak

    def _record(self, name: str, rates: list, rss: list, steps: int, flags: tuple, t0: float, **extra) -> dict:
        r = {"examples_per_s": summary(rates), "peak_rss_mb": summary(rss), "steps": steps, "flags": list(flags),
             **extra}
        self.results[name] = r
        self.say(f"bench train: {name}: median {r['examples_per_s']['median']:,.0f} ex/s "
                 f"(min {min(rates):,.0f}, max {max(rates):,.0f}), peak RSS {r['peak_rss_mb']['median']:,.0f} MB "
                 f"[{time.perf_counter() - t0:.0f} s]")
        return r

    def run(self, name: str, data: str, cfg_path: str, steps: int, *flags: str, reps: Optional[int] = None,
            keep: bool = False) -> dict:
        """`reps` runs of one configuration, one after another."""
        t0 = time.perf_counter()
        got = [self._once(f"{name}-{rep}", data, cfg_path, steps, flags, keep) for rep in range(reps or self.reps)]
        return self._record(name, [g[0] for g in got], [g[1] for g in got], steps, flags, t0)

    def plan(self, name: str, data: str, cfg_path: str, steps: int, *flags: str, copies: int = 1) -> None:
        """Queue a configuration for run_planned(); copies > 1: that many independent runs AT ONCE
        (ex/s is their sum; two one-thread processes exchanging nothing are this box's ceiling for
        any 2-process scaling)."""
        self.planned.append((name, data, cfg_path, steps, flags, copies))

    def run_planned(self) -> None:
        """Every queued configuration once per repetition, round-robin: a drift of the shared
        machine's speed during the suite hits all of them alike instead of the ones run last."""
        from concurrent.futures import ThreadPoolExecutor
        got: dict[str, list] = {p[0]: [] for p in self.planned}
        t0 = time.perf_counter()
        for rep in range(self.reps):
            for name, data, cfg_path, steps, flags, copies in self.planned:
                with ThreadPoolExecutor(copies) as pool:
                    done = list(pool.map(lambda i: self._once(f"{name}-{rep}-{i}", data, cfg_path, steps, flags, False),
                                         range(copies)))
                got[name].append((sum(d[0] for d in done), max(d[1] for d in done)))
            self.say(f"bench train: repetition {rep + 1}/{self.reps} of {len(self.planned)} configurations done "
                     f"[{time.perf_counter() - t0:.0f} s]")
        for name, data, cfg_path, steps, flags, copies in self.planned:
            self._record(name, [g[0] for g in got[name]], [g[1] for g in got[name]], steps, flags, t0,
                         **({"copies": copies} if copies > 1 else {}))
        self.planned = []

    def median(self, name: str, key: str = "examples_per_s") -> float:
        return self.results[name][key]["median"]


def _preprocess(cfg_path: str, log: str, out: str, beam: bool = True) -> str:
    """`recpipe preprocess` (Beam), or with beam=False the single-process baseline (same functions,
    same artifact and shards, no runner start-up: for the quick run's small side datasets)."""
    if not os.path.exists(os.path.join(out, "transform", "transform.json")):
        if beam:
            subprocess.run([*CLI, "preprocess", "--config", cfg_path, "--input", log, "--output", out], check=True,
                           capture_output=True)
        else:
            from features.config import load_config
            from recpipe.bench_preprocess import baseline_preprocess
            baseline_preprocess(load_config(cfg_path), log, out)
    return out


def _generate(rows: int, out: str, seed: int = 7) -> str:
    if not os.path.isdir(out):
        from pipeline.synthetic import GenerateSpec, generate_log
        generate_log(GenerateSpec(rows=rows, days=2, seed=seed), out)
    return out


def _ceiling(reps: int, seconds: float) -> dict:
    """The matmul ceiling, measured in a fresh process (this one's thread pools may be set up)."""
    out = subprocess.run([sys.executable, "-m", "recpipe.flops", "2048", str(reps), str(seconds)], check=True,
                         capture_output=True, text=True).stdout
    return {k: summary(v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}


def _flops_per_example(cfg_path: str, data: str) -> int:
    """Training FLOPs per example of the dense part (3 x forward)."""
    from features.artifact import TransformArtifact
    from features.config import load_config
    from trainers.models import dense_flops_per_example, model_spec
    return 3 * dense_flops_per_example(model_spec(load_config(cfg_path), TransformArtifact.read(
        os.path.join(data, "transform"))))


def bench_train(o: TrainBenchOptions, work: str, cfg_path: str, say: Callable[[str], None]) -> dict:
    os.makedirs(work, exist_ok=True)
    base = yaml.safe_load(open(cfg_path))
    runs = _Runs(work, o.reps, say)
    steps = o.steps
    # Two checkpoint intervals per run: the steady rate is the second (no tracing, XLA compile, warm-up
    # or checkpoint write in it).
    train_cfg = {"checkpoint_every": max(steps // 2, 1)}
    if o.data_dir:
        pre = o.data_dir
        say(f"bench train: data {pre}")
    else:
        say(f"bench train: {o.rows:,} generated rows -> preprocess")
        pre = _preprocess(cfg_path, _generate(o.rows, os.path.join(work, "log")), os.path.join(work, "pre"))

    default = runs.config("default", base, train=train_cfg)
    runs.plan("real_fp32", pre, default, steps)
    runs.plan("synthetic_fp32", pre, default, steps, "--synthetic-input")
    dense = runs.config("dense_heavy", base, model=DENSE_HEAVY, train=train_cfg)
    runs.plan("dense_fp32", pre, dense, steps)
    runs.plan("dense_bf16", pre, dense, steps, "--precision", "bf16")
    if not o.quick:  # bf16 on the embedding-heavy default, and on the dense-heavy model without input
        runs.plan("real_bf16", pre, default, steps, "--precision", "bf16")
        runs.plan("dense_fp32_synthetic", pre, dense, steps, "--synthetic-input")
        runs.plan("dense_bf16_synthetic", pre, dense, steps, "--precision", "bf16", "--synthetic-input")
    knobs = {} if o.quick else KNOBS
    for name, tuning in knobs.items():
        runs.plan(f"knob_{name}", pre, runs.config(f"knob_{name}", base, train={**train_cfg, "tuning": tuning}), steps)

    # Strategies: Horovod one thread per rank; PS workers one thread each vs local with 2 threads.
    hvd_steps = steps if not o.quick else max(steps // 2, 8)
    runs.plan("horovod_np1", pre, default, hvd_steps, "--strategy", "horovod", "--np", "1", "--threads", "1")
    runs.plan("horovod_np2", pre, default, hvd_steps, "--strategy", "horovod", "--np", "2", "--threads", "1")
    if not o.quick:  # the same one-thread rank twice at once, nothing exchanged: this box's 2-process ceiling
        runs.plan("independent_np1_x2", pre, default, hvd_steps, "--strategy", "horovod", "--np", "1",
                  "--threads", "1", copies=2)
    if os.cpu_count() != 2:  # TensorFlow's default pools are the core count: on 2 cores real_fp32 IS this run
        runs.plan("local_threads2", pre, default, steps, "--threads", "2")
    runs.plan("ps_2w_2ps", pre, default, steps, "--strategy", "ps", "--ps-workers", "2", "--ps-servers", "2",
              "--ps-task-threads", "1")
    runs.run_planned()
    if "local_threads2" not in runs.results:
        runs.results["local_threads2"] = runs.results["real_fp32"]

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

    quality = _criteo_quality(o, work, say) if o.criteo_csv else {}
    from recpipe.scaleout import scale_out_report
    scaling = scale_out_report(pre, default, runs.results, o.bandwidth_gbps, say)

    ratios = {
        "train_real_vs_synthetic_input": runs.median("real_fp32") / runs.median("synthetic_fp32"),
        "train_bf16_vs_fp32": runs.median("dense_bf16") / runs.median("dense_fp32"),
        "train_horovod_scaling_2": runs.median("horovod_np2") / (2 * runs.median("horovod_np1")),
        "train_ps_vs_local": runs.median("ps_2w_2ps") / runs.median("local_threads2"),
        **{f"train_knob_{n}_speed": runs.median(f"knob_{n}") / runs.median("real_fp32") for n in knobs},
        **{f"train_knob_{n}_rss": runs.median(f"knob_{n}", "peak_rss_mb") / runs.median("real_fp32", "peak_rss_mb")
           for n in knobs},
        **rss.get("ratios", {}),
    }
    if not o.quick:
        ratios["train_two_independent_vs_2x_one"] = runs.median("independent_np1_x2") / (2 * runs.median("horovod_np1"))
        ratios["train_horovod_np2_vs_two_independent"] = runs.median("horovod_np2") / runs.median("independent_np1_x2")
        ratios["train_bf16_vs_fp32_embedding_heavy"] = runs.median("real_bf16") / runs.median("real_fp32")
        ratios["train_bf16_vs_fp32_dense_synthetic"] = (runs.median("dense_bf16_synthetic") /
                                                        runs.median("dense_fp32_synthetic"))
    if quality:
        ratios["train_dcn_vs_logistic_auc"] = quality["local"]["auc"] / quality["logistic"]["auc"]
    return {
        "suite": "train", "rows": o.rows, "steps": steps, "reps": o.reps, "quick": o.quick,
        "config": {"default": base.get("model"), "dense_heavy": DENSE_HEAVY, "batch_size": base["train"]["batch_size"],
                   "knobs": knobs},
        "runs": runs.results, "ceiling_gflops": ceiling, "train_flops_per_example": flops,
        "fraction_of_ceiling": fraction, "rss_vs_table": rss, "criteo_quality": quality, "scale_out": scaling,
        "ratios": ratios,
    }


def _rss_vs_table(o: TrainBenchOptions, work: str, base: dict, runs: _Runs, say: Callable[[str], None]) -> dict:
    """Peak RSS of local training with one hashed table of growing size (same data), and at a fixed
    table with 4x the data: memory should follow the table, not the data."""
    sizes = (100_000, 1_000_000) if o.quick else (100_000, 1_000_000, 4_000_000)
    rows = 5_000 if o.quick else 50_000
    small = _generate(rows, os.path.join(work, "rss_log"), seed=11)
    cfg = {**base, "features": {"sparse": [{"name": "user_id", "column": "user_id", "hash_buckets": 0,
                                           "embedding_dim": 32}],
                                "dense": base["features"]["dense"][:2]},
           "model": {"task": "ranking", "type": "dcn_v2", "cross_layers": 1, "deep_layers": [64]},
           "train": {**base["train"], "checkpoint_every": 50}}
    out: dict = {"table_rows": [], "peak_rss_mb": [], "table_mb": []}
    for n in sizes:
        cfg["features"]["sparse"][0]["hash_buckets"] = n
        path = runs.config(f"rss_{n}", cfg)
        data = _preprocess(path, small, os.path.join(work, f"rss_pre_{n}"), beam=not o.quick)
        r = runs.run(f"rss_{n}", data, path, 100, reps=1)
        out["table_rows"].append(n)
        out["peak_rss_mb"].append(r["peak_rss_mb"]["median"])
        out["table_mb"].append(n * 32 * 4 * 2 / 2**20)  # weights + Adagrad accumulator, float32
    if len(sizes) > 1:
        slope = (out["peak_rss_mb"][-1] - out["peak_rss_mb"][0]) / (out["table_mb"][-1] - out["table_mb"][0])
        out["rss_mb_per_table_mb"] = slope
    if o.quick:
        return out
    # Same table (the smallest), 4x the rows of data.
    big = _generate(rows * 4, os.path.join(work, "rss_log_4x"), seed=12)
    cfg["features"]["sparse"][0]["hash_buckets"] = sizes[0]
    path = runs.config("data_4x", cfg)
    data = _preprocess(path, big, os.path.join(work, "rss_pre_4x"))
    r = runs.run("data_4x", data, path, 100, reps=1)
    out["data_4x_peak_rss_mb"] = r["peak_rss_mb"]["median"]
    out["ratios"] = {"train_rss_data_4x_vs_1x": out["data_4x_peak_rss_mb"] / out["peak_rss_mb"][0]}
    out["ratios"]["train_rss_table_40x_vs_1x"] = out["peak_rss_mb"][-1] / out["peak_rss_mb"][0]
    return out


def _criteo_quality(o: TrainBenchOptions, work: str, say: Callable[[str], None]) -> dict:
    """Eval AUC on the shared Criteo sample's time split: DCN-v2 with each strategy, and logistic regression."""
    from recpipe.demo import repo_configs
    cfg_path = str(repo_configs() / "criteo.yaml")
    base = yaml.safe_load(open(cfg_path))
    parquet = os.path.join(work, "criteo_parquet")
    if not os.path.isdir(parquet):
        subprocess.run([*CLI, "criteo-to-parquet", "--csv", o.criteo_csv, "--out", parquet], check=True,
                       capture_output=True)
    pre = _preprocess(cfg_path, parquet, os.path.join(work, "criteo_pre"))
    steps = base["train"]["steps"] if not o.quick else 100
    runs = _Runs(work, 1, say)
    lr = runs.config("criteo_logistic", base, model={"task": "ranking", "type": "logistic"})
    out = {}
    for name, cfg, flags in (("local", cfg_path, ()), ("logistic", lr, ()),
                             ("ps", cfg_path, ("--strategy", "ps")),
                             ("horovod", cfg_path, ("--strategy", "horovod", "--np", "2"))):
        runs.run(f"criteo_{name}", pre, cfg, steps, *flags, keep=True)
        model_dir = os.path.join(work, "models", f"criteo_{name}-0")
        ev = subprocess.run([*CLI, "evaluate", "--model-dir", model_dir, "--data", pre], check=True,
                            capture_output=True, text=True).stdout
        metrics = json.loads(ev.strip().splitlines()[-1])
        out[name] = {"auc": metrics["auc"], "logloss": metrics["logloss"], "eval_rows": metrics["examples"],
                     "steps": steps, "examples_per_s": runs.median(f"criteo_{name}")}
        say(f"bench train: criteo {name}: AUC {metrics['auc']:.4f} logloss {metrics['logloss']:.4f}")
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
            "dense_fp32_synthetic": "dense-heavy, synthetic input", "dense_bf16_synthetic": "dense-heavy, bf16, synthetic",
            "horovod_np1": "Horovod np=1, 1 thread", "horovod_np2": "Horovod np=2, 1 thread each",
            "independent_np1_x2": "two np=1 runs at once (no exchange), 1 thread each",
            "local_threads2": "local, 2 threads", "ps_2w_2ps": "PS 2 workers (1 thread) + 2 PS"}
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
