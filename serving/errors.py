"""The model server's request error, shared by the registry, the APIs and the warmup replay."""
from __future__ import annotations

from recpipe.common.errors import RecpipeError

__all__ = ["RequestError"]


class RequestError(RecpipeError, ValueError):
    """The client sent something the model cannot take (HTTP 400 / gRPC INVALID_ARGUMENT)."""
