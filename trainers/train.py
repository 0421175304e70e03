"""`recpipe train`: one trainer, three strategies (local, ParameterServerStrategy, Horovod), the same
model dir layout (recpipe.trainers.model_dir) and checkpoints that restore into each other.

Local and PS run Keras' model.fit in epochs of `checkpoint_every` steps (a checkpoint at each end);
Horovod runs its own loop (recpipe.trainers.strategies.hvd). Rerunning on a model dir resumes from its last checkpoint.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Callable, Optional

import tensorflow as tf

from recpipe.features.artifact import TransformArtifact
from recpipe.features.config import Config
from recpipe.common.errors import RecpipeError
from recpipe.features.preprocessed import PreprocessedData
from recpipe.trainers.advisor import advise
from recpipe.trainers.allocator import loaded_allocator
from recpipe.trainers.data import DataError, SameCopyCheck, make_dataset, naming_bad_shards, synthetic_dataset
from recpipe.trainers.data_copy import check_whole_copy
from recpipe.trainers.errors import JobFault, TrainError
from recpipe.trainers.health import check_loss
from recpipe.trainers.strategies.hvd import run_rank
from recpipe.trainers.strategies.hvd_job import launch_job, launch_ranks, launches_ranks, writer_lock
from recpipe.trainers.memory import Holders, check_memory, holders_on_this_host
from recpipe.trainers.model_dir import ModelDir, TrainState
from recpipe.trainers.models import compiled_model, table_shapes
from recpipe.trainers.optim import optimizer_for, precision_policy
from recpipe.trainers.options import TrainOptions
from recpipe.trainers.prepare import prepare_run
from recpipe.trainers.progress import Reporter
from recpipe.trainers.item_to_item_fit import fit_item_to_item
from recpipe.trainers.selection import requested_config, select, serves_the_chief
from recpipe.trainers.strategies.ps import LocalPSCluster, make_strategy, serve_task
from recpipe.trainers.strategies.ps_placement import bytes_by_task, state_line
from recpipe.trainers.strategies.restarts import fault_exit_code
from recpipe.trainers.strategies.ps_tasks import Task, TaskWatch, silent_tasks, task_names, wait_for_tasks
from recpipe.trainers.strategies.tf_config import PSCluster, TFConfig, tf_config
from recpipe.trainers.evaluation.validation import Validator, validator_for
from recpipe.trainers.warm_start import apply_warm_start

__all__ = ["TrainError", "TrainOptions", "TrainState", "train", "set_threads", "steps_per_execution",
           "LOCAL_STEPS_PER_EXECUTION"]


def train(opts: TrainOptions, say: Callable[[str], None] = print) -> TrainState:
    """Train (or resume) the model of `opts`; with model.type auto, the candidates and keep the best
    (recpipe.trainers.selection); item_to_item is fitted in closed form (recpipe.trainers.item_to_item).

    Args:
        opts: the train options.
        say: progress.

    Returns:
        The TrainState of the model left in opts.model_dir.

    Raises:
        TrainError, DataError, ConfigError, JobFault: the run cannot go on; the message names why.
    """
    selected = select(opts, say, lambda one: train(one, say))
    if selected is not None:
        return selected
    if not serves_the_chief(opts) and requested_config(opts).model.type == "item_to_item":  # closed form, here
        with naming_bad_shards(opts.data_dir), writer_lock(opts):
            return fit_item_to_item(opts, say)
    if launches_ranks(opts.run):  # `recpipe train` calls recpipe.trainers.strategies.hvd_job itself, before importing TensorFlow
        return launch_job(opts, say)
    with naming_bad_shards(opts.data_dir), writer_lock(opts):
        return _train(opts, say)


def _check_worker_copy(data_dir: str, cluster: TFConfig) -> None:
    """A PS worker reads the shards on its own host, at the chief's paths, and the chief checks only its own
    copy: a worker whose copy is cut short at a record's end would read fewer rows without a word (its graph
    checks the shards' names, since a graph has no file-size op). So a worker checks its copy whole before it serves,
    and one that cannot stops naming itself and the copy."""
    try:
        check_whole_copy(PreprocessedData(data_dir))
    except DataError as e:
        address = cluster.cluster.spec()[cluster.task_type][cluster.task_index]
        raise DataError(f"PS {cluster.task_type} {cluster.task_index} ({address}): {e}") from None


def _train(opts: TrainOptions, say: Callable[[str], None]) -> TrainState:
    cluster = tf_config() if opts.run.strategy == "ps" else None
    if cluster is not None and cluster.task_type != "chief":  # a TFJob runs one command in every replica
        if cluster.task_type == "ps":
            _check_ps_task_memory(opts, len(cluster.cluster.ps), say)
        elif not opts.synthetic_input:
            _check_worker_copy(opts.data_dir, cluster)
        say(f"train: serving PS-cluster task {cluster.task_type} {cluster.task_index} until killed")
        serve_task(cluster.cluster.spec(), cluster.task_type, cluster.task_index, opts.run.ps_task_threads)
    prepared = prepare_run(opts, say)
    cfg, artifact, total = prepared.cfg, prepared.artifact, prepared.total
    run = opts.run
    set_threads(run.threads or cfg.train.tuning.intra_op_threads, run.threads or cfg.train.tuning.inter_op_threads)
    if run.strategy == "auto":
        advice = advise(cfg, artifact, opts.data_dir, workers=run.np, ps_tasks=run.ps_servers)
        for line in advice.table().splitlines():
            say(line.replace("advise:", "train: advisor:", 1))
        opts = dataclasses.replace(opts, run=dataclasses.replace(run, strategy=advice.strategy))
        if launches_ranks(opts.run):  # the advisor picked Horovod for --np ranks
            return launch_ranks(opts, prepared, say, None)
    holders = holders_on_this_host(opts.run, cluster is not None)
    if holders is not None:
        check_memory(cfg, artifact, holders, say)
    if opts.run.strategy == "horovod":  # a rank of a job, or one alone
        return run_rank(cfg, artifact, opts, total, say)
    if opts.run.strategy == "local":
        return _fit(cfg, artifact, opts, total, tf.distribute.get_strategy(), say)
    if cluster is not None:
        c = cluster.cluster
        say(f"train: PS cluster from TF_CONFIG: chief {c.chief}, {len(c.workers)} workers, {len(c.ps)} PS")
        wait_for_tasks(c, run.cluster_wait_seconds, say)
        same_copy = None if opts.synthetic_input else SameCopyCheck(opts.data_dir)
        return _fit_on_ps(cfg, artifact, opts, total, c, say, same_copy=same_copy)
    with LocalPSCluster(run.ps_workers, run.ps_servers, run.ps_task_threads, say=say) as local:
        return _fit_on_ps(cfg, artifact, opts, total, local.cluster, say, local=local)


def _fit_on_ps(cfg: Config, artifact: TransformArtifact, opts: TrainOptions, total: int, cluster: PSCluster,
               say: Callable[[str], None], same_copy: Optional[SameCopyCheck] = None,
               local: Optional[LocalPSCluster] = None) -> TrainState:
    """_fit on a PS cluster (a TF_CONFIG one, or `local` started by this process), with its tasks watched
    (a task whose host is cut off is declared after --task-timeout-seconds) and TensorFlow's errors named: a
    worker's copy check, a PS task lost (e.g. "UnavailableError: 0 derived errors ignored. [Op:Identity]
    name:" or a "Connection reset by peer" at the next checkpoint, naming no task)."""
    model_dir = ModelDir(opts.model_dir)

    def lost_error(lost: list[Task], how: str) -> JobFault:
        # A PS task holds its share of the variables in memory: the job cannot go on without them. A local
        # cluster is started anew by the rerun; a TF_CONFIG cluster's task by its cluster manager.
        restart = "" if local is not None else "once it serves again (its cluster manager restarts it), "
        cause = f"{task_names(lost)} {how}"
        return JobFault(str(model_dir.stopped(
            cause, f"a PS task holds its share of the variables in memory and cannot rejoin; {restart}")), cause)

    def stuck(lost: list[Task]) -> None:  # the watch's thread: the coordinator's RPCs did not fail in time
        sys.stdout.flush()
        print(f"recpipe train: error: {lost_error(lost, 'is cut off')}", file=sys.stderr, flush=True)
        os._exit(fault_exit_code())

    watch = TaskWatch(cluster, opts.run.task_timeout_seconds, say, on_stuck=stuck)
    # set before the job runs: the executors may be collected while the error unwinds, before it is caught below
    sys.unraisablehook = _quiet_lost_rpcs(sys.unraisablehook, lambda: bool(watch.lost_ps))
    try:
        with watch:
            return _fit(cfg, artifact, opts, total, make_strategy(cluster, table_shapes(cfg, artifact)), say,
                        same_copy)
    except Exception as e:
        other_copy = same_copy.error(e, cluster.workers) if same_copy is not None else None
        if other_copy is not None:
            raise other_copy from None
        if not isinstance(e, tf.errors.OpError):
            raise
        if watch.lost_ps:
            raise lost_error(watch.lost_ps, "is cut off") from e
        lost = local.dead_ps(grace=5.0) if local is not None else silent_tasks(cluster)
        if not lost:
            raise
        raise lost_error(lost, "died" if local is not None else "does not answer") from e


def _quiet_lost_rpcs(hook: Callable, lost: Callable[[], bool]) -> Callable:
    """`hook` but for TensorFlow's executors failing their pending RPCs as they are collected once `lost()` says
    a task of the job is lost (an "Exception ignored in: Executor.__del__" traceback beside the named error)."""
    def unraisable(info) -> None:
        if not (lost() and isinstance(info.exc_value, tf.errors.OpError)):
            hook(info)
    return unraisable


def _check_ps_task_memory(opts: TrainOptions, num_ps: int, say: Callable[[str], None]) -> None:
    """A PS task of a TF_CONFIG cluster checks its share of the tables against its own host before it serves:
    short of memory, it would be killed when the chief creates the variables, in words on no host."""
    try:
        cfg, artifact = ModelDir(opts.model_dir).resolve_config(PreprocessedData(opts.data_dir), opts.config_path)
    except (RecpipeError, OSError) as e:
        say(f"train: note: this PS task cannot read the config or data ({e}); its memory is not checked")
        return
    check_memory(cfg, artifact, Holders.ps_task(num_ps), say)


def set_threads(intra: int, inter: int) -> None:
    """TensorFlow's thread pools; they can be set only before TensorFlow's runtime starts."""
    for n, setter, getter in ((intra, tf.config.threading.set_intra_op_parallelism_threads,
                               tf.config.threading.get_intra_op_parallelism_threads),
                              (inter, tf.config.threading.set_inter_op_parallelism_threads,
                               tf.config.threading.get_inter_op_parallelism_threads)):
        if n and getter() != n:
            try:
                setter(n)
            except RuntimeError as e:  # the runtime already started in this process (e.g. in tests)
                raise TrainError(f"threads={n}: TensorFlow is already initialised in this process ({e}); "
                                 f"set it in a fresh `recpipe train`") from None


class _Checkpoints(tf.keras.callbacks.Callback):
    """A checkpoint and a progress report at each epoch end (an epoch = `checkpoint_every` steps),
    and the bar per step. Under ParameterServerStrategy batch-level hooks are not allowed (they
    would sync every step), so there the bar moves once per epoch."""

    def __init__(self, manager: tf.train.CheckpointManager, reporter: Reporter, per_batch: bool,
                 check: Callable[[float, int], None], validator: Validator | None = None):
        super().__init__()
        self.manager, self.reporter, self.check, self.validator = manager, reporter, check, validator
        self.per_batch = per_batch
        self.step = self._epoch_start = reporter.start
        self.last_logs: dict = {}
        self._supports_tf_logs = True  # the bar never reads the logs, so Keras need not fetch them
        if per_batch and reporter.bar.enabled:
            self.on_train_batch_end = self._batch_end

    def _batch_end(self, batch, logs=None):
        # Keras calls this once per dispatched call, with the epoch's index of its last step
        self.step = self._epoch_start + batch + 1
        self.reporter.batch(self.step)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self.step

    def on_epoch_end(self, epoch, logs=None):
        step = self.step = self._counted_step()
        self.reporter.interval_end(step)
        self.last_logs = {k: _scalar(v) for k, v in (logs or {}).items()}
        self.check(self.last_logs.get("loss", math.nan), step)  # a non-finite loss is never saved
        self.manager.save(checkpoint_number=step)
        self.reporter.interval(step, self.last_logs.get("loss", math.nan), self.last_logs.get("auc"))
        if self.validator is not None and self.validator(step, self.manager.latest_checkpoint):
            self.model.stop_training = True


    def _counted_step(self) -> int:
        """The step at an epoch's end. Locally, the optimizer's count. Under ParameterServerStrategy the
        coordinator re-runs a step whose worker was lost, and one that had already applied its update
        before the worker went applies it twice, so the optimizer counts past the steps the loop ran (step
        601 of 600, ckpt-401): there the count is the steps scheduled, and the optimizer's is set to it."""
        applied = int(self.model.optimizer.iterations.numpy())
        if self.per_batch:
            return applied
        step = self._epoch_start + int(self.params["steps"])
        if applied != step:
            self.model.optimizer.iterations.assign(step)
            self.reporter.note(f"train: note: {applied - step:+d} update(s) beyond the {step} steps run (a step "
                               f"re-run after its worker was lost); counting {step}")
        return step


def _ps_state_line(model: tf.keras.Model) -> str:
    """The MB of variables and optimizer slots each PS task holds (recpipe.trainers.strategies.ps_placement)."""
    seen, pairs = set(), []
    for v in [*model.variables, *model.optimizer.variables]:
        for part in getattr(v, "variables", None) or [v]:  # a ShardedVariable's shards, each on its task
            if id(part) not in seen:
                seen.add(id(part))
                pairs.append((part.device, part.shape.num_elements() * part.dtype.size))
    return state_line(bytes_by_task(pairs))


def _scalar(v) -> float:
    """A log value as a float; under ParameterServerStrategy logs are RemoteValues to fetch."""
    if hasattr(v, "fetch"):
        v = v.fetch()
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


# Steps per dispatched call when train.tuning.steps_per_execution is 0 (the default), outside
# ParameterServerStrategy: Keras then loops over them inside one compiled function, so the Python of its
# fit loop and of the function call runs once per 100 steps, not at every step (bench/results/embedding.md)
LOCAL_STEPS_PER_EXECUTION = 100


def steps_per_execution(cfg: Config, ps: bool) -> int:
    """How many steps Keras runs per dispatched call.

    Args:
        cfg: the config (train.tuning.steps_per_execution; 0 lets recpipe choose).
        ps: whether the job runs under ParameterServerStrategy.

    Returns:
        The config's value when set; else 1 under ParameterServerStrategy, where each call is a closure the
        coordinator runs again whole on another worker when its worker is lost (so a lost worker re-applies at
        most one step), and LOCAL_STEPS_PER_EXECUTION otherwise.
    """
    chosen = cfg.train.tuning.steps_per_execution
    return chosen or (1 if ps else LOCAL_STEPS_PER_EXECUTION)


def _fit(cfg: Config, artifact: TransformArtifact, opts: TrainOptions, total: int,
         strategy: tf.distribute.Strategy, say: Callable[[str], None], same_copy: Optional[SameCopyCheck] = None
         ) -> TrainState:
    """model.fit under `strategy`; `same_copy`: for a PS cluster of other hosts, whose workers read the
    data at the chief's paths, each worker's dataset first checks it reads the chief's copy."""
    ps = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)
    model_dir = ModelDir(opts.model_dir)
    validator = None if opts.synthetic_input else validator_for(cfg, artifact, opts.data_dir, model_dir, say)
    with precision_policy(opts.run.precision):
        tf.keras.utils.set_random_seed(cfg.train.seed)
        with strategy.scope():
            model = compiled_model(cfg, artifact, optimizer_for(cfg, own_step=True, shared=ps),
                                   steps_per_execution(cfg, ps))
        if ps:
            say(_ps_state_line(model))
        ckpt, manager = model_dir.checkpoint(model)
        start = 0
        resumed = model_dir.resume(ckpt, say)
        if resumed:
            start = int(model.optimizer.iterations.numpy())
            say(f"train: resuming from {resumed} at step {start}")
        elif opts.warm_start:
            apply_warm_start(model, cfg, artifact, opts.warm_start, say)
        if start >= total or (validator is not None and validator.stopped):
            why = f"stopped early at step {start}" if start < total else f"trained {start} >= {total} steps"
            say(f"train: already {why}; nothing to do")
            return TrainState.unchanged(start, opts.run.strategy, opts.run.precision, cfg.train.batch_size,
                                        opts.data_dir)

        remaining = total - start
        every = min(cfg.train.checkpoint_every, remaining)
        seed = cfg.train.seed + start
        sizes = {f.name: artifact.id_space_size(f) for f in cfg.features.sparse}

        def dataset_fn(input_context=None):
            if opts.synthetic_input:
                return synthetic_dataset(cfg, sizes, cfg.train.batch_size, seed)
            if same_copy is not None:  # run by each worker as it makes its dataset, on its own host's files
                same_copy.in_graph()
            return make_dataset(cfg, opts.data_dir, "train", cfg.train.batch_size, training=True,
                                input_context=input_context, seed=seed)

        data = tf.keras.utils.experimental.DatasetCreator(dataset_fn) if ps else dataset_fn()
        reporter = Reporter(say, total, start, cfg.train.batch_size)
        checkpoints = _Checkpoints(manager, reporter, per_batch=not ps,
                                   check=lambda loss, step: check_loss(loss, step, cfg, opts.data_dir),
                                   validator=validator)
        tensorboard = tf.keras.callbacks.TensorBoard(model_dir.logs_dir, update_freq="epoch", write_graph=False,
                                                     profile_batch=0)
        # Epochs of `every` steps (a checkpoint at each end), then one short epoch for the rest.
        model.fit(data, steps_per_epoch=every, epochs=remaining // every, verbose=0,
                  callbacks=[checkpoints, tensorboard])
        if remaining % every and not (validator is not None and validator.stopped):
            model.fit(data, steps_per_epoch=remaining % every, epochs=1, verbose=0,
                      callbacks=[checkpoints, tensorboard])
        reporter.close()
        done = int(model.optimizer.iterations.numpy())
        if validator is not None and validator.still_improving(done):
            h = validator.history
            say(f"train: note: validation {h.metric} still improved at the last step, {done} ({h.best:.4f}); the run "
                f"ended at its step cap (train.steps), so more steps may help")
        if manager.latest_checkpoint is None or not manager.latest_checkpoint.endswith(f"-{done}"):
            manager.save(checkpoint_number=done)
        overall, steady = reporter.rates(done)
        state = TrainState(done, done - start, start, overall, steady, checkpoints.last_logs.get("loss", math.nan),
                           opts.run.strategy, opts.run.precision, cfg.train.batch_size,
                           data_dir=PreprocessedData(opts.data_dir).root,
                           best_step=validator.history.best_step if validator is not None else None,
                           allocator=loaded_allocator())
        model_dir.write_state(state)
        return state
