"""Model selection on the validation split: each checkpoint scored, the best weights kept and used,
early stopping, on every strategy; the wide logit, dropout and L2 on looked-up rows."""
import copy
import json
import os

import pytest
import yaml

from recpipe.trainers.evaluation.evaluate import evaluate
from recpipe.trainers.model_dir import ModelDir, load_trained
from recpipe.trainers.options import RunOptions, TrainOptions
from recpipe.trainers.evaluation.scoring import score
from recpipe.trainers.train import train
from recpipe.trainers.evaluation.validation import ValidationHistory

# Each test's tier is marked on it: the config checks are unit, the trainings integration, the Beam ->
# train -> evaluate/export chains system, and the two statistical claims (DCN-v2 over logistic regression,
# logQ correction over popularity) quality.


def _config(tmp_path, data: dict, **train_keys) -> str:
    data = copy.deepcopy(data)
    data["model"].update(wide=True, dropout=0.2)
    data["train"].update(embedding_l2=1e-4, **train_keys)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.integration
def test_early_stopping_keeps_the_best_checkpoint_and_evaluate_uses_it(tmp_path, preprocessed_with_validation):
    """A validation score at every checkpoint; training stops once `patience` of them have not beaten the
    best (at learning rate 0.5 the small log's validation AUC peaks after 20-120 steps, measured over
    seeds), and the best checkpoint's weights are the ones kept, evaluated and plotted."""
    data_dir, pre, data = preprocessed_with_validation
    assert pre.rows_validation > 500
    cfg_path = _config(tmp_path, data, learning_rate=0.5, steps=500, checkpoint_every=10,
                       early_stopping={"patience": 2})
    said = []
    state = train(TrainOptions(data_dir, str(tmp_path / "m"), cfg_path), say=said.append)
    md = ModelDir(str(tmp_path / "m"))
    h = ValidationHistory.read(md.validation_path)
    assert h.metric == "auc" and state.steps_done < 500, "no early stop: validation AUC kept improving"
    assert h.stopped_early_at == state.steps_done and h.since_best() == 2
    assert [e["step"] for e in h.history] == list(range(10, state.steps_done + 1, 10))
    assert h.best == max(e["auc"] for e in h.history) and state.best_step == h.best_step < state.steps_done
    assert any(f"early stop at step {state.steps_done}" in s for s in said)
    # the kept weights are the best checkpoint's, not the last one's: evaluate and export read them
    cfg, _, model = load_trained(md.root)
    assert score(cfg, model, data_dir, "validation")["auc"] == pytest.approx(h.best, abs=1e-9)
    metrics = evaluate(md.root, data_dir)
    assert metrics["auc"] > 0.6 and 0.5 < metrics["calibration"] < 2
    assert sum(b["rows"] for b in metrics["reliability"]) == metrics["examples"]
    assert metrics["baselines"]["constant_rate"]["logloss"] > metrics["logloss"]
    assert open(md.reliability_png, "rb").read(4) == b"\x89PNG"
    before = os.stat(md.reliability_png).st_mtime_ns
    evaluate(md.root, data_dir)
    assert os.stat(md.reliability_png).st_mtime_ns == before  # a rerun leaves the plot untouched (the daily DAG)
    # a rerun knows it is done
    again = train(TrainOptions(data_dir, md.root, cfg_path), say=said.append)
    assert again.steps_this_run == 0 and any("stopped early" in s for s in said)


@pytest.mark.integration
@pytest.mark.parametrize("strategy", ["ps", "horovod"])
def test_distributed_strategies_select_on_validation_too(tmp_path, preprocessed_with_validation, strategy):
    """A PS cluster's chief and Horovod's rank 0 score each checkpoint on validation once and keep the best."""
    data_dir, _, data = preprocessed_with_validation
    cfg_path = _config(tmp_path, data, steps=20, checkpoint_every=10)
    run = RunOptions(strategy=strategy, steps=20, np=2)
    state = train(TrainOptions(data_dir, str(tmp_path / strategy), cfg_path, run=run), say=lambda _: None)
    md = ModelDir(str(tmp_path / strategy))
    h = ValidationHistory.read(md.validation_path)
    assert [e["step"] for e in h.history] == [10, 20]  # the chief / rank 0 scored each checkpoint once
    assert md.best_weights() is not None and h.best == max(e["auc"] for e in h.history)
    assert json.load(open(md.state_path))["best_step"] == h.best_step == state.best_step
    cfg, _, model = load_trained(md.root)
    assert score(cfg, model, data_dir, "validation")["auc"] == pytest.approx(h.best, abs=1e-9)


@pytest.mark.integration
def test_without_a_validation_split_patience_is_reported_and_the_latest_checkpoint_kept(tmp_path, preprocessed):
    from conftest import small_config_dict
    cfg_path = _config(tmp_path, small_config_dict(), steps=20, checkpoint_every=10, early_stopping={"patience": 1})
    said = []
    state = train(TrainOptions(preprocessed[0], str(tmp_path / "m"), cfg_path), say=said.append)
    assert state.steps_done == 20 and state.best_step is None
    assert any("no validation split" in s for s in said)
    assert ModelDir(str(tmp_path / "m")).best_weights() is None


@pytest.mark.unit
def test_wide_logit_config_checks():
    from conftest import small_config_dict

    from recpipe.features.config import ConfigError, parse_config
    d = small_config_dict()
    d["model"] = {"task": "ranking", "type": "logistic", "wide": True}
    with pytest.raises(ConfigError, match=r"model.wide: model.type logistic \(ranking\) does not read it"):
        parse_config(d)
    d = small_config_dict()
    d["model"]["dropout"] = 1.0
    with pytest.raises(ConfigError, match=r"model.dropout: must be in \[0, 1\)"):
        parse_config(d)
    d = small_config_dict()
    d["train"]["early_stopping"] = {"metric": "recall_at_10"}
    with pytest.raises(ConfigError, match="train.early_stopping.metric: 'recall_at_10' is not a ranking metric"):
        parse_config(d)


@pytest.mark.system
def test_a_cross_declared_in_yaml_runs_through_beam_training_and_the_served_graph(tmp_path, small_log):
    """features.sparse[] {cross: [...], hash_buckets: N}: the Beam job, the trainer and the SavedModel
    compute the same crossed IDs (the export's skew check scores raw eval rows through the graph)."""
    from conftest import IN_MEMORY, small_config_dict

    from recpipe.features.config import parse_config
    from recpipe.pipeline.preprocess import run_preprocess
    from recpipe.serving.export.savedmodel import export_model
    from recpipe.serving.version import ExportBase
    data = small_config_dict(steps=10)
    data["features"]["sparse"].append({"name": "user_x_item", "cross": ["user_id", "item_id"], "hash_buckets": 4000,
                                       "embedding_dim": 8})
    data["features"]["sparse"].append({"name": "c1_x_c2", "cross": ["C1", "C2"], "hash_buckets": 500})
    cfg = parse_config(data)
    run_preprocess(cfg, small_log, str(tmp_path / "pre"), IN_MEMORY, say=lambda _: None)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    train(TrainOptions(str(tmp_path / "pre"), str(tmp_path / "m"), str(path)), say=lambda _: None)
    cfg2, artifact, model = load_trained(str(tmp_path / "m"))
    assert artifact.table_sizes()["user_x_item"] == 4000 and "user_x_item" not in artifact.raw_schema
    export_model(str(tmp_path / "m"), str(tmp_path / "export"), version=1)
    skew = ExportBase(str(tmp_path / "export")).versions()[-1].skew_report()
    assert skew["rows"] > 100 and skew["max_abs_diff"] <= skew["tolerance"]


@pytest.mark.integration
def test_the_sklearn_baseline_one_hot_encodes_the_same_ids(preprocessed_with_validation):
    """recpipe bench quality's scikit-learn peer: one column per ID of every feature plus one per dense
    feature; a single-valued feature puts a 1 in its ID's column, a multivalent one spreads 1 over its items
    (mean). A feature sharing another's table gets columns of its own: the history's items are not the
    candidate item (one block of columns for both gave "item 7 in the history" the candidate's weight)."""
    import numpy as np

    from recpipe.features.config import parse_config
    from recpipe.features.preprocessed import PreprocessedData
    from recpipe.bench.sklearn_peer import design_matrix, sklearn_logistic
    data_dir, pre, data = preprocessed_with_validation
    cfg = parse_config(data)
    art = PreprocessedData(data_dir).transform()
    x, y = design_matrix(cfg, data_dir, "validation")
    sizes = art.table_sizes()
    blocks = [(f.name, sizes[cfg.table_owner(f).name]) for f in cfg.features.sparse]
    width = sum(n for _, n in blocks)
    assert x.shape == (pre.rows_validation, width + len(cfg.features.dense)) and len(y) == pre.rows_validation
    single = [f for f in cfg.features.sparse if not f.multivalent]
    from recpipe.trainers.data import make_dataset
    hist_rows = np.concatenate([b["hist"].row_lengths().numpy() > 0
                                for b in make_dataset(cfg, data_dir, "validation", 4096, training=False)])
    sparse_part = np.asarray(x[:, :width].sum(axis=1)).ravel()
    assert np.allclose(sparse_part, len(single) + hist_rows)
    start = sum(n for name, n in blocks[:[name for name, _ in blocks].index("hist")])
    hist_block = np.asarray(x[:, start:start + sizes["item_id"]].sum(axis=1)).ravel()
    assert np.allclose(hist_block, hist_rows)  # the history's own columns, apart from item_id's
    fit = sklearn_logistic(cfg, data_dir, grid=(0.1, 1.0))
    assert fit["C"] in (0.1, 1.0) and fit["auc"] > 0.6 and len(fit["trials"]) == 2


@pytest.mark.integration
def test_tune_searches_the_declared_space_on_validation_and_writes_the_best_config(tmp_path,
                                                                                   preprocessed_with_validation):
    """Each trial (a `recpipe train` process) is scored by its best checkpoint on validation; the best
    trial's values are written back as a config."""
    import csv

    from recpipe.features.config import load_config
    from recpipe.tune import tune
    data_dir, _, data = preprocessed_with_validation
    d = copy.deepcopy(data)
    d["train"].update(steps=20, checkpoint_every=10)
    d["tune"] = {"trials": 2, "seed": 1, "params": [
        {"key": "model.dropout", "low": 0.0, "high": 0.5},
        {"key": "train.learning_rate", "low": 0.01, "high": 0.3, "log": True},
        {"key": "model.deep_layers", "choices": [[32, 16], [16]]}]}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(d))
    said = []
    result = tune(str(path), data_dir, str(tmp_path / "tune"), say=said.append)
    rows = list(csv.DictReader(open(tmp_path / "tune" / "trials.csv")))
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)
    scores = [float(r["auc"]) for r in rows]
    assert scores[0] != scores[1] and result["best"]["auc"] == max(scores)  # two different trials, the better kept
    best = load_config(tmp_path / "tune" / "best.yaml")
    assert best.model.dropout == pytest.approx(result["best"]["model.dropout"])
    assert best.model.deep_layers == result["best"]["model.deep_layers"] in ([32, 16], [16])
    for r in rows:  # each trial is a full model dir scored on validation only
        h = ValidationHistory.read(str(tmp_path / "tune" / "trials" / f"{int(r['trial']):03d}" / "model" /
                                       "validation.json"))
        assert h.best == pytest.approx(float(r["auc"]))
    assert any("best trial" in s for s in said)
    with pytest.raises(Exception, match="declare the search space under tune.params"):
        d.pop("tune")
        path.write_text(yaml.safe_dump(d))
        tune(str(path), data_dir, str(tmp_path / "t2"))


@pytest.fixture(scope="module")
def interaction_log(tmp_path_factory):
    """A 40k-row synthetic log (100 users x 50 items, so the interactions are learnable) preprocessed
    with a validation split, and its config dict."""
    from conftest import IN_MEMORY, small_config_dict

    from recpipe.features.config import parse_config
    from recpipe.pipeline.preprocess import run_preprocess
    from recpipe.pipeline.synthetic import GenerateSpec, generate_log
    base = tmp_path_factory.mktemp("interactions")
    d = small_config_dict()
    d["split"]["validation_fraction"] = 0.15
    d["train"].update(batch_size=256, checkpoint_every=200, early_stopping={"patience": 4})
    generate_log(GenerateSpec(rows=40_000, days=2, seed=11, num_users=100, num_items=50), str(base / "log"))
    run_preprocess(parse_config(d), str(base / "log"), str(base / "pre"), IN_MEMORY, say=lambda _: None)
    return str(base / "pre"), d


def _train_eval(tmp_path, data_dir: str, d: dict, name: str, **train_keys) -> dict:
    d = copy.deepcopy(d)
    d["train"].update(**train_keys)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d))
    train(TrainOptions(data_dir, str(tmp_path / name), str(path)), say=lambda _: None)
    return evaluate(str(tmp_path / name), data_dir)


@pytest.mark.quality
def test_the_synthetic_log_rewards_learning_interactions(tmp_path, interaction_log):
    """recpipe.pipeline.synthetic draws labels with user-taste x item-topic and pairwise terms: DCN-v2 beats
    logistic regression on it by a wide margin (what DCN-v2 is for). Eval AUC measured over training seeds
    1-5 (logistic, 200 steps at learning rate 1.0, where its validation AUC has levelled off) and 1-6
    (DCN-v2, 400 steps at 0.5): logistic 0.728-0.732, DCN-v2 0.795-0.803, a margin of at least 0.063."""
    data_dir, d = interaction_log
    lr = copy.deepcopy(d)
    lr["model"] = {"task": "ranking", "type": "logistic"}
    lr_auc = _train_eval(tmp_path, data_dir, lr, "logistic", learning_rate=1.0, steps=200)["auc"]
    dcn_auc = _train_eval(tmp_path, data_dir, d, "dcn", learning_rate=0.5, steps=400)["auc"]
    assert lr_auc > 0.7, lr_auc  # the additive part alone is learnable
    assert dcn_auc > lr_auc + 0.04, (lr_auc, dcn_auc)


@pytest.mark.quality
def test_logq_correction_and_temperature_lift_two_tower_retrieval_past_popularity(tmp_path, interaction_log):
    """The in-batch softmax samples negatives by popularity; without logQ correction two towers learn
    popularity-debiased scores and lose to the most-popular baseline; with it and temperature 0.5 they
    beat it. Recall@10 measured over training seeds 1-6 (500 steps at learning rate 0.2, a checkpoint
    every 250): plain 0.417-0.517, corrected 0.708-0.717, most popular 0.698 (a margin of at least 0.0098)."""
    data_dir, d = interaction_log
    d = copy.deepcopy(d)
    d["model"] = {"task": "retrieval", "type": "two_tower", "query_features": ["user_id", "hist", "I1"],
                  "candidate_features": ["item_id"], "tower_layers": [32, 16]}
    d["model"]["logq_correction"] = False  # on by default: the plain in-batch softmax is asked for
    plain = _train_eval(tmp_path, data_dir, d, "plain", learning_rate=0.2, steps=500, checkpoint_every=250)
    d["model"].update(logq_correction=True, temperature=0.5)
    corrected = _train_eval(tmp_path, data_dir, d, "logq", learning_rate=0.2, steps=500, checkpoint_every=250)
    popular = corrected["baselines"]["most_popular"]["recall_at_10"]
    assert plain["baselines"]["most_popular"]["recall_at_10"] == popular  # the same split, the same baseline
    assert plain["recall_at_10"] < popular < corrected["recall_at_10"] - 0.004, (plain, corrected, popular)
    assert corrected["recall_at_10"] > plain["recall_at_10"] + 0.1, (plain, corrected)


@pytest.fixture(scope="module")
def new_users_log(tmp_path_factory):
    """Clicks on 100 items of Zipf popularity, the same for every user (popularity is the best a model can do):
    users u0-u199 click first, then u200-u299, users the model never saw, make the last 30 % of the rows (the
    eval split, and most of validation). Preprocessed with a time split, and its config dict."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from conftest import IN_MEMORY
    from recpipe.features.config import parse_config
    from recpipe.pipeline.preprocess import run_preprocess
    rng = np.random.default_rng(5)
    n, old = 12_000, 8_400
    weights = 1.0 / np.arange(1, 101) ** 1.1
    items = rng.choice(100, size=n, p=weights / weights.sum())
    users = np.concatenate([rng.integers(0, 200, old), rng.integers(200, 300, n - old)])
    base = tmp_path_factory.mktemp("new_users")
    (base / "log").mkdir()
    pq.write_table(pa.table({"user": [f"u{u}" for u in users], "item": [f"i{i}" for i in items],
                             "ts": pa.array(np.arange(n), pa.int64()), "label": [1] * n}),
                   base / "log" / "part.parquet")
    d = {"name": "new_users", "input": {"timestamp": "ts"},
         "split": {"eval_fraction": 0.3, "validation_fraction": 0.1}, "label": {"column": "label"},
         "features": {"sparse": [
             {"name": "user", "column": "user", "vocab": {"min_count": 1}, "embedding_dim": 8},
             {"name": "item", "column": "item", "vocab": {"min_count": 1}, "embedding_dim": 8}]},
         "model": {"task": "retrieval", "type": "two_tower", "query_features": ["user"],
                   "candidate_features": ["item"], "tower_layers": [16]},
         "train": {"batch_size": 256, "learning_rate": 0.2, "steps": 600, "checkpoint_every": 100}}
    run_preprocess(parse_config(d), str(base / "log"), str(base / "pre"), IN_MEMORY, say=lambda _: None)
    return str(base / "pre"), d


@pytest.mark.quality
def test_a_model_left_at_its_defaults_is_not_below_popularity_for_users_it_never_saw(tmp_path, new_users_log):
    """Every eval user is new (one OOV row stands for all of them): with the default logQ correction the towers
    rank by popularity as the baseline does; with the plain in-batch softmax, whose negatives come by
    popularity, they rank popular items too low and fall below it. Recall@10 over training seeds 1-5 and 42:
    default 0.625 every time, plain 0.261-0.373, most popular 0.625."""
    data_dir, d = new_users_log
    default = _train_eval(tmp_path, data_dir, d, "default")
    popular = default["baselines"]["most_popular"]["recall_at_10"]
    assert default["without_history"]["examples"] == default["examples"]  # every eval user is new
    d = copy.deepcopy(d)
    d["model"]["logq_correction"] = False
    plain = _train_eval(tmp_path, data_dir, d, "plain")
    assert default["recall_at_10"] >= popular - 0.01, (default["recall_at_10"], popular)
    assert plain["recall_at_10"] < popular - 0.03, (plain["recall_at_10"], popular)


@pytest.mark.unit
def test_retrieval_options_are_checked():
    from conftest import small_config_dict

    from recpipe.features.config import ConfigError, parse_config
    d = small_config_dict()
    d["model"]["temperature"] = 0.5
    with pytest.raises(ConfigError, match=r"model.temperature: model.type dcn_v2 \(ranking\) does not read it"):
        parse_config(d)
    d["model"] = {"task": "retrieval", "type": "two_tower", "query_features": ["item_id"],
                  "candidate_features": ["user_id"], "logq_correction": True}
    with pytest.raises(ConfigError, match="model.logq_correction: needs candidate frequencies"):
        parse_config(d)


@pytest.mark.unit
def test_logq_correction_is_on_by_default_where_the_candidate_has_train_counts():
    """Unset, logQ correction is on when the first candidate feature has a vocabulary (its counts are the
    frequencies) and off for a hashed one; an explicit value wins; a ranking model never has it."""
    from conftest import small_config_dict

    from recpipe.features.config import parse_config
    from recpipe.features.schema import logq_correction
    d = small_config_dict()
    assert logq_correction(parse_config(d)) is False
    d["model"] = {"task": "retrieval", "type": "two_tower", "query_features": ["user_id"],
                  "candidate_features": ["item_id"]}
    assert parse_config(d).model.logq_correction is None and logq_correction(parse_config(d)) is True
    d["model"]["logq_correction"] = False
    assert logq_correction(parse_config(d)) is False
    d["model"] = {"task": "retrieval", "type": "two_tower", "query_features": ["item_id"],
                  "candidate_features": ["user_id"]}  # user_id is hashed in the small config
    assert logq_correction(parse_config(d)) is False


@pytest.mark.system
def test_splits_of_one_label_give_null_metrics_named_not_bare_nan(tmp_path, small_log, capsys):
    """Validation and eval rows all labelled 0: early stopping said nothing and kept the last checkpoint,
    and `recpipe evaluate` exited 0 with `"auc": NaN`, which is not JSON (jq and JSON.parse refuse it)."""
    import glob

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from conftest import IN_MEMORY, small_config_dict
    from recpipe.features.config import parse_config
    from recpipe.pipeline.preprocess import run_preprocess
    from recpipe.cli import main
    data = small_config_dict()
    data["split"]["validation_fraction"] = 0.25
    for i, src in enumerate(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))):
        t = pq.read_table(src)
        if i:  # the second day holds the validation and eval rows: their labels broken upstream
            t = t.set_column(t.schema.get_field_index("label"), "label", pa.array(np.zeros(len(t), np.int64)))
        day = tmp_path / "log" / os.path.basename(os.path.dirname(src))
        os.makedirs(day)
        pq.write_table(t, str(day / "p.parquet"))
    pre = run_preprocess(parse_config(data), str(tmp_path / "log"), str(tmp_path / "data"), IN_MEMORY,
                         say=lambda _: None)
    assert pre.positives["validation"] == pre.positives["eval"] == 0 < pre.positives["train"]
    said = []
    cfg_path = _config(tmp_path, data, steps=20, checkpoint_every=10, early_stopping={"patience": 1})
    state = train(TrainOptions(str(tmp_path / "data"), str(tmp_path / "m"), cfg_path), say=said.append)
    assert state.steps_done == 20 and state.best_step is None  # nothing to choose by: the last one is kept
    assert [s for s in said if "WARNING" in s] == [
        f"train: WARNING: the validation split holds 0 positives of {pre.rows_validation:,} rows (0.00 %): fewer "
        "than 100, its AUC is noise (undefined at 95 % from sampling alone) and cannot choose between "
        "checkpoints: give split.validation_fraction more rows, or preprocess more of the log",
        f"train: WARNING: validation auc is undefined: every one of the {pre.rows_validation:,} validation rows "
        "has label 0: AUC needs rows of both labels, so the model cannot be judged on this split; no checkpoint "
        "can be chosen by it, so the last one is the model kept"]
    history = json.loads(open(ModelDir(str(tmp_path / "m")).validation_path).read(), parse_constant=_refuse)
    assert [h["auc"] for h in history["history"]] == [None] * 2
    capsys.readouterr()
    out = tmp_path / "metrics.json"
    argv = ["evaluate", "--model-dir", str(tmp_path / "m"), "--data", str(tmp_path / "data"), "--output", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    metrics = json.loads(out.read_text(), parse_constant=_refuse)
    assert json.loads(printed[-1], parse_constant=_refuse) == metrics
    assert metrics["auc"] is None and metrics["calibration"] is None and metrics["positive_rate"] == 0
    assert metrics["logloss"] > 0 and metrics["examples"] == pre.rows_eval
    assert metrics["undefined"]["auc"].startswith(f"every one of the {pre.rows_eval:,} eval rows has label 0")
    assert printed[:2] == [f"evaluate: WARNING: {k} is null: {v}" for k, v in metrics["undefined"].items()]


def _refuse(constant: str):
    raise AssertionError(f"{constant} is not JSON")


@pytest.mark.integration
def test_retrieval_selects_on_seen_excluded_recall_and_says_when_the_step_cap_cut_it_short(
        tmp_path, preprocessed_with_validation):
    """Under a split where users come back, the plain recall rewards candidates a user already clicked, so
    selection could only pick by it; now early stopping takes the seen-excluded metrics too. And a run whose
    last checkpoint was still its best said nothing of having stopped at its step cap."""
    data_dir, _, data = preprocessed_with_validation
    data = copy.deepcopy(data)
    data["model"] = {"task": "retrieval", "type": "two_tower", "query_features": ["user_id", "hist", "I1"],
                     "candidate_features": ["item_id"], "tower_layers": [32, 16]}
    data["train"].update(steps=40, checkpoint_every=20, learning_rate=0.05,
                         early_stopping={"metric": "seen_excluded_recall_at_10"})
    path = tmp_path / "tt.yaml"
    path.write_text(yaml.safe_dump(data))
    said = []
    train(TrainOptions(data_dir, str(tmp_path / "m"), str(path)), say=said.append)
    h = ValidationHistory.read(ModelDir(str(tmp_path / "m")).validation_path)
    assert h.metric == "seen_excluded_recall_at_10" and [e["step"] for e in h.history] == [20, 40]
    assert h.best == max(e["seen_excluded_recall_at_10"] for e in h.history)
    assert all(e["seen_excluded_recall_at_10"] != e["recall_at_10"] for e in h.history)  # another metric
    assert h.best_step == 40, h  # 40 steps of this seed are too few: it still improves (training is reproducible)
    assert [s for s in said if "step cap" in s] == [
        f"train: note: validation seen_excluded_recall_at_10 still improved at the last step, 40 ({h.best:.4f}); the "
        f"run ended at its step cap (train.steps), so more steps may help"]
