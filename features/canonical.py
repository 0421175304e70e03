"""Raw Arrow record batches -> validated, canonical columns (pure, vectorised, no TF, no Beam).

Canonical form, keyed by FEATURE name (two features may read one column):
  sparse scalar      pa.string, no nulls (null -> ""); from a column read dictionary-encoded
                     (encoded_columns), a dictionary<int32, string> array of those strings
  sparse multivalent pa.list_(pa.string()), no nulls (null -> []), empty tokens dropped
  dense              pa.float32, missing -> NaN (the transform fills it)
  LABEL_KEY          pa.float32 0/1
The TF transform (recpipe.features.transform) maps canonical columns to IDs; the serving graph builds
the same canonical tensors from request tensors (recpipe.features.transform.canonicalize_request).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Collection

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recpipe.features.config import Config
from recpipe.features.schema import DEFAULT_SEPARATOR, list_separator
from recpipe.common.errors import RecpipeError

__all__ = ["LABEL_KEY", "SchemaError", "NULL_KIND", "plain_type", "plain_columns", "raw_kind", "merged_kind",
           "check_schema", "validate_batch", "canonicalize", "as_string", "list_parts", "dense_prenorm", "numeric",
           "one_array", "times", "rows_with_value", "dense_sums", "DENSE_SUM_SCALE", "DEFAULT_SEPARATOR",
           "CROSS_SEPARATOR", "BadRows", "FLOAT32_MAX", "DEAD_LETTER_REASONS", "list_separator", "list_separators",
           "splits_back", "unsplittable_reason", "encoded_columns", "is_id_dictionary", "decoded"]

LABEL_KEY = "target.label"  # not a valid feature name, so it cannot collide
CROSS_SEPARATOR = "\x1f"  # joins a cross's values (ASCII unit separator: no value of C1 "a\x1fb" x C2 "c" meets
                           # C1 "a" x C2 "b\x1fc" unless a log puts unit separators in its IDs)
FLOAT32_MAX = float(np.finfo(np.float32).max)
# Why a row is dead-lettered, in the order validate_batch checks (the first failing check names the reason
# and the field), each with what it means for the row's field:
DEAD_LETTER_REASONS = {
    "invalid_utf8": "holds a string that is not UTF-8",
    "label_unparsable": "the label cannot be read as a number",
    "null_label": "the label is null",
    "label_not_0_1": "the label is neither 0 nor 1",
    "timestamp_unparsable": "the timestamp cannot be read as a number or an ISO 8601 date or date-time",
    "null_timestamp": "the timestamp is null (or not a finite number)",
    "null_user": "the per-user split's user column is null",
    "order_unparsable": "the per-user split's order column cannot be read",
    "null_order": "the per-user split's order column is null (or not a finite number)",
    "dense_unparsable": "a dense feature's value cannot be read as a number",
    "dense_infinite": "a dense feature's value is infinite",
    "dense_out_of_range": "a dense feature's value is finite but beyond float32 (e.g. 1e39); `out_of_range: clip` "
                          "on the feature clips it instead",
    "list_item_has_separator": "a list item contains the feature's separator, which serving joins lists with (with a "
                               "separator of several characters: the items joined by it would split elsewhere)",
}


class SchemaError(RecpipeError, ValueError):
    """A log file's columns do not fit the config; the message names file, column and feature."""


_SECONDS = {"s": 1, "ms": 10 ** 3, "us": 10 ** 6, "ns": 10 ** 9}
# The kind of a column of Arrow type null (pandas writes an all-None column so): every value missing, so
# any feature can read it, as the kind the other files (or the previous transform) give the column.
NULL_KIND = "null"
_KIND_TYPES = {"string": pa.string(), "int": pa.int64(), "uint64": pa.uint64(), "float": pa.float64(),
               "list<string>": pa.list_(pa.string()), "list<int>": pa.list_(pa.int64()),
               "list<uint64>": pa.list_(pa.uint64())}
# Files that log one column as int64 and as uint64: the signed kind, as before uint64 was a kind of its own
# (a value of 2**63 or more still trains, as its decimal string; an int64 input cannot carry it).
_MERGED_KINDS = {frozenset(("int", "uint64")): "int", frozenset(("list<int>", "list<uint64>")): "list<int>"}


def plain_type(tp: pa.DataType) -> pa.DataType:
    """The type a column is read as: dictionary-encoded values (pandas categoricals) as their values'
    type, timestamps and dates (any unit or time zone) as float64 seconds since the epoch, UTC, decimals
    (SQL exports) as float64, binary (Parquet BYTE_ARRAY without the UTF8 annotation, as Impala, Hive
    and older Spark SQL write strings) and the view layouts of strings and binary (Arrow's Utf8View, as
    pyarrow writes a string_view column back) as string, and lists of these (fixed-size ones too) as
    lists of those."""
    if pa.types.is_dictionary(tp):
        return plain_type(tp.value_type)
    if pa.types.is_binary(tp) or pa.types.is_string_view(tp) or pa.types.is_binary_view(tp):
        return pa.string()
    if pa.types.is_large_binary(tp):
        return pa.large_string()
    if pa.types.is_timestamp(tp) or pa.types.is_date(tp) or pa.types.is_decimal(tp):
        return pa.float64()
    if pa.types.is_list(tp) or pa.types.is_fixed_size_list(tp):
        return pa.list_(plain_type(tp.value_type))
    if pa.types.is_large_list(tp):
        return pa.large_list(plain_type(tp.value_type))
    return tp


def _plain(arr: pa.Array) -> pa.Array:
    tp = arr.type
    if pa.types.is_dictionary(tp):
        return _plain(arr.dictionary_decode())
    if pa.types.is_timestamp(tp):  # unsafe: ns since 1970 pass 2**53 within days; float64 s keep ~0.2 us
        return pc.divide(pc.cast(pc.cast(arr, pa.int64()), pa.float64(), safe=False), float(_SECONDS[tp.unit]))
    if pa.types.is_date32(tp):
        return pc.multiply(pc.cast(pc.cast(arr, pa.int32()), pa.float64()), 86_400.0)
    if pa.types.is_date64(tp):
        return pc.divide(pc.cast(pc.cast(arr, pa.int64()), pa.float64(), safe=False), 1_000.0)
    if pa.types.is_decimal(tp):
        return pc.cast(arr, pa.float64())
    # binary: the same buffers; rows that are not UTF-8 are dead-lettered (invalid_utf8)
    if pa.types.is_binary(tp) or pa.types.is_large_binary(tp):
        return arr.view(plain_type(tp))
    if pa.types.is_string_view(tp) or pa.types.is_binary_view(tp):
        return pc.cast(arr, pa.binary()).view(pa.string())
    if pa.types.is_fixed_size_list(tp):  # e.g. a column of numpy rows: a list that happens to be of one length
        return _plain(arr.cast(pa.list_(tp.value_type)))
    if (pa.types.is_list(tp) or pa.types.is_large_list(tp)) and plain_type(tp) != tp:
        return type(arr).from_arrays(arr.offsets, _plain(arr.values), mask=arr.is_null())
    return arr


def plain_columns(table: pa.Table, kinds: dict[str, str] | None = None, encoded: Collection[str] = ()) -> pa.Table:
    """`table` with every column of a type plain_type() changes converted to it (nulls kept), and every
    column of type null made a column of nulls of its kind in `kinds` (the run's raw schema).

    A column named in `encoded` (encoded_columns) that holds dictionary-encoded strings stays encoded, as
    dictionary<indices, string> (binary values viewed as strings), unless its dictionary holds a null."""
    for i, field in enumerate(table.schema):
        if pa.types.is_null(field.type) and kinds and kinds.get(field.name) in _KIND_TYPES:
            table = table.set_column(i, field.name, pa.nulls(table.num_rows, _KIND_TYPES[kinds[field.name]]))
        elif field.name in encoded and _string_dictionaries(table.column(i)):
            if not pa.types.is_string(field.type.value_type):
                table = table.set_column(i, field.name, pa.chunked_array(
                    [pa.DictionaryArray.from_arrays(c.indices, c.dictionary.view(pa.string()))
                     for c in table.column(i).chunks]))
        elif plain_type(field.type) != field.type:
            column = pa.chunked_array([_plain(c) for c in table.column(i).chunks], plain_type(field.type))
            table = table.set_column(i, field.name, column)
    return table


def _string_dictionaries(column: pa.ChunkedArray) -> bool:
    """Whether every chunk of a column is dictionary-encoded UTF-8 or binary with no null in its dictionary."""
    tp = column.type
    if not (pa.types.is_dictionary(tp) and (pa.types.is_string(tp.value_type) or pa.types.is_binary(tp.value_type))):
        return False
    return not any(c.dictionary.null_count for c in column.chunks)


def encoded_columns(cfg: Config, raw_schema: dict[str, str]) -> list[str]:
    """The string columns a job may read dictionary-encoded, as Parquet stores them (plain_columns).

    Args:
        cfg: the config.
        raw_schema: the run's raw schema (column -> kind).

    Returns:
        The string columns read by single-valued sparse features only (no label, timestamp, split, dense
        or multivalent feature reads them), in config order. Their canonical form may stay encoded
        (is_id_dictionary): validation, row hashing, counting and ID lookup then work on each distinct
        value of a batch once instead of on each row, and once per row group where a batch's dictionary
        equals the last one's (recpipe.features.dictionaries).
    """
    other = {cfg.label.column, cfg.input.timestamp, cfg.split.user, cfg.split_order,
             *(d.column for d in cfg.features.dense), *(f.column for f in cfg.column_sparse if f.multivalent)}
    out: list[str] = []
    for f in cfg.column_sparse:
        if f.column not in other and f.column not in out and raw_schema.get(f.column) == "string":
            out.append(f.column)
    return out


def is_id_dictionary(arr: pa.Array) -> bool:
    """Whether an array is dictionary-encoded strings (an encoded_columns column, raw or canonical)."""
    return pa.types.is_dictionary(arr.type) and pa.types.is_string(arr.type.value_type)


def decoded(arr: pa.Array) -> pa.Array:
    """A dictionary-encoded array as plain values; any other array as it is."""
    return arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr


def raw_kind(tp: pa.DataType) -> str | None:
    """The artifact's name for an Arrow type (as plain_type() reads it), or None when no feature can
    read it."""
    tp = plain_type(tp)
    if pa.types.is_null(tp):
        return NULL_KIND
    if pa.types.is_string(tp) or pa.types.is_large_string(tp):
        return "string"
    if pa.types.is_uint64(tp):  # served as uint64: an int64 input cannot carry 2**63 and above
        return "uint64"
    if pa.types.is_integer(tp) or pa.types.is_boolean(tp):
        return "int"
    if pa.types.is_floating(tp):
        return "float"
    if pa.types.is_list(tp) or pa.types.is_large_list(tp):
        inner = raw_kind(tp.value_type)
        if inner in ("string", "int", "uint64"):
            return f"list<{inner}>"
    return None


def merged_kind(a: str, b: str) -> str | None:
    """The kind of a column that files (or a previous transform) type as `a` and as `b`; None when no
    kind holds both. NULL_KIND takes the other."""
    if a == b or b == NULL_KIND:
        return a
    if a == NULL_KIND:
        return b
    return _MERGED_KINDS.get(frozenset((a, b)))


def check_schema(schema: pa.Schema, cfg: Config, source: str) -> dict[str, str]:
    """Check a file's schema against the config; return {column: raw kind} for the columns used."""
    kinds: dict[str, str] = {}
    for col in cfg.raw_columns():
        found = schema.get_all_field_indices(col)
        if len(found) > 1:
            raise SchemaError(f"{source}: column {col!r} required by the config appears {len(found)} times")
        if not found:
            raise SchemaError(f"{source}: column {col!r} required by the config is missing "
                              f"(file has: {', '.join(schema.names[:12])}{'...' if len(schema.names) > 12 else ''})")
        kind = raw_kind(schema.field(found[0]).type)
        if kind is None:
            raise SchemaError(f"{source}: column {col!r} has unsupported type {schema.field(found[0]).type}")
        kinds[col] = kind

    def need(col: str, allowed: tuple[str, ...], what: str) -> None:
        allowed = (*allowed, *(k.replace("int", "uint64") for k in allowed if "int" in k))
        if kinds[col] not in (*allowed, NULL_KIND):
            raise SchemaError(f"{source}: column {col!r} ({kinds[col]}) cannot feed {what}; "
                              f"expected {' or '.join(allowed)}")

    need(cfg.label.column, ("int", "float", "string"), "the label")
    if cfg.input.timestamp:
        need(cfg.input.timestamp, ("int", "float", "string"), "the timestamp")
    if cfg.split.by == "user":
        need(cfg.split.user, ("string", "int"), "split.user")
        need(cfg.split_order, ("int", "float", "string"), "split.order")
    for f in cfg.column_sparse:
        if f.multivalent:
            need(f.column, ("list<string>", "list<int>", "string"), f"multivalent feature {f.name!r}")
        else:
            need(f.column, ("string", "int"), f"sparse feature {f.name!r}")
    for d in cfg.features.dense:
        need(d.column, ("int", "float", "string"), f"dense feature {d.name!r}")
    return kinds


_NUMBER = r"^\s*[-+]?((\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|inf|infinity|nan)\s*$"


def numeric(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A label/timestamp/dense column as float64 (null or "" -> NaN) and a mask of unparsable rows.

    Numeric columns never have unparsable rows; string columns are parsed row by row, vectorised.
    """
    arr = one_array(arr)
    n = len(arr)
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        trimmed = pc.utf8_trim_whitespace(arr)
        blank = pc.fill_null(pc.equal(trimmed, ""), True)
        ok = pc.fill_null(pc.match_substring_regex(trimmed, _NUMBER, ignore_case=True), False)
        bad = np.asarray(pc.and_(pc.invert(blank), pc.invert(ok)).to_numpy(zero_copy_only=False), dtype=bool)
        usable = pc.if_else(ok, trimmed, pa.scalar(None, pa.string()))
        values = pc.cast(usable, pa.float64()).to_numpy(zero_copy_only=False)
        return np.asarray(values, dtype=np.float64), bad
    if pa.types.is_boolean(arr.type):
        arr = pc.cast(arr, pa.int64())
    values = pc.cast(arr, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.float64), np.zeros(n, dtype=bool)


def times(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A timestamp (or split order) column as float64 and a mask of unparsable rows: numeric(), and in a
    string column also ISO 8601 dates and date-times ("2026-01-01", "2026-01-01 12:30:00",
    "2026-01-01T12:30:00.25+02:00", "...Z") as seconds since the epoch, UTC unless the value carries an
    offset. One parser for every row (Python's datetime.fromisoformat), so which rows parse never depends
    on what else a batch holds; only the rows that are not numbers pay for it."""
    values, bad = numeric(arr)
    if bad.any():
        rows = np.flatnonzero(bad)
        strings = pc.utf8_trim_whitespace(one_array(arr).take(pa.array(rows))).to_pylist()
        for i, s in zip(rows.tolist(), strings):
            seconds = _iso_seconds(s)
            if seconds is not None:
                values[i], bad[i] = seconds, False
    return values, bad


def _iso_seconds(s: str) -> float | None:
    try:
        t = dt.datetime.fromisoformat(s)
    except ValueError:
        return None
    return (t if t.tzinfo is not None else t.replace(tzinfo=dt.timezone.utc)).timestamp()


@dataclass
class BadRows:
    """Row indices (into the batch) that cannot be used, with a reason and the field at fault."""
    indices: np.ndarray
    reasons: list[str]
    fields: list[str]


def one_array(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as one Array: a chunked column of one chunk is that chunk (Arrow's combine_chunks copies
    even one chunk: 58 µs for a 64k-row string column, about 1 s of a 2M-row Criteo-shaped job's CPU)."""
    if not isinstance(arr, pa.ChunkedArray):
        return arr
    return arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()


def _all_ascii(values: pa.Array) -> bool:
    """Whether every byte of a string array's values is below 0x80 (nulls' bytes included: a False only
    sends the array to the full check)."""
    if len(values) == 0:
        return True
    offsets, data = values.buffers()[1:3]
    if data is None:
        return True
    width = 8 if pa.types.is_large_string(values.type) else 4
    bounds = np.frombuffer(offsets, dtype=np.int64 if width == 8 else np.int32, count=len(values) + 1,
                           offset=values.offset * width)
    start, end = int(bounds[0]), int(bounds[-1])
    return bool(np.frombuffer(data, dtype=np.uint8, count=end - start, offset=start).max(initial=0) < 0x80)


def _invalid_utf8(arr: pa.Array) -> np.ndarray:
    """Rows holding a string (or a list item) that is not valid UTF-8. Parquet does not check it on
    write, and TensorFlow fails the whole batch on it; the fast path is one validation of the array."""
    n = len(arr)
    if pa.types.is_dictionary(arr.type):  # each distinct value checked once
        bad = _invalid_utf8(arr.dictionary)
        if not bad.any():
            return np.zeros(n, dtype=bool)
        return np.isin(np.asarray(arr.indices.fill_null(-1)), np.flatnonzero(bad))
    is_list = pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)
    values = pc.list_flatten(arr) if is_list else arr
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        return np.zeros(n, dtype=bool)
    if _all_ascii(values):  # ASCII is UTF-8: one vectorised pass, 15x faster than Arrow's full validation
        return np.zeros(n, dtype=bool)
    try:
        values.validate(full=True)
        return np.zeros(n, dtype=bool)
    except pa.ArrowInvalid:
        pass
    raw = values.cast(pa.binary() if pa.types.is_string(values.type) else pa.large_binary())

    def bad(b) -> bool:
        try:
            b.decode("utf-8")
            return False
        except UnicodeDecodeError:
            return True

    bad_values = np.array([v is not None and bad(v) for v in raw.to_pylist()], dtype=bool)
    return _rows_holding(arr, bad_values) if is_list else bad_values


def _rows_holding(arr: pa.Array, item_mask: np.ndarray) -> np.ndarray:
    """Rows of a list column with at least one item flagged in item_mask (over the flattened items)."""
    out = np.zeros(len(arr), dtype=bool)
    out[pc.list_parent_indices(arr).to_numpy(zero_copy_only=False)[item_mask]] = True
    return out


def list_separators(cfg: Config) -> dict[str, str]:
    """The separator of every column a multivalent feature reads (config_checks gives a column one).

    Args:
        cfg: the config.

    Returns:
        {column: separator}: the raw columns (serving inputs) whose rows may be lists.
    """
    return {f.column: list_separator(f) for f in cfg.column_sparse if f.multivalent}


def splits_back(items: list, separator: str) -> bool:
    """Whether one list row survives being joined with `separator` (as serving joins a list) and split
    again (as every path splits a joined row): the Python form of the rule _unsplittable applies to Arrow
    columns, for request parsers.

    Args:
        items: the row's items (strings or integers; None or "" items are no tokens).
        separator: the feature's separator (list_separator).

    Returns:
        False when an item contains the separator or, with a separator of several characters, the joined
        items split elsewhere (separator "aba", items "xab", "ay"); True otherwise.
    """
    kept = [str(x) for x in items if x is not None and str(x) != ""]
    return [x for x in separator.join(kept).split(separator) if x] == kept


def unsplittable_reason(separator: str) -> str:
    """What is wrong with a list row that does not split back (splits_back), as every path words it.

    Args:
        separator: the feature's separator.

    Returns:
        E.g. "a list item contains the separator ';'".
    """
    overlap = " (or overlaps it: the joined items would split elsewhere)" if len(separator) > 1 else ""
    return f"a list item contains the separator {separator!r}{overlap}"


def _unsplittable(arr: pa.Array, separator: str) -> np.ndarray:
    """Rows of a list column that do not split back (splits_back): serving could not carry them."""
    values = pc.list_flatten(arr)
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)) \
            and not set(separator) & set("-0123456789"):  # integers, as decimals, cannot hold it
        return np.zeros(len(arr), dtype=bool)
    values = as_string(values)
    if len(separator) == 1:  # one character: exactly the rows with an item holding it, at a third of the cost
        return _rows_holding(arr, pc.fill_null(pc.match_substring(values, separator), False)
                             .to_numpy(zero_copy_only=False))
    items = _nonempty(values, _lengths(arr))
    again = _tokens(pc.binary_join(items, separator), separator)
    bad = _lengths(items) != _lengths(again)
    same = np.flatnonzero(~bad)
    if len(same):  # rows of equal length: compare their items one by one
        kept, back = items.take(pa.array(same)), again.take(pa.array(same))
        differ = pc.not_equal(pc.list_flatten(kept), pc.list_flatten(back)).to_numpy(zero_copy_only=False)
        bad[same[_rows_holding(kept, differ)]] = True
    return bad


def validate_batch(batch: pa.RecordBatch | pa.Table, cfg: Config) -> tuple[np.ndarray, BadRows]:
    """Return (good-row mask, bad rows). The first failing check of a row names its reason
    (DEAD_LETTER_REASONS) and its field."""
    n = batch.num_rows
    reason = np.full(n, "", dtype=object)
    flagged = np.zeros(n, dtype=bool)  # reason != "", kept as booleans: comparing objects costs ~1 ms a call

    def flag(mask: np.ndarray, why: str, col: str) -> None:
        fresh = mask & ~flagged
        if fresh.any():
            reason[fresh] = f"{why}:{col}"
            flagged[fresh] = True

    present = set(batch.schema.names)  # the split pass reads only the columns it needs
    for col in cfg.raw_columns():
        if col in present:
            flag(_invalid_utf8(one_array(batch.column(col))), "invalid_utf8", col)
    lv, lbad = numeric(batch.column(cfg.label.column))
    flag(lbad, "label_unparsable", cfg.label.column)
    flag(np.isnan(lv), "null_label", cfg.label.column)
    flag(~np.isin(lv, (0.0, 1.0)), "label_not_0_1", cfg.label.column)
    if cfg.input.timestamp:
        tv, tbad = times(batch.column(cfg.input.timestamp))
        flag(tbad, "timestamp_unparsable", cfg.input.timestamp)
        flag(~np.isfinite(tv), "null_timestamp", cfg.input.timestamp)
    if cfg.split.by == "user":
        flag(np.asarray(one_array(batch.column(cfg.split.user)).is_null().to_numpy(zero_copy_only=False), dtype=bool),
             "null_user", cfg.split.user)
        ov, obad = times(batch.column(cfg.split_order))
        flag(obad, "order_unparsable", cfg.split_order)
        flag(~np.isfinite(ov), "null_order", cfg.split_order)
    for d in cfg.features.dense:
        v, dbad = numeric(batch.column(d.column))
        flag(dbad, "dense_unparsable", d.column)
        flag(np.isinf(v), "dense_infinite", d.column)
        if d.out_of_range == "dead_letter":  # a finite float64 beyond float32 would become inf, then NaN stats
            with np.errstate(invalid="ignore"):
                flag(np.abs(v) > FLOAT32_MAX, "dense_out_of_range", d.column)
    for f in cfg.column_sparse:
        if f.column not in present:
            continue
        raw = one_array(batch.column(f.column))
        if f.multivalent and (pa.types.is_list(raw.type) or pa.types.is_large_list(raw.type)):
            flag(_unsplittable(raw, list_separator(f)), "list_item_has_separator", f.column)
    bad = np.flatnonzero(flagged)
    reasons = [str(reason[i]).split(":", 1)[0] for i in bad]
    fields = [str(reason[i]).split(":", 1)[1] for i in bad]
    return ~flagged, BadRows(bad, reasons, fields)


def as_string(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column's values as strings, the way every ID token is spelled (ints and strings alike; booleans
    as 0/1), so a vocabulary, a hash and the per-user split see one spelling."""
    arr = one_array(arr)
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        if pa.types.is_boolean(arr.type):
            arr = pc.cast(arr, pa.int64())
        arr = pc.cast(arr, pa.string())
    return pc.cast(arr, pa.string())


def list_parts(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """A canonical list column as (its rows' items, flat; row splits from 0), for a ragged tensor or
    the batch transform's Ragged IDs."""
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.slice(offsets[0], offsets[-1] - offsets[0]) if len(arr) else arr.values.slice(0, 0)
    return values, offsets - offsets[0]


def _lengths(lists: pa.Array) -> np.ndarray:
    """Each row's item count of a list column (a null row: 0)."""
    return pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _tokens(arr: pa.Array, separator: str) -> pa.ListArray:
    """A multivalent column as list<string>: a list column's items as strings, a string column's rows
    split on `separator` (literally: no pattern, no trimming); nulls -> [], null and empty tokens dropped."""
    is_list = pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)
    lists = arr if is_list else pc.split_pattern(as_string(arr), separator)
    return _nonempty(as_string(pc.list_flatten(lists)), _lengths(lists))


def _nonempty(values: pa.Array, lengths: np.ndarray) -> pa.ListArray:
    """Flat string items and each row's count of them -> list<string> rows without null or empty items."""
    keep = pc.not_equal(values.fill_null(""), "").to_numpy(zero_copy_only=False)
    if not keep.all():
        row_of = np.repeat(np.arange(len(lengths)), lengths)
        lengths = np.bincount(row_of[keep], minlength=len(lengths)).astype(np.int64)
        values = values.filter(pa.array(keep))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), values.fill_null(""))


def canonicalize(batch: pa.RecordBatch | pa.Table, cfg: Config) -> dict[str, pa.Array]:
    """Valid rows of a raw batch -> canonical columns keyed by feature name (+ LABEL_KEY)."""
    def col(name: str) -> pa.Array:
        return one_array(batch.column(name))

    out: dict[str, pa.Array] = {}
    for f in cfg.column_sparse:
        raw = col(f.column)
        if f.multivalent:
            out[f.name] = _tokens(raw, list_separator(f))
        elif is_id_dictionary(raw):
            out[f.name] = _filled_dictionary(raw)
        else:
            out[f.name] = as_string(raw).fill_null("")
    for f in cfg.crosses:  # after their sources; the graph joins the same strings (transform.canonicalize_request)
        out[f.name] = pc.binary_join_element_wise(*(decoded(out[s]) for s in f.cross), CROSS_SEPARATOR)
    for d in cfg.features.dense:
        out[d.name] = _float32(col(d.column), clip=d.out_of_range == "clip")
    out[LABEL_KEY] = _float32(col(cfg.label.column), clip=False)
    return out


_EXACT_IN_FLOAT64 = 2 ** 53


def _float32(arr: pa.Array, clip: bool) -> pa.Array:
    """numeric()'s float64 values of a column rounded to float32, missing ones NaN; clipped to
    ±FLOAT32_MAX first when `clip` (NaN stays NaN). An integer column within ±2**53 (exact in float64,
    where every Criteo count is) is cast to float32 by Arrow alone: the same values, a third of the cost."""
    if pa.types.is_integer(arr.type):
        bounds = pc.min_max(arr)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is None or (-_EXACT_IN_FLOAT64 <= low and high <= _EXACT_IN_FLOAT64):
            return pc.fill_null(pc.cast(arr, pa.float32(), safe=False), float("nan"))
    values = numeric(arr)[0]
    if clip:
        values = np.clip(values, -FLOAT32_MAX, FLOAT32_MAX)
    return pa.array(values.astype(np.float32), pa.float32())


def _filled_dictionary(arr: pa.DictionaryArray) -> pa.DictionaryArray:
    """A dictionary-encoded string column with its nulls as "" (the dictionary's own "", or one added)."""
    if not arr.null_count:
        return arr
    dictionary = arr.dictionary
    empty = pc.index(dictionary, "").as_py()
    if empty < 0:
        empty, dictionary = len(dictionary), pa.concat_arrays([dictionary, pa.array([""], dictionary.type)])
    return pa.DictionaryArray.from_arrays(pc.fill_null(arr.indices, pa.scalar(empty, arr.indices.type)), dictionary)


def rows_with_value(cols: dict[str, pa.Array], cfg: Config) -> dict[str, int]:
    """Per column-fed feature of a canonical batch: the rows holding a value (an ID other than "", a list
    with an item, a dense number), so a feature its log never fills can be told apart from one it does."""
    out = {}
    for f in cfg.column_sparse:  # lengths from the offsets (canonical columns hold no nulls): 0.6 ms a 65,536-row
        arr = cols[f.name]       # batch of the synthetic config, where comparing strings with "" took 3.5
        if is_id_dictionary(arr):
            lengths = pc.binary_length(arr.dictionary).to_numpy(zero_copy_only=False)
            out[f.name] = int(np.count_nonzero(np.take(lengths, np.asarray(arr.indices))))
            continue
        lengths = pc.list_value_length(arr) if f.multivalent else pc.binary_length(arr)
        out[f.name] = int(np.count_nonzero(lengths.to_numpy(zero_copy_only=False)))
    for d in cfg.features.dense:
        values = cols[d.name].to_numpy(zero_copy_only=False)
        out[d.name] = int(len(values) - np.count_nonzero(np.isnan(values)))
    return out


DENSE_SUM_SCALE = 2 ** 20  # dense_sums' fixed point: integers add up alike in any order, on any runner


def dense_sums(cols: dict[str, pa.Array], cfg: Config) -> dict[str, int]:
    """Per dense feature with moments (not bucketized) of a canonical batch: the sum of the values its rows
    hold, as its statistics see them (dense_prenorm), missing ones left out (rows_with_value counts the
    rest), so a split's mean can be set against another's apart from how often the value is missing; in
    units of 1 / DENSE_SUM_SCALE (40 ns a row for the synthetic config's 13)."""
    out = {}
    for d in cfg.features.dense:
        if d.transform != "bucketize":
            values = cols[d.name].to_numpy(zero_copy_only=False)
            total = dense_prenorm(values[~np.isnan(values)], d.transform, d.fill).sum(dtype=np.float64)
            out[d.name] = int(round(float(total) * DENSE_SUM_SCALE))
    return out


def dense_prenorm(values: np.ndarray, transform: str, fill: float) -> np.ndarray:
    """The value a dense feature's statistics are computed on (mirrors FeatureTransform)."""
    x = np.where(np.isnan(values), np.float32(fill), values).astype(np.float32)
    if transform == "log_zscore":
        x = np.log1p(np.maximum(x, np.float32(0))).astype(np.float32)
    return x
