"""`recpipe bench --quick`: the CI smoke run of every benchmark suite (figures are not asserted;
that every suite runs end to end and reports every ratio key, plots included, is).

The suites run as three `recpipe bench SUITE,SUITE --quick` processes at once into one results folder,
each followed by its reruns: most of their time is processes starting TensorFlow, Beam and Airflow. Their
figures are contended, which is why this test asserts none of them; a user's `recpipe bench` runs its suites
one after another."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from recpipe.bench.targets import RETIRED, SUITES, TARGETS, suite_of
from recpipe.bench.netns import netns_available

# The cluster suite needs network namespaces (root); without them `bench` skips it and says why.
CLUSTER = netns_available()[0]
# The embedding and scaling suites have tests of their own (tests/test_bench_embedding.py: its TorchRec peer's
# environment is 5.5 GB; tests/test_bench_scaling.py).
OWN_TEST = ("embedding", "scaling")
RUN = [s for s in SUITES if (CLUSTER or s != "cluster") and s not in OWN_TEST]


# Three streams at once, each a `recpipe bench A,B --quick` process and then its reruns, also at once. Train,
# serve and export reuse the preprocess suite's data (run.py's shared path). Their reruns, `recpipe bench serve`
# and `recpipe bench export` in the same workdir, generate their own (the standalone path) and must train and
# export afresh over the first run's model dirs and export versions (each failed with 'version 1 already
# exists'); the memory growth rerun preprocesses its evicting chain afresh in the same workdir. The lifecycle
# stream runs niced: its five process chains at once would take most of the two cores from the other streams'
# runs, one at a time on their critical path; niced, it fills the gaps they leave.
STREAMS = (("preprocess,train,serve,export", ("serve", "export"), 0),
           ("cluster,quality" if CLUSTER else "quality", (), 0), ("lifecycle", ("memory_growth",), 10))


def _bench(suites: str, out, work, log, *flags: str, nice: int = 0) -> None:
    """`recpipe bench SUITES --quick [FLAGS]` at `nice`: it must end well and say it wrote the report."""
    log.parent.mkdir(exist_ok=True)
    with open(log, "w") as fh:
        code = subprocess.run(["nice", "-n", str(nice), sys.executable, "-m", "recpipe.cli", "bench", suites, "--quick",
                               "--output", str(out), "--workdir", str(work), *flags], stdout=fh,
                              stderr=subprocess.STDOUT).returncode
    text = log.read_text()
    assert code == 0, f"bench {suites} exited {code}:\n{text[-3000:]}"
    assert f"bench: wrote {out}/REPORT.md" in text, text[-1000:]


def _rerun(name: str, work, tmp_path):
    """One rerun in the first runs' workdir: the memory growth's evicting chain preprocessed again (its item table
    rows per day), or `recpipe bench NAME --quick` with 2 training steps (None)."""
    from recpipe.bench.lifecycle_memory import item_table_rows, preprocess_chain
    if name == "memory_growth":
        return [item_table_rows(d) for d in preprocess_chain(str(work / "lifecycle"), True, True, lambda _: None)]
    return _bench(name, tmp_path / "rerun", work, tmp_path / "logs" / f"rerun-{name}.log", "--steps", "2")


def _stream(suites: str, reruns: tuple, nice: int, tmp_path) -> dict:
    """One stream: its suites, then its reruns at once; their results by name."""
    work = tmp_path / "work"
    _bench(suites, tmp_path / "results", work, tmp_path / "logs" / f"{suites}.log", nice=nice)
    with ThreadPoolExecutor(max(len(reruns), 1)) as pool:
        started = {name: pool.submit(_rerun, name, work, tmp_path) for name in reruns}
        return {name: job.result() for name, job in started.items()}


@pytest.mark.bench
def test_quick_bench_runs_every_suite_and_reports_every_ratio(tmp_path):
    from recpipe.bench.report import write_report
    out = tmp_path / "results"
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(STREAMS)) as pool:
        started = [pool.submit(_stream, *stream, tmp_path) for stream in STREAMS]
        reran = {name: r for job in started for name, r in job.result().items()}
    elapsed = time.monotonic() - t0
    write_report(str(out))  # once more, with every suite's result there: the streams ended in any order
    ratios = {}
    for suite in RUN:
        result = json.loads((out / f"{suite}.json").read_text())
        assert result["quick"] is True and result["machine"]["cpus"] >= 1
        assert result["machine"]["versions"]["tensorflow"] == "2.21.0"
        assert len(result["machine"]["git_commit"]) == 40  # the commit of the measured code
        ratios.update(result["ratios"])
        assert (out / f"{suite}.md").read_text().startswith("#")
    # the quick cluster run shapes links to 100mbit only
    expected = {k for k in [*TARGETS, *RETIRED]
                if not k.endswith("_1gbit") and (CLUSTER or not k.startswith("cluster_"))
                and suite_of(k) not in OWN_TEST}
    assert expected <= set(ratios), expected - set(ratios)
    assert all(isinstance(v, float) and math.isfinite(v) for v in ratios.values()), ratios
    assert {f"export_prune_{k}" for k in ("bytes_vs_fp32", "weight_bytes_vs_fp32", "qps_vs_fp32", "auc_delta_abs")
            } <= set(ratios)  # reported without a target
    assert ratios["export_prune_weight_bytes_vs_fp32"] < 1  # a pruned table is smaller
    assert "preprocess_repeats_check_vs_unchecked" in ratios  # what finding rows read twice costs
    assert "train_vs_tfrs_fit_dense_bound" in ratios  # the most any implementation could lead the TFRS peer by
    memory = json.loads((out / "lifecycle.json").read_text())["memory_growth"]["runs"]
    assert memory["no_evict"][-1]["item_table_rows"] > memory["evict"][-1]["item_table_rows"]
    assert all(d["train_peak_rss_mb"] > 100 for r in memory.values() for d in r)  # a TF process's own peak
    # quality margins may be negative (100 quick steps), absolute AUC differences 0; every other ratio is
    # a positive measurement
    differences = {k for k in ratios
                   if k.endswith(("_auc_delta_abs", "_auc_gap_vs_no_drift", "_vs_no_lifecycle", "_beyond_oracle"))}
    assert all(ratios[k] >= 0 for k in differences), ratios
    assert all(v > 0 for k, v in ratios.items() if not k.startswith("quality_") and k not in differences), ratios
    quality = json.loads((out / "quality.json").read_text())
    assert set(quality["ranking"]) == {"criteo", "movielens"}
    assert set(quality["ranking"]["criteo"]) == {"default", "logistic", "sklearn_logistic", "lightgbm"}
    for log in ("criteo", "movielens"):  # real, tuned on validation
        assert quality["ranking"][log]["sklearn_logistic"]["auc_mean"] > 0.65
        assert quality["ranking"][log]["lightgbm"]["auc_mean"] > 0.65
    insta = quality["retrieval"]["instacart"]  # the real Instacart sample, each user's last order
    assert insta["examples"] == 6493 and 0.05 < insta["most_popular"]["recall_at_10"] < 0.1
    assert insta["ease_applies"] and insta["ease"]["new_recall_at_10"] > insta["most_popular"]["new_recall_at_10"]
    assert not quality["retrieval"]["movielens_retrieval"]["ease_applies"]  # a time split
    assert quality["retrieval"]["movielens_retrieval"]["candidates"] > 1000
    if CLUSTER:
        _check_cluster(out, tmp_path)
    train = json.loads((out / "train.json").read_text())
    assert train["ceiling_gflops"]["bf16"]["median"] > 0 and train["ceiling_gflops"]["fp32"]["median"] > 0
    assert {r["workers"] for r in train["scale_out"]["predictions"]} == {8, 64, 512}
    assert len(train["rss_vs_table"]["table_rows"]) >= 2
    report = (out / "REPORT.md").read_text()
    for key in expected:
        assert key in report
    for png in ("preprocess_throughput.png", "train_throughput.png", "train_rss_vs_table.png", "serve_latency.png",
                "lifecycle.png", "lifecycle_memory.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
        assert f"]({png})" in report
    compared = subprocess.run([sys.executable, "-m", "recpipe.cli", "bench", "compare", str(out / "preprocess.json"),
                               str(out)], check=True, capture_output=True, text=True).stdout
    assert "preprocess_beam_vs_duckdb" in compared and " same" in compared
    print(f"the quick suites and their reruns took {elapsed:.0f} s")
    # the memory growth rerun in the same workdir preprocessed afresh, to the same tables
    assert reran["memory_growth"] == [d["item_table_rows"] for d in memory["evict"]]


def _check_cluster(out, tmp_path):
    """The cluster suite measured both links and its calibration feeds `recpipe advise --calibration`."""
    cluster = json.loads((out / "cluster.json").read_text())
    assert cluster["calibration"]["compute_probe_s"] > 0 and set(cluster["measured"]) == {"unshaped", "100mbit"}
    advice = subprocess.run([sys.executable, "-m", "recpipe.cli", "advise", "--data",
                             str(tmp_path / "work" / "cluster" / "pre"), "--np", "2", "--ps-servers", "2",
                             "--bandwidth-gbps", "0.1", "--calibration", str(out / "cluster.json")],
                            check=True, capture_output=True, text=True).stdout
    assert "+ measured overheads" in advice


@pytest.mark.integration
def test_bench_runs_the_suites_named_in_their_order_and_refuses_an_unknown_one():
    from recpipe.bench.run import suites_of
    assert suites_of("all") == SUITES
    assert suites_of("serve, preprocess") == ("preprocess", "serve")  # preprocess first: the others reuse its data
    with pytest.raises(ValueError, match="bench suite 'serv': use preprocess, train"):
        suites_of("preprocess,serv")
    proc = subprocess.run([sys.executable, "-m", "recpipe.cli", "bench", "train,,serve"], capture_output=True,
                          text=True)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        f"recpipe bench: error: bench suite 'train,,serve': use {', '.join(SUITES)}, several of them joined by "
        f"commas, or all")


@pytest.mark.unit
def test_bench_compare_flags_a_missed_target_as_regressed():
    from recpipe.bench.compare import compare_ratios, format_comparison
    rows = {r["ratio"]: r for r in compare_ratios(
        {"serve_p99_ms_c8": 8.0, "preprocess_beam_vs_duckdb": 0.3, "train_bf16_vs_fp32": 1.2, "other": 2.0},
        {"serve_p99_ms_c8": 25.0, "preprocess_beam_vs_duckdb": 0.9, "train_bf16_vs_fp32": 1.21, "new_key": 1.0})}
    assert rows["serve_p99_ms_c8"]["verdict"] == "regressed"          # <= 10 met before, missed now
    assert rows["preprocess_beam_vs_duckdb"]["verdict"] == "fixed"
    assert rows["train_bf16_vs_fp32"]["verdict"] == "same"
    assert rows["other"]["verdict"] == "gone" and rows["new_key"]["verdict"] == "new"
    assert "REGRESSED" in format_comparison(list(rows.values()), "a", "b")


@pytest.mark.unit
def test_the_report_names_the_cpu_each_suite_ran_on(tmp_path):
    from recpipe.bench.common import save_result
    from recpipe.bench.report import write_report
    for suite, cpu in (("cluster", "Intel Xeon"), ("quality", "AMD EPYC"), ("export", "Intel Xeon")):
        save_result(str(tmp_path), suite, {"machine": {"cpus": 2, "cpu": cpu}, "ratios": {}}, f"# {suite}\n")
    with open(write_report(str(tmp_path))) as fh:
        header = fh.read().splitlines()[2]
    assert header.endswith("CPU: Intel Xeon (cluster, export), AMD EPYC (quality).")


@pytest.mark.unit
def test_a_nan_figure_is_written_as_null_and_the_report_and_compare_name_it(tmp_path):
    """A suite result with NaN in it (a slope over equal points, a recall over no rows) is valid JSON; the
    report shows a null ratio as a missed target, plots around it, and `bench compare` calls it a regression."""
    from recpipe.bench.common import save_result
    from recpipe.bench.compare import compare_ratios, load_ratios
    from recpipe.bench.report import NULL_FIGURE, NULL_RATIO, write_report
    nan, machine = float("nan"), {"date": "2026-11-27", "cpus": 2}
    day = {"auc": 0.71, "item_slots": 10}
    save_result(str(tmp_path), "lifecycle", {
        "machine": machine, "settings": {"max_size": 20},
        "ratios": {"lifecycle_item_slots_vs_max_size": nan, "lifecycle_auc_gap_vs_no_drift": 0.02,
                   "lifecycle_rss_mb_per_table_mb": float("inf")},
        "runs": {"drift_evict": [{**day, "auc": nan}, day], "stable_evict": [day, day]}}, "# lifecycle\n")
    no_rows = {"recall_at_10": 0.05, "new_recall_at_10": 0.01, "history_recall_at_10": nan}
    save_result(str(tmp_path), "quality", {"machine": machine,
                                           "ratios": {"quality_instacart_recall10_vs_popularity": 1.2},
                                           "retrieval": {"instacart": {
        "model": {"recall_at_10_mean": 0.07, "recall_at_10_sd": 0.01, "new_recall_at_10_mean": 0.02,
                  "history_recall_at_10_mean": nan, "history_recall_at_10_sd": nan, "runs": [{"kept": "two_tower"}]},
        "most_popular": no_rows, "cooccurrence": no_rows, "examples": 100, "new_examples": 40,
        "history_examples": 0}}}, "# quality\n")

    def refuse(constant):
        raise AssertionError(f"bare {constant} in a bench JSON")
    life = json.loads((tmp_path / "lifecycle.json").read_text(), parse_constant=refuse)
    assert life["ratios"]["lifecycle_item_slots_vs_max_size"] is None and life["runs"]["drift_evict"][0]["auc"] is None
    with open(write_report(str(tmp_path))) as fh:
        report = fh.read()
    assert "| lifecycle_item_slots_vs_max_size | null | <= 1 | **no**: see below |" in report
    assert f"- **lifecycle_item_slots_vs_max_size** = null: {NULL_RATIO}" in report
    assert f"- **lifecycle_auc_gap_vs_no_drift** = 0.0200: {NULL_FIGURE}" in report  # its explanation needs day 1's AUC
    assert "| lifecycle_rss_mb_per_table_mb | null |" in report
    insta = next(line for line in report.splitlines() if line.startswith("- **quality_instacart"))
    assert "Only 0 of the 100 eval clicks" in insta and "On the users with history" not in insta
    assert (tmp_path / "lifecycle.png").read_bytes()[:4] == b"\x89PNG"
    new, _ = load_ratios(str(tmp_path))
    rows = {r["ratio"]: r["verdict"] for r in compare_ratios(
        {"lifecycle_item_slots_vs_max_size": 0.9, "lifecycle_rss_mb_per_table_mb": 1.6}, new)}
    assert rows["lifecycle_item_slots_vs_max_size"] == "regressed"  # met before; null misses it
    assert rows["lifecycle_rss_mb_per_table_mb"] == "null"  # no target
    (tmp_path / "other.json").write_text('{"ratios": {"serve_p99_ms_c8": "12 ms"}}')
    with pytest.raises(ValueError, match=r"other.json: ratio 'serve_p99_ms_c8' is \"12 ms\", not a number or null"):
        load_ratios(str(tmp_path / "other.json"))


@pytest.mark.unit
def test_duckdb_peer_does_the_same_split_and_vocabularies(tmp_path):
    """The peer is a fair yardstick: same split, same vocabularies, same in-vocabulary IDs as ours."""
    import pyarrow.parquet as pq

    from recpipe.features.canonical import LABEL_KEY
    from recpipe.features.config import load_config
    from recpipe.bench.baseline import baseline_preprocess
    from recpipe.bench.criteo_like import write_criteo_like
    from recpipe.bench.duckdb_peer import duckdb_preprocess
    from recpipe.samples import repo_configs
    from recpipe.trainers.data import make_dataset

    cfg = load_config(repo_configs() / "criteo.yaml")
    log = write_criteo_like(3_000, str(tmp_path / "log"), file_rows=1_000)
    ours = baseline_preprocess(cfg, log, str(tmp_path / "ours"))
    peer = duckdb_preprocess(cfg, log, str(tmp_path / "peer"))
    splits = ("train", "validation", "eval")
    assert [peer[s] for s in splits] == [ours[s] for s in splits] == [2_430, 270, 300]
    from recpipe.features.preprocessed import PreprocessedData
    vocabs = PreprocessedData(str(tmp_path / "ours")).transform().vocabularies
    assert peer["vocab_sizes"] == {name: len(v) for name, v in vocabs.items()}
    peer_train = pq.read_table(tmp_path / "peer" / "train.parquet")
    ours_train = next(iter(make_dataset(cfg, str(tmp_path / "ours"), "train", 10_000, training=False)))
    for name in ("C3", "C20"):
        size = len(vocabs[name])
        a, b = peer_train.column(name).to_numpy(), ours_train[name].numpy()
        assert sorted(a[a < size]) == sorted(b[b < size])
    assert sorted(peer_train.column("label").to_numpy()) == sorted(ours_train[LABEL_KEY].numpy())


@pytest.mark.integration
def test_tfrs_peer_is_our_model_trained_the_tutorial_way(preprocessed, small_cfg):
    """The `train_vs_tfrs_fit` peer has exactly our model's weights (tables, cross, deep, logit) and trains."""
    import math

    from recpipe.features.preprocessed import PreprocessedData
    from recpipe.bench.tfrs_peer import TutorialDCN, in_memory, run_peer
    from recpipe.trainers.models import build_model, dummy_batch

    artifact = PreprocessedData(preprocessed[0]).transform()
    ours = build_model(small_cfg, artifact)
    ours(dummy_batch(small_cfg))
    peer = TutorialDCN(small_cfg, artifact.table_sizes())
    peer(in_memory(small_cfg, preprocessed[0], "eval"))
    shapes = sorted(tuple(v.shape) for v in ours.trainable_variables)
    assert shapes == sorted(tuple(v.shape) for v in peer.trainable_variables)
    got = run_peer(preprocessed[0], small_cfg, steps=20)
    assert got["examples"] == 20 * 128 and got["train_rows_in_memory"] == preprocessed[1].rows_train
    assert got["examples_per_s_steady"] > 0 and 0.0 < got["auc"] < 1.0 and math.isfinite(got["auc"])


@pytest.mark.integration
def test_step_parts_times_every_matmul_of_the_dense_layers(preprocessed, small_cfg):
    """The denominator of `train_vs_tfrs_fit_dense_bound`, the model's cross and deep layers alone, computes all
    three matmuls of each of its layers (forward, the weights' gradient, the input's gradient), given a model not
    yet built: listed before the layers were built, the weights had no gradients in the step's result, TensorFlow
    pruned those matmuls, and the bound came out 1.66 where 1.26 was measured with them."""
    from recpipe.bench.step_parts import _dense_layers_step, _model_step
    from recpipe.trainers.data import make_dataset

    batch = next(iter(make_dataset(small_cfg, preprocessed[0], "train", 64, training=False)))
    model, _ = _model_step(small_cfg, preprocessed[0])
    graph = _dense_layers_step(model, batch).get_concrete_function(batch).graph
    needed, todo = set(), [t.op for t in graph.outputs]
    while todo:  # every op the step's result depends on: what TensorFlow keeps when it prunes the graph
        op = todo.pop()
        if op.name not in needed:
            needed.add(op.name)
            todo += [t.op for t in op.inputs] + list(op.control_inputs)
    matmuls = [op for op in graph.get_operations() if op.type == "MatMul" and op.name in needed]
    layers = small_cfg.model.cross_layers + len(small_cfg.model.deep_layers) + 1  # + the logit
    assert len(matmuls) == 3 * layers, [op.name for op in matmuls]


@pytest.mark.integration
def test_plain_horovod_peer_exchanges_gradients_at_two_ranks(tmp_path, preprocessed, small_cfg_path):
    """The `train_horovod_vs_plain_horovod` peer is real Horovod: two ranks under horovodrun, the same weights
    at the end on both (its train_step goes through optimizer.minimize, where DistributedOptimizer allreduces)."""
    from recpipe.bench.train_runs import TrainRuns

    runs = TrainRuns(str(tmp_path), reps=1, say=lambda _: None)
    runs.plan_horovod_peer("plain_horovod_np2", preprocessed[0], small_cfg_path, 10, 2)
    runs.run_planned()  # raises when the ranks end with different weights
    got = runs.results["plain_horovod_np2"]
    assert got["examples_per_s"]["median"] > 0 and 0.0 < got["eval_auc"]["median"] < 1.0


@pytest.mark.unit
def test_serve_bench_client_reads_each_response_by_its_content_length():
    """The serve bench's keep-alive load client: responses arriving a byte at a time or two in one read,
    header names in any case, each read whole and nothing more; no Content-Length is an error."""
    import socket
    import threading

    from recpipe.bench.serve import _KeepAlive

    replies = [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
               b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
               b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"]
    srv = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.recv(1 << 16)
            for i in range(len(replies[0])):  # a byte at a time
                conn.sendall(replies[0][i:i + 1])
            conn.recv(1 << 16)
            conn.sendall(replies[1])  # two whole responses in one send
            conn.recv(1 << 16)
            conn.sendall(replies[2])
            while conn.recv(1 << 16):  # until the client closes (its last request may come with the third)
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = _KeepAlive(srv.getsockname()[1], b"POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    try:
        assert client.call() == 200 and client.buf == b""
        assert client.call() == 400 and client.buf.startswith(b"HTTP/1.1 200")
        assert client.call() == 200 and client.buf == b""  # the second response, already read
        with pytest.raises(RuntimeError, match="without Content-Length"):
            client.call()
    finally:
        client.close()
        srv.close()
