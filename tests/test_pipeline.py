"""The Beam job: stages under TestPipeline, and whole runs with exact row accounting and clear errors.

A whole run costs about 1.5 s, most of it Beam's own start-up, whatever its size: each family of behaviour
has one (or a few) over small logs that hold every case of the family at once, and what is decided before
any stage runs (listing, footers, the launch checks) or by pure functions over the job's figures (the
anomaly messages: tests/test_anomalies.py) is tested without one."""
import datetime
import decimal
import glob
import json
import os
import shutil
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from conftest import CONFIGS, IN_MEMORY, SHARED_DATA, small_config_dict
from recpipe.features.artifact import TransformArtifact
from recpipe.features.canonical import DENSE_SUM_SCALE, LABEL_KEY, SchemaError, canonicalize, dense_prenorm, plain_columns
from recpipe.features.canonical import encoded_columns, raw_kind, validate_batch
from recpipe.features.config import parse_config
from recpipe.features.preprocessed import SPLITS, PreprocessedData
from recpipe.features.records import parse_record
from recpipe.pipeline.analysis import (merge_count_tables, merge_dense_stats, select_vocabulary, select_vocabulary_table,
                               split_cutoffs_by_row, split_cutoffs_from_histogram, split_sizes, token_count_tables)
from recpipe.pipeline.anomalies import dead_letter_warnings, feature_warnings, timestamp_warnings
from recpipe.pipeline.leakage import leak_warnings
from recpipe.pipeline.options import pipeline_runner
from recpipe.pipeline.preprocess import PreprocessError, run_preprocess
from recpipe.pipeline.repeats import row_hashes
from recpipe.pipeline.sources import InputError, inspect_inputs, list_input_files
from recpipe.pipeline.transforms import (Columns, ColumnsCoder, ComputeVocabularies, RawBatch, RawBatchCoder,
                                         ReadClickLogs, SplitRows, ValidateRows, _MergeCountTables,
                                         read_units)


def _test_pipeline() -> BeamTestPipeline:
    """A TestPipeline on the runner `recpipe preprocess` uses for these options."""
    options = beam.options.pipeline_options.PipelineOptions(IN_MEMORY)
    return BeamTestPipeline(runner=pipeline_runner(options), options=options)


def _count_rows(out_dir, split, cfg):
    parse = parse_record(cfg)
    n = 0
    for f in glob.glob(os.path.join(out_dir, split, "*.tfrecord")):
        for rec in tf.data.TFRecordDataset(f):
            n += int(parse(rec)[LABEL_KEY].shape[0])
    return n


def _days(small_log) -> list[str]:
    """The small log's dt= partition folders, in order."""
    return sorted(glob.glob(os.path.join(small_log, "dt=*")))


def _first_file(small_log) -> str:
    return sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]


def _write(path, table, **kwargs):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path, **kwargs)
    return path


def _with_columns(t: pa.Table, **columns) -> pa.Table:
    for name, values in columns.items():
        t = t.set_column(t.schema.get_field_index(name), name, values)
    return t


def _warnings(said: list[str]) -> list[str]:
    return [s for s in said if "WARNING" in s]


def _shard_bytes(out: Path, split: str) -> list[bytes]:
    """The bytes of each shard file of one split of a preprocess output, in name order (none is an error)."""
    files = sorted(glob.glob(str(Path(out) / split / "*")))
    assert files, f"no {split} shards in {out}"
    return [Path(f).read_bytes() for f in files]


# ----------------------------------------------------------------------------- pure helpers
@pytest.mark.unit
def test_select_vocabulary_top_k_ties_deterministic():
    counts = [("b", 5), ("a", 5), ("c", 9), ("d", 1), ("e", 5)]
    assert select_vocabulary(counts, 2, None) == (["c", "a", "b", "e"], [9, 5, 5, 5])
    assert select_vocabulary(reversed(counts), 2, 2) == (["c", "a"], [9, 5])


@pytest.mark.unit
def test_count_tables_select_the_same_vocabulary_as_per_token_counting():
    """Per-batch Arrow count tables, merged whole (with compaction on the way), give exactly the
    vocabulary the per-token counts give: same values, counts, order (ties by value) and cut."""
    cfg = parse_config({"name": "t", "features": {"sparse": [
        {"name": "a", "column": "a", "vocab": {"min_count": 2}},
        {"name": "b", "column": "b", "multivalent": True, "vocab": {"min_count": 1, "max_size": 7}},
        {"name": "c", "column": "c", "share_embedding_with": "a"}]}})
    rng = np.random.default_rng(3)
    batches, expected = [], {"a": {}, "b": {}}
    for _ in range(6):
        a = [f"v{x}" for x in rng.zipf(1.5, 50) % 40]
        c = [f"v{x}" for x in rng.integers(0, 60, 50)]
        b = [[f"t{x}" for x in rng.integers(0, 30, rng.integers(0, 4))] for _ in range(50)]
        batches.append({"a": pa.array(a), "c": pa.array(c), "b": pa.array(b, pa.list_(pa.string()))})
        for owner, tokens in (("a", a + c), ("b", [t for row in b for t in row])):
            for t in tokens:
                expected[owner][t] = expected[owner].get(t, 0) + 1
    combiner = _MergeCountTables(compact_rows=30)  # compacts after a few tables
    accs = {"a": [combiner.create_accumulator(), combiner.create_accumulator()], "b": [combiner.create_accumulator()]}
    for i, cols in enumerate(batches):
        for owner, table in token_count_tables(cols, cfg):
            assert table.num_rows == len(set(table.column("value").to_pylist()))  # one row per distinct value
            acc = accs[owner][i % len(accs[owner])]
            combiner.add_input(acc, table)
    merged = {o: combiner.extract_output(combiner.merge_accumulators(a)) for o, a in accs.items()}
    for owner, min_count, max_size in (("a", 2, None), ("b", 1, 7)):
        values, counts = select_vocabulary_table(merged[owner], min_count, max_size)
        assert (values.to_pylist(), counts.to_pylist()) == select_vocabulary(expected[owner].items(), min_count,
                                                                             max_size)
    assert merge_count_tables([]).num_rows == 0


@pytest.mark.unit
def test_a_merged_count_table_pickles_at_its_own_size():
    """A runner moves count tables between stages pickled: a table whose chunks share buffers pickles them once
    per chunk (group_by's output did, 9x its size for 40 batches: the DirectRunner's peak RSS at 15M rows)."""
    import pickle
    rng = np.random.default_rng(0)
    tables = []
    for _ in range(40):
        values, counts = np.unique(rng.zipf(1.2, 20_000) % 100_000, return_counts=True)
        tables.append(pa.table({"value": pa.array(values.astype(str)), "count": pa.array(counts, pa.int64())}))
    merged = merge_count_tables(tables)
    assert merged.column("value").num_chunks == 1 and merged.column("count").num_chunks == 1
    assert len(pickle.dumps(merged)) < 1.05 * merged.nbytes + 10_000
    assert sum(merged.column("count").to_pylist()) == 40 * 20_000


@pytest.mark.unit
def test_split_cutoffs():
    hist = {10: 50, 20: 30, 30: 20}
    assert split_cutoffs_from_histogram(hist, 0.2)[1] == 20  # rows with ts > 20 (20 rows) are eval
    assert split_cutoffs_from_histogram(hist, 0.5)[1] == 10  # 50 train rows needed: ts <= 10 has exactly 50
    assert split_cutoffs_from_histogram({}, 0.1) == (float("inf"), float("inf"))
    # 80 rows before eval; the last 3/8 of them (30) are validation: ts 20
    assert split_cutoffs_from_histogram(hist, 0.2, 0.375) == (10, 20)
    assert split_cutoffs_from_histogram(hist, 0.2, 0.0) == (20, 20)  # no validation split
    assert split_cutoffs_by_row(100, 0.1, 0.2) == (71, 89)  # rows 0..71 train, 72..89 validation, 90..99 eval


# ----------------------------------------------------------------------------- stages on TestPipeline
@pytest.mark.integration
def test_validate_rows_routes_bad_rows_with_reasons():
    cfg = parse_config(small_config_dict())
    table = pa.table({"label": pa.array([1, None, 2, 0]), "ts": pa.array([1, 2, 3, None]),
                      "I1": pa.array([1.0, 1.0, 1.0, 1.0]), "I2": pa.array([0.0, 0.0, float("inf"), 0.0]),
                      "I3": pa.array([1, 2, 3, 4])})
    cfg_small = parse_config({**small_config_dict(), "features": {"dense": small_config_dict()["features"]["dense"]}})
    with _test_pipeline() as p:
        out = (p | beam.Create([RawBatch("f.parquet", 10, np.arange(4), table)]) | ValidateRows(cfg_small))
        good_rows = out.good | "GoodRows" >> beam.FlatMap(lambda b: b.table.column("label").to_pylist())
        dead = out.dead_letter | "Dead" >> beam.FlatMap(
            lambda t: list(zip(t.column("row").to_pylist(), t.column("reason").to_pylist(),
                               t.column("source_file").to_pylist())))
        assert_that(good_rows, equal_to([1]), label="good")
        assert_that(dead, equal_to([(11, "null_label", "f.parquet"), (12, "label_not_0_1", "f.parquet"),
                                    (13, "null_timestamp", "f.parquet")]), label="dead")
    del cfg


@pytest.mark.unit
def test_read_and_validated_batches_are_sized_without_being_encoded(small_log, small_cfg):
    """A runner samples the encoded size of every PCollection's first elements for its metrics. The read's
    and the validation's batches are RawBatches, whose coder estimates a size from the buffers (Beam's
    fallback pickled each 27 MB batch once more to measure it) and still round-trips the batch whole."""
    kinds, inputs = inspect_inputs(list_input_files(small_log), small_cfg)
    files = [(f.path, f.first_row, f.num_rows) for f in inputs]
    p = beam.Pipeline()
    batches = p | ReadClickLogs(files, small_cfg.raw_columns(), kinds, hash_rows=True)
    for pcoll in (batches, batches | ValidateRows(small_cfg, dead_letter=False),
                  (batches | "WithDead" >> ValidateRows(small_cfg)).good):
        assert pcoll.element_type is RawBatch
        assert isinstance(beam.coders.registry.get_coder(pcoll.element_type), RawBatchCoder)
    table = pq.read_table(files[0][0])
    batch = RawBatch(files[0][0], 0, np.arange(table.num_rows), table, row_hashes(table))
    coder = RawBatchCoder()
    encoded = coder.encode(batch)
    back = coder.decode(encoded)
    assert back.table.equals(batch.table) and (back.hashes == batch.hashes).all() and back.source == batch.source
    assert 0.5 < coder.estimate_size(batch) / len(encoded) < 2
    # the split's canonical batches likewise (Columns, ColumnsCoder): 1.1 GB pickled just to be measured at 2M rows
    splits = (batches | "Good" >> ValidateRows(small_cfg, dead_letter=False)
              | SplitRows(small_cfg, p | beam.Create([(1.0e18, 1.0e18)])))
    for split in SPLITS:
        assert splits[split].element_type is Columns
        assert isinstance(beam.coders.registry.get_coder(splits[split].element_type), ColumnsCoder)
    cols = Columns(canonicalize(table.filter(pa.array(validate_batch(table, small_cfg)[0])), small_cfg))
    encoded = ColumnsCoder().encode(cols)
    back = ColumnsCoder().decode(encoded)
    assert type(back) is Columns and back.keys() == cols.keys()
    assert all(back[k].equals(cols[k]) or np.array_equal(back[k], cols[k], equal_nan=True) for k in cols)
    assert 0.5 < ColumnsCoder().estimate_size(cols) / len(encoded) < 2


@pytest.mark.integration
def test_compute_vocabularies_min_count_top_k_and_shared():
    cfg = parse_config({"name": "v", "features": {"sparse": [
        {"name": "item", "column": "item", "vocab": {"min_count": 2, "max_size": 2, "oov_buckets": 1}},
        {"name": "hist", "column": "hist", "multivalent": True, "share_embedding_with": "item"},
        {"name": "rare", "column": "rare", "vocab": {"min_count": 5}}]}})
    t1 = pa.table({"label": [0, 1, 0], "item": ["x", "y", "z"], "hist": [["x"], ["y", "x"], []],
                   "rare": ["a", "b", "c"]})
    t2 = pa.table({"label": [0, 1], "item": ["z", "w"], "hist": [["y"], ["w"]], "rare": ["a", "a"]})
    with _test_pipeline() as p:
        vocabs = (p | beam.Create([canonicalize(t1, cfg), canonicalize(t2, cfg)]) | ComputeVocabularies(cfg))
        # x:3 y:3 w:2 z:2 -> top 2 by count, ties by value: x, y ; 'rare' has nothing >= 5
        as_lists = vocabs | beam.MapTuple(lambda owner, vc: (owner, (vc[0].to_pylist(), vc[1].to_pylist())))
        assert_that(as_lists, equal_to([("item", (["x", "y"], [3, 3])), ("rare", ([], []))]))


# ----------------------------------------------------------------------------- whole runs
@pytest.mark.integration
def test_preprocess_outputs_and_accounting(preprocessed, small_cfg):
    """Every row is accounted for, in the result, the artifact and the shards on disk; the plain synthetic log
    is named for nothing (no feature, file, leak or repeated row)."""
    out, result = preprocessed
    assert result.rows_in == 6000
    assert result.rows_in == result.rows_train + result.rows_eval + result.rows_dead
    data = PreprocessedData(out)
    art = data.transform()
    assert art.row_counts["in"] == 6000 and art.row_counts["train"] == result.rows_train
    assert _count_rows(out, "train", small_cfg) == result.rows_train
    assert _count_rows(out, "eval", small_cfg) == result.rows_eval
    assert result.rows_eval == pytest.approx(1200, abs=60)  # last 20% by timestamp
    assert len(art.vocabularies["item_id"]) <= 500 and art.dense_stats["I3"]["boundaries"]
    assert not [d for d in os.listdir(os.path.dirname(out)) if ".staging-" in d]
    assert feature_warnings(small_cfg, art, result.split_counts()) == []
    assert timestamp_warnings(result.time_ranges, "ts") == [] and len(result.time_ranges) == 2
    assert leak_warnings(small_cfg, data.eval_sample_table()) == []
    assert art.row_counts["repeated_rows"] == 0
    assert not any(n.startswith("_") for n in os.listdir(out))  # the staged row hashes went with the check


@pytest.mark.integration
def test_reading_id_columns_dictionary_encoded_changes_no_output_byte(tmp_path, preprocessed, small_log, small_cfg,
                                                                     monkeypatch):
    """The job reads the string ID columns dictionary-encoded (hashed features, shared and vocabulary ones,
    with nulls); read as plain strings instead, every file it writes is the same, byte for byte."""
    import recpipe.pipeline.preprocess as preprocess_module
    out, _ = preprocessed
    raw_schema, _ = inspect_inputs(list_input_files(small_log), small_cfg)
    assert encoded_columns(small_cfg, raw_schema) == ["user_id", "item_id", *(f"C{i}" for i in range(1, 7))]
    monkeypatch.setattr(preprocess_module, "encoded_columns", lambda cfg, raw: [])
    plain = tmp_path / "plain"
    run_preprocess(small_cfg, small_log, str(plain), IN_MEMORY, say=lambda _: None)
    files = lambda root: sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file())  # noqa: E731
    assert files(out) == files(plain)
    differ = [f for f in files(out) if (Path(out) / f).read_bytes() != (plain / f).read_bytes()]
    assert differ == []


@pytest.mark.integration
def test_split_is_by_time(preprocessed, small_log):
    art = PreprocessedData(preprocessed[0]).transform()
    assert art.split["kind"] == "timestamp"
    # Every eval row is later than every train row: the newest file holds all eval rows.
    files = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))
    ts_first_day = pq.read_table(files[0], columns=["ts"]).column("ts").to_numpy()
    assert art.row_counts["eval"] < pq.ParquetFile(files[-1]).metadata.num_rows
    assert len(ts_first_day) <= art.row_counts["train"]


@pytest.mark.system
def test_the_cli_runs_the_job_in_process_without_tensorflow_or_prism(tmp_path, small_log, small_cfg_path):
    """`recpipe preprocess` and the daily DAG's preprocess task (`recpipe daily preprocess`) run the job
    without TensorFlow (hashing, dense transforms, record encoding and the row check are Arrow/numpy/farmhash,
    so no worker pays TF's start-up), on DirectRunner's in-process FnApiRunner in both of its running modes:
    DirectRunner itself tries every job on Prism first (it fetches Prism's binary from GitHub at run time;
    where that works, the job runs on a runner never tested here, where not, it falls back) and leaves an
    empty $TMPDIR/beam-temp* folder per run. `--runner=PrismRunner` still reaches Prism. Both commands run in
    one process, so whatever either imported is in its sys.modules at the end."""
    import subprocess
    import sys

    import yaml
    from apache_beam.options.pipeline_options import PipelineOptions
    day = os.path.basename(_days(small_log)[0])[3:]
    project = tmp_path / "project.yaml"
    project.write_text(yaml.safe_dump({"log_root": small_log, "work_root": str(tmp_path / "work"),
                                       "export_base": str(tmp_path / "serving"), "config": small_cfg_path}))
    temp = tmp_path / "tmp"
    temp.mkdir()
    in_memory = ["preprocess", "--config", small_cfg_path, "--input", small_log, "--output", str(tmp_path / "out")]
    daily = ["daily", "preprocess", "--project", str(project), "--day", day,
             "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    code = ("import sys; from apache_beam.runners.portability import prism_runner; "
            "prism_runner.PrismRunner.run_pipeline = lambda *a, **k: sys.exit('Prism was tried'); "
            "from recpipe.cli import main; "
            f"rc = main({in_memory!r}) or main({daily!r}); "
            "print('tensorflow loaded' if any(m.split('.')[0] == 'tensorflow' for m in sys.modules) else 'no tf'); "
            "sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(temp)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rows in = 6000" in proc.stdout and "rows in = 3000" in proc.stdout, proc.stdout
    assert proc.stdout.strip().endswith("no tf"), proc.stdout
    assert (tmp_path / "work" / day / "preprocessed").is_dir()
    assert not list(temp.glob("beam-temp*"))
    assert pipeline_runner(PipelineOptions(["--runner=PrismRunner"])) is None
    assert pipeline_runner(PipelineOptions(["--runner=recpipe.pipeline.dask_runner.DaskRunner"])) is None


@pytest.mark.integration
def test_written_files_must_hold_the_counted_rows(tmp_path, preprocessed):
    """The last check before publishing reads what is on disk: a lost shard fails the run, naming the split."""
    from recpipe.pipeline.preprocess import _check_written
    out, result = preprocessed
    copy = shutil.copytree(out, tmp_path / "copy")
    _check_written(PreprocessedData(str(copy)), result)  # complete: passes
    for f in PreprocessedData(str(copy)).shard_files("eval"):
        os.remove(f)
    with pytest.raises(PreprocessError, match=rf"eval: 0 rows written, {result.rows_eval} counted"):
        _check_written(PreprocessedData(str(copy)), result)


@pytest.mark.integration
def test_bad_rows_are_dead_lettered_exactly(tmp_path, small_log, small_cfg):
    """Every row that cannot be used is dead-lettered with its file, row, reason, field and content, and
    counted by reason; the others are published. String-typed numbers are parsed per row (a label or dense
    value that is no number is dead-lettered), and a binary column (Parquet BYTE_ARRAY without the UTF8
    annotation, as Impala, Hive and older Spark SQL write strings) reads as strings, a value that is not
    UTF-8 dead-lettered. 2 % dead-lettered is under max_dead_letter_fraction: no warning; nor for the rows
    repeated within the file when max_repeated_row_fraction 1 turns that check off (the job then hashes no
    rows, and the artifact says it did not count them)."""
    t = pq.read_table(_first_file(small_log)).slice(0, 400)
    t = pa.concat_tables([t, t.slice(100, 6)])  # 6 rows twice: 1.5 %, named with the check on
    labels = [str(v) for v in t.column("label").to_pylist()]
    labels[3], labels[5], labels[7], labels[11] = None, "clicked", "5", None
    ts = t.column("ts").to_pylist()
    ts[20] = None
    i1 = ["" if v is None else str(v) for v in t.column("I1").to_pylist()]
    i1[9] = "12abc"
    i2 = [float("inf") if i == 30 else v for i, v in enumerate(t.column("I2").to_pylist())]
    items = [None if v is None else v.encode() for v in t.column("item_id").to_pylist()]
    items[40] = b"\xff\xfe item"
    t = _with_columns(t, label=pa.array(labels), ts=pa.array(ts, pa.int64()), I1=pa.array(i1),
                      I2=pa.array(i2, pa.float64()), item_id=pa.array(items, pa.binary()))
    log = _write(str(tmp_path / "log" / "dt=2026-01-01" / "part-0.parquet"), t)
    out = str(tmp_path / "out")
    said = []
    cfg = parse_config({**small_config_dict(), "preprocess": {"max_repeated_row_fraction": 1}})
    res = run_preprocess(cfg, log, out, IN_MEMORY, say=said.append)
    assert res.dead_letter == {"null_label": 2, "label_unparsable": 1, "label_not_0_1": 1, "dense_unparsable": 1,
                               "null_timestamp": 1, "dense_infinite": 1, "invalid_utf8": 1}
    assert not _warnings(said)  # 2.0 % dead-lettered: under max_dead_letter_fraction
    assert res.rows_in == 406 and res.rows_train + res.rows_eval == 398
    dead = pq.read_table(PreprocessedData(out).dead_letter_files()).to_pylist()
    assert sorted((d["row"], d["reason"], d["field"]) for d in dead) == [
        (3, "null_label", "label"), (5, "label_unparsable", "label"), (7, "label_not_0_1", "label"),
        (9, "dense_unparsable", "I1"), (11, "null_label", "label"), (20, "null_timestamp", "ts"),
        (30, "dense_infinite", "I2"), (40, "invalid_utf8", "item_id")]
    assert {d["source_file"] for d in dead} == {os.path.abspath(log)}
    assert json.loads(next(d for d in dead if d["row"] == 7)["row_json"])["label"] == "5"
    assert "row accounting" not in res.summary() and "dead-lettered 8" in res.summary()
    art = PreprocessedData(out).transform()
    assert (art.raw_schema["label"], art.raw_schema["I1"], art.raw_schema["item_id"]) == ("string",) * 3
    assert art.row_counts["repeated_rows"] is None and not any(n.startswith("_") for n in os.listdir(out))


@pytest.mark.unit
@pytest.mark.parametrize("case, message", [
    ("missing_column", "column 'C3' required by the config is missing"),
    ("not_parquet", "not a readable Parquet file"),
    ("truncated", "not a readable Parquet file"),
    ("empty_dir", "no Parquet files found"),
    ("zero_rows", "input has no rows"),
    ("no_such_path", "no such file or directory"),
    ("type_drift", "column 'I1' is float but int"),
    ("timestamp_drift", "column 'ts' is float (timestamp[ms, tz=UTC], read as seconds since the epoch) but int in"),
    ("wrong_type", "cannot feed sparse feature 'user_id'"),
    ("duplicate_column", "column 'I1' required by the config appears 2 times"),
])
def test_bad_inputs_fail_naming_the_file(tmp_path, small_log, small_cfg, case, message):
    """Each fails at launch, from listings and footers, before any Beam stage runs (a unit test may run none)
    and before the output is created."""
    t = pq.read_table(_first_file(small_log)).slice(0, 50)
    d = tmp_path / "in"
    bad_file = str(d / "b.parquet")
    if case == "missing_column":
        _write(bad_file, t.drop(["C3"]))
    elif case == "not_parquet":
        d.mkdir()
        open(bad_file, "w").write("label,ts\n1,2\n")
    elif case == "truncated":
        _write(bad_file, t)
        data = Path(bad_file).read_bytes()
        open(bad_file, "wb").write(data[: len(data) // 2])
    elif case == "empty_dir":
        d.mkdir()
        bad_file = str(d)
    elif case == "zero_rows":
        _write(bad_file, t.slice(0, 0))
    elif case == "no_such_path":
        bad_file = str(d / "nothing")
    elif case == "type_drift":
        _write(str(d / "a.parquet"), t)
        _write(bad_file, _with_columns(t, I1=pa.array(t.column("I1").to_pylist(), pa.float64())))
    elif case == "timestamp_drift":  # was "is float but int": a timestamp column is no float to its writer
        _write(str(d / "a.parquet"), t)
        ms = pa.array([v * 1000 for v in t.column("ts").to_pylist()], pa.int64()).cast(pa.timestamp("ms", tz="UTC"))
        _write(bad_file, t.set_column(t.schema.get_field_index("ts"), "ts", ms))
    elif case == "duplicate_column":
        _write(bad_file, pa.Table.from_arrays([*t.columns, t.column("I1")], names=[*t.column_names, "I1"]))
    elif case == "wrong_type":
        _write(bad_file, t.set_column(t.schema.get_field_index("user_id"), "user_id", pa.array([1.5] * 50)))
    spec = str(d) if case in ("type_drift", "timestamp_drift") else bad_file
    with pytest.raises((InputError, SchemaError)) as e:
        run_preprocess(small_cfg, spec, str(tmp_path / "out"), IN_MEMORY, say=lambda _: None)
    assert message in str(e.value)
    if case not in ("empty_dir", "no_such_path"):
        assert "b.parquet" in str(e.value)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.unit
def test_output_must_be_new(tmp_path, small_log, small_cfg):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(PreprocessError, match="exists and is not empty"):
        run_preprocess(small_cfg, small_log, str(out), IN_MEMORY, say=lambda _: None)
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.unit
def test_listing_and_offsets(small_log, small_cfg):
    files = list_input_files(small_log)
    assert files == sorted(files) and all("dt=" in f for f in files)
    assert list_input_files(os.path.join(small_log, "dt=*", "*.parquet")) == files
    _, inputs = inspect_inputs(files, small_cfg)
    assert inputs[1].first_row == inputs[0].num_rows


@pytest.mark.integration
def test_files_and_rows_read_twice_are_named(tmp_path, small_log, small_cfg):
    """A partition holding the same file twice (a retried task's output kept beside the first, a backfill
    re-run) was read whole twice with no word: every row weighed double, and counted as two rows in. The
    copy of the same bytes is named at launch (refused there under on_anomaly: fail, before any Beam stage
    runs); the job finds the same rows written again in other bytes (shuffled, other row groups), and rows
    repeated within a file (a join upstream that fanned out on a key that is not unique) over
    preprocess.max_repeated_row_fraction, with an example."""
    log = tmp_path / "log"
    day1, day2 = _days(small_log)
    shutil.copytree(day1, log / os.path.basename(day1))
    first = sorted(glob.glob(str(log / "*" / "*.parquet")))[0]
    copy = first.replace(".parquet", "-attempt2.parquet")
    shutil.copyfile(first, copy)
    other = pq.read_table(first)  # the same rows, written again: another file (its footer differs)
    shorter = first.replace(".parquet", "-shorter.parquet")
    pq.write_table(other.slice(1).take(np.random.default_rng(0).permutation(other.num_rows - 1)), shorter,
                   row_group_size=100)
    t2 = pq.read_table(day2)
    fanned = _write(str(log / os.path.basename(day2) / "part-00000.parquet"),
                    pa.concat_tables([t2, t2.slice(10, 200)]))  # 200 rows twice
    rows = pq.ParquetFile(first).metadata.num_rows
    read = 3 * rows - 1 + t2.num_rows + 200
    said = []
    res = run_preprocess(small_cfg, str(log), str(tmp_path / "out"), IN_MEMORY, say=said.append)
    assert _warnings(said) == [  # "-attempt2" sorts before ".parquet", before "-shorter"
        f"preprocess: WARNING: {copy} and {first} hold the same bytes ({rows:,} rows each): a file written 2 times "
        "upstream (a retried task, a re-run backfill beside the first run's output)? Each of its rows is read 2 "
        "times; remove the copies",
        # the job finds the shuffled, re-laid-out copy by its rows (the copy named at launch is not named again)
        f"preprocess: WARNING: {shorter}: each of its {rows - 1:,} rows repeats a row of {copy} in every column "
        "read (in other bytes: another order, layout or writer): were its rows written again as another file "
        "upstream (a re-run's output beside the first run's)? Each is read twice; remove the copies",
        f"preprocess: WARNING: 200 of the {read:,} rows read ({200 / read:.1%}) repeat an earlier row in every "
        f"column read, over preprocess.max_repeated_row_fraction (0.01): 200 within {fanned} (e.g. {fanned} row "
        f"{t2.num_rows} repeats {fanned} row 10): did a join upstream fan out (a key that is not unique), or were "
        f"rows appended twice? Each repeat is trained on as a row of its own, and in a time split a repeat of an "
        f"eval row may sit in train too"]
    assert PreprocessedData(str(tmp_path / "out")).transform().row_counts["repeated_rows"] == 2 * rows - 1 + 200
    assert res.rows_in == res.rows_out + res.rows_dead == read == sum(
        pq.ParquetFile(f).metadata.num_rows for f in glob.glob(str(log / "*" / "*.parquet")))
    cfg = parse_config({**small_config_dict(), "preprocess": {"on_anomaly": "fail"}})
    with pytest.raises(PreprocessError, match="hold the same bytes"):  # at launch, before any Beam stage runs
        run_preprocess(cfg, str(log), str(tmp_path / "out2"), IN_MEMORY, say=lambda _: None)
    assert not os.path.exists(tmp_path / "out2")


@pytest.mark.unit
def test_a_column_logged_as_int64_and_as_uint64_is_int(tmp_path, small_log, small_cfg):
    """Files that type one ID column uint64 and int64 read as the signed kind, as before uint64 had a kind
    (serving then takes int64); with a string file beside them the column's kinds are named."""
    t = pq.read_table(_first_file(small_log)).slice(0, 50)
    users = pa.array(range(50), pa.int64())
    paths = [_write(str(tmp_path / f"{kind}.parquet"), t.set_column(t.schema.get_field_index("user_id"), "user_id",
                                                                     users.cast(kind)))
             for kind in (pa.uint64(), pa.int64(), pa.uint64(), pa.string())]
    assert inspect_inputs(paths[:1], small_cfg)[0]["user_id"] == "uint64"
    assert inspect_inputs(paths[:3], small_cfg)[0]["user_id"] == "int"
    with pytest.raises(SchemaError, match=r"string.parquet: column 'user_id' is string but int in .*uint64.parquet"):
        inspect_inputs(paths, small_cfg)


def _littered_copy(tmp_path, small_log) -> Path:
    """A copy of the small log with what Spark and Hive leave beside a table's data: an uncommitted task's
    `_temporary/` output, a `.hive-staging_*` folder, `_SUCCESS`, a `.crc` checksum and `_common_metadata`."""
    log = tmp_path / "log"
    shutil.copytree(small_log, log)
    day = sorted(log.glob("dt=*"))[0]
    part = sorted(day.glob("*.parquet"))[0]
    for extra in (log / "_temporary" / "0" / "_temporary" / "attempt_0" / "part-00000.parquet",
                  day / ".hive-staging_hive_2026" / "-ext-10000" / "000000_0.parquet", day / "_SUCCESS",
                  day / ".part-00000.parquet.crc", day / "_common_metadata.parquet"):
        extra.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(part, extra)
    return log


@pytest.mark.unit
def test_a_tables_hidden_folders_and_markers_are_not_input(tmp_path, small_log, small_cfg):
    """What Spark and Hive leave beside a table's data, an uncommitted task's `_temporary/` output, a
    `.hive-staging_*` folder, `_SUCCESS`, is not read from a directory, local or by URL (a Parquet file
    under `_temporary/` used to be read: its rows twice), nor a marker or checksum from a glob's `*`
    (`dt=*/*` used to read `_SUCCESS` and fail on it as 'not a readable Parquet file'). preprocess reads
    exactly what list_input_files lists (a run by URL: test_iso_8601_string_timestamps_read_as_epoch_seconds)."""
    log = _littered_copy(tmp_path, small_log)
    day = sorted(log.glob("dt=*"))[0]
    part = os.path.basename(list_input_files(_days(small_log)[0])[0])
    want = [os.path.relpath(f, small_log) for f in list_input_files(small_log)]
    files = list_input_files(str(log))
    assert [os.path.relpath(f, log) for f in files] == want
    assert [f.split(str(log), 1)[1] for f in list_input_files("file://" + str(log))] == \
        [f.split(str(log), 1)[1] for f in files]
    assert sum(f.num_rows for f in inspect_inputs(files, small_cfg)[1]) == 6000

    # a glob reads every file it matches, the same by URL as on disk: `*` stays within one path part (fnmatch's
    # crossed '/', so file://LOG/*/*.parquet also read _temporary/0/_temporary/attempt_0/part-00000.parquet)
    for pattern in ("*/*.parquet", "dt=*/*.parquet", "**/*.parquet", "dt=2026-01-0[1]/*", "*/.*", "*/_*"):
        local = list_input_files(str(log / pattern))
        assert [f.split(str(log), 1)[1] for f in list_input_files("file://" + str(log / pattern))] == \
            [f.split(str(log), 1)[1] for f in local], pattern
    # but not a writer's marker or checksum, unless the pattern names such files: a partition's `*` is its data
    names = [os.path.basename(f) for f in list_input_files(str(log / "dt=2026-01-0[1]" / "*"))]
    assert names == [part] and "_SUCCESS" in os.listdir(day)
    assert {os.path.basename(f) for f in list_input_files(str(log / "*" / "_*"))} == {"_SUCCESS",
                                                                                     "_common_metadata.parquet"}
    every_day = list_input_files(str(log / "dt=*" / "*"))
    assert [os.path.relpath(f, log) for f in every_day] == want
    assert sum(f.num_rows for f in inspect_inputs(every_day, small_cfg)[1]) == 6000


# ----------------------------------------------------------------------------- incremental days
@pytest.mark.unit
def test_incremental_vocabulary_keeps_ids():
    from recpipe.features.config import VocabSpec
    from recpipe.pipeline.lifecycle import VocabState, advance_vocabulary
    prev = VocabState(["a", "b"], [5, 3], [0, 0])
    new = advance_vocabulary(prev, [("c", 4), ("b", 1), ("d", 1), ("e", 4)], 1, VocabSpec(min_count=2, max_size=3))
    assert new.values == ["a", "b", "c"] and new.counts == [5, 4, 4]  # room for one: c beats e on the tie by value
    new = advance_vocabulary(VocabState(["a"], [1], [0]), [("z", 9)], 1, VocabSpec(min_count=1))
    assert (new.values, new.counts) == (["a", "z"], [1, 9])


@pytest.mark.unit
def test_merge_dense_stats_accumulates_moments():
    prev = {"x": {"mean": 1.0, "std": 0.0, "count": 2}, "b": {"boundaries": [1.0, 2.0]}}
    cur = {"x": {"mean": 3.0, "std": 0.0, "count": 2}, "b": {"boundaries": [5.0]}}
    out = merge_dense_stats(prev, cur)
    assert out["x"]["count"] == 4 and out["x"]["mean"] == pytest.approx(2.0) and out["x"]["std"] == pytest.approx(1.0)
    assert out["b"] == {"boundaries": [1.0, 2.0]}


@pytest.fixture(scope="module")
def day_one(tmp_path_factory, small_log, small_cfg):
    """The small log's first day, preprocessed: the run the next day's extends."""
    out = tmp_path_factory.mktemp("day_one") / "out"
    run_preprocess(small_cfg, _days(small_log)[0], str(out), IN_MEMORY, say=lambda _: None)
    return str(out)


@pytest.mark.integration
def test_previous_transform_keeps_known_ids_and_compares_the_day(tmp_path, small_log, small_cfg, day_one):
    """A day's run extending the previous day's (--previous-transform): every kept value keeps its ID, new
    values are appended, dense statistics accumulate and bucket boundaries stay. The day is compared with that
    run, and still published (on_anomaly: warn): a partly written day (30 % of the rows, TFX's num_examples
    drift), a feature filled far less often (I1) or in other units (I2 x1000) are named with the previous
    run's day. Columns that hold only nulls (Arrow type null) in every file of the day (hist_items, C1: named,
    for they have no value) are typed by the previous transform, and are an error without one."""
    day2 = pq.read_table(_days(small_log)[1])
    n = int(day2.num_rows * 0.3)
    part = day2.slice(0, n)
    keep = np.random.default_rng(1).random(n) < 0.3
    part = _with_columns(
        part, I1=pa.array([v if k else None for v, k in zip(part.column("I1").to_pylist(), keep)], pa.int64()),
        I2=pa.array([None if v is None else v * 1000 for v in part.column("I2").to_pylist()], pa.int64()),
        hist_items=pa.nulls(n), C1=pa.nulls(n))
    log = tmp_path / "log"
    _write(str(log / "dt=2026-01-02" / "part-00000.parquet"), part)
    with pytest.raises(SchemaError, match=r"column\(s\) 'hist_items', 'C1' hold only nulls"):  # at launch
        run_preprocess(small_cfg, str(log), str(tmp_path / "untyped"), IN_MEMORY, say=lambda _: None)
    out = str(tmp_path / "d2")
    said = []
    run_preprocess(small_cfg, str(log), out, IN_MEMORY, say=said.append, previous_transform=day_one)
    warnings = _warnings(said)
    assert len(warnings) == 5, warnings
    assert (f"this run reads {n:,} rows (dt=2026-01-02) against 3,000 rows in the previous run (2026-01-01): 0.30 "
            f"of them, below preprocess.min_rows_vs_previous (0.5)") in warnings[0]  # at launch
    named = {s.split("'")[1]: s for s in warnings[1:]}
    assert set(named) == {"hist", "C1", "I1", "I2"}, warnings
    assert "of this run's" in named["I1"] and "of the previous run's (2026-01-01)" in named["I1"]
    assert "its values in this run's" in named["I2"] and "from the previous run's (2026-01-01)" in named["I2"]
    assert "has no value in any of the" in named["hist"] and "has no value in any of the" in named["C1"]
    a1, a2 = PreprocessedData(day_one).transform(), PreprocessedData(out).transform()
    assert a2.raw_schema == a1.raw_schema  # the all-null columns typed as the previous day's
    for owner, values in a1.vocabularies.items():
        assert a2.vocabularies[owner][: len(values)] == values, owner
        assert all(c2 >= c1 for c1, c2 in zip(a1.vocab_counts[owner], a2.vocab_counts[owner]))
    assert any(len(a2.vocabularies[o]) > len(a1.vocabularies[o]) for o in a1.vocabularies)  # new values appended
    assert a2.dense_stats["I1"]["count"] == a1.dense_stats["I1"]["count"] + a2.row_counts["train"]
    assert a2.dense_stats["I3"]["boundaries"] == a1.dense_stats["I3"]["boundaries"]
    assert a2.lineage == {"previous_transform": day_one}


@pytest.mark.integration
def test_a_day_of_far_fewer_or_more_rows_than_the_previous_run_is_refused_at_launch(tmp_path, small_log, small_cfg,
                                                                                     day_one, preprocessed):
    """A day's partition only partly written upstream (its marker set, files missing), or its rows in two
    files of another layout (which the copied-file check cannot see), trained a model with no word. A day's
    run compares its rows per dt= day with the run it extends (TFX's num_examples drift comparator), at launch:
    under on_anomaly: fail it is refused before any Beam stage runs (named and published under warn: see
    test_previous_transform_keeps_known_ids_and_compares_the_day). A run over two days, extended by one day of
    as many rows as each, passes the check (and meets the next launch check, an output that exists)."""
    t = pq.read_table(_days(small_log)[1])
    _write(str(tmp_path / "partial" / "dt=2026-01-02" / "part-00000.parquet"), t.slice(0, int(t.num_rows * 0.3)))
    _write(str(tmp_path / "twice" / "dt=2026-01-02" / "part-00000.parquet"), t)
    _write(str(tmp_path / "twice" / "dt=2026-01-02" / "part-00000-rerun.parquet"), t, row_group_size=1000)
    strict = parse_config({**small_config_dict(), "preprocess": {"on_anomaly": "fail"}})
    before = PreprocessedData(day_one).transform().row_counts["in"]
    short = (rf"this run reads {int(t.num_rows * 0.3):,} rows \(dt=2026-01-02\) against {before:,} rows in the "
             rf"previous run \(2026-01-01\): 0\.30 of them, below preprocess\.min_rows_vs_previous \(0\.5\): is a "
             rf"partition only partly written upstream")
    with pytest.raises(PreprocessError, match=short):
        run_preprocess(strict, str(tmp_path / "partial"), str(tmp_path / "o1"), IN_MEMORY, say=lambda _: None,
                       previous_transform=day_one)
    with pytest.raises(PreprocessError, match=rf"reads {2 * t.num_rows:,} rows .*: 2\.00 times them, above "
                                              rf"preprocess\.max_rows_vs_previous \(1\.75\): are rows in two files"):
        run_preprocess(strict, str(tmp_path / "twice"), str(tmp_path / "o2"), IN_MEMORY, say=lambda _: None,
                       previous_transform=day_one)
    assert not glob.glob(str(tmp_path / "o*"))
    # per day: the session's run over both days, extended by a third day of as many rows as each
    assert PreprocessedData(preprocessed[0]).transform().row_counts["partition_days"] == 2
    _write(str(tmp_path / "day3" / "dt=2026-01-03" / "part-00000.parquet"), t)
    (tmp_path / "o4").mkdir()
    (tmp_path / "o4" / "keep.txt").write_text("mine")
    with pytest.raises(PreprocessError, match="exists and is not empty"):  # the launch check after the volume's
        run_preprocess(strict, str(tmp_path / "day3"), str(tmp_path / "o4"), IN_MEMORY, say=lambda _: None,
                       previous_transform=preprocessed[0])


@pytest.mark.integration
def test_previous_transform_must_have_same_features(tmp_path, small_log, small_cfg, preprocessed):
    d = small_config_dict()
    d["features"]["dense"] = d["features"]["dense"][:2]
    with pytest.raises(PreprocessError, match="different 'features' section"):
        run_preprocess(parse_config(d), small_log, str(tmp_path / "o"), IN_MEMORY, say=lambda _: None,
                       previous_transform=preprocessed[0])


# ----------------------------------------------------------------------------- Arrow and Parquet types
SENTINEL = 253_402_214_400  # 9999-12-31T00:00:00Z, Hive's placeholder date
SENTINEL_ROW = 160  # a train row of the second file, but for its sentinel timestamp


@pytest.fixture(scope="module")
def arrow_twins(tmp_path_factory, small_log, small_cfg):
    """Three logs of the same 300 rows in two files, and the plain one preprocessed: `plain` (int64 epoch
    seconds, plain strings and lists, float64 I2; its second file's I1 and C1 typed nulls and its lists of
    exactly two items), `typed` (the same values in the types other writers give them: see
    test_typed_columns_read_as_their_plain_values) and `iso` (timestamps as ISO 8601 strings). Row 7's
    timestamp is null (not a date-time in `iso`); row SENTINEL_ROW's is 9999-12-31 in all three."""
    root = tmp_path_factory.mktemp("arrow")
    t = pq.read_table(_first_file(small_log)).slice(0, 300)
    seconds = t.column("ts").to_pylist()
    seconds[7], seconds[SENTINEL_ROW] = None, SENTINEL
    two = [((h or []) + [None, None])[:2] for h in t.column("hist_items").to_pylist()]  # null items too
    plain = _with_columns(t, ts=pa.array(seconds, pa.int64()), I2=pa.array(t.column("I2").to_pylist(), pa.float64()))
    first, second = plain.slice(0, 150), plain.slice(150)
    second = _with_columns(second, hist_items=pa.array(two[150:], pa.list_(pa.string())),
                           I1=pa.nulls(150, pa.int64()), C1=pa.nulls(150, pa.string()))
    decimals = {k: pa.array([None if v is None else decimal.Decimal(v) for v in x.column("I2").to_pylist()],
                            pa.decimal128(14, 2)) for k, x in enumerate((first, second))}
    typed_first = _with_columns(  # pandas: categoricals, datetimes in nanoseconds with a zone; views; a decimal
        first, ts=pa.array([None if v is None else v * 10 ** 9 for v in seconds[:150]], pa.int64())
        .cast(pa.timestamp("ns", tz="UTC")),
        user_id=pc.dictionary_encode(first.column("user_id")), item_id=pc.dictionary_encode(first.column("item_id")),
        C1=pc.dictionary_encode(first.column("C1")),
        hist_items=pa.array(first.column("hist_items").to_pylist(), pa.list_(pa.dictionary(pa.int32(), pa.string()))),
        C2=first.column("C2").cast(pa.string_view()), C3=first.column("C3").cast(pa.binary_view()),
        C4=first.column("C4").cast(pa.large_binary()), I2=decimals[0])
    typed_second = _with_columns(  # Hive, Impala, older Spark: INT96 timestamps, binary strings; numpy lists
        second, ts=pa.array([v * 10 ** 6 for v in seconds[150:]], pa.int64()).cast(pa.timestamp("us")),
        item_id=second.column("item_id").cast(pa.binary()), C4=second.column("C4").cast(pa.large_binary()),
        C5=second.column("C5").cast(pa.binary()), hist_items=pa.array(two[150:], pa.list_(pa.binary(), 2)),
        I1=pa.nulls(150), C1=pa.nulls(150), I2=decimals[1])  # I1, C1 of Arrow type null: pandas' all-None columns
    forms = ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S+00:00", "%Y-%m-%dT%H:%M:%S.000")
    iso = [None if v is None else datetime.datetime.fromtimestamp(v, datetime.timezone.utc).strftime(
        forms[i % len(forms)]) for i, v in enumerate(seconds)]
    iso[7] = "2026-13-01T00:00:00"
    logs = {"plain": [first, second], "typed": [typed_first, typed_second],
            "iso": [_with_columns(x, ts=pa.array(iso[k * 150:(k + 1) * 150])) for k, x in enumerate((first, second))]}
    for name, tables in logs.items():
        for k, table in enumerate(tables):
            _write(str(root / name / f"part-{k}.parquet"), table,
                   use_deprecated_int96_timestamps=(name, k) == ("typed", 1))
    plain_out = root / "plain_out"
    res = run_preprocess(small_cfg, str(root / "plain"), str(plain_out), IN_MEMORY, say=lambda _: None)
    assert res.dead_letter == {"null_timestamp": 1} and res.rows_in == 300
    return root, res


@pytest.mark.integration
def test_typed_columns_read_as_their_plain_values(arrow_twins, small_cfg):
    """A log as other writers type its columns preprocesses to the same examples, byte for byte, and the same
    vocabularies and split as its plain twin (each type was once 'unsupported type' or a wrong value):
    pandas categoricals (dictionary-encoded strings, lists of them); datetimes in nanoseconds with a zone
    (nanoseconds since 1970 used to fail a safe cast to float64, 'Integer value ... not in range'); Hive's,
    Impala's and older Spark's INT96 timestamps, whose 9999-12-31 sentinel reads as 9999-12-31 (Arrow's
    nanoseconds wrap it to a date in 1816 silently, which would put its row in train, not eval), and their
    strings as BYTE_ARRAY without the UTF8 annotation (binary, large binary, list of binary); string_view and
    binary_view (as pyarrow writes a string_view column back); a list of fixed size (pyarrow writes one from
    numpy rows); decimals (SQL exports) as floats; and a file's all-null columns (Arrow type null) as
    missing values of the kind the other file gives them. A null timestamp is dead-lettered as in int64."""
    root, plain = arrow_twins
    typed_files = sorted(glob.glob(str(root / "typed" / "*.parquet")))
    assert [pq.ParquetFile(f).schema.column(pq.read_schema(f).get_field_index("ts")).physical_type
            for f in typed_files] == ["INT64", "INT96"]
    assert pq.read_schema(typed_files[0]).field("C2").type == pa.string_view()
    assert pq.read_schema(typed_files[1]).field("hist_items").type.list_size == 2
    assert pa.types.is_null(pq.read_schema(typed_files[1]).field("C1").type)
    res = run_preprocess(small_cfg, str(root / "typed"), str(root / "typed_out"), IN_MEMORY, say=lambda _: None)
    assert res.dead_letter == {"null_timestamp": 1}
    assert (res.rows_train, res.rows_eval) == (plain.rows_train, plain.rows_eval)
    typed = PreprocessedData(str(root / "typed_out"))
    ours = PreprocessedData(str(root / "plain_out")).transform()
    assert typed.transform().raw_schema == {**ours.raw_schema, "ts": "float"}
    assert ours.raw_schema["I2"] == "float" and ours.raw_schema["hist_items"] == "list<string>"
    assert typed.transform().vocabularies == ours.vocabularies
    for split in ("train", "eval"):  # the same examples, byte for byte
        assert _shard_bytes(root / "plain_out", split) == _shard_bytes(root / "typed_out", split), split
    assert SENTINEL in typed.eval_sample_table().column("ts").to_pylist()  # read as 9999: an eval row


@pytest.mark.integration
def test_iso_8601_string_timestamps_read_as_epoch_seconds(arrow_twins, small_cfg):
    """A log whose timestamps are ISO 8601 strings (as JSON event logs and CSV exports carry them: 'Z', an
    offset, a space instead of 'T', no zone meaning UTC) preprocesses to the same examples, byte for
    byte, as its twin with int64 epoch seconds (every row used to be dead-lettered as
    timestamp_unparsable); a string that is no date-time is dead-lettered, naming the column. The log is
    given by URL (file:// here), so it is listed and read through pyarrow's filesystems."""
    root, _ = arrow_twins
    url = "file://" + str(root / "iso")
    files = list_input_files(url)
    assert len(files) == 2 and all(f.startswith("file://") for f in files)
    res = run_preprocess(small_cfg, url, str(root / "iso_out"), IN_MEMORY, say=lambda _: None)
    assert res.dead_letter == {"timestamp_unparsable": 1}
    iso = PreprocessedData(str(root / "iso_out"))
    dead = pq.read_table(iso.dead_letter_files())
    assert dead.select(["row", "reason", "field"]).to_pylist() == [
        {"row": 7, "reason": "timestamp_unparsable", "field": "ts"}]
    assert iso.transform().raw_schema["ts"] == "string"
    for split in ("train", "eval"):
        assert _shard_bytes(root / "iso_out", split) == _shard_bytes(root / "plain_out", split), split


@pytest.mark.unit
def test_arrow_timestamps_of_any_unit_or_zone_read_as_epoch_seconds():
    """The reader's conversion of a timestamp column (every row of every file goes through plain_columns):
    seconds, milliseconds (as an Arrow timestamp of pandas or Spark), microseconds or nanoseconds, with a
    zone or none, read as float epoch seconds of the same instant, a kind every feature of a time can read;
    a null stays null, so its row is dead-lettered as null_timestamp as in int64."""
    seconds = [1_767_225_611, None, 1_767_300_000, SENTINEL]
    cfg = parse_config({"name": "t", "input": {"timestamp": "ts"}, "label": {"column": "label"},
                        "features": {"dense": [{"name": "x", "column": "x"}]}})
    for unit, per in (("s", 1), ("ms", 10 ** 3), ("us", 10 ** 6), ("ns", 10 ** 9)):
        for tz in (None, "UTC", "+02:00"):
            values = [None if v is None else v * per for v in seconds]
            if unit == "ns":
                values[3] = None  # nanoseconds end in 2262
            arr = pa.array(values, pa.int64()).cast(pa.timestamp(unit, tz=tz))
            table = plain_columns(pa.table({"label": [1, 0, 1, 0], "ts": arr, "x": [1.0, 2.0, 3.0, 4.0]}))
            assert raw_kind(arr.type) == "float" and table.column("ts").type == pa.float64()
            assert table.column("ts").to_pylist() == [None if v is None else float(v // per) for v in values], \
                (unit, tz)
            good, bad = validate_batch(table, cfg)
            assert list(bad.indices) == [1] + ([3] if unit == "ns" else []) and set(bad.reasons) == {"null_timestamp"}


# ----------------------------------------------------------------------------- other logs and splits
@pytest.mark.system
@pytest.mark.skipif(not (SHARED_DATA / "criteo_10k.csv").is_file(), reason="../shared/data Criteo sample absent")
def test_real_criteo_sample_end_to_end(tmp_path):
    """`recpipe criteo-to-parquet` + `recpipe preprocess` on the real 10k-row Criteo log."""
    import subprocess
    import sys
    run = lambda *a: subprocess.run([sys.executable, "-m", "recpipe.cli", *a], capture_output=True, text=True,
                                    check=True, timeout=600).stdout  # noqa: E731
    run("criteo-to-parquet", "--csv", str(SHARED_DATA / "criteo_10k.csv"), "--output", str(tmp_path / "log"))
    out = run("preprocess", "--config", str(CONFIGS / "criteo.yaml"), "--input", str(tmp_path / "log"),
              "--output", str(tmp_path / "pre"))
    assert "rows in = 9999 = rows out 9999 (train 8100, validation 900, eval 999) + rows dead-lettered 0" in out
    art = TransformArtifact.read(str(tmp_path / "pre" / "transform"))
    assert art.split["kind"] == "row_order"
    # Criteo's C20 has 3 values plus empties; min_count 3 keeps all of them, "" (missing) included.
    assert set(art.vocabularies["C20"]) <= {"", *pq.read_table(str(tmp_path / "log" / "criteo_10k.parquet"),
                                                                 columns=["C20"]).column("C20").drop_null().to_pylist()}
    assert 0 < art.dense_stats["I1"]["count"] == 8100  # train rows only


SHOP_CONFIG = {
    "name": "shop_ctr", "input": {"timestamp": "event_time"},
    "split": {"eval_fraction": 0.25, "validation_fraction": 0.2}, "label": {"column": "clicked"},
    "features": {
        "sparse": [{"name": "shop", "column": "shop", "vocab": {"min_count": 1, "oov_buckets": 1}},
                   {"name": "terms", "column": "query_terms", "multivalent": True, "separator": ";",
                    "vocab": {"min_count": 1, "max_size": 10, "oov_buckets": 2}, "combiner": "sum"},
                   {"name": "block", "column": "block", "vocab": {"min_count": 1, "oov_buckets": 1}}],
        "dense": [{"name": "price", "column": "price", "transform": "log_zscore"},
                  {"name": "rating", "column": "rating", "transform": "bucketize", "num_buckets": 4}]},
    "train": {"batch_size": 64, "steps": 5}}


@pytest.fixture(scope="module")
def shop_log(tmp_path_factory):
    """A log of another schema (SHOP_CONFIG: a boolean label, string timestamps and numbers, ';'-joined terms)
    in two files, its rows in time order, `block` the row number // 100; preprocessed."""
    rng = np.random.default_rng(0)
    n = 2000
    table = pa.table({
        "clicked": pa.array(rng.integers(0, 2, n).astype(bool)),
        "event_time": pa.array([str(1_700_000_000 + i) for i in range(n)]),
        "shop": pa.array(rng.integers(0, 40, n)),
        "query_terms": pa.array([";".join(f"t{x}" for x in rng.integers(0, 30, rng.integers(0, 4))) for _ in range(n)]),
        "price": pa.array([f"{x:.2f}" for x in rng.random(n) * 100]),
        "rating": pa.array(rng.random(n) * 5),
        "block": pa.array(np.arange(n) // 100),
    })
    root = tmp_path_factory.mktemp("shop")
    _write(str(root / "log" / "day1.parquet"), table.slice(0, 1000))
    _write(str(root / "log" / "day2.parquet"), table.slice(1000))
    cfg = parse_config(SHOP_CONFIG)
    res = run_preprocess(cfg, str(root / "log"), str(root / "out"), IN_MEMORY, say=lambda _: None)
    return cfg, res, root / "out"


@pytest.mark.integration
def test_a_new_log_schema_needs_only_a_config(shop_log):
    cfg, res, out = shop_log
    assert (res.rows_in, res.rows_train, res.rows_validation, res.rows_eval, res.rows_dead) == (2000, 1200, 300, 500, 0)
    art = TransformArtifact.read(str(out / "transform"))
    assert art.raw_schema == {"clicked": "int", "event_time": "string", "shop": "int", "query_terms": "string",
                              "block": "int", "price": "string", "rating": "float"}
    assert len(art.vocabularies["terms"]) == 10 and len(art.dense_stats["rating"]["boundaries"]) == 3
    shards = glob.glob(str(out / "train" / "*.tfrecord"))
    batch = next(iter(tf.data.TFRecordDataset(shards).map(parse_record(cfg))))
    assert isinstance(batch["terms"], tf.RaggedTensor) and int(tf.reduce_max(batch["terms"].flat_values)) < 12


@pytest.mark.integration
def test_validation_split_is_carved_from_train_by_time_and_unseen_by_the_analysis(shop_log):
    """split.validation_fraction: the last share of the pre-eval rows become the validation split; the
    vocabularies come from the train rows alone, so validation and eval values are new to them alike."""
    cfg, res, out = shop_log
    assert (res.rows_in, res.rows_train, res.rows_validation, res.rows_eval) == (2000, 1200, 300, 500)
    art = TransformArtifact.read(str(out / "transform"))
    assert art.row_counts["validation"] == 300 and art.split["validation_fraction"] == 0.2
    assert sorted(art.vocabularies["block"]) == [str(s) for s in sorted(range(12), key=str)]  # rows 0..1199 only
    ids = {split: np.concatenate([b["block"].numpy() for b in tf.data.TFRecordDataset(
        glob.glob(str(out / split / "*.tfrecord"))).map(parse_record(cfg))]) for split in SPLITS}
    assert {k: len(v) for k, v in ids.items()} == {"train": 1200, "validation": 300, "eval": 500}
    assert ids["train"].max() < 12 and (ids["validation"] == 12).all() and (ids["eval"] == 12).all()  # OOV


@pytest.mark.integration
def test_an_empty_validation_split_fails_unless_told_to_warn(tmp_path):
    table = pa.table({"clicked": pa.array(np.arange(100) % 2 == 0), "ts": pa.array([5] * 80 + [9] * 20),
                      "shop": pa.array(np.arange(100) % 7)})
    _write(str(tmp_path / "log" / "d.parquet"), table)
    data = {"name": "v", "input": {"timestamp": "ts"}, "split": {"eval_fraction": 0.2, "validation_fraction": 0.1},
            "label": {"column": "clicked"},
            "features": {"sparse": [{"name": "shop", "column": "shop", "vocab": {"min_count": 1}}]}}
    with pytest.raises(PreprocessError, match="the validation split is empty"):
        run_preprocess(parse_config(data), str(tmp_path / "log"), str(tmp_path / "o1"), IN_MEMORY, say=lambda _: None)
    data["split"]["on_empty"] = "warn"
    said = []
    res = run_preprocess(parse_config(data), str(tmp_path / "log"), str(tmp_path / "o2"), IN_MEMORY, say=said.append)
    assert (res.rows_train, res.rows_validation, res.rows_eval) == (80, 0, 20)
    assert any("WARNING: the validation split is empty" in line for line in said)


# ----------------------------------------------------------------------------- the anomaly report
ANOMALY_CONFIG = {
    "name": "anomalies", "input": {"timestamp": "ts"}, "label": {"column": "label"},
    "split": {"eval_fraction": 0.2, "validation_fraction": 0.125},
    "features": {
        "sparse": [
            {"name": "user", "column": "user", "hash_buckets": 100},
            {"name": "tags", "column": "tags", "multivalent": True, "vocab": {"min_count": 1}},  # null or empty
            {"name": "blank", "column": "blank", "vocab": {"min_count": 1}},  # "" in every row
            {"name": "gone", "column": "gone", "vocab": {"min_count": 1}},  # in no eval row
            {"name": "filled", "column": "filled", "vocab": {"min_count": 1}},  # in 10 % of the eval rows
            {"name": "outcome", "column": "outcome", "vocab": {"min_count": 1}},  # joined from the outcome
            {"name": "event", "column": "event_id", "vocab": {"min_count": 1}},  # a new value in every row
            {"name": "cat", "column": "cat", "vocab": {"min_count": 2, "max_size": 20}},  # 100 values: cut
        ],
        "dense": [
            {"name": "late", "column": "late", "transform": "log_zscore"},  # in no train row, in eval rows
            {"name": "const", "column": "const", "fill": 1.0},  # 7 in every row
            {"name": "shift", "column": "shift"},  # x1000 in the eval rows, 5 % missing
            {"name": "secs", "column": "secs_to_click", "transform": "log_zscore"},  # only after a click
            {"name": "bucket", "column": "bucket", "transform": "bucketize", "num_buckets": 4},
        ]},
    "preprocess": {"max_dead_letter_fraction": 0.01},
}
ANOMALY_ROWS, DAY_START = 2000, 1_767_225_600  # 2026-01-01T00:00:00Z


@pytest.fixture(scope="module")
def anomaly_log(tmp_path_factory):
    """A log holding every anomaly a run names at its end, each in its own column (ANOMALY_CONFIG), 40 rows
    without a label (2 %, over the config's 0.01), the validation split all labelled 0, and the last 100 rows
    in a file of their own with timestamps in milliseconds; with what the run must count from it."""
    n, rng = ANOMALY_ROWS, np.random.default_rng(5)
    ts = DAY_START + 40 * np.arange(n)  # 2,000 rows within the day
    good = np.arange(n) % 50 != 25
    pos = np.cumsum(good) - 1  # rank among the good rows, which are in time order (the milliseconds last)
    fit, before_eval = split_sizes(int(good.sum()), 0.2, 0.125)
    split = np.where(pos < fit, "train", np.where(pos < before_eval, "validation", "eval"))
    is_eval, is_val = split == "eval", split == "validation"
    label = np.where(is_val, 0, rng.random(n) < 0.3).astype(int)

    def some(p: float) -> np.ndarray:
        return rng.random(n) < p
    table = pa.table({
        "ts": ts, "label": pa.array([int(v) if g else None for v, g in zip(label, good)], pa.int64()),
        "user": [f"u{x}" for x in rng.integers(0, 200, n)],
        "tags": pa.array([[None, [], [""]][i % 3] for i in range(n)], pa.list_(pa.string())),
        "blank": [""] * n,
        "gone": [None if e else f"g{x}" for e, x in zip(is_eval, rng.integers(0, 5, n))],
        "filled": [f"f{x}" if not e or k else None for e, k, x in zip(is_eval, some(0.1), rng.integers(0, 5, n))],
        "outcome": ["converted" if v else "none" for v in label],
        "event_id": [f"ev-{i:06d}" for i in range(n)],
        "cat": [f"c{x}" for x in rng.integers(0, 100, n)],
        "late": pa.array([int(x) if e and k else None for e, k, x in zip(is_eval, some(0.8), rng.integers(1, 50, n))],
                         pa.int64()),
        "const": [7.0] * n,
        "shift": pa.array([None if m else x * (1000 if e else 1) for m, e, x in zip(some(0.05), is_eval,
                                                                                      rng.normal(50, 10, n))]),
        "secs_to_click": pa.array([float(x) if v else None for v, x in zip(label, rng.exponential(30, n))]),
        "bucket": rng.random(n) * 10,
    })
    log = tmp_path_factory.mktemp("anomalies") / "log" / "dt=2026-01-01"
    seconds = _write(str(log / "part-00000.parquet"), table.slice(0, n - 100))
    millis = _write(str(log / "part-00001.parquet"), _with_columns(table.slice(n - 100), ts=pa.array(ts[-100:] * 1000)))
    cfg = parse_config(ANOMALY_CONFIG)
    kept = table.filter(pa.array(good))
    splits = {s: kept.filter(pa.array(split[good] == s)) for s in SPLITS}
    with_value = {s: {} for s in SPLITS}
    dense_sums = {s: {} for s in SPLITS}
    for s, t in splits.items():
        for f in cfg.column_sparse:
            values = t.column(f.column).to_pylist()
            with_value[s][f.name] = sum(bool([x for x in v or [] if x] if f.multivalent else v) for v in values)
        for d in cfg.features.dense:
            x = np.array([np.nan if v is None else v for v in t.column(d.column).to_pylist()], np.float32)
            with_value[s][d.name] = int((~np.isnan(x)).sum())
            if d.transform != "bucketize":
                dense_sums[s][d.name] = float(dense_prenorm(x[~np.isnan(x)], d.transform, d.fill).sum(dtype=np.float64))
    good_ts = [ts[:n - 100][good[:n - 100]], ts[n - 100:][good[n - 100:]] * 1000]
    expected = {"rows": {s: t.num_rows for s, t in splits.items()}, "with_value": with_value, "dense_sums": dense_sums,
                "positives": {s: int(sum(t.column("label").to_pylist())) for s, t in splits.items()},
                "time_ranges": {os.path.abspath(p): (float(x.min()), float(x.max()))
                                for p, x in zip((seconds, millis), good_ts)},
                "eval_events": sorted(splits["eval"].column("event_id").to_pylist())}
    return str(log.parent), millis, expected


def _anomalies_named(expected: dict, millis: str) -> list[str]:
    """What each line of the anomaly log's report starts with, in the order the run reports them."""
    rows, wv = expected["rows"], expected["with_value"]
    n_train = f"{rows['train']:,} train rows"
    return [
        f"40 of the {ANOMALY_ROWS:,} rows read (2.0%) were dead-lettered",
        f"every one of the {rows['validation']:,} validation rows has label 0 (column 'label')",
        f"feature 'tags' (column 'tags') has no value in any of the {n_train}",
        f"feature 'blank' (column 'blank') has no value in any of the {n_train}",
        f"feature 'gone' (column 'gone') has values in {wv['train']['gone']:,} of the {n_train} but in none of the "
        f"{rows['eval']:,} eval rows",
        f"feature 'late' (column 'late') has no value in any of the {n_train}: a model cannot learn from it (is the "
        f"column null or empty upstream?); yet {wv['eval']['late']:,} of the {rows['eval']:,} eval rows have one",
        "feature 'const' (column 'const') has one value in every train row (7, missing values filled with 1)",
        f"feature 'secs' (column 'secs_to_click') has values in {wv['train']['secs']:,} of the {n_train} but in none "
        f"of the {rows['validation']:,} validation rows",
        f"feature 'event' (column 'event_id'): only 0.0% of its {n_train} with a value hold one that recurs",
        "feature 'cat' (column 'cat'): vocab.max_size (20) is full",
        f"feature 'filled' (column 'filled') has a value in {wv['eval']['filled'] / rows['eval']:.1%} of the "
        f"{rows['eval']:,} eval rows against 100.0% of the {n_train}",
        f"dense feature 'shift' (column 'shift'): its values in the {rows['eval']:,} eval rows average",
        f"{millis}: its timestamps (column 'ts') run from the year",
        f"dense feature 'secs' (column 'secs_to_click') alone orders the {rows['eval']:,} eval-sample rows by their "
        f"label (column 'label') with AUC 1.000",
        f"feature 'outcome' (column 'outcome'): its 2 values alone sort the {rows['eval']:,} eval-sample rows by their "
        f"label (column 'label'), AUC 1.000"]


@pytest.mark.integration
def test_a_run_counts_what_its_anomaly_checks_need_and_reports_each(tmp_path, anomaly_log):
    """The job counts, per split, the rows, those labelled 1, and per feature the rows with a value and the
    sum of a dense feature's values (missing ones left out, bucketized features not summed), and each file's
    first and last timestamp, exactly; it keeps the eval rows as the eval sample; these figures are in the
    artifact's row counts. From them it reports every anomaly of the log (the messages are
    tests/test_anomalies.py's), each once, and publishes the run (on_anomaly: warn)."""
    log, millis, expected = anomaly_log
    cfg = parse_config(ANOMALY_CONFIG)
    said = []
    res = run_preprocess(cfg, log, str(tmp_path / "out"), IN_MEMORY, say=said.append)
    assert res.rows_in == ANOMALY_ROWS and res.dead_letter == {"null_label": 40}
    assert {s: res.rows(s) for s in SPLITS} == expected["rows"] == {"train": 1372, "validation": 196, "eval": 392}
    assert res.with_value == expected["with_value"]
    for s in SPLITS:
        assert set(res.dense_sums[s]) == {"late", "const", "shift", "secs"}, s  # the bucketized one has no moments
        for name, total in expected["dense_sums"][s].items():
            assert res.dense_sums[s][name] / DENSE_SUM_SCALE == pytest.approx(total, rel=1e-9, abs=1e-3), (s, name)
    assert res.positives == expected["positives"] and res.positives["validation"] == 0
    assert res.time_ranges == expected["time_ranges"]
    data = PreprocessedData(str(tmp_path / "out"))
    art, sample = data.transform(), data.eval_sample_table()
    assert sorted(sample.column("event_id").to_pylist()) == expected["eval_events"]
    assert {k: art.row_counts[k] for k in ("with_value", "dense_sums", "positives")} == \
        {"with_value": res.with_value, "dense_sums": res.dense_sums, "positives": res.positives}
    warnings = _warnings(said)
    named = _anomalies_named(expected, millis)
    assert len(warnings) == len(named) and all(w.startswith(f"preprocess: WARNING: {n}")
                                                for w, n in zip(warnings, named)), warnings
    assert warnings == [f"preprocess: WARNING: {w}" for w in [  # the messages are the pure functions' own
        *dead_letter_warnings(res.rows_in, res.dead_letter, 0.01, os.path.join(str(tmp_path / "out"), "dead_letter")),
        *feature_warnings(cfg, art, res.split_counts()), *timestamp_warnings(res.time_ranges, "ts"),
        *leak_warnings(cfg, sample)]]


@pytest.mark.integration
def test_on_anomaly_fail_refuses_the_run_publishing_nothing(tmp_path, anomaly_log):
    """preprocess.on_anomaly: fail stops the run, naming every anomaly the job found, and publishes nothing."""
    log, millis, expected = anomaly_log
    strict = parse_config({**ANOMALY_CONFIG, "preprocess": {**ANOMALY_CONFIG["preprocess"], "on_anomaly": "fail"}})
    with pytest.raises(PreprocessError) as e:
        run_preprocess(strict, log, str(tmp_path / "out"), IN_MEMORY, say=lambda _: None)
    assert str(e.value).endswith(" (preprocess.on_anomaly is fail)")
    assert [n for n in _anomalies_named(expected, millis) if n not in str(e.value)] == []
    assert os.listdir(tmp_path) == []  # neither the output nor its staging folder


@pytest.mark.unit
def test_read_units_group_whole_files_in_order_until_they_reach_the_rows():
    files = [("a", 0, 100), ("b", 100, 300), ("c", 400, 50), ("d", 450, 60), ("e", 510, 1000), ("f", 1510, 10)]
    units = read_units(files, min_rows=100)
    assert units == [(("a", 0),), (("b", 100),), (("c", 400), ("d", 450)), (("e", 510),), (("f", 1510),)]
    assert read_units(files, min_rows=10_000) == [tuple((p, f) for p, f, _ in files)]
    assert read_units([], min_rows=100) == []
