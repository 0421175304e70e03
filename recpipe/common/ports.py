"""Free TCP ports on 127.0.0.1 for the processes the project starts itself (a model server, a local PS cluster)."""
from __future__ import annotations

import socket

__all__ = ["free_ports"]


def free_ports(n: int) -> list[int]:
    """n distinct ports free right now: all n sockets are held open while the kernel picks, so two calls in a row
    cannot hand out the same port (a server's REST and gRPC ports picked one at a time can come out equal, and
    the server then fails to bind the second)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
