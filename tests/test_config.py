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
    (lambda d: d.update(model=dict(task="retrieval", type="two_tower")), "model.query_features: retrieval needs"),
    (lambda d: d.update(model=dict(task="retrieval", type="two_tower", query_features=["user_id"],
                                   candidate_features=["hist"])), "model.candidate_features[0]: 'hist' must be single-valued"),
    (lambda d: d.update(model=dict(task="retrieval", type="two_tower", query_features=["user_id", "item_id"],
                                   candidate_features=["item_id"])), "also listed in model.query_features"),
    (lambda d: d["model"].update(query_features=["user_id"]),
     "model.query_features: model.type dcn_v2 (ranking) does not read it"),
    (lambda d: d.update(model=dict(task="retrieval", type="two_tower", query_features=["user_id"],
                                   candidate_features=["item_id"], query_key="hist")),
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
        d["model"] = {"task": "ranking", "type": "dlrm"}
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


# ----------------------------------------------------------------------------- hostile YAML (issue 65)
def _bomb_config(levels: int = 9) -> str:
    """The small config with a billion-laughs anchor bomb as tune.params[0].choices: `levels` nested anchors
    of ten aliases each (9 levels expand to 10**9 strings; PyYAML shares them, whatever copies them does not)."""
    anchors = ['&lol0 "lol"'] + [f"&lol{i} [{', '.join([f'*lol{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return (yaml.safe_dump(small_config_dict(), sort_keys=False)
            + "tune:\n  params:\n    - key: model.dropout\n      choices: [" + ", ".join(anchors) + "]\n")


def test_alias_bomb_is_refused_at_once_naming_the_file_and_the_alias(tmp_path):
    """A billion-laughs config ran 179 s to 2.2 GB and died with MemoryError; now every YAML read from a user
    (the config, the daily project file, an artifact's config.yaml) refuses it in one line, in well under 1 s."""
    import time

    from recpipe.common.typed_yaml import read_yaml
    from recpipe.daily import load_daily_config
    from recpipe.features.artifact import TransformArtifact
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb_config())
    refused = (r"bomb.yaml: refused: YAML aliases expand past the limit of 10,000 nodes "
               r"\(at alias \d+, \*lol\d at line \d+")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=refused) as e:
        read_yaml(bomb)
    assert time.perf_counter() - t0 < 1.0
    assert "\n" not in str(e.value)
    for load in (load_config, load_daily_config):
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match=refused):
            load(str(bomb))
        assert time.perf_counter() - t0 < 1.0
    artifact = tmp_path / "transform"
    artifact.mkdir()
    (artifact / "transform.json").write_text('{"format_version": 1}')
    (artifact / "config.yaml").write_text(_bomb_config())
    with pytest.raises(ConfigError, match=refused.replace("bomb.yaml", "transform/config.yaml")):
        TransformArtifact.read(str(artifact))


def test_config_over_the_size_limit_is_refused_before_parsing(tmp_path):
    """A 50 MB generated config took ~11 s per MB to parse; above 1 MiB it is refused by its size, unread."""
    import time

    from recpipe.common.typed_yaml import MAX_YAML_BYTES, parse_yaml
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(small_config_dict(), sort_keys=False) + "# " + "x" * (2 * MAX_YAML_BYTES) + "\n")
    size = big.stat().st_size
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        load_config(big)
    assert time.perf_counter() - t0 < 1.0
    assert str(e.value) == (f"{big}: refused: {size:,} bytes, over the 1,048,576-byte (1 MiB) limit for a config")
    with pytest.raises(ConfigError, match=r"x/config.yaml: refused: 1,048,577 bytes, over the 1,048,576-byte"):
        parse_yaml("#" * MAX_YAML_BYTES + "\n", "x/config.yaml")  # text read elsewhere (an artifact's config)
    at_limit = tmp_path / "at_limit.yaml"
    text = yaml.safe_dump(small_config_dict(), sort_keys=False)
    at_limit.write_text(text + "#" * (MAX_YAML_BYTES - len(text) - 1) + "\n")
    assert at_limit.stat().st_size == MAX_YAML_BYTES
    assert load_config(at_limit) == parse_config(small_config_dict())


def test_moderate_aliases_load_and_the_alias_limit_is_exact(tmp_path):
    """Anchors, aliases and merge keys (`<<: *base`, refused as an unknown tag before) as people use them load
    as the written-out config; aliases adding exactly MAX_ALIAS_NODES nodes load, one more is refused."""
    from recpipe.common.typed_yaml import MAX_ALIAS_NODES, parse_yaml
    plain = small_config_dict()
    plain["tune"] = {"params": [{"key": "model.deep_layers", "choices": [[32, 16], [64, 32]]}]}
    merged = [f"    - {{<<: *c1, name: C{i}, column: C{i}}}" if i % 2 else
              f"    - {{name: C{i}, column: C{i}, vocab: *vocab, embedding_dim: 8}}" for i in range(2, 7)]
    path = tmp_path / "anchors.yaml"
    path.write_text("\n".join([
        "name: small_ctr", "input: {timestamp: ts}", "split: {eval_fraction: 0.2}", "label: {column: label}",
        "features:", "  sparse:",
        "    - {name: user_id, column: user_id, hash_buckets: 1000, embedding_dim: 8}",
        "    - {name: item_id, column: item_id, embedding_dim: 8,",
        "       vocab: {min_count: 2, max_size: 500, oov_buckets: 2}}",
        "    - {name: hist, column: hist_items, multivalent: true, share_embedding_with: item_id}",
        "    - &c1 {name: C1, column: C1, vocab: &vocab {min_count: 2, oov_buckets: 1}, embedding_dim: 8}",
        *merged,
        "  dense:",
        "    - &i1 {name: I1, column: I1, transform: log_zscore}",
        "    - {<<: *i1, name: I2, column: I2, transform: zscore, fill: 1.0}",
        "    - {<<: *i1, name: I3, column: I3, transform: bucketize, num_buckets: 5}",
        "model: {task: ranking, type: dcn_v2, cross_layers: 1, deep_layers: &layers [32, 16]}",
        "train: {batch_size: 128, learning_rate: 0.05, steps: 150, checkpoint_every: 50}",
        "tune: {params: [{key: model.deep_layers, choices: [*layers, [64, 32]]}]}", ""]))
    assert load_config(path) == parse_config(plain)
    with pytest.raises(ConfigError, match="duplicate key 'name'"):  # a merge key's keys may be overridden, once
        parse_yaml("a: &a {name: x}\nb: {<<: *a, name: y, name: z}\n", "dup.yaml")
    exact = "a: &a 1\nb: [" + ", ".join(["*a"] * MAX_ALIAS_NODES) + "]\n"
    assert len(parse_yaml(exact, "exact.yaml")["b"]) == MAX_ALIAS_NODES
    over = exact.replace("*a]", "*a, *a]")
    limit = rf"limit of {MAX_ALIAS_NODES:,} nodes \(at alias {MAX_ALIAS_NODES + 1:,}, \*a at line 2"
    with pytest.raises(ConfigError, match=rf"over.yaml: refused: YAML aliases expand past the {limit}"):
        parse_yaml(over, "over.yaml")


def test_recursive_aliases_and_deep_nesting_are_refused_in_one_line(tmp_path):
    """An alias inside its own anchor built a structure that contains itself (misreported, or endless
    recursion later); nesting a few hundred levels deep crashed PyYAML's composer with RecursionError. Both
    are refused naming the file and line."""
    from recpipe.common.typed_yaml import MAX_YAML_DEPTH, read_yaml
    rec = tmp_path / "rec.yaml"
    rec.write_text("name: x\nfeatures: &f {sparse: [*f]}\n")
    with pytest.raises(ConfigError, match=r"rec.yaml: refused: alias \*f at line 2, column 24 repeats a node that "
                                          r"contains it"):
        load_config(rec)
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=rf"deep.yaml: refused: YAML nested deeper than the limit of "
                                          rf"{MAX_YAML_DEPTH} levels \(at line 1, column {MAX_YAML_DEPTH + 6}\)"):
        load_config(deep)
    ok = tmp_path / "ok.yaml"
    ok.write_text("a: " + "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1) + "\n")
    nested: list = []
    for _ in range(MAX_YAML_DEPTH - 2):  # the mapping and the outer list make the limit
        nested = [nested]
    assert read_yaml(ok)["a"] == nested


def test_cli_refuses_an_alias_bomb_in_one_line(tmp_path, capsys):
    """`recpipe preprocess --config BOMB` exits 1 with the one line `recpipe preprocess: error: BOMB: ...`
    before any Beam work (a 5-level bomb: 111,111 nodes, past the limit yet cheap for the old loader)."""
    from recpipe.cli import main
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb_config(levels=5))
    rc = main(["preprocess", "--config", str(bomb), "--input", str(tmp_path / "log"),
               "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.startswith(f"recpipe preprocess: error: {bomb}: refused: YAML aliases expand past the limit of "
                          "10,000 nodes (at alias "), err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert not (tmp_path / "out").exists()
