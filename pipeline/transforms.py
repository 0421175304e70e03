"""The preprocessing stages as small composite Beam PTransforms over Arrow record batches.

pass 1  ReadClickLogs -> ValidateRows -> SplitCutoffs
pass 2  ReadClickLogs -> ValidateRows -> SplitRows.train -> ComputeVocabularies, ComputeDenseStats
        -> AssembleArtifact
pass 3  ReadClickLogs -> ValidateRows (+ dead letter) -> SplitRows -> ApplyTransform -> shards
        and from its read batches: CountRows, FindRepeatedRows
The per-batch arithmetic lives in recpipe.pipeline.analysis (pure, shared with the benchmark baseline).
"""
from __future__ import annotations

import functools
import json
import operator
import pickle
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filebasedsink import FileBasedSink
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from recpipe.common import fsio
from recpipe.common.prefetch import prefetch
from recpipe.features.artifact import TransformArtifact
from recpipe.features.canonical import (LABEL_KEY, BadRows, canonicalize, decoded, dense_sums, is_id_dictionary,
                                plain_columns, rows_with_value, times, validate_batch)
from recpipe.features.config import Config
from recpipe.features.dictionaries import DictionaryMemo
from recpipe.common.days import day_name, day_number
from recpipe.features.preprocessed import SPLITS
from recpipe.pipeline.lifecycle import VocabState, advance_vocabulary
from recpipe.pipeline.repeats import (BUCKET_ROWS, Repeats, bucketed, find_repeats, pairs_bytes, pairs_from_bytes,
                              row_hashes)
from recpipe.pipeline.analysis import (COUNT_SCHEMA, batch_dense_stats, dense_stats, merge_count_tables,
                               merge_dense_stats, select_vocabulary_table, split_cutoffs_by_row,
                               split_cutoffs_from_histogram, TokenCounts, ts_histogram, user_last_orders,
                               user_split_masks, merge_last_orders)

__all__ = ["NAMESPACE", "DEAD_LETTER_SCHEMA", "RawBatch", "RawBatchCoder", "Columns", "ColumnsCoder", "ReadClickLogs",
           "READ_UNIT_ROWS", "read_units", "ValidateRows", "SplitCutoffs", "SplitRows", "ComputeVocabularies",
           "ComputeDenseStats", "AssembleArtifact", "PackArtifact", "pack_artifact", "ApplyTransform", "WriteRecords",
           "WriteEvalSample", "CountRows", "FindRepeatedRows", "EVAL_SAMPLE_ROWS"]

NAMESPACE = "recpipe"
EVAL_SAMPLE_ROWS = 1000  # raw eval rows kept for the export's skew check
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
    hashes: np.ndarray | None = None  # recpipe.pipeline.repeats.row_hashes of the table, when the read computed them
    checked: tuple[np.ndarray, BadRows] | None = None  # validate_batch of the table, when the read computed it


class Columns(dict):
    """A canonical batch (recpipe.features.canonical.canonicalize): column name -> Arrow array. A dict,
    typed so that its PCollections get ColumnsCoder."""


class _PickledArrowCoder(beam.coders.Coder):
    """Pickled, as Beam's fallback coder would, but with a size estimate from the Arrow buffers' sizes.
    A runner measures the encoded size of a sample of each PCollection's elements for its metrics, every
    one of the first few dozen: with the fallback, each batch (27 MB at 64k Criteo-shaped rows) would be
    pickled once more just to be measured, 1.1 GB in all for 2M rows."""

    def encode(self, value) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes):
        return pickle.loads(encoded)

    def is_deterministic(self) -> bool:
        return False


def _compact(arr: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A dictionary-encoded column as plain strings when its dictionary holds more values than it has rows
    (it shares its row group's whole dictionary, which pickling would copy); any other column as it is."""
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    if not any(is_id_dictionary(c) and len(c.dictionary) > len(c) for c in chunks):
        return arr
    return pa.chunked_array([decoded(c) for c in chunks]) if isinstance(arr, pa.ChunkedArray) else decoded(arr)


class RawBatchCoder(_PickledArrowCoder):
    """RawBatch's coder (dictionary-encoded columns pickled compact: _compact)."""

    def encode(self, value: RawBatch) -> bytes:
        table = pa.table({name: _compact(c) for name, c in zip(value.table.column_names, value.table.columns)})
        return super().encode(replace(value, table=table))

    def estimate_size(self, value: RawBatch) -> int:
        hashes = 0 if value.hashes is None else value.hashes.nbytes
        checked = 0 if value.checked is None else value.checked[0].nbytes + value.checked[1].indices.nbytes
        return value.table.nbytes + value.positions.nbytes + hashes + checked + len(value.source)


class ColumnsCoder(_PickledArrowCoder):
    """Columns' coder (dictionary-encoded columns pickled compact: _compact)."""

    def encode(self, value: Columns) -> bytes:
        return super().encode(Columns({name: _compact(column) for name, column in value.items()}))

    def estimate_size(self, value: Columns) -> int:
        return sum(len(name) + column.nbytes for name, column in value.items())


beam.coders.registry.register_coder(RawBatch, RawBatchCoder)
beam.coders.registry.register_coder(Columns, ColumnsCoder)


# ------------------------------------------------------------------------- read
class _ReadFile(beam.DoFn):
    def __init__(self, columns: list[str], kinds: dict[str, str], batch_rows: int, count_rows: bool,
                 hash_rows: bool = False, validate: Config | None = None, encoded: tuple[str, ...] = ()):
        self._columns, self._kinds, self._encoded = columns, kinds, encoded
        self._batch_rows = batch_rows
        self._rows_in = Metrics.counter(NAMESPACE, "rows_in") if count_rows else None
        self._hash_rows = hash_rows
        self._validate = validate

    def process(self, element: tuple[tuple[str, int], ...]) -> Iterable[RawBatch]:
        for path, first_global in element:
            yield from self._read(path, first_global)

    def _read(self, path: str, first_global: int) -> Iterable[RawBatch]:
        from recpipe.pipeline.sources import open_parquet
        pf = open_parquet(path, self._encoded)
        start = 0
        # the next batch is decoded (and validated, for ValidateRows) on another thread while this one goes
        # down the stages (Arrow decodes without the interpreter lock): 2M Criteo-shaped rows, about 1 s of
        # each pass's main thread
        cfg = self._validate
        tables = prefetch(((t, _validated(t, cfg) if cfg is not None else None)
                           for t in (plain_columns(pa.Table.from_batches([batch]), self._kinds, self._encoded)
                                     for batch in pf.iter_batches(batch_size=self._batch_rows, columns=self._columns))),
                          name="parquet-read")
        # and its rows are hashed on a third, one batch behind the read (numpy lets go of the interpreter
        # lock): hashing in line cost the job 14 %, on a thread 7 %
        memo = DictionaryMemo()  # a row group's batches share its dictionaries: each hashed once
        batches = prefetch(((t, c, row_hashes(t, memo)) for t, c in tables), name="row-hashes") \
            if self._hash_rows else ((t, c, None) for t, c in tables)
        try:
            for table, checked, hashes in batches:
                n = table.num_rows
                if self._rows_in is not None:
                    self._rows_in.inc(n)
                yield RawBatch(path, start, np.arange(first_global + start, first_global + start + n), table, hashes,
                               checked)
                start += n
        except (OSError, pa.ArrowException) as e:
            raise ValueError(f"{path}: unreadable after row {start} ({type(e).__name__}: "
                             f"{' '.join(str(e).split())})") from None
        expected = pf.metadata.num_rows
        if start != expected:
            raise ValueError(f"{path}: read {start} rows but the footer says {expected}")


def _validated(table: pa.Table, cfg: Config) -> tuple[np.ndarray, BadRows] | None:
    """validate_batch's result for the read to carry, or None when it raises: ValidateRows then runs it again
    and the error surfaces in its own step, not as the file being unreadable."""
    try:
        return validate_batch(table, cfg)
    except Exception:  # noqa: BLE001 - raised again, where it belongs, by ValidateRows
        return None


READ_UNIT_ROWS = 262_144  # a read's unit of work (a bundle on the Dask runner): whole files, this many rows or more


def read_units(files: list[tuple[str, int, int]], min_rows: int) -> list[tuple[tuple[str, int], ...]]:
    """Consecutive files grouped into the read's units of work.

    Args:
        files: (path, first global row, rows) of each file, in path order.
        min_rows: rows a unit reaches before the next file starts another (a file is never split).

    Returns:
        Tuples of (path, first global row), each unit's files in order; every file is in exactly one.
        A runner gives each unit at least a bundle of its own, so a unit bounds the rows a bundle holds
        (one large file excepted) and many small files do not each cost a bundle.
    """
    units, unit, rows = [], [], 0
    for path, first_row, n in files:
        unit.append((path, first_row))
        rows += n
        if rows >= min_rows:
            units.append(tuple(unit))
            unit, rows = [], 0
    if unit:
        units.append(tuple(unit))
    return units


class ReadClickLogs(beam.PTransform):
    """(path, first global row, rows) of each file -> RawBatch record batches of `columns`, streamed per file,
    read in units of whole files (read_units).

    The job reads its input up to three times (split cutoff, analysis, transform) instead of
    holding rows between stages: a runner then keeps at most a few batches per worker in memory.
    Only the transform pass counts `rows_in`, and hashes its rows for FindRepeatedRows (`hash_rows`).
    With `validate`, each batch is validated (validate_batch) on the thread that decodes it, for
    ValidateRows with the same config to use. Columns in `encoded` (recpipe.features.canonical.encoded_columns)
    are read dictionary-encoded where Parquet stores them so and their dictionaries are short
    (recpipe.features.canonical.plain_columns).
    """

    def __init__(self, files: list[tuple[str, int, int]], columns: list[str], kinds: dict[str, str],
                 batch_rows: int = 65_536, count_rows: bool = False, hash_rows: bool = False,
                 validate: Config | None = None, encoded: list[str] | tuple[str, ...] = ()):
        super().__init__()
        self._files, self._columns, self._kinds = files, columns, kinds
        self._batch_rows, self._count, self._hash = batch_rows, count_rows, hash_rows
        self._validate, self._encoded = validate, tuple(c for c in encoded if c in columns)

    def expand(self, pbegin):
        return (pbegin
                | "Files" >> beam.Create(read_units(self._files, READ_UNIT_ROWS), reshuffle=False)  # Spread shuffles
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.ParDo(_ReadFile(self._columns, self._kinds, self._batch_rows, self._count,
                                                 self._hash, self._validate, self._encoded))
                .with_output_types(RawBatch))


# ------------------------------------------------------------------------- validate
class _Validate(beam.DoFn):
    def __init__(self, cfg: Config, dead_letter: bool):
        self._cfg = cfg
        self._dead_letter = dead_letter
        self._counters: dict[str, Any] = {}

    def _count(self, reason: str, n: int) -> None:
        if reason not in self._counters:
            self._counters[reason] = Metrics.counter(NAMESPACE, f"dead_letter.{reason}")
        self._counters[reason].inc(n)

    def process(self, b: RawBatch):
        good, bad = b.checked if b.checked is not None else validate_batch(b.table, self._cfg)
        if len(bad.indices) and self._dead_letter:
            for reason in set(bad.reasons):
                self._count(reason, bad.reasons.count(reason))
            rows = _rows_for_json(b.table.take(pa.array(bad.indices)))
            yield beam.pvalue.TaggedOutput(DEAD_TAG, pa.table({
                "source_file": [b.source] * len(rows),
                "row": (b.first_row + bad.indices).astype(np.int64),
                "reason": bad.reasons,
                "field": bad.fields,
                "row_json": [json.dumps(r, default=str) for r in rows],
            }, schema=DEAD_LETTER_SCHEMA))
        if good.all():
            yield replace(b, checked=None) if b.checked is not None else b  # its mask is spent: not pickled on
        elif good.any():
            keep = np.flatnonzero(good)
            yield RawBatch(b.source, b.first_row, b.positions[keep], b.table.take(pa.array(keep)))


def _bytes_type(tp: pa.DataType) -> pa.DataType | None:
    """The binary twin of a string (or list-of-string) type; None for other types."""
    if pa.types.is_string(tp) or pa.types.is_large_string(tp):
        return pa.binary()
    if pa.types.is_list(tp) or pa.types.is_large_list(tp):
        inner = _bytes_type(tp.value_type)
        return pa.list_(inner) if inner is not None else None
    return None


def _text(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "backslashreplace")  # a dead-lettered row may hold invalid UTF-8
    if isinstance(v, list):
        return [_text(x) for x in v]
    return v


def _rows_for_json(table: pa.Table) -> list[dict]:
    """Rows as Python dicts, strings read as bytes and decoded leniently (escapes for invalid UTF-8)."""
    cols = {}
    for name, col in zip(table.column_names, plain_columns(table).columns):  # dictionaries decoded
        as_bytes = _bytes_type(col.type)
        values = (col.cast(as_bytes) if as_bytes is not None else col).to_pylist()
        cols[name] = [_text(v) for v in values] if as_bytes is not None else values
    return [{k: cols[k][i] for k in cols} for i in range(table.num_rows)]


class ValidateRows(beam.PTransform):
    """Good batches on the main output, bad rows (as Arrow tables) on `dead_letter`.

    With dead_letter=False (the analysis passes) bad rows are dropped uncounted and the result is
    the good PCollection alone; the transform pass is the one that accounts for every row.
    """

    def __init__(self, cfg: Config, dead_letter: bool = True):
        super().__init__()
        self._cfg, self._dead_letter = cfg, dead_letter

    def expand(self, batches):
        pardo = beam.ParDo(_Validate(self._cfg, self._dead_letter)).with_output_types(RawBatch)
        return batches | pardo.with_outputs(DEAD_TAG, main="good") if self._dead_letter else batches | pardo


# ------------------------------------------------------------------------- split
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


class _Split(beam.DoFn):
    def __init__(self, cfg: Config, analysis: bool):
        self._cfg = cfg
        self._rows = None if analysis else {s: Metrics.counter(NAMESPACE, f"rows_{s}") for s in SPLITS}
        self._splits = ("train",) if analysis else SPLITS

    def process(self, b: RawBatch, cutoffs):
        cfg = self._cfg
        if cfg.split.by == "user":  # cutoffs: {user: their last order values}
            is_validation, is_eval = user_split_masks(b.table, cfg.split.user, cfg.split_order, cutoffs,
                                                      cfg.split.validation_fraction > 0)
        else:
            key = times(b.table.column(cfg.input.timestamp))[0] if cfg.input.timestamp else \
                b.positions.astype(np.float64)
            validation_cutoff, eval_cutoff = cutoffs
            is_eval = key > eval_cutoff
            is_validation = (key > validation_cutoff) & ~is_eval
            if cfg.input.timestamp and self._rows is not None and len(key):
                yield beam.pvalue.TaggedOutput("time_range", [(f"time_first.{b.source}", ("min", float(key.min()))),
                                                              (f"time_last.{b.source}", ("max", float(key.max())))])
        for split, mask in (("train", ~(is_eval | is_validation)), ("validation", is_validation), ("eval", is_eval)):
            n = int(mask.sum())
            if n and split in self._splits:
                if self._rows is not None:
                    self._rows[split].inc(n)
                table = b.table if n == len(mask) else b.table.filter(pa.array(mask))
                yield beam.pvalue.TaggedOutput(split, Columns(canonicalize(table, self._cfg)))
                if split == "eval" and self._rows is not None:
                    positions = b.positions if n == len(mask) else b.positions[mask]
                    # copies, not views: a runner may keep this output whole until its reader runs
                    # (Dask does), and a view would keep the batch's whole eval rows with it
                    first = np.arange(min(n, EVAL_SAMPLE_ROWS))
                    sample = plain_columns(table.take(pa.array(first)))  # dictionaries decoded, as a log holds them
                    yield beam.pvalue.TaggedOutput("eval_raw", (positions[first], sample))


class SplitCutoffs(beam.PTransform):
    """Good batches (timestamp configs) -> the (validation, eval) cutoffs: rows with key > eval cutoff
    are eval, rows with validation cutoff < key <= eval cutoff are validation (analysis.split_cutoffs_*).

    The key is the timestamp, or the global row number when the config has no timestamp (then the
    cutoffs come from the Parquet footers' row counts and the input PCollection is not read).
    A user split's "cutoffs" are {user: their last distinct order values} (analysis.user_split_masks),
    one side-input entry per user.
    """

    def __init__(self, cfg: Config, total_rows: int):
        super().__init__()
        self._cfg, self._total = cfg, total_rows

    def expand(self, good):
        cfg = self._cfg
        if cfg.split.by == "user":
            return (good
                    | "LastOrders" >> beam.Map(lambda b, user, order: user_last_orders(b.table, user, order),
                                               cfg.split.user, cfg.split_order)
                    | "MergeLastOrders" >> beam.CombineGlobally(_MergeDicts(merge_last_orders)))
        if cfg.input.timestamp:
            return (good
                    | "TsHistogram" >> beam.Map(lambda b, col: ts_histogram(b.table, col), cfg.input.timestamp)
                    | "MergeHistogram" >> beam.CombineGlobally(_MergeDicts(operator.add))
                    | "Cutoff" >> beam.Map(split_cutoffs_from_histogram, cfg.split.eval_fraction,
                                            cfg.split.validation_fraction))
        cutoffs = split_cutoffs_by_row(self._total, cfg.split.eval_fraction, cfg.split.validation_fraction)
        return good.pipeline | "Cutoff" >> beam.Create([cutoffs])


class SplitRows(beam.PTransform):
    """Good batches -> canonical column dicts on outputs `train`, `validation` and `eval` (and a batch's
    first raw eval rows with their global row numbers, (positions, table), on `eval_raw`; with a timestamp
    split, each batch's first and last timestamp as counts for CountRows on `time_range`), by the cutoffs
    side input, each split's rows counted. For the `analysis` pass: the train rows only, nothing counted."""

    def __init__(self, cfg: Config, cutoff, analysis: bool = False):
        super().__init__()
        self._cfg, self._cutoff, self._analysis = cfg, cutoff, analysis

    def expand(self, good):
        return good | "Split" >> beam.ParDo(_Split(self._cfg, self._analysis),
                                             cutoffs=beam.pvalue.AsSingleton(self._cutoff)).with_output_types(
            Any, **{split: Columns for split in SPLITS}).with_outputs(*SPLITS, "eval_raw", "time_range")


class _FirstRows(beam.CombineFn):
    """(global row numbers, raw Arrow table) pairs -> the table of the n rows with the lowest row numbers
    among them all, in row order (a sample for the export's skew check): the same rows whatever bundles a
    runner made and in whatever order it merged them."""

    def __init__(self, n: int):
        self._n = n

    def create_accumulator(self):
        return None

    def add_input(self, acc, rows):
        positions, table = rows
        if acc is not None:
            positions = np.concatenate([acc[0], positions])
            table = pa.concat_tables([acc[1], table], promote_options="default")
        first = np.argsort(positions, kind="stable")[:self._n]
        return positions[first], table.take(pa.array(first))

    def merge_accumulators(self, accs):
        out = None
        for a in accs:
            if a is not None:
                out = self.add_input(out, a)
        return out

    def extract_output(self, acc):
        return None if acc is None else acc[1]


class WriteEvalSample(beam.PTransform):
    """SplitRows' `eval_raw` (global row numbers, raw eval rows) -> `parquet_path` (the EVAL_SAMPLE_ROWS eval
    rows first in the input, files in path order, or all) and `record_path` (the same rows, in order,
    transformed by the same DoFn as the shards): the export's skew check compares the SavedModel on the
    first with the model on the second."""

    def __init__(self, cfg: Config, parquet_path: str, record_path: str, packed):
        super().__init__()
        self._cfg, self._parquet, self._records, self._packed = cfg, parquet_path, record_path, packed

    def expand(self, tables):
        parquet_path, record_path = self._parquet, self._records

        def write_raw(table):
            import pyarrow.parquet as pq
            fs, p = fsio.resolve(parquet_path)
            pq.write_table(table, p, filesystem=fs)
            return table

        def write_record(parts: tuple[bytes, ...]):
            fsio.write_bytes(record_path, b"".join(parts))

        sample = (tables | "FirstRows" >> beam.CombineGlobally(_FirstRows(EVAL_SAMPLE_ROWS)).without_defaults()
                  | "NonEmpty" >> beam.Filter(lambda t: t is not None and t.num_rows > 0)
                  | "WriteRaw" >> beam.Map(write_raw))
        return (sample | "Canonicalize" >> beam.Map(canonicalize, self._cfg)
                | "Transform" >> beam.ParDo(_Transform(), beam.pvalue.AsSingleton(self._packed))
                | "WriteTransformed" >> beam.Map(write_record))


# ------------------------------------------------------------------------- work on a thread of its own
class _OnThread(beam.DoFn):
    """A DoFn that runs `work(element, *side inputs)`, which returns that element's outputs as a list, on a
    thread of the DoFn's own (named `thread_name`), one element behind the stages before it: while it works
    on batch k, the stages before it (the split and canonicalisation of batch k+1) go on in the calling
    thread. The work mostly runs outside the interpreter lock (Arrow, numpy), so the two use two cores.
    Outputs keep their order; a bundle's last element's come from finish_bundle."""

    def __init__(self, work: Callable[..., list], thread_name: str):
        self._work, self._thread_name = work, thread_name

    def setup(self):
        self._pool, self._pending = ThreadPoolExecutor(1, thread_name_prefix=self._thread_name), None

    def start_bundle(self):
        self._pending = None

    def process(self, element, *args):
        working = self._pool.submit(self._work, element, *args)
        if self._pending is not None:
            yield from self._pending.result()
        self._pending = working

    def finish_bundle(self):
        pending, self._pending = self._pending, None
        if pending is not None:
            for out in pending.result():
                yield WindowedValue(out, MIN_TIMESTAMP, (GlobalWindow(),))

    def teardown(self):
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=True)


# ------------------------------------------------------------------------- analyse
class _CountTokens(_OnThread):
    """Canonical train batches -> (vocabulary owner, count table) pairs: the batches counted
    (analysis.TokenCounts) on the DoFn's own thread (_OnThread), one table per owner at the bundle's end.
    The combiner after it then merges a few tables per bundle, not one per batch, on the thread that runs
    the stages."""

    def __init__(self, cfg: Config):
        super().__init__(self._count, "count-tokens")
        self._cfg = cfg
        self._counts: TokenCounts | None = None

    def start_bundle(self):
        super().start_bundle()
        self._counts = TokenCounts(self._cfg)

    def _count(self, cols: dict[str, pa.Array]) -> list:
        self._counts.add(cols)
        return []

    def finish_bundle(self):
        yield from super().finish_bundle()  # the bundle's last batch counted
        for pair in self._counts.tables():
            yield WindowedValue(pair, MIN_TIMESTAMP, (GlobalWindow(),))


class _MergeCountTables(beam.CombineFn):
    """Count tables (value, count) -> one, summed by value. Whole tables are merged, compacted once
    the pending rows pass `compact_rows`, so the combiner's work is per batch, not per token."""

    def __init__(self, compact_rows: int = 1 << 20):
        self._compact_rows = compact_rows

    def create_accumulator(self):
        return []

    def add_input(self, acc, table):
        acc.append(table)
        if len(acc) > 1 and sum(t.num_rows for t in acc) > self._compact_rows:
            acc[:] = [merge_count_tables(acc)]
        return acc

    def merge_accumulators(self, accs):
        return [merge_count_tables([t for acc in accs for t in acc])]

    def compact(self, acc):
        return [merge_count_tables(acc)] if len(acc) > 1 else acc

    def extract_output(self, acc):
        return merge_count_tables(acc)


PENDING_SCHEMA = pa.schema([("value", pa.string()), ("day", pa.int64()), ("rows", pa.int64())])


class VocabArrays(NamedTuple):
    """A vocabulary's lifecycle state (recpipe.pipeline.lifecycle.VocabState) as Arrow arrays."""
    values: pa.Array     # string, null for a free slot
    counts: pa.Array     # int64
    last_seen: pa.Array  # int64 days, null when free or unknown
    pending: pa.Table    # PENDING_SCHEMA


def vocab_arrays(state: VocabState) -> VocabArrays:
    pending = pa.Table.from_pylist([{"value": v, "day": d, "rows": r} for v, d, r in state.pending],
                                   schema=PENDING_SCHEMA)
    return VocabArrays(pa.array(state.values, pa.string()), pa.array(state.counts, pa.int64()),
                       pa.array(state.last_seen, pa.int64()), pending)


def previous_state(prev: TransformArtifact, owner: str) -> VocabState:
    """The state a previous artifact holds for one vocabulary (artifacts written before the lifecycle
    have no last-seen days or pending counts)."""
    values = list(prev.vocabularies.get(owner, []))
    counts = list(prev.vocab_counts.get(owner, [])) or [0] * len(values)
    last_seen = list(prev.vocab_last_seen.get(owner, [])) or [None] * len(values)
    pending = [tuple(p) for p in prev.vocab_pending.get(owner, [])]
    return VocabState(values, counts, last_seen, pending, day_number(prev.day) if prev.day else None)


def vocabulary_state(owner: str, counts: pa.Table, cfg: Config, previous: TransformArtifact | None,
                     day: int | None) -> VocabArrays:
    """A vocabulary owner's state after this run's train counts (COUNT_SCHEMA; empty when no train row has
    a value for it). The first day without a window selects vectorised; otherwise the previous artifact's
    state advances by one day (recpipe.pipeline.lifecycle). The state stays Arrow arrays: the artifact's
    assembly takes it as a side input, which a runner sizes object by object when it is Python lists."""
    spec = cfg.sparse_by_name[owner].vocab
    if previous is None and spec.window_days == 1:
        values, kept = select_vocabulary_table(counts, spec.min_count, spec.max_size)
        return VocabArrays(values, kept, pa.array([day] * len(values), pa.int64()), PENDING_SCHEMA.empty_table())
    state = previous_state(previous, owner) if previous is not None else None
    if spec.window_days == 1:  # only values that can enter or are already known need the Python pass
        known = pa.array([v for v in state.values if v is not None] if state else [], pa.string())
        counts = counts.filter(pc.or_(pc.greater_equal(counts.column("count"), spec.min_count),
                                      pc.is_in(counts.column("value"), value_set=known)))
    today = zip(counts.column("value").to_pylist(), counts.column("count").to_pylist())
    return vocab_arrays(advance_vocabulary(state, today, day, spec))


def every_vocabulary(counted: Iterable[tuple[str, VocabArrays]], cfg: Config, previous: TransformArtifact | None,
                     day: int | None) -> dict[str, VocabArrays]:
    """Every vocabulary owner's state, in config order: ComputeVocabularies' for the owners it counted, and
    for an owner no train row has a value for, vocabulary_state of no counts."""
    found = dict(counted)
    return {f.name: found[f.name] if f.name in found else vocabulary_state(f.name, COUNT_SCHEMA.empty_table(), cfg,
                                                                           previous, day)
            for f in cfg.features.sparse if f.vocab is not None}


class ComputeVocabularies(beam.PTransform):
    """Canonical train batches -> (owner feature name, VocabArrays) per vocabulary owner some train row has
    a value for (every_vocabulary adds the others, where the artifact is assembled).

    Each batch is counted (analysis.TokenCounts); the combiner sums whole tables; vocabulary_state
    selects or advances each owner's vocabulary, IDs of kept values never changing.
    """

    def __init__(self, cfg: Config, previous: TransformArtifact | None = None, day: int | None = None):
        super().__init__()
        self._cfg, self._previous, self._day = cfg, previous, day

    def expand(self, train):
        cfg, prev, day = self._cfg, self._previous, self._day
        return (train
                | "CountTables" >> beam.ParDo(_CountTokens(cfg))
                | "SumCounts" >> beam.CombinePerKey(_MergeCountTables())
                | "Select" >> beam.MapTuple(lambda owner, counts: (owner, vocabulary_state(owner, counts, cfg, prev,
                                                                                           day))))


def _dense_stats(cols: dict[str, pa.Array], cfg: Config) -> list[dict]:
    return [batch_dense_stats(cols, cfg)]


class _BatchDenseStats(_OnThread):
    """Canonical batch -> analysis.batch_dense_stats, worked out on the DoFn's own thread (_OnThread); counts
    the bundles that held a batch (`dense_stats_bundles`: how the runner split the step's work)."""

    def __init__(self, cfg: Config):
        super().__init__(functools.partial(_dense_stats, cfg=cfg), "dense-stats")
        self._bundles = Metrics.counter(NAMESPACE, "dense_stats_bundles")
        self._batches = 0

    def start_bundle(self):
        super().start_bundle()
        self._batches = 0

    def process(self, cols: dict[str, pa.Array]):
        self._batches += 1
        yield from super().process(cols)

    def finish_bundle(self):
        yield from super().finish_bundle()
        if self._batches:
            self._bundles.inc()


class ComputeDenseStats(beam.PTransform):
    """Canonical train batches -> {feature: {mean, std, count} or {boundaries}} (one element).

    Each batch gives exact partial statistics (analysis.batch_dense_stats: integer sums of the values and
    of their squares, counts of the values of a bucketized feature on a fixed grid), which add up exactly,
    so the result is the same however a runner splits the batches into bundles and merges them."""

    def __init__(self, cfg: Config, previous: TransformArtifact | None = None):
        super().__init__()
        self._cfg, self._previous = cfg, previous

    def expand(self, train):
        cfg, previous = self._cfg, self._previous
        stats = (train | "BatchStats" >> beam.ParDo(_BatchDenseStats(cfg))
                 | "SumStats" >> beam.CombineGlobally(_MergeDicts(operator.add, functools.partial(dense_stats,
                                                                                                   cfg=cfg))))
        if previous is None:
            return stats
        return stats | "WithPrevious" >> beam.Map(lambda current: merge_dense_stats(previous.dense_stats, current))


# ------------------------------------------------------------------------- artifact + transform
class AssembleArtifact(beam.PTransform):
    """(ComputeVocabularies' output, ComputeDenseStats' output) -> the TransformArtifact (one element), every
    vocabulary owner in it (every_vocabulary)."""

    def __init__(self, cfg: Config, raw_schema: dict[str, str], split: dict, versions: dict, lineage: dict,
                 day: int | None = None, previous: TransformArtifact | None = None):
        super().__init__()
        self._cfg, self._raw, self._split, self._versions, self._lineage = cfg, raw_schema, split, versions, lineage
        self._day, self._previous = day, previous

    def expand(self, inputs):
        vocabs, stats = inputs

        def assemble(_, counted, dense_stats):
            vocab_list = every_vocabulary(counted, self._cfg, self._previous, self._day).items()
            return TransformArtifact(
                config=self._cfg, raw_schema=self._raw,
                vocabularies={o: v.values.to_pylist() for o, v in vocab_list},
                vocab_counts={o: v.counts.to_pylist() for o, v in vocab_list},
                vocab_last_seen={o: v.last_seen.to_pylist() for o, v in vocab_list},
                vocab_pending={o: [list(r.values()) for r in v.pending.to_pylist()] for o, v in vocab_list},
                dense_stats=dense_stats, split=self._split, versions=self._versions, lineage=self._lineage,
                day=day_name(self._day) if self._day is not None else None)

        return (vocabs.pipeline | "Seed" >> beam.Create([None])
                | "Assemble" >> beam.Map(assemble, beam.pvalue.AsList(vocabs), beam.pvalue.AsSingleton(stats)))


def pack_artifact(artifact: TransformArtifact) -> bytes:
    """The artifact as one bytes object, the form the transform stages take it as a side input: a
    runner's side-input cache sizes a bytes object at once, where it walks a vocabulary list string by
    string (measured: ~1M `objsize` calls for 130k vocabulary values on 500k rows)."""
    return pickle.dumps(artifact, protocol=pickle.HIGHEST_PROTOCOL)


class PackArtifact(beam.PTransform):
    """The artifact PCollection -> its packed form (pack_artifact), the side input of _Transform."""

    def expand(self, artifact):
        return artifact | "Pack" >> beam.Map(pack_artifact)


@functools.lru_cache(maxsize=1)
def _batch_transform(packed: bytes):
    """The BatchTransform of a PackArtifact output, built once per process (each split's transform and the eval
    sample's share it; about 60 ms and the vocabularies' memory each)."""
    from recpipe.features.batch_transform import BatchTransform
    return BatchTransform(pickle.loads(packed))


def _framed_record(cols: dict[str, pa.Array], packed: bytes) -> list[tuple[bytes, bytes, bytes]]:
    """A canonical batch's one record, transformed by the PackArtifact output `packed` and framed."""
    from recpipe.features.record_codec import encode_batch, frame_parts
    label = cols[LABEL_KEY]
    out = _batch_transform(packed)({k: v for k, v in cols.items() if k != LABEL_KEY})
    out[LABEL_KEY] = label.to_numpy(zero_copy_only=False).astype(np.float32)
    return [frame_parts(encode_batch(out))]


class _Transform(_OnThread):
    """Canonical batch -> one serialized record of transformed columns (recpipe.features.records), framed
    as a TFRecord (record_codec.frame_parts), made on the DoFn's own thread (_OnThread)."""

    def __init__(self):
        super().__init__(_framed_record, "transform")

    def teardown(self):
        super().teardown()
        _batch_transform.cache_clear()  # the vocabularies go with the last transform of the run


class ApplyTransform(beam.PTransform):
    """Canonical batches -> serialized records, framed for WriteRecords; `packed`: the PackArtifact output
    (one element)."""

    def __init__(self, packed):
        super().__init__()
        self._packed = packed

    def expand(self, batches):
        return batches | beam.ParDo(_Transform(), beam.pvalue.AsSingleton(self._packed))


class _FramedRecordSink(FileBasedSink):
    """Beam's TFRecord sink for records framed before they reach it (record_codec.frame_parts): it only
    writes their parts, so the framing's work is done on the thread that made the record."""

    def write_record(self, file_handle, value: tuple[bytes, ...]) -> None:
        for part in value:
            file_handle.write(part)


class WriteRecords(beam.PTransform):
    """Framed records (ApplyTransform's output) -> uncompressed TFRecord files named as beam.io.WriteToTFRecord
    names them (`prefix`-SSSSS-of-NNNNN`suffix`), the same bytes as it writes."""

    def __init__(self, prefix: str, suffix: str):
        super().__init__()
        self._prefix, self._suffix = prefix, suffix

    def expand(self, records):
        # the coder is never called (_FramedRecordSink.write_record writes the parts as they are)
        return records | beam.io.Write(_FramedRecordSink(self._prefix, beam.coders.BytesCoder(),
                                                         file_name_suffix=self._suffix,
                                                         compression_type=CompressionTypes.UNCOMPRESSED))


# ------------------------------------------------------------------------- accounting
def _count_in(b: RawBatch) -> dict[str, int]:
    return {"in": b.table.num_rows}


def _count_split(cols: dict, split: str, cfg: Config) -> dict[str, int]:
    labels = cols[LABEL_KEY].to_numpy(zero_copy_only=False)
    return {split: len(labels), f"positives.{split}": int(np.count_nonzero(labels > 0.5)),
            **{f"with_value.{split}.{name}": n for name, n in rows_with_value(cols, cfg).items()},
            **{f"dense_sum.{split}.{name}": s for name, s in dense_sums(cols, cfg).items()}}


def _count_dead(table: pa.Table) -> dict[str, int]:
    reasons, counts = np.unique(np.asarray(table.column("reason").to_pylist(), dtype=object), return_counts=True)
    return {f"dead_letter.{r}": int(c) for r, c in zip(reasons, counts)}


def _add_count(a, b):
    """Two counts of one key summed; of two ("min" | "max", x) pairs (a file's first and last timestamp),
    the extreme one."""
    if isinstance(a, (tuple, list)):
        return a[0], (min if a[0] == "min" else max)(a[1], b[1])
    return a + b


class CountRows(beam.PTransform):
    """(read batches, {split: its columns}, dead-letter tables, SplitRows' time_range) -> one JSON file of
    row counts ({"in", "train", "validation", "eval", "positives.<split>", "dead_letter.<reason>",
    "with_value.<split>.<feature>", "dense_sum.<split>.<feature>"}: recpipe.pipeline.anomalies.SplitCounts; and each
    file's ["min", first] and ["max", last] timestamp as "time_first.<file>", "time_last.<file>"), computed
    from the elements themselves: a task a runner retries contributes once, as its output does (counters may
    count it twice). Each element's counts are one dict; one combine merges them key by key."""

    def __init__(self, path: str, cfg: Config):
        super().__init__()
        self._path, self._cfg = path, cfg

    def expand(self, pcolls):
        batches, splits, dead, time_range = pcolls
        path = self._path
        parts = (batches | "In" >> beam.Map(_count_in),
                 *(splits[s] | f"Split[{s}]" >> beam.Map(_count_split, s, self._cfg) for s in SPLITS),
                 dead | "DeadLetter" >> beam.Map(_count_dead),
                 time_range | "TimeRange" >> beam.Map(dict))
        return (parts | "All" >> beam.Flatten() | "Sum" >> beam.CombineGlobally(_MergeDicts(_add_count))
                | "Write" >> beam.Map(lambda counts: fsio.write_json(path, counts)))


# ------------------------------------------------------------------------- repeated rows
class _StageHashes(beam.DoFn):
    """Read batches -> (bucket, file) for each bucket a bundle's rows fell in: the bundle appends its rows'
    (hash, row number) pairs to one file per bucket in `folder`, so a bucket's rows meet on disk. Through
    the runner's shuffle, the DirectRunner held those 16 bytes a row as 94 bytes of peak RSS a row (1,336 MB
    against 868 MB at 5M rows), so memory grew with the log. A retried bundle's files are named by no
    output; they go with the folder."""

    def __init__(self, folder: str, buckets: int):
        self._folder, self._buckets = folder, buckets
        self._files: dict[int, tuple[str, Any]] = {}

    def start_bundle(self):
        self._files, self._tag = {}, uuid.uuid4().hex

    def process(self, b: RawBatch) -> None:
        for bucket, (hashes, positions) in bucketed(_hashes(b), b.positions, self._buckets):
            if bucket not in self._files:
                if not self._files:  # the bundle's first file
                    fsio.makedirs(self._folder)
                path = fsio.join(self._folder, f"{bucket:05d}-{self._tag}.pairs")
                fs, local = fsio.resolve(path)
                self._files[bucket] = (path, fs.open_output_stream(local))
            self._files[bucket][1].write(pairs_bytes(hashes, positions))

    def finish_bundle(self):
        for bucket, (path, stream) in sorted(self._files.items()):
            stream.close()
            yield WindowedValue((bucket, path), MIN_TIMESTAMP, (GlobalWindow(),))
        self._files = {}

    def teardown(self):  # a failed bundle's files, named by no output
        for _, stream in self._files.values():
            stream.close()


def _bucket_repeats(paths: Iterable[str], file_starts: np.ndarray) -> Repeats:
    """One bucket's repeats, from its staged files."""
    hashes, positions = pairs_from_bytes([fsio.read_bytes(p) for p in sorted(paths)])
    return find_repeats(hashes, positions, file_starts)


def _hashes(b: RawBatch) -> np.ndarray:
    return b.hashes if b.hashes is not None else row_hashes(b.table)


def _merge_repeats(found: Iterable[Repeats]) -> Repeats:
    out = Repeats()
    for r in found:
        out = out.merge(r)
    return out


class FindRepeatedRows(beam.PTransform):
    """Read batches -> one JSON file (recpipe.pipeline.repeats.Repeats.to_json) of the rows equal in every column
    read to an earlier row: each row hashed once (by the read: ReadClickLogs' hash_rows), the hashes
    bucketed so that equal rows meet in one bucket, staged as files in `staging` (the runner shuffles only
    their names), each bucket sorted on its own (at most about BUCKET_ROWS rows on one worker)."""

    def __init__(self, path: str, staging: str, file_starts: list[int], total_rows: int):
        super().__init__()
        self._path, self._staging, self._starts = path, staging, np.asarray(file_starts, np.int64)
        self._buckets = max(16, -(-total_rows // BUCKET_ROWS))

    def expand(self, batches):
        path, starts = self._path, self._starts
        return (batches
                | "Stage" >> beam.ParDo(_StageHashes(self._staging, self._buckets))
                | "PerBucket" >> beam.GroupByKey()
                | "Found" >> beam.MapTuple(lambda _, paths: _bucket_repeats(paths, starts))
                | "All" >> beam.CombineGlobally(_merge_repeats)
                | "Write" >> beam.Map(lambda r: fsio.write_json(path, r.to_json())))
