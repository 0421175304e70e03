"""A synthetic Criteo-like click log, written as date-partitioned Parquet.

Columns: ts (int64 epoch s), label (0/1), user_id, item_id, C1..C26 (Zipf-like strings),
I1..I13 (int64 counts with nulls), hist_items (list<string>). Labels are Bernoulli(sigmoid(logit))
of a hidden model with additive AND interaction terms, so a model that learns the features reaches
an AUC well above 0.5, and one that learns interactions goes further than logistic regression can:

  logit = bias + w_user[u] + w_item[i] + sum_{j<6} w_cat_j[C_j] + sum_{j<4} w_dense_j * z(I_j)  (additive)
        + AFFINITY * <taste[u], topic[i]>        user taste x item topic (4 latent dims, N(0, 1) each)
        + w_pair[C1 % 8, C2 % 8]                  a pairwise interaction of two categorical features
        + 0.35 * min(#history items of the item's genre (index mod 7), 3)   history x candidate

Logistic regression on one-hot features sees only the additive part; embeddings (dot products,
DCN-v2's cross layers, two towers) can learn the rest.

Item drift (`item_drift` > 0): the catalogue holds num_items + item_drift * (days - 1) items and day d
draws its items (and histories) from the window of num_items starting at d * item_drift: every day the
item_drift oldest items stop and item_drift new ones appear. How popular an item is (`item_popularity`):
- "window": Zipf-ranked from the window's start, so the stopping items are the day's most clicked, new
  ones appear at the tail, and popularity moves on to items that were rarer the day before;
- "lifelong": each item keeps one Zipf rank from its first day to its last (the first num_items items'
  ranks a seeded permutation; a new item takes the rank of the one it replaces), so the items that stop
  take a random share of the clicks (item_drift / num_items of them on average). Without drift this is
  the "window" log's items relabelled; with or without drift, day 1 is the same log.

`truth_column`: each row also carries p_click, the probability its label was drawn with, so a
benchmark can score the hidden model itself (the best AUC any model can reach on those rows). No
config reads it; the label and every other column are the same with or without it.
"""
from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["GenerateSpec", "generate_log", "NUM_CATEGORICAL", "NUM_DENSE", "TRUTH_COLUMN", "SUCCESS_MARKER",
           "ITEM_POPULARITY"]

NUM_CATEGORICAL = 26
NUM_DENSE = 13
_SECONDS_PER_DAY = 86_400
AFFINITY = 1.0
SUCCESS_MARKER = "_SUCCESS"  # written into each day's partition after its files, as Hadoop's committers do
TRUTH_COLUMN = "p_click"  # GenerateSpec.truth_column: the hidden model's probability, for oracle metrics
LATENT_DIMS = 4
ITEM_POPULARITY = ("window", "lifelong")


@dataclass(frozen=True)
class GenerateSpec:
    rows: int
    days: int = 1
    seed: int = 0
    start_date: dt.date = dt.date(2026, 1, 1)
    num_users: int = 20_000
    num_items: int = 5_000
    max_history: int = 10
    rows_per_file: int = 1_000_000
    item_drift: int = 0        # items per day the active item window moves on (module docstring)
    truth_column: bool = False  # also write p_click, each row's click probability under the hidden model
    item_popularity: str = "window"  # "window" | "lifelong": how an item's popularity moves (module docstring)
    bias: float = -1.9  # the hidden model's bias: lower for rarer clicks (-1.9: about 29 % of rows clicked, -6: 5 %)

    def catalogue_items(self) -> int:
        return self.num_items + self.item_drift * (self.days - 1)


def _zipf_index(rng: np.random.Generator, n: int, cardinality: int, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, cardinality + 1) ** exponent
    cdf = np.cumsum(weights / weights.sum())
    idx = np.searchsorted(cdf, rng.random(n), side="right")
    return np.minimum(idx, cardinality - 1)


def _items_of_ranks(spec: GenerateSpec, ranks: np.ndarray, window_start: int) -> np.ndarray:
    """The catalogue indices of the items holding these Zipf ranks on the day whose active window starts at
    window_start. "lifelong": item j's rank is rank_of[j % num_items] (each index of the window leaves a
    different remainder, so the window holds every rank once), whatever the day."""
    if spec.item_popularity == "window":
        return window_start + ranks
    rank_of = np.random.default_rng(spec.seed + 3_000_017).permutation(spec.num_items)
    remainder = np.argsort(rank_of)[ranks]
    return window_start + (remainder - window_start) % spec.num_items


def _dictionary(prefix: str, cardinality: int, rng: np.random.Generator) -> pa.Array:
    # Hex-looking tokens like Criteo's hashed categoricals, unique per position.
    codes = rng.permutation(cardinality * 16)[:cardinality] + 0x10000000
    return pa.array([f"{prefix}{c:08x}" for c in codes], pa.string())


def _columns(spec: GenerateSpec, n: int, rng: np.random.Generator, hidden: dict, item_offset: int = 0
             ) -> dict[str, pa.Array]:
    cols: dict[str, pa.Array] = {}
    logit = np.full(n, hidden["bias"])

    user = _zipf_index(rng, n, spec.num_users, 0.9)
    item = _items_of_ranks(spec, _zipf_index(rng, n, spec.num_items, 1.05), item_offset)
    cols["user_id"] = pc.take(hidden["users"], pa.array(user))
    cols["item_id"] = pc.take(hidden["items"], pa.array(item))
    logit += hidden["w_user"][user] + hidden["w_item"][item]
    logit += AFFINITY * np.einsum("nk,nk->n", hidden["taste"][user], hidden["topic"][item])
    picked = {}

    for j, (card, expo) in enumerate(hidden["cat_shapes"]):
        idx = _zipf_index(rng, n, card, expo)
        arr = pc.take(hidden["cat_dicts"][j], pa.array(idx))
        null_mask = rng.random(n) < 0.04
        cols[f"C{j + 1}"] = pc.if_else(pa.array(null_mask), pa.scalar(None, pa.string()), arr)
        if j < 6:
            logit += hidden["w_cat"][j][idx]
        if j < 2:
            picked[j] = idx

    logit += hidden["w_pair"][picked[0] % 8, picked[1] % 8]
    for j in range(NUM_DENSE):
        val = np.floor(rng.lognormal(mean=1.0 + 0.2 * j, sigma=1.2, size=n)).astype(np.int64)
        missing = rng.random(n) < 0.08 + 0.02 * (j % 4)
        if j < 4:
            z = (np.log1p(val) - (1.0 + 0.2 * j)) / 1.2
            logit += np.where(missing, 0.0, hidden["w_dense"][j] * z)
        cols[f"I{j + 1}"] = pa.array(val, pa.int64(), mask=missing)

    lengths = rng.integers(0, spec.max_history + 1, size=n)
    hist = _items_of_ranks(spec, _zipf_index(rng, int(lengths.sum()), spec.num_items, 1.05), item_offset)
    # Users who saw an item of the same "genre" (item index mod 7) click it more often.
    same = (hist % 7) == np.repeat(item % 7, lengths)
    row_of = np.repeat(np.arange(n), lengths)
    logit += 0.35 * np.minimum(np.bincount(row_of[same], minlength=n), 3)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    cols["hist_items"] = pa.ListArray.from_arrays(pa.array(offsets), pc.take(hidden["items"], pa.array(hist)))

    prob = 1.0 / (1.0 + np.exp(-logit))
    cols["label"] = pa.array((rng.random(n) < prob).astype(np.int64))
    if spec.truth_column:
        cols[TRUTH_COLUMN] = pa.array(prob)
    return cols


def _with_drift_items(spec: GenerateSpec, hidden: dict) -> dict:
    """The catalogue's items past the first num_items (item drift), drawn from their own stream, so
    the first num_items items and everything else equal the drift-free log's (day 1 is the same)."""
    extra = spec.catalogue_items() - spec.num_items
    if extra <= 0:
        return hidden
    rng = np.random.default_rng(spec.seed + 2_000_029)
    return {**hidden, "items": pa.concat_arrays([hidden["items"], _dictionary("j", extra, rng)]),
            "w_item": np.concatenate([hidden["w_item"], rng.normal(0, 0.8, extra)]),
            "topic": np.concatenate([hidden["topic"], rng.normal(0, 1, (extra, LATENT_DIMS))])}


def _hidden_model(spec: GenerateSpec) -> dict:
    rng = np.random.default_rng(spec.seed + 1_000_003)
    shapes = [(int(c), float(e)) for c, e in zip(
        rng.choice([3, 20, 100, 500, 2_000, 10_000, 50_000], size=NUM_CATEGORICAL),
        rng.uniform(0.8, 1.3, size=NUM_CATEGORICAL))]
    return {
        "bias": float(spec.bias),
        "users": _dictionary("u", spec.num_users, rng),
        "items": _dictionary("i", spec.num_items, rng),
        "w_user": rng.normal(0, 0.5, spec.num_users),
        "w_item": rng.normal(0, 0.8, spec.num_items),
        "cat_shapes": shapes,
        "cat_dicts": [_dictionary("", c, rng) for c, _ in shapes],
        "w_cat": [rng.normal(0, 0.6, c) for c, _ in shapes[:6]],
        "w_dense": rng.normal(0, 0.6, NUM_DENSE),
        # drawn last, so the additive part above is the same as before these were added
        "taste": rng.normal(0, 1, (spec.num_users, LATENT_DIMS)),
        "topic": rng.normal(0, 1, (spec.num_items, LATENT_DIMS)),
        "w_pair": rng.normal(0, 1.0, (8, 8)),
    }


def generate_log(spec: GenerateSpec, out_dir: str, say=None) -> list[str]:
    """Write spec.rows rows over spec.days days, each day's partition marked complete (SUCCESS_MARKER)
    after its files; return the Parquet files written (sorted)."""
    if spec.rows <= 0 or spec.days <= 0:
        raise ValueError(f"rows and days must be positive (got rows={spec.rows}, days={spec.days})")
    if spec.item_popularity not in ITEM_POPULARITY:
        raise ValueError(f"item_popularity must be one of {', '.join(ITEM_POPULARITY)} (got {spec.item_popularity!r})")
    hidden = _with_drift_items(spec, _hidden_model(spec))
    rng = np.random.default_rng(spec.seed)
    per_day = np.full(spec.days, spec.rows // spec.days)
    per_day[: spec.rows % spec.days] += 1
    written = []
    order = ["ts", "label", "user_id", "item_id", *[f"C{j + 1}" for j in range(NUM_CATEGORICAL)],
             *[f"I{j + 1}" for j in range(NUM_DENSE)], "hist_items", *([TRUTH_COLUMN] if spec.truth_column else [])]
    for day, n_day in enumerate(per_day):
        date = spec.start_date + dt.timedelta(days=day)
        day_dir = os.path.join(out_dir, f"dt={date.isoformat()}")
        os.makedirs(day_dir, exist_ok=True)
        day_start = int(dt.datetime(date.year, date.month, date.day, tzinfo=dt.timezone.utc).timestamp())
        for part, start in enumerate(range(0, int(n_day), spec.rows_per_file)):
            n = int(min(spec.rows_per_file, n_day - start))
            cols = _columns(spec, n, rng, hidden, item_offset=day * spec.item_drift)
            lo = start * _SECONDS_PER_DAY // max(int(n_day), 1)
            hi = (start + n) * _SECONDS_PER_DAY // max(int(n_day), 1)
            cols["ts"] = pa.array(np.sort(rng.integers(day_start + lo, day_start + max(hi, lo + 1), size=n)))
            table = pa.table({k: cols[k] for k in order})
            path = os.path.join(day_dir, f"part-{part:05d}.parquet")
            pq.write_table(table, path, row_group_size=128 * 1024)
            written.append(path)
            if say:
                say(f"wrote {path} ({n} rows)")
        open(os.path.join(day_dir, SUCCESS_MARKER), "w").close()  # the day is complete, as Spark marks it
    return sorted(written)
