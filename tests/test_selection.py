"""model.type auto (recpipe.trainers.selection): the candidates trained, the best kept on validation."""
from __future__ import annotations

import copy
import json
import os

import pytest
import yaml
from conftest import small_config_dict

from recpipe.common.errors import ConfigError
from recpipe.features.config import load_config, parse_config
from recpipe.features.schema import CANDIDATES, candidate_types
from recpipe.trainers.errors import TrainError
from recpipe.trainers.selection import CandidateResult, pick, with_type


def _result(t: str, v, status: str = "ok") -> CandidateResult:
    return CandidateResult(t, v, 50 if v is not None else None, 100, 1.0, status)


@pytest.mark.unit
def test_the_best_candidate_on_validation_is_kept_whichever_way_the_metric_improves():
    results = [_result("dcn_v2", 0.71), _result("logistic", 0.73), _result("dlrm", None, "failed: killed")]
    assert pick(results, "auc").type == "logistic"
    assert pick(results, "logloss").type == "dcn_v2"  # lower is better
    assert pick([_result("dcn_v2", 0.7), _result("logistic", 0.7)], "auc").type == "dcn_v2"  # ties: the first
    with pytest.raises(TrainError, match="no candidate has a validation score: dcn_v2 failed: no validation"):
        pick([_result("dcn_v2", None, "failed: no validation score")], "auc")


@pytest.mark.unit
def test_a_config_without_a_type_selects_and_reads_the_keys_of_its_candidates():
    data = _auto_dict()
    cfg = parse_config(data)
    assert cfg.model.type == "auto" and candidate_types(cfg.model) == CANDIDATES["ranking"] == ("dcn_v2", "logistic")
    logistic = with_type(cfg, "logistic")
    assert parse_config(_dump(logistic)).model.type == "logistic"  # its dump leaves cross_layers out
    bad = copy.deepcopy(data)
    bad["model"]["tower_layers"] = [8]
    with pytest.raises(ConfigError, match="model.tower_layers: model.type auto"):
        parse_config(bad)
    retrieval = candidate_types(parse_config({**data, "model": {"task": "retrieval", "query_features": ["user_id"],
                                                                 "candidate_features": ["item_id"]}}).model)
    assert retrieval == ("two_tower", "item_to_item")


def _auto_dict(steps: int = 100) -> dict:
    data = small_config_dict(steps)
    data["model"] = {"task": "ranking", "cross_layers": 1, "deep_layers": [32, 16]}
    data["split"]["validation_fraction"] = 0.25
    return data


def _dump(cfg) -> dict:
    from recpipe.features.config import config_to_dict
    return config_to_dict(cfg)


@pytest.mark.system
def test_auto_trains_each_candidate_keeps_the_best_on_validation_and_evaluate_reports_them(
        tmp_path, preprocessed_with_validation):
    from recpipe.trainers.evaluation.evaluate import evaluate
    from recpipe.trainers.options import TrainOptions
    from recpipe.trainers.train import train
    data_dir = preprocessed_with_validation[0]
    cfg_path = tmp_path / "auto.yaml"
    cfg_path.write_text(yaml.safe_dump(_auto_dict()))
    model_dir = tmp_path / "model"
    said: list[str] = []
    opts = TrainOptions(data_dir=data_dir, model_dir=str(model_dir), config_path=str(cfg_path))
    state = train(opts, say=said.append)
    selection = json.loads((model_dir / "selection.json").read_text())
    scores = {c["type"]: c["validation"] for c in selection["candidates"]}
    assert selection["metric"] == "auc" and set(scores) == {"dcn_v2", "logistic"}, selection
    assert all(c["status"] == "ok" and 0.4 < c["validation"] < 1 for c in selection["candidates"]), selection
    winner = max(scores, key=scores.get)
    assert selection["winner"] == winner
    assert load_config(model_dir / "config.yaml").model.type == winner
    kept = model_dir / "candidates" / winner
    assert (model_dir / "validation.json").read_text() == (kept / "validation.json").read_text()
    assert state.steps_done == 100
    assert any(line.startswith("[logistic] ") for line in said) and any(f"kept {winner}" in line for line in said)
    metrics = evaluate(str(model_dir), data_dir)
    assert metrics["selection"]["winner"] == winner and 0.4 < metrics["auc"] < 1
    said.clear()
    train(opts, say=said.append)  # a rerun resumes each candidate (nothing left to do) and keeps the same one
    assert json.loads((model_dir / "selection.json").read_text())["winner"] == winner
    assert sum("nothing to do" in line for line in said) == 2, said


@pytest.mark.integration
def test_auto_without_a_validation_split_trains_the_first_candidate_and_says_so(tmp_path, preprocessed):
    from recpipe.trainers.options import TrainOptions
    from recpipe.trainers.train import train
    data = _auto_dict(steps=50)
    del data["split"]["validation_fraction"]
    cfg_path = tmp_path / "auto.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    said: list[str] = []
    train(TrainOptions(data_dir=preprocessed[0], model_dir=str(tmp_path / "m"), config_path=str(cfg_path)),
          say=said.append)
    assert load_config(tmp_path / "m" / "config.yaml").model.type == "dcn_v2"
    assert not os.path.exists(tmp_path / "m" / "selection.json")
    assert any("no validation split" in line and "training dcn_v2" in line for line in said), said


@pytest.mark.integration
def test_auto_refuses_a_model_dir_holding_a_model_it_did_not_select(tmp_path, preprocessed_with_validation):
    from recpipe.trainers.options import TrainOptions
    from recpipe.trainers.train import train
    named = tmp_path / "m"
    named.mkdir()
    (named / "config.yaml").write_text(yaml.safe_dump(preprocessed_with_validation[2]))  # a dcn_v2 model's
    cfg_path = tmp_path / "auto.yaml"
    cfg_path.write_text(yaml.safe_dump(_auto_dict()))
    with pytest.raises(TrainError, match="holds a model not trained by model.type auto"):
        train(TrainOptions(data_dir=preprocessed_with_validation[0], model_dir=str(named), config_path=str(cfg_path)),
              say=lambda _: None)
    assert sorted(p.name for p in named.iterdir()) == ["config.yaml"]  # nothing written beside it


@pytest.mark.system
def test_a_run_that_fails_is_a_failed_result_naming_its_last_line(tmp_path, preprocessed_with_validation):
    from recpipe.trainers.selection import train_subprocess
    said: list[str] = []
    r = train_subprocess("trial 0", str(tmp_path / "missing.yaml"), preprocessed_with_validation[0],
                         str(tmp_path / "m"), [], said.append)
    assert r.validation is None and r.best_step is None and r.status.startswith("failed: ")
    assert "missing.yaml" in r.status and said and said[-1] == f"[trial 0] {r.status[len('failed: '):]}"
