"""A model key the model's type does not read is refused, not ignored: the table of the keys each type reads
(recpipe.features.schema.MODEL_KEYS) is what build_model reads, a config setting another key fails naming the
file, the key, the type and the keys it reads, and the configs recpipe ships, writes and dumped earlier load.
And a train or validation split with too few labels is warned of (recpipe.trainers.label_counts)."""
from __future__ import annotations

import dataclasses
import re
import typing

import numpy as np
import pytest
import yaml

from conftest import small_config_dict
from helpers import REPO
from recpipe.features.config import ConfigError, check_config, config_to_dict, dump_config, load_config, parse_config
from recpipe.features.schema import CANDIDATES, MODEL_KEYS, MODEL_TYPES, ModelSpec
from recpipe.features.schema_doc import field_docs
from recpipe.trainers.label_counts import MIN_POSITIVES, input_features, label_count_warnings

pytestmark = pytest.mark.unit

MODEL_FIELDS = [f.name for f in dataclasses.fields(ModelSpec) if f.name not in ("task", "type")]

# One config per type, small enough to build in a blink (small_config_dict's features, all 8 wide).
BASES = {
    "dcn_v2": {"task": "ranking", "type": "dcn_v2", "cross_layers": 1, "deep_layers": [8]},
    "dlrm": {"task": "ranking", "type": "dlrm", "bottom_layers": [8], "deep_layers": [8]},
    "logistic": {"task": "ranking", "type": "logistic"},
    "two_tower": {"task": "retrieval", "type": "two_tower", "query_features": ["user_id", "hist"],
                  "candidate_features": ["item_id"], "tower_layers": [8]},
    "item_to_item": {"task": "retrieval", "type": "item_to_item", "query_features": ["user_id", "hist"],
                     "candidate_features": ["item_id"]},
}
# A value of each key other than every base's (and its default).
SENTINELS = {"cross_layers": 3, "low_rank": 2, "deep_layers": [4], "bottom_layers": [4], "query_features": ["C1"],
             "candidate_features": ["item_id", "C2"], "tower_layers": [4], "query_key": "C3", "wide": True,
             "dropout": 0.5, "temperature": 0.5, "logq_correction": False, "uniform_negatives": 3,
             "remove_accidental_hits": True}
# build_model would add a wide logit to logistic regression, whose own logit already is one: refused as such
# (a wide logit is for dcn_v2 and dlrm), so not a key logistic reads.
BUILT_BUT_REFUSED = {("logistic", "wide")}
# item_to_item scores the first candidate feature's IDs: the sentinel adds an attribute after it, which it reads past
# (a two_tower config's attributes stay valid under model.type auto, whose candidates include item_to_item).
READ_BUT_UNCHANGED = {("item_to_item", "candidate_features")}


def _cfg(model: dict):
    d = small_config_dict()
    d["model"] = model
    return parse_config(d)


def test_the_table_covers_every_type_and_key():
    types = [t for t in typing.get_args(typing.get_type_hints(ModelSpec)["type"]) if t != "auto"]
    assert sorted(MODEL_KEYS) == sorted(types) == sorted(t for ts in MODEL_TYPES.values() for t in ts if t != "auto")
    for task, ts in MODEL_TYPES.items():  # auto selects among the task's candidates, each a type of the task
        assert "auto" in ts and set(CANDIDATES[task]) <= set(ts), task
    read = {k for keys in MODEL_KEYS.values() for k in keys}
    assert read == set(MODEL_FIELDS), "a key no type reads, or a table entry that is no key"
    assert set(SENTINELS) == set(MODEL_FIELDS)
    for t, keys in MODEL_KEYS.items():
        assert len(set(keys)) == len(keys), t


def test_each_keys_meaning_names_the_types_that_read_it():
    """docs/config.md is generated from the comments: each model key's starts with its readers, as the table has."""
    docs = field_docs(ModelSpec)
    for key in MODEL_FIELDS:
        head = docs[key].split(":", 1)[0]
        named = {t for word in re.split(r",\s*", head) for t in MODEL_TYPES.get(word, (word,)) if t != "auto"}
        assert named == {t for t, keys in MODEL_KEYS.items() if key in keys}, (key, docs[key])


def _artifact(cfg):
    from recpipe.features.artifact import TransformArtifact
    vocabs = {f.name: [f"v{i}" for i in range(20)] for f in cfg.features.sparse
              if f.vocab is not None and f.share_embedding_with is None}
    counts = {name: list(range(1, 21)) for name in vocabs}  # unequal: logQ correction changes the loss
    stats = {d.name: {"mean": 0.0, "std": 1.0, "boundaries": [0.0, 1.0]} for d in cfg.features.dense}
    return TransformArtifact(config=cfg, raw_schema={}, vocabularies=vocabs, vocab_counts=counts, dense_stats=stats)


def _batch(cfg, artifact, n: int = 8) -> dict:
    import tensorflow as tf
    from recpipe.features.canonical import LABEL_KEY
    rng = np.random.default_rng(0)
    sizes = artifact.table_sizes()
    batch = {}
    for f in cfg.features.sparse:
        rows = sizes[cfg.table_owner(f).name]
        if f.multivalent:
            lengths = rng.integers(1, 3, n)
            batch[f.name] = tf.RaggedTensor.from_row_lengths(tf.constant(rng.integers(0, rows, lengths.sum())),
                                                             tf.constant(lengths))
        else:
            ids = rng.integers(0, rows, n)
            ids[1] = ids[0]  # a candidate twice in the batch: remove_accidental_hits has one to remove
            batch[f.name] = tf.constant(ids)
    for d in cfg.features.dense:
        batch[d.name] = tf.constant(rng.normal(size=n), tf.float32)
    batch[LABEL_KEY] = tf.constant([1, 0, 1, 1, 0, 1, 1, 0][:n], tf.float32)
    return batch


def _what_it_does(cfg, artifact, batch) -> tuple:
    """What a model of cfg is: its variables' shapes and its training loss on `batch` from the same seed, and
    the query key evaluation uses (retrieval)."""
    import tensorflow as tf
    from recpipe.trainers.evaluation.candidates import query_key_feature
    from recpipe.trainers.models import build_model
    tf.keras.utils.set_random_seed(7)
    model = build_model(cfg, artifact)
    # item_to_item has no loss (fitted in closed form): what it does is its scores, zero until fitted
    loss = float(tf.reduce_sum(model(batch))) if cfg.model.type == "item_to_item" else \
        float(model.compute_loss(batch, training=True))
    shapes = [tuple(v.shape) for v in model.variables]
    return shapes, loss, query_key_feature(cfg) if cfg.model.task == "retrieval" else None


def _same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[2] == b[2] and abs(a[1] - b[1]) <= 1e-6 * max(1.0, abs(a[1]))


@pytest.mark.parametrize("model_type", list(BASES))
def test_the_table_is_what_build_model_reads(model_type):
    """Each key changed on its own (in code, past the config checks): a key of the type's row changes the model
    built (its variables or its loss; query_key what evaluation reads), any other key changes nothing."""
    cfg = _cfg(BASES[model_type])
    artifact = _artifact(cfg)
    batch = _batch(cfg, artifact)
    base = _what_it_does(cfg, artifact, batch)
    assert _same(base, _what_it_does(cfg, artifact, batch)), "not deterministic: the comparison would mean nothing"
    wrong = []
    for key, value in SENTINELS.items():
        assert getattr(cfg.model, key) != value, key
        changed = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **{key: value}))
        reads = not _same(base, _what_it_does(changed, artifact, batch))
        if reads != ((key in MODEL_KEYS[model_type] and (model_type, key) not in READ_BUT_UNCHANGED)
                     or (model_type, key) in BUILT_BUT_REFUSED):
            wrong.append(f"{key}: {'read' if reads else 'not read'}")
    assert wrong == [], f"{model_type}: MODEL_KEYS disagrees with build_model: {wrong}"


@pytest.mark.parametrize("model_type", list(BASES))
def test_a_key_the_type_does_not_read_is_refused_even_at_its_default(tmp_path, model_type):
    unread = [k for k in MODEL_FIELDS if k not in MODEL_KEYS[model_type]]
    default = ModelSpec()
    for key in unread:
        d = small_config_dict()
        d["model"] = {**BASES[model_type], key: getattr(default, key)}  # the default: still set in the YAML
        if d["model"][key] is None:
            d["model"][key] = SENTINELS[key]
        path = tmp_path / f"{key}.yaml"
        path.write_text(yaml.safe_dump(d, sort_keys=False))
        with pytest.raises(ConfigError) as e:
            load_config(path)
        message = str(e.value)
        reads = ", ".join(MODEL_KEYS[model_type]) or "no model key"
        assert message.startswith(f"{path}: model.{key}: "), message
        assert f"model.type {model_type} ({BASES[model_type]['task']}) does not read it" in message, message
        assert f"{model_type} reads {reads} besides task and type" in message, message


def test_logistic_refuses_the_keys_of_issue_63():
    for key, value in (("dropout", 0.3), ("deep_layers", [256, 128]), ("cross_layers", 2)):
        with pytest.raises(ConfigError, match=f"model.{key}: model.type logistic .ranking. does not read it"):
            _cfg({"task": "ranking", "type": "logistic", key: value})


def test_the_first_unread_key_in_the_yamls_order_is_named():
    with pytest.raises(ConfigError, match=r"^model\.low_rank: "):
        _cfg({"type": "dlrm", "low_rank": 4, "cross_layers": 3})
    with pytest.raises(ConfigError, match=r"^model\.cross_layers: "):
        _cfg({"type": "dlrm", "cross_layers": 3, "low_rank": 4})


def test_keys_the_type_reads_load():
    for model_type, model in BASES.items():
        cfg = _cfg({**model, **{k: SENTINELS[k] for k in MODEL_KEYS[model_type]
                                if k not in ("candidate_features", "query_features", "uniform_negatives")}})
        assert cfg.model.type == model_type


def test_a_config_built_in_code_is_refused_an_unread_key_set_to_another_value_than_its_default():
    cfg = _cfg(BASES["logistic"])
    assert check_config(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, deep_layers=[256, 128]))) \
        .model.type == "logistic"  # the default: not known to be set
    with pytest.raises(ConfigError, match="model.dropout: model.type logistic"):
        check_config(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dropout=0.3)))


def test_dumps_hold_the_keys_the_type_reads_and_load_back():
    for model_type, model in BASES.items():
        cfg = _cfg(model)
        dumped = config_to_dict(cfg)
        assert set(dumped["model"]) <= {"task", "type", *MODEL_KEYS[model_type]}, dumped["model"]
        assert parse_config(dumped) == cfg
        assert parse_config(yaml.safe_load(dump_config(cfg))) == cfg


def test_a_dump_written_before_unread_keys_were_left_out_still_loads(tmp_path):
    """A transform artifact's, model dir's or export's config.yaml of an earlier recpipe holds every model key
    (config_to_dict wrote them all): it loads, the keys its type ignored reset to their defaults, so it equals
    the config of today that trains the same model."""
    earlier = {"task": "ranking", "type": "logistic", "cross_layers": 3, "deep_layers": [32, 16],
               "bottom_layers": [64], "query_features": [], "candidate_features": [], "tower_layers": [64, 32],
               "wide": False, "dropout": 0.3, "logq_correction": False, "uniform_negatives": 0,
               "remove_accidental_hits": False}
    d = small_config_dict()
    d["model"] = earlier
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    assert load_config(path) == _cfg({"task": "ranking", "type": "logistic"})
    first = {k: earlier[k] for k in ("task", "type", "cross_layers", "deep_layers", "bottom_layers",
                                     "query_features", "candidate_features", "tower_layers")}
    d["model"] = {**first, "type": "dcn_v2"}  # the first release's dump: no wide, dropout, ... yet
    assert parse_config(d).model == ModelSpec(type="dcn_v2", cross_layers=3, deep_layers=[32, 16])
    d["model"] = {k: v for k, v in first.items() if k != "tower_layers"}  # not a whole dump: a user's config
    with pytest.raises(ConfigError, match="model.cross_layers: model.type logistic"):
        parse_config(d)


def test_the_configs_shipped_written_and_tested_load(tmp_path):
    from recpipe.pipeline.infer import infer, profile_table, render_config
    import pyarrow as pa
    for path in sorted((REPO / "configs").glob("*.yaml")):
        load_config(path)
    parse_config(small_config_dict())
    table = pa.table({"ts": [1_600_000_000 + i for i in range(200)], "label": [i % 3 == 0 for i in range(200)],
                      "user": [f"u{i % 17}" for i in range(200)], "price": [float(i) for i in range(200)]})
    text = render_config(infer(profile_table(table), rows=200), "log/")
    rendered = yaml.safe_load(text)
    for model_type in ("logistic", "dlrm"):  # the header suggests type: logistic as the baseline
        parse_config({**rendered, "model": {**rendered["model"], "type": model_type}})


# ------------------------------------------------------------ too few labels

def _counts(train=(9_949, 51), validation=(0, 0)) -> dict:
    return {"train": train[0], "validation": validation[0], "eval": 1_000,
            "positives": {"train": train[1], "validation": validation[1], "eval": 10}}


def test_a_train_split_of_51_positives_is_warned_of_with_its_counts():
    cfg = _cfg(BASES["dcn_v2"])
    assert input_features(cfg) == 12  # 9 sparse, 3 dense: 120 positives needed
    (line,) = label_count_warnings(cfg, _counts())
    assert line.startswith("train: WARNING: the train split holds 51 positives of 9,949 rows (0.51 %): "), line
    assert "a ranking model of 12 input features needs at least 120 to learn from" in line, line
    assert label_count_warnings(cfg, _counts(train=(9_949, 120))) == []
    assert len(label_count_warnings(cfg, _counts(train=(9_949, 119)))) == 1


def test_the_train_threshold_is_100_at_least_and_10_per_feature():
    d = small_config_dict()
    d["features"] = {"dense": [{"name": "I1", "column": "I1"}]}
    d["model"] = BASES["logistic"]
    one = parse_config(d)
    assert input_features(one) == 1
    assert label_count_warnings(one, _counts(train=(5_000, 100))) == []
    assert "needs at least 100 " in label_count_warnings(one, _counts(train=(5_000, 99)))[0]


def test_ranking_warns_of_the_scarcer_label_and_retrieval_of_positives_only():
    ranking = _cfg(BASES["dcn_v2"])
    (line,) = label_count_warnings(ranking, _counts(train=(9_949, 9_900)))
    assert "holds 49 negatives of 9,949 rows (0.49 %)" in line, line
    retrieval = _cfg(BASES["two_tower"])
    assert input_features(retrieval) == 3
    assert label_count_warnings(retrieval, _counts(train=(9_949, 9_949))) == []  # every row a positive pair
    (line,) = label_count_warnings(retrieval, _counts(train=(9_949, 60)))
    assert "holds 60 positives" in line and "a retrieval model of 3 input features needs at least 100" in line


def test_a_validation_split_with_few_positives_is_warned_of_as_noise():
    cfg = _cfg(BASES["dcn_v2"])
    (line,) = label_count_warnings(cfg, _counts(train=(90_000, 5_000), validation=(10_000, 40)))
    assert line.startswith("train: WARNING: the validation split holds 40 positives of 10,000 rows (0.40 %): "
                           f"fewer than {MIN_POSITIVES}, its AUC is noise (+-0.09 at 95 % "), line
    assert label_count_warnings(cfg, _counts(train=(90_000, 5_000), validation=(10_000, 100))) == []
    (line,) = label_count_warnings(_cfg(BASES["two_tower"]), _counts(train=(90_000, 5_000), validation=(500, 25)))
    assert "its recall@10 is noise (+-0.20 at 95 %" in line, line
    (line,) = label_count_warnings(cfg, _counts(train=(90_000, 5_000), validation=(500, 0)))
    assert "holds 0 positives" in line and "(undefined at 95 %" in line, line


def test_no_counts_no_split_no_warning():
    cfg = _cfg(BASES["dcn_v2"])
    assert label_count_warnings(cfg, {"train": 9_949, "validation": 100}) == []  # counted before positives were
    assert label_count_warnings(cfg, {}) == []
    assert label_count_warnings(cfg, _counts(train=(0, 0))) == []  # empty train: refused elsewhere
