"""The `recpipe preprocess` Beam job: Parquet click logs -> transform artifact + training shards.

    OUTPUT/transform/     features.artifact.TransformArtifact (vocabularies, dense stats, counts)
    OUTPUT/train/*.tfrecord, OUTPUT/eval/*.tfrecord   features.records batches
    OUTPUT/dead_letter/*.parquet   rows that cannot be used: source_file, row, reason, field, row_json

Runs on any Beam runner given by `beam_args` (default: DirectRunner). The run fails unless
rows in = rows train + rows eval + rows dead-lettered, exactly.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from dataclasses import dataclass, field

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from features import fsio
from features.artifact import TransformArtifact
from features.config import Config
from pipeline.sources import inspect_inputs, list_input_files
from pipeline.transforms import (DEAD_LETTER_SCHEMA, NAMESPACE, ApplyTransform, AssembleArtifact,
                                 ComputeDenseStats, ComputeVocabularies, ReadClickLogs, SplitRows,
                                 ValidateRows)

__all__ = ["PreprocessError", "PreprocessResult", "build_pipeline", "run_preprocess"]


class PreprocessError(RuntimeError):
    pass


@dataclass
class PreprocessResult:
    output: str
    rows_in: int
    rows_train: int
    rows_eval: int
    dead_letter: dict[str, int] = field(default_factory=dict)

    @property
    def rows_dead(self) -> int:
        return sum(self.dead_letter.values())

    def summary(self) -> str:
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(self.dead_letter.items())) or "none"
        return (f"rows in = {self.rows_in} = rows out {self.rows_train + self.rows_eval} "
                f"(train {self.rows_train}, eval {self.rows_eval}) + rows dead-lettered {self.rows_dead} "
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


def build_pipeline(p: beam.Pipeline, cfg: Config, files, raw_schema: dict[str, str], out: str) -> None:
    total = sum(f.num_rows for f in files)
    split_info = ({"kind": "timestamp", "column": cfg.input.timestamp} if cfg.input.timestamp
                  else {"kind": "row_order"})
    split_info["eval_fraction"] = cfg.split.eval_fraction

    batches = p | "ReadClickLogs" >> ReadClickLogs([(f.path, f.first_row) for f in files], cfg.raw_columns())
    validated = batches | "ValidateRows" >> ValidateRows(cfg)
    splits = validated.good | "SplitByTime" >> SplitRows(cfg, total)
    vocabs = splits.train | "ComputeVocabularies" >> ComputeVocabularies(cfg)
    stats = splits.train | "ComputeDenseStats" >> ComputeDenseStats(cfg)
    artifact = (vocabs, stats) | "AssembleArtifact" >> AssembleArtifact(cfg, raw_schema, split_info, _versions())
    _ = artifact | "WriteArtifact" >> beam.Map(lambda a: a.write(fsio.join(out, "transform")))
    for split in ("train", "eval"):
        _ = (splits[split]
             | f"ApplyTransform[{split}]" >> ApplyTransform(artifact)
             | f"WriteShards[{split}]" >> beam.io.WriteToTFRecord(
                 fsio.join(out, split, "part"), file_name_suffix=".tfrecord"))
    _ = (validated.dead_letter
         | "WriteDeadLetter" >> beam.io.WriteToParquetBatched(
             fsio.join(out, "dead_letter", "part"), schema=DEAD_LETTER_SCHEMA, file_name_suffix=".parquet"))


def _counter(result, name: str) -> int:
    found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE).with_name(name))["counters"]
    return sum(int(r.committed if r.committed is not None else r.attempted) for r in found)


def _dead_letter_counts(result) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]:
        name = r.key.metric.name
        if name.startswith("dead_letter."):
            value = int(r.committed if r.committed is not None else r.attempted)
            out[name.split(".", 1)[1]] = out.get(name.split(".", 1)[1], 0) + value
    return out


def run_preprocess(cfg: Config, input_spec: str, output: str, beam_args: list[str] | None = None,
                   progress=print) -> PreprocessResult:
    """Run the job; publish OUTPUT atomically (local paths) and check the row accounting."""
    files = list_input_files(input_spec)
    raw_schema, inputs = inspect_inputs(files, cfg)
    total = sum(f.num_rows for f in inputs)
    progress(f"preprocess: {len(inputs)} file(s), {total} rows")

    local = "://" not in output
    if local and os.path.exists(output) and os.listdir(output):
        raise PreprocessError(f"{output}: output directory exists and is not empty")
    staging = (os.path.join(os.path.dirname(os.path.abspath(output)) or ".",
                            f".{os.path.basename(os.path.abspath(output))}.staging-{uuid.uuid4().hex[:8]}")
               if local else output)

    options = PipelineOptions(beam_args or [])
    try:
        p = beam.Pipeline(options=options)
        build_pipeline(p, cfg, inputs, raw_schema, staging)
        result = p.run()
        result.wait_until_finish()
        res = PreprocessResult(output, _counter(result, "rows_in"), _counter(result, "rows_train"),
                               _counter(result, "rows_eval"), _dead_letter_counts(result))
        if res.rows_in != total or res.rows_in != res.rows_train + res.rows_eval + res.rows_dead:
            raise PreprocessError(f"row accounting does not balance: footers say {total} rows; {res.summary()}")
        art_dir = fsio.join(staging, "transform")
        meta_path = fsio.join(art_dir, "transform.json")
        meta = json.loads(fsio.read_text(meta_path))
        meta["row_counts"] = {"in": res.rows_in, "train": res.rows_train, "eval": res.rows_eval,
                              "dead_letter": res.rows_dead, "dead_letter_by_reason": res.dead_letter,
                              "files": len(inputs)}
        fsio.write_text(meta_path, json.dumps(meta, indent=1, sort_keys=True))
        TransformArtifact.read(art_dir)  # the published artifact must load
        if local:
            if os.path.exists(output):
                os.rmdir(output)
            os.rename(staging, output)
    except BaseException:
        if local and os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)
        raise
    progress(f"preprocess: {res.summary()}")
    return res
