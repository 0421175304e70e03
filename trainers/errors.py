"""Errors of training: a bad option, model dir or data folder, named in the message; a dead task's exit
status in words."""
from __future__ import annotations

import signal

from recpipe.common.errors import RecpipeError

__all__ = ["TrainError", "JobFault", "how_it_ended"]


class TrainError(RecpipeError, ValueError):
    pass


class JobFault(TrainError):
    """A job stopped by a fault of its cluster (a PS task, rank or host lost), not by its inputs: a launcher
    with restarts left (--max-restarts) starts it again from its last checkpoint.

    Args:
        message: the whole error: what was lost, and what a rerun does.
        cause: what was lost alone (default: the message).
    """

    def __init__(self, message: str, cause: str | None = None):
        super().__init__(message)
        self.cause = cause or message


def how_it_ended(code: int) -> str:
    """An exit status in words: a signal's name, or the exit code."""
    signum = -code if code < 0 else code - 128 if 128 < code < 160 else None
    if signum:
        try:
            return f"killed by {signal.Signals(signum).name}"
        except ValueError:
            pass
    return f"exit code {code}"
