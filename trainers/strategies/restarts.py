"""Restarts without a human (--max-restarts N, as torchrun's): a job that a lost PS task, rank or host stops
starts again from its last checkpoint, up to N times.

A Horovod launcher already runs apart from its ranks, so it restarts them itself (hvd_job.launch_job). The
coordinator of a PS job is the training process: its TensorFlow runtime cannot reconnect to a PS task that
came back, so `recpipe train --strategy ps --max-restarts N` runs each attempt as a child `recpipe train`
and starts another when one ends in a job fault (it exits FAULT_EXIT) or is killed by a signal. The child
waits for every task to serve (--cluster-wait-seconds) and resumes from the checkpoint, so the run completes
with the steps asked for. No TensorFlow here: the supervising process never imports it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Callable, Sequence

from recpipe.trainers.errors import how_it_ended
from recpipe.trainers.strategies.tf_config import tf_config

__all__ = ["ATTEMPT_ENV", "FAULT_EXIT", "fault_exit_code", "supervises_attempts", "run_attempts"]

ATTEMPT_ENV = "RECPIPE_TRAIN_ATTEMPT"  # set in an attempt that a supervising `recpipe train` started
FAULT_EXIT = 75  # EX_TEMPFAIL: how such an attempt exits when a job fault stopped it


def fault_exit_code() -> int:
    """The exit code of a process that a job fault stopped: FAULT_EXIT in a supervised attempt (its supervisor
    starts the next), 1 otherwise."""
    return FAULT_EXIT if ATTEMPT_ENV in os.environ else 1


def supervises_attempts(strategy: str, max_restarts: int) -> bool:
    """Whether this `recpipe train` supervises attempts: the coordinator (the chief of TF_CONFIG, or the
    starter of a local cluster) of a PS job with restarts, not itself an attempt. A PS or worker task is
    restarted by its cluster manager, and Horovod's launcher restarts its ranks itself.

    Raises:
        TrainError: a TF_CONFIG that cannot be read, naming the key.
    """
    if strategy != "ps" or max_restarts == 0 or ATTEMPT_ENV in os.environ:
        return False
    cluster = tf_config()
    return cluster is None or cluster.task_type == "chief"


def run_attempts(argv: Sequence[str], max_restarts: int, say: Callable[[str], None]) -> int:
    """Run `recpipe *argv` as attempts until one succeeds, fails on its inputs, or max_restarts are spent.

    Args:
        argv: the `recpipe` arguments of every attempt (the supervisor's own).
        max_restarts: how many attempts may follow the first after a job fault.
        say: where the restarts are reported.

    Returns:
        The exit code: 0 once an attempt completes, else the last attempt's (1 for a job fault or a signal).
    """
    attempt = 0
    while True:
        proc = subprocess.Popen([sys.executable, "-m", "recpipe.cli", *argv],
                                env=dict(os.environ, **{ATTEMPT_ENV: str(attempt)}))
        code, stopped = _wait_forwarding_signals(proc)
        if code == 0:
            return 0
        if stopped or not (code == FAULT_EXIT or code < 0):
            return code if code > 0 else 128 - code
        if attempt >= max_restarts:
            say(f"train: no restart left (--max-restarts {max_restarts}); the job stops")
            return 1
        attempt += 1
        how = "stopped by the fault above" if code == FAULT_EXIT else how_it_ended(code)
        say(f"train: restart {attempt} of {max_restarts} (the attempt was {how}): resuming from the last "
            f"checkpoint once every task serves")


def _wait_forwarding_signals(proc: subprocess.Popen) -> tuple[int, bool]:
    """(proc's exit code, whether the supervisor was stopped meanwhile): SIGTERM and SIGINT are passed on to
    it (a cluster manager stopping the supervisor stops the attempt, which is then not restarted)."""
    stopped = []

    def forward(signum, _frame):
        stopped.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait(), bool(stopped)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
