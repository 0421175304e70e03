"""`recpipe bench embedding`: the embedding-heavy model's sizes, the Zipf log, the ratios, the TorchRec peer's
request and response (its script runs in an environment of its own, kept out of CI: 5.5 GB), and the quick
suite end to end with the TFRS-tutorial peer."""
from __future__ import annotations

import ast
import json
import math
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from recpipe.bench.embedding import (STEP_GROUPS, EmbeddingBenchOptions, bench_embedding, explain,
                                     markdown, ratios, spec_for)
from recpipe.bench.embedding_model import EmbeddingHeavySpec, bench_config, param_counts, state_bytes, table_rows
from recpipe.bench.isolated_env import plan_key
from recpipe.bench.torchrec_peer import SCRIPT, TORCHREC_PLAN, read_response, torchrec_request
from recpipe.bench.zipf_log import truncated_zipf, write_zipf_log
from recpipe.common.metrics import roc_auc
from recpipe.features.config import parse_config


@pytest.mark.unit
@pytest.mark.parametrize("quick", [False, True])
def test_the_model_is_embedding_heavy(quick):
    spec = spec_for(EmbeddingBenchOptions(quick=quick))
    rows = table_rows(spec)
    assert len(rows) == 26 and sum(rows) == spec.total_rows and rows == sorted(rows) and rows[0] >= spec.smallest
    assert spec.total_rows >= (100_000 if quick else 10_000_000) and 32 <= spec.dim <= 64
    p = param_counts(spec)
    assert p["embedding_vs_dense"] >= 20
    assert state_bytes(spec) == 8 * (p["embedding"] + p["dense"])


@pytest.mark.unit
def test_dense_parameters_match_torchrecs_dlrm_count():
    """torchrec.models.dlrm.DLRM(dense_arch [64, 32], over_arch [256, 128, 1], 26 features) has 134,305
    parameters besides its tables (counted in the TorchRec environment), as recpipe's DLRM has."""
    spec = EmbeddingHeavySpec()
    assert param_counts(spec)["dense"] == 134_305
    with pytest.raises(ValueError, match="cannot hold"):
        table_rows(EmbeddingHeavySpec(total_rows=1_000))


@pytest.mark.unit
def test_the_config_is_a_valid_dlrm_with_the_tables_sizes():
    spec = EmbeddingHeavySpec(total_rows=260_000, smallest=100)
    cfg = parse_config(bench_config(spec))
    assert cfg.model.type == "dlrm" and cfg.model.deep_layers == [256, 128]
    assert [f.hash_buckets for f in cfg.features.sparse] == table_rows(spec)
    assert {f.embedding_dim for f in cfg.features.sparse} == {32} and len(cfg.features.dense) == 13
    assert cfg.train.tuning.intra_op_threads == cfg.train.tuning.inter_op_threads == spec.threads


@pytest.mark.unit
def test_truncated_zipf_has_the_law_s_head_and_range():
    rng = np.random.default_rng(0)
    for exponent in (1.0, 1.05, 1.5):
        ranks = truncated_zipf(rng, 400_000, 10_000, exponent)
        assert truncated_zipf(rng, 1_000, 3, exponent).max() <= 2
        assert ranks.shape == (400_000,) and ranks.dtype == np.int64
        assert ranks.min() == 0 and ranks.max() < 10_000
        counts = np.bincount(ranks, minlength=10_000)
        law = 1.0 / np.arange(1, 10_001) ** exponent
        law /= law.sum()
        # the head follows the discrete law, the tail's mass too, and frequency falls with rank
        assert counts[0] / 400_000 == pytest.approx(law[0], rel=0.05)
        assert counts[5_000:].sum() / 400_000 == pytest.approx(law[5_000:].sum(), rel=0.05)
        assert counts[0] > counts[9] > counts[99] > counts[999]
    with pytest.raises(ValueError):
        truncated_zipf(rng, 10, 0, 1.1)


@pytest.mark.unit
def test_the_zipf_log_is_two_days_of_skewed_ids_with_a_learnable_label(tmp_path):
    spec = EmbeddingHeavySpec(total_rows=26_000, smallest=100, log_rows=20_000)
    out = write_zipf_log(spec, str(tmp_path / "log"), file_rows=6_000)
    days = sorted(p.name for p in (tmp_path / "log").iterdir())
    assert days == ["dt=2026-01-01", "dt=2026-01-02"]
    table = pq.ParquetDataset(out).read()
    assert table.num_rows == 20_000
    assert {"label", "ts", *[f"C{i}" for i in range(1, 27)], *[f"I{i}" for i in range(1, 14)]} <= set(
        table.column_names)
    ids = table.column("C26").to_numpy()
    _, counts = np.unique(ids, return_counts=True)
    assert counts.max() > 100 * np.median(counts)  # a head and a long tail
    assert len(counts) <= table_rows(spec)[-1]
    label = table.column("label").to_numpy()
    assert 0.1 < label.mean() < 0.5


def _run(rate: float, auc: float, rss: float) -> dict:
    return {"examples_per_s": {"median": rate}, "eval_auc": {"median": auc}, "peak_rss_mb": {"median": rss}}


@pytest.mark.unit
def test_ratios_set_ours_against_each_peer_that_ran():
    runs = {"recpipe_train": _run(30_000, 0.72, 4_000), "tfrs_fit": _run(15_000, 0.70, 5_000)}
    got = ratios(runs, state_mb=2_000)
    assert got == {"train_rss_vs_state": 2.0, "train_rss_vs_bound": pytest.approx(4_000 / 3_400),
                   "train_embedding_heavy_vs_tfrs_fit": 2.0,
                   "train_embedding_heavy_vs_tfrs_fit_auc": pytest.approx(0.72 / 0.70)}
    runs["torchrec"] = _run(40_000, 0.72, 3_000)
    got = ratios(runs, state_mb=2_000)
    assert got["train_embedding_heavy_vs_torchrec"] == 0.75 and got["train_embedding_heavy_vs_torchrec_auc"] == 1.0


@pytest.mark.unit
def test_a_speed_ratio_is_explained_by_our_steps_parts():
    runs = {"recpipe_train": _run(60_000, 0.68, 3_800), "tfrs_fit": _run(50_000, 0.67, 10_000)}
    r = {"runs": runs, "spec": {"batch_size": 1024}, "ratios": ratios(runs, state_mb=2_500)}
    assert "Split on" not in explain("train_embedding_heavy_vs_tfrs_fit", r)  # no parts measured: none told
    r["parts"] = {"recpipe_ms": {"input": 0.3, "lookup_forward": 1.7, "interaction": 3.5, "mlp": 5.5,
                                 "dense_optimizer": 1.1, "sparse_optimizer": 1.8, "step": 14.5,
                                 "lookup_backward_sparse_update_loss": 2.7}, "torchrec_ms": None}
    text = explain("train_embedding_heavy_vs_tfrs_fit", r)
    # 1.5x the peer's 20.5 ms per step of 1024
    assert "target's 13.7 ms per step" in text and "compiled step takes 14.5 ms" in text and "9.0 ms" in text
    assert "leave 4.7 ms" in text and "2.6 ms outside it (17.1 all in)" in text  # 60,000 ex/s: 17.1 ms a step
    assert text.index("bottom and top MLPs") < text.index("dot interaction")  # largest part first
    assert "Profiled" not in text
    runs["recpipe_train"] = _run(80_000, 0.68, 3_800)  # 12.8 ms a step: below the step timed one call per step
    text = explain("train_embedding_heavy_vs_tfrs_fit", r)
    assert "outside it" not in text and "takes 1.7 ms less per step than this step timed one call per step" in text
    assert "(12.8 all in: the call's dispatch" in text
    runs["recpipe_train"] = _run(60_000, 0.68, 3_800)
    r["parts"]["recpipe_detail"] = {"step_kernel_ms": {"mlps": 7.0, "tables_adagrad": 5.0, "lookup_forward": 10.0}}
    text = explain("train_embedding_heavy_vs_tfrs_fit", r)
    assert "kernels take 22.0 ms per step summed over both threads" in text
    assert text.index("ID dedup and lookups, forward") < text.index("the MLPs and the logit 7.0") < text.index(
        "the tables' Adagrad (accumulator rows")


def _request_keys(tree: ast.AST) -> set[str]:
    """Every req["key"] the TorchRec script reads."""
    return {n.slice.value for n in ast.walk(tree) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
            and n.value.id == "req" and isinstance(n.slice, ast.Constant)}


@pytest.mark.unit
def test_the_torchrec_request_carries_every_key_the_script_reads(tmp_path):
    spec = EmbeddingHeavySpec(total_rows=26_000, smallest=100)
    req = torchrec_request(spec, table_rows(spec), 40, str(tmp_path), "run-0", parts=(2, 5))
    with open(SCRIPT) as fh:
        read = _request_keys(ast.parse(fh.read()))
    assert read and read <= set(req), read - set(req)
    assert json.loads(json.dumps(req)) == req
    assert req["tables"] == table_rows(spec) and req["features"][0] == "C1" and req["parts_steps"] == 5
    with pytest.raises(ValueError, match="adagrad or rowwise_adagrad"):
        torchrec_request(spec, table_rows(spec), 40, str(tmp_path), "x", optimizer="adam")
    with pytest.raises(ValueError, match="table sizes"):
        torchrec_request(spec, [10, 20], 40, str(tmp_path), "x")


@pytest.mark.unit
def test_the_torchrec_response_is_scored_on_the_eval_labels(tmp_path):
    spec = EmbeddingHeavySpec(total_rows=26_000, smallest=100)
    req = torchrec_request(spec, table_rows(spec), 40, str(tmp_path), "run-0")
    rng = np.random.default_rng(1)
    y = (rng.random(500) < 0.3).astype(np.float32)
    p = np.clip(0.3 + 0.2 * (y - 0.3) + 0.1 * rng.standard_normal(500), 0.01, 0.99).astype(np.float32)
    np.savez(req["eval"], sparse=np.zeros((500, 26), np.int64), dense=np.zeros((500, 13), np.float32), label=y)
    np.save(req["predictions"], p)
    with open(req["output"], "w") as fh:
        json.dump({"examples_per_s_steady": 1234.5, "examples": 40 * 1024}, fh)
    got = read_response(req)
    assert got["examples_per_s_steady"] == 1234.5 and got["auc"] == roc_auc(y, p) and got["auc"] > 0.8
    np.save(req["predictions"], p[:-1])
    with pytest.raises(ValueError, match="predictions for"):
        read_response(req)


@pytest.mark.unit
def test_the_torchrec_plan_pins_every_package_and_installs_torchrec_last_without_deps():
    steps = [(list(reqs), list(flags)) for reqs, flags in TORCHREC_PLAN]
    assert all("==" in r for reqs, _ in steps for r in reqs)
    assert steps[-1] == (["torchrec==1.9.2"], ["--no-deps"])  # its metadata names the CUDA fbgemm-gpu
    assert "fbgemm-gpu-cpu==1.9.0" in steps[0][0] and "torch==2.14.1" in steps[0][0]
    assert plan_key(TORCHREC_PLAN) == plan_key(TORCHREC_PLAN) != plan_key(TORCHREC_PLAN[:-1])
    reordered = ((tuple(reversed(TORCHREC_PLAN[0][0])), ()), *TORCHREC_PLAN[1:])
    assert plan_key(reordered) == plan_key(TORCHREC_PLAN)


@pytest.mark.bench
def test_quick_embedding_suite_runs_end_to_end_against_the_tfrs_peer(tmp_path):
    """The quick suite without TorchRec (its environment is 5.5 GB): both contenders train the same examples
    and are scored; the report explains both figures."""
    result = bench_embedding(EmbeddingBenchOptions(quick=True, reps=1, torchrec=False, ps_memory=False),
                             str(tmp_path), print)
    runs = result["runs"]
    assert set(runs) == {"recpipe_train", "tfrs_fit"}
    assert all(0.4 < r["eval_auc"]["median"] < 1 and r["examples_per_s"]["median"] > 0 for r in runs.values())
    assert set(result["ratios"]) == {"train_rss_vs_state", "train_rss_vs_bound", "train_embedding_heavy_vs_tfrs_fit",
                                     "train_embedding_heavy_vs_tfrs_fit_auc"}
    assert all(math.isfinite(v) and v > 0 for v in result["ratios"].values())
    assert sum(result["table_rows"]) == result["spec"]["total_rows"]
    result["machine"] = {"cpus": 2, "cpu": "test"}
    text = markdown(result)
    assert text.startswith("# Embedding-heavy training") and "train_embedding_heavy_vs_tfrs_fit" in text
    # our step's parts on the same data (the full suite splits it), 6 steps: more
    # than the 4 warm-up calls, so a function traced per step index would be traced again while timed
    out = subprocess.run([sys.executable, "-m", "recpipe.bench.embedding_parts", str(tmp_path / "pre"),
                          str(tmp_path / "embedding_heavy.yaml"), "6", "2"], capture_output=True, text=True, check=True)
    parts = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(parts["traces"]) == {"lookup_forward", "interaction", "mlp", "dense_optimizer", "sparse_optimizer",
                                    "step"} and set(parts["traces"].values()) == {1}
    assert all(v > 0 for k, v in parts["parts_ms"].items() if k != "lookup_backward_sparse_update_loss")
    kernels = parts["step_kernel_ms"]  # the step profiled: every kernel of the model's layers and optimizer in a group
    assert set(kernels) <= set(STEP_GROUPS) and all(kernels[k] > 0 for k in ("lookup_forward", "lookup_backward",
                                                                     "tables_adagrad", "mlps", "interaction_products"))
