"""The memory bound of the embedding and lifecycle suites: the ratio, each PS task's share of the state, the PS
task processes found below a run, the worst warm-started day, and a memory part merged into an older result."""
from __future__ import annotations

import math

import pytest

from recpipe.bench.lifecycle_memory import merge_memory_growth, warm_day_vs_bound
from recpipe.bench.memory_bound import bound_mb, ps_tasks_vs_bound, rss_vs_bound
from recpipe.bench.ps_memory import descendants, ps_task_of
from recpipe.trainers.strategies.ps_placement import bytes_by_task, parse_state_line, state_line, task_of

pytestmark = pytest.mark.unit


def test_the_bound_is_1_3_times_the_state_plus_800_mb():
    assert bound_mb(1000) == pytest.approx(2100)
    assert rss_vs_bound(2100, 1000) == pytest.approx(1.0)
    assert rss_vs_bound(4000, 2540) == pytest.approx(4000 / 4102)
    assert rss_vs_bound(700, 100, base_mb=570) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        rss_vs_bound(100, 0, base_mb=0)


def test_each_ps_task_is_held_to_its_own_share_and_base():
    got = ps_tasks_vs_bound({"ps:1": {"peak_rss_mb": 2000, "state_mb": 1000, "base_rss_mb": 700},
                             "ps:0": {"peak_rss_mb": 1000, "state_mb": 0, "base_rss_mb": 1000}})
    assert list(got) == ["ps:0", "ps:1"] and got["ps:0"] == 1.0 and got["ps:1"] == pytest.approx(1.0)


def test_variables_are_summed_by_the_task_their_device_names():
    assert task_of("/job:ps/replica:0/task:1/device:CPU:0") == "ps:1"
    assert task_of("/job:worker/task:0") == "worker:0" and task_of("") is None and task_of("/device:CPU:0") is None
    pairs = [("/job:ps/replica:0/task:1/device:CPU:0", 100), ("/job:ps/replica:0/task:0/device:CPU:0", 30),
             ("/job:ps/replica:0/task:1/device:CPU:0", 5), ("/device:CPU:0", 999)]
    assert bytes_by_task(pairs) == {"ps:0": 30, "ps:1": 105}
    line = state_line({"ps:0": 3 << 20, "ps:1": 1 << 19})
    assert parse_state_line(f"train: other\n{line}\ntrain: done") == {"ps:0": 3.0, "ps:1": 0.5}
    assert parse_state_line("train: nothing of the kind") is None


def test_ps_tasks_are_found_below_the_run_only():
    assert ps_task_of(["python", "-m", "recpipe.trainers.strategies.ps", "{}", "ps", "1"]) == "ps:1"
    assert ps_task_of(["python", "-m", "recpipe.trainers.strategies.ps", "{}", "worker", "0"]) is None
    assert ps_task_of(["python", "-m", "recpipe.cli", "train"]) is None
    parents = {10: 1, 11: 10, 12: 11, 13: 11, 20: 1, 21: 20}
    assert descendants(10, parents) == {11, 12, 13} and descendants(21, parents) == set()


def _day(day: str, table_mb: float, peak: float) -> dict:
    return {"day": day, "table_mb": table_mb, "train_peak_rss_mb": peak}


def test_the_worst_warm_started_day_leaves_out_each_chains_first_day():
    runs = {"evict": [_day("d1", 10, 5000), _day("d2", 100, 900)],
            "no_evict": [_day("d1", 10, 700), _day("d2", 200, 1100)]}
    ratio, chain, day = warm_day_vs_bound(runs)
    assert (chain, day) == ("no_evict", "d2") and ratio == pytest.approx(1100 / 1060)
    assert math.isnan(warm_day_vs_bound({"evict": [_day("d1", 10, 700)]})[0])


def test_a_memory_part_measured_again_replaces_the_old_one_and_keeps_the_rest():
    old = {"suite": "lifecycle", "runs": {"drift_evict": []}, "machine": {"date": "then"},
           "ratios": {"lifecycle_skew_checks_passed": 1.0, "lifecycle_rss_mb_per_table_mb": 4.4},
           "memory_growth": {"runs": {}, "ratios": {"lifecycle_rss_mb_per_table_mb": 4.4}}}
    new = {"runs": {"evict": []}, "ratios": {"lifecycle_rss_mb_per_table_mb": 2.0,
                                             "lifecycle_warm_day_rss_vs_bound": 0.9}}
    got = merge_memory_growth(old, new, {"date": "now"})
    assert got["ratios"] == {"lifecycle_skew_checks_passed": 1.0, "lifecycle_rss_mb_per_table_mb": 2.0,
                             "lifecycle_warm_day_rss_vs_bound": 0.9}
    assert got["memory_growth"]["machine"] == {"date": "now"} and got["machine"] == {"date": "then"}
    assert got["runs"] is old["runs"] and old["memory_growth"]["ratios"]["lifecycle_rss_mb_per_table_mb"] == 4.4


def test_the_embedding_suites_memory_figures_merge_into_a_full_runs_result():
    from recpipe.bench.embedding import explain, markdown, merge_memory
    run = {"examples_per_s": {"median": 100.0, "min": 90.0, "max": 110.0}, "eval_auc": {"median": 0.7},
           "peak_rss_mb": {"median": 4000.0, "values": [4000.0]}}
    full = {"runs": {"recpipe_train": run},
            "ratios": {"train_rss_vs_state": 2.0, "train_embedding_heavy_vs_tfrs_fit": 1.2},
            "state_mb": 2000.0, "spec": {"log_rows": 10, "batch_size": 8, "tables": 2, "dim": 4, "bottom_layers": [4],
                                         "deep_layers": [4], "exponent": 1.05, "learning_rate": 0.05, "threads": 2},
            "table_rows": [5, 6], "steps": 10, "reps": 1, "quick": True, "machine": {"cpus": 2, "cpu": "test"},
            "params": {"recpipe": {"embedding": 44, "dense": 10, "embedding_vs_dense": 4.4},
                       "triangle": {"dense": 8}}, "torchrec": {}, "parts": {}}
    memory = {"steps": 10, "reps": 3, "state_mb": 2000.0,
              "recpipe_train": {**run, "peak_rss_mb": {"median": 3000.0, "values": [3000.0, 2990.0, 3010.0]}},
              "ps_memory": {}, "ratios": {"train_rss_vs_state": 1.5, "train_rss_vs_bound": 3000 / 3400}}
    got = merge_memory(full, memory, {"date": "now", "git_commit": "abc"})
    assert got["ratios"] == {"train_rss_vs_state": 1.5, "train_embedding_heavy_vs_tfrs_fit": 1.2,
                             "train_rss_vs_bound": pytest.approx(3000 / 3400)}
    assert got["runs"] is full["runs"] and got["memory_run"]["machine"]["date"] == "now"
    assert "3,000 MB" in explain("train_rss_vs_bound", got) and "measured alone on now" in markdown(got)
