"""The Beam job: stages under TestPipeline, and whole runs with exact row accounting and clear errors."""
import datetime
import decimal
import glob
import json
from pathlib import Path
import os

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
from features.artifact import TransformArtifact
from features.canonical import LABEL_KEY
from features.config import parse_config
from features.preprocessed import SPLITS, PreprocessedData
from features.records import parse_record
from pipeline.options import pipeline_runner
from pipeline.preprocess import PreprocessError, run_preprocess
from pipeline.sources import InputError, inspect_inputs, list_input_files
from pipeline.analysis import (merge_count_tables, merge_dense_stats, select_vocabulary,
                               select_vocabulary_table, split_cutoffs_by_row, split_cutoffs_from_histogram,
                               token_count_tables)
from pipeline.repeats import row_hashes
from pipeline.transforms import (ComputeVocabularies, RawBatch, RawBatchCoder, ReadClickLogs, ValidateRows,
                                 _MergeCountTables)
from features.canonical import SchemaError, canonicalize


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


# ----------------------------------------------------------------------------- pure helpers
def test_select_vocabulary_top_k_ties_deterministic():
    counts = [("b", 5), ("a", 5), ("c", 9), ("d", 1), ("e", 5)]
    assert select_vocabulary(counts, 2, None) == (["c", "a", "b", "e"], [9, 5, 5, 5])
    assert select_vocabulary(reversed(counts), 2, 2) == (["c", "a"], [9, 5])


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
            lambda t: list(zip(t.column("row").to_pylist(), t.column("reason").to_pylist(), t.column("source_file").to_pylist())))
        assert_that(good_rows, equal_to([1]), label="good")
        assert_that(dead, equal_to([(11, "null_label", "f.parquet"), (12, "label_not_0_1", "f.parquet"),
                                    (13, "null_timestamp", "f.parquet")]), label="dead")
    del cfg


def test_read_and_validated_batches_are_sized_without_being_encoded(small_log, small_cfg):
    """A runner samples the encoded size of every PCollection's first elements for its metrics. The read's
    and the validation's batches are RawBatches, whose coder estimates a size from the buffers (Beam's
    fallback pickled each 27 MB batch once more to measure it) and still round-trips the batch whole."""
    kinds, inputs = inspect_inputs(list_input_files(small_log), small_cfg)
    files = [(f.path, f.first_row) for f in inputs]
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


def test_compute_vocabularies_min_count_top_k_and_shared():
    cfg = parse_config({"name": "v", "features": {"sparse": [
        {"name": "item", "column": "item", "vocab": {"min_count": 2, "max_size": 2, "oov_buckets": 1}},
        {"name": "hist", "column": "hist", "multivalent": True, "share_embedding_with": "item"},
        {"name": "rare", "column": "rare", "vocab": {"min_count": 5}}]}})
    t1 = pa.table({"label": [0, 1, 0], "item": ["x", "y", "z"], "hist": [["x"], ["y", "x"], []], "rare": ["a", "b", "c"]})
    t2 = pa.table({"label": [0, 1], "item": ["z", "w"], "hist": [["y"], ["w"]], "rare": ["a", "a"]})
    with _test_pipeline() as p:
        vocabs = (p | beam.Create([canonicalize(t1, cfg), canonicalize(t2, cfg)]) | ComputeVocabularies(cfg))
        # x:3 y:3 w:2 z:2 -> top 2 by count, ties by value: x, y ; 'rare' has nothing >= 5
        as_lists = vocabs | beam.MapTuple(lambda owner, vc: (owner, (vc[0].to_pylist(), vc[1].to_pylist())))
        assert_that(as_lists, equal_to([("item", (["x", "y"], [3, 3])), ("rare", ([], []))]))


# ----------------------------------------------------------------------------- whole runs
def test_preprocess_outputs_and_accounting(preprocessed, small_cfg):
    out, result = preprocessed
    assert result.rows_in == 6000
    assert result.rows_in == result.rows_train + result.rows_eval + result.rows_dead
    art = TransformArtifact.read(os.path.join(out, "transform"))
    assert art.row_counts["in"] == 6000 and art.row_counts["train"] == result.rows_train
    assert _count_rows(out, "train", small_cfg) == result.rows_train
    assert _count_rows(out, "eval", small_cfg) == result.rows_eval
    assert result.rows_eval == pytest.approx(1200, abs=60)  # last 20% by timestamp
    assert len(art.vocabularies["item_id"]) <= 500 and art.dense_stats["I3"]["boundaries"]
    assert not [d for d in os.listdir(os.path.dirname(out)) if ".staging-" in d]


def test_the_beam_job_never_loads_tensorflow(tmp_path, small_log, small_cfg_path):
    """`recpipe preprocess` (and the DoFns it runs) work without TensorFlow: hashing, dense transforms,
    record encoding and the row check are Arrow/numpy/farmhash, so no worker pays TF's start-up; nor does
    the daily DAG's preprocess task (`recpipe daily preprocess`)."""
    import subprocess
    import sys

    import yaml
    day = sorted(d for d in os.listdir(small_log) if d.startswith("dt="))[0][3:]
    project = tmp_path / "project.yaml"
    project.write_text(yaml.safe_dump({"log_root": small_log, "work_root": str(tmp_path / "work"),
                                       "model_base": str(tmp_path / "serving"), "config": small_cfg_path}))
    for argv, said in ((['preprocess', '--config', small_cfg_path, '--input', small_log, '--output',
                         str(tmp_path / 'out')], "rows in = 6000"),
                       (['daily', 'preprocess', '--project', str(project), '--day', day], "rows in = ")):
        code = ("import sys; from recpipe.cli import main; "
                f"rc = main({argv!r}); "
                "print('tensorflow loaded' if any(m.split('.')[0] == 'tensorflow' for m in sys.modules) else 'no tf'); "
                "sys.exit(rc)")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert said in proc.stdout and proc.stdout.strip().endswith("no tf"), proc.stdout
    assert (tmp_path / "work" / day / "preprocessed").is_dir()


def test_direct_runner_runs_in_process_without_trying_prism(tmp_path, small_log, small_cfg_path):
    """Beam's DirectRunner tries every job on Prism first: it fetches Prism's binary from GitHub at run
    time (where that works, the job runs on a runner never tested here; where not, it falls back) and
    leaves an empty $TMPDIR/beam-temp* folder per run. `recpipe preprocess` runs DirectRunner's in-process
    FnApiRunner directly, in both of its running modes; `--runner=PrismRunner` still reaches Prism."""
    import subprocess
    import sys
    from apache_beam.options.pipeline_options import PipelineOptions
    temp = tmp_path / "tmp"
    temp.mkdir()
    code = ("import sys; from apache_beam.runners.portability import prism_runner; "
            "prism_runner.PrismRunner.run_pipeline = lambda *a, **k: sys.exit('Prism was tried'); "
            "from recpipe.cli import main; sys.exit(main(sys.argv[1:]))")
    for i, mode in enumerate([[], ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]]):
        proc = subprocess.run([sys.executable, "-c", code, "preprocess", "--config", small_cfg_path, "--input",
                               small_log, "--output", str(tmp_path / f"out{i}"), *mode], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "TMPDIR": str(temp)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "rows in = 6000" in proc.stdout
    assert not list(temp.glob("beam-temp*"))
    assert pipeline_runner(PipelineOptions(["--runner=PrismRunner"])) is None
    assert pipeline_runner(PipelineOptions(["--runner=pipeline.dask_runner.DaskRunner"])) is None


def test_written_files_must_hold_the_counted_rows(tmp_path, preprocessed):
    """The last check before publishing reads what is on disk: a lost shard fails the run, naming the split."""
    import shutil

    from features.preprocessed import PreprocessedData
    from pipeline.preprocess import _check_written
    out, result = preprocessed
    copy = shutil.copytree(out, tmp_path / "copy")
    _check_written(PreprocessedData(str(copy)), result)  # complete: passes
    for f in PreprocessedData(str(copy)).shard_files("eval"):
        os.remove(f)
    with pytest.raises(PreprocessError, match=rf"eval: 0 rows written, {result.rows_eval} counted"):
        _check_written(PreprocessedData(str(copy)), result)


def test_split_is_by_time(tmp_path, small_log, small_cfg):
    out, _ = str(tmp_path / "o"), None
    run_preprocess(small_cfg, small_log, out, IN_MEMORY, say=lambda _: None)
    art = TransformArtifact.read(os.path.join(out, "transform"))
    assert art.split["kind"] == "timestamp"
    # Every eval row is later than every train row: the newest file holds all eval rows.
    files = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))
    ts_first_day = pq.read_table(files[0], columns=["ts"]).column("ts").to_numpy()
    assert art.row_counts["eval"] < pq.ParquetFile(files[-1]).metadata.num_rows
    assert len(ts_first_day) <= art.row_counts["train"]


def _write(path, table):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path)
    return path


def test_bad_rows_are_dead_lettered_exactly(tmp_path, small_log, small_cfg):
    src = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]
    t = pq.read_table(src).slice(0, 400)
    labels = t.column("label").to_pylist()
    labels[3], labels[7], labels[11] = None, 5, None
    ts = t.column("ts").to_pylist()
    ts[20] = None
    i1 = t.column("I2").to_pylist()
    t = t.set_column(t.schema.get_field_index("label"), "label", pa.array(labels, pa.int64()))
    t = t.set_column(t.schema.get_field_index("ts"), "ts", pa.array(ts, pa.int64()))
    t = t.set_column(t.schema.get_field_index("I2"), "I2", pa.array([float("inf") if i == 30 else v for i, v in enumerate(i1)], pa.float64()))
    log = _write(str(tmp_path / "log" / "dt=2026-01-01" / "part-0.parquet"), t)
    out = str(tmp_path / "out")
    said = []
    res = run_preprocess(small_cfg, log, out, IN_MEMORY, say=said.append)
    assert res.dead_letter == {"null_label": 2, "label_not_0_1": 1, "null_timestamp": 1, "dense_infinite": 1}
    assert not [s for s in said if "WARNING" in s]  # 1.2 % dead-lettered: under max_dead_letter_fraction
    assert res.rows_in == 400 and res.rows_train + res.rows_eval == 395
    dead = pq.read_table(glob.glob(os.path.join(out, "dead_letter", "*.parquet"))).to_pylist()
    assert sorted(d["row"] for d in dead) == [3, 7, 11, 20, 30]
    assert {d["source_file"] for d in dead} == {os.path.abspath(log)}
    assert json.loads(next(d for d in dead if d["row"] == 7)["row_json"])["label"] == 5
    assert "row accounting" not in res.summary() and "dead-lettered 5" in res.summary()
    strict = small_config_dict()
    strict["preprocess"] = {"max_dead_letter_fraction": 0.01, "on_anomaly": "fail"}
    with pytest.raises(PreprocessError, match=r"^5 of the 400 rows read \(1\.2%\) were dead-lettered, over preprocess"
                                              r"\.max_dead_letter_fraction \(0\.01\): null_label 2, dense_infinite 1, "
                                              r"label_not_0_1 1, null_timestamp 1; each row's file, row and field are "
                                              r"in .*strict/dead_letter"):
        run_preprocess(parse_config(strict), log, str(tmp_path / "strict"), IN_MEMORY, say=lambda _: None)


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
    src = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]
    t = pq.read_table(src).slice(0, 50)
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
        _write(bad_file, t.set_column(t.schema.get_field_index("I1"), "I1", pa.array(t.column("I1").to_pylist(), pa.float64())))
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


def test_output_must_be_new(tmp_path, small_log, small_cfg):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(PreprocessError, match="exists and is not empty"):
        run_preprocess(small_cfg, small_log, str(out), IN_MEMORY, say=lambda _: None)
    assert (out / "keep.txt").read_text() == "mine"


def test_listing_and_offsets(small_log, small_cfg):
    files = list_input_files(small_log)
    assert files == sorted(files) and all("dt=" in f for f in files)
    assert list_input_files(os.path.join(small_log, "dt=*", "*.parquet")) == files
    _, inputs = inspect_inputs(files, small_cfg)
    assert inputs[1].first_row == inputs[0].num_rows


def test_a_file_written_twice_upstream_is_named(tmp_path, small_log, small_cfg):
    """A partition holding the same file twice (a retried task's output kept beside the first, a backfill
    re-run) was read whole twice with no word: every row weighed double, and counted as two rows in."""
    import shutil
    days = sorted(glob.glob(os.path.join(small_log, "*")))
    log = tmp_path / "log"
    for d in days:
        shutil.copytree(d, log / os.path.basename(d))
    first = sorted(glob.glob(str(log / "*" / "*.parquet")))[0]
    copy = first.replace(".parquet", "-attempt2.parquet")
    shutil.copyfile(first, copy)
    other = pq.read_table(first)  # the same rows, written again: another file (its footer differs)
    shorter = first.replace(".parquet", "-shorter.parquet")
    pq.write_table(other.slice(1).take(np.random.default_rng(0).permutation(other.num_rows - 1)), shorter,
                   row_group_size=100)
    rows = pq.ParquetFile(first).metadata.num_rows
    said = []
    res = run_preprocess(small_cfg, str(log), str(tmp_path / "out"), IN_MEMORY, say=said.append)
    assert [s for s in said if "WARNING" in s] == [  # "-attempt2" sorts before ".parquet", before "-shorter"
        f"preprocess: WARNING: {copy} and {first} hold the same bytes ({rows:,} rows each): a file written 2 times "
        "upstream (a retried task, a re-run backfill beside the first run's output)? Each of its rows is read 2 "
        "times; remove the copies",
        # the job finds the shuffled, re-laid-out copy by its rows (the copy named at launch is not named again)
        f"preprocess: WARNING: {shorter}: each of its {rows - 1:,} rows repeats a row of {copy} in every column "
        "read (in other bytes: another order, layout or writer): were its rows written again as another file "
        "upstream (a re-run's output beside the first run's)? Each is read twice; remove the copies"]
    assert TransformArtifact.read(str(tmp_path / "out" / "transform")).row_counts["repeated_rows"] == 2 * rows - 1
    assert res.rows_in == res.rows_out + res.rows_dead == sum(
        pq.ParquetFile(f).metadata.num_rows for f in glob.glob(str(log / "*" / "*.parquet")))
    cfg = parse_config({**small_config_dict(), "preprocess": {"on_anomaly": "fail"}})
    with pytest.raises(PreprocessError, match="hold the same bytes"):  # at launch, before any Beam stage runs
        run_preprocess(cfg, str(log), str(tmp_path / "out2"), IN_MEMORY, say=lambda _: None)
    assert not os.path.exists(tmp_path / "out2")


def test_rows_repeated_within_files_are_named(tmp_path, small_log, small_cfg):
    """Rows repeated within a file (a join upstream that fanned out on a key that is not unique) were each
    trained on as rows of their own with no word; over preprocess.max_repeated_row_fraction they are named
    with an example, and the check can be turned off."""
    first, second = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[:2]
    t = pq.read_table(first)
    fanned = pa.concat_tables([t, t.slice(10, 120)])  # 120 rows twice: 2 % of the 6,120 rows read
    log = tmp_path / "log"
    _write(str(log / "dt=2026-01-01" / "part-00000.parquet"), fanned)
    _write(str(log / "dt=2026-01-02" / "part-00000.parquet"), pq.read_table(second))
    rows = fanned.num_rows + pq.read_metadata(second).num_rows
    strict = parse_config({**small_config_dict(), "preprocess": {"on_anomaly": "fail"}})
    path = log / "dt=2026-01-01" / "part-00000.parquet"
    with pytest.raises(PreprocessError, match=(
            rf"120 of the {rows:,} rows read \({120 / rows:.1%}\) repeat an earlier row in every column read, over "
            rf"preprocess\.max_repeated_row_fraction \(0\.01\): 120 within {path} \(e\.g\. {path} row "
            rf"{t.num_rows} repeats {path} row 10\): did a join upstream fan out")):
        run_preprocess(strict, str(log), str(tmp_path / "o1"), IN_MEMORY, say=lambda _: None)
    said = []
    off = parse_config({**small_config_dict(), "preprocess": {"on_anomaly": "fail", "max_repeated_row_fraction": 1}})
    run_preprocess(off, str(log), str(tmp_path / "o2"), IN_MEMORY, say=said.append)
    assert TransformArtifact.read(str(tmp_path / "o2" / "transform")).row_counts["repeated_rows"] is None
    run_preprocess(small_cfg, small_log, str(tmp_path / "o3"), IN_MEMORY, say=lambda _: None)
    assert TransformArtifact.read(str(tmp_path / "o3" / "transform")).row_counts["repeated_rows"] == 0
    assert not any(n.startswith("_") for n in os.listdir(tmp_path / "o3"))  # the staged hashes went with the check


def test_a_day_of_far_fewer_or_more_rows_than_the_previous_run_is_named(tmp_path, small_log, small_cfg):
    """A day's partition only partly written upstream (its marker set, files missing), or its rows in two
    files of another layout (which the copied-file check cannot see), trained a model with no word. A day's
    run compares its rows per dt= day with the run it extends (TFX's num_examples drift comparator)."""
    day1, day2 = sorted(glob.glob(os.path.join(small_log, "dt=*")))
    run_preprocess(small_cfg, day1, str(tmp_path / "d1"), IN_MEMORY, say=lambda _: None)
    before = pq.read_table(day1).num_rows
    t = pq.read_table(day2)
    _write(str(tmp_path / "partial" / "dt=2026-01-02" / "part-00000.parquet"), t.slice(0, int(t.num_rows * 0.3)))
    _write(str(tmp_path / "twice" / "dt=2026-01-02" / "part-00000.parquet"), t)
    pq.write_table(t, str(tmp_path / "twice" / "dt=2026-01-02" / "part-00000-rerun.parquet"), row_group_size=1000)
    strict = parse_config({**small_config_dict(), "preprocess": {"on_anomaly": "fail"}})
    short = (rf"this run reads {int(t.num_rows * 0.3):,} rows \(dt=2026-01-02\) against {before:,} rows in the "
             rf"previous run \(2026-01-01\): 0\.30 of them, below preprocess\.min_rows_vs_previous \(0\.5\): is a "
             rf"partition only partly written upstream")
    with pytest.raises(PreprocessError, match=short):  # at launch, before any Beam stage runs
        run_preprocess(strict, str(tmp_path / "partial"), str(tmp_path / "o1"), IN_MEMORY, say=lambda _: None,
                       previous_transform=str(tmp_path / "d1"))
    with pytest.raises(PreprocessError, match=rf"reads {2 * t.num_rows:,} rows .*: 2\.00 times them, above "
                                              rf"preprocess\.max_rows_vs_previous \(1\.75\): are rows in two files"):
        run_preprocess(strict, str(tmp_path / "twice"), str(tmp_path / "o2"), IN_MEMORY, say=lambda _: None,
                       previous_transform=str(tmp_path / "d1"))
    assert not glob.glob(str(tmp_path / "o*"))
    said = []  # warn (the default): named, and the day is published
    run_preprocess(small_cfg, str(tmp_path / "partial"), str(tmp_path / "o3"), IN_MEMORY, say=said.append,
                   previous_transform=str(tmp_path / "d1"))
    assert [s for s in said if "WARNING" in s and "min_rows_vs_previous" in s]
    # per day: a run over both days extended by one day of as many rows as each is not named
    both = tmp_path / "both"
    run_preprocess(small_cfg, small_log, str(both), IN_MEMORY, say=lambda _: None)
    assert TransformArtifact.read(str(both / "transform")).row_counts["partition_days"] == 2
    _write(str(tmp_path / "day3" / "dt=2026-01-03" / "part-00000.parquet"), t)
    said = []
    run_preprocess(small_cfg, str(tmp_path / "day3"), str(tmp_path / "o4"), IN_MEMORY, say=said.append,
                   previous_transform=str(both))
    assert not [s for s in said if "WARNING" in s], said


def test_a_column_logged_as_int64_and_as_uint64_is_int(tmp_path, small_log, small_cfg):
    """Files that type one ID column uint64 and int64 read as the signed kind, as before uint64 had a kind
    (serving then takes int64); with a string file beside them the column's kinds are named."""
    t = pq.read_table(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]).slice(0, 50)
    users = pa.array(range(50), pa.int64())
    paths = [_write(str(tmp_path / f"{kind}.parquet"), t.set_column(t.schema.get_field_index("user_id"), "user_id",
                                                                     users.cast(kind)))
             for kind in (pa.uint64(), pa.int64(), pa.uint64(), pa.string())]
    assert inspect_inputs(paths[:1], small_cfg)[0]["user_id"] == "uint64"
    assert inspect_inputs(paths[:3], small_cfg)[0]["user_id"] == "int"
    with pytest.raises(SchemaError, match=r"string.parquet: column 'user_id' is string but int in .*uint64.parquet"):
        inspect_inputs(paths, small_cfg)


def test_a_tables_hidden_folders_and_markers_are_not_input(tmp_path, small_log, small_cfg):
    """What Spark and Hive leave beside a table's data, an uncommitted task's `_temporary/` output, a
    `.hive-staging_*` folder, `_SUCCESS`, is not read from a directory, local or by URL (a Parquet file
    under `_temporary/` used to be read: its rows twice), nor a marker or checksum from a glob's `*`
    (`dt=*/*` used to read `_SUCCESS` and fail on it as 'not a readable Parquet file')."""
    import shutil
    log = tmp_path / "log"
    shutil.copytree(small_log, log)
    day = sorted(log.glob("dt=*"))[0]
    part = sorted(day.glob("*.parquet"))[0]
    for extra in (log / "_temporary" / "0" / "_temporary" / "attempt_0" / "part-00000.parquet",
                  day / ".hive-staging_hive_2026" / "-ext-10000" / "000000_0.parquet", day / "_SUCCESS",
                  day / ".part-00000.parquet.crc", day / "_common_metadata.parquet"):
        extra.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(part, extra)
    want = list_input_files(small_log)
    files = list_input_files(str(log))
    assert [os.path.relpath(f, log) for f in files] == [os.path.relpath(f, small_log) for f in want]
    assert [f.split(str(log), 1)[1] for f in list_input_files("file://" + str(log))] == \
        [f.split(str(log), 1)[1] for f in files]
    assert run_preprocess(small_cfg, str(log), str(tmp_path / "out"), IN_MEMORY, say=lambda _: None).rows_in == 6000

    # a glob reads every file it matches, the same by URL as on disk: `*` stays within one path part (fnmatch's
    # crossed '/', so file://LOG/*/*.parquet also read _temporary/0/_temporary/attempt_0/part-00000.parquet)
    for pattern in ("*/*.parquet", "dt=*/*.parquet", "**/*.parquet", "dt=2026-01-0[1]/*", "*/.*", "*/_*"):
        local = list_input_files(str(log / pattern))
        assert [f.split(str(log), 1)[1] for f in list_input_files("file://" + str(log / pattern))] == \
            [f.split(str(log), 1)[1] for f in local], pattern
    # but not a writer's marker or checksum, unless the pattern names such files: a partition's `*` is its data
    names = [os.path.basename(f) for f in list_input_files(str(log / "dt=2026-01-0[1]" / "*"))]
    assert names == [os.path.basename(part)] and "_SUCCESS" in os.listdir(day)
    assert {os.path.basename(f) for f in list_input_files(str(log / "*" / "_*"))} == {"_SUCCESS",
                                                                                     "_common_metadata.parquet"}
    assert run_preprocess(small_cfg, str(log / "dt=*" / "*"), str(tmp_path / "glob_out"), IN_MEMORY,
                          say=lambda _: None).rows_in == 6000


# ----------------------------------------------------------------------------- incremental days
def test_incremental_vocabulary_keeps_ids():
    from features.config import VocabSpec
    from pipeline.lifecycle import VocabState, advance_vocabulary
    prev = VocabState(["a", "b"], [5, 3], [0, 0])
    new = advance_vocabulary(prev, [("c", 4), ("b", 1), ("d", 1), ("e", 4)], 1, VocabSpec(min_count=2, max_size=3))
    assert new.values == ["a", "b", "c"] and new.counts == [5, 4, 4]  # room for one: c beats e on the tie by value
    new = advance_vocabulary(VocabState(["a"], [1], [0]), [("z", 9)], 1, VocabSpec(min_count=1))
    assert (new.values, new.counts) == (["a", "z"], [1, 9])


def test_merge_dense_stats_accumulates_moments():
    prev = {"x": {"mean": 1.0, "std": 0.0, "count": 2}, "b": {"boundaries": [1.0, 2.0]}}
    cur = {"x": {"mean": 3.0, "std": 0.0, "count": 2}, "b": {"boundaries": [5.0]}}
    out = merge_dense_stats(prev, cur)
    assert out["x"]["count"] == 4 and out["x"]["mean"] == pytest.approx(2.0) and out["x"]["std"] == pytest.approx(1.0)
    assert out["b"] == {"boundaries": [1.0, 2.0]}


def test_previous_transform_keeps_known_ids(tmp_path, small_log, small_cfg):
    days = sorted(glob.glob(os.path.join(small_log, "dt=*")))
    day1, day2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    run_preprocess(small_cfg, days[0], day1, IN_MEMORY, say=lambda _: None)
    run_preprocess(small_cfg, days[1], day2, IN_MEMORY, say=lambda _: None, previous_transform=day1)
    a1 = TransformArtifact.read(os.path.join(day1, "transform"))
    a2 = TransformArtifact.read(os.path.join(day2, "transform"))
    for owner, values in a1.vocabularies.items():
        assert a2.vocabularies[owner][: len(values)] == values, owner
        assert all(c2 >= c1 for c1, c2 in zip(a1.vocab_counts[owner], a2.vocab_counts[owner]))
    assert any(len(a2.vocabularies[o]) > len(a1.vocabularies[o]) for o in a1.vocabularies)  # new values appended
    assert a2.dense_stats["I1"]["count"] == a1.dense_stats["I1"]["count"] + a2.row_counts["train"]
    assert a2.dense_stats["I3"]["boundaries"] == a1.dense_stats["I3"]["boundaries"]
    assert a2.lineage == {"previous_transform": day1}


def test_previous_transform_must_have_same_features(tmp_path, small_log, small_cfg, preprocessed):
    d = small_config_dict()
    d["features"]["dense"] = d["features"]["dense"][:2]
    with pytest.raises(PreprocessError, match="different 'features' section"):
        run_preprocess(parse_config(d), small_log, str(tmp_path / "o"), IN_MEMORY, say=lambda _: None,
                       previous_transform=preprocessed[0])


def test_string_typed_numbers_are_parsed_per_row(tmp_path, small_log, small_cfg):
    src = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]
    t = pq.read_table(src).slice(0, 300)
    labels = [str(v) for v in t.column("label").to_pylist()]
    labels[5] = "clicked"
    i1 = ["" if v is None else str(v) for v in t.column("I1").to_pylist()]
    i1[9] = "12abc"
    t = t.set_column(t.schema.get_field_index("label"), "label", pa.array(labels))
    t = t.set_column(t.schema.get_field_index("I1"), "I1", pa.array(i1))
    log = _write(str(tmp_path / "log" / "part-0.parquet"), t)
    res = run_preprocess(small_cfg, log, str(tmp_path / "out"), IN_MEMORY, say=lambda _: None)
    assert res.dead_letter == {"label_unparsable": 1, "dense_unparsable": 1}
    assert res.rows_train + res.rows_eval == 298
    art = TransformArtifact.read(str(tmp_path / "out" / "transform"))
    assert art.raw_schema["label"] == "string" and art.raw_schema["I1"] == "string"


def test_iso_8601_string_timestamps_read_as_epoch_seconds(tmp_path, small_log, small_cfg):
    """A log whose timestamps are ISO 8601 strings (as JSON event logs and CSV exports carry them: 'Z', an
    offset, a space instead of 'T', no zone meaning UTC) preprocesses to the same examples, byte for
    byte, as its twin with int64 epoch seconds (every row used to be dead-lettered as
    timestamp_unparsable); a string that is no date-time is dead-lettered, naming the column."""
    src = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]
    plain = pq.read_table(src).slice(0, 300)
    col = plain.schema.get_field_index("ts")
    forms = ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S+00:00", "%Y-%m-%dT%H:%M:%S.000")
    seconds = plain.column("ts").to_pylist()
    iso = [datetime.datetime.fromtimestamp(v, datetime.timezone.utc).strftime(forms[i % len(forms)])
           for i, v in enumerate(seconds)]
    iso[5], seconds[5] = "2026-13-01T00:00:00", None
    logs = {"plain": plain.set_column(col, "ts", pa.array(seconds, pa.int64())),
            "iso": plain.set_column(col, "ts", pa.array(iso))}
    for name, table in logs.items():
        res = run_preprocess(small_cfg, _write(str(tmp_path / name / "part-0.parquet"), table),
                             str(tmp_path / f"{name}_out"), IN_MEMORY, say=lambda _: None)
        assert res.dead_letter == {"null_timestamp" if name == "plain" else "timestamp_unparsable": 1}, name
    dead = pq.read_table(glob.glob(str(tmp_path / "iso_out" / "dead_letter" / "*.parquet"))[0])
    assert dead.select(["row", "reason", "field"]).to_pylist() == [
        {"row": 5, "reason": "timestamp_unparsable", "field": "ts"}]
    for split in ("train", "eval"):
        assert _shard_bytes(tmp_path / "iso_out", split) == _shard_bytes(tmp_path / "plain_out", split), split


def test_categorical_columns_and_arrow_timestamps_read_as_their_plain_values(tmp_path, small_log, small_cfg):
    """A log written from pandas categoricals (dictionary-encoded strings, lists of them) with an Arrow
    timestamp (milliseconds, UTC) instead of epoch seconds preprocesses to the same rows, vocabularies
    and split as the plain log; a null timestamp is dead-lettered as with int64."""
    src = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]
    plain = pq.read_table(src).slice(0, 300)
    t = plain
    for name in ("user_id", "item_id", "C1"):
        t = t.set_column(t.schema.get_field_index(name), name, pc.dictionary_encode(t.column(name)))
    hist = pa.array(t.column("hist_items").to_pylist(), pa.list_(pa.dictionary(pa.int32(), pa.string())))
    t = t.set_column(t.schema.get_field_index("hist_items"), "hist_items", hist)
    millis = [v * 1000 for v in t.column("ts").to_pylist()]
    millis[7] = None
    t = t.set_column(t.schema.get_field_index("ts"), "ts",
                     pa.array(millis, pa.int64()).cast(pa.timestamp("ms", tz="UTC")))
    ts = plain.column("ts").to_pylist()
    ts[7] = None
    plain = plain.set_column(plain.schema.get_field_index("ts"), "ts", pa.array(ts, pa.int64()))
    results = {}
    for name, table in (("plain", plain), ("typed", t)):
        res = run_preprocess(small_cfg, _write(str(tmp_path / name / "part-0.parquet"), table),
                             str(tmp_path / f"{name}_out"), IN_MEMORY, say=lambda _: None)
        assert res.dead_letter == {"null_timestamp": 1}
        results[name] = (res.rows_train, res.rows_eval, TransformArtifact.read(str(tmp_path / f"{name}_out" /
                                                                                   "transform")))
    assert results["typed"][:2] == results["plain"][:2]
    typed, ours = results["typed"][2], results["plain"][2]
    assert typed.vocabularies == ours.vocabularies
    assert typed.raw_schema["ts"] == "float" and typed.raw_schema["user_id"] == "string"
    assert typed.raw_schema["hist_items"] == "list<string>"
    for split in ("train", "eval"):  # the same examples, byte for byte
        assert _shard_bytes(tmp_path / "plain_out", split) == _shard_bytes(tmp_path / "typed_out", split), split


def test_nanosecond_and_int96_timestamps_read_as_epoch_seconds(tmp_path, small_log, small_cfg):
    """pandas writes datetimes as Parquet TIMESTAMP(NANOS), and Hive, Impala and older Spark as INT96,
    which Arrow reads in nanoseconds: both preprocess to the same examples, byte for byte, as the log
    with int64 epoch seconds (nanoseconds since 1970 used to fail a safe cast to float64, 'Integer
    value ... not in range', so such a log could not be read at all). Hive's 9999-12-31 sentinel in an
    INT96 column reads as 9999-12-31 (Arrow's nanoseconds wrap it to a date in 1816 silently), so its
    row is split as a year-9999 timestamp in int64 seconds is."""
    src = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]
    plain = pq.read_table(src).slice(0, 300)
    col = plain.schema.get_field_index("ts")
    seconds = plain.column("ts").to_pylist()
    sentinel = seconds[:7] + [253_402_214_400] + seconds[8:]  # 9999-12-31T00:00:00Z
    logs = {
        "plain": plain,
        "nanos": plain.set_column(col, "ts", pa.array([v * 10 ** 9 for v in seconds], pa.int64())
                                  .cast(pa.timestamp("ns"))),
        "plain_9999": plain.set_column(col, "ts", pa.array(sentinel, pa.int64())),
        "int96_9999": plain.set_column(col, "ts", pa.array([v * 10 ** 6 for v in sentinel], pa.int64())
                                       .cast(pa.timestamp("us"))),
    }
    for name, table in logs.items():
        path = str(tmp_path / name / "part-0.parquet")
        os.makedirs(os.path.dirname(path))
        pq.write_table(table, path, use_deprecated_int96_timestamps=name.startswith("int96"))
        physical = pq.ParquetFile(path).schema.column(col).physical_type
        assert physical == ("INT96" if name.startswith("int96") else "INT64"), (name, physical)
        res = run_preprocess(small_cfg, path, str(tmp_path / f"{name}_out"), IN_MEMORY, say=lambda _: None)
        assert res.rows_train + res.rows_eval == 300 and not res.dead_letter, name
    for typed, twin in (("nanos", "plain"), ("int96_9999", "plain_9999")):
        for split in ("train", "eval"):
            assert _shard_bytes(tmp_path / f"{typed}_out", split) == _shard_bytes(tmp_path / f"{twin}_out", split), \
                (typed, split)
    # the sentinel moved row 7 from train to eval: the comparison above can tell a wrapped date apart
    assert _shard_bytes(tmp_path / "plain_out", "eval") != _shard_bytes(tmp_path / "plain_9999_out", "eval")


def test_fixed_size_list_columns_read_as_lists(tmp_path, small_log, small_cfg):
    """A list column every row of which has the same length may be written as a fixed-size list (pyarrow
    does so from numpy rows): it preprocesses to the same examples, byte for byte, as the same lists
    written as a plain list column (it was 'unsupported type fixed_size_list')."""
    src = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]
    plain = pq.read_table(src).slice(0, 300)
    col = plain.schema.get_field_index("hist_items")
    two = [((h or []) + [None, None])[:2] for h in plain.column("hist_items").to_pylist()]  # null items too
    logs = {"plain": plain.set_column(col, "hist_items", pa.array(two, pa.list_(pa.string()))),
            "fixed": plain.set_column(col, "hist_items", pa.array(two, pa.list_(pa.string(), 2)))}
    for name, table in logs.items():
        res = run_preprocess(small_cfg, _write(str(tmp_path / name / "part-0.parquet"), table),
                             str(tmp_path / f"{name}_out"), IN_MEMORY, say=lambda _: None)
        assert res.rows_train + res.rows_eval == 300, name
    assert pq.read_schema(str(tmp_path / "fixed" / "part-0.parquet")).field("hist_items").type.list_size == 2
    assert TransformArtifact.read(str(tmp_path / "fixed_out" / "transform")).raw_schema["hist_items"] == "list<string>"
    for split in ("train", "eval"):
        assert _shard_bytes(tmp_path / "fixed_out", split) == _shard_bytes(tmp_path / "plain_out", split), split


def test_binary_and_view_columns_read_as_strings_and_non_utf8_rows_are_dead_lettered(tmp_path, small_log, small_cfg):
    """Impala, Hive and older Spark SQL write strings as Parquet BYTE_ARRAY without the UTF8 annotation,
    which Arrow reads as binary, and pyarrow reads a string_view column back as string_view (both were
    'unsupported type'): binary, large binary, list-of-binary, string_view and binary_view columns
    preprocess to the same examples, byte for byte, as their string twins, and a value that is not
    UTF-8 is dead-lettered naming its row and column."""
    src = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]
    plain = pq.read_table(src).slice(0, 300)
    t = plain
    for name, tp in (("item_id", pa.binary()), ("C1", pa.large_binary()), ("hist_items", pa.list_(pa.binary())),
                     ("C2", pa.string_view()), ("C3", pa.binary_view())):
        t = t.set_column(t.schema.get_field_index(name), name, t.column(name).cast(tp))
    for name, table in (("plain", plain), ("binary", t)):
        run_preprocess(small_cfg, _write(str(tmp_path / name / "part-0.parquet"), table), str(tmp_path / f"{name}_out"),
                       IN_MEMORY, say=lambda _: None)
    art = TransformArtifact.read(str(tmp_path / "binary_out" / "transform"))
    assert pq.read_schema(str(tmp_path / "binary" / "part-0.parquet")).field("C2").type == pa.string_view()
    assert art.raw_schema["item_id"] == art.raw_schema["C2"] == "string"
    assert art.raw_schema["hist_items"] == "list<string>"
    assert art.vocabularies == TransformArtifact.read(str(tmp_path / "plain_out" / "transform")).vocabularies
    for split in ("train", "eval"):
        assert _shard_bytes(tmp_path / "plain_out", split) == _shard_bytes(tmp_path / "binary_out", split), split

    items = t.column("item_id").to_pylist()
    items[5] = b"\xff\xfe item"
    bad = t.set_column(t.schema.get_field_index("item_id"), "item_id", pa.array(items, pa.binary()))
    res = run_preprocess(small_cfg, _write(str(tmp_path / "bad" / "part-0.parquet"), bad), str(tmp_path / "bad_out"),
                         IN_MEMORY, say=lambda _: None)
    assert res.dead_letter == {"invalid_utf8": 1} and res.rows_in == res.rows_out + 1
    dead = pq.read_table(PreprocessedData(str(tmp_path / "bad_out")).dead_letter_files()).to_pylist()
    assert [(d["row"], d["reason"], d["field"]) for d in dead] == [(5, "invalid_utf8", "item_id")]


def _shard_bytes(out: Path, split: str) -> list[bytes]:
    """The bytes of each shard file of one split of a preprocess output, in name order (none is an error)."""
    files = sorted(glob.glob(str(out / split / "*")))
    assert files, f"no {split} shards in {out}"
    return [Path(f).read_bytes() for f in files]


def test_columns_of_nulls_and_decimals_read_as_missing_values_and_floats(tmp_path, small_log, small_cfg):
    """A day's file where a column holds only nulls (Arrow type null: pandas writes an all-None column
    so) reads as missing values of the kind the other files give it, and a decimal dense column as
    floats: the same examples, byte for byte, as the typed twin. A column null in every file is typed by
    the previous transform, or else an error naming it."""
    src = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]
    t = pq.read_table(src).slice(0, 300)
    i2 = t.column("I2").to_pylist()
    typed_second = t.slice(150)
    untyped_second = typed_second
    for name in ("I1", "C1", "hist_items"):
        i = t.schema.get_field_index(name)
        typed_second = typed_second.set_column(i, name, pa.nulls(150, t.schema.field(i).type))
        untyped_second = untyped_second.set_column(i, name, pa.nulls(150))
    twins = {"typed": [t.slice(0, 150), typed_second], "untyped": [t.slice(0, 150), untyped_second]}
    dec = pa.array([None if v is None else decimal.Decimal(v) for v in i2], pa.decimal128(14, 2))
    twins["untyped"] = [x.set_column(x.schema.get_field_index("I2"), "I2", dec.slice(k * 150, 150))
                        for k, x in enumerate(twins["untyped"])]
    twins["typed"] = [x.set_column(x.schema.get_field_index("I2"), "I2", pa.array(i2[k * 150:(k + 1) * 150],
                                                                                   pa.float64()))
                      for k, x in enumerate(twins["typed"])]
    for name, tables in twins.items():
        for k, table in enumerate(tables):
            _write(str(tmp_path / name / f"part-{k}.parquet"), table)
        res = run_preprocess(small_cfg, str(tmp_path / name), str(tmp_path / f"{name}_out"), IN_MEMORY,
                             say=lambda _: None)
        assert res.rows_in == 300 and not res.dead_letter
    arts = [TransformArtifact.read(str(tmp_path / f"{n}_out" / "transform")) for n in ("typed", "untyped")]
    assert arts[0].raw_schema == arts[1].raw_schema and arts[0].vocabularies == arts[1].vocabularies
    for split in ("train", "eval"):
        assert _shard_bytes(tmp_path / "typed_out", split) == _shard_bytes(tmp_path / "untyped_out", split), split
    only_nulls = str(tmp_path / "only_nulls" / "part-0.parquet")
    _write(only_nulls, twins["untyped"][1])
    with pytest.raises(SchemaError, match="column\\(s\\) 'hist_items', 'C1', 'I1' hold only nulls"):
        run_preprocess(small_cfg, only_nulls, str(tmp_path / "nulls_out"), IN_MEMORY, say=lambda _: None)
    res = run_preprocess(small_cfg, only_nulls, str(tmp_path / "nulls_out"), IN_MEMORY, say=lambda _: None,
                         previous_transform=str(tmp_path / "typed_out"))
    assert res.rows_in == 150 and TransformArtifact.read(str(tmp_path / "nulls_out" / "transform")).raw_schema == \
        arts[0].raw_schema


def test_url_input_through_pyarrow_filesystems(tmp_path, small_log, small_cfg):
    url = "file://" + os.path.abspath(small_log)
    files = list_input_files(url)
    assert len(files) == 2 and all(f.startswith("file://") for f in files)
    res = run_preprocess(small_cfg, url, str(tmp_path / "out"), IN_MEMORY, say=lambda _: None)
    assert res.rows_in == 6000 and res.rows_dead == 0


@pytest.mark.skipif(not (SHARED_DATA / "criteo_10k.csv").is_file(), reason="../shared/data Criteo sample absent")
def test_real_criteo_sample_end_to_end(tmp_path):
    """`recpipe criteo-to-parquet` + `recpipe preprocess` on the real 10k-row Criteo log."""
    import subprocess
    import sys
    run = lambda *a: subprocess.run([sys.executable, "-m", "recpipe.cli", *a], capture_output=True, text=True,
                                    check=True, timeout=600).stdout  # noqa: E731
    run("criteo-to-parquet", "--csv", str(SHARED_DATA / "criteo_10k.csv"), "--out", str(tmp_path / "log"))
    out = run("preprocess", "--config", str(CONFIGS / "criteo.yaml"), "--input", str(tmp_path / "log"),
              "--output", str(tmp_path / "pre"))
    assert "rows in = 9999 = rows out 9999 (train 8100, validation 900, eval 999) + rows dead-lettered 0" in out
    art = TransformArtifact.read(str(tmp_path / "pre" / "transform"))
    assert art.split["kind"] == "row_order"
    # Criteo's C20 has 3 values plus empties; min_count 3 keeps all of them, "" (missing) included.
    assert set(art.vocabularies["C20"]) <= {"", *pq.read_table(str(tmp_path / "log" / "criteo_10k.parquet"),
                                                                 columns=["C20"]).column("C20").drop_null().to_pylist()}
    assert 0 < art.dense_stats["I1"]["count"] == 8100  # train rows only


def test_a_new_log_schema_needs_only_a_config(tmp_path):
    rng = np.random.default_rng(0)
    n = 2000
    table = pa.table({
        "clicked": pa.array(rng.integers(0, 2, n).astype(bool)),
        "event_time": pa.array([str(1_700_000_000 + i) for i in range(n)]),
        "shop": pa.array(rng.integers(0, 40, n)),
        "query_terms": pa.array([";".join(f"t{x}" for x in rng.integers(0, 30, rng.integers(0, 4))) for _ in range(n)]),
        "price": pa.array([f"{x:.2f}" for x in rng.random(n) * 100]),
        "rating": pa.array(rng.random(n) * 5),
    })
    _write(str(tmp_path / "log" / "day1.parquet"), table.slice(0, 1000))
    _write(str(tmp_path / "log" / "day2.parquet"), table.slice(1000))
    cfg = parse_config({
        "name": "shop_ctr", "input": {"timestamp": "event_time"}, "split": {"eval_fraction": 0.25},
        "label": {"column": "clicked"},
        "features": {
            "sparse": [{"name": "shop", "column": "shop", "vocab": {"min_count": 1, "oov_buckets": 1}},
                       {"name": "terms", "column": "query_terms", "multivalent": True, "separator": ";",
                        "vocab": {"min_count": 1, "max_size": 10, "oov_buckets": 2}, "combiner": "sum"}],
            "dense": [{"name": "price", "column": "price", "transform": "log_zscore"},
                      {"name": "rating", "column": "rating", "transform": "bucketize", "num_buckets": 4}]},
        "train": {"batch_size": 64, "steps": 5}})
    res = run_preprocess(cfg, str(tmp_path / "log"), str(tmp_path / "out"), IN_MEMORY, say=lambda _: None)
    assert (res.rows_in, res.rows_train, res.rows_eval, res.rows_dead) == (2000, 1500, 500, 0)
    art = TransformArtifact.read(str(tmp_path / "out" / "transform"))
    assert art.raw_schema == {"clicked": "int", "event_time": "string", "shop": "int", "query_terms": "string",
                              "price": "string", "rating": "float"}
    assert len(art.vocabularies["terms"]) == 10 and len(art.dense_stats["rating"]["boundaries"]) == 3
    batch = next(iter(tf.data.TFRecordDataset(glob.glob(str(tmp_path / "out" / "train" / "*.tfrecord"))).map(parse_record(cfg))))
    assert isinstance(batch["terms"], tf.RaggedTensor) and int(tf.reduce_max(batch["terms"].flat_values)) < 12


def test_validation_split_is_carved_from_train_by_time_and_unseen_by_the_analysis(tmp_path):
    """split.validation_fraction: the last share of the pre-eval rows become the validation split; the
    vocabularies come from the train rows alone, so validation and eval values are new to them alike."""
    n = 2000
    table = pa.table({"clicked": pa.array(np.arange(n) % 3 == 0), "ts": pa.array(np.arange(n) + 1_700_000_000),
                      "shop": pa.array(np.arange(n) // 100)})
    _write(str(tmp_path / "log" / "day1.parquet"), table)
    cfg = parse_config({
        "name": "v", "input": {"timestamp": "ts"}, "split": {"eval_fraction": 0.25, "validation_fraction": 0.2},
        "label": {"column": "clicked"},
        "features": {"sparse": [{"name": "shop", "column": "shop", "vocab": {"min_count": 1, "oov_buckets": 1}}]}})
    res = run_preprocess(cfg, str(tmp_path / "log"), str(tmp_path / "out"), IN_MEMORY, say=lambda _: None)
    assert (res.rows_in, res.rows_train, res.rows_validation, res.rows_eval) == (2000, 1200, 300, 500)
    art = TransformArtifact.read(str(tmp_path / "out" / "transform"))
    assert art.row_counts["validation"] == 300 and art.split["validation_fraction"] == 0.2
    assert sorted(art.vocabularies["shop"]) == [str(s) for s in sorted(range(12), key=str)]  # rows 0..1199 only
    ids = {split: np.concatenate([b["shop"].numpy() for b in tf.data.TFRecordDataset(
        glob.glob(str(tmp_path / "out" / split / "*.tfrecord"))).map(parse_record(cfg))]) for split in SPLITS}
    assert {k: len(v) for k, v in ids.items()} == {"train": 1200, "validation": 300, "eval": 500}
    assert ids["train"].max() < 12 and (ids["validation"] == 12).all() and (ids["eval"] == 12).all()  # OOV


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


def test_features_the_train_split_leaves_empty_or_constant_are_named(tmp_path, small_log, small_cfg):
    """A column null or empty in every train row (a broken upstream join) or of one value in all of them
    trains a feature with nothing to learn, and one the eval rows lack is judged without: preprocess names
    each one, and its rows with a value per split are in the artifact's row counts; the features the log
    fills are not named."""
    src = sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0]
    t = pq.read_table(src).slice(0, 1000)
    ts = t.column("ts").to_numpy()
    late = ts > np.quantile(ts, 0.8)  # about the eval split (the last 20 % by time)
    i1 = [v if is_late else None for v, is_late in zip(t.column("I1").to_pylist(), late)]
    for name, values in (("I1", pa.array(i1, pa.int64())), ("I2", pa.array([7.0] * 1000)),
                         ("hist_items", pa.array([None if i % 2 else [] for i in range(1000)], pa.list_(pa.string()))),
                         ("C2", pa.array([""] * 1000)), ("C3", pa.array([None if x else "c" for x in late]))):
        t = t.set_column(t.schema.get_field_index(name), name, values)
    _write(str(tmp_path / "log" / "part-0.parquet"), t)
    said = []
    res = run_preprocess(small_cfg, str(tmp_path / "log"), str(tmp_path / "out"), IN_MEMORY, say=said.append)
    warnings = [s for s in said if "WARNING" in s]
    assert len(warnings) == 5, warnings
    named = {s.split("'")[1]: s for s in warnings}
    assert set(named) == {"I1", "I2", "hist", "C2", "C3"}
    assert f"no value in any of the {res.rows_train:,} train rows" in named["I1"]
    assert f"yet {res.with_value['eval']['I1']:,} of the {res.rows_eval:,} eval rows have one" in named["I1"]
    assert "one value in every train row (7, missing values filled with 1)" in named["I2"]
    assert "(column 'hist_items') has no value" in named["hist"] and "eval" not in named["hist"]
    assert "(column 'C2') has no value" in named["C2"]
    assert f"but in none of the {res.rows_eval:,} eval rows" in named["C3"]
    counts = TransformArtifact.read(str(tmp_path / "out" / "transform")).row_counts["with_value"]
    assert counts == res.with_value and counts["train"]["I1"] == 0 < counts["eval"]["I1"]
    assert counts["train"]["user_id"] == res.rows_train and counts["train"]["I3"] > 0
    strict = small_config_dict()
    strict["preprocess"] = {"on_anomaly": "fail"}
    with pytest.raises(PreprocessError, match="feature 'I1' .* has no value.*preprocess.on_anomaly is fail"):
        run_preprocess(parse_config(strict), str(tmp_path / "log"), str(tmp_path / "strict"), IN_MEMORY,
                       say=lambda _: None)
    assert not os.path.exists(tmp_path / "strict")  # nothing published


def _with_columns(t: pa.Table, **columns) -> pa.Table:
    for name, values in columns.items():
        t = t.set_column(t.schema.get_field_index(name), name, values)
    return t


def test_features_whose_splits_or_days_disagree_are_named(tmp_path, small_log, small_cfg):
    """A column filled in most train rows but few eval rows (a join that broke part way through the log), or
    whose values change unit (x1000), has values everywhere and no NaN: preprocess names each, between the
    splits and between a day's run and the previous day's, with the figures; the thresholds are the
    config's, and neither the plain synthetic log nor a few rows of sampling noise is named."""
    days = sorted(glob.glob(os.path.join(small_log, "dt=*")))
    t = pq.read_table(days[0])
    late = t.column("ts").to_numpy() > np.quantile(t.column("ts").to_numpy(), 0.8)  # about the eval split
    keep = np.random.default_rng(0).random(t.num_rows) < 0.1
    i1, i2, c1 = (t.column(c).to_pylist() for c in ("I1", "I2", "C1"))
    hostile = _with_columns(
        t, I1=pa.array([v if not x or k else None for v, x, k in zip(i1, late, keep)], pa.int64()),
        C1=pa.array([v if not x or k else None for v, x, k in zip(c1, late, keep)], pa.string()),
        I2=pa.array([v if v is None or not x else v * 1000 for v, x in zip(i2, late)], pa.int64()))
    _write(str(tmp_path / "split" / "dt=2026-01-01" / "p.parquet"), hostile)
    said = []
    res = run_preprocess(small_cfg, str(tmp_path / "split"), str(tmp_path / "o1"), IN_MEMORY, say=said.append)
    warnings = [s for s in said if "WARNING" in s]
    assert len(warnings) == 3, warnings
    named = {s.split("'")[1]: s for s in warnings}
    counts = res.split_counts()
    for name in ("I1", "C1"):
        assert (f"has a value in {counts.share('eval', name):.1%} of the {res.rows_eval:,} eval rows against "
                f"{counts.share('train', name):.1%} of the {res.rows_train:,} train rows" in named[name])
        assert "preprocess.max_presence_change (0.25)" in named[name]
    assert counts.mean("eval", "I2") > 500 * counts.mean("train", "I2")  # missing values left out of the means
    assert "its values in the" in named["I2"] and "has its unit or scale changed upstream?" in named["I2"]
    shift = float(named["I2"].split("standard deviations")[0].rsplit(",", 1)[1])
    assert shift > 100
    art = TransformArtifact.read(str(tmp_path / "o1" / "transform"))
    assert art.row_counts["dense_sums"] == res.dense_sums and set(res.dense_sums["eval"]) == {"I1", "I2"}
    loose = small_config_dict()
    loose["preprocess"] = {"max_presence_change": 1, "max_mean_shift": shift + 1}
    said = []
    run_preprocess(parse_config(loose), str(tmp_path / "split"), str(tmp_path / "o2"), IN_MEMORY, say=said.append)
    assert not [s for s in said if "WARNING" in s]
    # per feature (TFX's per-feature thresholds): I1's own limit silences it only; C1's, tighter than its move,
    # names C1 with its own key, and I2 keeps the global one; with C1's and I2's own limits raised, none is named
    own = small_config_dict()
    own["preprocess"] = {"features": [{"feature": "C1", "max_presence_change": 0.5},
                                      {"feature": "I1", "max_presence_change": 0.9}]}
    said = []
    run_preprocess(parse_config(own), str(tmp_path / "split"), str(tmp_path / "o3"), IN_MEMORY, say=said.append)
    named = {s.split("'")[1]: s for s in said if "WARNING" in s}
    assert set(named) == {"C1", "I2"} and "beyond preprocess.features[0].max_presence_change (0.5)" in named["C1"]
    assert "beyond preprocess.max_mean_shift (1)" in named["I2"]
    own["preprocess"]["features"][0]["max_presence_change"] = 1
    own["preprocess"]["features"].append({"feature": "I2", "max_mean_shift": shift + 1, "leak_check": False})
    said = []
    run_preprocess(parse_config(own), str(tmp_path / "split"), str(tmp_path / "o4"), IN_MEMORY, say=said.append)
    assert not [s for s in said if "WARNING" in s]

    # a day's run against the previous day's: the second day's I1 mostly missing and I2 in other units
    said = []
    run_preprocess(small_cfg, days[0], str(tmp_path / "d1"), IN_MEMORY, say=said.append)
    day2 = pq.read_table(days[1])
    keep = np.random.default_rng(1).random(day2.num_rows) < 0.3
    day2 = _with_columns(
        day2, I1=pa.array([v if k else None for v, k in zip(day2.column("I1").to_pylist(), keep)], pa.int64()),
        I2=pa.array([None if v is None else v * 1000 for v in day2.column("I2").to_pylist()], pa.int64()))
    _write(str(tmp_path / "days" / os.path.basename(days[1]) / "p.parquet"), day2)
    run_preprocess(small_cfg, str(tmp_path / "days"), str(tmp_path / "d2"), IN_MEMORY, say=said.append,
                   previous_transform=str(tmp_path / "d1"))
    warnings = [s for s in said if "WARNING" in s]
    named = {s.split("'")[1]: s for s in warnings}
    assert set(named) == {"I1", "I2"}, warnings
    assert "of this run's" in named["I1"] and "of the previous run's (2026-01-01)" in named["I1"]
    assert "its values in this run's" in named["I2"] and "from the previous run's (2026-01-01)" in named["I2"]


def test_files_whose_timestamps_are_in_other_units_are_named(tmp_path, small_log, small_cfg):
    """A day's file whose integer timestamps are milliseconds reads as the year 57,974: its rows went to
    whichever split that says, with no word. Preprocess names the file, its range and the unit that fits."""
    from pipeline.anomalies import timestamp_warnings
    days = sorted(glob.glob(os.path.join(small_log, "dt=*")))
    t = pq.read_table(days[1])
    _write(str(tmp_path / "log" / os.path.basename(days[0]) / "p.parquet"), pq.read_table(days[0]))
    ms = str(tmp_path / "log" / os.path.basename(days[1]) / "p.parquet")
    _write(ms, _with_columns(t, ts=pa.array(t.column("ts").to_numpy() * 1000)))
    said = []
    res = run_preprocess(small_cfg, str(tmp_path / "log"), str(tmp_path / "out"), IN_MEMORY, say=said.append)
    warnings = [s for s in said if "WARNING" in s]
    assert len(warnings) == 1 and warnings[0].startswith(f"preprocess: WARNING: {ms}: its timestamps (column 'ts') "
                                                         f"run from the year 57,9"), warnings
    assert "more than a year from its partition dt=2026-01-02: are they milliseconds read as seconds? (÷ 1000 they " \
           "run from 2026-01-02 to 2026-01-02)" in warnings[0]
    assert sorted(res.time_ranges) == [os.path.abspath(p) for p in sorted(glob.glob(str(tmp_path / "log" / "*" / "*")))]
    # no partition: only past 2200 (a placeholder such as Hive's 9999-12-31, or a unit)
    year = 365.2425 * 86_400
    assert timestamp_warnings({"/a.parquet": (5.0, 9.0), "/b.parquet": (56 * year, 57 * year)}, "ts") == []
    [sentinel] = timestamp_warnings({"/c.parquet": (56 * year, 253402214400.0)}, "ts")
    assert "to 9999-12-31 00:00:00, after 2200 (no dt= partition): a placeholder value" in sentinel
    [micro] = timestamp_warnings({"/d.parquet": (56 * year * 1e6, 57 * year * 1e6)}, "ts")
    assert "are they microseconds read as seconds?" in micro


def test_a_split_of_one_label_is_named(tmp_path, small_log, small_cfg):
    """Eval rows all labelled 0 (a label column broken upstream) gave `recpipe evaluate` an AUC of NaN, and a
    validation split so would leave early stopping choosing nothing, with no word from preprocess."""
    t = pq.read_table(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0])
    late = t.column("ts").to_numpy() > np.quantile(t.column("ts").to_numpy(), 0.8)
    _write(str(tmp_path / "log" / "p.parquet"), _with_columns(
        t, label=pa.array([0 if x else v for v, x in zip(t.column("label").to_pylist(), late)], pa.int64())))
    said = []
    res = run_preprocess(small_cfg, str(tmp_path / "log"), str(tmp_path / "out"), IN_MEMORY, say=said.append)
    assert [s for s in said if "WARNING" in s] == [
        f"preprocess: WARNING: every one of the {res.rows_eval:,} eval rows has label 0 (column 'label'): AUC is "
        f"undefined on it, so the model cannot be judged (recpipe evaluate reports it as null)"]
    assert res.positives["eval"] == 0 < res.positives["train"] < res.rows_train
    assert TransformArtifact.read(str(tmp_path / "out" / "transform")).row_counts["positives"] == res.positives


def test_features_that_give_the_label_away_are_named(tmp_path, small_log, small_cfg):
    """A column recorded after the click (seconds to the click, null without one) and a flag joined in
    from the outcome table: each orders the rows by label, the model's eval AUC would be near 1.0 and
    serving would not know them. Preprocess published such a log with no word."""
    t = pq.read_table(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0])
    label = np.array(t.column("label").to_pylist())
    rng = np.random.default_rng(0)
    _write(str(tmp_path / "log" / "p.parquet"), _with_columns(
        t, I1=pa.array(np.where(label == 1, rng.exponential(30, len(label)), np.nan), from_pandas=True),
        C1=pa.array(np.where(label == 1, "converted", "none").tolist())))
    said = []
    res = run_preprocess(small_cfg, str(tmp_path / "log"), str(tmp_path / "out"), IN_MEMORY, say=said.append)
    n = min(res.rows_eval, 1000)
    why = ("is it recorded after the click, or derived from the label? A model trained on it scores near 1.0 in "
           "evaluation and fails in serving, where the value is not known yet")
    missing = 1 - float(np.mean(pq.read_table(PreprocessedData(str(tmp_path / "out")).eval_sample_parquet)
                                .column("label").to_numpy()))
    assert [s for s in said if "label away" in s or "by their label" in s] == [
        f"preprocess: WARNING: dense feature 'I1' (column 'I1') alone orders the {n:,} eval-sample rows by their "
        f"label (column 'label') with AUC 1.000, {missing:.0%} of them without a value (scored lowest): {why}",
        f"preprocess: WARNING: feature 'C1' (column 'C1'): its 2 values alone sort the {n:,} eval-sample rows by "
        f"their label (column 'label'), AUC 1.000 from each value's click rate: {why}"]
    known = parse_config({**small_config_dict(), "preprocess": {"features": [{"feature": "C1", "leak_check": False}]}})
    said = []
    run_preprocess(known, str(tmp_path / "log"), str(tmp_path / "out1"), IN_MEMORY, say=said.append)
    assert [s.split("'")[1] for s in said if "by their label" in s] == ["I1"]  # C1's own leak_check is off
    strict = parse_config({**small_config_dict(), "preprocess": {"on_anomaly": "fail"}})
    with pytest.raises(PreprocessError, match="dense feature 'I1' .* alone orders"):
        run_preprocess(strict, str(tmp_path / "log"), str(tmp_path / "out2"), IN_MEMORY, say=lambda _: None)


def test_an_id_whose_values_never_recur_is_named(tmp_path, small_log):
    """A row or event ID (or a timestamp) configured as a sparse feature: every value is new, so the model
    learns nothing from it, serving sees only OOV values, and with min_count 1 its table grows by a row per
    example; it was published with no word."""
    t = pq.read_table(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))[0])
    _write(str(tmp_path / "log" / "p.parquet"), t.append_column("event_id", pa.array(
        [f"ev-{i:08d}" for i in range(t.num_rows)])))
    d = small_config_dict()
    d["features"]["sparse"].append({"name": "event", "column": "event_id", "vocab": {"min_count": 1},
                                    "embedding_dim": 8})
    said = []
    res = run_preprocess(parse_config(d), str(tmp_path / "log"), str(tmp_path / "out"), IN_MEMORY, say=said.append)
    assert [s for s in said if "WARNING" in s] == [
        f"preprocess: WARNING: feature 'event' (column 'event_id'): only 0.0% of its {res.rows_train:,} train rows "
        f"with a value hold one that recurs in train and is kept (vocab.min_count 1; {res.rows_train:,} values "
        f"kept): is it a row, request or event ID, or a timestamp? The model cannot learn from values that never "
        f"come back, and at serving they are all new (OOV)"]


def test_a_vocabulary_whose_max_size_cuts_most_rows_to_oov_is_named(tmp_path, small_log, preprocessed):
    """max_size far below a feature's values (TFT's top_k): values min_count keeps are cut, and most train
    rows share the OOV buckets, where the model cannot tell them apart; it was published with no word."""
    d = small_config_dict()
    d["features"]["sparse"][3]["vocab"] = {"min_count": 2, "max_size": 20, "oov_buckets": 1}  # C1
    said = []
    res = run_preprocess(parse_config(d), small_log, str(tmp_path / "out"), IN_MEMORY, say=said.append)
    art = PreprocessedData(str(tmp_path / "out")).transform()
    values, counts = art.vocabularies["C1"], art.vocab_counts["C1"]
    with_value = res.with_value["train"]["C1"]
    oov = res.rows_train - sum(counts) - (0 if "" in values else res.rows_train - with_value)
    assert len(values) == 20 and oov / with_value > 0.5
    assert [s for s in said if "WARNING" in s] == [
        f"preprocess: WARNING: feature 'C1' (column 'C1'): vocab.max_size (20) is full and its least frequent value "
        f"kept is in {min(counts)} train rows, so values in up to {min(counts)} rows, over vocab.min_count (2), were "
        f"cut: {oov / with_value:.1%} of the {with_value:,} train rows with a value map to its 1 OOV bucket(s), "
        f"where the model cannot tell them apart; raise max_size, or hash the feature (hash_buckets)"]
    full = PreprocessedData(preprocessed[0]).transform()  # no max_size: min_count alone sends rare values to OOV
    assert len(full.vocabularies["C1"]) > 20


def test_a_few_rows_of_sampling_noise_are_not_named(preprocessed):
    """Shares and means that move only as far as a split's few rows allow by chance are not anomalies."""
    from pipeline.anomalies import SplitCounts, feature_warnings
    from features.canonical import DENSE_SUM_SCALE
    data, res = preprocessed
    art, cfg = PreprocessedData(data).transform(), parse_config(small_config_dict())
    base = res.split_counts()
    assert feature_warnings(cfg, art, base) == []

    def eval_of(rows: int, with_c1: int, i2_mean: float) -> SplitCounts:
        """An eval split of `rows` rows, all holding every value at the train means but C1's and I2's."""
        means = {d: base.mean("train", d) for d in base.dense_sums["train"]} | {"I2": i2_mean}
        with_value = {**base.with_value, "eval": {f: rows for f in base.with_value["eval"]} | {"C1": with_c1}}
        sums = {**base.dense_sums, "eval": {d: int(m * rows * DENSE_SUM_SCALE) for d, m in means.items()}}
        return SplitCounts({**base.rows, "eval": rows}, with_value, sums)
    far = base.mean("train", "I2") + 1.5 * art.dense_stats["I2"]["std"]  # beyond max_mean_shift, 1
    assert feature_warnings(cfg, art, eval_of(5, 2, far)) == []  # 5 rows: within 4 standard errors
    assert len(feature_warnings(cfg, art, eval_of(40, 8, far))) == 2
