"""Distributed training and faults: ParameterServerStrategy on 127.0.0.1, worker and trainer kills."""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainers.errors import TrainError
from trainers.evaluate import evaluate
from trainers.options import RunOptions, TrainOptions
from trainers.train import train


def _children(pid: int) -> list[tuple[int, str]]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append((int(entry), cmd))
    return out


def _latest_step(model_dir: str) -> int:
    import tensorflow as tf
    latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def _train_cli(data, model_dir, *extra, env=None):
    return subprocess.Popen([sys.executable, "-m", "recpipe.cli", "train", "--data", data, "--model-dir", model_dir,
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _wait_for_checkpoint(proc, model_dir, timeout=300):
    deadline = time.monotonic() + timeout
    while _latest_step(model_dir) == 0:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "no checkpoint written in time"
        time.sleep(0.3)


def test_ps_strategy_trains_sharded_and_restores_locally(tmp_path, preprocessed, small_cfg_path, trained):
    model_dir = str(tmp_path / "ps")
    said = []
    r = train(TrainOptions(preprocessed[0], model_dir, small_cfg_path,
                           run=RunOptions(strategy="ps", steps=150)), say=said.append)
    assert r.steps_done == 150
    assert any("local PS cluster up: 2 workers" in s for s in said)
    shards = [f for f in os.listdir(os.path.join(model_dir, "checkpoints")) if ".data-" in f]
    assert len(shards) >= 2  # variables lived on more than one PS task
    ps_auc = evaluate(model_dir, preprocessed[0])["auc"]
    local_auc = evaluate(trained, preprocessed[0])["auc"]  # same config and steps, local strategy
    assert ps_auc > 0.6 and abs(ps_auc - local_auc) < 0.08, (ps_auc, local_auc)


def test_ps_shards_only_the_tables_so_mixed_precision_trains(tmp_path, preprocessed, small_cfg_path, monkeypatch):
    """Keras' mixed precision cannot wrap a sharded Dense kernel (an AutoCastVariable needs a ResourceVariable),
    so the PS strategy shards the embedding tables and nothing else, and bf16 trains under it. Shards of at
    least 1 KiB here: a rule by size alone would shard the small model's Dense kernels too."""
    import tensorflow as tf

    import trainers.ps
    from trainers.ps import TablePartitioner
    partitioner = TablePartitioner({(1000, 16)}, 1 << 10, 4)
    assert partitioner(tf.TensorShape([1000, 16]), tf.float32) == [4, 1]
    assert partitioner(tf.TensorShape([477, 477]), tf.float32) == [1, 1]
    assert partitioner(tf.TensorShape([477]), tf.float32) == [1]
    monkeypatch.setattr(trainers.ps, "MIN_SHARD_BYTES", 1 << 10)
    r = train(TrainOptions(preprocessed[0], str(tmp_path / "ps_bf16"), small_cfg_path,
                           run=RunOptions(strategy="ps", precision="bf16", steps=20)), say=lambda _: None)
    assert r.steps_done == 20 and math.isfinite(r.final_loss)


def test_ps_job_survives_a_killed_worker(tmp_path, preprocessed, small_cfg_path):
    model_dir, temp = str(tmp_path / "ps_kill"), tmp_path / "tmp"
    temp.mkdir()
    proc = _train_cli(preprocessed[0], model_dir, "--config", small_cfg_path, "--strategy", "ps", "--steps", "600",
                      env={**os.environ, "TMPDIR": str(temp)})
    try:
        _wait_for_checkpoint(proc, model_dir)
        workers = [pid for pid, cmd in _children(proc.pid) if "trainers.ps" in cmd and " worker " in cmd]
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "exited (-9); restarting it" in out, out
    assert re.match(r"train: 60[0-2] steps done", out.strip().splitlines()[-1]), out[-3000:]  # no teardown noise
    # A step whose worker died after pushing its update is rescheduled: at-least-once, so >= 600.
    assert 600 <= _latest_step(model_dir) <= 602
    # the chief ends with os._exit, so no atexit handler removes AutoGraph's sources: they went to a
    # folder of its own, removed on the way out
    assert not list(temp.iterdir()), sorted(p.name for p in temp.iterdir())[:5]


def test_killed_trainer_resumes_from_last_checkpoint(tmp_path, preprocessed, small_cfg_path):
    model_dir = str(tmp_path / "kill")
    proc = _train_cli(preprocessed[0], model_dir, "--config", small_cfg_path, "--steps", "3000")
    _wait_for_checkpoint(proc, model_dir)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lost_at = _latest_step(model_dir)
    assert 0 < lost_at < 3000
    said = []
    r = train(TrainOptions(preprocessed[0], model_dir, small_cfg_path, run=RunOptions(steps=3000)), say=said.append)
    assert r.resumed_from == lost_at and r.steps_done == 3000
    assert any("resuming from" in s and f"at step {lost_at}" in s for s in said)


def test_horovod_two_ranks_rank0_writes_and_resumes(tmp_path, preprocessed, small_cfg_path, trained):
    model_dir = str(tmp_path / "hvd")
    said = []
    r = train(TrainOptions(preprocessed[0], model_dir, small_cfg_path,
                           run=RunOptions(strategy="horovod", np=2, steps=100)),
              say=said.append)
    assert r.steps_done == 100 and any("2 ranks" in s for s in said)
    ckpts = sorted(f for f in os.listdir(os.path.join(model_dir, "checkpoints")) if f.endswith(".index"))
    assert ckpts == ["ckpt-100.index", "ckpt-50.index"]  # rank 0 alone wrote them, once each
    r2 = train(TrainOptions(preprocessed[0], model_dir, small_cfg_path,
                            run=RunOptions(strategy="horovod", np=2, steps=150)),
               say=said.append)
    assert r2.resumed_from == 100 and r2.steps_done == 150
    hvd_auc = evaluate(model_dir, preprocessed[0])["auc"]
    local_auc = evaluate(trained, preprocessed[0])["auc"]  # 150 local steps of half the examples
    assert hvd_auc > 0.6 and abs(hvd_auc - local_auc) < 0.08, (hvd_auc, local_auc)


def test_auto_sparse_gradients_densify_only_tables_a_dense_allreduce_moves_less_of():
    """sparse_gradients auto: per table, from static shapes (every rank decides alike)."""
    import tensorflow as tf

    from trainers.hvd import _exchange_dense

    def auto(rows, width=16, ranks=2, batch=1024):
        return _exchange_dense("auto", tf.TensorShape([rows, width]), ranks, batch)

    # np=2: a ring allreduce moves rows x width x 4 bytes per rank, the allgather up to min(rows, batch) rows
    # of width x 4 bytes + an 8-byte ID
    assert auto(6) and auto(503) and auto(1_024) and auto(1_152)  # 1,152 x 64 = 1,024 x 72
    assert not auto(1_153) and not auto(2_003) and not auto(50_000)
    assert auto(4_608, ranks=8) and not auto(4_609, ranks=8)  # 2/8 x 4,608 x 64 = 1,024 x 72
    assert not auto(1_000, batch=100) and auto(100, batch=100)
    assert not auto(6, ranks=1) and not auto(50_000, ranks=1)  # one rank: 2 x rows x 64 > rows x 72
    assert _exchange_dense("dense", tf.TensorShape([50_000, 16]), 2, 1_024)
    assert not _exchange_dense("allgather", tf.TensorShape([6, 16]), 2, 1_024)


@pytest.mark.parametrize("mode", ["dense", "auto"])
def test_horovod_dense_sparse_gradients(tmp_path, preprocessed, mode):
    """Densified embedding gradients (every table, or per table: auto, where the C tables of a few values go
    dense and user_id's 1,000 rows are allgathered), accumulated over 2 micro-batches and exchanged in
    2 grouped collectives per kind (the other runs: the default auto through the tape, one grouped
    exchange); every Horovod run ends with its ranks' weights checked equal."""
    import yaml
    from conftest import small_config_dict
    d = small_config_dict()
    d["train"]["sparse_gradients"] = mode
    d["train"]["gradient_groups"] = 2
    d["train"]["horovod_cycle_time_ms"] = 2.5
    d["train"].setdefault("tuning", {})["grad_accum_steps"] = 2
    path = tmp_path / "dense.yaml"
    path.write_text(yaml.safe_dump(d))
    r = train(TrainOptions(preprocessed[0], str(tmp_path / "m"), str(path),
                           run=RunOptions(strategy="horovod", np=2, steps=20)),
              say=lambda _: None)
    assert r.steps_done == 20
    state = __import__("json").load(open(tmp_path / "m" / "train_state.json"))
    assert state["sparse_gradients"] == mode and state["gradient_groups"] == 2 and state["ranks"] == 2
    assert state["cycle_time_ms"] == 2.5


_ONE_RANK_STEP = """
import json, sys
from features.config import load_config  # first: features sets TF_USE_LEGACY_KERAS before TensorFlow loads
import horovod.tensorflow as hvd
from features.preprocessed import PreprocessedData
from trainers.data import make_dataset
from trainers.hvd import _step_function
from trainers.models import compiled_model
from trainers.optim import optimizer_for
data, cfg_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
hvd.init()
cfg = load_config(cfg_path)
model = compiled_model(cfg, PreprocessedData(data).transform(), optimizer_for(cfg, "fp32", loss_scale=True))
step = _step_function(cfg, model, model.optimizer)
it = iter(make_dataset(cfg, data, "train", cfg.train.batch_size, training=True))
graph = step.get_concrete_function(it).graph
print(json.dumps({"size": hvd.size(), "losses": [float(step(it)) for _ in range(steps)],
                  "horovod_ops": sorted({op.type for op in graph.get_operations() if op.type.startswith("Horovod")})}))
"""


def test_a_one_rank_horovod_step_runs_no_collective_and_takes_its_batch_in_the_function(preprocessed,
                                                                                        small_cfg_path):
    """At size 1 there is nothing to average: the step has no Horovod op (each would wait for the
    background thread's next cycle, train.horovod_cycle_time_ms, and cost a 1-rank run 13 % of its
    rate), and it reads its batch from the iterator inside the function, as Keras' fit does."""
    out = subprocess.run([sys.executable, "-c", _ONE_RANK_STEP, preprocessed[0], small_cfg_path, "5"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["size"] == 1 and got["horovod_ops"] == [], got
    assert len(got["losses"]) == 5 and all(map(math.isfinite, got["losses"])), got


def test_horovod_cycle_time_comes_from_the_config_unless_the_environment_sets_it(monkeypatch):
    """train.horovod_cycle_time_ms reaches Horovod as HOROVOD_CYCLE_TIME; a value the environment
    already has (horovodrun --cycle-time-ms sets it) wins; a value Horovod would misread is refused."""
    from features.config import ConfigError, config_to_dict, load_config, parse_config
    from recpipe.samples import repo_configs
    from trainers.errors import TrainError
    from trainers.hvd import CYCLE_TIME_ENV, horovod_cycle_time_ms
    cfg = load_config(str(repo_configs() / "synthetic.yaml"))
    monkeypatch.delenv(CYCLE_TIME_ENV, raising=False)
    assert horovod_cycle_time_ms(cfg) == cfg.train.horovod_cycle_time_ms == 5.0
    monkeypatch.setenv(CYCLE_TIME_ENV, "0.5")
    assert horovod_cycle_time_ms(cfg) == 0.5
    for bad in ("fast", "-1", "nan"):
        monkeypatch.setenv(CYCLE_TIME_ENV, bad)
        with pytest.raises(TrainError, match=f"HOROVOD_CYCLE_TIME='{bad}'"):
            horovod_cycle_time_ms(cfg)
    d = config_to_dict(cfg)
    d["train"]["horovod_cycle_time_ms"] = -2
    with pytest.raises(ConfigError, match="train.horovod_cycle_time_ms: must be >= 0, got -2"):
        parse_config(d)


def test_every_rank_gets_the_launchers_input_flags(tmp_path):
    """A rank is a `recpipe train` of its own: what the launcher was told about input reaches it."""
    from trainers.hvd_launch import rank_command
    opts = TrainOptions("DATA", str(tmp_path), None, run=RunOptions(strategy="horovod", np=2), warm_start="OLD",
                        synthetic_input=True)
    cmd = rank_command(opts)
    assert "--synthetic-input" in cmd and cmd[cmd.index("--warm-start") + 1] == "OLD"
    assert "--synthetic-input" not in rank_command(TrainOptions("DATA", str(tmp_path), None))


def test_hosts_are_for_horovod():
    """--hosts starts each host's Horovod ranks: with another strategy it was ignored (or, under `auto`, used if
    the advisor picked Horovod) without a word."""
    with pytest.raises(TrainError, match="hosts: --hosts starts each host's Horovod ranks; it needs --strategy "
                                         "horovod, not ps"):
        RunOptions(strategy="ps", hosts="a,b")
    with pytest.raises(TrainError, match="host_index: 2 is not one of the 2 hosts"):
        RunOptions(strategy="horovod", hosts="a,b", host_index=2)


def test_advisor_traffic_model():
    from trainers.advisor import predict
    # dense-heavy (50M dense, few embedding rows touched): ring-allreduce wins
    ar, ps = predict(sparse=1_000_000, dense=50_000_000, unique_rows=2_000, dim=16, step_s=0.05, workers=8,
                     ps_tasks=2, bandwidth_gbps=10)
    assert ar < ps
    # sparse-heavy (huge tables, 200k rows touched per batch, tiny MLP) with many workers: PS wins
    ar, ps = predict(sparse=500_000_000, dense=200_000, unique_rows=200_000, dim=64, step_s=0.05, workers=64,
                     ps_tasks=16, bandwidth_gbps=10)
    assert ps < ar


def test_advisor_counts_the_tables_auto_allreduces_whole():
    """The advisor's Horovod bytes follow train.sparse_gradients: with auto, a small table goes whole into
    the ring (as the trainer exchanges it) instead of N-1 ranks' rows into the allgather."""
    from trainers.advisor import TableTraffic, Traffic, link_bytes
    small, big = TableTraffic(500, 16, 400, 1_024), TableTraffic(1_000_000, 16, 1_000, 1_024)
    t = Traffic(1_000, 500 * 16 + 1_000_000 * 16, 1_024, 1_400, 2_048, 1_400 * 72, 2_048 * 72, (small, big))
    n = 512
    auto, ps = link_bytes(t, n, 128, "auto")
    assert auto == pytest.approx(2 * (n - 1) / n * (4_000 + 500 * 64) + (n - 1) * 1_000 * 72)
    gathered, ps_too = link_bytes(t, n, 128, "allgather")
    assert gathered == pytest.approx(2 * (n - 1) / n * 4_000 + (n - 1) * 1_400 * 72) and gathered > 1.3 * auto
    assert ps == ps_too == pytest.approx(4 * (4_000 + 1_400 * 72))  # PS moves touched rows either way
    dense, _ = link_bytes(t, n, 128, "dense")
    assert dense == pytest.approx(2 * (n - 1) / n * (4_000 + (500 + 1_000_000) * 64))
    assert link_bytes(t, n, 128, "auto", dedup=False)[0] == pytest.approx(
        2 * (n - 1) / n * (4_000 + 500 * 64) + (n - 1) * 1_024 * 72)
    assert t.dense_tables(n) == [True, False] and t.dense_tables(2, "allgather") == [False, False]


def test_advise_refuses_a_calibration_with_a_null_overhead(tmp_path):
    """A cluster bench that measured no finite overhead writes null (bench JSON has no NaN): `advise
    --calibration` names the key, where it built its prediction on it."""
    import json

    from trainers.advisor import Overheads
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"calibration": {"overheads": {"allreduce_s": 0.012, "ps_s": 0.03}}}))
    assert Overheads.from_calibration(str(path)) == Overheads(0.012, 0.03)
    path.write_text(json.dumps({"calibration": {"overheads": {"allreduce_s": None, "ps_s": 0.03}}}))
    out = subprocess.run([sys.executable, "-m", "recpipe.cli", "advise", "--data", str(tmp_path / "none"),
                          "--calibration", str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1] == (
        f"recpipe advise: error: {path}: calibration.overheads.allreduce_s is null, not a finite number of seconds "
        f">= 0 (null: the bench measured no finite value); rerun `recpipe bench cluster`")
    path.write_text(json.dumps({"measured": {}}))
    with pytest.raises(ValueError, match="no calibration.overheads.allreduce_s and .ps_s: not a `recpipe bench"):
        Overheads.from_calibration(str(path))
    path.write_text('{"calibration": {"overheads": {"allreduce_s": 0.01,')  # cut short
    with pytest.raises(ValueError, match=f"^{path}: not valid JSON: Expecting property name enclosed in double "
                                         f"quotes at line 1 column 52$"):
        Overheads.from_calibration(str(path))
    path.write_bytes(b"\x89PNG\r\n")
    with pytest.raises(ValueError, match=f"^{path}: not valid JSON: not UTF-8 text \\(byte 0\\)$"):
        Overheads.from_calibration(str(path))


def test_advise_probe_and_cli(tmp_path, preprocessed, small_cfg, small_cfg_path):
    import json

    from features.artifact import TransformArtifact
    from trainers.advisor import advise
    art = TransformArtifact.read(os.path.join(preprocessed[0], "transform"))
    advice = advise(small_cfg, art, preprocessed[0], workers=2, ps_tasks=2)
    assert advice.strategy in ("ps", "horovod") and advice.step_compute_s > 0 and advice.unique_rows_per_batch > 0
    assert advice.sparse_gradients == "auto" and 0 < advice.dense_tables <= advice.tables == len(art.table_sizes())
    assert advice.sparse_params == sum(t * 8 for t in art.table_sizes().values())  # all dims are 8 here
    tiny = advise(small_cfg, art, preprocessed[0], workers=2, ps_tasks=2, worker_memory_bytes=1000)
    assert tiny.strategy == "ps" and "must be sharded" in tiny.reason
    out = subprocess.run([sys.executable, "-m", "recpipe.cli", "advise", "--data", preprocessed[0], "--config",
                          small_cfg_path, "--workers", "8", "--out", str(tmp_path / "a.json")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "advise: -> " in out.stdout and json.loads(Path(tmp_path / "a.json").read_text())["workers"] == 8


def test_a_dead_ranks_own_error_reaches_the_launchers_message(tmp_path):
    """The launcher names why a rank died: that rank's own last error line, not horovodrun's and not
    another rank's (a collective failing because this rank was killed)."""
    from trainers.hvd_launch import rank_died
    opts = TrainOptions(str(tmp_path), str(tmp_path / "m"), None)
    output = ["[1]<stderr>:recpipe train: error: Horovod ranks ended with different weights (sums ...)",
              "[0]<stderr>:tensorflow.python.framework.errors_impl.UnknownError: Gloo: connection closed by peer",
              "Traceback (most recent call last):", "RuntimeError: Horovod detected that one or more processes exited "
              "with non-zero status, thus causing the job to be terminated."]
    e = str(rank_died(opts, 1, 1, output=output))
    assert "rank 1 died (exit code 1: Horovod ranks ended with different weights (sums ...))" in e
    assert "one or more" not in e and "Gloo" not in e and "a rerun starts over" in e
    assert "rank 0 died (killed by SIGKILL: UnknownError: Gloo: connection closed by peer)" in str(
        rank_died(opts, 0, -9, output=output))
    assert "died (killed by SIGKILL)," in str(rank_died(opts, 2, -9, output=output))  # rank 2 printed nothing
    # Horovod's ops built for another TensorFlow: the launcher checks only that they are there (no TensorFlow)
    abi = ["[0]<stderr>:recpipe train: error: ImportError: /venv/lib/python3.11/site-packages/horovod/tensorflow/"
           "mpi_lib.cpython-311-x86_64-linux-gnu.so: undefined symbol: _ZN10tensorflow8OpKernelD2Ev"]
    assert str(rank_died(opts, 0, 1, output=abi)).endswith(
        "undefined symbol: _ZN10tensorflow8OpKernelD2Ev; Horovod's TensorFlow ops were built for another "
        "TensorFlow: rebuild them with `make horovod`), so the job stopped: no checkpoint was written yet; a rerun "
        "starts over")
    own = ["recpipe train: error: a rank started by --hosts prints without a prefix"]
    assert "exit code 1: a rank started by --hosts prints without a prefix)" in str(rank_died(opts, 3, 1, output=own))
    # the first host's rendezvous store stopped answering mid-rendezvous: Gloo's HTTP client aborts the rank
    gone = ["[2026-11-27 02:26:28.637903: E horovod/common/gloo/http_store.cc:96] HTTP GET request failed too many "
            "times, aborting. See exception message above.", "terminate called after throwing an instance of "
            "'std::runtime_error'", "  what():  HTTP request failed."]
    assert ("rank 1 on 10.0.0.2 died (killed by SIGABRT: Gloo's rendezvous store did not answer (HTTP requests to it "
            "failed); it is served by `recpipe train ... --host-index 0` on 10.0.0.1: is that still running, or did "
            "it stop (its own output says why)?), so the job stopped") in str(
        rank_died(opts, 1, -6, " on 10.0.0.2", gone, {0: (0, "10.0.0.1"), 1: (1, "10.0.0.2")}))


def test_a_rank_death_that_only_shows_another_ranks_end_is_not_first_hand():
    """Across hosts, a host reports its rank's death to the others only when it is first-hand: a rank whose
    collectives failed because another rank ended would otherwise be named in place of the one that did."""
    from trainers.hvd_launch import rank_death
    assert rank_death(1, -9).first_hand  # killed (the OOM killer): the others see only their collectives fail
    assert rank_death(1, 1, output=["recpipe train: error: Horovod ranks ended with different weights"]).first_hand
    assert rank_death(1, 1, output=["RuntimeError: out of memory"]).first_hand
    for symptom in ["UnknownError: [[{{node HorovodGroupedAllreduce_UnsortedSegmentSum_0}}]] [Op:__inference_step_1]",
                    "UnknownError: Gloo: connection closed by peer [10.78.0.2]:4410",
                    "HTTP GET request failed too many times, aborting.",
                    "Wait timeout after 300 seconds for key(s): 1"]:
        assert not rank_death(0, 1, output=[symptom]).first_hand, symptom
    assert not rank_death(0, -6).first_hand and not rank_death(0, -15).first_hand  # Gloo's abort, our terminate


def test_horovod_ranks_must_hold_the_same_shards():
    """A host whose copy of the shards was partial (a file missing, one cut short: a copy still going on)
    passed the ranks' check, which compared the transform alone: each rank reads its share of the shards it
    lists, so rows were read twice or never, without a word."""
    import copy
    from trainers.errors import TrainError
    from trainers.hvd import _check_ranks_train_one_model
    shards = {split: {f"part-0000{i}-of-00004.tfrecord": 1000 + i for i in range(4)}
              for split in ("train", "validation", "eval")}
    rank = {"host": "10.0.0.1", "data": "/data", "code": {}, "transform": {"vocabularies": "v", "dense": {}},
            "config": {"train": {"steps": 10}}, "steps": 10, "precision": "fp32", "shards": shards}
    _check_ranks_train_one_model([rank, {**rank, "host": "10.0.0.2"}])  # a whole copy
    _check_ranks_train_one_model([{**rank, "shards": None}, {**rank, "shards": None}])  # synthetic input
    partial = copy.deepcopy(shards)
    del partial["train"]["part-00003-of-00004.tfrecord"]
    partial["train"]["part-00001-of-00004.tfrecord"] = 512
    partial["eval"]["part-00000-of-00001.tfrecord"] = 9  # an older run's shard left beside this run's
    with pytest.raises(TrainError, match=re.escape(
            "the ranks read other copies of the shards: rank 1 (host 10.0.0.2, /data): its eval/ also has "
            "part-00000-of-00001.tfrecord, its train/ lacks part-00003-of-00004.tfrecord, "
            "train/part-00001-of-00004.tfrecord is 512 bytes against 1,001, against rank 0 (host 10.0.0.1, /data); "
            "each rank reads its share of the shards it lists, so rows would be read twice or never")):
        _check_ranks_train_one_model([rank, {**rank, "host": "10.0.0.2", "shards": partial}])
