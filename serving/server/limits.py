"""The REST server's limits and timeouts (constants only: the docs' guarantees table is generated from them)."""

__all__ = ["MAX_BODY_BYTES", "MAX_HEAD_BYTES", "REQUEST_DEADLINE_S", "IDLE_TIMEOUT_S", "MAX_CONNECTIONS"]

MAX_BODY_BYTES = 16 * 1024 * 1024  # a larger body, declared or arriving chunked: 413
MAX_HEAD_BYTES = 64 * 1024         # request line + headers: 431 beyond
REQUEST_DEADLINE_S = 30.0          # a request must arrive whole within this long after its first byte
IDLE_TIMEOUT_S = 120.0             # keep-alive connections with nothing in flight are closed after this
MAX_CONNECTIONS = 1000             # the next connection is answered 503
