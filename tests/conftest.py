"""Test tiers and the shared, session-scoped artifacts.

Every test carries exactly one tier marker (registered in pytest.ini, checked at collection):

- unit: pure logic and small I/O in this process: no subprocess, no Beam job, no training, no traffic
  beyond loopback (_unit_guard fails the test), and no session or module fixture but the light ones
  (UNIT_FIXTURES). `make test-fast` runs this tier.
- integration: one stage end to end in this process or its own (a Beam run, a training, an export, a server).
- system: several stages or processes together: the CLI chain, clusters in network namespaces, Airflow,
  Dask, servers under load.
- quality: statistical claims about models (each with margins that hold across seeds).
- bench: the quick run of every `recpipe bench` suite.

`make test` runs every tier, the unit tier first. The session fixtures produce each stage once with the
real component (Beam DirectRunner, TFRS training, SavedModel export); tests that need a later stage reuse
them instead of rebuilding the chain.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from recpipe.common import tf_env  # noqa: F401  (before any test module imports TensorFlow)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
SHARED_DATA = REPO.parent / "shared" / "data" / "criteo_sample"
IN_MEMORY = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


# ----------------------------------------------------------------------------- tiers
TIERS = ("unit", "integration", "system", "quality", "bench")
# The session fixtures a unit test may ask for: they cost no Beam job or training. Function-scoped fixtures run
# under _unit_guard; wider-scoped ones are set up before it, so a unit test may use only these.
UNIT_FIXTURES = {"tmp_path_factory", "small_cfg", "small_cfg_path", "small_log"}


def _tier_problems(item) -> list[str]:
    tiers = [m.name for m in item.iter_markers() if m.name in TIERS]
    if len(tiers) != 1:
        return [f"{item.nodeid}: {len(tiers)} tier markers ({', '.join(tiers) or 'none'}); give it exactly one of "
                f"{', '.join(TIERS)}"]
    if tiers[0] != "unit":
        return []
    defs = item._fixtureinfo.name2fixturedefs
    heavy = sorted(name for name in item.fixturenames
                   if name in defs and defs[name][-1].scope != "function" and name not in UNIT_FIXTURES)
    return [f"{item.nodeid}: a unit test uses the {', '.join(heavy)} fixture(s), set up before the unit guard; "
            "mark it integration or give it a lighter fixture"] if heavy else []


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Refuse a test without exactly one tier (or a unit test on a heavy fixture); run the unit tier first."""
    problems = [p for item in items for p in _tier_problems(item)]
    if problems:
        raise pytest.UsageError("test tiers:\n  " + "\n  ".join(problems))
    items.sort(key=lambda item: item.get_closest_marker("unit") is None)  # stable: file order within each


class UnitTierError(AssertionError):
    """A unit test did what only a heavier tier may do."""


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise UnitTierError(f"a unit test {what}; mark it integration or system")
    return refuse


@pytest.fixture(autouse=True)
def _unit_guard(request, monkeypatch):
    """In a unit test, starting a process, running a Beam pipeline or a training, or connecting beyond
    loopback fails the test (so the fast tier stays fast and hermetic)."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    import socket
    import subprocess

    import apache_beam

    import recpipe.trainers.train

    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("started a process"))
    monkeypatch.setattr(apache_beam.Pipeline, "run", _refuse("ran a Beam pipeline"))
    monkeypatch.setattr(recpipe.trainers.train, "_train", _refuse("trained a model"))
    connect = socket.socket.connect

    def loopback_only(sock, address):
        host = address[0] if isinstance(address, tuple) else address
        if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            raise UnitTierError(f"a unit test connected to {address}; mark it integration or system")
        return connect(sock, address)
    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    yield


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
    from recpipe.features.config import parse_config
    return parse_config(small_config_dict())


@pytest.fixture(scope="session")
def small_cfg_path(tmp_path_factory):
    import yaml
    path = tmp_path_factory.mktemp("cfg") / "small.yaml"
    path.write_text(yaml.safe_dump(small_config_dict()))
    return str(path)


@pytest.fixture(scope="session")
def small_log(tmp_path_factory):
    from recpipe.pipeline.synthetic import GenerateSpec, generate_log
    out = tmp_path_factory.mktemp("log")
    generate_log(GenerateSpec(rows=6000, days=2, seed=3, num_users=500, num_items=300), str(out))
    return str(out)


@pytest.fixture(scope="session")
def preprocessed(tmp_path_factory, small_cfg, small_log):
    from recpipe.pipeline.preprocess import run_preprocess
    out = tmp_path_factory.mktemp("pre") / "out"
    result = run_preprocess(small_cfg, small_log, str(out), IN_MEMORY, say=lambda _: None)
    return str(out), result


@pytest.fixture(scope="session")
def trained(tmp_path_factory, preprocessed, small_cfg_path):
    from recpipe.trainers.options import TrainOptions
    from recpipe.trainers.train import train
    model_dir = tmp_path_factory.mktemp("model") / "m"
    train(TrainOptions(data_dir=preprocessed[0], model_dir=str(model_dir), config_path=small_cfg_path),
          say=lambda _: None)
    return str(model_dir)


@pytest.fixture(scope="session")
def exported(tmp_path_factory, trained):
    from recpipe.serving.export.savedmodel import export_model
    base = tmp_path_factory.mktemp("export")
    return str(base), export_model(trained, str(base), version=1)


@pytest.fixture(scope="session")
def preprocessed_with_validation(tmp_path_factory, small_log):
    """The small log with a validation split (the last quarter of the train rows by time), and its config dict."""
    from recpipe.features.config import parse_config
    from recpipe.pipeline.preprocess import run_preprocess
    data = small_config_dict()
    data["split"]["validation_fraction"] = 0.25
    out = tmp_path_factory.mktemp("pre_val") / "out"
    result = run_preprocess(parse_config(data), small_log, str(out), IN_MEMORY, say=lambda _: None)
    return str(out), result, data
