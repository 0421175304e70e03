"""recpipe.pipeline.dask_runner on a real dask.distributed cluster (a scheduler and two one-thread worker
processes started here): each change to the stock DaskRunner beside the behaviour it replaces, and the
unchanged preprocess job giving DirectRunner's outputs, also with a worker killed mid-run."""
from __future__ import annotations

import collections
import difflib
import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from conftest import IN_MEMORY, small_config_dict
from helpers import installed_copy
from recpipe.features.canonical import LABEL_KEY
from recpipe.features.config import parse_config
from recpipe.features.preprocessed import PreprocessedData
from recpipe.pipeline import transforms
from recpipe.pipeline.preprocess import run_preprocess

STOCK = "apache_beam.runners.dask.dask_runner.DaskRunner"
OURS = "recpipe.pipeline.dask_runner.DaskRunner"
TESTS = str(Path(__file__).resolve().parent)

pytestmark = pytest.mark.system


def _scheduler(dask_cli: str, sched_file: str, env: dict) -> subprocess.Popen:
    """`dask scheduler` on a free port, once it has written `sched_file` (its address)."""
    proc = subprocess.Popen([dask_cli, "scheduler", "--port", "0", "--scheduler-file", sched_file, "--no-dashboard"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not os.path.exists(sched_file):
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("dask scheduler did not start")
        time.sleep(0.2)
    return proc


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """`dask scheduler` + 2 `dask worker` processes (nanny-supervised, one thread each)."""
    import distributed
    work = tmp_path_factory.mktemp("dask")
    dask_cli = str(Path(sys.executable).parent / "dask")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    sched_file = str(work / "scheduler.json")
    procs = [_scheduler(dask_cli, sched_file, env)]
    try:
        for _ in range(2):
            procs.append(subprocess.Popen([dask_cli, "worker", "--scheduler-file", sched_file, "--nworkers", "1",
                                           "--nthreads", "1", "--no-dashboard"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        address = json.loads(Path(sched_file).read_text())["address"]
        with distributed.Client(address) as client:
            client.wait_for_workers(2, timeout=120)
        yield address
    finally:
        _stop(procs)


def _stop(procs: list) -> None:
    """The workers, then the scheduler (procs[0]): a worker whose scheduler went first waits to reconnect
    before it exits (8 s more)."""
    for group in (procs[1:], procs[:1]):
        for p in group:
            p.terminate()
        for p in group:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _run(build, runner: str, address: str):
    p = beam.Pipeline(runner=runner, options=PipelineOptions([f"--dask_client_address={address}"]))
    build(p)
    result = p.run()
    try:
        result.wait_until_finish(duration=120_000)
    finally:
        result.client.close()  # the stock runner leaves its client open (ours closes it itself)
    return result


def _record(x, directory: str) -> None:
    """A side-effect sink that works on any runner: one file per element."""
    os.makedirs(directory, exist_ok=True)
    Path(directory, f"{uuid.uuid4().hex}.json").write_text(json.dumps(x, default=repr))


def _recorded(directory: Path) -> list:
    return sorted(json.loads(f.read_text()) for f in directory.glob("*.json")) if directory.exists() else []


class _SplitEvenOdd(beam.DoFn):
    def process(self, x):
        yield x if x % 2 == 0 else beam.pvalue.TaggedOutput("odd", x)


def test_each_output_gets_its_own_tag(dask_cluster, tmp_path):
    def build(p, out):
        outs = p | beam.Create(list(range(8))) | beam.ParDo(_SplitEvenOdd()).with_outputs("odd", main="even")
        _ = outs.even | "Even" >> beam.Map(_record, str(out / "even"))

    _run(lambda p: build(p, tmp_path / "stock"), STOCK, dask_cluster)
    stock = _recorded(tmp_path / "stock" / "even")
    assert stock != [0, 2, 4, 6] and len(stock) == 8  # stock: the odd (tagged) elements reached it too
    _run(lambda p: build(p, tmp_path / "ours"), OURS, dask_cluster)
    assert _recorded(tmp_path / "ours" / "even") == [0, 2, 4, 6]


def test_every_leaf_runs(dask_cluster, tmp_path):
    def build(p, out):
        items = p | beam.Create([1, 2, 3])
        _ = items | "First" >> beam.Map(_record, str(out / "first"))
        _ = items | "Second" >> beam.Map(_record, str(out / "second"))

    _run(lambda p: build(p, tmp_path / "stock"), STOCK, dask_cluster)
    assert _recorded(tmp_path / "stock" / "first") == []  # stock: only the last-visited leaf ran
    _run(lambda p: build(p, tmp_path / "ours"), OURS, dask_cluster)
    assert _recorded(tmp_path / "ours" / "first") == _recorded(tmp_path / "ours" / "second") == [1, 2, 3]


class _SumInFinishBundle(beam.DoFn):
    def start_bundle(self):
        self.total = 0

    def process(self, x):
        self.total += x

    def finish_bundle(self):
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.windowed_value import WindowedValue
        yield WindowedValue(self.total, 0, [GlobalWindow()])


def test_finish_bundle_outputs_are_kept(dask_cluster, tmp_path):
    def build(p, out):
        _ = (p | beam.Create([1, 2, 3, 4]) | beam.ParDo(_SumInFinishBundle())
             | beam.Map(_record, str(out)))

    _run(lambda p: build(p, tmp_path / "stock"), STOCK, dask_cluster)
    assert _recorded(tmp_path / "stock") == []  # stock: collected before finish_bundle ran
    _run(lambda p: build(p, tmp_path / "ours"), OURS, dask_cluster)
    assert sum(_recorded(tmp_path / "ours")) == 10


class _Counted(beam.DoFn):
    def __init__(self, executions: str):
        self.executions, self.seen = executions, Metrics.counter("test", "seen")

    def process(self, x):
        self.seen.inc()
        Path(self.executions, uuid.uuid4().hex).touch()  # how often it really ran
        yield x % 3, x


class _DieOnce(beam.DoFn):
    """Kills its worker process the first time it sees key 0 (the nanny restarts the worker; Dask
    recomputes what was lost with it, including results of the stage before)."""

    def __init__(self, marker: str):
        self.marker = marker

    def process(self, kv):
        if kv[0] == 0 and not os.path.exists(self.marker):
            Path(self.marker).touch()
            os._exit(1)
        yield kv


def test_metrics_are_merged_and_count_a_retried_task_once(dask_cluster, tmp_path):
    def build(p, executions):
        os.makedirs(executions, exist_ok=True)
        _ = (p | beam.Create(list(range(300))) | beam.ParDo(_Counted(executions)) | beam.GroupByKey()
             | beam.ParDo(_DieOnce(str(tmp_path / "died"))) | beam.Map(_record, str(tmp_path / "out")))

    with pytest.raises(NotImplementedError):  # stock: no metrics at all
        _run(lambda p: build(p, str(tmp_path / "stock_runs")), STOCK, dask_cluster).metrics()
    os.remove(tmp_path / "died")
    result = _run(lambda p: build(p, str(tmp_path / "runs")), OURS, dask_cluster)
    assert (tmp_path / "died").exists()  # a worker died mid-job and its tasks were redone
    seen = result.metrics().query(MetricsFilter().with_name("seen"))["counters"]
    assert sum(r.committed for r in seen) == 300  # exactly once per element, whatever ran twice
    print(f"first stage ran {len(os.listdir(tmp_path / 'runs'))} times for 300 elements")
    assert len(os.listdir(tmp_path / "runs")) >= 300


def _pair(x, s):
    return x, s


def _second(t, s):
    return t[1], s


def test_one_side_input_value_for_every_reader(dask_cluster, tmp_path):
    """Like a file sink's InitializeWrite (a fresh temp dir name each time it runs): read by two
    transforms that run one after the other."""
    def build(p, out):
        name = p | "S" >> beam.Create([0]) | "Name" >> beam.Map(lambda _: uuid.uuid4().hex)
        first = p | "M" >> beam.Create([1, 2]) | "UseA" >> beam.Map(_pair, beam.pvalue.AsSingleton(name))
        _ = (first | "UseB" >> beam.Map(_second, beam.pvalue.AsSingleton(name))
             | beam.Map(_record, str(out)))

    _run(lambda p: build(p, tmp_path / "stock"), STOCK, dask_cluster)
    assert any(a != b for a, b in _recorded(tmp_path / "stock"))  # stock: computed again, another value
    _run(lambda p: build(p, tmp_path / "ours"), OURS, dask_cluster)
    assert [a == b for a, b in _recorded(tmp_path / "ours")] == [True, True]


class _SideEffect(beam.DoFn):
    """Like a file sink's pre-finalize (which deletes existing final shards): counts how often it
    runs and records the pid of the worker that ran it."""

    def __init__(self, runs: str):
        self.runs = runs

    def process(self, x):
        os.makedirs(self.runs, exist_ok=True)
        Path(self.runs, f"{os.getpid()}-{uuid.uuid4().hex}").touch()
        Metrics.counter("t", "side_runs").inc()
        yield x


def _kill_side_worker(x, side, runs: str, marker: str):
    """The first element kills the worker that ran _SideEffect (and holds its result) and waits for it
    to be gone; a retry of this task (if it killed itself) finds the marker and goes on."""
    if not os.path.exists(marker):
        Path(marker).touch()
        pid = int(next(iter(os.listdir(runs))).split("-")[0])
        os.kill(pid, signal.SIGKILL)
        time.sleep(3)
    return x + side


def test_a_lost_worker_never_reruns_a_step_computed_for_a_side_input(dask_cluster, tmp_path):
    runs, marker = str(tmp_path / "runs"), str(tmp_path / "killed")

    def build(p):
        side = p | "S" >> beam.Create([100]) | "Side" >> beam.ParDo(_SideEffect(runs))
        _ = (p | "M" >> beam.Create(list(range(20)))
             | "Use" >> beam.Map(_kill_side_worker, beam.pvalue.AsSingleton(side), runs, marker)
             | beam.Map(_record, str(tmp_path / "out")))

    result = _run(build, OURS, dask_cluster)
    assert os.path.exists(marker)  # the worker holding the side step's result was killed
    assert len(os.listdir(runs)) == 1  # and the step did not run again for its metrics
    assert _recorded(tmp_path / "out") == list(range(100, 120))
    side_runs = result.metrics().query(MetricsFilter().with_name("side_runs"))["counters"]
    assert sum(r.committed for r in side_runs) == 1


def _ignore(x, _side):
    return x


def test_a_lost_worker_never_reruns_a_step_whose_readers_are_built(dask_cluster, tmp_path):
    """The kill comes while the runner still builds the graph: a later side input's round runs a step
    that kills the worker holding _SideEffect's result, after every reader of that result was built.
    Kept wanted, the result was recomputed: a file sink's pre-finalize ran again after its finalize had
    moved the shards, deleting them (the preprocess job then failed, or published a split without shards)."""
    runs, marker = str(tmp_path / "runs"), str(tmp_path / "killed")

    def build(p):
        side = p | "S" >> beam.Create([100]) | "Side" >> beam.ParDo(_SideEffect(runs))
        used = p | "M" >> beam.Create(list(range(20))) | "Use" >> beam.Map(_pair, beam.pvalue.AsSingleton(side))
        kill = (p | "K" >> beam.Create([0])
                | "Kill" >> beam.Map(_kill_side_worker, 0, runs, marker))
        _ = (used | "Later" >> beam.Map(_ignore, beam.pvalue.AsSingleton(kill))
             | beam.Map(_record, str(tmp_path / "out")))

    _run(build, OURS, dask_cluster)
    assert os.path.exists(marker)  # the worker holding the side step's result was killed
    assert len(os.listdir(runs)) == 1  # and nothing asked for that result again
    assert _recorded(tmp_path / "out") == [[x, 100] for x in range(20)]


class _CountBundles(beam.DoFn):
    def __init__(self, directory: str):
        self.directory = directory

    def start_bundle(self):
        os.makedirs(self.directory, exist_ok=True)
        Path(self.directory, uuid.uuid4().hex).touch()

    def process(self, x):
        yield x


def test_a_create_read_through_a_reshuffle_gives_each_element_a_bundle(dask_cluster, tmp_path):
    """Point 9: the read's units of files are such a Create; stock ran up to 128 of them in one bundle."""
    def build(p, name):
        _ = (p | beam.Create([f"unit{i}" for i in range(12)]) | beam.Reshuffle()
             | beam.ParDo(_CountBundles(str(tmp_path / f"{name}_bundles"))) | beam.Map(_record, str(tmp_path / name)))

    _run(lambda p: build(p, "stock"), STOCK, dask_cluster)
    _run(lambda p: build(p, "ours"), OURS, dask_cluster)
    assert len(os.listdir(tmp_path / "stock_bundles")) == 1
    assert len(os.listdir(tmp_path / "ours_bundles")) == 12
    assert _recorded(tmp_path / "ours") == sorted(f"unit{i}" for i in range(12))


class _RecordedSum(beam.CombineFn):
    """A sum that records the accumulators each final merge receives."""

    def __init__(self, directory: str):
        self.directory = directory

    def create_accumulator(self):
        return 0

    def add_input(self, total, x):
        return total + x

    def merge_accumulators(self, totals):
        totals = list(totals)
        _record(sorted(totals), self.directory)
        return sum(totals)

    def extract_output(self, total):
        return total


def test_a_combine_is_lifted_so_each_bundle_sends_one_accumulator(dask_cluster, tmp_path):
    """Point 10: 12 bundles of 50 ones each sum their own before the GroupByKey; stock moved all 600 ones."""
    def build(p, name):
        _ = (p | beam.Create(list(range(12))) | beam.Reshuffle() | beam.FlatMap(lambda _: [("k", 1)] * 50)
             | beam.CombinePerKey(_RecordedSum(str(tmp_path / f"{name}_merges")))
             | beam.Map(_record, str(tmp_path / name)))

    _run(lambda p: build(p, "stock"), STOCK, dask_cluster)
    _run(lambda p: build(p, "ours"), OURS, dask_cluster)
    assert _recorded(tmp_path / "stock") == _recorded(tmp_path / "ours") == [["k", 600]]
    # stock: all 600 ones crossed the GroupByKey; Beam's CombineValues then sums them in three parts (its
    # way to exercise merge_accumulators: a Beam upgrade may change the parts, not that nothing was lifted)
    assert _recorded(tmp_path / "stock_merges") == [[200, 200, 200]]
    assert _recorded(tmp_path / "ours_merges") == [[50] * 12]


# ------------------------------------------------------------------------- the preprocess job
def _shard_rows(data: PreprocessedData, split: str) -> collections.Counter:
    import tensorflow as tf

    from recpipe.features.records import parse_record
    parse, out = parse_record(data.transform().config), collections.Counter()
    for f in data.shard_files(split):
        for rec in tf.data.TFRecordDataset(f):
            cols = {k: (v.to_list() if isinstance(v, tf.RaggedTensor) else v.numpy().tolist())
                    for k, v in parse(rec).items()}
            for i in range(len(cols[LABEL_KEY])):
                out[json.dumps({k: cols[k][i] for k in sorted(cols)})] += 1
    return out


def _dead_rows(data: PreprocessedData) -> list:
    files = data.dead_letter_files()
    rows = pq.read_table(files).to_pylist() if files else []
    return sorted((r["source_file"], r["row"], r["reason"], r["field"]) for r in rows)


def _artifact_files(data: PreprocessedData) -> dict[str, bytes]:
    """The transform artifact's files, {path under transform/: bytes}; in transform.json the shard list
    (row_counts.shard_bytes, {split: {file: bytes}}) cut to each split's total bytes: how a runner splits a
    split into shard files is its own (one per bundle that wrote), the records in them are not."""
    root = Path(data.transform_dir)
    files = {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}
    meta = json.loads(files["transform.json"])
    assert json.dumps(meta, indent=1, sort_keys=True).encode() == files["transform.json"]  # re-encoded byte for byte
    meta["row_counts"]["shard_bytes"] = {split: sum(shards.values())
                                         for split, shards in meta["row_counts"]["shard_bytes"].items()}
    files["transform.json"] = json.dumps(meta, indent=1, sort_keys=True).encode()
    return files


def _assert_same_outputs(a: PreprocessedData, b: PreprocessedData) -> None:
    ours, theirs = _artifact_files(a), _artifact_files(b)
    assert sorted(ours) == sorted(theirs)
    for name in ours:  # config.yaml, vocab/*.json, transform.json: dense statistics, row counts, split ...
        assert ours[name] == theirs[name], "\n".join([name, *difflib.unified_diff(
            ours[name].decode().splitlines(), theirs[name].decode().splitlines(), lineterm="", n=1)])
    for split in ("train", "eval"):
        assert _shard_rows(a, split) == _shard_rows(b, split), split
    assert _dead_rows(a) == _dead_rows(b) and _dead_rows(a)
    sample = pq.read_table(a.eval_sample_parquet)
    assert sample.num_rows and sample.equals(pq.read_table(b.eval_sample_parquet))  # the same rows, in order
    assert Path(a.eval_sample_records).read_bytes() == Path(b.eval_sample_records).read_bytes()


@pytest.fixture(scope="module")
def log_with_bad_rows(tmp_path_factory, small_log):
    out = tmp_path_factory.mktemp("badlog")
    for i, src in enumerate(sorted(glob.glob(os.path.join(small_log, "*", "*.parquet")))):
        t = pq.read_table(src)
        labels = t.column("label").to_pylist()
        for j in range(i, len(labels), 97):
            labels[j] = None if j % 2 else 7
        t = t.set_column(t.schema.get_field_index("label"), "label", pa.array(labels, pa.int64()))
        os.makedirs(out / f"day{i}")
        pq.write_table(t, out / f"day{i}" / "part-0.parquet", row_group_size=1000)
    return str(out)


@pytest.fixture(scope="module")
def direct_output(tmp_path_factory, log_with_bad_rows):
    out = str(tmp_path_factory.mktemp("direct") / "pre")
    run_preprocess(parse_config(small_config_dict()), log_with_bad_rows, out, IN_MEMORY, say=lambda _: None)
    return PreprocessedData(out)


@pytest.fixture(scope="module")
def many_file_log(tmp_path_factory):
    """26,000 rows (1 in 97 dead-lettered) in 130 files, each holding rows from the whole time range, so that
    train and eval rows are in every file. The read's units of work (READ_UNIT_ROWS, lowered to 5,000 rows by
    the test using it: 25 files) get a bundle each on Dask: the job runs each step in 6 bundles."""
    from recpipe.pipeline.synthetic import GenerateSpec, generate_log
    raw = tmp_path_factory.mktemp("many_raw")
    files = generate_log(GenerateSpec(rows=26_000, days=2, seed=11, num_users=500, num_items=300), str(raw))
    rows = pa.concat_tables([pq.read_table(f) for f in files])
    labels = rows.column("label").to_pylist()
    for j in range(0, len(labels), 97):
        labels[j] = None if j % 2 else 7
    rows = rows.set_column(rows.schema.get_field_index("label"), "label", pa.array(labels, pa.int64()))
    out = tmp_path_factory.mktemp("many")
    for i in range(130):
        os.makedirs(out / f"part{i:03d}")
        pq.write_table(rows.take(list(range(i, rows.num_rows, 130))), out / f"part{i:03d}" / "data.parquet")
    return str(out)


def _dense_stats_bundles(results: list) -> int:
    """How many bundles held train batches in the job's dense-statistics step (its own counter)."""
    from recpipe.pipeline.transforms import NAMESPACE
    found = results[-1].metrics().query(MetricsFilter().with_namespace(NAMESPACE)
                                        .with_name("dense_stats_bundles"))["counters"]
    return sum(r.committed for r in found)


def test_preprocess_on_dask_in_several_bundles_gives_directrunners_artifact(dask_cluster, tmp_path, many_file_log,
                                                                             monkeypatch):
    """A runner groups and merges partial results in its own way: Dask, its work split in bundles, wrote
    dense statistics that differed from DirectRunner's in the last digits (float sums in another order),
    bucket boundaries from a quantile sketch fed in another order, and another eval sample. They are now
    reduced exactly: the artifact's files are byte for byte DirectRunner's."""
    results = []
    run = beam.Pipeline.run

    def keep_result(pipeline, *args, **kwargs):
        results.append(run(pipeline, *args, **kwargs))
        return results[-1]

    monkeypatch.setattr(beam.Pipeline, "run", keep_result)
    monkeypatch.setattr(transforms, "READ_UNIT_ROWS", 5_000)  # 6 units of up to 25 files: a bundle each on Dask
    cfg = parse_config(small_config_dict())
    direct, dask = str(tmp_path / "direct"), str(tmp_path / "dask")
    run_preprocess(cfg, many_file_log, direct, IN_MEMORY, say=lambda _: None)
    direct_bundles = _dense_stats_bundles(results)
    res = run_preprocess(cfg, many_file_log, dask, ["--runner", "dask", "--dask-address", dask_cluster],
                         say=lambda _: None)
    dask_bundles = _dense_stats_bundles(results)
    print(f"dense statistics from train batches in {direct_bundles} bundle(s) on DirectRunner, {dask_bundles} on Dask")
    assert dask_bundles >= 2 and direct_bundles >= 1
    assert res.rows_in == 26_000 and res.rows_dead == len(range(0, 26_000, 97))
    _assert_same_outputs(PreprocessedData(direct), PreprocessedData(dask))


def test_preprocess_on_dask_gives_directrunners_outputs(dask_cluster, tmp_path, log_with_bad_rows, direct_output):
    out = str(tmp_path / "pre")
    proc = subprocess.run([sys.executable, "-m", "recpipe.cli", "preprocess", "--config", _config(tmp_path),
                           "--input", log_with_bad_rows, "--output", out, "--runner", "dask", "--dask-address",
                           dask_cluster], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rows in = 6000 = rows out" in proc.stdout and "label_not_0_1=" in proc.stdout
    _assert_same_outputs(direct_output, PreprocessedData(out))


def test_preprocess_on_dask_keeps_no_rows_on_the_cluster(dask_cluster, tmp_path, log_with_bad_rows, direct_output,
                                                         monkeypatch):
    """Point 5: each round of the job keeps only what a transform not built yet reads (a cutoff, the artifact,
    a sink's temp dir and write results, a combined count), never a step's rows: those stream through."""
    from recpipe.pipeline import dask_runner
    kept, to_keep = [], dask_runner._Visitor._to_keep

    def spy(visitor, component):
        chosen = to_keep(visitor, component)
        kept.extend(pc.producer.full_label for pc in chosen)
        return chosen

    monkeypatch.setattr(dask_runner._Visitor, "_to_keep", spy)
    out = str(tmp_path / "pre")
    run_preprocess(parse_config(small_config_dict()), log_with_bad_rows, out,
                   ["--runner", "dask", "--dask-address", dask_cluster], say=lambda _: None)
    per_row = ("ReadForSplit", "ValidateForSplit", "ReadForAnalysis", "ValidateForAnalysis", "TrainRows",
               "ReadClickLogs", "ValidateRows", "SplitByTime", "ApplyTransform")
    assert any(label.startswith("PackArtifact") for label in kept), kept
    assert [label for label in kept if label.startswith(per_row)] == []
    _assert_same_outputs(direct_output, PreprocessedData(out))


def test_preprocess_on_dask_survives_a_killed_worker(dask_cluster, tmp_path, log_with_bad_rows, direct_output):
    """A worker process SIGKILLed mid-job, the moment it holds a result the job computed on the cluster (the
    first bag persisted for a side input, read again later): the scheduler sees it leave, Dask recomputes
    what it held, and the outputs and the row accounting (from the data) come out exactly as DirectRunner's."""
    import distributed
    job_over, killed = threading.Event(), {}
    with distributed.Client(dask_cluster, set_as_default=False) as watcher:
        watcher.wait_for_workers(2, timeout=120)
        pids = watcher.run(os.getpid)

        def kill_a_worker_holding_results():
            while not job_over.is_set():
                held = {worker: keys for worker, keys in watcher.has_what().items() if keys}
                if held:
                    address = max(held, key=lambda w: len(held[w]))
                    os.kill(pids[address], signal.SIGKILL)
                    killed.update(address=address, pid=pids[address], keys=len(held[address]))
                    return
                time.sleep(0.02)

        killer = threading.Thread(target=kill_a_worker_holding_results)
        killer.start()
        out = str(tmp_path / "pre")
        try:
            res = run_preprocess(parse_config(small_config_dict()), log_with_bad_rows, out,
                                 ["--runner", "dask", "--dask-address", dask_cluster], say=lambda _: None)
        finally:
            job_over.set()
            killer.join()
        assert killed, "no worker was killed while the job ran (none held a computed result before it ended)"
        deadline = time.monotonic() + 60

        def still_there() -> list:
            return [what for what, there in (("its process", os.path.exists(f"/proc/{killed['pid']}")),
                    ("its scheduler entry", killed["address"] in watcher.scheduler_info(n_workers=-1)["workers"]))
                    if there]
        while still_there() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not still_there(), (killed, still_there())  # the process is gone and the scheduler saw it leave
    assert res.rows_in == 6000 == res.rows_train + res.rows_eval + res.rows_dead
    _assert_same_outputs(direct_output, PreprocessedData(out))


def _config(tmp_path) -> str:
    import yaml
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(small_config_dict()))
    return str(path)


def test_a_worker_with_other_code_is_named_before_the_job_starts(dask_cluster, tmp_path, log_with_bad_rows,
                                                                 monkeypatch):
    """Beam pickles the job's DoFns by reference, so each worker runs its own install's copy: a worker
    with another version of recpipe's `features` (here hashing IDs otherwise) turned its rows into other IDs
    than the rest, and the job published them without a word. A third worker joins with that copy first on
    its path; the job stops before it starts, naming it. A worker joining later is named by its first bundle."""
    import distributed

    from recpipe.pipeline.dask_runner import DaskWorkersError
    other = tmp_path / "other_install"
    hashing = installed_copy(other) / "features" / "hashing.py"
    hashing.write_text(hashing.read_text().replace("(fingerprints % np.uint64(buckets))",
                                                   "((fingerprints >> np.uint64(1)) % np.uint64(buckets))"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(other), TESTS, os.environ.get("PYTHONPATH", "")]))
    worker = subprocess.Popen([str(Path(sys.executable).parent / "dask"), "worker", dask_cluster, "--name", "other",
                               "--nworkers", "1", "--nthreads", "1", "--no-dashboard"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with distributed.Client(dask_cluster) as client:
            client.wait_for_workers(3, timeout=120)
            address = next(a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
                           if w["name"] == "other")
        out = tmp_path / "pre"
        with pytest.raises(DaskWorkersError) as e:
            run_preprocess(parse_config(small_config_dict()), log_with_bad_rows, str(out),
                           ["--runner", "dask", "--dask-address", dask_cluster], say=lambda _: None)
        text = str(e.value)
        assert text.startswith(f"Dask workers with other code than this client: {address} runs recpipe.features "), text
        named = text.split(". A worker runs")[0]
        assert "; " not in named and ", " not in named and "install the same recpipe" in text, text  # only it
        assert not (out / "transform").exists()
    finally:
        worker.terminate()
        worker.wait(timeout=30)

    # A worker that joins after that check: here the job's check is skipped, on a cluster of that worker
    # alone; its first bundle compares its code with the client's, and the job stops naming it.
    from recpipe.pipeline import dask_runner
    monkeypatch.setattr(dask_runner, "check_workers_run_our_code",
                        lambda client: dask_runner.code_identity(dask_runner.SAME_SOURCE, dask_runner.SAME_VERSIONS))
    sched_file = str(tmp_path / "late.json")
    dask_cli = str(Path(sys.executable).parent / "dask")
    procs = [_scheduler(dask_cli, sched_file, env)]
    try:
        procs.append(subprocess.Popen([dask_cli, "worker", "--scheduler-file", sched_file, "--nthreads", "1",
                                       "--no-dashboard"], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        late = json.loads(Path(sched_file).read_text())["address"]
        with distributed.Client(late) as client:
            client.wait_for_workers(1, timeout=120)
        with pytest.raises(DaskWorkersError, match=r"^Dask workers with other code than this client: tcp://\S+ "
                                                   r"runs recpipe.features \w+ \(the client's: \w+\) \(it joined after the "
                                                   r"job started\)\. A worker runs"):
            run_preprocess(parse_config(small_config_dict()), log_with_bad_rows, str(tmp_path / "late"),
                           ["--runner", "dask", "--dask-address", late], say=lambda _: None)
        assert not (tmp_path / "late" / "transform").exists()
    finally:
        _stop(procs)
