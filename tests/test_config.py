"""Config loading: the shipped configs load and round-trip, and a config that would fail later (an unknown or
misspelt key, a bad value, a name or number the pipeline cannot use, a YAML quirk) fails at load naming its
key."""
import copy

import pytest
import yaml

from conftest import CONFIGS, small_config_dict
from recpipe.features.config import ConfigError, config_to_dict, embedding_dim, load_config, parse_config

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["synthetic.yaml", "criteo.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(CONFIGS / name)
    assert cfg.features.sparse and cfg.features.dense
    assert parse_config(config_to_dict(cfg)) == cfg  # round trip


def test_defaults_and_sharing():
    cfg = parse_config(small_config_dict())
    hist = cfg.sparse_by_name["hist"]
    assert cfg.table_owner(hist).name == "item_id"
    assert embedding_dim(cfg, hist) == 8
    assert cfg.raw_columns()[:2] == ["label", "ts"]


def _with(mutate):
    d = copy.deepcopy(small_config_dict())
    mutate(d)
    return d


@pytest.mark.parametrize("mutate, key", [
    (lambda d: d.update(bogus=1), "bogus: unknown key"),
    (lambda d: d["features"]["sparse"][1]["vocab"].update(min_cout=3), "features.sparse[1].vocab.min_cout: unknown key"),
    (lambda d: d["features"]["sparse"][1]["vocab"].update(min_count="3"), "features.sparse[1].vocab.min_count: expected an integer"),
    (lambda d: d["features"]["sparse"][0].pop("column"), "features.sparse[0].column: required key is missing"),
    (lambda d: d["features"]["dense"][0].update(transform="log"), "features.dense[0].transform: 'log' is not one of"),
    (lambda d: d["features"]["sparse"][0].update(vocab={"min_count": 1}), "features.sparse[0]: give exactly one of"),
    (lambda d: d["features"]["sparse"][2].update(share_embedding_with="nope"), "features.sparse[2].share_embedding_with: no sparse feature named 'nope'"),
    (lambda d: d["features"]["sparse"][3].update(name="item_id"), "features.sparse[3].name: 'item_id' is already used"),
    (lambda d: d["features"]["sparse"][3].update(name="bad name"), "features.sparse[3].name: 'bad name' must be"),
    (lambda d: d["split"].update(eval_fraction=1.5), "split.eval_fraction: must be between 0 and 1"),
    (lambda d: d["train"].update(batch_size=0), "train.batch_size: must be > 0"),
    (lambda d: d["model"].update(type="two_tower"), "model.type: 'two_tower' is not a ranking model"),
    (lambda d: d["model"].update(task="retrieval", type="two_tower"), "model.query_features: retrieval needs"),
    (lambda d: d["model"].update(task="retrieval", type="two_tower", query_features=["user_id"],
                                 candidate_features=["hist"]), "model.candidate_features[0]: 'hist' must be single-valued"),
    (lambda d: d["model"].update(task="retrieval", type="two_tower", query_features=["user_id", "item_id"],
                                 candidate_features=["item_id"]), "also listed in model.query_features"),
    (lambda d: d["model"].update(query_features=["user_id"]), "model.query_features: only retrieval models"),
    (lambda d: d["model"].update(task="retrieval", type="two_tower", query_features=["user_id"],
                                 candidate_features=["item_id"], query_key="hist"),
     "model.query_key: 'hist' must be a single-valued sparse feature"),
    (lambda d: d["features"]["sparse"][0].update(separator=","), "features.sparse[0].separator: only multivalent"),
    (lambda d: d["features"]["sparse"][1]["vocab"].update(oov_buckets=0), "features.sparse[1].vocab.oov_buckets: must be > 0"),
    (lambda d: d.update(preprocess={"max_presence_change": 0}), "preprocess.max_presence_change: must be in (0, 1]"),
    (lambda d: d.update(preprocess={"max_presence_change": 1.5}), "preprocess.max_presence_change: must be in (0, 1]"),
    (lambda d: d.update(preprocess={"max_mean_shift": -1}), "preprocess.max_mean_shift: must be > 0"),
    (lambda d: d.update(preprocess={"features": [{"feature": "nope"}]}), "preprocess.features[0].feature: 'nope' is not"),
    (lambda d: d.update(preprocess={"features": [{"feature": "C1", "max_mean_shift": 2}]}),
     "preprocess.features[0].max_mean_shift: 'C1' is not a dense feature"),
    (lambda d: d.update(preprocess={"features": [{"feature": "I2", "max_presence_change": 0}]}),
     "preprocess.features[0].max_presence_change: must be in (0, 1]"),
    (lambda d: d.update(preprocess={"features": [{"feature": "I2"}, {"feature": "I2", "max_mean_shift": 2}]}),
     "preprocess.features[1].feature: 'I2' already has limits in preprocess.features[0]"),
    (lambda d: d.update(preprocess={"max_dead_letter_fraction": 2}), "preprocess.max_dead_letter_fraction: must be in"),
    (lambda d: d.update(preprocess={"min_rows_vs_previous": 1.5}), "preprocess.min_rows_vs_previous: must be in"),
    (lambda d: d.update(preprocess={"max_rows_vs_previous": 0.5}), "preprocess.max_rows_vs_previous: must be >= 1"),
])
def test_errors_name_the_key(mutate, key):
    with pytest.raises(ConfigError) as e:
        parse_config(_with(mutate))
    assert key in str(e.value)


def test_dlrm_needs_one_dim():
    def mutate(d):
        d["model"]["type"] = "dlrm"
        d["features"]["sparse"][0]["embedding_dim"] = 4
    with pytest.raises(ConfigError, match="dlrm needs one embedding_dim"):
        parse_config(_with(mutate))


def test_load_config_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nfeatures: {sparse: [{name: a}]}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: features.sparse\[0\].column: required key is missing"):
        load_config(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml: not valid YAML"):
        load_config(broken)
    with pytest.raises(ConfigError, match="missing.yaml: cannot read config"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("mutate, key", [
    (lambda d: d["features"]["dense"][0].update(fill=float("nan")), "features.dense[0].fill: must be a finite"),
    (lambda d: d["train"].update(learning_rate=float("inf")), "train.learning_rate: must be a finite"),
])
def test_config_rejects_non_finite_numbers(mutate, key):
    d = small_config_dict()
    mutate(d)
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        parse_config(d)


@pytest.mark.parametrize("mutate, key", [
    (lambda d: d["features"]["sparse"][0].update(name="user_id\n"), "features.sparse[0].name"),
    (lambda d: d["features"]["sparse"][0].update(column="user id"), "features.sparse[0].column: 'user id' cannot"),
    (lambda d: d["features"]["dense"][1].update(column="label"), "features.dense[1].column: 'label' is the label"),
])
def test_names_that_would_fail_later_fail_at_config_load(mutate, key):
    d = small_config_dict()
    mutate(d)
    with pytest.raises(ConfigError) as e:
        parse_config(d)
    assert key in str(e.value)


def test_config_yaml_quirks(tmp_path):
    text = yaml.safe_dump(small_config_dict())
    (tmp_path / "dup.yaml").write_text(text + "name: again\n")
    with pytest.raises(ConfigError, match="duplicate key 'name'"):
        load_config(tmp_path / "dup.yaml")
    d = small_config_dict()
    d["train"]["learning_rate"] = "1e-9"  # what PyYAML (YAML 1.1) makes of an unquoted 1e-9
    assert parse_config(d).train.learning_rate == 1e-9
