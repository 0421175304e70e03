"""Distributed training and faults: ParameterServerStrategy on 127.0.0.1, worker and trainer kills."""
import os
import signal
import subprocess
import sys
import time


from trainers.evaluate import evaluate
from trainers.train import TrainOptions, train


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


def _train_cli(data, model_dir, *extra):
    return subprocess.Popen([sys.executable, "-m", "recpipe.cli", "train", "--data", data, "--model-dir", model_dir,
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_checkpoint(proc, model_dir, timeout=300):
    deadline = time.monotonic() + timeout
    while _latest_step(model_dir) == 0:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "no checkpoint written in time"
        time.sleep(0.3)


def test_ps_strategy_trains_sharded_and_restores_locally(tmp_path, preprocessed, small_cfg_path, trained):
    model_dir = str(tmp_path / "ps")
    said = []
    r = train(TrainOptions(preprocessed[0], model_dir, small_cfg_path, strategy="ps", steps=150), say=said.append)
    assert r.steps_done == 150
    assert any("local PS cluster up: 2 workers" in s for s in said)
    shards = [f for f in os.listdir(os.path.join(model_dir, "checkpoints")) if ".data-" in f]
    assert len(shards) >= 2  # variables lived on more than one PS task
    ps_auc = evaluate(model_dir, preprocessed[0])["auc"]
    local_auc = evaluate(trained, preprocessed[0])["auc"]  # same config and steps, local strategy
    assert ps_auc > 0.6 and abs(ps_auc - local_auc) < 0.08, (ps_auc, local_auc)


def test_ps_job_survives_a_killed_worker(tmp_path, preprocessed, small_cfg_path):
    model_dir = str(tmp_path / "ps_kill")
    proc = _train_cli(preprocessed[0], model_dir, "--config", small_cfg_path, "--strategy", "ps", "--steps", "600")
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
    # A step whose worker died after pushing its update is rescheduled: at-least-once, so >= 600.
    assert 600 <= _latest_step(model_dir) <= 602


def test_killed_trainer_resumes_from_last_checkpoint(tmp_path, preprocessed, small_cfg_path):
    model_dir = str(tmp_path / "kill")
    proc = _train_cli(preprocessed[0], model_dir, "--config", small_cfg_path, "--steps", "3000")
    _wait_for_checkpoint(proc, model_dir)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lost_at = _latest_step(model_dir)
    assert 0 < lost_at < 3000
    said = []
    r = train(TrainOptions(preprocessed[0], model_dir, small_cfg_path, steps=3000), say=said.append)
    assert r.resumed_from == lost_at and r.steps_done == 3000
    assert any("resuming from" in s and f"at step {lost_at}" in s for s in said)


def test_horovod_two_ranks_rank0_writes_and_resumes(tmp_path, preprocessed, small_cfg_path, trained):
    model_dir = str(tmp_path / "hvd")
    said = []
    r = train(TrainOptions(preprocessed[0], model_dir, small_cfg_path, strategy="horovod", np=2, steps=100),
              say=said.append)
    assert r.steps_done == 100 and any("2 ranks" in s for s in said)
    ckpts = sorted(f for f in os.listdir(os.path.join(model_dir, "checkpoints")) if f.endswith(".index"))
    assert ckpts == ["ckpt-100.index", "ckpt-50.index"]  # rank 0 alone wrote them, once each
    r2 = train(TrainOptions(preprocessed[0], model_dir, small_cfg_path, strategy="horovod", np=2, steps=150),
               say=said.append)
    assert r2.resumed_from == 100 and r2.steps_done == 150
    hvd_auc = evaluate(model_dir, preprocessed[0])["auc"]
    local_auc = evaluate(trained, preprocessed[0])["auc"]  # 150 local steps of half the examples
    assert hvd_auc > 0.6 and abs(hvd_auc - local_auc) < 0.08, (hvd_auc, local_auc)


def test_horovod_dense_sparse_gradients(tmp_path, preprocessed):
    import yaml
    from conftest import small_config_dict
    d = small_config_dict()
    d["train"]["sparse_gradients"] = "dense"
    path = tmp_path / "dense.yaml"
    path.write_text(yaml.safe_dump(d))
    r = train(TrainOptions(preprocessed[0], str(tmp_path / "m"), str(path), strategy="horovod", np=2, steps=20),
              say=lambda _: None)
    assert r.steps_done == 20
    state = __import__("json").load(open(tmp_path / "m" / "train_state.json"))
    assert state["sparse_gradients"] == "dense" and state["ranks"] == 2
