"""What preprocess names and what it lets pass (recpipe.pipeline.anomalies, recpipe.pipeline.leakage): the messages of each
anomaly, from the figures a run counts (SplitCounts, a transform artifact, each file's timestamp range,
the repeats, the eval sample), built here by hand. That a whole run counts those figures and reports these
warnings (or refuses them under preprocess.on_anomaly: fail) is tests/test_pipeline.py's."""
import glob
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import CONFIGS, small_config_dict
from recpipe.features.artifact import TransformArtifact
from recpipe.features.canonical import DENSE_SUM_SCALE
from recpipe.features.config import parse_config
from recpipe.pipeline.anomalies import (SplitCounts, copied_file_warnings, dead_letter_warnings, feature_warnings,
                                repeated_row_warnings, timestamp_warnings, volume_warnings)
from recpipe.pipeline.leakage import leak_warnings
from recpipe.pipeline.repeats import Repeats
from recpipe.pipeline.sources import InputFile

pytestmark = pytest.mark.unit

DENSE = ("I1", "I2", "I3")
FEATURES = ("user_id", "item_id", "hist", "C1", "C2", "C3", "C4", "C5", "C6", *DENSE)


def _config(**preprocess):
    return parse_config({**small_config_dict(), "preprocess": preprocess} if preprocess else small_config_dict())


def _artifact(cfg, **fields) -> TransformArtifact:
    """A transform artifact of `cfg` holding only what a check reads."""
    return TransformArtifact(config=cfg, raw_schema={}, **fields)


def _counts(rows: dict, with_value: dict, means: dict | None = None, positives: dict | None = None) -> SplitCounts:
    """SplitCounts of rows per split; with_value: per split, rows with a value per feature (every feature
    not given: all the split's rows); means: per split, the mean of a dense feature's values (as dense_sums)."""
    full = {s: {f: n for f in FEATURES} | with_value.get(s, {}) for s, n in rows.items()}
    sums = {s: {d: int(m * full[s][d] * DENSE_SUM_SCALE) for d, m in per.items()} for s, per in (means or {}).items()}
    return SplitCounts(rows, full, sums, positives or {})


# ----------------------------------------------------------------------------- features of one run
def test_features_the_train_split_leaves_empty_or_constant_are_named():
    """A column null or empty in every train row (a broken upstream join) or of one value in all of them
    trains a feature with nothing to learn, and one a later split lacks is judged without: each is named
    with its figures, once; the features the log fills are not."""
    cfg = _config()
    counts = _counts({"train": 800, "validation": 100, "eval": 200},
                     {"train": {"I1": 0, "hist": 0, "C2": 0}, "validation": {"I1": 0, "hist": 0, "C2": 0, "C3": 0},
                      "eval": {"I1": 150, "hist": 0, "C2": 0, "C3": 0}})
    art = _artifact(cfg, dense_stats={"I1": {"mean": 0.0, "std": 0.0}, "I2": {"mean": 7.0, "std": 0.0},
                                      "I3": {"boundaries": [1.0, 2.0]}})
    empty = "train rows: a model cannot learn from it (is the column null or empty upstream?)"
    assert feature_warnings(cfg, art, counts) == [
        f"feature 'hist' (column 'hist_items') has no value in any of the 800 {empty}",
        f"feature 'C2' (column 'C2') has no value in any of the 800 {empty}",
        "feature 'C3' (column 'C3') has values in 800 of the 800 train rows but in none of the 100 validation rows: "
        "the model is judged without it (is it no longer logged?)",
        "feature 'C3' (column 'C3') has values in 800 of the 800 train rows but in none of the 200 eval rows: "
        "the model is judged without it (is it no longer logged?)",
        f"feature 'I1' (column 'I1') has no value in any of the 800 {empty}; yet 150 of the 200 eval rows have one, "
        f"so training and eval see different data",  # named once: its filled value's std 0 is not named again
        "feature 'I2' (column 'I2') has one value in every train row (7, missing values filled with 1): it carries "
        "no signal"]
    logged = _config()
    logged_art = _artifact(logged, dense_stats={"I1": {"mean": 2.0, "std": 0.5}, "I2": {"mean": 7.0, "std": 3.0}})
    assert feature_warnings(logged, logged_art, _counts({"train": 800, "validation": 0, "eval": 200}, {})) == []


def test_features_whose_splits_disagree_are_named_beyond_the_configs_limits():
    """A column filled in most train rows but few eval rows (a join that broke part way through the log), or
    whose values change unit (x1000), has values everywhere and no NaN: each is named with its figures; the
    limits are the config's, globally and per feature (TFX's per-feature thresholds)."""
    counts = _counts({"train": 2400, "validation": 0, "eval": 600},
                     {"train": {"I1": 2280}, "eval": {"I1": 60, "C1": 60}},
                     {"train": {"I1": 1.0, "I2": 3.0}, "eval": {"I1": 1.0, "I2": 3000.0}})
    stats = {"I1": {"mean": 1.0, "std": 1.0}, "I2": {"mean": 3.0, "std": 2.0}, "I3": {"boundaries": [1.0]}}

    def named(cfg) -> dict[str, str]:
        return {w.split("'")[1]: w for w in feature_warnings(cfg, _artifact(cfg, dense_stats=stats), counts)}
    shift = ("its values in the 600 eval rows average 3000, +1498.5 standard deviations (2) from the 2,400 train "
             "rows' 3, beyond preprocess.max_mean_shift (1): has its unit or scale changed upstream?")
    assert named(_config()) == {
        "I1": "feature 'I1' (column 'I1') has a value in 10.0% of the 600 eval rows against 95.0% of the 2,400 "
              "train rows, a change beyond preprocess.max_presence_change (0.25): is it filled less upstream now?",
        "C1": "feature 'C1' (column 'C1') has a value in 10.0% of the 600 eval rows against 100.0% of the 2,400 "
              "train rows, a change beyond preprocess.max_presence_change (0.25): is it filled less upstream now?",
        "I2": f"dense feature 'I2' (column 'I2'): {shift}"}
    assert named(_config(max_presence_change=1, max_mean_shift=1499)) == {}
    # per feature: I1's own limit silences it only; C1's, tighter than its move, names C1 with its own key, and
    # I2 keeps the global one; with C1's and I2's own limits raised, none is named
    own = _config(features=[{"feature": "C1", "max_presence_change": 0.5},
                            {"feature": "I1", "max_presence_change": 0.9}])
    assert set(named(own)) == {"C1", "I2"}
    assert "beyond preprocess.features[0].max_presence_change (0.5)" in named(own)["C1"]
    assert named(own)["I2"].endswith(shift)
    assert named(_config(features=[{"feature": "C1", "max_presence_change": 1},
                                   {"feature": "I1", "max_presence_change": 0.9},
                                   {"feature": "I2", "max_mean_shift": 1499}])) == {}


def test_features_that_moved_since_the_previous_run_are_named():
    """A day's run against the run it extends: a feature filled in far fewer of this day's train rows than
    the previous day's, or whose values moved by many standard deviations, is named, with that run's day."""
    cfg = _config()
    previous = _artifact(cfg, day="2026-01-01", dense_stats={"I1": {"mean": 1.0, "std": 1.0},
                                                             "I2": {"mean": 3.0, "std": 2.0}},
                         row_counts={"train": 2400, "with_value": {"train": {"I1": 2280, "I2": 2400}},
                                     "dense_sums": {"train": {"I1": 2280 * DENSE_SUM_SCALE,
                                                              "I2": 3 * 2400 * DENSE_SUM_SCALE}}})
    now = _counts({"train": 900, "validation": 0, "eval": 0}, {"train": {"I1": 270}},
                  {"train": {"I1": 1.0, "I2": 3000.0}})
    art = _artifact(cfg, dense_stats={"I1": {"mean": 1.0, "std": 1.0}, "I2": {"mean": 800.0, "std": 1300.0}})
    assert feature_warnings(cfg, art, now, previous) == [
        "feature 'I1' (column 'I1') has a value in 30.0% of this run's 900 train rows against 95.0% of the previous "
        "run's (2026-01-01) 2,400 train rows, a change beyond preprocess.max_presence_change (0.25): is it filled "
        "less upstream now?",
        "dense feature 'I2' (column 'I2'): its values in this run's 900 train rows average 3000, +1498.5 standard "
        "deviations (2) from the previous run's (2026-01-01) 2,400 train rows' 3, beyond preprocess.max_mean_shift "
        "(1): has its unit or scale changed upstream?"]
    previous.day = None
    assert "against 95.0% of the previous run's 2,400 train rows" in feature_warnings(cfg, art, now, previous)[0]
    assert feature_warnings(cfg, art, _counts({"train": 900, "validation": 0, "eval": 0}, {"train": {"I1": 855}},
                                              {"train": {"I1": 1.0, "I2": 3.5}}), previous) == []


def test_a_few_rows_of_sampling_noise_are_not_named():
    """Shares and means that move only as far as a split's few rows allow by chance are not anomalies."""
    cfg = _config()
    art = _artifact(cfg, dense_stats={"I1": {"mean": 1.5, "std": 0.8}, "I2": {"mean": 4.0, "std": 3.0}})
    train = {"I1": 1.5, "I2": 4.0}

    def eval_of(rows: int, with_c1: int, i2_mean: float) -> SplitCounts:
        """An eval split of `rows` rows, all holding every value at the train means but C1's and I2's."""
        return _counts({"train": 4800, "validation": 0, "eval": rows}, {"eval": {"C1": with_c1}},
                       {"train": train, "eval": {**train, "I2": i2_mean}})
    assert feature_warnings(cfg, art, eval_of(1200, 1200, 4.0)) == []
    far = 4.0 + 1.5 * 3.0  # beyond max_mean_shift, 1
    assert feature_warnings(cfg, art, eval_of(5, 2, far)) == []  # 5 rows: within 4 standard errors
    assert [w.split("'")[1] for w in feature_warnings(cfg, art, eval_of(40, 8, far))] == ["C1", "I2"]


def test_a_split_of_one_label_is_named():
    """Eval rows all labelled 0 (a label column broken upstream) gave `recpipe evaluate` an AUC of NaN, and a
    validation split so would leave early stopping choosing nothing, a train split so a model nothing to
    learn; each is named. Retrieval logs hold clicks only, by design."""
    rows = {"train": 800, "validation": 100, "eval": 200}
    assert feature_warnings(_config(), _artifact(_config()), _counts(rows, {}, positives={
        "train": 200, "validation": 100, "eval": 0})) == [
        "every one of the 100 validation rows has label 1 (column 'label'): AUC is undefined on it, so early "
        "stopping cannot choose a checkpoint (every one scores NaN and the last is kept)",
        "every one of the 200 eval rows has label 0 (column 'label'): AUC is undefined on it, so the model cannot "
        "be judged (recpipe evaluate reports it as null)"]
    [train] = feature_warnings(_config(), _artifact(_config()), _counts(rows, {}, positives={
        "train": 0, "validation": 3, "eval": 7}))
    assert train == ("every one of the 800 train rows has label 0 (column 'label'): a model cannot learn to tell the "
                     "two apart")
    retrieval = parse_config(yaml.safe_load((CONFIGS / "movielens_retrieval.yaml").read_text()))
    assert feature_warnings(retrieval, _artifact(retrieval), SplitCounts(rows, positives=dict(rows))) == []


def test_an_id_whose_values_never_recur_is_named():
    """A row or event ID (or a timestamp) configured as a sparse feature: every value is new, so the model
    learns nothing from it, serving sees only OOV values, and with min_count 1 its table grows by a row per
    example. Named when under 5 % of its train rows hold a value that recurs, over 1,000 rows; not on a day's
    run, whose vocabulary counts carry the earlier days."""
    d = small_config_dict()
    d["features"]["sparse"].append({"name": "event", "column": "event_id", "vocab": {"min_count": 1},
                                    "embedding_dim": 8})
    cfg = parse_config(d)

    def named(counts: list[int], previous=None) -> list[str]:
        n = sum(counts)
        return feature_warnings(cfg, _artifact(cfg, vocab_counts={"event": counts}),
                                SplitCounts({"train": n, "validation": 0, "eval": 0}, {"train": {"event": n}}),
                                previous)
    assert named([1] * 3000) == [
        "feature 'event' (column 'event_id'): only 0.0% of its 3,000 train rows with a value hold one that recurs in "
        "train and is kept (vocab.min_count 1; 3,000 values kept): is it a row, request or event ID, or a timestamp? "
        "The model cannot learn from values that never come back, and at serving they are all new (OOV)"]
    assert "only 3.3% of its 3,000 train rows" in named([2] * 50 + [1] * 2900)[0]
    assert named([2] * 100 + [1] * 2800) == []  # 6.7 % recur
    assert named([1] * 999) == []  # too few rows to tell
    assert named([1] * 3000, previous=_artifact(cfg, day="2026-01-01")) == []


def test_a_vocabulary_whose_max_size_cuts_most_rows_to_oov_is_named():
    """max_size far below a feature's values (TFT's top_k): values min_count keeps are cut, and most train
    rows share the OOV buckets, where the model cannot tell them apart. Not named when the vocabulary is
    not full, when min_count alone would cut the values too, when few rows are cut, or without max_size."""
    d = small_config_dict()
    d["features"]["sparse"][3]["vocab"] = {"min_count": 2, "max_size": 20, "oov_buckets": 1}  # C1
    cfg = parse_config(d)
    counts = _counts({"train": 3000, "validation": 0, "eval": 0}, {"train": {"C1": 2700}})

    def named(values: list[str], kept: list[int], config=cfg) -> list[str]:
        return feature_warnings(config, _artifact(config, vocabularies={"C1": values}, vocab_counts={"C1": kept}),
                                counts)
    top = [f"v{i}" for i in range(20)]
    assert named(top, [50] * 10 + [30] * 10) == [  # 3,000 - 800 kept - 300 without a value: 1,900 OOV
        "feature 'C1' (column 'C1'): vocab.max_size (20) is full and its least frequent value kept is in 30 train "
        "rows, so values in up to 30 rows, over vocab.min_count (2), were cut: 70.4% of the 2,700 train rows with a "
        "value map to its 1 OOV bucket(s), where the model cannot tell them apart; raise max_size, or hash the "
        "feature (hash_buckets)"]
    # "" kept (the 300 rows without a value): 3,000 - 1,070 kept rows OOV
    assert "were cut: 71.5% of the 2,700" in named([""] + top[:19], [300] + [50] * 10 + [30] * 9)[0]
    assert named(top[:19], [50] * 10 + [30] * 9) == []  # not full
    assert named(top, [50] * 10 + [30] * 9 + [2]) == []  # its least kept value is at min_count
    assert named(top, [120] * 10 + [110] * 10) == []  # 400 of 2,700 rows OOV: under 20 %
    assert named(top, [50] * 10 + [30] * 10, _config()) == []  # no max_size


# ----------------------------------------------------------------------------- files and rows
def test_files_whose_timestamps_are_in_other_units_are_named():
    """A day's file whose integer timestamps are milliseconds reads as the year 57,974: its rows went to
    whichever split that says, with no word. Its file is named with its range and the unit that fits."""
    year, day = 365.2425 * 86_400, 1_767_312_000  # 2026-01-02T00:00:00Z
    [ms] = timestamp_warnings({"/log/dt=2026-01-02/p.parquet": ((day + 60) * 1000, (day + 80_000) * 1000),
                               "/log/dt=2026-01-01/p.parquet": (day - 80_000, day - 60)}, "ts")
    assert ms.startswith("/log/dt=2026-01-02/p.parquet: its timestamps (column 'ts') run from the year 57,9")
    assert ms.endswith(
        "more than a year from its partition dt=2026-01-02: are they milliseconds read as seconds? (÷ 1000 they run "
        "from 2026-01-02 to 2026-01-02) Each row goes to the split its timestamp says, so these land in the wrong "
        "one (the eval split is the latest)")
    # no partition: only past 2200 (a placeholder such as Hive's 9999-12-31, or a unit)
    assert timestamp_warnings({"/a.parquet": (5.0, 9.0), "/b.parquet": (56 * year, 57 * year)}, "ts") == []
    [sentinel] = timestamp_warnings({"/c.parquet": (56 * year, 253402214400.0)}, "ts")
    assert "to 9999-12-31 00:00:00, after 2200 (no dt= partition): a placeholder value" in sentinel
    [micro] = timestamp_warnings({"/d.parquet": (56 * year * 1e6, 57 * year * 1e6)}, "ts")
    assert "are they microseconds read as seconds?" in micro


def test_features_that_give_the_label_away_are_named(small_log, small_cfg):
    """A column recorded after the click (seconds to the click, null without one) and a flag joined in from
    the outcome table each order the eval sample's rows by label: each is named (unless its own leak_check
    is off). Retrieval logs and samples of too few rows of a label are not judged, nor the plain log."""
    t = pq.read_table(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]).slice(0, 1000)
    assert leak_warnings(small_cfg, t) == []
    label = np.array(t.column("label").to_pylist())
    rng = np.random.default_rng(0)
    leaky = t.set_column(t.schema.get_field_index("I1"), "I1", pa.array(
        np.where(label == 1, rng.exponential(30, len(label)), np.nan), from_pandas=True))
    leaky = leaky.set_column(t.schema.get_field_index("C1"), "C1", pa.array(
        np.where(label == 1, "converted", "none").tolist()))
    why = ("is it recorded after the click, or derived from the label? A model trained on it scores near 1.0 in "
           "evaluation and fails in serving, where the value is not known yet")
    assert leak_warnings(small_cfg, leaky) == [
        f"dense feature 'I1' (column 'I1') alone orders the 1,000 eval-sample rows by their label (column 'label') "
        f"with AUC 1.000, {1 - label.mean():.0%} of them without a value (scored lowest): {why}",
        f"feature 'C1' (column 'C1'): its 2 values alone sort the 1,000 eval-sample rows by their label (column "
        f"'label'), AUC 1.000 from each value's click rate: {why}"]
    known = _config(features=[{"feature": "C1", "leak_check": False}])
    assert [w.split("'")[1] for w in leak_warnings(known, leaky)] == ["I1"]  # C1's own leak_check is off
    few = leaky.filter(pa.array((label == 0) | (np.cumsum(label) <= 9)))  # 9 clicks: too few to judge
    assert leak_warnings(small_cfg, few) == []
    retrieval = parse_config(yaml.safe_load((CONFIGS / "movielens_retrieval.yaml").read_text()))
    assert leak_warnings(retrieval, leaky.rename_columns([c if c != "ts" else "timestamp" for c in t.column_names])) \
        == []


def test_a_share_of_dead_lettered_rows_over_the_limit_is_named():
    """Each dead-lettered row is kept and counted; over preprocess.max_dead_letter_fraction of the rows read,
    the run is told, by reason, largest first."""
    dead = {"null_label": 2, "dense_infinite": 1, "label_not_0_1": 1, "null_timestamp": 1}
    assert dead_letter_warnings(400, dead, 0.01, "/out/dead_letter") == [
        "5 of the 400 rows read (1.2%) were dead-lettered, over preprocess.max_dead_letter_fraction (0.01): "
        "null_label 2, dense_infinite 1, label_not_0_1 1, null_timestamp 1; each row's file, row and field are in "
        "/out/dead_letter"]
    assert dead_letter_warnings(400, dead, 0.05, "/out/dead_letter") == []
    assert dead_letter_warnings(0, {}, 0.01, "/out/dead_letter") == []


def test_files_of_the_same_bytes_are_named():
    """A partition holding the same file twice (a retried task's output kept beside the first, a backfill
    re-run): every row would weigh double; each group of copies is named with how often its rows are read."""
    a, b, c = (InputFile(f"/log/dt=2026-01-01/{n}.parquet", 3000, 3000 * i) for i, n in enumerate("abc"))
    assert copied_file_warnings([[a, b, c]]) == [
        "/log/dt=2026-01-01/a.parquet, /log/dt=2026-01-01/b.parquet and /log/dt=2026-01-01/c.parquet hold the same "
        "bytes (3,000 rows each): a file written 3 times upstream (a retried task, a re-run backfill beside the "
        "first run's output)? Each of its rows is read 3 times; remove the copies"]
    assert copied_file_warnings([]) == []


def test_rows_repeated_within_or_across_files_are_named():
    """Rows repeated within a file (a join that fanned out on a key that is not unique) are named over
    preprocess.max_repeated_row_fraction with an example; a file whose every row repeats another's (the
    same rows written again in other bytes) is named whatever its share, unless the launch named it as a
    copy of the same bytes."""
    a, b = InputFile("/l/a.parquet", 3120, 0), InputFile("/l/b.parquet", 3000, 3120)
    fan_out = Repeats({(0, 0): 120}, {(0, 0): [(3001, 11), (3000, 10)]})
    assert repeated_row_warnings(fan_out, [a, b], [], 0.01) == [
        "120 of the 6,120 rows read (2.0%) repeat an earlier row in every column read, over "
        "preprocess.max_repeated_row_fraction (0.01): 120 within /l/a.parquet (e.g. /l/a.parquet row 3000 repeats "
        "/l/a.parquet row 10): did a join upstream fan out (a key that is not unique), or were rows appended twice? "
        "Each repeat is trained on as a row of its own, and in a time split a repeat of an eval row may sit in train "
        "too"]
    assert repeated_row_warnings(Repeats({(0, 0): 61}, {(0, 0): [(3000, 10)]}), [a, b], [], 0.01) == []
    across = Repeats({(0, 1): 70}, {(0, 1): [(3200, 4)]})
    assert "70 in /l/b.parquet of rows in /l/a.parquet (e.g. /l/b.parquet row 80 repeats /l/a.parquet row 4)" in \
        repeated_row_warnings(across, [a, b], [], 0.01)[0]
    copy, shorter, first = (InputFile("/l/a-attempt2.parquet", 3000, 0), InputFile("/l/a-shorter.parquet", 2999, 3000),
                            InputFile("/l/a.parquet", 3000, 5999))
    again = Repeats({(0, 1): 2999, (0, 2): 3000}, {(0, 1): [(3000, 1)], (0, 2): [(5999, 0)]})
    assert repeated_row_warnings(again, [copy, shorter, first], [[copy, first]], 0.01) == [
        "/l/a-shorter.parquet: each of its 2,999 rows repeats a row of /l/a-attempt2.parquet in every column read (in "
        "other bytes: another order, layout or writer): were its rows written again as another file upstream (a "
        "re-run's output beside the first run's)? Each is read twice; remove the copies"]


def test_a_day_of_far_fewer_or_more_rows_than_the_previous_run_is_named():
    """A day's run reads its rows per dt= partition day against the run it extends (TFX's num_examples drift
    comparator): far fewer (a partition only partly written) or far more (rows in two files) is named."""
    cfg = _config()
    one_day = _artifact(cfg, day="2026-01-01", row_counts={"in": 3000, "partition_days": 1})
    assert volume_warnings(cfg, 900, ["2026-01-02"], one_day) == [
        "this run reads 900 rows (dt=2026-01-02) against 3,000 rows in the previous run (2026-01-01): 0.30 of them, "
        "below preprocess.min_rows_vs_previous (0.5): is a partition only partly written upstream (files missing), "
        "or were rows dropped before the log? The model learns from what is there"]
    assert volume_warnings(cfg, 6000, ["2026-01-02"], one_day) == [
        "this run reads 6,000 rows (dt=2026-01-02) against 3,000 rows in the previous run (2026-01-01): 2.00 times "
        "them, above preprocess.max_rows_vs_previous (1.75): are rows in two files (a re-run's output beside the "
        "first run's), or is it a day of that much more traffic?"]
    assert volume_warnings(cfg, 3000, ["2026-01-02"], one_day) == []
    assert volume_warnings(cfg, 900, ["2026-01-02"], None) == []
    # per day: a run over two days is compared a day at a time
    two_days = _artifact(cfg, day="2026-01-02", row_counts={"in": 6000, "partition_days": 2})
    assert volume_warnings(cfg, 3000, ["2026-01-03"], two_days) == []
    assert volume_warnings(cfg, 6000, ["2026-01-03", "2026-01-04"], two_days) == []
    assert volume_warnings(cfg, 900, [], two_days)[0].startswith(
        "this run reads 900 rows (no dt= partition) against 3,000 rows a day in the previous run (2026-01-02): 0.30")
    assert volume_warnings(_config(min_rows_vs_previous=0.2), 900, ["2026-01-02"], one_day) == []
