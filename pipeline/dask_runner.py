"""Beam's DaskRunner, corrected where the `recpipe preprocess` job needs it, on a dask.distributed cluster.

`--runner=recpipe.pipeline.dask_runner.DaskRunner --dask_client_address=tcp://HOST:8786` (or recpipe's short
form `--runner dask --dask-address tcp://HOST:8786`). Each point below (the code cites them as "point N")
is small, separate and tested on a real cluster (tests/test_dask_runner.py; 1-5 beside the stock behaviour
they correct), so it could go upstream:

1. Multi-output ParDo: each output PCollection gets its own tag's elements. Stock: every consumer
   of any output sees all outputs' elements (a dead-letter table reaches the main output's reader).
2. Every leaf is computed. Stock: only the last-visited transform's bag, so other sinks never run.
3. Outputs emitted in finish_bundle are kept. Stock: a bundle's outputs are collected before
   finish_bundle, so file sinks (which report their files from finish_bundle) publish nothing.
4. Metrics: each bundle's MetricsContainer is returned with its output partition and merged on the
   client; only the attempt whose result Dask used counts, so a retried task never double-counts.
   Stock: `result.metrics()` raises NotImplementedError.
5. Side inputs are computed once, on the cluster, before the transforms that read them (they are
   small: a cutoff, an artifact). Stock: each task reading one recomputes its whole upstream graph
   from inside the task.
6. The metrics of the steps computed for a side input are fetched with it, so the end of the job
   never asks for those steps again. Otherwise a worker killed after a file sink's finalize has moved
   the shards makes Dask recompute the sink's pre-finalize step (to get its metrics), which deletes
   existing final shards, and the job publishes a split with no shards while its row counts balance.
7. A result computed on the cluster is let go once every transform reading it is built (each reader
   holds what it needs: a side input its value, a main input its own graph), and every reader of a side
   input gets the one value fetched for the first. Held until the job ends, a result lost with a killed
   worker would be recomputed while the job goes on, re-running a sink's pre-finalize after its finalize
   has moved the shards: the shards would be deleted and the finalize, retried, would fail on the missing
   files.
8. Every worker runs the client's code, checked before the job starts, and by a worker that joins
   later at its first bundle: Beam pickles a DoFn of an importable module by reference, so a worker
   runs its own install's copy. One with another version of the job's packages (`SAME_SOURCE`,
   compared by the bytes of their .py files) or of the libraries the transform computes with
   (`SAME_VERSIONS`) would give rows other IDs than the rest, without a word.
"""
from __future__ import annotations

import collections
import dataclasses
import functools

import apache_beam as beam
import dask.bag as db
from apache_beam import pvalue
from apache_beam.pipeline import PipelineVisitor
from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature, _OutputHandler
from apache_beam.runners.dask import dask_runner as stock
from apache_beam.runners.dask import transform_evaluator as ops
from apache_beam.runners.direct.direct_metrics import DirectMetrics
from apache_beam.metrics.execution import MetricsContainer
from apache_beam.runners.worker import statesampler
from apache_beam.transforms import DoFn
from apache_beam.transforms.sideinputs import SideInputMap
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils import counters
from apache_beam.utils.windowed_value import WindowedValue

from recpipe.common.code_identity import code_identity, identity_differences
from recpipe.common.errors import RecpipeError

__all__ = ["DaskRunner", "DaskWorkersError"]

SAME_SOURCE = ("recpipe.common", "recpipe.features", "recpipe.pipeline")  # the packages the job's DoFns and its one transform come from
SAME_VERSIONS = ("apache-beam", "pyarrow", "numpy", "pyfarmhash", "tensorflow", "cloudpickle")


class DaskWorkersError(RecpipeError, RuntimeError):
    pass


def check_workers_run_our_code(client) -> dict[str, str]:
    """Check that every Dask worker runs this process's code (point 8).

    Args:
        client: the dask.distributed Client of the job's cluster.

    Returns:
        This process's code_identity() (package source digests and library versions).

    Raises:
        DaskWorkersError: a worker's code_identity() differs from this process's, or the check cannot run
            on it; the message names every such worker and what differs.
    """
    identity = functools.partial(code_identity, SAME_SOURCE, SAME_VERSIONS)
    ours = identity()
    bad = []
    for address, theirs in sorted(client.run(identity, on_error="return").items()):
        if isinstance(theirs, BaseException):  # e.g. a recpipe too old to have code_identity
            bad.append(f"{address} cannot run the check ({type(theirs).__name__}: {theirs})")
            continue
        differ = identity_differences(ours, theirs, "the client's: ")
        if differ:
            bad.append(f"{address} runs {', '.join(differ)}")
    if bad:
        raise _other_code(bad)
    return ours


def _other_code(workers: list[str], late: bool = False) -> DaskWorkersError:
    """The error naming `workers` ('ADDRESS runs KEY THEIRS (the client's: OURS)'), found by the job's check
    or, `late`, by the first bundle of a worker that joined after it."""
    return DaskWorkersError(f"Dask workers with other code than this client: {'; '.join(workers)}"
                            f"{' (it joined after the job started)' if late else ''}. A worker runs its own "
                            f"install's copy of the job's code (Beam pickles it by reference), so it would turn "
                            f"rows into other IDs; install the same recpipe (and libraries) on every worker and "
                            f"restart it")


_METRICS = "__bundle_metrics__"  # the tag of a bundle's MetricUpdates inside its output partition


_THIS_PROCESS: dict = {}  # the worker's code_identity, computed at its first bundle


def _check_this_worker(client_identity: dict[str, str]) -> None:
    """Point 8 for a worker that joined after the job started: its first bundle compares its code with
    the client's (once per process), and every bundle it runs fails with a DaskWorkersError if they differ."""
    if "identity" not in _THIS_PROCESS:
        _THIS_PROCESS["identity"] = code_identity(SAME_SOURCE, SAME_VERSIONS)
    differ = identity_differences(client_identity, _THIS_PROCESS["identity"], "the client's: ")
    if differ:
        import dask.distributed as ddist
        try:
            where = ddist.get_worker().address
        except ValueError:
            where = "a process that is no Dask worker"
        raise _other_code([f"{where} runs {', '.join(differ)}"], late=True)


def _run_bundle(items, fn, window_fn, step: str, side_inputs, args, kwargs, client_identity: dict) -> list:
    """One Dask partition = one Beam bundle: (tag, element) pairs of every output (tag None: main),
    finish_bundle's included (point 3), and (_METRICS, the bundle's MetricUpdates) last (point 4), run
    only where the code is the client's (point 8)."""
    _check_this_worker(client_identity)
    receivers = ops.OneReceiver()
    handler = _OutputHandler(window_fn=window_fn, main_receivers=receivers[None], tagged_receivers=receivers,
                             per_element_output_counter=None, output_batch_converter=None,
                             process_yields_batches=False, process_batch_yields_elements=False)
    container = MetricsContainer(step)
    sampler = statesampler.StateSampler("", counters.CounterFactory())
    statesampler.set_current_tracker(sampler)
    try:
        with sampler.scoped_state(step, "process", metrics_container=container):
            invoker = DoFnInvoker.create_invoker(
                DoFnSignature(fn), handler, context=DoFnContext(step, state=None), side_inputs=side_inputs,
                input_args=args, input_kwargs=kwargs, user_state_context=None,
                bundle_finalizer_param=DoFn.BundleFinalizerParam())
            invoker.invoke_setup()
            invoker.invoke_start_bundle()
            for item in items:
                invoker.invoke_process(item)
            invoker.invoke_finish_bundle()
            invoker.invoke_teardown()
    finally:
        statesampler.set_current_tracker(None)
    out = [(v.tag, ops.defenestrate(v.value)) if isinstance(v, pvalue.TaggedOutput) else (None, ops.defenestrate(v))
           for v in receivers.values]
    out.append((_METRICS, container.get_cumulative()))
    return out


class _ParDo(ops.DaskBagOp):
    """A ParDo whose bag holds (tag, element) pairs; the visitor splits it per output."""
    client_identity: dict = {}  # set by the visitor: the client's code_identity (point 8)

    def apply(self, input_bag: db.Bag, side_inputs=None) -> db.Bag:
        transform = self.transform
        args, kwargs = transform.raw_side_inputs
        main_input = next(iter(self.applied.main_inputs.values()))
        window_fn = main_input.windowing.windowfn if hasattr(main_input, "windowing") else None
        return input_bag.map(ops.get_windowed_value, window_fn).map_partitions(
            _run_bundle, transform.fn, window_fn, self.applied.full_label, side_inputs, list(args), kwargs,
            self.client_identity)


def _tagged(pair, tag) -> bool:
    return pair[0] == tag


def _second(pair):
    return pair[1]


class _Readers(PipelineVisitor):
    """How many transforms read each PCollection, as a main or a side input."""

    def __init__(self):
        self.count: collections.Counter = collections.Counter()

    def visit_transform(self, node) -> None:
        self.count.update(_read(node))


def _read(node) -> list:
    """The PCollections a leaf transform reads, once per reading input."""
    return ([pc for pc in node.inputs if not isinstance(pc, pvalue.PBegin)]
            + [si.pvalue for si in node.side_inputs])


@dataclasses.dataclass
class _Visitor(PipelineVisitor):
    """Beam graph -> Dask bags: one bag per transform, one view of it per output PCollection (point 1)."""
    client: object
    bag_kwargs: dict
    unbuilt_readers: collections.Counter                       # PCollection -> readers not built yet (point 7)
    client_identity: dict                                      # the client's code_identity (point 8)
    pcolls: dict = dataclasses.field(default_factory=dict)     # PCollection -> bag
    bags: dict = dataclasses.field(default_factory=dict)       # transform node -> its bag (ParDo: tagged pairs)
    persisted: set = dataclasses.field(default_factory=set)    # nodes whose bag is computed on the cluster
    consumed: set = dataclasses.field(default_factory=set)
    metric_values: dict = dataclasses.field(default_factory=dict)  # node -> MetricUpdates fetched early (point 6)
    side_values: dict = dataclasses.field(default_factory=dict)    # PCollection -> its elements, fetched once

    def visit_transform(self, node) -> None:
        transform_cls = type(node.transform)
        op_class = _ParDo if transform_cls is beam.ParDo else ops.TRANSLATIONS.get(transform_cls, ops.NoOp)
        op = op_class(node, bag_kwargs=self.bag_kwargs)
        if isinstance(op, _ParDo):
            op.client_identity = self.client_identity
        kwargs: dict = {"input_bag": None, "side_inputs": None}
        inputs = [pc for pc in node.inputs if not isinstance(pc, pvalue.PBegin)]
        self.consumed.update(inputs)
        if node.side_inputs:
            kwargs["side_inputs"] = [self._side_input(si) for si in node.side_inputs]
        if inputs:
            bags = [self.pcolls[pc] for pc in inputs]
            kwargs["input_bag"] = bags if isinstance(op, ops.Flatten) or len(bags) > 1 else bags[0]
        self._bind(node, op.apply(**kwargs))
        self.unbuilt_readers.subtract(_read(node))
        self._let_go()

    def _let_go(self) -> None:
        """Point 7: forget the computed results every reader of which is built, so Dask never recomputes
        them (their metrics are fetched already: point 6); a result nothing reads is a leaf, kept."""
        for node in [n for n in self.persisted if n in self.bags]:
            outputs = list(node.outputs.values())
            if outputs and all(pc in self.consumed and self.unbuilt_readers[pc] <= 0 for pc in outputs):
                del self.bags[node]
                for pc in outputs:
                    del self.pcolls[pc]
                    self.side_values.pop(pc, None)

    def _bind(self, node, bag) -> None:
        self.bags[node] = bag
        for tag, pc in node.outputs.items():
            self.pcolls[pc] = _view(bag, tag) if _is_pardo(node) else bag

    def _side_input(self, si) -> SideInputMap:
        """Point 5: everything built so far is computed once on the cluster and kept there (so no transform
        runs twice: a sink's InitializeWrite, run again, would name another temp dir); the side input's
        elements are then passed by value."""
        self.consumed.add(si.pvalue)
        fresh = [n for n, bag in self.bags.items() if n not in self.persisted and isinstance(bag, db.Bag)]
        if fresh:
            for node, bag in zip(fresh, self.client.persist([self.bags[n] for n in fresh])):
                self._bind(node, bag)
            # their metrics now, by value: asked for at the end, a partition lost with a worker would be
            # recomputed, re-running a step such as a file sink's pre-finalize, which deletes the shards
            # its finalize has already moved into place
            done = [n for n in fresh if _is_pardo(n)]
            for node, updates in zip(done, self.client.compute([_view(self.bags[n], _METRICS) for n in done],
                                                               sync=True)):
                self.metric_values[node] = list(updates)
        self.persisted.update(fresh)
        if si.pvalue not in self.side_values:
            values = self.client.compute(self.pcolls[si.pvalue]).result()
            self.side_values[si.pvalue] = [WindowedValue(v, 0, (GlobalWindow(),)) for v in values]
        return SideInputMap(type(si), si._view_options(), self.side_values[si.pvalue])

    def metrics(self) -> list:
        """The metrics bags of the ParDos whose metrics were not fetched already (point 6)."""
        return [_view(bag, _METRICS) for node, bag in self.bags.items()
                if _is_pardo(node) and node not in self.metric_values]

    def leaves(self) -> list:
        """Point 2: every bag nothing else reads (and every ParDo runs, through its metrics)."""
        return [bag for pc, bag in self.pcolls.items() if pc not in self.consumed and isinstance(bag, db.Bag)]


def _is_pardo(node) -> bool:
    return type(node.transform) is beam.ParDo


def _view(tagged_bag, tag):
    return tagged_bag.filter(functools.partial(_tagged, tag=tag)).map(_second)


class DaskRunnerResult(stock.DaskRunnerResult):
    """The stock result, plus the metrics of the bundles whose outputs were used (point 4)."""

    def __init__(self, client, futures, n_metrics: int, early_metrics: list):
        super().__init__(client, futures)
        self._n_metrics, self._early = n_metrics, early_metrics
        self._metrics = None

    def wait_until_finish(self, duration=None) -> str:
        try:
            state = super().wait_until_finish(duration)
            merged = DirectMetrics()
            late = [future.result() for future in self.futures[len(self.futures) - self._n_metrics:]]
            for bundles in [*self._early, *late]:
                for updates in bundles:
                    merged.commit_logical(None, updates)
                    merged.commit_physical(None, updates)
            self._metrics = merged
        finally:
            self.client.close()  # the job is over either way; the stock result leaves it reconnecting forever
        return state

    def metrics(self) -> DirectMetrics:
        if self._metrics is None:
            raise RuntimeError("metrics are known once wait_until_finish() returned")
        return self._metrics


class DaskRunner(stock.DaskRunner):
    """Beam's DaskRunner with points 1-8 of the module docstring."""

    def run_pipeline(self, pipeline, options):
        import dask.distributed as ddist
        dask_options = options.view_as(stock.DaskOptions).get_all_options(drop_default=True, current_only=True)
        bag_kwargs = stock.DaskOptions._extract_bag_kwargs(dask_options)
        client = ddist.Client(**dask_options)
        try:  # side inputs are computed while the graph is built (point 5), so a bundle may fail here
            identity = check_workers_run_our_code(client)
            pipeline.replace_all(stock.dask_overrides())
            readers = _Readers()
            pipeline.visit(readers)
            visitor = _Visitor(client, bag_kwargs, readers.count, identity)
            pipeline.visit(visitor)
            metrics = visitor.metrics()
            futures = client.compute([*visitor.leaves(), *metrics])  # one graph: shared tasks run once
        except BaseException:
            client.close()  # else it reconnects for ever to a scheduler that may be gone
            raise
        return DaskRunnerResult(client, list(futures), len(metrics), list(visitor.metric_values.values()))
