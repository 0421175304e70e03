"""Convert a Criteo display-ads CSV/TSV (label, I1..I13, C1..C26) to a Parquet click log.

The public Criteo logs have no timestamp: row order is time order, so the converted file keeps
the order and configs/criteo.yaml splits by row order.
"""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

__all__ = ["CRITEO_COLUMNS", "criteo_csv_to_parquet"]

CRITEO_COLUMNS = ["label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]]


def criteo_csv_to_parquet(csv_path: str, out_dir: str) -> str:
    """Write OUT_DIR/<stem>.parquet; a header row is used when present, else Criteo's order."""
    with open(csv_path, "rb") as fh:
        first = fh.readline().decode("utf-8", "replace")
    delimiter = "\t" if first.count("\t") > first.count(",") else ","
    has_header = first.strip().split(delimiter)[0].strip() == "label"
    types = {"label": pa.int64(), **{f"I{i}": pa.float64() for i in range(1, 14)},
             **{f"C{i}": pa.string() for i in range(1, 27)}}
    try:
        table = pacsv.read_csv(
            csv_path,
            read_options=pacsv.ReadOptions(column_names=None if has_header else CRITEO_COLUMNS),
            parse_options=pacsv.ParseOptions(delimiter=delimiter),
            convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True,
                                                 include_columns=CRITEO_COLUMNS))
    except (pa.ArrowInvalid, KeyError) as e:
        raise ValueError(f"{csv_path}: not a Criteo CSV ({e})") from None
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(csv_path))[0]
    out = os.path.join(out_dir, f"{stem}.parquet")
    pq.write_table(table, out)
    return out
