"""Free TCP ports on 127.0.0.1 for the processes the project starts itself (a model server, a local PS cluster)."""
from __future__ import annotations

import errno
import socket
from typing import Optional

__all__ = ["free_ports", "bind_error"]


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


def bind_error(what: str, host: str, port: int, cause: Optional[OSError] = None) -> OSError:
    """The one-line error of a server that could not listen on host:port.

    Args:
        what: the listener, as the message names it ("REST", "gRPC").
        host: the address it tried to bind.
        port: the port it tried to bind.
        cause: the bind's own error; None when the library that failed did not say why (gRPC), which
            is then found by binding the address once more here.

    Returns:
        An OSError whose message names the port and says whether another process holds it.
    """
    if cause is None:
        try:
            socket.create_server((host, port)).close()
        except OSError as e:
            cause = e
    if cause is not None and cause.errno == errno.EADDRINUSE:
        return OSError(f"{what} port {port} on {host} is already in use (another server listens there; give a free "
                       f"port, or 0 for any)")
    reason = f": {cause.strerror or cause}" if cause is not None else ""
    return OSError(f"cannot listen for {what} on {host}:{port}{reason}")
