"""Convert a Criteo display-ads CSV/TSV (label, I1..I13, C1..C26) to a Parquet click log.

The public Criteo logs have no timestamp: row order is time order, so the converted file keeps
the order and configs/criteo.yaml splits by row order.
"""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from recpipe.pipeline.sources import InputError

__all__ = ["CRITEO_COLUMNS", "criteo_csv_to_parquet"]

CRITEO_COLUMNS = ["label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]]


def criteo_csv_to_parquet(csv_path: str, out_dir: str, say=None) -> str:
    """Write OUT_DIR/<stem>.parquet; a header row is used when present, else Criteo's order.

    Nothing is dropped silently: a numeric column with a value that does not parse stays a string
    column, so `recpipe preprocess` dead-letters exactly those rows (naming row and field); a line with
    the wrong number of fields is kept in OUT_DIR/<stem>.rejected.csv with its line number and
    reported (it has no columns to put in a table)."""
    with open(csv_path, "rb") as fh:
        first = fh.readline().decode("utf-8", "replace")
    delimiter = "\t" if first.count("\t") > first.count(",") else ","
    has_header = first.strip().split(delimiter)[0].strip() == "label"
    numeric = {"label": pa.int64(), **{f"I{i}": pa.float64() for i in range(1, 14)}}
    rejected: list[tuple[int, str]] = []

    def reject(row) -> str:
        rejected.append((row.number, row.text))
        return "skip"

    try:
        table = pacsv.read_csv(
            csv_path,
            read_options=pacsv.ReadOptions(column_names=None if has_header else CRITEO_COLUMNS),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, invalid_row_handler=reject),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in CRITEO_COLUMNS},
                                                 strings_can_be_null=True, include_columns=CRITEO_COLUMNS))
    except (pa.ArrowInvalid, KeyError) as e:
        raise InputError(f"{csv_path}: not a Criteo CSV ({' '.join(str(e).split())})") from None
    for name, tp in numeric.items():
        try:
            table = table.set_column(table.schema.get_field_index(name), name, pc.cast(table[name], tp))
        except pa.ArrowInvalid:  # kept as strings: preprocess dead-letters the rows that do not parse
            if say:
                say(f"criteo-to-parquet: column {name} has values that are not numbers; kept as text, so "
                    f"`recpipe preprocess` dead-letters those rows")
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(csv_path))[0]
    out = os.path.join(out_dir, f"{stem}.parquet")
    pq.write_table(table, out)
    if rejected:
        rejected = _with_line_numbers(csv_path, rejected)
        path = os.path.join(out_dir, f"{stem}.rejected.csv")
        with open(path, "w") as fh:
            fh.write("line,text\n" + "".join(f"{n},{json.dumps(t)}\n" for n, t in rejected))
        if say:
            say(f"criteo-to-parquet: {len(rejected)} line(s) with the wrong number of fields skipped: {path}")
    return out


def _with_line_numbers(csv_path: str, rejected: list[tuple]) -> list[tuple[int, str]]:
    """pyarrow may not know a rejected row's line number: find each text's line (1-based) in the file."""
    if all(n is not None for n, _ in rejected):
        return rejected
    wanted: dict[str, list[int]] = {}
    for i, (_, text) in enumerate(rejected):
        wanted.setdefault(text, []).append(i)
    out = list(rejected)
    with open(csv_path, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, start=1):
            slots = wanted.get(line.rstrip("\r\n"))
            if slots:
                i = slots.pop(0)
                out[i] = (number, rejected[i][1])
    return out
