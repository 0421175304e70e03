"""Errors of training: a bad option, model dir or data folder, named in the message; a dead task's exit
status in words."""
import signal

from recpipe.common.errors import RecpipeError

__all__ = ["TrainError", "how_it_ended"]


class TrainError(RecpipeError, ValueError):
    pass


def how_it_ended(code: int) -> str:
    """An exit status in words: a signal's name, or the exit code."""
    signum = -code if code < 0 else code - 128 if 128 < code < 160 else None
    if signum:
        try:
            return f"killed by {signal.Signals(signum).name}"
        except ValueError:
            pass
    return f"exit code {code}"
