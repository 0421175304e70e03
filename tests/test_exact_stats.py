"""What the preprocess job reduces across bundles comes out the same however a runner splits the batches into
bundles and in whatever order it merges the partial results (Beam's combiners: create, add, merge, extract),
and is what it claims to be: dense statistics from exact sums, bucket boundaries within a bin of the exact
quantiles, the eval sample the first eval rows of the input."""
from __future__ import annotations

import functools
import itertools
import json
import math
import operator
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recpipe.features.config import parse_config
from recpipe.pipeline.analysis import (Moments, QuantileSketch, batch_dense_stats, dense_stats, merge_dense_stats,
                                       moment_stats, moments_of, sketch_boundaries)
from recpipe.pipeline.transforms import _FirstRows, _MergeDicts

pytestmark = pytest.mark.unit

CFG = parse_config({"name": "t", "label": {"column": "label"}, "features": {"sparse": [], "dense": [
    {"name": "x", "column": "x", "transform": "zscore"},
    {"name": "y", "column": "y", "transform": "log_zscore", "fill": 1.0},
    {"name": "b", "column": "b", "transform": "bucketize", "num_buckets": 4}]}})

# any float32 (subnormals, the largest, -0.0), and the kind of values a click log holds
_ANY32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
_VALUES = st.one_of(_ANY32, st.integers(0, 5000).map(float), st.floats(-1e6, 1e6, width=32))


@st.composite
def _batch(draw) -> dict[str, pa.Array]:
    """A canonical batch of the three dense columns (float64, nulls for missing values)."""
    n = draw(st.integers(1, 40))
    column = st.lists(st.one_of(_VALUES, st.none()), min_size=n, max_size=n)
    return {name: pa.array(draw(column), pa.float64()) for name in ("x", "y", "b")}


def _combine(fn, partials: list, data) -> dict:
    """`partials` reduced as a runner may: in a drawn order, cut into drawn bundles (each folded with
    add_input from a fresh accumulator), whose accumulators are merged in a drawn order and tree."""
    order = data.draw(st.permutations(partials), "order")
    cuts = sorted(data.draw(st.sets(st.integers(1, max(len(order) - 1, 1)), max_size=len(order)), "bundles"))
    accs = []
    for lo, hi in zip([0, *cuts], [*cuts, len(order)]):
        acc = fn.create_accumulator()
        for item in order[lo:hi]:
            acc = fn.add_input(acc, item)
        accs.append(acc)
    while len(accs) > 1:  # merge a drawn run of neighbours, until one is left
        start = data.draw(st.integers(0, len(accs) - 2))
        stop = data.draw(st.integers(start + 2, len(accs)))
        accs[start:stop] = [fn.merge_accumulators(accs[start:stop])]
    return fn.extract_output(accs[0])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_batch(), min_size=1, max_size=8), st.data())
def test_dense_statistics_are_the_same_bytes_for_any_bundles_and_order(batches, data):
    partials = [batch_dense_stats(cols, CFG) for cols in batches]
    fn = _MergeDicts(operator.add, functools.partial(dense_stats, cfg=CFG))
    in_order = fn.extract_output(functools.reduce(fn.add_input, partials, fn.create_accumulator()))
    again = _combine(_MergeDicts(operator.add, functools.partial(dense_stats, cfg=CFG)), partials, data)
    assert json.dumps(again, sort_keys=True) == json.dumps(in_order, sort_keys=True)
    assert sorted(in_order) == ["b", "x", "y"] and in_order["x"]["count"] == sum(len(b["x"]) for b in batches)


@settings(max_examples=300, deadline=None)
@given(st.lists(_ANY32, min_size=1, max_size=60) | st.lists(st.floats(-60, 60, width=32), min_size=1, max_size=60))
def test_mean_and_std_are_the_exact_ones_rounded(values):
    """Any float32 values (and values of magnitudes within 2**6, summed as plain floats): the mean is their
    exact mean rounded once, the std the square root of their exact variance rounded once (so no grouping
    or order can change them)."""
    stats = moment_stats({"v": moments_of(np.asarray(values, np.float32))})["v"]
    exact = [Fraction(float(np.float32(v))) for v in values]
    mean = sum(exact) / len(exact)
    assert stats["count"] == len(values)
    assert stats["mean"] == float(mean)
    assert stats["std"] == math.sqrt(float(sum(v * v for v in exact) / len(exact) - mean * mean))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=200))
def test_mean_and_std_are_numpys_to_rounding(values):
    x = np.asarray(values, np.float32).astype(np.float64)
    stats = moment_stats({"v": moments_of(x.astype(np.float32))})["v"]
    scale = float(np.abs(x).max()) or 1.0
    assert math.isclose(stats["mean"], float(np.mean(x)), rel_tol=1e-12, abs_tol=1e-12 * scale)
    assert math.isclose(stats["std"], float(np.std(x)), rel_tol=1e-9, abs_tol=1e-9 * scale)


def test_a_large_batch_sums_exactly():
    """Values summed in chunks (a million and more) and values of every magnitude in one batch."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(1_200_000) * 10.0 ** rng.integers(-20, 20, 1_200_000)).astype(np.float32)
    whole = moments_of(x)
    assert whole == moments_of(x[:700_000]) + moments_of(x[700_000:]) == moments_of(x[::-1].copy())
    rounded_sum = math.fsum(x.astype(np.float64).tolist())  # the exact sum, rounded once
    assert math.isclose(moment_stats({"v": whole})["v"]["mean"], rounded_sum / len(x), rel_tol=4e-16)


def test_a_non_finite_value_gives_non_finite_statistics_in_any_order():
    parts = [moments_of(np.array(v, np.float32)) for v in ([1, np.inf], [2, -np.inf], [3, 4])]
    for order in itertools.permutations(parts):
        stats = moment_stats({"v": sum(order, Moments())})["v"]
        assert math.isnan(stats["mean"]) and math.isnan(stats["std"]) and stats["count"] == 6
    stats = moment_stats({"v": moments_of(np.array([1, np.inf], np.float32))})["v"]
    assert stats["mean"] == math.inf and math.isnan(stats["std"])
    assert moment_stats({"v": Moments()})["v"] == {"mean": 0.0, "std": 1.0, "count": 0}


def test_moments_and_sketches_take_float32_only():
    with pytest.raises(TypeError, match="float32"):
        moments_of(np.array([1.0]))
    with pytest.raises(TypeError, match="float32"):
        QuantileSketch.of(np.array([1.0]))
    with pytest.raises(ValueError, match="NaN"):
        QuantileSketch.of(np.array([1.0, np.nan], np.float32))


def _exact_ranks(x: np.ndarray, num_buckets: int) -> list[float]:
    ordered = np.sort(x)
    return [float(ordered[(i * len(x) - 1) // num_buckets]) for i in range(1, num_buckets)]


def test_bucket_boundaries_are_the_exact_quantiles_within_a_bin():
    rng = np.random.default_rng(7)
    counts = rng.poisson(30, 50_000) - 10.0  # integers of at most 12 bits have a bin each: exact
    counts = counts.astype(np.float32)
    for buckets in (2, 5, 10):
        assert sketch_boundaries(QuantileSketch.of(counts), buckets) == sorted(set(_exact_ranks(counts, buckets)))
    wide = np.concatenate([-rng.lognormal(0, 3, 20_000), rng.lognormal(0, 3, 30_000), np.zeros(50)]
                          ).astype(np.float32)
    for buckets in (4, 10, 50):
        got, want = sketch_boundaries(QuantileSketch.of(wide), buckets), _exact_ranks(wide, buckets)
        assert len(got) == len(want) == buckets - 1
        for g, w in zip(got, want):  # the exact quantile cut toward zero to 12 significant bits
            assert math.copysign(1, g) == math.copysign(1, w) and abs(g) <= abs(w), (g, w)
            assert abs(w - g) <= abs(w) * 2.0 ** -11, (g, w)


def test_the_sketch_orders_infinities_and_signed_zeros():
    x = np.array([-np.inf] * 3 + [0.0] * 3 + [-0.0] * 3 + [np.inf] * 3, np.float32)
    assert sketch_boundaries(QuantileSketch.of(x), 4) == [-math.inf, 0.0]
    assert math.copysign(1.0, sketch_boundaries(QuantileSketch.of(x), 4)[1]) == 1.0  # -0.0 counts as 0.0
    assert sketch_boundaries(QuantileSketch.of(np.array([-3.0, -3.0, 2.0], np.float32)), 2) == [-3.0]
    assert sketch_boundaries(QuantileSketch(), 4) == []
    assert dense_stats({}, CFG) == {"b": {"boundaries": []}}


def test_merged_days_are_the_statistics_of_both_days_values():
    rng = np.random.default_rng(3)
    one, two = rng.normal(5, 2, 1000).astype(np.float32), rng.normal(8, 1, 3000).astype(np.float32)
    day_one, day_two = (moment_stats({"v": moments_of(v)}) for v in (one, two))
    merged = merge_dense_stats(day_one, day_two)["v"]
    both = moment_stats({"v": moments_of(np.concatenate([one, two]))})["v"]
    assert merged["count"] == 4000
    assert math.isclose(merged["mean"], both["mean"], rel_tol=1e-15)
    assert math.isclose(merged["std"], both["std"], rel_tol=1e-14)
    assert merge_dense_stats(day_two, day_one)["v"] == merged  # exact, so the same floats either way


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=8), st.integers(1, 40), st.data())
def test_the_eval_sample_is_the_first_eval_rows_whatever_the_bundles(sizes, n, data):
    """Batches of eval rows (global row numbers ascending in each, batches of any files): the sample is the
    n rows with the lowest row numbers, in row order."""
    rows = data.draw(st.lists(st.integers(0, 10_000), min_size=sum(sizes), max_size=sum(sizes), unique=True))
    batches, start = [], 0
    for size in sizes:
        positions = np.array(sorted(rows[start:start + size]), np.int64)
        batches.append((positions, pa.table({"row": positions, "tag": [f"r{p}" for p in positions]})))
        start += size
    sample = _combine(_FirstRows(n), batches, data)
    assert sample.column("row").to_pylist() == sorted(rows)[:n]
    assert sample.column("tag").to_pylist() == [f"r{p}" for p in sorted(rows)[:n]]
