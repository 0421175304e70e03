"""The preprocessing peer a user would reach for instead of Beam: the same transform done by DuckDB.

Same input (the Parquet log, files in the order `recpipe preprocess` reads them), same config, same
work: the time split (last eval_fraction of rows by timestamp, or by row order without one), one
vocabulary per ID column over the train rows (min_count, max_size, most frequent first, ties by
value), IDs with OOV buckets, dense fill / log1p / z-score with train statistics; written as one
Parquet file per split of int64 IDs, float32 dense values and the label.

The peer covers what the Criteo-shaped benchmark config uses (single-valued vocabulary features,
zscore / log_zscore dense features) and refuses anything else by name: it is a yardstick, not a
second implementation of the product's transform. OOV IDs use DuckDB's own hash, so they differ from
FarmHash's: the cost is the same, the IDs are not meant to be compared.
"""
from __future__ import annotations

import os
import time

from recpipe.features.config import Config
from recpipe.pipeline.analysis import split_sizes
from recpipe.pipeline.sources import list_input_files

__all__ = ["duckdb_preprocess", "check_supported"]


def check_supported(cfg: Config) -> None:
    if cfg.split.by != "time":
        raise ValueError("duckdb peer: only a time split (split.by: time) is implemented")
    for f in cfg.features.sparse:
        if f.vocab is None or f.multivalent or f.share_embedding_with:
            raise ValueError(f"duckdb peer: feature {f.name!r} is not a single-valued vocabulary feature")
    for d in cfg.features.dense:
        if d.transform not in ("zscore", "log_zscore"):
            raise ValueError(f"duckdb peer: dense feature {d.name!r} uses {d.transform!r} (zscore/log_zscore only)")


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _prenorm(d, alias: str = "") -> str:
    """The dense value before the z-score: fill, then log1p of the non-negative part for log_zscore."""
    x = f"coalesce(CAST({alias}{_q(d.column)} AS DOUBLE), {float(d.fill)})"
    return f"ln(1 + greatest({x}, 0))" if d.transform == "log_zscore" else x


def duckdb_preprocess(cfg: Config, log_dir: str, out_dir: str, threads: int = 2) -> dict:
    """Run the transform; returns row counts and the wall time of each phase."""
    import duckdb

    check_supported(cfg)
    files = list_input_files(log_dir)
    os.makedirs(out_dir, exist_ok=True)
    con = duckdb.connect()
    con.execute(f"SET threads = {int(threads)}")
    con.execute("SET preserve_insertion_order = true")
    con.execute("SET enable_progress_bar = false")
    t0 = time.perf_counter()
    cols = ", ".join(_q(c) for c in cfg.raw_columns())
    file_list = "[" + ", ".join(_lit(f) for f in files) + "]"
    con.execute(f"CREATE TEMP TABLE raw AS SELECT {cols}, row_number() OVER () - 1 AS _pos "
                f"FROM read_parquet({file_list}, hive_partitioning = false)")
    total = con.execute("SELECT count(*) FROM raw").fetchone()[0]
    n_train, n_before_eval = split_sizes(total, cfg.split.eval_fraction, cfg.split.validation_fraction)
    key = _q(cfg.input.timestamp) if cfg.input.timestamp else "_pos"

    def cutoff_leaving(n: int):  # the smallest key leaving at least n rows before it (ties before), as the job's
        return con.execute(f"SELECT {key} FROM raw ORDER BY {key} LIMIT 1 OFFSET {max(n - 1, 0)}").fetchone()[0]
    cutoff, eval_cutoff = cutoff_leaving(n_train), cutoff_leaving(n_before_eval)
    con.execute(f"CREATE TEMP VIEW train AS SELECT * FROM raw WHERE {key} <= {cutoff}")
    t_split = time.perf_counter()

    for f in cfg.features.sparse:
        limit = f"QUALIFY id < {f.vocab.max_size}" if f.vocab.max_size else ""
        con.execute(
            f"CREATE TEMP TABLE vocab_{f.name} AS SELECT value, cnt, "
            f"row_number() OVER (ORDER BY cnt DESC, value) - 1 AS id FROM ("
            f"SELECT coalesce(CAST({_q(f.column)} AS VARCHAR), '') AS value, count(*) AS cnt FROM train "
            f"GROUP BY 1 HAVING count(*) >= {f.vocab.min_count}) {limit}")
    dense = cfg.features.dense
    stats_sql = ", ".join(f"avg({_prenorm(d)}), stddev_pop({_prenorm(d)})" for d in dense)
    stats = con.execute(f"SELECT {stats_sql} FROM train").fetchone() if dense else ()
    t_analyse = time.perf_counter()

    sizes = {f.name: con.execute(f"SELECT count(*) FROM vocab_{f.name}").fetchone()[0] for f in cfg.features.sparse}
    selects, joins = [], []
    for i, f in enumerate(cfg.features.sparse):
        value = f"coalesce(CAST(r.{_q(f.column)} AS VARCHAR), '')"
        selects.append(f"coalesce(v{i}.id, {sizes[f.name]} + hash({value}) % {f.vocab.oov_buckets}) "
                       f"AS {_q(f.name)}")
        joins.append(f"LEFT JOIN vocab_{f.name} v{i} ON {value} = v{i}.value")
    for j, d in enumerate(dense):
        mean, std = stats[2 * j] or 0.0, stats[2 * j + 1] or 0.0
        std = std if std > 1e-6 else 1.0
        selects.append(f"CAST(({_prenorm(d, 'r.')} - {mean}) / {std} AS FLOAT) AS {_q(d.name)}")
    selects.append(f"CAST(r.{_q(cfg.label.column)} AS FLOAT) AS label")
    body = f"SELECT {', '.join(selects)} FROM raw r {' '.join(joins)}"
    counts = {}
    for split, cond in (("train", f"r.{key} <= {cutoff}"),
                        ("validation", f"r.{key} > {cutoff} AND r.{key} <= {eval_cutoff}"),
                        ("eval", f"r.{key} > {eval_cutoff}")):
        path = os.path.join(out_dir, f"{split}.parquet")
        con.execute(f"COPY ({body} WHERE {cond}) TO {_lit(path)} (FORMAT parquet)")
        counts[split] = con.execute(f"SELECT count(*) FROM read_parquet({_lit(path)})").fetchone()[0]
    t_end = time.perf_counter()
    con.close()
    return {"rows": total, **counts, "vocab_sizes": sizes, "split_s": t_split - t0, "analyse_s": t_analyse - t_split,
            "transform_write_s": t_end - t_analyse, "wall_s": t_end - t0}
