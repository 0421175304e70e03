"""`recpipe init`: a starting feature spec inferred from a sample of a Parquet click log, the way TFDV infers a
schema: the time column, the label (a 0/1 column) and its positive rate, and for every other column its type,
null share and cardinality -> a vocabulary (with a min_count) or hashing (with buckets), a multivalent list, or a
dense feature with its normalisation. Every guess is written down beside its figures, and the ones a person
should check are listed at the top of the YAML and in the summary.

The profile of the sample (profile_table), the guesses (infer) and the YAML (render_config) are pure;
read_sample does the I/O.
"""
from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from recpipe.common.errors import RecpipeError
from recpipe.common.typed_yaml import FLOAT_STRING_PATTERN
from recpipe.features.canonical import plain_columns, raw_kind
from recpipe.features.config import Config, parse_config
from recpipe.pipeline.sources import list_input_files, open_parquet

__all__ = ["ColumnProfile", "Guess", "Inference", "InferError", "read_sample", "profile_table", "infer",
           "render_config", "summary_lines"]

_TIME_NAME = re.compile(r"(^|_)(ts|time|timestamp|datetime|date|event_time|epoch|created_at)$", re.I)
_LABEL_NAMES = ("label", "click", "clicked", "clicks", "is_click", "target", "y", "converted", "conversion",
                "purchase", "purchased", "bought", "liked")
_ID_NAME = re.compile(r"(^id$|_id$|Id$|_key$|_code$|^sku$|_sku$|_hash$)")
_COLUMN_OK = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\-/]*")  # what a SavedModel input name may be
SEPARATOR = "|"
VOCAB_MAX = 100_000        # more distinct values than this in the sample: hashed
SMALL_INT_CATEGORIES = 32  # an integer column with at most this many values reads as a category


class InferError(RecpipeError, ValueError):
    """The sample cannot give a starting config (no rows, no 0/1 column for the label, an unknown column)."""


@dataclass(frozen=True)
class ColumnProfile:
    """What the sample shows of one column.

    Attributes:
        name: the column.
        arrow_type: its Arrow type as logged.
        kind: how recpipe reads it: "int", "uint64", "float", "string", "list<int>", "list<string>", "null",
            or None when no feature can read it.
        rows: the sample's rows.
        null_fraction: the share of rows that are null (or empty strings).
        distinct: distinct non-null values (of the list items, for lists).
        singletons: distinct values seen in one row only.
        is_time: the logged type is a timestamp or a date.
        zero_one: every non-null value is 0 or 1 (numbers and booleans).
        positive_rate: the share of 1s among non-null values, when zero_one.
        minimum: the smallest value (numbers).
        maximum: the largest value (numbers).
        median: the median (numbers).
        separated: the share of non-null strings holding the list separator "|".
        numeric_strings: the share of non-null strings that parse as numbers.
        mean_items: the mean number of items per row (lists and separated strings).
    """
    name: str
    arrow_type: str
    kind: Optional[str]
    rows: int
    null_fraction: float
    distinct: int
    singletons: int = 0
    is_time: bool = False
    zero_one: bool = False
    positive_rate: Optional[float] = None
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    median: Optional[float] = None
    separated: float = 0.0
    numeric_strings: float = 0.0
    mean_items: Optional[float] = None


@dataclass(frozen=True)
class Guess:
    """What `init` makes of one column.

    Attributes:
        column: the column.
        role: "timestamp", "label", "sparse", "dense" or "skip".
        spec: the feature's entry in features.sparse or features.dense (empty for the other roles).
        why: the figures the guess rests on, written beside it in the YAML.
        check: why a person should look at this guess ("" when the figures leave no doubt).
    """
    column: str
    role: str
    spec: dict = field(default_factory=dict)
    why: str = ""
    check: str = ""


@dataclass(frozen=True)
class Inference:
    """The starting config and how it was reached.

    Attributes:
        guesses: one per column of the sample, in the log's column order.
        rows: rows in the sample.
        files: Parquet files the log has.
        sampled_files: files the sample was read from.
        config: the config as plain data (what the YAML holds), valid for parse_config.
    """
    guesses: list[Guess]
    rows: int
    files: int
    sampled_files: int
    config: dict

    def typed(self) -> Config:
        """The config, parsed and validated.

        Returns:
            The typed Config.

        Raises:
            ConfigError: never for a config infer() wrote; a bug otherwise.
        """
        return parse_config(self.config)

    def checks(self) -> list[Guess]:
        """The guesses a person should look at.

        Returns:
            The guesses whose `check` is not empty.
        """
        return [g for g in self.guesses if g.check]


def read_sample(input_spec: str, max_rows: int = 200_000) -> tuple[pa.Table, int, int]:
    """Read up to `max_rows` rows of a log, from its files in order, with the columns every file has.

    Args:
        input_spec: a folder (searched for dt=YYYY-MM-DD/ partitions), a glob, or one Parquet file.
        max_rows: rows to read at the most.

    Returns:
        (the sample, the number of files in the log, the number the sample was read from).

    Raises:
        InputError: the input does not exist or holds no Parquet file.
        InferError: the files hold no rows.
    """
    files = list_input_files(input_spec)
    tables, rows, opened = [], 0, 0
    for path in files:
        opened += 1
        for batch in open_parquet(path).iter_batches(batch_size=min(65_536, max_rows - rows)):
            tables.append(pa.Table.from_batches([batch]))
            rows += batch.num_rows
            if rows >= max_rows:
                break
        if rows >= max_rows:
            break
    if not rows:
        raise InferError(f"{input_spec}: the log's {len(files)} file(s) hold no rows")
    common = [n for n in tables[0].column_names if all(n in t.column_names for t in tables)]
    table = pa.concat_tables([t.select(common) for t in tables], promote_options="permissive")
    return table, len(files), opened


def _numbers(column: pa.ChunkedArray) -> np.ndarray:
    values = pc.drop_null(column).to_numpy(zero_copy_only=False)
    return values.astype(np.float64) if values.dtype != np.float64 else values


def profile_table(table: pa.Table) -> list[ColumnProfile]:
    """Profile every column of a sample.

    Args:
        table: the sample, as logged (timestamps, dictionaries and binary strings are read as recpipe reads them).

    Returns:
        One ColumnProfile per column, in the table's order.
    """
    plain = plain_columns(table)
    out = []
    for logged, column in zip(table.schema, plain.columns):
        name, rows = logged.name, len(column)
        kind = raw_kind(logged.type)
        is_time = pa.types.is_timestamp(logged.type) or pa.types.is_date(logged.type)
        if pa.types.is_boolean(column.type):
            column = pc.cast(column, pa.int8())
        nulls = column.null_count
        info: dict = {}
        if kind in ("int", "uint64", "float"):
            values = _numbers(column)
            finite = values[np.isfinite(values)]
            uniques, counts = np.unique(finite, return_counts=True)
            info.update(distinct=len(uniques), singletons=int((counts == 1).sum()))
            if len(finite):
                info.update(minimum=float(finite.min()), maximum=float(finite.max()), median=float(np.median(finite)))
                if set(uniques.tolist()) <= {0.0, 1.0}:
                    info.update(zero_one=True, positive_rate=float(finite.mean()))
        elif kind == "string":
            values = pc.drop_null(column)
            empty = int(pc.sum(pc.equal(values, "")).as_py() or 0)
            nulls += empty
            values = values.filter(pc.not_equal(values, ""))
            counts = pc.value_counts(values)
            n = max(len(values), 1)
            separated = pc.sum(pc.match_substring(values, SEPARATOR)).as_py() or 0
            numeric = pc.sum(pc.match_substring_regex(values, FLOAT_STRING_PATTERN)).as_py() or 0
            info.update(distinct=len(counts), singletons=int(pc.sum(pc.equal(counts.field("counts"), 1)).as_py() or 0),
                        separated=separated / n, numeric_strings=numeric / n)
            if separated / n >= 0.5:
                items = pc.list_flatten(pc.split_pattern(values, SEPARATOR))
                items = items.filter(pc.not_equal(items, ""))
                item_counts = pc.value_counts(items)
                info.update(distinct=len(item_counts), mean_items=len(items) / n,
                            singletons=int(pc.sum(pc.equal(item_counts.field("counts"), 1)).as_py() or 0))
        elif kind and kind.startswith("list<"):
            values = pc.drop_null(column)
            items = pc.drop_null(pc.list_flatten(values))
            counts = pc.value_counts(items)
            info.update(distinct=len(counts), mean_items=len(items) / max(len(values), 1),
                        singletons=int(pc.sum(pc.equal(counts.field("counts"), 1)).as_py() or 0))
        else:
            info.update(distinct=0)
        out.append(ColumnProfile(name=name, arrow_type=_type_name(logged.type), kind=kind, rows=rows,
                                 null_fraction=nulls / rows if rows else 1.0, is_time=is_time, **info))
    return out


def _feature_name(column: str, taken: set[str]) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", column)
    name = name if re.match(r"[A-Za-z]", name) else f"f_{name}"
    base, i = name, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _embedding_dim(distinct: int) -> int:
    """About 6 x the fourth root of the cardinality (the rule of thumb TensorFlow's feature-column guide
    gives), in steps of 8 from 8 to 64."""
    return int(min(64, max(8, 8 * round(6 * max(distinct, 1) ** 0.25 / 8))))


def _sparse(p: ColumnProfile, name: str, multivalent: bool) -> tuple[dict, str]:
    spec: dict = {"name": name, "column": p.name}
    if multivalent:
        spec["multivalent"] = True
        if p.kind == "string":
            spec["separator"] = SEPARATOR
    repeats = p.distinct - p.singletons
    if p.distinct <= VOCAB_MAX and repeats > 0:
        min_count = 2 if p.singletons > p.distinct / 2 else 1
        spec["vocab"] = {"min_count": min_count, "oov_buckets": 1 if p.distinct <= 1_000 else 4}
        how = f"vocabulary, min_count {min_count}" + (" (most values seen once)" if min_count == 2 else "")
    else:
        buckets = 2 ** max(10, min(22, math.ceil(math.log2(max(2 * p.distinct, 2)))))
        spec["hash_buckets"] = buckets
        how = f"hashed into {buckets:,} buckets" + (" (no value repeats in the sample)" if not repeats else "")
    spec["embedding_dim"] = _embedding_dim(p.distinct)
    return spec, how


def _dense(p: ColumnProfile, name: str) -> tuple[dict, str]:
    skewed = (p.minimum is not None and p.minimum >= 0 and p.maximum is not None and p.median is not None
              and p.maximum > 100 * max(p.median, 1.0))
    transform = "log_zscore" if skewed else "zscore"
    return ({"name": name, "column": p.name, "transform": transform, "fill": 0.0},
            f"dense, {transform}" + (" (non-negative, long tail)" if skewed else ""))


def _type_name(tp: pa.DataType) -> str:
    if pa.types.is_dictionary(tp):
        return f"dictionary<{_type_name(tp.value_type)}>"
    if pa.types.is_list(tp) or pa.types.is_large_list(tp) or pa.types.is_fixed_size_list(tp):
        return f"list<{_type_name(tp.value_type)}>"
    return str(tp)


def _figures(p: ColumnProfile) -> str:
    text = f"{p.arrow_type}, {p.null_fraction:.1%} null"
    if p.is_time and p.minimum is not None:
        first, last = (dt.datetime.fromtimestamp(v, dt.timezone.utc).strftime("%Y-%m-%d %H:%M")
                       for v in (p.minimum, p.maximum))
        return f"{text}, {first} to {last} UTC"
    text += f", {p.distinct:,} distinct"
    if p.mean_items is not None:
        text += f", {p.mean_items:.1f} items a row"
    if p.minimum is not None and not p.zero_one:
        text += f", {p.minimum:g} to {p.maximum:g}, median {p.median:g}"
    return text


def _label_score(p: ColumnProfile) -> int:
    lower = p.name.lower()
    return 2 if lower in _LABEL_NAMES else 1 if lower.startswith(("is_", "has_", "did_")) else 0


def _pick_label(profiles: list[ColumnProfile], label: Optional[str]) -> tuple[ColumnProfile, str]:
    if label is not None:
        found = [p for p in profiles if p.name == label]
        if not found:
            raise InferError(f"--label {label!r}: no such column (the log has: {', '.join(p.name for p in profiles)})")
        if not found[0].zero_one:
            raise InferError(f"--label {label!r}: the label must hold 0 and 1 only; the sample has "
                             f"{found[0].distinct:,} distinct values ({found[0].arrow_type})")
        return found[0], ""
    candidates = [p for p in profiles if p.zero_one and p.kind in ("int", "uint64", "float") and not p.is_time]
    if not candidates:
        raise InferError("no column holds only 0 and 1 for the label (a click, a purchase): give --label COLUMN "
                         "after making one")
    candidates.sort(key=lambda p: (-_label_score(p), p.null_fraction))
    best = candidates[0]
    check = ""
    if len(candidates) > 1:
        check = (f"chosen by its name among the 0/1 columns {', '.join(p.name for p in candidates)}"
                 if _label_score(best) > _label_score(candidates[1]) else
                 f"the first of the 0/1 columns {', '.join(p.name for p in candidates)}: give --label if another")
    elif not _label_score(best):
        check = "the only 0/1 column, though its name does not say label"
    return best, check


def _pick_time(profiles: list[ColumnProfile], timestamp: Optional[str], label: str) -> Optional[ColumnProfile]:
    if timestamp is not None:
        found = [p for p in profiles if p.name == timestamp]
        if not found:
            raise InferError(f"--timestamp {timestamp!r}: no such column "
                             f"(the log has: {', '.join(p.name for p in profiles)})")
        return found[0]
    typed = [p for p in profiles if p.is_time and p.name != label]
    if typed:
        return typed[0]
    named = [p for p in profiles if p.name != label and _TIME_NAME.search(p.name) and p.kind in ("int", "float")
             and p.minimum is not None and p.minimum >= 1e8]
    return named[0] if named else None


def infer(profiles: list[ColumnProfile], rows: int, files: int = 1, sampled_files: int = 1,
          label: Optional[str] = None, timestamp: Optional[str] = None, name: str = "my_log") -> Inference:
    """Guess a starting config from a sample's column profiles.

    Args:
        profiles: profile_table's output.
        rows: rows in the sample.
        files: Parquet files in the log.
        sampled_files: files the sample came from.
        label: the label column, instead of the guess (it must hold 0 and 1 only).
        timestamp: the time column, instead of the guess.
        name: the config's name.

    Returns:
        The guesses and the config they make, which parse_config accepts.

    Raises:
        InferError: no 0/1 column for the label, or --label / --timestamp name no usable column.
    """
    label_p, label_check = _pick_label(profiles, label)
    time_p = _pick_time(profiles, timestamp, label_p.name)
    taken: set[str] = set()
    guesses: list[Guess] = []
    sparse, dense = [], []
    for p in profiles:
        figures = _figures(p)
        if p is label_p:
            guesses.append(Guess(p.name, "label", why=f"{figures}, positive rate {p.positive_rate:.2%}",
                                 check=label_check))
            continue
        if p is time_p:
            guesses.append(Guess(p.name, "timestamp", why=figures,
                                 check="" if p.is_time or timestamp else "chosen by its name and its range"))
            continue
        if not _COLUMN_OK.fullmatch(p.name):
            guesses.append(Guess(p.name, "skip", why=figures, check="its name cannot be a SavedModel input: rename "
                                                                    "the column to use it"))
            continue
        if p.kind is None or p.kind == "null" or p.null_fraction >= 1.0 or p.distinct <= 1:
            why = "no feature can read this type" if p.kind is None else "always null" if (
                p.kind == "null" or p.null_fraction >= 1.0) else "one value only"
            guesses.append(Guess(p.name, "skip", why=f"{figures}: {why}"))
            continue
        if p.is_time:
            guesses.append(Guess(p.name, "skip", why=f"{figures}: a second time column",
                                 check="a time: derive hour or weekday columns from it to use it"))
            continue
        check = ""
        if p.kind.startswith("list<") or (p.kind == "string" and p.separated >= 0.5):
            spec, how = _sparse(p, _feature_name(p.name, taken), multivalent=True)
            sparse.append(spec)
        elif p.kind == "string" and p.numeric_strings >= 0.99 and p.distinct > SMALL_INT_CATEGORIES:
            spec, how = _dense(p, _feature_name(p.name, taken))
            dense.append(spec)
            check = "numbers logged as strings: read as a dense feature"
        elif p.kind == "string" or _ID_NAME.search(p.name) or (
                p.kind in ("int", "uint64") and p.distinct <= SMALL_INT_CATEGORIES and not p.zero_one):
            spec, how = _sparse(p, _feature_name(p.name, taken), multivalent=False)
            sparse.append(spec)
            if p.kind in ("int", "uint64") and not _ID_NAME.search(p.name):
                check = "integers with few values: read as a category; make it dense if their order matters"
        else:
            spec, how = _dense(p, _feature_name(p.name, taken))
            dense.append(spec)
            if p.kind in ("int", "uint64") and p.distinct <= 1_000 and not p.zero_one:
                check = "integers read as a number; make it sparse if they are codes"
        if p.null_fraction > 0.5:
            check = "; ".join(filter(None, [check, f"{p.null_fraction:.0%} null"]))
        guesses.append(Guess(p.name, "sparse" if spec in sparse else "dense", spec=spec, why=f"{figures}: {how}",
                             check=check))
    if not sparse and not dense:
        raise InferError("no column is left for a feature once the label and time columns are set aside")
    config: dict = {"name": name}
    if time_p is not None:
        config["input"] = {"timestamp": time_p.name}
    config["split"] = {"eval_fraction": 0.1, "validation_fraction": 0.1}
    config["label"] = {"column": label_p.name}
    config["features"] = {"sparse": sparse, "dense": dense}
    config["model"] = {"task": "ranking"}
    config["train"] = {"steps": 2000}
    inference = Inference(guesses, rows, files, sampled_files, config)
    inference.typed()
    return inference


def render_config(inference: Inference, source: str) -> str:
    """The config as commented YAML: what each guess rests on, and what a person should check first.

    Args:
        inference: infer's output.
        source: the log it was inferred from, named in the header.

    Returns:
        YAML text that load_config reads back to the same config.
    """
    c = inference.config
    by_column = {g.column: g for g in inference.guesses}
    lines = [f"# Inferred by `recpipe init` from {source}: {inference.rows:,} rows read from "
             f"{inference.sampled_files} of {inference.files} file(s).",
             "# A starting point: read the guesses below, then `recpipe preprocess` and `recpipe train`."]
    checks = inference.checks()
    if checks:
        lines.append("# Check these guesses first:")
        lines += [f"#   {g.column}: {g.check}" for g in checks]
    if "input" not in c:
        lines.append("# No time column found: the eval split is the log's last rows in file order "
                     "(set input.timestamp if the log has a time).")
    lines.append(f"name: {c['name']}")
    if "input" in c:
        lines.append(f"input: {{timestamp: {_scalar(c['input']['timestamp'])}}}"
                     f"  # {by_column[c['input']['timestamp']].why}")
    order = "by time" if "input" in c else "in file order"
    lines.append(f"split: {{eval_fraction: 0.1, validation_fraction: 0.1}}  # eval: the last 10 % {order}; "
                 f"validation: the 10 % before it")
    label = by_column[c["label"]["column"]]
    lines.append(f"label: {{column: {_scalar(label.column)}}}  # {label.why}")
    lines.append("features:")
    for kind in ("sparse", "dense"):
        lines.append(f"  {kind}:" + ("" if c["features"][kind] else " []"))
        for spec in c["features"][kind]:
            lines.append(f"    - {_flow(spec)}  # {by_column[spec['column']].why}")
    skipped = [g for g in inference.guesses if g.role == "skip"]
    if skipped:
        lines.append("  # left out:")
        lines += [f"  #   {g.column}: {g.why}" for g in skipped]
    lines.append("model: {task: ranking}  # no type: DCN-v2 and the logistic model, the better on validation kept")
    lines.append("train: {steps: 2000}  # batch 1024, Adagrad 0.05; early stopping on the validation split")
    text = "\n".join(lines) + "\n"
    assert parse_config(yaml.safe_load(text)) == inference.typed(), "the rendered YAML must be the inferred config"
    return text


def _scalar(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _flow(spec: dict) -> str:
    return yaml.safe_dump(spec, default_flow_style=True, sort_keys=False, width=10_000).strip()


def summary_lines(inference: Inference) -> list[str]:
    """A short per-column summary for the terminal: the guess, its figures, and what to check.

    Args:
        inference: infer's output.

    Returns:
        One line per column, then one line per guess to check.
    """
    width = max(len(g.column) for g in inference.guesses)
    out = [f"init: {inference.rows:,} rows from {inference.sampled_files} of {inference.files} file(s)"]
    for g in inference.guesses:
        out.append(f"init:   {g.column:<{width}}  {g.role:<9}  {g.why}" + ("  [check]" if g.check else ""))
    for g in inference.checks():
        out.append(f"init: check {g.column}: {g.check}")
    return out
