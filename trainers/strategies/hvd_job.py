"""`recpipe train --strategy horovod` as the launcher of its ranks (--np N > 1 on this host, or this host's
ranks of a job over --hosts). It prepares the model dir, checks this host's copy of the data and its memory,
starts the ranks and reports how they ended, all without TensorFlow: each rank imports it, and the
launcher's own import would cost about 3 s of CPU and 550 MB of RSS, held while its ranks train."""
from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Callable, Optional

from recpipe.trainers.errors import JobFault, TrainError
from recpipe.trainers.strategies.hvd_hosts import HostJob, host_job
from recpipe.trainers.strategies.hvd_launch import inside_horovod_job, launch
from recpipe.trainers.strategies.tf_config import tf_config
from recpipe.trainers.memory import check_memory, holders_on_this_host
from recpipe.trainers.model_dir import ModelDir, TrainState
from recpipe.trainers.options import RunOptions, TrainOptions
from recpipe.trainers.prepare import PreparedRun, prepare_run

__all__ = ["launches_ranks", "launch_ranks", "launch_job", "writer_lock"]


def launches_ranks(run: RunOptions) -> bool:
    """Whether this process starts Horovod ranks rather than being one (a rank alone, --np 1, needs no launcher:
    hvd.init() gives size 1)."""
    return run.strategy == "horovod" and not inside_horovod_job() and (run.hosts is not None or run.np > 1)


def launch_ranks(opts: TrainOptions, prepared: PreparedRun, say: Callable[[str], None],
                 hosts: Optional[HostJob]) -> TrainState:
    """Start the ranks, once this host's memory can hold a copy of the tables for each: this host's of a
    job over --hosts (`hosts`, host_job's), or --np on this host."""
    check_memory(prepared.cfg, prepared.artifact, holders_on_this_host(opts.run, False), say)
    if opts.run.hosts:
        if hosts is None:
            raise TrainError("--hosts: launch inside recpipe.trainers.strategies.hvd_hosts.host_job (as launch_job does)")
        return hosts.launch(opts, prepared.total)
    return launch(opts, say)


def launch_job(opts: TrainOptions, say: Callable[[str], None]) -> TrainState:
    """The whole launcher: this host's part of a job over --hosts (the first host's rendezvous server, or
    waiting for it) around preparing the run and starting the ranks, so a host that stops before starting
    its ranks tells the others why. A rank lost (a JobFault, on any host) starts the job again from its last
    checkpoint, up to --max-restarts times: every host's launcher restarts its own ranks, and the first host
    serves a new rendezvous.

    Raises:
        TrainError: a host's inputs stopped the job, or it was stopped by more faults than --max-restarts.
    """
    restarts, previous = 0, None
    while True:
        hosts = None
        try:
            with host_job(opts.run, say, previous) as hosts, writer_lock(opts):
                return launch_ranks(opts, prepare_run(opts, say), say, hosts)
        except JobFault as e:
            if restarts >= opts.run.max_restarts:
                raise
            restarts += 1
            previous = hosts
            say(f"train: restart {restarts} of {opts.run.max_restarts} (--max-restarts) after {e.cause}: resuming "
                f"from rank 0's last checkpoint")


def writer_lock(opts: TrainOptions) -> AbstractContextManager:
    """The model dir's writer lock for the process that writes it: a local run, the chief of a PS cluster,
    a Horovod launcher on the first host (or alone), a Horovod rank alone. A rank inside a job, a launcher of
    another host (which may share the first host's --model-dir) and the other tasks of a PS cluster write
    no checkpoint and take no lock.

    Args:
        opts: the run's options.

    Returns:
        ModelDir(opts.model_dir).writer_lock(), or a context manager that does nothing.

    Raises:
        TrainError: --strategy ps with a TF_CONFIG that cannot be read, naming the key.
    """
    run = opts.run
    cluster = tf_config() if run.strategy == "ps" else None
    if inside_horovod_job() or (run.hosts and run.host_index != 0) or (cluster and cluster.task_type != "chief"):
        return contextlib.nullcontext()
    return ModelDir(opts.model_dir).writer_lock()
