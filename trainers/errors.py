"""Errors of training: a bad option, model dir or data folder, named in the message."""
from features.errors import RecpipeError

__all__ = ["TrainError"]


class TrainError(RecpipeError, ValueError):
    pass
