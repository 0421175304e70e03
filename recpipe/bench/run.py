"""`recpipe bench [preprocess|train|serve|cluster|quality|export|lifecycle|embedding|scaling|SUITE,...|all] [--quick]`:
runs the suites, each ratio against its baseline measured in the same run, -> bench/results/<suite>.json + .md, then
REPORT.md with PNG plots (recpipe.bench.report).

Figures are the median of `reps` runs (min and max kept); ratios are only meaningful within one
run (shared, noisy machines). `--quick` is the CI smoke run: small sizes, one repetition.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Optional

from recpipe.bench.cluster import ClusterBenchOptions, bench_cluster
from recpipe.bench.cluster import markdown as cluster_markdown
from recpipe.bench.common import machine_info, save_result
from recpipe.bench.embedding import EmbeddingBenchOptions, bench_embedding
from recpipe.bench.embedding import markdown as embedding_markdown
from recpipe.bench.export import bench_export
from recpipe.bench.export import markdown as export_markdown
from recpipe.bench.lifecycle import bench_lifecycle
from recpipe.bench.lifecycle import markdown as lifecycle_markdown
from recpipe.bench.preprocess import bench_peers, bench_preprocess, bench_shard_formats, report_markdown
from recpipe.bench.quality_suite import bench_quality
from recpipe.bench.quality_suite import markdown as quality_markdown
from recpipe.bench.report import write_report
from recpipe.bench.scaling import bench_scaling, options_for
from recpipe.bench.scaling_report import markdown as scaling_markdown
from recpipe.bench.serve import markdown as serve_markdown
from recpipe.bench.serve import run_serve_bench
from recpipe.bench.targets import SUITES
from recpipe.bench.train import TrainBenchOptions, bench_train
from recpipe.bench.train import markdown as train_markdown
from recpipe.bench.netns import netns_available
from recpipe.samples import find_criteo_sample, repo_configs

__all__ = ["BenchOptions", "run_bench", "suites_of"]


@dataclass(frozen=True)
class BenchOptions:
    suite: str = "all"
    quick: bool = False
    reps: Optional[int] = None     # default: 3, or 1 with --quick
    rows: Optional[int] = None     # default per suite (smaller with --quick)
    steps: Optional[int] = None
    out_dir: str = "bench/results"
    workdir: Optional[str] = None

    def repetitions(self) -> int:
        return self.reps or (1 if self.quick else 3)


def suites_of(spec: str) -> tuple[str, ...]:
    """The suites `spec` names ("all", one suite, or several joined by commas), in SUITES order: the
    preprocess suite's data is reused by the train, serve and export suites of the same run."""
    names = SUITES if spec == "all" else tuple(s.strip() for s in spec.split(","))
    unknown = [s for s in names if s not in SUITES]
    if unknown or not names:
        raise ValueError(f"bench suite {', '.join(unknown) or spec!r}: use {', '.join(SUITES)}, several of them "
                         f"joined by commas, or all")
    return tuple(s for s in SUITES if s in names)


def run_bench(opts: BenchOptions, say: Callable[[str], None] = print) -> dict:
    suites = suites_of(opts.suite)
    work = opts.workdir or tempfile.mkdtemp(prefix="recpipe-bench-")
    cfg_path = str(repo_configs() / "synthetic.yaml")
    reps, quick = opts.repetitions(), opts.quick
    info = machine_info()
    results = {}
    shared = None  # (raw log, preprocessed) of the preprocess suite, reused by the others in this run
    t0 = time.perf_counter()
    for suite in suites:
        sw = os.path.join(work, suite)
        say(f"bench: {suite} ({'quick, ' if quick else ''}{reps} repetition{'s' * (reps > 1)}) in {sw}")
        if suite == "preprocess":
            rows = opts.rows or (3_000 if quick else 500_000)
            pre = bench_preprocess(rows, sw, cfg_path, say, scale=10, reps=reps, quick=quick)
            shards = bench_shard_formats(os.path.join(sw, "beam_1x"), say)
            peers = bench_peers(5_000 if quick else 2_000_000, sw, str(repo_configs() / "criteo.yaml"), say,
                                reps=reps)
            result = {"suite": suite, "quick": quick, "machine": info, "config": {"rows_1x": rows, "scale": 10},
                      "preprocess": pre, "shards": shards, "peers": peers,
                      "ratios": {**pre["ratios"], **peers["ratios"]}}
            mult = 10 if quick else 1  # quick: the 10x data (50k rows); full: the 1x data (500k rows)
            shared = (os.path.join(sw, f"log_{mult}x"), os.path.join(sw, f"beam_{mult}x"))
            save_result(opts.out_dir, suite, result, report_markdown(result))
        elif suite == "train":
            criteo = find_criteo_sample()
            o = TrainBenchOptions(rows=opts.rows or (10_000 if quick else 200_000),
                                  steps=opts.steps or (8 if quick else 300), reps=reps, quick=quick,
                                  criteo_csv=str(criteo) if criteo and not quick else None,
                                  data_dir=shared[1] if shared and not opts.rows else None)
            result = bench_train(o, sw, cfg_path, say)
            result["machine"] = info
            save_result(opts.out_dir, suite, result, train_markdown(result))
        elif suite == "cluster":
            usable, why = netns_available()
            if not usable:
                say(f"bench: cluster skipped: {why}")
                continue
            o = ClusterBenchOptions(rows=opts.rows or (20_000 if quick else 100_000),
                                    steps=opts.steps or (6 if quick else 60), reps=reps, quick=quick,
                                    rates=(None, "100mbit") if quick else (None, "1gbit", "100mbit"))
            result = bench_cluster(o, sw, cfg_path, say)
            result["machine"] = info
            save_result(opts.out_dir, suite, result, cluster_markdown(result))
        elif suite == "quality":
            if find_criteo_sample() is None:
                say("bench: quality skipped: the real Criteo sample (../shared/data/criteo_sample) is missing")
                continue
            result = bench_quality(sw, say, quick=quick, seeds=max(reps, 3) if not quick else 1)
            result["machine"] = info
            save_result(opts.out_dir, suite, result, quality_markdown(result))
        elif suite == "export":
            result = bench_export(sw, say, quick=quick, reps=reps,
                                  synthetic=shared if shared and not opts.rows else None)
            result["machine"] = info
            save_result(opts.out_dir, suite, result, export_markdown(result))
        elif suite == "embedding":
            result = bench_embedding(EmbeddingBenchOptions(quick=quick, reps=reps, steps=opts.steps), sw, say)
            result["machine"] = info
            save_result(opts.out_dir, suite, result, embedding_markdown(result))
        elif suite == "scaling":
            result = bench_scaling(options_for(quick, opts.steps), sw, say)
            result["machine"] = info
            save_result(opts.out_dir, suite, result, scaling_markdown(result))
        elif suite == "lifecycle":
            result = bench_lifecycle(sw, say, quick=quick, reps=reps)
            result["machine"] = info
            save_result(opts.out_dir, suite, result, lifecycle_markdown(result))
        else:
            result = run_serve_bench(sw, cfg_path, rows=opts.rows or (5_000 if quick else 100_000),
                                     steps=opts.steps or (20 if quick else 200), reps=reps,
                                     seconds=0.5 if quick else 4.0, say=say,
                                     data=shared if shared and not opts.rows else None,
                                     concurrencies=(1, 8) if quick else (1, 8, 32))
            result.update(suite=suite, quick=quick, machine=info)
            save_result(opts.out_dir, suite, result, serve_markdown(result))
        results[suite] = result
        say(f"bench: {suite} done ({time.perf_counter() - t0:,.0f} s so far) -> {opts.out_dir}/{suite}.json")
    path = write_report(opts.out_dir)
    say(f"bench: wrote {path}")
    return results


