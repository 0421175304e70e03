"""The `recpipe preprocess` Beam job: Parquet click logs -> a recpipe.features.preprocessed.PreprocessedData
folder (transform artifact, train/validation/eval shards, dead letter, eval sample).

Runs on any Beam runner given by `beam_args` (default: recpipe.pipeline.options.DEFAULT_BEAM_ARGS). The run
fails unless rows in = rows train + rows validation + rows eval + rows dead-lettered, exactly.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import sys
import uuid
from dataclasses import dataclass, field

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from recpipe.common import fsio
from recpipe.features.artifact import TransformArtifact
from recpipe.features.canonical import NULL_KIND, SchemaError, encoded_columns, merged_kind
from recpipe.features.config import Config, config_to_dict
from recpipe.common.days import day_number
from recpipe.common.dirlock import DirLock
from recpipe.common.errors import RecpipeError
from recpipe.features.preprocessed import SPLITS, PreprocessedData
from recpipe.pipeline.anomalies import (SplitCounts, copied_file_warnings, dead_letter_warnings, feature_warnings,
                                repeated_row_warnings, timestamp_warnings, volume_warnings)
from recpipe.pipeline.leakage import leak_warnings
from recpipe.pipeline.options import beam_args_with_defaults, check_beam_args, pipeline_runner
from recpipe.pipeline.repeats import Repeats
from recpipe.pipeline.sources import inspect_inputs, list_input_files, partition_day, partition_days, same_files
from recpipe.pipeline.transforms import (DEAD_LETTER_SCHEMA, NAMESPACE, ApplyTransform, AssembleArtifact,
                                 ComputeDenseStats, ComputeVocabularies, CountRows, FindRepeatedRows, PackArtifact,
                                 ReadClickLogs, SplitCutoffs, SplitRows, ValidateRows, WriteEvalSample, WriteRecords)

__all__ = ["PreprocessError", "PreprocessResult", "build_pipeline", "run_preprocess", "load_previous_transform",
           "run_day"]


class PreprocessError(RecpipeError, RuntimeError):
    pass


@dataclass
class PreprocessResult:
    output: str
    rows_in: int
    rows_train: int
    rows_eval: int
    dead_letter: dict[str, int] = field(default_factory=dict)
    rows_validation: int = 0
    with_value: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> feature -> rows with a value
    dense_sums: dict[str, dict[str, int]] = field(default_factory=dict)  # split -> dense feature -> sum (fixed point)
    time_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # file -> first, last timestamp
    positives: dict[str, int] = field(default_factory=dict)  # split -> rows labelled 1

    @property
    def rows_dead(self) -> int:
        return sum(self.dead_letter.values())

    @property
    def rows_out(self) -> int:
        return self.rows_train + self.rows_validation + self.rows_eval

    def rows(self, split: str) -> int:
        return {"train": self.rows_train, "validation": self.rows_validation, "eval": self.rows_eval}[split]

    def split_counts(self) -> SplitCounts:
        return SplitCounts({s: self.rows(s) for s in SPLITS}, self.with_value, self.dense_sums, self.positives)

    def summary(self) -> str:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(self.dead_letter.items())) or "none"
        validation = f", validation {self.rows_validation}" if self.rows_validation else ""
        return (f"rows in = {self.rows_in} = rows out {self.rows_out} "
                f"(train {self.rows_train}{validation}, eval {self.rows_eval}) + rows dead-lettered {self.rows_dead} "
                f"[{reasons}]")


def _versions() -> dict[str, str]:
    import pyarrow
    from importlib.metadata import PackageNotFoundError, version
    try:
        own = version("recpipe")
    except PackageNotFoundError:
        own = "dev"
    return {"recpipe": own, "apache_beam": beam.__version__, "pyarrow": pyarrow.__version__,
            "python": sys.version.split()[0]}


def load_previous_transform(path: str, cfg: Config, raw_schema: dict[str, str]) -> TransformArtifact:
    """A previous run's artifact (its output folder or its transform/ folder) this run will extend."""
    prev = PreprocessedData.at(path).transform()
    ours, theirs = config_to_dict(cfg), config_to_dict(prev.config)
    for key in ("features", "label", "input"):
        if ours[key] != theirs[key]:
            raise PreprocessError(f"{path}: previous transform has a different '{key}' section; "
                                  f"IDs can only be kept stable for the same features")
    for col, kind in raw_schema.items():
        if merged_kind(prev.raw_schema.get(col, kind), kind) is None:
            raise PreprocessError(f"{path}: column {col!r} was {prev.raw_schema[col]} there, {kind} now")
    return prev


def typed_schema(raw_schema: dict[str, str], previous: TransformArtifact | None, input_spec: str) -> dict[str, str]:
    """raw_schema with a column that holds only nulls (Arrow type null) in every input file typed as in
    the previous transform; without one nothing says what such a column holds, which is an error."""
    known = previous.raw_schema if previous is not None else {}
    untyped = [c for c, kind in raw_schema.items() if kind == NULL_KIND and known.get(c, NULL_KIND) == NULL_KIND]
    if untyped:
        raise SchemaError(f"{input_spec}: column(s) {', '.join(map(repr, untyped))} hold only nulls (Arrow type "
                          f"null) in every input file, so nothing says what they hold; write them typed, or extend "
                          f"a previous transform (--previous-transform) that has them")
    return {c: merged_kind(known.get(c, kind), kind) for c, kind in raw_schema.items()}


def run_day(cfg: Config, day: str | None, files: list[str], previous: TransformArtifact | None) -> int | None:
    """The run's day (days since 1970-01-01): --day, else the input's latest dt= partition. Required,
    and later than the previous run's day, when a vocabulary admits over a window or evicts."""
    day = day or partition_day(files)
    lifecycle = [f.name for f in cfg.features.sparse
                 if f.vocab is not None and (f.vocab.window_days > 1 or f.vocab.evict_unseen_days is not None)]
    if day is None:
        if lifecycle:
            raise PreprocessError(f"features {', '.join(lifecycle)} admit over days or evict: give the run's --day "
                                  f"YYYY-MM-DD (or read dt=YYYY-MM-DD partitions)")
        return None
    try:
        number = day_number(day)
    except ValueError:
        raise PreprocessError(f"--day {day!r}: expected YYYY-MM-DD") from None
    if lifecycle and previous is not None and previous.day is not None and number <= day_number(previous.day):
        raise PreprocessError(f"--day {day}: the previous transform is of {previous.day}; a day's run extends an "
                              f"earlier day's")
    return number


def build_pipeline(p: beam.Pipeline, cfg: Config, files, raw_schema: dict[str, str], out: PreprocessedData,
                   previous: TransformArtifact | None = None, previous_path: str | None = None,
                   day: int | None = None) -> None:
    total = sum(f.num_rows for f in files)
    if cfg.split.by == "user":
        split_info = {"kind": "user_last", "user": cfg.split.user, "order": cfg.split_order}
    elif cfg.input.timestamp:
        split_info = {"kind": "timestamp", "column": cfg.input.timestamp}
    else:
        split_info = {"kind": "row_order"}
    split_info["eval_fraction"] = cfg.split.eval_fraction
    split_info["validation_fraction"] = cfg.split.validation_fraction

    files_arg = [(f.path, f.first_row, f.num_rows) for f in files]
    columns = cfg.raw_columns()
    # Pass 1: the split cutoffs (reads only what validation and the timestamp need).
    if cfg.input.timestamp or cfg.split.by == "user":
        split_cols = [c for c in columns if c in {cfg.label.column, cfg.input.timestamp, cfg.split.user,
                                                  cfg.split_order, *(d.column for d in cfg.features.dense)}]
        good_for_split = (p | "ReadForSplit" >> ReadClickLogs(files_arg, split_cols, raw_schema, validate=cfg)
                          | "ValidateForSplit" >> ValidateRows(cfg, dead_letter=False))
    else:
        good_for_split = None
    cutoff = (good_for_split if good_for_split is not None else p) | "SplitCutoffs" >> SplitCutoffs(cfg, total)
    # Pass 2: analysis on the train rows.
    encoded = encoded_columns(cfg, raw_schema)  # read dictionary-encoded where the files store them so
    train_rows = (p | "ReadForAnalysis" >> ReadClickLogs(files_arg, columns, raw_schema, validate=cfg,
                                                         encoded=encoded)
                  | "ValidateForAnalysis" >> ValidateRows(cfg, dead_letter=False)
                  | "TrainRows" >> SplitRows(cfg, cutoff, analysis=True)).train
    vocabs = train_rows | "ComputeVocabularies" >> ComputeVocabularies(cfg, previous, day)
    stats = train_rows | "ComputeDenseStats" >> ComputeDenseStats(cfg, previous)
    lineage = {"previous_transform": previous_path} if previous is not None else {}
    artifact = (vocabs, stats) | "AssembleArtifact" >> AssembleArtifact(cfg, raw_schema, split_info, _versions(),
                                                                        lineage, day, previous)
    # Pass 3: read -> validate -> split -> transform -> write, fused; accounts for every row.
    batches = p | "ReadClickLogs" >> ReadClickLogs(files_arg, columns, raw_schema, count_rows=True,
                                                   hash_rows=_checks_repeats(cfg), validate=cfg, encoded=encoded)
    validated = batches | "ValidateRows" >> ValidateRows(cfg)
    splits = validated.good | "SplitByTime" >> SplitRows(cfg, cutoff)
    transform_dir = out.transform_dir
    _ = artifact | "WriteArtifact" >> beam.Map(lambda a: a.write(transform_dir))
    packed = artifact | "PackArtifact" >> PackArtifact()
    for split in SPLITS:
        _ = (splits[split]
             | f"ApplyTransform[{split}]" >> ApplyTransform(packed)
             | f"WriteShards[{split}]" >> WriteRecords(out.shard_prefix(split), ".tfrecord"))
    _ = splits.eval_raw | "WriteEvalSample" >> WriteEvalSample(cfg, out.eval_sample_parquet, out.eval_sample_records,
                                                               packed)
    _ = (validated.dead_letter
         | "WriteDeadLetter" >> beam.io.WriteToParquetBatched(
             out.dead_letter_prefix, schema=DEAD_LETTER_SCHEMA, file_name_suffix=".parquet"))
    _ = ((batches, {s: splits[s] for s in SPLITS}, validated.dead_letter, splits.time_range)
         | "CountRows" >> CountRows(out.row_counts_path, cfg))
    if _checks_repeats(cfg):
        _ = batches | "FindRepeatedRows" >> FindRepeatedRows(out.repeats_path, out.row_hashes_dir,
                                                             [f.first_row for f in files], total)


def _checks_repeats(cfg: Config) -> bool:
    """Whether the job looks for repeated rows (preprocess.max_repeated_row_fraction 1 turns it off)."""
    return cfg.preprocess.max_repeated_row_fraction < 1


def _repeats(staged: PreprocessedData, cfg: Config) -> Repeats | None:
    """The FindRepeatedRows branch's findings (None when the run does not look), its files removed."""
    if not _checks_repeats(cfg):
        return None
    found = Repeats.from_json(fsio.read_json(staged.repeats_path))
    fsio.remove(staged.repeats_path)
    fsio.remove_dir(staged.row_hashes_dir)
    return found


def _counter(result, name: str) -> int | None:
    """A counter's value, or None when the runner reports no metrics."""
    try:
        found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE).with_name(name))["counters"]
    except (NotImplementedError, RuntimeError):
        return None
    return sum(int(r.committed if r.committed is not None else r.attempted) for r in found)


def _row_counts(staged: PreprocessedData) -> PreprocessResult:
    """The accounting from the data: the CountRows branch summed the rows the job read, wrote to each
    split and dead-lettered (by reason), from the elements themselves, so a retried task counts once."""
    counts = fsio.read_json(staged.row_counts_path)
    fsio.remove(staged.row_counts_path)
    dead = {k.split(".", 1)[1]: v for k, v in counts.items() if k.startswith("dead_letter.")}
    per_split: dict[str, dict[str, dict]] = {"with_value": {}, "dense_sum": {}}
    first, last = {}, {}
    for key, n in counts.items():
        kind, _, rest = key.partition(".")
        if kind in per_split:
            split, name = rest.split(".", 1)
            per_split[kind].setdefault(split, {})[name] = n
        elif kind in ("time_first", "time_last"):
            (first if kind == "time_first" else last)[rest] = n[1]
    return PreprocessResult(staged.root, counts.get("in", 0), counts.get("train", 0), counts.get("eval", 0), dead,
                            counts.get("validation", 0), per_split["with_value"], per_split["dense_sum"],
                            {path: (first[path], last[path]) for path in first},
                            {s: counts.get(f"positives.{s}", 0) for s in SPLITS})


def _staging_path(output: str) -> str:
    """Where the job writes before publishing: a hidden sibling of OUTPUT, tagged with this process's pid."""
    out = os.path.abspath(output)
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _output_lock(output: str) -> DirLock:
    """The lock a run holds on OUTPUT from its emptiness check to its publication: a hidden sibling file
    (OUTPUT itself must stay empty), so a second run into the same OUTPUT fails at once instead of
    removing the first one's staging folder or publishing over it."""
    return DirLock.beside(output, f"preprocess output {output}")


def remove_stale_staging(output: str) -> list[str]:
    """Staging folders of OUTPUT whose process is gone (killed before it could clean up); returns them."""
    out = os.path.abspath(output)
    parent, prefix = os.path.dirname(out), f".{os.path.basename(out)}.staging-"
    removed = []
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            removed.append(os.path.join(parent, name))
    return removed


def _check_written(data: PreprocessedData, res: PreprocessResult) -> None:
    """The shards and dead-letter files on disk hold exactly the rows the accounting counted: a runner
    that loses written files (a sink step re-run after a worker died) fails the run here instead."""
    import pyarrow.parquet as pq

    from recpipe.features.record_codec import count_rows
    found = {split: count_rows(data.shard_files(split)) for split in SPLITS}
    found["dead_letter"] = sum(pq.read_metadata(path, filesystem=fs).num_rows
                               for fs, path in map(fsio.resolve, data.dead_letter_files()))
    expected = {**{s: res.rows(s) for s in SPLITS}, "dead_letter": res.rows_dead}
    wrong = [f"{k}: {found[k]} rows written, {expected[k]} counted" for k in expected if found[k] != expected[k]]
    if wrong:
        raise PreprocessError(f"{data.root}: the written files do not hold the counted rows ({'; '.join(wrong)}); "
                              f"the runner lost or duplicated output files: rerun the job")


def _check_usable(cfg: Config, artifact: TransformArtifact, res: PreprocessResult, previous: TransformArtifact | None,
                  say, eval_sample=None, repeated: list[str] | None = None) -> None:
    """Nothing is published that training cannot use: finite statistics, non-empty splits; features the
    train split gives nothing to learn from, or whose splits (or this day and the previous) disagree, are
    named (recpipe.pipeline.anomalies), and so are those that give the label away on the eval sample
    (recpipe.pipeline.leakage) and the `repeated` rows' warnings."""
    for name, stats in artifact.dense_stats.items():
        values = [stats.get("mean"), stats.get("std"), *stats.get("boundaries", [])]
        if not all(v is None or math.isfinite(v) for v in values):
            raise PreprocessError(f"dense feature {name!r}: its statistics are not finite ({stats}); a value in its "
                                  f"column overflows (see features.dense[].out_of_range)")
    if res.rows_train == 0:
        why = "every row was dead-lettered" if res.rows_dead == res.rows_in else "the eval split took every row"
        raise PreprocessError(f"the train split is empty: {why} ({res.summary()})")
    wanted = ["eval", "validation"] if cfg.split.validation_fraction > 0 else ["eval"]
    for split in wanted:
        if res.rows(split) == 0:
            if cfg.split.by == "user":
                message = (f"the {split} split is empty: no user has {2 if split == 'eval' else 3} or more distinct "
                           f"{cfg.split_order} values ({res.summary()})")
            else:
                message = (f"the {split} split is empty: no good row is later than its cutoff (constant "
                           f"{cfg.input.timestamp or 'row order'}?) ({res.summary()})")
            if cfg.split.on_empty == "fail":
                raise PreprocessError(message + "; set split.on_empty: warn to publish it anyway")
            say(f"preprocess: WARNING: {message}; published because split.on_empty is warn")
    anomalies = [*dead_letter_warnings(res.rows_in, res.dead_letter, cfg.preprocess.max_dead_letter_fraction,
                                       fsio.join(res.output, "dead_letter")),
                 *feature_warnings(cfg, artifact, res.split_counts(), previous),
                 *timestamp_warnings(res.time_ranges, cfg.input.timestamp),
                 *(leak_warnings(cfg, eval_sample) if eval_sample is not None else []),
                 *(repeated or [])]
    _report(cfg, anomalies, say)


def _report(cfg: Config, anomalies: list[str], say) -> None:
    """Each anomaly as a WARNING line, or, under preprocess.on_anomaly: fail, the run stopped naming them all."""
    if anomalies and cfg.preprocess.on_anomaly == "fail":
        raise PreprocessError("; ".join(anomalies) + " (preprocess.on_anomaly is fail)")
    for warning in anomalies:
        say(f"preprocess: WARNING: {warning}")


def run_preprocess(cfg: Config, input_spec: str, output: str, beam_args: list[str] | None = None,
                   say=print, previous_transform: str | None = None, day: str | None = None) -> PreprocessResult:
    """Run the job; publish OUTPUT atomically (local paths) and check the row accounting.

    beam_args: Beam options on top of recpipe.pipeline.options.DEFAULT_BEAM_ARGS.
    previous_transform: extend that run's vocabularies (IDs of kept values never change).
    day: YYYY-MM-DD of this run (default: the input's latest dt= partition), for the vocabularies'
    admission window and eviction (recpipe.pipeline.lifecycle).
    """
    beam_args = beam_args_with_defaults(beam_args)
    check_beam_args(beam_args)
    files = list_input_files(input_spec)
    raw_schema, inputs = inspect_inputs(files, cfg)
    previous = load_previous_transform(previous_transform, cfg, raw_schema) if previous_transform else None
    raw_schema = typed_schema(raw_schema, previous, input_spec)
    day_no = run_day(cfg, day, files, previous)
    total = sum(f.num_rows for f in inputs)
    say(f"preprocess: {len(inputs)} file(s), {total} rows")
    days = partition_days(files)
    copies = same_files(inputs)
    _report(cfg, [*copied_file_warnings(copies), *volume_warnings(cfg, total, days, previous)],
            say)  # at launch, before any stage runs

    local = "://" not in output
    with _output_lock(output) if local else contextlib.nullcontext():  # one run writes OUTPUT at a time
        if local and os.path.exists(output) and os.listdir(output):
            raise PreprocessError(f"{output}: output directory exists and is not empty")
        if local:
            for stale in remove_stale_staging(output):
                say(f"preprocess: removed {stale}, left by a run that was killed")
        staging = _staging_path(output) if local else output

        options = PipelineOptions(beam_args)
        try:
            p = beam.Pipeline(runner=pipeline_runner(options), options=options)
            build_pipeline(p, cfg, inputs, raw_schema, PreprocessedData(staging), previous, previous_transform, day_no)
            result = p.run()
            result.wait_until_finish()
            staged = PreprocessedData(staging)
            res = dataclasses.replace(_row_counts(staged), output=output)
            if res.rows_in != total or res.rows_in != res.rows_out + res.rows_dead:
                raise PreprocessError(f"row accounting does not balance: footers say {total} rows; {res.summary()}")
            counted = _counter(result, "rows_in")
            if counted is not None and counted != res.rows_in:
                say(f"preprocess: note: the rows_in counter says {counted}, the data {res.rows_in} (a retried task "
                    f"counted twice?); the accounting uses the data")
            _check_written(staged, res)
            repeats = _repeats(staged, cfg)
            artifact = staged.transform()  # the published artifact must load
            repeated = repeated_row_warnings(repeats, inputs, copies, cfg.preprocess.max_repeated_row_fraction) \
                if repeats is not None else []
            _check_usable(cfg, artifact, res, previous, say, staged.eval_sample_table(), repeated)
            artifact.row_counts = {"in": res.rows_in, "train": res.rows_train, "validation": res.rows_validation,
                                   "eval": res.rows_eval,
                                   "dead_letter": res.rows_dead, "dead_letter_by_reason": res.dead_letter,
                                   "files": len(inputs), "partition_days": len(days),
                                   "repeated_rows": repeats.repeats if repeats is not None else None,
                                   "with_value": res.with_value, "dense_sums": res.dense_sums,
                                   "positives": res.positives,
                                   "shard_bytes": staged.shard_sizes()}  # what a copy of the folder must hold
            artifact.write_meta(staged.transform_dir)  # last: the row counts mark the folder complete
            if local:
                if os.path.exists(output):
                    os.rmdir(output)
                os.rename(staging, output)
        except BaseException:
            if local and os.path.isdir(staging):
                shutil.rmtree(staging, ignore_errors=True)
            raise
    say(f"preprocess: {res.summary()}")
    return res
