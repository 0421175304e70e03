"""Damaged checkpoints and concurrent writers: resume, evaluate, export and warm start use the newest whole
checkpoint and name each damaged one; a model dir, an export base and a preprocess output have one writer at
a time, and a day's model is pushed once however many pushes start."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from conftest import IN_MEMORY, small_config_dict
from helpers import QUIET, run_cli

pytestmark = pytest.mark.integration


def _copy(trained: str, tmp_path) -> str:
    dest = tmp_path / "m"
    shutil.copytree(trained, dest, ignore=shutil.ignore_patterns(".writer.lock"))
    return str(dest)


def _truncate_data(prefix: str) -> str:
    data = prefix + ".data-00000-of-00001"
    with open(data, "r+b") as fh:
        fh.truncate(os.path.getsize(data) // 2)
    return data


def test_damage_names_the_file_and_reason(trained, tmp_path):
    from recpipe.trainers.checkpoints import checkpoint_prefixes, damage
    model = _copy(trained, tmp_path)
    newest, older, oldest = checkpoint_prefixes(os.path.join(model, "checkpoints"))
    assert [p.rsplit("-", 1)[1] for p in (newest, older, oldest)] == ["150", "100", "50"]
    assert damage(newest) is None
    _truncate_data(newest)
    assert "ckpt-150.data-00000-of-00001 holds" in damage(newest) and "cut short" in damage(newest)
    open(older + ".index", "r+b").truncate(0)
    assert damage(older) == "ckpt-100.index is empty"
    with open(older + ".index", "wb") as fh:
        fh.write(b"\0" * 4096)
    assert damage(older).startswith("ckpt-100.index cannot be read")
    os.remove(oldest + ".data-00000-of-00001")
    assert damage(oldest) == "ckpt-50.data-* is missing"


def test_evaluate_and_export_fall_back_to_the_newest_whole_checkpoint(trained, preprocessed, tmp_path):
    from recpipe.serving.export.savedmodel import export_model
    from recpipe.trainers.errors import TrainError
    from recpipe.trainers.evaluation.evaluate import evaluate
    from recpipe.trainers.model_dir import ModelDir
    model = _copy(trained, tmp_path)
    ckpts = os.path.join(model, "checkpoints")
    _truncate_data(os.path.join(ckpts, "ckpt-150"))
    warnings = []
    ModelDir(model).load_trained(say=warnings.append)
    assert len(warnings) == 1 and "ckpt-150 is damaged" in warnings[0] and "cut short" in warnings[0]
    metrics = evaluate(model, preprocessed[0])
    assert 0.5 < metrics["auc"] < 1
    assert os.path.isdir(export_model(model, str(tmp_path / "export"), version=1))
    os.remove(os.path.join(ckpts, "ckpt-100.index"))
    os.remove(os.path.join(ckpts, "ckpt-50.data-00000-of-00001"))
    with pytest.raises(TrainError) as e:
        ModelDir(model).load_trained(say=lambda _: None)
    assert str(e.value).startswith(f"{model}: no checkpoint restores (ckpt-150: ")
    assert "ckpt-100: ckpt-100.index is missing" in str(e.value)
    assert "ckpt-50: ckpt-50.data-* is missing" in str(e.value)


def test_resume_falls_back_and_removes_killed_saves(trained, preprocessed, tmp_path):
    from recpipe.trainers.options import TrainOptions
    from recpipe.trainers.train import train
    model = _copy(trained, tmp_path)
    ckpts = os.path.join(model, "checkpoints")
    _truncate_data(os.path.join(ckpts, "ckpt-150"))
    os.makedirs(os.path.join(ckpts, "ckpt-151_temp"))  # what a save killed midway leaves
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(small_config_dict(steps=200)))
    lines = []
    state = train(TrainOptions(data_dir=preprocessed[0], model_dir=model, config_path=str(cfg)), say=lines.append)
    assert state.steps_done == 200 and state.resumed_from == 100
    assert any("ckpt-151_temp, left by a checkpoint save that was killed" in ln for ln in lines)
    assert any("WARNING: checkpoint" in ln and "ckpt-150 is damaged" in ln for ln in lines)
    assert any(f"resuming from {ckpts}/ckpt-100 at step 100" in ln for ln in lines)
    assert not os.path.exists(os.path.join(ckpts, "ckpt-151_temp"))


def _hold(lock_path: str) -> subprocess.Popen:
    """Another process holding a DirLock on lock_path until killed."""
    code = ("import sys, time; from recpipe.common.dirlock import DirLock\n"
            f"with DirLock({lock_path!r}, 'x'):\n    print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_writer_is_refused_at_once_and_a_dead_holders_lock_is_taken(tmp_path):
    from recpipe.common.dirlock import DirLock, FolderInUseError
    lock = str(tmp_path / "d" / ".writer.lock")
    holder = _hold(lock)
    try:
        t0 = time.monotonic()
        with pytest.raises(FolderInUseError) as e:
            with DirLock(lock, "model dir d"):
                pass
        assert time.monotonic() - t0 < 1
        assert f"model dir d is in use by pid {holder.pid} on " in str(e.value)
        with pytest.raises(FolderInUseError, match="after waiting 0.5 s"):
            with DirLock(lock, "model dir d", wait_s=0.5):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with DirLock(lock, "model dir d"):  # the kernel released the dead process's lock
        with DirLock(lock, "model dir d"):  # re-entrant within a process
            pass
        assert json.loads(open(lock).read())["pid"] == os.getpid()


def test_train_and_preprocess_refuse_an_output_in_use(trained, small_log, small_cfg, tmp_path, small_cfg_path):
    from recpipe.common.dirlock import FolderInUseError
    from recpipe.pipeline.preprocess import run_preprocess
    model = _copy(trained, tmp_path)
    holder = _hold(os.path.join(model, ".writer.lock"))
    try:
        t0 = time.monotonic()
        p = run_cli("train", "--data", "unused", "--model-dir", model, "--config", small_cfg_path)
        assert p.returncode == 1, p.stderr
        assert f"recpipe train: error: model dir {model} is in use by pid {holder.pid}" in p.stderr
    finally:
        holder.kill()
        holder.wait()
    out = tmp_path / "pre"
    holder = _hold(str(tmp_path / ".pre.lock"))
    try:
        with pytest.raises(FolderInUseError, match=f"preprocess output {out} is in use by pid {holder.pid}"):
            run_preprocess(small_cfg, small_log, str(out), IN_MEMORY, **QUIET)
    finally:
        holder.kill()
        holder.wait()
    assert time.monotonic() - t0 < 60


def test_a_day_started_twice_is_pushed_once(trained, preprocessed, tmp_path, small_cfg_path):
    day = "2026-01-02"
    work = tmp_path / "work" / day
    shutil.copytree(preprocessed[0], work / "preprocessed")
    _copy(trained, work)  # WORK/DAY/m
    os.rename(work / "m", work / "model")
    (work / "metrics.json").write_text(json.dumps({"auc": 0.7}))
    (work / "blessing.json").write_text(json.dumps({"blessed": True, "reason": "test"}))
    project = tmp_path / "project.yaml"
    project.write_text(yaml.safe_dump({"log_root": str(tmp_path / "log"), "work_root": str(tmp_path / "work"),
                                       "export_base": str(tmp_path / "serving"), "config": small_cfg_path}))
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: run_cli("daily", "push", "--project", str(project), "--day", day), range(2)))
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    versions = [v for v in os.listdir(tmp_path / "serving") if v.isdigit()]
    assert len(versions) == 1
    said = [r.stdout + r.stderr for r in runs]
    assert sum(f"exported {tmp_path / 'serving' / versions[0]}" in s for s in said) == 1
    assert sum(f"is already version {versions[0]}; nothing to do" in s for s in said) == 1


def test_a_lock_beside_a_folder_is_removed_on_release(tmp_path):
    from recpipe.common.dirlock import DirLock
    lock = str(tmp_path / ".out.lock")
    with DirLock(lock, "x", remove=True):
        waiter_fd = os.open(lock, os.O_RDWR)  # opened before the holder deletes it
    assert not os.path.exists(lock)
    os.close(waiter_fd)
    with DirLock(lock, "x", remove=True):
        assert json.loads(open(lock).read())["pid"] == os.getpid()
    assert os.listdir(tmp_path) == []
