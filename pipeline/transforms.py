"""The preprocessing stages as small composite Beam PTransforms over Arrow record batches.

ReadClickLogs -> ValidateRows -> SplitByTime -> Canonicalize -> (ComputeVocabularies,
ComputeDenseStats) -> AssembleArtifact -> ApplyTransform -> WriteShards.
"""
from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass
from typing import Any, Iterable

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics

from features.artifact import TransformArtifact
from features.canonical import LABEL_KEY, canonicalize, dense_prenorm, validate_batch
from features.config import Config

__all__ = ["NAMESPACE", "DEAD_LETTER_SCHEMA", "RawBatch", "ReadClickLogs", "ValidateRows",
           "SplitRows", "ComputeVocabularies", "ComputeDenseStats", "AssembleArtifact",
           "ApplyTransform", "eval_cutoff_from_histogram", "select_vocabulary"]

NAMESPACE = "recpipe"
DEAD_TAG = "dead_letter"
DEAD_LETTER_SCHEMA = pa.schema([
    ("source_file", pa.string()), ("row", pa.int64()), ("reason", pa.string()),
    ("field", pa.string()), ("row_json", pa.string()),
])


@dataclass
class RawBatch:
    source: str
    first_row: int          # row number of the batch's first row within its file
    positions: np.ndarray   # global row numbers (files in path order) of the batch's rows
    table: pa.Table


# ------------------------------------------------------------------------- read
class _ReadFile(beam.DoFn):
    def __init__(self, columns: list[str], batch_rows: int):
        self._columns = columns
        self._batch_rows = batch_rows
        self._rows_in = Metrics.counter(NAMESPACE, "rows_in")

    def process(self, element: tuple[str, int]) -> Iterable[RawBatch]:
        from pipeline.sources import open_parquet
        path, first_global = element
        pf = open_parquet(path)
        start = 0
        try:
            for batch in pf.iter_batches(batch_size=self._batch_rows, columns=self._columns):
                n = batch.num_rows
                self._rows_in.inc(n)
                yield RawBatch(path, start, np.arange(first_global + start, first_global + start + n),
                               pa.Table.from_batches([batch]))
                start += n
        except (OSError, pa.ArrowException) as e:
            raise ValueError(f"{path}: unreadable after row {start} ({type(e).__name__}: {e})") from None
        expected = pf.metadata.num_rows
        if start != expected:
            raise ValueError(f"{path}: read {start} rows but the footer says {expected}")


class ReadClickLogs(beam.PTransform):
    def __init__(self, files: list[tuple[str, int]], columns: list[str], batch_rows: int = 65_536):
        super().__init__()
        self._files, self._columns, self._batch_rows = files, columns, batch_rows

    def expand(self, pbegin):
        return (pbegin
                | "Files" >> beam.Create(self._files)
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.ParDo(_ReadFile(self._columns, self._batch_rows)))


# ------------------------------------------------------------------------- validate
class _Validate(beam.DoFn):
    def __init__(self, cfg: Config):
        self._cfg = cfg
        self._counters: dict[str, Any] = {}

    def _count(self, reason: str, n: int) -> None:
        if reason not in self._counters:
            self._counters[reason] = Metrics.counter(NAMESPACE, f"dead_letter.{reason}")
        self._counters[reason].inc(n)

    def process(self, b: RawBatch):
        good, bad = validate_batch(b.table, self._cfg)
        if len(bad.indices):
            for reason in set(bad.reasons):
                self._count(reason, bad.reasons.count(reason))
            rows = b.table.take(pa.array(bad.indices)).to_pylist()
            yield beam.pvalue.TaggedOutput(DEAD_TAG, pa.table({
                "source_file": [b.source] * len(rows),
                "row": (b.first_row + bad.indices).astype(np.int64),
                "reason": bad.reasons,
                "field": bad.fields,
                "row_json": [json.dumps(r, default=str) for r in rows],
            }, schema=DEAD_LETTER_SCHEMA))
        if good.all():
            yield b
        elif good.any():
            keep = np.flatnonzero(good)
            yield RawBatch(b.source, b.first_row, b.positions[keep], b.table.take(pa.array(keep)))


class ValidateRows(beam.PTransform):
    """Good batches on the main output, bad rows (as Arrow tables) on `dead_letter`."""

    def __init__(self, cfg: Config):
        super().__init__()
        self._cfg = cfg

    def expand(self, batches):
        return batches | beam.ParDo(_Validate(self._cfg)).with_outputs(DEAD_TAG, main="good")


# ------------------------------------------------------------------------- split
def ts_histogram(b: RawBatch, column: str) -> dict[int, int]:
    counts = pc.value_counts(b.table.column(column).combine_chunks())
    return dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()))


class _MergeDicts(beam.CombineFn):
    """Merges dicts key by key with `add`; `finish` turns the merged dict into the output."""

    def __init__(self, add, finish=None):
        self._add, self._finish = add, finish

    def create_accumulator(self):
        return {}

    def add_input(self, acc, item):
        for k, v in item.items():
            acc[k] = self._add(acc[k], v) if k in acc else v
        return acc

    def merge_accumulators(self, accs):
        out: dict = {}
        for a in accs:
            self.add_input(out, a)
        return out

    def extract_output(self, acc):
        return self._finish(acc) if self._finish else acc


def eval_cutoff_from_histogram(hist: dict[int, int], eval_fraction: float) -> float:
    """Rows with timestamp > cutoff are eval: the smallest cutoff leaving >= (1-f) of rows in train."""
    if not hist:
        return math.inf
    total = sum(hist.values())
    need_train = total - math.floor(eval_fraction * total)
    seen = 0
    for ts in sorted(hist):
        seen += hist[ts]
        if seen >= need_train:
            return ts
    return max(hist)


class _Split(beam.DoFn):
    def __init__(self, cfg: Config):
        self._cfg = cfg
        self._rows = {s: Metrics.counter(NAMESPACE, f"rows_{s}") for s in ("train", "eval")}

    def process(self, b: RawBatch, cutoff):
        if self._cfg.input.timestamp:
            key = b.table.column(self._cfg.input.timestamp).to_numpy().astype(np.float64)
        else:
            key = b.positions.astype(np.float64)
        is_eval = key > cutoff
        for split, mask in (("train", ~is_eval), ("eval", is_eval)):
            n = int(mask.sum())
            if n:
                self._rows[split].inc(n)
                table = b.table if n == len(mask) else b.table.filter(pa.array(mask))
                yield beam.pvalue.TaggedOutput(split, canonicalize(table, self._cfg))


class SplitRows(beam.PTransform):
    """Good batches -> canonical column dicts on outputs `train` and `eval` (last fraction by time)."""

    def __init__(self, cfg: Config, total_rows: int):
        super().__init__()
        self._cfg, self._total = cfg, total_rows

    def expand(self, good):
        cfg = self._cfg
        if cfg.input.timestamp:
            cutoff = (good
                      | "TsHistogram" >> beam.Map(ts_histogram, cfg.input.timestamp)
                      | "MergeHistogram" >> beam.CombineGlobally(_MergeDicts(operator.add))
                      | "Cutoff" >> beam.Map(eval_cutoff_from_histogram, cfg.split.eval_fraction))
        else:
            n_train = self._total - math.floor(cfg.split.eval_fraction * self._total)
            cutoff = good.pipeline | "Cutoff" >> beam.Create([float(n_train - 1)])
        return good | "Split" >> beam.ParDo(_Split(cfg), cutoff=beam.pvalue.AsSingleton(cutoff)).with_outputs(
            "train", "eval")


# ------------------------------------------------------------------------- analyse
def _token_counts(cols: dict[str, pa.Array], cfg: Config) -> Iterable[tuple[tuple[str, str], int]]:
    for f in cfg.features.sparse:
        owner = cfg.table_owner(f)
        if owner.vocab is None:
            continue
        arr = cols[f.name]
        if pa.types.is_list(arr.type):
            arr = pc.list_flatten(arr)
        counts = pc.value_counts(arr)
        for v, c in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()):
            yield (owner.name, v), c


def select_vocabulary(counts: Iterable[tuple[str, int]], min_count: int, max_size: int | None
                      ) -> tuple[list[str], list[int]]:
    """Values with count >= min_count, most frequent first, ties by value; at most max_size."""
    kept = sorted(((v, c) for v, c in counts if c >= min_count), key=lambda vc: (-vc[1], vc[0]))
    if max_size is not None:
        kept = kept[:max_size]
    return [v for v, _ in kept], [c for _, c in kept]


class ComputeVocabularies(beam.PTransform):
    """Canonical train batches -> (owner feature name, (values, counts)) per vocabulary."""

    def __init__(self, cfg: Config):
        super().__init__()
        self._cfg = cfg

    def expand(self, train):
        cfg = self._cfg
        owners = {f.name: f.vocab for f in cfg.features.sparse if f.vocab is not None}

        def by_owner(kv):
            (owner, value), count = kv
            return owner, (value, count)

        def select(kv):
            owner, counts = kv
            spec = owners[owner]
            return owner, select_vocabulary(counts, spec.min_count, spec.max_size)

        counted = (train
                   | "TokenCounts" >> beam.FlatMap(_token_counts, cfg)
                   | "SumCounts" >> beam.CombinePerKey(sum)
                   | "DropRare" >> beam.Filter(lambda kv: kv[1] >= owners[kv[0][0]].min_count)
                   | "ByOwner" >> beam.Map(by_owner)
                   | "Group" >> beam.GroupByKey()
                   | "TopK" >> beam.Map(select))
        # Every vocabulary owner gets an entry, also when no value reached min_count.
        empty = train.pipeline | "AllOwners" >> beam.Create([(o, ([], [])) for o in owners])
        return ((counted, empty) | "WithEmpty" >> beam.Flatten()
                | "OnePerOwner" >> beam.CombinePerKey(lambda vs: max(list(vs), key=lambda x: len(x[0]))))


def _moments(cols: dict[str, pa.Array], cfg: Config) -> dict[str, tuple[int, float, float]]:
    out = {}
    for d in cfg.features.dense:
        if d.transform == "bucketize":
            continue
        x = dense_prenorm(cols[d.name].to_numpy(zero_copy_only=False), d.transform, d.fill).astype(np.float64)
        out[d.name] = (len(x), float(x.sum()), float((x * x).sum()))
    return out


def _moment_stats(acc: dict[str, tuple[int, float, float]]) -> dict[str, dict]:
    stats = {}
    for k, (n, s, ss) in acc.items():
        mean = s / n if n else 0.0
        var = max(ss / n - mean * mean, 0.0) if n else 1.0
        stats[k] = {"mean": mean, "std": math.sqrt(var), "count": n}
    return stats


def _add_moments(a: tuple, b: tuple) -> tuple:
    return tuple(x + y for x, y in zip(a, b))


class ComputeDenseStats(beam.PTransform):
    """Canonical train batches -> {feature: {mean, std, count} or {boundaries}} (one element)."""

    def __init__(self, cfg: Config):
        super().__init__()
        self._cfg = cfg

    def expand(self, train):
        cfg = self._cfg
        moments = (train | "Moments" >> beam.Map(_moments, cfg)
                   | "SumMoments" >> beam.CombineGlobally(_MergeDicts(_add_moments, _moment_stats)))
        buckets = {d.name: d for d in cfg.features.dense if d.transform == "bucketize"}

        def values(cols):
            for name, d in buckets.items():
                yield name, dense_prenorm(cols[name].to_numpy(zero_copy_only=False), d.transform, d.fill).tolist()

        quantiles = (train | "BucketValues" >> beam.FlatMap(values)
                     | "Quantiles" >> beam.ApproximateQuantiles.PerKey(
                         max(d.num_buckets for d in buckets.values()) + 1 if buckets else 2, input_batched=True))

        def merge(moment_stats, quantile_list):
            stats = dict(moment_stats)
            for name, qs in quantile_list:
                n = buckets[name].num_buckets
                step = (len(qs) - 1) / n
                inner = [float(qs[round(i * step)]) for i in range(1, n)]
                stats[name] = {"boundaries": sorted(set(inner))}
            for name in buckets:
                stats.setdefault(name, {"boundaries": []})
            return stats

        return (moments | "WithBoundaries" >> beam.Map(merge, beam.pvalue.AsList(quantiles)))


# ------------------------------------------------------------------------- artifact + transform
class AssembleArtifact(beam.PTransform):
    def __init__(self, cfg: Config, raw_schema: dict[str, str], split: dict, versions: dict):
        super().__init__()
        self._cfg, self._raw, self._split, self._versions = cfg, raw_schema, split, versions

    def expand(self, inputs):
        vocabs, stats = inputs

        def assemble(_, vocab_list, dense_stats):
            return TransformArtifact(
                config=self._cfg, raw_schema=self._raw,
                vocabularies={o: list(v) for o, (v, _) in vocab_list},
                vocab_counts={o: list(c) for o, (_, c) in vocab_list},
                dense_stats=dense_stats, split=self._split, versions=self._versions)

        return (vocabs.pipeline | "Seed" >> beam.Create([None])
                | "Assemble" >> beam.Map(assemble, beam.pvalue.AsList(vocabs), beam.pvalue.AsSingleton(stats)))


class _Transform(beam.DoFn):
    """Canonical batch -> one serialized record of transformed columns (features.records)."""

    def __init__(self):
        self._transform = None

    def process(self, cols: dict[str, pa.Array], artifact: TransformArtifact):
        from features.records import encode_batch
        from features.transform import FeatureTransform, canonical_to_tensors
        if self._transform is None:
            self._transform = FeatureTransform(artifact)
        label = cols[LABEL_KEY]
        out = self._transform(canonical_to_tensors({k: v for k, v in cols.items() if k != LABEL_KEY}))
        out[LABEL_KEY] = label.to_numpy(zero_copy_only=False).astype(np.float32)
        yield encode_batch(out)


class ApplyTransform(beam.PTransform):
    def __init__(self, artifact):
        super().__init__()
        self._artifact = artifact

    def expand(self, batches):
        return batches | beam.ParDo(_Transform(), beam.pvalue.AsSingleton(self._artifact))
