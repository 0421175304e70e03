"""Beam's DaskRunner, corrected where the `recpipe preprocess` job needs it, on a dask.distributed cluster.

`--runner=recpipe.pipeline.dask_runner.DaskRunner --dask_client_address=tcp://HOST:8786` (or recpipe's short
form `--runner dask --dask-address tcp://HOST:8786`). Each point below (the code cites them as "point N")
is small, separate and tested on a real cluster (tests/test_dask_runner.py; 1-5, 9 and 10 beside the stock behaviour
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
   small: a cutoff, an artifact), and passed by value. Stock: each task reading one recomputes its whole
   upstream graph from inside the task. The transforms are built in an order that leaves those reading a
   side input not computed yet for last, so one round computes every built transform connected to the
   side input's own steps; it keeps only the outputs a transform not built yet reads (what a built one
   reads streams through the round's graph and is let go), so no step runs twice and the cluster never
   holds a log-sized result: a sink's write results, not the rows written.
6. The metrics of the steps computed in a round are fetched with it, so the end of the job
   never asks for those steps again. Otherwise a worker killed after a file sink's finalize has moved
   the shards makes Dask recompute the sink's pre-finalize step (to get its metrics), which deletes
   existing final shards, and the job publishes a split with no shards while its row counts balance.
7. A result kept by a round is let go once every transform reading it is built (each reader
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
9. A Create read through a Reshuffle (Beam's way to spread work, as the read's units of files) puts each
   element in a partition of its own (so a bundle of its own), up to MAX_CREATE_PARTITIONS partitions,
   unless `--dask_npartitions` or `--dask_partition_size` says otherwise; the Reshuffle itself is a no-op.
   Stock: 128 elements a partition, so a log of up to 128 read units was read, validated and transformed
   in one bundle, on one worker, its whole output held in that one task's result.
10. A CombinePerKey (and so a CombineGlobally) is lifted, as the DirectRunner does: each bundle combines
   its own elements per key and emits one accumulator per key from finish_bundle (point 3 keeps it), so
   the GroupByKey moves one accumulator per key and bundle. Stock: every element goes through the
   GroupByKey, and every batch's count tables and statistics wait in the shuffle until the last bundle
   is done.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import math

import apache_beam as beam
import dask.bag as db
from dask.base import tokenize
from apache_beam import pvalue
from apache_beam.pipeline import PipelineVisitor, PTransformOverride
from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature, _OutputHandler
from apache_beam.runners.dask import dask_runner as stock
from apache_beam.runners.dask import overrides
from apache_beam.runners.dask import transform_evaluator as ops
from apache_beam.runners.direct.direct_metrics import DirectMetrics
from apache_beam.metrics.execution import MetricsContainer
from apache_beam.runners.worker import statesampler
from apache_beam.transforms import DoFn
from apache_beam.transforms.combiners import LiftedCombinePerKey
from apache_beam.transforms.sideinputs import SideInputMap
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils import counters
from apache_beam.utils.windowed_value import WindowedValue

from recpipe.common.code_identity import code_identity, identity_differences
from recpipe.common.errors import RecpipeError

__all__ = ["DaskRunner", "DaskWorkersError", "MAX_CREATE_PARTITIONS"]

MAX_CREATE_PARTITIONS = 1024  # point 9: a spread Create of more elements shares them out over this many

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


class _Create(ops.DaskBagOp):
    """A Create's bag, its keys named after the transform: two Creates of equal elements (every sink's DoOnce)
    would otherwise share keys, kept by one round and fused into another graph later. Sized as stock's (128
    elements a partition, or the options' size), or, `spread` (read through a Reshuffle), one element a
    partition up to MAX_CREATE_PARTITIONS (point 9)."""
    spread: bool = False

    def apply(self, input_bag=None, side_inputs=None) -> db.Bag:
        items = list(self.transform.values)
        npartitions, size = self.bag_kwargs.get("npartitions"), self.bag_kwargs.get("partition_size")
        if npartitions and size:
            raise ValueError(f"give --dask_npartitions or --dask_partition_size, not both ({npartitions}, {size})")
        if npartitions:  # as dask.bag.from_sequence
            size = math.ceil(len(items) / npartitions) if len(items) <= 100 else len(items) // npartitions
        elif not size:
            size = math.ceil(len(items) / MAX_CREATE_PARTITIONS) if self.spread else \
                max(128, math.ceil(math.sqrt(len(items)) / 10))
        size = max(1, size)
        parts = [items[i:i + size] for i in range(0, len(items), size)] or [[]]
        name = f"create-{tokenize(self.applied.full_label, items, size)}"
        return db.Bag({(name, i): part for i, part in enumerate(parts)}, name, len(parts))


def _tagged(pair, tag) -> bool:
    return pair[0] == tag


def _second(pair):
    return pair[1]


class _Leaves(PipelineVisitor):
    """The leaf transforms in the pipeline's own order."""

    def __init__(self):
        self.nodes: list = []

    def visit_transform(self, node) -> None:
        self.nodes.append(node)


def _read(node) -> list:
    """The PCollections a leaf transform reads, once per reading input."""
    return _main_inputs(node) + [si.pvalue for si in node.side_inputs]


def _main_inputs(node) -> list:
    return [pc for pc in node.inputs if not isinstance(pc, pvalue.PBegin)]


@dataclasses.dataclass
class _Visitor:
    """Beam graph -> Dask bags: one bag per transform, one view of it per output PCollection (point 1),
    built in an order that computes side inputs in as few rounds as possible (point 5)."""
    client: object
    bag_kwargs: dict
    client_identity: dict                                      # the client's code_identity (point 8)
    # PCollection -> transforms reading it (as a main or a side input) not built yet (point 7)
    unbuilt_readers: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    producer: dict = dataclasses.field(default_factory=dict)   # PCollection -> the leaf transform making it
    spread: set = dataclasses.field(default_factory=set)       # PCollections only Reshuffles read (point 9)
    pcolls: dict = dataclasses.field(default_factory=dict)     # PCollection -> bag
    fresh: dict = dataclasses.field(default_factory=dict)      # transform not computed yet -> its bag
    kept: set = dataclasses.field(default_factory=set)         # PCollections whose bag a round computed
    consumed: set = dataclasses.field(default_factory=set)
    metric_values: dict = dataclasses.field(default_factory=dict)  # node -> MetricUpdates fetched early (point 6)
    side_values: dict = dataclasses.field(default_factory=dict)    # PCollection -> its elements, fetched once

    def build(self, nodes: list) -> None:
        """Build every leaf transform of `nodes` (in the pipeline's order): always one whose side inputs are
        known, if any is ready; else the ready one whose side inputs need the smallest round (point 5)."""
        self.producer = {pc: n for n in nodes for pc in n.outputs.values()}
        readers = collections.defaultdict(list)
        for n in nodes:
            for pc in _read(n):
                readers[pc].append(n)
        self.unbuilt_readers = collections.Counter({pc: len(them) for pc, them in readers.items()})
        self.spread = {pc for pc, them in readers.items() if all(type(r.transform) is overrides._Reshuffle
                                                                   for r in them)}
        pending = list(nodes)
        built: set = set()
        while pending:
            ready = [n for n in pending if all(self.producer.get(pc) in built for pc in _read(n)
                                               if pc in self.producer)]
            node = next((n for n in ready if all(si.pvalue in self.side_values for si in n.side_inputs)), None)
            if node is None:
                node = min(ready, key=self._round_size)
            self._visit(node)
            built.add(node)
            pending.remove(node)

    def _visit(self, node) -> None:
        transform_cls = type(node.transform)
        op_class = _OPS.get(transform_cls) or ops.TRANSLATIONS.get(transform_cls, ops.NoOp)
        op = op_class(node, bag_kwargs=self.bag_kwargs)
        if isinstance(op, _Create):
            op.spread = bool(node.outputs) and all(pc in self.spread for pc in node.outputs.values())
        if isinstance(op, _ParDo):
            op.client_identity = self.client_identity
        kwargs: dict = {"input_bag": None, "side_inputs": None}
        inputs = _main_inputs(node)
        self.consumed.update(inputs)
        if node.side_inputs:
            kwargs["side_inputs"] = [self._side_input(si) for si in node.side_inputs]
        if inputs:
            bags = [self.pcolls[pc] for pc in inputs]
            kwargs["input_bag"] = bags if isinstance(op, ops.Flatten) or len(bags) > 1 else bags[0]
        bag = op.apply(**kwargs)
        if isinstance(bag, db.Bag):
            self.fresh[node] = bag
        for tag, pc in node.outputs.items():
            self.pcolls[pc] = _view(bag, tag) if _is_pardo(node) else bag
        self.unbuilt_readers.subtract(_read(node))
        self._let_go()

    def _let_go(self) -> None:
        """Point 7: forget the kept results every reader of which is built, so Dask never recomputes
        them (their metrics are fetched already: point 6); a result nothing reads is a leaf, kept."""
        for pc in [pc for pc in self.kept if pc in self.consumed and self.unbuilt_readers[pc] <= 0]:
            self.kept.discard(pc)
            del self.pcolls[pc]
            self.side_values.pop(pc, None)

    def _side_input(self, si) -> SideInputMap:
        """Point 5: the side input's elements, by value, computed in a round if they are not yet; every reader
        gets the value fetched for the first (a sink's InitializeWrite, run again, would name another temp dir)."""
        self.consumed.add(si.pvalue)
        if si.pvalue not in self.side_values:
            if self.producer[si.pvalue] in self.fresh:
                self._round(self._component(self.producer[si.pvalue]))
            values = self.client.compute(self.pcolls[si.pvalue]).result()
            self.side_values[si.pvalue] = [WindowedValue(v, 0, (GlobalWindow(),)) for v in values]
        return SideInputMap(type(si), si._view_options(), self.side_values[si.pvalue])

    def _component(self, node) -> list:
        """The transforms not computed yet connected to `node` through main inputs (either way): one round
        computes them all, so none of them runs again for a later round or at the end."""
        neighbours = collections.defaultdict(set)
        for reader in self.fresh:
            for pc in _main_inputs(reader):
                if self.producer.get(pc) in self.fresh:
                    neighbours[reader].add(self.producer[pc])
                    neighbours[self.producer[pc]].add(reader)
        seen, todo = {node}, [node]
        while todo:
            for other in neighbours[todo.pop()] - seen:
                seen.add(other)
                todo.append(other)
        return [n for n in self.fresh if n in seen]

    def _round_size(self, node) -> int:
        """How many transforms the rounds for `node`'s unknown side inputs would compute."""
        return sum(len(self._component(self.producer[si.pvalue])) for si in node.side_inputs
                   if si.pvalue not in self.side_values and self.producer.get(si.pvalue) in self.fresh)

    def _round(self, component: list) -> None:
        """Compute `component` in one graph on the cluster (point 5), keeping only the outputs that a transform
        not built yet reads (or, for a transform other than a ParDo, that nothing reads: a leaf), and fetching
        every ParDo's metrics by value (point 6): asked for at the end, a partition lost with a worker would be
        recomputed, re-running a step such as a file sink's pre-finalize, which deletes the shards its finalize
        has already moved into place. A ParDo's output nothing reads is not kept: its metrics ran it."""
        keep = self._to_keep(component)
        pardos = [n for n in component if _is_pardo(n)]
        computed = self.client.persist([self.pcolls[pc] for pc in keep]
                                       + [_view(self.fresh[n], _METRICS) for n in pardos])
        for node, updates in zip(pardos, self.client.compute(computed[len(keep):], sync=True)):
            self.metric_values[node] = list(updates)
        for node in component:
            del self.fresh[node]
            for pc in node.outputs.values():
                self.pcolls.pop(pc, None)
        for pc, bag in zip(keep, computed):
            self.pcolls[pc] = bag
            self.kept.add(pc)

    def _to_keep(self, component: list) -> list:
        """The outputs of `component` its round keeps: those a transform not built yet reads, and those of a
        transform other than a ParDo that nothing reads."""
        return [pc for n in component for pc in n.outputs.values()
                if self.unbuilt_readers[pc] > 0 or (pc not in self.consumed and not _is_pardo(n))]

    def metrics(self) -> list:
        """The metrics bags of the ParDos not computed in a round (point 6)."""
        return [_view(bag, _METRICS) for node, bag in self.fresh.items() if _is_pardo(node)]

    def leaves(self) -> list:
        """Point 2: every bag nothing else reads (and every ParDo runs, through its metrics)."""
        return [bag for pc, bag in self.pcolls.items() if pc not in self.consumed and isinstance(bag, db.Bag)]


_OPS = {beam.ParDo: _ParDo, overrides._Create: _Create}  # our translations, before the stock ones


def _is_pardo(node) -> bool:
    return type(node.transform) is beam.ParDo


def _view(tagged_bag, tag):
    return tagged_bag.filter(functools.partial(_tagged, tag=tag)).map(_second)


class _LiftCombinePerKey(PTransformOverride):
    """Point 10: a CombinePerKey in the default windowing becomes a bundle-wise pre-combine, a GroupByKey
    and a final merge (Beam's LiftedCombinePerKey, the DirectRunner's translation)."""

    def matches(self, applied_ptransform) -> bool:
        return (isinstance(applied_ptransform.transform, beam.CombinePerKey)
                and applied_ptransform.inputs[0].windowing.is_default())

    def get_replacement_transform_for_applied_ptransform(self, applied_ptransform):
        transform = applied_ptransform.transform
        try:
            return LiftedCombinePerKey(transform.fn, transform.args, transform.kwargs)
        except NotImplementedError:  # 10 or more extra positional arguments: Beam does not lift it either
            return transform


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
    """Beam's DaskRunner with points 1-10 of the module docstring."""

    def run_pipeline(self, pipeline, options):
        import dask.distributed as ddist
        dask_options = options.view_as(stock.DaskOptions).get_all_options(drop_default=True, current_only=True)
        bag_kwargs = stock.DaskOptions._extract_bag_kwargs(dask_options)
        client = ddist.Client(**dask_options)
        try:  # side inputs are computed while the graph is built (point 5), so a bundle may fail here
            identity = check_workers_run_our_code(client)
            pipeline.replace_all([_LiftCombinePerKey()])  # before the stock ones replace its GroupByKey
            pipeline.replace_all(stock.dask_overrides())
            leaves = _Leaves()
            pipeline.visit(leaves)
            visitor = _Visitor(client, bag_kwargs, identity)
            visitor.build(leaves.nodes)
            metrics = visitor.metrics()
            futures = client.compute([*visitor.leaves(), *metrics])  # one graph: shared tasks run once
        except BaseException:
            client.close()  # else it reconnects for ever to a scheduler that may be gone
            raise
        return DaskRunnerResult(client, list(futures), len(metrics), list(visitor.metric_values.values()))
