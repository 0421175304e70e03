"""`recpipe bench scaling`: the log-log slope fit, the ratios and the report of a result, and the quick suite end
to end (its full run takes about 25 minutes and is not part of CI)."""
from __future__ import annotations

import math

import pytest

from recpipe.bench.scaling import bench_scaling, options_for
from recpipe.bench.scaling_report import PNG, growth_words, loglog_slope, marginal_rate, markdown, ratios, write_png


def _result() -> dict:
    """A result whose DirectRunner time is linear in rows (10 s per million after 5 s), RSS flat, Dask's one
    point, and training whose RSS is a base plus the state."""
    direct = [{"rows": n, "wall_s": 5 + n / 1e5, "rows_per_s": n / (5 + n / 1e5), "peak_rss_mb": 900.0,
               "largest_process_rss_mb": 900.0, "cpu_s": 10.0, "input_bytes": n * 60, "output_bytes": n * 80}
              for n in (1_000_000, 10_000_000, 50_000_000)]
    train = [{"table_rows": n, "wall_s": 20 + n / 1e6, "examples_per_s": 3e4, "examples_per_s_steady": 4e4,
              "peak_rss_mb": 800 + 1.5 * n * 64 / 2**20, "largest_process_rss_mb": 800.0, "cpu_s": 30.0,
              "state_mb": n * 64 / 2**20, "model_dir_bytes": n * 64, "preprocess_s": 8.0}
             for n in (1_000_000, 10_000_000, 50_000_000)]
    r = {"suite": "scaling", "quick": False, "left_out": {"dask": [10_000_000, 50_000_000]},
         "preprocess": {"config": "criteo.yaml", "dask_workers": 2, "generate_s": {},
                        "points": {"direct": direct, "dask": [dict(direct[0], wall_s=15.0)]}},
         "train": {"dim": 8, "steps": 300, "batch_size": 1024, "log_rows": 400_000, "points": train},
         "machine": {"cpus": 2, "cpu": "test", "memory_gib": 23.5}}
    r.update(ratios(r))
    return r


@pytest.mark.unit
def test_the_slope_of_a_power_law_is_its_exponent():
    xs = [1e6, 1e7, 5e7]
    for exponent in (0.0, 0.5, 1.0, 2.0):
        slope, intercept = loglog_slope(xs, [3 * x ** exponent for x in xs])
        assert slope == pytest.approx(exponent) and intercept == pytest.approx(math.log10(3))
    assert all(math.isnan(v) for v in loglog_slope([1e6, 1e6], [1.0, 2.0]))  # one size: no slope
    with pytest.raises(ValueError, match="positive"):
        loglog_slope([0, 1], [1, 1])
    with pytest.raises(ValueError, match="2 sizes against 1 costs"):
        loglog_slope([1, 2], [1])


@pytest.mark.unit
def test_the_ratios_and_the_marginal_rate_come_from_the_points():
    r = _result()
    found = r["ratios"]
    assert found["scaling_preprocess_rss_slope_direct"] == pytest.approx(0.0)
    assert 0.7 < found["scaling_preprocess_time_slope_direct"] < 1.0  # the 5 s start-up bends it below 1
    assert math.isnan(found["scaling_preprocess_time_slope_dask"])  # one point
    assert found["scaling_train_rss_mb_per_state_mb"] == pytest.approx(1.5)
    assert marginal_rate(r["preprocess"]["points"]["direct"], "rows") == pytest.approx(1e5)
    assert math.isnan(marginal_rate(r["preprocess"]["points"]["dask"], "rows"))
    assert r["slopes"]["scaling_train_rss_slope"]["points"] == 3
    assert [growth_words(s, "rss") for s in (0.05, 0.15, 0.5, 1.0)] == ["flat", "nearly flat", "sublinear",
                                                                        "linear"]
    assert [growth_words(s, "time") for s in (0.5, 1.0, 1.3)] == ["sublinear", "linear", "superlinear"]


@pytest.mark.unit
def test_the_report_says_the_result_in_words_and_names_what_was_left_out(tmp_path):
    r = _result()
    text = markdown(r)
    assert text.startswith("# How cost grows")
    assert "Peak RSS of the process tree grows as rows^0.00 (flat" in text
    assert "100,000 rows/s between the two largest points" in text
    assert "Left out: the Dask runner at 10,000,000, 50,000,000 rows" in text
    assert "width 8" in text and f"]({PNG})" in text
    assert "1.50 MB per MB of weights and Adagrad slots" in text
    assert write_png(r, str(tmp_path)) == str(tmp_path / PNG)
    assert (tmp_path / PNG).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.bench
def test_quick_scaling_suite_measures_every_point_and_deletes_its_data(tmp_path):
    o = options_for(quick=True)
    result = bench_scaling(o, str(tmp_path), print)
    points = result["preprocess"]["points"]
    assert [p["rows"] for p in points["direct"]] == list(o.log_rows) == [p["rows"] for p in points["dask"]]
    assert [p["table_rows"] for p in result["train"]["points"]] == list(o.table_rows)
    every = [*points["direct"], *points["dask"], *result["train"]["points"]]
    assert all(p["wall_s"] > 0 and p["peak_rss_mb"] > 100 for p in every)
    assert all(p["input_bytes"] > 0 and p["output_bytes"] > 0 for p in [*points["direct"], *points["dask"]])
    assert all(p["model_dir_bytes"] > 0 for p in result["train"]["points"])
    assert all(math.isfinite(v) for v in result["ratios"].values()) and len(result["ratios"]) == 7
    assert list(tmp_path.iterdir()) == []  # every point's log, shards and model dir deleted
