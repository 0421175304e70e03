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

from recpipe.trainers.errors import TrainError
from recpipe.trainers.evaluation.evaluate import evaluate
from recpipe.trainers.model_dir import ModelDir
from recpipe.trainers.options import RunOptions, TrainOptions
from recpipe.trainers.train import train

from conftest import small_config_dict
from helpers import config_file, installed_copy


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


def _descendants(pid: int) -> list[tuple[int, str]]:
    out, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            out.append(child)
            todo.append(child[0])
    return out


def _env_of(pid: int) -> dict:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _has_tensorflow(pid: int) -> bool:
    """Whether TensorFlow's runtime library is mapped into the process."""
    return "libtensorflow_framework" in Path(f"/proc/{pid}/maps").read_text()


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


def _kill_once_checkpointed(proc, model_dir: str, victim, before_kill=None) -> None:
    """SIGKILL the first descendant process of `proc` that victim(pid, cmdline) picks, once `model_dir` holds a
    checkpoint (calling before_kill(proc's pid, the victim's pid) first, if given)."""
    _wait_for_checkpoint(proc, model_dir)
    found = []
    deadline = time.monotonic() + 60
    while not found and time.monotonic() < deadline:
        found = [pid for pid, cmd in _descendants(proc.pid) if pid != proc.pid and victim(pid, cmd)]
        time.sleep(0.2)
    assert found, _descendants(proc.pid)
    if before_kill is not None:
        before_kill(proc.pid, found[0])
    os.kill(found[0], signal.SIGKILL)


@pytest.mark.integration
def test_ps_strategy_trains_sharded_in_mixed_precision_and_restores_locally(tmp_path, preprocessed, small_cfg_path,
                                                                            trained, monkeypatch):
    """The PS strategy places the variables on both PS tasks and trains as well as the local strategy, whose
    evaluate restores its checkpoint. Keras' mixed precision cannot wrap a sharded Dense kernel (an
    AutoCastVariable needs a ResourceVariable), so it shards the embedding tables and nothing else, and bf16
    trains under it: with shards of at least 1 KiB here, a rule by size alone would shard the small model's
    Dense kernels too."""
    import tensorflow as tf

    import recpipe.trainers.strategies.ps
    from recpipe.trainers.strategies.ps import TablePartitioner
    partitioner = TablePartitioner({(1000, 16)}, 1 << 10, 4)
    assert partitioner(tf.TensorShape([1000, 16]), tf.float32) == [4, 1]
    assert partitioner(tf.TensorShape([477, 477]), tf.float32) == [1, 1]
    assert partitioner(tf.TensorShape([477]), tf.float32) == [1]
    monkeypatch.setattr(recpipe.trainers.strategies.ps, "MIN_SHARD_BYTES", 1 << 10)
    model_dir = str(tmp_path / "ps")
    said = []
    r = train(TrainOptions(preprocessed[0], model_dir, small_cfg_path,
                           run=RunOptions(strategy="ps", precision="bf16", steps=150)), say=said.append)
    assert r.steps_done == 150 and math.isfinite(r.final_loss)
    assert any("local PS cluster up: 2 workers" in s for s in said)
    shards = [f for f in os.listdir(os.path.join(model_dir, "checkpoints")) if ".data-" in f]
    assert len(shards) >= 2  # variables lived on more than one PS task
    ps_auc = evaluate(model_dir, preprocessed[0])["auc"]
    local_auc = evaluate(trained, preprocessed[0])["auc"]  # same config and steps, local strategy, fp32
    assert ps_auc > 0.6 and abs(ps_auc - local_auc) < 0.08, (ps_auc, local_auc)


@pytest.mark.system
def test_ps_job_survives_a_killed_worker(tmp_path, preprocessed, small_cfg_path):
    """A local PS cluster's worker killed mid-run (at its first checkpoint, 100 steps before the end) is
    restarted, and the job ends at its last step."""
    model_dir, temp = str(tmp_path / "ps_kill"), tmp_path / "tmp"
    temp.mkdir()
    proc = _train_cli(preprocessed[0], model_dir, "--config", small_cfg_path, "--strategy", "ps", "--steps", "150",
                      env={**os.environ, "TMPDIR": str(temp)})
    try:
        _wait_for_checkpoint(proc, model_dir)
        workers = [pid for pid, cmd in _children(proc.pid) if "recpipe.trainers.strategies.ps" in cmd and " worker " in cmd]
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "exited (-9); restarting it" in out, out
    assert out.strip().splitlines()[-1].startswith("train: 150 steps done"), out[-3000:]  # no teardown noise
    # A step whose worker died after pushing its update is re-run and applies it twice; the count stays the
    # steps run, and so do the checkpoint names.
    assert _latest_step(model_dir) == 150 and "step 151" not in out
    assert sorted(f for f in os.listdir(os.path.join(model_dir, "checkpoints")) if f.endswith(".index")) == \
        ["ckpt-100.index", "ckpt-150.index", "ckpt-50.index"]
    # the chief ends with os._exit, so no atexit handler removes AutoGraph's sources: they went to a
    # folder of its own, removed on the way out
    assert not list(temp.iterdir()), sorted(p.name for p in temp.iterdir())[:5]


@pytest.mark.system
def test_killed_trainer_resumes_from_last_checkpoint(tmp_path, preprocessed, small_cfg_path):
    model_dir = str(tmp_path / "kill")
    proc = _train_cli(preprocessed[0], model_dir, "--config", small_cfg_path, "--steps", "3000")
    _wait_for_checkpoint(proc, model_dir)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lost_at = _latest_step(model_dir)
    assert 0 < lost_at < 3000
    said = []  # the rerun resumes there and trains on to a few steps past it
    r = train(TrainOptions(preprocessed[0], model_dir, small_cfg_path, run=RunOptions(steps=lost_at + 10)),
              say=said.append)
    assert r.resumed_from == lost_at and r.steps_done == lost_at + 10 and _latest_step(model_dir) == lost_at + 10
    assert any("resuming from" in s and f"at step {lost_at}" in s for s in said)


@pytest.mark.system
def test_horovod_two_ranks_rank0_writes_and_resumes(tmp_path, preprocessed, trained):
    """Two ranks train, rank 0 alone writing the checkpoints. A rank killed mid-run (as by the kernel's OOM killer)
    is named with its signal and the last checkpoint by the launcher, which runs without TensorFlow
    (recpipe.trainers.strategies.hvd_job: it reads that step from the checkpoints' state file), its error the run's last line; a rerun
    resumes from that checkpoint, and the model is as good as the local strategy's. The two runs exchange the
    embedding gradients in the two ways other than the default (auto through the tape in one grouped exchange, as
    every run in test_cluster.py): densified, every table, then per table (auto: the C tables of a few values go
    dense and user_id's 1,000 rows are allgathered), each accumulated over 2 micro-batches of the batch and
    exchanged in 2 grouped collectives per kind; every Horovod run ends with its ranks' weights checked equal."""
    import yaml
    from conftest import small_config_dict

    def config(mode: str) -> str:
        d = small_config_dict()
        d["train"].update(sparse_gradients=mode, gradient_groups=2, horovod_cycle_time_ms=2.5)
        d["train"].setdefault("tuning", {})["grad_accum_steps"] = 2
        path = tmp_path / f"{mode}.yaml"
        path.write_text(yaml.safe_dump(d))
        return str(path)

    model_dir = str(tmp_path / "hvd")
    proc = subprocess.Popen([sys.executable, "-m", "recpipe.cli", "train", "--data", preprocessed[0], "--model-dir",
                             model_dir, "--config", config("dense"), "--strategy", "horovod", "--np", "2", "--steps",
                             "3000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    loaded = {}
    try:
        _kill_once_checkpointed(
            proc, model_dir, lambda pid, cmd: cmd.split()[:1] == [sys.executable] and "-m recpipe.cli train" in cmd
            and _env_of(pid).get("HOROVOD_RANK") == "1",
            lambda launcher, rank: loaded.update(launcher=_has_tensorflow(launcher), rank=_has_tensorflow(rank)))
        err = proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    lost_at = _latest_step(model_dir)
    line = err.strip().splitlines()[-1]  # the last line: not buried under what TensorFlow logs at exit
    assert proc.returncode == 1 and "horovod rank 1 died (killed by SIGKILL)" in line, err[-3000:]
    assert f"the last checkpoint is step {lost_at} in " in line and "rerun the same command to resume" in line, line
    assert loaded == {"launcher": False, "rank": True}
    assert 50 <= lost_at < 150
    assert ModelDir(model_dir).config().train.sparse_gradients == "dense"  # the config the ranks were given
    said = []
    r = train(TrainOptions(preprocessed[0], model_dir, config("auto"),
                           run=RunOptions(strategy="horovod", np=2, steps=150)),
              say=said.append)
    assert r.resumed_from == lost_at and r.steps_done == 150 and any("2 ranks" in s for s in said)
    ckpts = sorted(f for f in os.listdir(os.path.join(model_dir, "checkpoints")) if f.endswith(".index"))
    assert ckpts == ["ckpt-100.index", "ckpt-150.index", "ckpt-50.index"]  # rank 0 alone wrote them, once each
    state = json.loads((tmp_path / "hvd" / "train_state.json").read_text())
    assert state["sparse_gradients"] == "auto" and state["gradient_groups"] == 2 and state["ranks"] == 2
    assert state["cycle_time_ms"] == 2.5
    hvd_auc = evaluate(model_dir, preprocessed[0])["auc"]
    local_auc = evaluate(trained, preprocessed[0])["auc"]  # 150 local steps of half the examples
    assert hvd_auc > 0.6 and abs(hvd_auc - local_auc) < 0.08, (hvd_auc, local_auc)


@pytest.mark.system
def test_a_dead_ps_task_is_named_with_its_signal_and_the_checkpoint(tmp_path, preprocessed):
    """A PS task of the local PS cluster killed mid-run: the chief failed with TensorFlow's
    'UnavailableError: ... Connection reset by peer [Op:__inference_tf_function_save_...]' and then
    about 380 lines of its remote context's teardown."""
    d = small_config_dict()
    d["train"]["checkpoint_every"] = 5  # the kill comes right after the first
    model_dir = str(tmp_path / "ps")
    proc = subprocess.Popen([sys.executable, "-m", "recpipe.cli", "train", "--model-dir", model_dir, "--data",
                             preprocessed[0], "--config", config_file(tmp_path, d), "--strategy", "ps", "--ps-workers",
                             "1", "--steps", "20000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _kill_once_checkpointed(proc, model_dir, lambda pid, cmd: "-m recpipe.trainers.strategies.ps" in cmd
                                and cmd.split()[-2:] == ["ps", "1"])
        err = proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]
    line = err.strip().splitlines()[-1]  # the last line: not buried under what TensorFlow logs at exit
    assert re.search(r"PS task 1 \(127\.0\.0\.1:\d+: killed by SIGKILL\) died, so the job stopped: a PS task holds "
                     r"its share of the variables in memory and cannot rejoin; ", line), line
    assert "the last checkpoint is step" in line and "rerun the same command to resume" in line, line


@pytest.mark.unit
def test_auto_sparse_gradients_densify_only_tables_a_dense_allreduce_moves_less_of():
    """sparse_gradients auto: per table, from static shapes (every rank decides alike)."""
    import tensorflow as tf

    from recpipe.trainers.strategies.hvd import _exchange_dense

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


_ONE_RANK_STEP = """
import json, sys
from recpipe.features.config import load_config  # first: features sets TF_USE_LEGACY_KERAS before TensorFlow loads
import horovod.tensorflow as hvd
from recpipe.features.preprocessed import PreprocessedData
from recpipe.trainers.data import make_dataset
from recpipe.trainers.strategies.hvd import _step_function
from recpipe.trainers.models import compiled_model
from recpipe.trainers.optim import optimizer_for
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


@pytest.mark.integration
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


@pytest.mark.unit
def test_horovod_cycle_time_comes_from_the_config_unless_the_environment_sets_it(monkeypatch):
    """train.horovod_cycle_time_ms reaches Horovod as HOROVOD_CYCLE_TIME; a value the environment
    already has (horovodrun --cycle-time-ms sets it) wins; a value Horovod would misread is refused."""
    from recpipe.features.config import ConfigError, config_to_dict, load_config, parse_config
    from recpipe.samples import repo_configs
    from recpipe.trainers.errors import TrainError
    from recpipe.trainers.strategies.hvd import CYCLE_TIME_ENV, horovod_cycle_time_ms
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


@pytest.mark.unit
def test_every_rank_gets_the_launchers_input_flags(tmp_path):
    """A rank is a `recpipe train` of its own: what the launcher was told about input reaches it."""
    from recpipe.trainers.strategies.hvd_launch import rank_command
    opts = TrainOptions("DATA", str(tmp_path), None, run=RunOptions(strategy="horovod", np=2), warm_start="OLD",
                        synthetic_input=True)
    cmd = rank_command(opts)
    assert "--synthetic-input" in cmd and cmd[cmd.index("--warm-start") + 1] == "OLD"
    assert "--synthetic-input" not in rank_command(TrainOptions("DATA", str(tmp_path), None))


@pytest.mark.unit
def test_hosts_are_for_horovod():
    """--hosts starts each host's Horovod ranks: with another strategy it was ignored (or, under `auto`, used if
    the advisor picked Horovod) without a word."""
    with pytest.raises(TrainError, match="hosts: --hosts starts each host's Horovod ranks; it needs --strategy "
                                         "horovod, not ps"):
        RunOptions(strategy="ps", hosts="a,b")
    with pytest.raises(TrainError, match="host_index: 2 is not one of the 2 hosts"):
        RunOptions(strategy="horovod", hosts="a,b", host_index=2)


@pytest.mark.unit
def test_advisor_traffic_model():
    from recpipe.trainers.advisor import predict
    # dense-heavy (50M dense, few embedding rows touched): ring-allreduce wins
    ar, ps = predict(sparse=1_000_000, dense=50_000_000, unique_rows=2_000, dim=16, step_s=0.05, workers=8,
                     ps_tasks=2, bandwidth_gbps=10)
    assert ar < ps
    # sparse-heavy (huge tables, 200k rows touched per batch, tiny MLP) with many workers: PS wins
    ar, ps = predict(sparse=500_000_000, dense=200_000, unique_rows=200_000, dim=64, step_s=0.05, workers=64,
                     ps_tasks=16, bandwidth_gbps=10)
    assert ps < ar


@pytest.mark.unit
def test_advisor_counts_the_tables_auto_allreduces_whole():
    """The advisor's Horovod bytes follow train.sparse_gradients: with auto, a small table goes whole into
    the ring (as the trainer exchanges it) instead of N-1 ranks' rows into the allgather."""
    from recpipe.trainers.advisor import TableTraffic, Traffic, link_bytes
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


@pytest.mark.integration
def test_advise_refuses_a_calibration_with_a_null_overhead(tmp_path):
    """A cluster bench that measured no finite overhead writes null (bench JSON has no NaN): `advise
    --calibration` names the key, where it built its prediction on it."""
    import json

    from recpipe.trainers.advisor import Overheads
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


@pytest.mark.integration
def test_advise_probe_and_cli(tmp_path, preprocessed, small_cfg, small_cfg_path):
    import json

    from recpipe.features.artifact import TransformArtifact
    from recpipe.trainers.advisor import advise
    art = TransformArtifact.read(os.path.join(preprocessed[0], "transform"))
    advice = advise(small_cfg, art, preprocessed[0], workers=2, ps_tasks=2)
    assert advice.strategy in ("ps", "horovod") and advice.step_compute_s > 0 and advice.unique_rows_per_batch > 0
    assert advice.sparse_gradients == "auto" and 0 < advice.dense_tables <= advice.tables == len(art.table_sizes())
    assert advice.sparse_params == sum(t * 8 for t in art.table_sizes().values())  # all dims are 8 here
    tiny = advise(small_cfg, art, preprocessed[0], workers=2, ps_tasks=2, worker_memory_bytes=1000)
    assert tiny.strategy == "ps" and "must be sharded" in tiny.reason
    out = subprocess.run([sys.executable, "-m", "recpipe.cli", "advise", "--data", preprocessed[0], "--config",
                          small_cfg_path, "--np", "8", "--output", str(tmp_path / "a.json")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "advise: -> " in out.stdout and json.loads(Path(tmp_path / "a.json").read_text())["workers"] == 8


@pytest.mark.unit
def test_a_dead_ranks_own_error_reaches_the_launchers_message(tmp_path):
    """The launcher names why a rank died: that rank's own last error line, not horovodrun's and not
    another rank's (a collective failing because this rank was killed)."""
    from recpipe.trainers.strategies.hvd_launch import rank_died
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


@pytest.mark.unit
def test_a_rank_death_that_only_shows_another_ranks_end_is_not_first_hand():
    """Across hosts, a host reports its rank's death to the others only when it is first-hand: a rank whose
    collectives failed because another rank ended would otherwise be named in place of the one that did."""
    from recpipe.trainers.strategies.hvd_launch import rank_death
    assert rank_death(1, -9).first_hand  # killed (the OOM killer): the others see only their collectives fail
    assert rank_death(1, 1, output=["recpipe train: error: Horovod ranks ended with different weights"]).first_hand
    assert rank_death(1, 1, output=["RuntimeError: out of memory"]).first_hand
    for symptom in ["UnknownError: [[{{node HorovodGroupedAllreduce_UnsortedSegmentSum_0}}]] [Op:__inference_step_1]",
                    "UnknownError: Gloo: connection closed by peer [10.78.0.2]:4410",
                    "HTTP GET request failed too many times, aborting.",
                    "Wait timeout after 300 seconds for key(s): 1"]:
        assert not rank_death(0, 1, output=[symptom]).first_hand, symptom
    assert not rank_death(0, -6).first_hand and not rank_death(0, -15).first_hand  # Gloo's abort, our terminate


@pytest.mark.unit
def test_horovod_ranks_must_hold_the_same_shards():
    """A host whose copy of the shards was partial (a file missing, one cut short: a copy still going on)
    passed the ranks' check, which compared the transform alone: each rank reads its share of the shards it
    lists, so rows were read twice or never, without a word."""
    import copy
    from recpipe.trainers.errors import TrainError
    from recpipe.trainers.strategies.hvd import _check_ranks_train_one_model
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


def _rank(**given) -> dict:
    """What a Horovod rank tells the others before training (recpipe.trainers.strategies.hvd.run_rank), as rank 0 on 10.0.0.1."""
    return {"host": "10.0.0.1", "data": "/data", "code": {}, "transform": {"vocabularies": "v", "dense": {}},
            "config": {"train": {"steps": 10}}, "steps": 10, "precision": "fp32", "shards": None, **given}


@pytest.mark.unit
def test_horovod_ranks_must_train_with_one_config(tmp_path, small_cfg_path):
    """A host given another --config stepped with its own learning rate, without a word: the ranks compare the
    configs their hosts loaded and name the keys that differ (across hosts: test_cluster.py's ranks' checks)."""
    import yaml

    from recpipe.features.config import config_to_dict, load_config
    from recpipe.trainers.strategies.hvd import _check_ranks_train_one_model
    other = yaml.safe_load(Path(small_cfg_path).read_text())
    other["train"]["learning_rate"] *= 2
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    ours = config_to_dict(load_config(small_cfg_path))
    _check_ranks_train_one_model([_rank(config=ours), _rank(host="10.0.0.2", config=ours)])
    with pytest.raises(TrainError, match=re.escape(
            "rank 1 (host 10.0.0.2, /data) trains with another config or run than rank 0 (host 10.0.0.1, /data): "
            "train.learning_rate differ; every host must run the same --config, --steps and --precision")):
        _check_ranks_train_one_model([_rank(config=ours), _rank(host="10.0.0.2", config=config_to_dict(
            load_config(str(tmp_path / "other.yaml"))))])


@pytest.mark.integration
def test_horovod_ranks_must_run_one_install(tmp_path):
    """A host with another install of recpipe (here its own trainers/, another optimizer epsilon, first on its
    path) built and stepped the model with its own code, without a word: the code identity a rank computes
    (a hash of the source its imports find) differs there, and the ranks' check names the package."""
    from recpipe.common.code_identity import code_identity
    from recpipe.trainers.strategies.hvd import SAME_SOURCE, SAME_VERSIONS, _check_ranks_train_one_model
    install = tmp_path / "install"
    optim = installed_copy(install) / "trainers" / "optim.py"
    optim.write_text(optim.read_text() + "\nADAGRAD_EPSILON = 1e-6  # another version\n")
    probe = ("import json, sys; from recpipe.common.code_identity import code_identity; "
             "print(json.dumps(code_identity(*json.loads(sys.argv[1]))))")

    def identity(*path: str) -> dict:  # as a rank on a host with `path` first finds it, from outside the source tree
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]))
        out = subprocess.run([sys.executable, "-c", probe, json.dumps([SAME_SOURCE, SAME_VERSIONS])], env=env,
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)
    ours, theirs = identity(), identity(str(install))
    assert ours == code_identity(SAME_SOURCE, SAME_VERSIONS)
    _check_ranks_train_one_model([_rank(code=ours), _rank(host="10.0.0.2", code=ours)])
    with pytest.raises(TrainError) as e:
        _check_ranks_train_one_model([_rank(code=ours), _rank(host="10.0.0.2", code=theirs)])
    assert str(e.value).startswith(
        f"rank 1 (host 10.0.0.2, /data) runs other code than rank 0 (host 10.0.0.1, /data): recpipe.trainers "
        f"{theirs['recpipe.trainers']} (rank 0: {ours['recpipe.trainers']}); each rank builds and steps the model with its own "
        f"host's install"), e.value


@pytest.mark.integration
def test_the_rendezvous_watcher_ends_quietly_once_gloo_clears_its_keys():
    """The first host's watcher of Gloo's rendezvous: the keys leave the store once every rank has joined,
    which the watcher took for every rank missing and died on min() of no rank (a traceback on host 0 in 3
    of 4 launches). It must end without a word instead, and name a rank still missing before that."""
    import threading

    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    from recpipe.localserver import free_port
    from recpipe.trainers.strategies.hvd_hosts import _start_rendezvous, _watch_rendezvous
    plan = get_host_assignments(parse_hosts("a:1,b:1"), 2)
    server = _start_rendezvous("127.0.0.1", free_port(), plan)
    said, errors = [], []

    def watch(done, after):
        try:
            _watch_rendezvous(server, plan, {"a": 0, "b": 1}, said.append, done, after=after, every=30)
        except Exception as e:  # noqa: BLE001 - the failure under test, reported by the asserts below
            errors.append(e)

    def rank_0_joined():
        with server.cache_lock:
            server.cache.setdefault("global", {})["rank_0"] = b"addr"

    try:
        rank_0_joined()
        done = threading.Event()
        watcher = threading.Thread(target=watch, args=(done, 0.5))
        watcher.start()
        time.sleep(2.6)  # the looks at 1 s and 2 s see rank 0 alone: rank 1 is named once
        done.set()
        watcher.join(timeout=5)
        assert len(said) == 1 and "waiting for rank 1 (host 1, b)" in said[0] and "since rank 0 joined" in said[0]

        said.clear()
        rank_0_joined()
        watcher = threading.Thread(target=watch, args=(threading.Event(), 1.5))
        watcher.start()
        time.sleep(1.3)  # the look at 1 s sees rank 0
        with server.cache_lock:
            server.cache["global"].clear()  # rank 1 joined and Gloo finished before the next look
        watcher.join(timeout=5)
        assert not watcher.is_alive() and errors == [] and said == []
    finally:
        server.shutdown()


@pytest.mark.unit
def test_the_task_watch_declares_a_silent_task_and_shuts_its_connections():
    """TaskWatch declares a task silent for its timeout (not before), shuts this process's connections to it
    so an RPC waiting on one fails at once, and says when it answers again."""
    import socket

    from recpipe.trainers.strategies.ps_tasks import TaskWatch, disconnect
    from recpipe.trainers.strategies.tf_config import PSCluster
    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"
    client = socket.create_connection(server.getsockname()[:2], timeout=5)
    peer, _ = server.accept()
    assert disconnect(address) == 1
    assert client.recv(1) == b""  # shut down: a read waiting on it ends now
    client.close()
    peer.close()
    server.close()  # the "worker" stops answering
    said = []
    watch = TaskWatch(PSCluster("127.0.0.1:1", [address], []), timeout=10, say=said.append)
    watch.look(100.0)
    watch.look(109.0)
    assert not watch.cut_off and not said
    watch.look(110.0)
    assert list(watch.cut_off) == [("worker", 0)] and not watch.lost_ps
    assert said == [f"train: worker 0 ({address}: no answer for 10 s: Connection refused): lost "
                    f"(--task-timeout-seconds 10); its steps run on the other workers"]
    server = socket.create_server(("127.0.0.1", int(address.rsplit(":", 1)[1])))
    watch.look(111.0)
    assert not watch.cut_off and said[-1] == f"train: worker 0 ({address}: answers again)"
    server.close()
