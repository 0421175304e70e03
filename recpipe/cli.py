"""`recpipe` command line: each subcommand maps to one public entry point of the packages.

Start-up is quiet: TensorFlow's C++ start-up lines (CUDA stub, oneDNN/CPU features, absl's
pre-init notice) and library warnings (Beam's "apitools not found", ...) are hidden unless `-v` or
RECPIPE_DEBUG=1 asks for them; errors still surface as one line `recpipe CMD: error: ...`
(RECPIPE_DEBUG=1: with the traceback).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from typing import Callable

from recpipe.cli_parser import build_parser
from recpipe.common.errors import RecpipeError
from recpipe.runtime import (exit_now, one_line, own_tempdir, ps_chief, quiet_startup, say, tensorflow_after_reexec,
                             tensorflow_at_startup)
from recpipe.trainers.errors import JobFault
from recpipe.trainers.options import RunOptions
from recpipe.trainers.strategies.restarts import fault_exit_code

__all__ = ["main"]


def cmd_init(a) -> None:
    from recpipe.pipeline.infer import infer, profile_table, read_sample, render_config, summary_lines
    if a.output and os.path.exists(a.output) and not a.force:
        raise RecpipeError(f"{a.output}: exists (give --force to overwrite it)")
    table, files, opened = read_sample(a.input, a.sample_rows)
    inference = infer(profile_table(table), table.num_rows, files, opened, label=a.label, timestamp=a.timestamp,
                      name=a.name)
    text = render_config(inference, a.input)
    for line in summary_lines(inference):
        print(line, file=sys.stderr if not a.output else sys.stdout, flush=True)
    _write_or_print(text, a.output, f"init: wrote {a.output}; next: recpipe preprocess --config {a.output} "
                                    f"--input {a.input} --output PRE")


def cmd_config(a) -> None:
    from recpipe.features.schema_doc import json_schema, reference_markdown
    text = json.dumps(json_schema(), indent=2) + "\n" if a.what == "schema" else reference_markdown()
    _write_or_print(text, a.output, f"config {a.what}: wrote {a.output}")


def _write_or_print(text: str, output: str | None, done: str) -> None:
    """`text` into the file `output` (then the line `done`), or on stdout when there is none."""
    if output:
        with open(output, "w") as fh:
            fh.write(text)
        say(done)
    else:
        sys.stdout.write(text)


def cmd_generate(a) -> None:
    import datetime as dt

    from recpipe.pipeline.synthetic import GenerateSpec, generate_log
    start = dt.date.fromisoformat(a.start_date)
    t0 = time.perf_counter()
    files = generate_log(GenerateSpec(rows=a.rows, days=a.days, seed=a.seed, start_date=start, item_drift=a.item_drift,
                                      num_users=a.users, num_items=a.items, bias=a.bias), a.output, say=say)
    say(f"generate: {a.rows} rows in {len(files)} file(s) under {a.output} ({time.perf_counter() - t0:.1f}s)")


def cmd_criteo(a) -> None:
    from recpipe.pipeline.criteo import criteo_csv_to_parquet
    out = criteo_csv_to_parquet(a.csv, a.output, say=say)
    say(f"criteo-to-parquet: wrote {out}")


def cmd_instacart(a) -> None:
    from recpipe.pipeline.instacart import instacart_to_parquet
    instacart_to_parquet(a.output, a.cache, say=say)


def cmd_movielens(a) -> None:
    from recpipe.pipeline.movielens import movielens_to_parquet
    movielens_to_parquet(a.output, a.cache, say=say, history=a.history)


def cmd_preprocess(a, extra: list[str]) -> None:
    from recpipe.features.config import load_config
    from recpipe.pipeline.options import check_beam_args
    from recpipe.pipeline.preprocess import run_preprocess
    check_beam_args(extra, also_known=a.own_flags)
    cfg = load_config(a.config)
    t0 = time.perf_counter()
    run_preprocess(cfg, a.input, a.output, extra, say=say, previous_transform=a.previous_transform, day=a.day)
    say(f"preprocess: done in {time.perf_counter() - t0:.1f}s -> {a.output}")


def _train_allocator(a) -> str:
    """--allocator, else train.tuning.allocator of the config `recpipe train` will use (decided before
    TensorFlow is imported, so the process can re-execute itself with the library preloaded)."""
    if a.allocator:
        return a.allocator
    from recpipe.features.config import load_config
    from recpipe.features.preprocessed import PreprocessedData
    for path in (a.config, os.path.join(a.model_dir, "config.yaml"),
                 os.path.join(PreprocessedData(a.data).transform_dir, "config.yaml")):
        if path and os.path.exists(path):
            return load_config(path).train.tuning.allocator
    return "auto"


def _run_options(a) -> RunOptions:
    return RunOptions(**{f.name: getattr(a, f.name) for f in dataclasses.fields(RunOptions)})


def cmd_train(a) -> int | None:
    from recpipe.trainers.allocator import reexec_with
    from recpipe.trainers.strategies.hvd_job import launch_job, launches_ranks
    from recpipe.trainers.options import TrainOptions
    from recpipe.trainers.strategies.restarts import run_attempts, supervises_attempts
    if supervises_attempts(a.strategy, a.max_restarts):  # before the re-exec: attempts make their own
        return run_attempts(a.argv, a.max_restarts, say)
    reexec_with(_train_allocator(a), a.argv, say)
    from recpipe.trainers.selection import requested_config, select
    opts = TrainOptions(data_dir=a.data, model_dir=a.model_dir, config_path=a.config, run=_run_options(a),
                        warm_start=a.warm_start, synthetic_input=a.synthetic_input)

    def train_one(opts: TrainOptions):
        # Horovod's launcher: its ranks import TensorFlow, it does not (item_to_item is fitted in this process)
        if launches_ranks(opts.run) and requested_config(opts).model.type != "item_to_item":
            return launch_job(opts, say=say)
        tensorflow_after_reexec(a)
        if ps_chief(a):  # after the re-exec, which would orphan the folder
            own_tempdir()
        from recpipe.trainers.train import train
        return train(opts, say=say)
    r = select(opts, say, train_one) or train_one(opts)  # model.type auto: each candidate, then the best
    rate = f", {r.examples_per_sec_last_run:,.0f} ex/s" if r.examples_per_sec_last_run else ""  # item_to_item: none
    say(f"train: {r.steps_done} steps done ({r.steps_this_run} this run{rate}) -> {a.model_dir}")


def cmd_tune(a) -> None:
    from recpipe.tune import tune
    from recpipe.trainers.options import run_flags
    tune(a.config, a.data, a.output, a.trials, tuple(run_flags(_run_options(a))), say=say)


def cmd_advise(a) -> None:
    from recpipe.features.config import load_config
    from recpipe.features.preprocessed import PreprocessedData
    from recpipe.trainers.advisor import advise
    from recpipe.common import fsio
    from recpipe.trainers.advisor import Overheads
    overheads = Overheads.from_calibration(a.calibration) if a.calibration else Overheads()
    artifact = PreprocessedData(a.data).transform()
    cfg = load_config(a.config) if a.config else artifact.config
    advice = advise(cfg, artifact, a.data, a.np, a.ps_servers, a.bandwidth_gbps, overheads=overheads)
    say(advice.table())
    if a.output:
        fsio.write_json(a.output, advice.as_dict(), sort_keys=False)


def cmd_evaluate(a) -> None:
    from recpipe.trainers.evaluation.evaluate import evaluate
    from recpipe.trainers.evaluation.slices import parse_slice
    metrics = evaluate(a.model_dir, a.data, a.output, slices=[parse_slice(s) for s in a.slice] if a.slice else None)
    for name, why in metrics.get("undefined", {}).items():
        say(f"evaluate: WARNING: {name} is null: {why}")
    say(json.dumps(metrics))


def cmd_export(a) -> None:
    from recpipe.serving.export.savedmodel import export_model
    from recpipe.serving.version import ExportBase
    path = export_model(a.model_dir, a.export_base, a.version, a.data, a.top_k, embedding_dtype=a.embedding_dtype,
                        dense_dtype=a.dense_dtype, prune_unseen_days=a.prune_unseen_days)
    exported = next(v for v in ExportBase(a.export_base).versions() if v.path == path)
    report = exported.skew_report()
    left_out = report.get("rows_left_out", 0)
    say(f"export: skew check passed on {report['rows']} eval rows (max |diff| {report['max_abs_diff']:.2g})"
         + (f"; {left_out} with a null integer ID left out: an int64 input cannot carry it" if left_out else ""))
    if "examples_rows" in report:
        left = f", {left_out} with a null integer ID among them" if left_out else ""
        say(f"export: predict_examples scores all {report['examples_rows']} as tf.Examples like the trainer{left} "
             f"(max |diff| {report['examples_max_abs_diff']:.2g})")
    if a.embedding_dtype != "float32" or a.dense_dtype != "float32":
        w = exported.meta().weights
        say(f"export: {w['embedding_tables']} embedding table(s) stored as {w['embedding_dtype']}, "
             f"{w['dense_layers']} Dense kernel(s) as {w['dense_dtype']}")
    if a.prune_unseen_days is not None:
        pruned = exported.meta().weights["pruned"]
        for table, t in pruned["tables"].items():
            say(f"export: {table}: {t['kept']:,} values seen in the {pruned['unseen_days']} day(s) up to "
                 f"{pruned['day']} kept, {t['pruned']:,} pruned to OOV ({t['rows_before']:,} -> "
                 f"{t['rows_after']:,} rows)")
    say(f"export: {path}")


def cmd_serve(a) -> None:
    from recpipe.serving.server.serve import ModelServer, ServeOptions
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    server = ModelServer(ServeOptions(a.export_base, a.model_name, a.host, a.rest_port, a.grpc_port,
                                      a.poll_seconds, a.max_batch_rows, a.batch_timeout_ms))
    server.catch_signals()
    server.start()
    server.serve_until_signal(say=say)


def cmd_demo(a) -> None:
    from recpipe.demo import DemoOptions, run_demo
    run_demo(DemoOptions(workdir=a.workdir, rows=a.rows, steps=a.steps, synthetic=a.synthetic), say=say)


def cmd_daily(a, extra: list[str]) -> int:
    from recpipe.daily import run_step
    if extra and a.step != "preprocess":
        raise ValueError(f"unrecognized arguments: {' '.join(extra)} (only `daily preprocess` takes Beam options)")
    if a.step == "train":  # the allocator `recpipe train` would run under (train.tuning.allocator)
        from recpipe.daily import load_daily_config, train_allocator, train_launches_ranks
        from recpipe.trainers.allocator import reexec_with
        from recpipe.trainers.strategies.restarts import run_attempts, supervises_attempts
        run = load_daily_config(a.project).train
        if supervises_attempts(run.strategy, run.max_restarts):  # as `recpipe train` (cmd_train)
            return run_attempts(a.argv, run.max_restarts, say)
        reexec_with(train_allocator(a.project), a.argv, say)
        if not train_launches_ranks(a.project):
            tensorflow_after_reexec(a)
    return run_step(a.step, a.project, a.day, say=say, beam_args=extra)


def cmd_cluster(a) -> None:
    from recpipe.k8s import RenderOptions, render, write_manifests
    opts = RenderOptions(a.project, a.day, a.image, a.name, a.namespace, a.volume_claim, a.volume_mount,
                         a.dask_workers, a.dask_threads, a.horovod_launcher)
    manifests = render(opts, say=say)
    written, order = write_manifests(manifests, a.output, a.namespace,
                                     f"recpipe cluster render --project {a.project} --day {a.day}")
    for path in written[:-1]:
        say(f"cluster render: {path} (checked, and validated against its schema)")
    say(f"cluster render: apply in this order, each step once the one before has finished ({written[-1]} does "
        f"it, waiting on each):")
    for line in order:
        say(f"cluster render:   {line}")


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
    run_bench(BenchOptions(suite=a.suite, quick=a.quick, reps=a.reps, rows=a.rows, steps=a.steps, out_dir=a.output,
                           workdir=a.workdir), say=say)


COMMANDS: dict[str, Callable] = {
    "init": cmd_init, "config": cmd_config, "generate": cmd_generate, "criteo-to-parquet": cmd_criteo, "instacart-to-parquet": cmd_instacart,
    "movielens-to-parquet": cmd_movielens, "preprocess": cmd_preprocess, "train": cmd_train, "tune": cmd_tune,
    "advise": cmd_advise, "evaluate": cmd_evaluate, "export": cmd_export, "serve": cmd_serve, "demo": cmd_demo,
    "daily": cmd_daily, "cluster": cmd_cluster, "bench": cmd_bench,
}


def main(argv: list[str] | None = None) -> int:
    """Run one `recpipe` command.

    Args:
        argv: the arguments after `recpipe` (default: sys.argv[1:]).

    Returns:
        The exit code: 0, 1 after a failure (printed as one line `recpipe CMD: error: ...`), 130 on Ctrl-C.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    debug = bool(os.environ.get("RECPIPE_DEBUG"))
    quiet_startup(args.verbose or debug, tensorflow_at_startup(args))
    if extra and not getattr(args, "beam", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    fn = COMMANDS[args.command]
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        rc = fn(args, extra) if getattr(args, "beam", False) else fn(args)
        if ps_chief(args):
            exit_now(rc if isinstance(rc, int) else 0)
    except KeyboardInterrupt:
        print(f"recpipe {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # every failure is one clear line; RECPIPE_DEBUG=1 shows the traceback
        if debug:
            raise
        kind = "" if isinstance(e, (RecpipeError, OSError, ValueError)) else f"{type(e).__name__}: "
        line = f"recpipe {args.command}: error: {kind}{one_line(e)}"
        code = fault_exit_code() if isinstance(e, JobFault) else 1
        if ps_chief(args):
            exit_now(code, last_line=line)
        print(line, file=sys.stderr)
        return code
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
