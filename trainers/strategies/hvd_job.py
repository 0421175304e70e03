"""`recpipe train --strategy horovod` as the launcher of its ranks (--np N > 1 on this host, or this host's
ranks of a job over --hosts). It prepares the model dir, checks this host's copy of the data and its memory,
starts the ranks and reports how they ended, all without TensorFlow: each rank imports it, and the
launcher's own import would cost about 3 s of CPU and 550 MB of RSS, held while its ranks train."""
from __future__ import annotations

from typing import Callable, Optional

from recpipe.trainers.errors import TrainError
from recpipe.trainers.strategies.hvd_hosts import HostJob, host_job
from recpipe.trainers.strategies.hvd_launch import inside_horovod_job, launch
from recpipe.trainers.memory import check_memory, holders_on_this_host
from recpipe.trainers.model_dir import TrainState
from recpipe.trainers.options import RunOptions, TrainOptions
from recpipe.trainers.prepare import PreparedRun, prepare_run

__all__ = ["launches_ranks", "launch_ranks", "launch_job"]


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
    its ranks tells the others why."""
    with host_job(opts.run, say) as hosts:
        return launch_ranks(opts, prepare_run(opts), say, hosts)
