"""Shared, session-scoped artifacts: a small synthetic log, its preprocessed form, a trained model, an export.

Each stage is produced by the real component (Beam DirectRunner, TFRS training, SavedModel export);
tests that need a later stage reuse these instead of rebuilding the chain.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from features import tf_env  # noqa: F401  (before any test module imports TensorFlow)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
SHARED_DATA = REPO.parent / "shared" / "data" / "criteo_sample"
IN_MEMORY = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def small_config_dict(steps: int = 150) -> dict:
    """A compact config over the synthetic log: every feature kind, small tables, fast to train."""
    return {
        "name": "small_ctr",
        "input": {"timestamp": "ts"},
        "split": {"eval_fraction": 0.2},
        "label": {"column": "label"},
        "features": {
            "sparse": [
                {"name": "user_id", "column": "user_id", "hash_buckets": 1000, "embedding_dim": 8},
                {"name": "item_id", "column": "item_id", "vocab": {"min_count": 2, "max_size": 500, "oov_buckets": 2},
                 "embedding_dim": 8},
                {"name": "hist", "column": "hist_items", "multivalent": True, "share_embedding_with": "item_id"},
                *[{"name": f"C{i}", "column": f"C{i}", "vocab": {"min_count": 2, "oov_buckets": 1},
                   "embedding_dim": 8} for i in range(1, 7)],
            ],
            "dense": [
                {"name": "I1", "column": "I1", "transform": "log_zscore"},
                {"name": "I2", "column": "I2", "transform": "zscore", "fill": 1.0},
                {"name": "I3", "column": "I3", "transform": "bucketize", "num_buckets": 5},
            ],
        },
        "model": {"task": "ranking", "type": "dcn_v2", "cross_layers": 1, "deep_layers": [32, 16]},
        "train": {"batch_size": 128, "learning_rate": 0.05, "steps": steps, "checkpoint_every": 50},
    }


@pytest.fixture(scope="session")
def small_cfg():
    from features.config import parse_config
    return parse_config(small_config_dict())


@pytest.fixture(scope="session")
def small_cfg_path(tmp_path_factory):
    import yaml
    path = tmp_path_factory.mktemp("cfg") / "small.yaml"
    path.write_text(yaml.safe_dump(small_config_dict()))
    return str(path)


@pytest.fixture(scope="session")
def small_log(tmp_path_factory):
    from pipeline.synthetic import GenerateSpec, generate_log
    out = tmp_path_factory.mktemp("log")
    generate_log(GenerateSpec(rows=6000, days=2, seed=3, num_users=500, num_items=300), str(out))
    return str(out)


@pytest.fixture(scope="session")
def preprocessed(tmp_path_factory, small_cfg, small_log):
    from pipeline.preprocess import run_preprocess
    out = tmp_path_factory.mktemp("pre") / "out"
    result = run_preprocess(small_cfg, small_log, str(out), IN_MEMORY, say=lambda _: None)
    return str(out), result


@pytest.fixture(scope="session")
def trained(tmp_path_factory, preprocessed, small_cfg_path):
    from trainers.options import TrainOptions
    from trainers.train import train
    model_dir = tmp_path_factory.mktemp("model") / "m"
    train(TrainOptions(data_dir=preprocessed[0], model_dir=str(model_dir), config_path=small_cfg_path),
          say=lambda _: None)
    return str(model_dir)


@pytest.fixture(scope="session")
def exported(tmp_path_factory, trained):
    from serving.export import export_model
    base = tmp_path_factory.mktemp("export")
    return str(base), export_model(trained, str(base), version=1)


@pytest.fixture(scope="session")
def preprocessed_with_validation(tmp_path_factory, small_log):
    """The small log with a validation split (the last quarter of the train rows by time), and its config dict."""
    from features.config import parse_config
    from pipeline.preprocess import run_preprocess
    data = small_config_dict()
    data["split"]["validation_fraction"] = 0.25
    out = tmp_path_factory.mktemp("pre_val") / "out"
    result = run_preprocess(parse_config(data), small_log, str(out), IN_MEMORY, say=lambda _: None)
    return str(out), result, data
