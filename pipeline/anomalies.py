"""What a preprocess run should not publish without a word: features the train split gives a model nothing
to learn from; features the splits (or this run and the previous day's) disagree on, as TFX's data
validation compares a statistics set with the previous span's (skew and drift); input files whose
timestamps are in another unit; a large share of rows dead-lettered; rows read twice.

Pure logic over the job's own figures (SplitCounts, each file's timestamp range, the dead-letter counts)
and the transform artifact; the caller prints the warnings or fails the run (preprocess.on_anomaly).
"""
from __future__ import annotations

import bisect
import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from recpipe.features.artifact import TransformArtifact
from recpipe.features.canonical import DENSE_SUM_SCALE
from recpipe.features.config import Config, SparseFeature
from recpipe.common.days import day_number
from recpipe.pipeline.repeats import Repeats
from recpipe.pipeline.sources import InputFile, partition_day

__all__ = ["SplitCounts", "feature_warnings", "timestamp_warnings", "dead_letter_warnings", "copied_file_warnings",
           "repeated_row_warnings", "volume_warnings"]

DAY = 86_400
YEAR = 365.2425 * DAY
# A file's timestamps may lie this far from its dt= partition's day (events logged late, backfills) ...
PARTITION_SLACK = 366 * DAY
# ... and, in no partition, before this (later is a unit mistake or a placeholder: Hive's 9999-12-31)
LATEST = (2200 - 1970) * YEAR
EARLIEST_GUESS = (1990 - 1970) * YEAR  # a unit guess must land after this, too
UNITS = ((1e3, "milliseconds"), (1e6, "microseconds"), (1e9, "nanoseconds"))

# A moved share or mean is named only when it also lies this many standard errors out, so a split of a few
# rows (sampling noise alone) is not.
_STANDARD_ERRORS = 4.0


@dataclass(frozen=True)
class SplitCounts:
    """What one run's row-counting branch saw per split: its rows and those labelled 1, per column-fed feature
    the rows holding a value, and per dense feature with moments the sum of those values as its statistics
    see them (recpipe.features.canonical.dense_sums)."""
    rows: dict[str, int]
    with_value: dict[str, dict[str, int]] = field(default_factory=dict)
    dense_sums: dict[str, dict[str, int]] = field(default_factory=dict)
    positives: dict[str, int] = field(default_factory=dict)  # rows labelled 1

    @classmethod
    def from_row_counts(cls, row_counts: dict[str, Any]) -> "SplitCounts":
        """From a published artifact's row_counts (those written before a figure was counted lack it)."""
        rows = {s: int(row_counts.get(s, 0)) for s in ("train", "validation", "eval")}
        return cls(rows, row_counts.get("with_value", {}), row_counts.get("dense_sums", {}),
                   row_counts.get("positives", {}))

    def share(self, split: str, name: str) -> Optional[float]:
        """The share of the split's rows holding a value for the feature (None: not counted, or no rows)."""
        n, k = self.rows.get(split, 0), self.with_value.get(split, {}).get(name)
        return k / n if n and k is not None else None

    def mean(self, split: str, name: str) -> Optional[float]:
        """The mean of a dense feature's values in the split's rows that hold one (None: none do)."""
        n, s = self.with_value.get(split, {}).get(name), self.dense_sums.get(split, {}).get(name)
        return s / DENSE_SUM_SCALE / n if n and s is not None else None


def _moved(a: float, n_a: int, b: float, n_b: int, limit: float) -> bool:
    """Whether two shares of rows differ by more than limit and by more than sampling noise would."""
    se = math.sqrt(a * (1 - a) / n_a + b * (1 - b) / n_b)
    return abs(a - b) > limit and abs(a - b) > _STANDARD_ERRORS * se


def _nothing_to_learn(cfg: Config, artifact: TransformArtifact, now: SplitCounts) -> list[str]:
    """No value in any train row (null or empty in the log: a broken join or a renamed field upstream, which
    the job itself cannot tell from a feature that is rare), said louder when the eval split has values for
    it; dense features of one value in every train row; features with values in train rows but none in the
    validation or eval split (logged no longer: the model is judged without what it learnt)."""
    train, n_train = now.with_value.get("train", {}), now.rows["train"]
    out = []
    for f in [*cfg.column_sparse, *cfg.features.dense]:
        if n_train == 0 or f.name not in train:
            continue
        where = f"feature {f.name!r} (column {f.column!r})"
        if train[f.name] == 0:
            elsewhere = {s: n for s in ("validation", "eval") if (n := now.with_value.get(s, {}).get(f.name, 0))}
            also = "".join(f"; yet {n:,} of the {now.rows[s]:,} {s} rows have one, so training and {s} see "
                           f"different data" for s, n in elsewhere.items())
            out.append(f"{where} has no value in any of the {n_train:,} train rows: a model cannot learn "
                       f"from it (is the column null or empty upstream?){also}")
            continue
        for split in ("validation", "eval"):
            if now.rows[split] and now.with_value.get(split, {}).get(f.name) == 0:
                out.append(f"{where} has values in {train[f.name]:,} of the {n_train:,} train rows but in "
                           f"none of the {now.rows[split]:,} {split} rows: the model is judged without it "
                           f"(is it no longer logged?)")
        stats = artifact.dense_stats.get(f.name, {})
        if stats.get("std") == 0 and "mean" in stats:
            log1p = " after log1p" if f.transform == "log_zscore" else ""
            out.append(f"{where} has one value in every train row ({stats['mean']:g}{log1p}, missing values "
                       f"filled with {f.fill:g}): it carries no signal")
    return out


def _own_single_valued_vocabularies(cfg: Config) -> list[SparseFeature]:
    """The single-valued, column-fed features with a vocabulary no other feature shares: those whose
    vocabulary counts are their own train rows' values, one per row."""
    shared = {f.share_embedding_with for f in cfg.features.sparse if f.share_embedding_with}
    return [f for f in cfg.column_sparse if f.vocab is not None and not f.multivalent and f.name not in shared]


# A vocabulary feature is named when fewer than this share of its train rows hold a value that recurs (kept in
# the vocabulary with a count of 2 or more), over at least this many train rows with a value.
MIN_RECURRING_SHARE, MIN_RECURRING_ROWS = 0.05, 1_000


def _values_never_recur(cfg: Config, artifact: TransformArtifact, now: SplitCounts) -> list[str]:
    """A single-valued feature with its own vocabulary whose values almost never recur in the train rows: a
    row, request or event ID, or a timestamp, read as an ID. The model learns nothing from it (each value's
    row is trained once, or the value is left out as rare) and at serving every value is new (OOV); with
    min_count 1 its table also grows by a row per example. Counted on this run's rows, so not on a day run
    (whose counts carry the earlier days)."""
    out = []
    for f in _own_single_valued_vocabularies(cfg):
        counts, n = artifact.vocab_counts.get(f.name), now.with_value.get("train", {}).get(f.name, 0)
        if counts is None or n < MIN_RECURRING_ROWS:
            continue
        recurring = sum(c for c in counts if c is not None and c >= 2)
        if recurring < MIN_RECURRING_SHARE * n:
            out.append(f"feature {f.name!r} (column {f.column!r}): only {recurring / n:.1%} of its {n:,} train rows "
                       f"with a value hold one that recurs in train and is kept (vocab.min_count "
                       f"{f.vocab.min_count}; {len(counts):,} values kept): is it a row, request or event ID, or a "
                       f"timestamp? The model cannot learn from values that never come back, and at serving they "
                       f"are all new (OOV)")
    return out


# A full vocabulary (max_size) is named when more than this share of its train rows with a value map to OOV.
MAX_CUT_SHARE = 0.2


def _vocabulary_cut(cfg: Config, artifact: TransformArtifact, now: SplitCounts) -> list[str]:
    """A single-valued feature whose vocabulary max_size cut values min_count would have kept, so many that a
    large share of its train rows map to the few OOV buckets, where the model cannot tell them apart (TFT's
    top_k does this in silence). Counted on this run's rows, so not on a day run."""
    out = []
    for f in _own_single_valued_vocabularies(cfg):
        values, counts = artifact.vocabularies.get(f.name), artifact.vocab_counts.get(f.name)
        n, rows = now.with_value.get("train", {}).get(f.name, 0), now.rows["train"]
        if f.vocab.max_size is None or not counts or values is None or len(values) < f.vocab.max_size or not n:
            continue
        least = min(counts)
        missing_kept = "" in values  # rows without a value ("") are OOV for that reason when "" is not kept
        oov = rows - sum(counts) - (0 if missing_kept else rows - n)
        if least <= f.vocab.min_count or oov <= MAX_CUT_SHARE * n:
            continue
        out.append(f"feature {f.name!r} (column {f.column!r}): vocab.max_size ({f.vocab.max_size:,}) is full and its "
                   f"least frequent value kept is in {least:,} train rows, so values in up to {least:,} rows, over "
                   f"vocab.min_count ({f.vocab.min_count}), were cut: {oov / n:.1%} of the {n:,} train rows with a "
                   f"value map to its {f.vocab.oov_buckets} OOV bucket(s), where the model cannot tell them apart; "
                   f"raise max_size, or hash the feature (hash_buckets)")
    return out


def _shares_moved(cfg: Config, now: SplitCounts, previous: Optional[SplitCounts], previous_name: str) -> list[str]:
    """A feature's share of rows with a value that moves by more than preprocess.max_presence_change: from
    the train split to the validation or eval split (skew: the model is judged on rows unlike those it
    learnt from, e.g. a join that broke part way through the log), or from the previous run's train split to
    this one's (drift). A split with no value at all is _nothing_to_learn's."""
    out = []
    pairs = [(split, "the", now, "the") for split in ("validation", "eval")]  # (split, whose, train of, whose)
    if previous is not None:
        pairs.append(("train", "this run's", previous, previous_name))
    for f in [*cfg.column_sparse, *cfg.features.dense]:
        limit, key = cfg.preprocess.limit(f.name, "max_presence_change")
        for split, own, base, base_name in pairs:
            a, b = base.share("train", f.name), now.share(split, f.name)
            if a is None or b is None or a == 0 or b == 0:
                continue
            n_a, n_b = base.rows["train"], now.rows[split]
            if _moved(a, n_a, b, n_b, limit):
                out.append(f"feature {f.name!r} (column {f.column!r}) has a value in {b:.1%} of {own} {n_b:,} {split} "
                           f"rows against {a:.1%} of {base_name} {n_a:,} train rows, a change beyond "
                           f"{key} ({limit:g}): is it filled "
                           f"{'less' if b < a else 'more'} upstream now?")
    return out


def _means_moved(cfg: Config, artifact: TransformArtifact, now: SplitCounts,
                 previous: Optional[tuple[TransformArtifact, SplitCounts]], previous_name: str) -> list[str]:
    """A dense feature whose values in the validation or eval rows (skew), or in this day's train rows against
    the previous day's (drift), average more than preprocess.max_mean_shift standard deviations apart (the
    std the model normalises it with; rows missing the value left out, _shares_moved's concern): a unit or
    scale changed upstream (milliseconds for seconds, cents for euros) gives a model inputs far outside what
    it learnt from, with no NaN or error anywhere."""
    out = []
    for d in cfg.features.dense:
        limit, key = cfg.preprocess.limit(d.name, "max_mean_shift")
        std = artifact.dense_stats.get(d.name, {}).get("std")
        train_mean = now.mean("train", d.name)
        if not std or train_mean is None:
            continue  # bucketized, of one value or of none (_nothing_to_learn names them)
        compared = [(s, f"the {now.rows[s]:,} {s} rows", train_mean, std, f"the {now.rows['train']:,} train rows")
                    for s in ("validation", "eval")]
        if previous is not None:
            before, counts = previous
            old_std, old_mean = before.dense_stats.get(d.name, {}).get("std"), counts.mean("train", d.name)
            if old_std and old_mean is not None:
                compared.append(("train", f"this run's {now.rows['train']:,} train rows", old_mean, old_std,
                                 f"{previous_name} {counts.rows['train']:,} train rows"))
        log1p = " after log1p" if d.transform == "log_zscore" else ""
        for split, what, mean, sd, against in compared:
            m, n = now.mean(split, d.name), now.with_value.get(split, {}).get(d.name, 0)
            if m is None:
                continue
            shift = (m - mean) / sd
            if abs(shift) > limit and abs(shift) > _STANDARD_ERRORS / math.sqrt(n):
                out.append(f"dense feature {d.name!r} (column {d.column!r}): its values in {what} average {m:g}"
                           f"{log1p}, {shift:+.1f} standard deviations ({sd:g}) from {against}' {mean:g}, beyond "
                           f"{key} ({limit:g}): has its unit or scale changed upstream?")
    return out


_ONE_CLASS = {"train": "a model cannot learn to tell the two apart",
              "validation": "AUC is undefined on it, so early stopping cannot choose a checkpoint (every one "
                            "scores NaN and the last is kept)",
              "eval": "AUC is undefined on it, so the model cannot be judged (recpipe evaluate reports it as null)"}


def _one_label_class(cfg: Config, now: SplitCounts) -> list[str]:
    """A ranking split whose rows all have one label (a label column broken upstream, a filter keeping only
    clicks, a split too small for the click rate). Retrieval logs hold clicks only, by design."""
    if cfg.model.task != "ranking":
        return []
    out = []
    for split, why in _ONE_CLASS.items():
        n, positives = now.rows.get(split, 0), now.positives.get(split)
        if n and positives in (0, n):
            out.append(f"every one of the {n:,} {split} rows has label {int(positives > 0)} (column "
                       f"{cfg.label.column!r}): {why}")
    return out


def feature_warnings(cfg: Config, artifact: TransformArtifact, now: SplitCounts,
                     previous: Optional[TransformArtifact] = None) -> list[str]:
    """Every anomaly of this run, each naming its feature and column; `previous`: the transform a day's run
    extends (--previous-transform), whose train split this run's is compared with."""
    before = SplitCounts.from_row_counts(previous.row_counts) if previous is not None else None
    name = f"the previous run's ({previous.day})" if previous is not None and previous.day else "the previous run's"
    return [*_one_label_class(cfg, now), *_nothing_to_learn(cfg, artifact, now),
            *(_values_never_recur(cfg, artifact, now) if previous is None else []),
            *(_vocabulary_cut(cfg, artifact, now) if previous is None else []),
            *_shares_moved(cfg, now, before, name),
            *_means_moved(cfg, artifact, now, (previous, before) if previous is not None else None, name)]


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S") \
        if -62135596800 <= ts < 253402300800 else f"the year {1970 + ts / YEAR:,.0f}"


def timestamp_warnings(ranges: dict[str, tuple[float, float]], column: Optional[str]) -> list[str]:
    """Input files whose timestamps (in seconds) lie more than a year from the day of their dt= partition,
    or, in no partition, after 2200: milliseconds (or micro-, nanoseconds) in an integer column read as
    seconds, a placeholder date, a clock gone wrong. Each row goes to the split its timestamp says, so such
    rows land in the wrong split (the eval split is the latest) with no error anywhere; named with the file,
    its range and the unit that would fit. `ranges`: each file's first and last timestamp of its good rows."""
    out = []
    for path, (lo, hi) in sorted(ranges.items()):
        day = partition_day([path])
        if day is not None:
            start = day_number(day) * DAY
            low, high, where = start - PARTITION_SLACK, start + DAY + PARTITION_SLACK, f"its partition dt={day}"
        else:
            low, high, where = -math.inf, LATEST, "2200 (no dt= partition)"
        if low <= lo and hi <= high:
            continue
        guess = next((f"are they {unit} read as seconds? (÷ {f:g} they run from {_when(lo / f)[:10]} to "
                      f"{_when(hi / f)[:10]})" for f, unit in UNITS
                      if max(low, EARLIEST_GUESS) <= lo / f and hi / f <= high), None)
        away = f"more than a year from {where}" if day is not None else f"after {where}"
        out.append(f"{path}: its timestamps (column {column!r}) run from {_when(lo)} to {_when(hi)}, {away}: "
                   f"{guess or 'a placeholder value or a clock gone wrong?'} Each row goes to the split its "
                   f"timestamp says, so these land in the wrong one (the eval split is the latest)")
    return out


def dead_letter_warnings(rows_in: int, dead_letter: dict[str, int], limit: float, where: str) -> list[str]:
    """A run that dead-letters more than `limit` of its rows (preprocess.max_dead_letter_fraction): each row
    is kept and counted, but a share that large says something upstream broke (a column's format, a
    writer), and the model learns from what is left."""
    dead = sum(dead_letter.values())
    if not rows_in or dead / rows_in <= limit:
        return []
    by_count = sorted(dead_letter.items(), key=lambda kv: (-kv[1], kv[0]))
    reasons = ", ".join(f"{reason} {n:,}" for reason, n in by_count)
    return [f"{dead:,} of the {rows_in:,} rows read ({dead / rows_in:.1%}) were dead-lettered, over "
            f"preprocess.max_dead_letter_fraction ({limit:g}): {reasons}; each row's file, row and field are "
            f"in {where}"]


def copied_file_warnings(groups: list[list[InputFile]]) -> list[str]:
    """Input files that hold the same bytes (recpipe.pipeline.sources.same_files): every row of such a file is read
    once per copy, so the model weighs it that many times and, in a time split, the same rows may sit in
    train and in eval."""
    out = []
    for files in groups:
        named = ", ".join(f.path for f in files[:-1]) + f" and {files[-1].path}"
        out.append(f"{named} hold the same bytes ({files[0].num_rows:,} rows each): a file written {len(files)} "
                   f"times upstream (a retried task, a re-run backfill beside the first run's output)? Each of its "
                   f"rows is read {len(files)} times; remove the copies")
    return out


def _row_name(inputs: list[InputFile], position: int) -> str:
    """A global row number (files in path order) as its file and row within it."""
    f = inputs[bisect.bisect_right([i.first_row for i in inputs], position) - 1]
    return f"{f.path} row {position - f.first_row}"


def repeated_row_warnings(repeats: Repeats, inputs: list[InputFile], copied: list[list[InputFile]],
                          limit: float) -> list[str]:
    """Rows equal in every column read to an earlier row (recpipe.pipeline.repeats). A file whose every row
    repeats rows of other files is named on its own (the same rows written again as another file: a re-run
    beside the first, by another writer or layout, which the same-bytes check at launch cannot see; a copy
    that check named is not named again); the other repeats when they are more than `limit`
    (preprocess.max_repeated_row_fraction) of the rows read: a join that fanned out, rows appended twice."""
    rows = sum(f.num_rows for f in inputs)
    same_bytes = {f.path: {g.path for g in group} for group in copied for f in group}
    from_files: dict[int, dict[int, int]] = {}
    for (first, copy), n in repeats.pairs.items():
        if first != copy:
            from_files.setdefault(copy, {})[first] = n
    out, explained = [], set()
    for copy, sources in sorted(from_files.items()):
        f = inputs[copy]
        if f.num_rows < 2 or sum(sources.values()) != f.num_rows:
            continue
        explained |= {(first, copy) for first in sources}
        if all(inputs[first].path in same_bytes.get(f.path, ()) for first in sources):
            continue  # named at launch
        named = " or ".join(f"{inputs[i].path} ({n:,})" if len(sources) > 1 else inputs[i].path
                            for i, n in sorted(sources.items()))
        out.append(f"{f.path}: each of its {f.num_rows:,} rows repeats a row of {named} in every column read "
                   f"(in other bytes: another order, layout or writer): were its rows written again as another file "
                   f"upstream (a re-run's output beside the first run's)? Each is read twice; remove the copies")
    rest = {pair: n for pair, n in repeats.pairs.items() if pair not in explained}
    total = sum(rest.values())
    if not rows or total <= limit * rows:
        return out
    biggest = sorted(rest.items(), key=lambda kv: (-kv[1], kv[0]))
    where = "; ".join((f"{n:,} within {inputs[a].path}" if a == b else
                       f"{n:,} in {inputs[b].path} of rows in {inputs[a].path}") for (a, b), n in biggest[:3])
    more = f"; {len(biggest) - 3} more pairs of files" if len(biggest) > 3 else ""
    repeat, first = min(e for pair, _ in biggest for e in repeats.examples.get(pair, []))
    example = f"e.g. {_row_name(inputs, repeat)} repeats {_row_name(inputs, first)}"
    out.append(f"{total:,} of the {rows:,} rows read ({total / rows:.1%}) repeat an earlier row in every column read, "
               f"over preprocess.max_repeated_row_fraction ({limit:g}): {where}{more} ({example}): did a join "
               f"upstream fan out (a key that is not unique), or were rows appended twice? Each repeat is trained "
               f"on as a row of its own, and in a time split a repeat of an eval row may sit in train too")
    return out


def volume_warnings(cfg: Config, rows: int, days: list[str], previous: Optional[TransformArtifact]) -> list[str]:
    """A day's run that reads far fewer or far more rows per dt= partition day than the run it extends
    (TFX's num_examples drift comparator): a partition only partly written upstream, rows dropped before
    the log, or rows in two files. A run in no partition counts as one day."""
    if previous is None or not previous.row_counts.get("in"):
        return []
    before_days = previous.row_counts.get("partition_days") or 1
    ratio = (rows / max(len(days), 1)) / (previous.row_counts["in"] / before_days)
    least, most = cfg.preprocess.min_rows_vs_previous, cfg.preprocess.max_rows_vs_previous
    if least <= ratio <= most:
        return []
    span = "no dt= partition" if not days else f"dt={days[0]}" if len(days) == 1 else \
        f"{len(days)} days, dt={days[0]} to dt={days[-1]}"
    per = f"{previous.row_counts['in']:,} rows" if before_days == 1 else \
        f"{previous.row_counts['in'] / before_days:,.0f} rows a day"
    said = (f"this run reads {rows:,} rows ({span}) against {per} in the previous run"
            f"{f' ({previous.day})' if previous.day else ''}")
    if ratio < least:
        return [f"{said}: {ratio:.2f} of them, below preprocess.min_rows_vs_previous ({least:g}): is a partition "
                f"only partly written upstream (files missing), or were rows dropped before the log? The model "
                f"learns from what is there"]
    return [f"{said}: {ratio:.2f} times them, above preprocess.max_rows_vs_previous ({most:g}): are rows in two "
            f"files (a re-run's output beside the first run's), or is it a day of that much more traffic?"]
