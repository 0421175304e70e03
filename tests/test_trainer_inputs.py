"""Training, evaluation and export on data they cannot use: non-finite normalisation statistics and a
diverging loss, a partial copy of the preprocessed folder (also on a PS worker's own host), data
preprocessed with another 'features' section or by another preprocess run, and an empty split each fail
naming the cause, and nothing is trained, scored or exported on it."""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from conftest import IN_MEMORY, small_config_dict
from recpipe.features.config import parse_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.localserver import free_port
from recpipe.pipeline.preprocess import PreprocessError, run_preprocess
from recpipe.serving.export.savedmodel import export_model
from recpipe.trainers.errors import TrainError
from recpipe.trainers.evaluation.evaluate import evaluate
from recpipe.trainers.model_dir import ModelDir
from recpipe.trainers.options import RunOptions, TrainOptions
from recpipe.trainers.train import train

from helpers import QUIET, config_file, day_table, set_column, write_table


@pytest.mark.integration
def test_non_finite_statistics_and_losses_fail_naming_the_cause(tmp_path, preprocessed, small_cfg, small_cfg_path):
    from recpipe.trainers.health import check_loss
    data = tmp_path / "data"
    shutil.copytree(preprocessed[0], data)
    meta_path = data / "transform" / "transform.json"
    meta = json.loads(meta_path.read_text())
    meta["dense_stats"]["I1"]["std"] = float("nan")
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(TrainError, match=r"dense feature\(s\) I1: its statistics"):
        check_loss(float("nan"), 50, small_cfg, str(data))
    d = small_config_dict()
    d["train"].update(optimizer="sgd", learning_rate=1e30)  # diverges: every input is finite
    cfg_path = tmp_path / "diverge.yaml"
    cfg_path.write_text(yaml.safe_dump(d))
    model_dir = tmp_path / "m"
    with pytest.raises(TrainError, match="lower train.learning_rate"):
        train(TrainOptions(preprocessed[0], str(model_dir), str(cfg_path), run=RunOptions(steps=60)), **QUIET)
    assert not list((model_dir / "checkpoints").glob("ckpt-*.index"))  # nothing was written


@pytest.mark.integration
def test_a_partial_copy_of_the_preprocessed_data_is_named(tmp_path, preprocessed, small_cfg_path):
    """A copy of the preprocessed folder cut short (a shard missing, or cut at a record's end) trained on fewer
    rows, and one copied over an older run's folder also on that run's shards (rows numbered by another
    vocabulary), without a word: the job lists every shard and its size, and training checks them."""
    from recpipe.trainers.data import DataError
    data = tmp_path / "copy"
    shutil.copytree(preprocessed[0], data)
    assert PreprocessedData(str(data)).copy_differences() == []
    shard = sorted((data / "train").glob("*.tfrecord"))[-1]
    size = shard.stat().st_size
    with open(shard, "rb") as fh:  # cut at the end of the first record: TensorFlow reads the rest as no rows
        first = 12 + int.from_bytes(fh.read(8), "little") + 4
    with open(shard, "r+b") as fh:
        fh.truncate(first)
    (data / "eval" / "part-00000-of-00002.tfrecord").write_bytes(b"")  # an older run's shard left behind
    expected = (f"{data} holds other shards than its preprocess run wrote: its eval/ also has "
                f"part-00000-of-00002.tfrecord; train/{shard.name} is {first:,} bytes against {size:,} (a copy cut "
                f"short or still going on, or an older run's shards left beside this one's?)")
    with pytest.raises(DataError, match=re.escape(expected)):
        train(TrainOptions(str(data), str(tmp_path / "model"), small_cfg_path, run=RunOptions(steps=5)), **QUIET)
    # a PS worker reads its own host's copy, which the chief does not see: it checks it before it serves
    cluster = {"chief": ["127.0.0.1:1"], "worker": [f"127.0.0.1:{free_port()}"], "ps": ["127.0.0.1:2"]}
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    worker = subprocess.run([sys.executable, "-m", "recpipe.cli", "train", "--data", str(data), "--model-dir",
                             str(tmp_path / "model"), "--config", small_cfg_path, "--strategy", "ps"], env=env,
                            capture_output=True, text=True, timeout=300)  # serving, it would run until killed
    assert worker.returncode != 0 and f"PS worker 0 ({cluster['worker'][0]}): {expected}" in worker.stderr, \
        worker.stderr[-3000:]


@pytest.mark.integration
def test_data_from_another_config_is_named_not_a_tensorflow_trace(tmp_path, preprocessed, trained, small_log):
    d = small_config_dict()
    d["features"]["dense"] = d["features"]["dense"][:1]
    other = str(tmp_path / "other")
    run_preprocess(parse_config(d), small_log, other, IN_MEMORY, **QUIET)
    with pytest.raises(TrainError, match="preprocessed with another 'features' section than the model in"):
        evaluate(trained, other)
    with pytest.raises(TrainError, match="another 'features' section"):
        train(TrainOptions(other, trained, run=RunOptions(steps=200)), **QUIET)


@pytest.mark.integration
def test_data_of_another_preprocess_run_is_named_not_scored(tmp_path, preprocessed, trained, small_log, small_cfg):
    """Same config, another run (other logs, another day): its IDs stand for other values. With tables
    of the same sizes, evaluate scored them and a resumed training trained on them, without a word."""
    rerun = str(tmp_path / "rerun")  # the same job on the same logs gives the same IDs: accepted
    run_preprocess(small_cfg, small_log, rerun, IN_MEMORY, **QUIET)
    assert evaluate(trained, rerun)["auc"] == evaluate(trained, preprocessed[0])["auc"]

    def other_run(name: str, change) -> str:
        root = tmp_path / name
        shutil.copytree(preprocessed[0], root)
        change(root / "transform")
        return str(root)

    def edit(path: Path, change) -> None:
        body = json.loads(path.read_text())
        change(body)
        path.write_text(json.dumps(body))

    def swap_first_two(body):
        body["values"][:2] = body["values"][1::-1]
    swapped = other_run("swapped", lambda t: edit(t / "vocab" / "C1.json", swap_first_two))
    first, second = json.loads((Path(preprocessed[0]) / "transform" / "vocab" / "C1.json").read_text())["values"][:2]
    named = (rf"{re.escape(swapped)}: preprocessed by another run than the data the model in {re.escape(trained)} was "
             rf"trained on, so its "
             rf"IDs stand for other values: feature 'C1': 2 of the \d+ IDs both vocabularies hold stand for other "
             rf"values \(ID 0: '{first}' in the model's, '{second}' in the data's\)\.")
    own = re.escape(preprocessed[0])
    with pytest.raises(TrainError, match=named + rf" Evaluate it on data of the run it was trained on \({own}\)"):
        evaluate(trained, swapped)
    resumed = str(tmp_path / "resumed")
    shutil.copytree(trained, resumed)
    with pytest.raises(TrainError, match=rf"in a new --model-dir \(--warm-start {re.escape(resumed)} carries"):
        train(TrainOptions(swapped, resumed, run=RunOptions(steps=200)), **QUIET)
    assert ModelDir(resumed).latest_step() == ModelDir(trained).latest_step()
    with pytest.raises(TrainError, match=r"Export with the data it was trained on \(leave --data out"):
        export_model(trained, str(tmp_path / "export"), data_dir=swapped)
    assert not glob.glob(str(tmp_path / "export" / "*"))

    def later_day(t: Path) -> None:  # a later run with --previous-transform: the same IDs and new ones
        edit(t / "vocab" / "item_id.json", lambda b: b["values"].extend(["new-a", "new-b"]))
        edit(t / "transform.json", lambda m: m["dense_stats"]["I2"].update(mean=m["dense_stats"]["I2"]["mean"] + 1))
    with pytest.raises(TrainError) as e:
        evaluate(trained, other_run("later", later_day))
    assert re.search(r"feature 'item_id': the data's vocabulary holds the model's \d+ values under the same IDs and "
                     r"2 more \(IDs \d+ and up\): from a later run that extended it", str(e.value))
    assert re.search(r"dense feature 'I2' is normalised with mean [\d.]+, std [\d.]+ in the model's transform and "
                     r"mean [\d.]+, std [\d.]+ in the data's", str(e.value))


@pytest.mark.integration
def test_empty_splits_fail_in_their_own_words(tmp_path, small_log, small_cfg, preprocessed):
    t = day_table(small_log)
    constant = write_table(tmp_path / "c" / "p.parquet", set_column(t, "ts", [1_700_000_000] * t.num_rows, pa.int64()))
    with pytest.raises(PreprocessError, match="the eval split is empty"):
        run_preprocess(small_cfg, constant, str(tmp_path / "o1"), IN_MEMORY, **QUIET)
    d = small_config_dict()
    d["split"]["on_empty"] = "warn"
    said = []
    run_preprocess(parse_config(d), constant, str(tmp_path / "o2"), IN_MEMORY, say=said.append)
    assert any("WARNING: the eval split is empty" in s for s in said)
    with pytest.raises(TrainError, match="the eval split is empty"):
        evaluate(_trained_on(tmp_path, str(tmp_path / "o2"), d), str(tmp_path / "o2"))
    all_bad = write_table(tmp_path / "b" / "p.parquet", set_column(t, "label", [7] * t.num_rows, pa.int64()))
    with pytest.raises(PreprocessError, match="the train split is empty: every row was dead-lettered"):
        run_preprocess(small_cfg, all_bad, str(tmp_path / "o3"), IN_MEMORY, **QUIET)
    assert not [p for p in os.listdir(tmp_path) if ".staging-" in p]


def _trained_on(tmp_path, data: str, d: dict) -> str:
    model_dir = str(tmp_path / "m_empty_eval")
    train(TrainOptions(data, model_dir, config_file(tmp_path, d), run=RunOptions(steps=5)), **QUIET)
    return model_dir
