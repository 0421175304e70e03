"""recpipe.serving.server.http_loop, the REST front end's transport, against raw sockets: order, limits, slow and
hostile clients (a small async app stands in for the REST routes, which tests/test_serving.py covers)."""
from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import pytest

from recpipe.serving.server.http_loop import HttpServer, Request, Response
from recpipe.serving.server.limits import MAX_HEAD_BYTES

pytestmark = pytest.mark.unit


class App:
    """Echoes method, path and body; `/slow` waits until `release` is set (on the loop, not a thread)."""

    def __init__(self):
        self.release = asyncio.Event()
        self.seen: list[Request] = []

    async def __call__(self, request: Request) -> Response:
        self.seen.append(request)
        if request.reject:
            return Response(request.reject[0], "text/plain", request.reject[1].encode())
        if request.path == "/slow":
            await self.release.wait()
        if request.path == "/bug":
            raise RuntimeError("a bug")
        return Response(200, "text/plain", f"{request.method} {request.path} {request.body.decode()}".encode())


@contextlib.contextmanager
def _served():
    """An HttpServer of App on a loopback port, its loop in a thread; stopped (and its loop seen to end) after."""
    app = App()
    server = HttpServer(app, "127.0.0.1", 0, threads=2, request_deadline_s=1.0, idle_timeout_s=1.5,
                        max_connections=4, max_body_bytes=1000)
    loop = threading.Thread(target=server.serve_forever, daemon=True)
    loop.start()
    try:
        yield server, app
    finally:
        server.shutdown()
        loop.join(10)
    assert not loop.is_alive()


def _connect(server) -> socket.socket:
    s = socket.create_connection(server.server_address, timeout=10)
    return s


def _read_all(s: socket.socket) -> bytes:
    """Until the server closes the connection."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def _responses(data: bytes) -> list[tuple[int, dict, bytes]]:
    out = []
    while data:
        head, data = data.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        n = int(headers["Content-Length"])
        out.append((int(lines[0].split()[1]), headers, data[:n]))
        data = data[n:]
    return out


def _read_responses(s: socket.socket, count: int) -> list[tuple[int, dict, bytes]]:
    data = b""
    while True:
        try:
            got = _responses(data)
        except (ValueError, KeyError):
            got = []
        if len(got) == count and sum(len(b) for *_, b in got) == sum(int(h["Content-Length"]) for _, h, _ in got):
            return got
        chunk = s.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk


def test_pipelined_requests_are_answered_in_order_on_one_connection():
    with _served() as (server, app):
        s = _connect(server)
        s.sendall(b"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /b HTTP/1.1\r\n\r\n"
                  b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nxy\r\n1\r\nz\r\n0\r\n\r\n")
        got = _read_responses(s, 3)
        assert [b for *_, b in got] == [b"POST /a abc", b"GET /b ", b"POST /c xyz"]
        assert all(code == 200 and "Connection" not in h and h["Date"] for code, h, _ in got)
        s.sendall(b"GET /d HTTP/1.0\r\n\r\n")  # HTTP/1.0 without keep-alive: answered, then closed
        (code, headers, body), = _responses(_read_all(s))
        assert (code, body, headers["Connection"]) == (200, b"GET /d ", "close")


def test_a_slow_request_does_not_hold_up_other_connections():
    with _served() as (server, app):
        slow, fast = _connect(server), _connect(server)
        slow.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
        fast.sendall(b"GET /fast HTTP/1.1\r\n\r\n")
        assert _read_responses(fast, 1)[0][2] == b"GET /fast "
        server.loop.call_soon_threadsafe(app.release.set)
        assert _read_responses(slow, 1)[0][2] == b"GET /slow "


@pytest.mark.parametrize("request_bytes, status", [
    (b"POST /p HTTP/1.1\r\n\r\n", 411),                                          # no Content-Length
    (b"POST /p HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", 413),                   # declared over the cap
    (b"POST /p HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n" + b"x" * 1001 + b"\r\n0\r\n\r\n", 413),
    (b"GET /h HTTP/1.1\r\nX-Big: " + b"y" * MAX_HEAD_BYTES + b"\r\n\r\n", 431),
    (b"POST /p HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 400),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),                        # TLS to a plain port
])
def test_requests_over_a_limit_or_malformed_get_a_status_and_the_connection_closes(request_bytes, status):
    with _served() as (server, app):
        s = _connect(server)
        s.sendall(request_bytes)
        (code, headers, body), = _responses(_read_all(s))
        assert code == status and headers["Connection"] == "close" and body, body
        assert app.seen[-1].reject[0] == status  # the app answered it (and counts it)


def test_an_upgrade_request_is_answered_plainly_and_the_connection_closed():
    with _served() as (server, _):
        s = _connect(server)
        s.sendall(b"GET /u HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n\x81\x85frame")
        (code, headers, body), = _responses(_read_all(s))
        assert (code, body, headers["Connection"]) == (200, b"GET /u ", "close")


def test_expect_100_continue_is_answered_before_the_body():
    with _served() as (server, _):
        s = _connect(server)
        s.sendall(b"POST /e HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        s.sendall(b"ok")
        assert _read_responses(s, 1)[0][2] == b"POST /e ok"


def test_an_app_error_is_a_500_not_a_hanging_connection():
    with _served() as (server, _):
        s = _connect(server)
        s.sendall(b"GET /bug HTTP/1.1\r\n\r\n")
        (code, headers, _), = _responses(_read_all(s))
        assert code == 500 and headers["Connection"] == "close"


def test_connections_over_the_cap_get_503_and_slow_or_idle_ones_are_closed():
    with _served() as (server, _):
        held = [_connect(server) for _ in range(4)]
        held[0].sendall(b"GET /a HTTP/1.1\r\n\r\n")
        _read_responses(held[0], 1)  # all four accepted
        extra = _connect(server)
        (code, headers, _), = _responses(_read_all(extra))
        assert code == 503 and headers["Connection"] == "close"
        held[1].sendall(b"POST /p HTTP/1.1\r\nContent-Length: 5\r\n\r\nab")  # never finished: the 1 s deadline
        t0 = time.monotonic()
        assert _read_all(held[1]) == b""
        assert time.monotonic() - t0 < 3
        for s in held[2:]:  # idle with nothing in flight: 1.5 s
            assert _read_all(s) == b""
        assert len(server.connections) <= 1


def test_shutdown_before_or_without_serving_closes_the_socket():
    server = HttpServer(App(), "127.0.0.1", 0, threads=1, request_deadline_s=1.0, idle_timeout_s=1.0,
                        max_connections=4, max_body_bytes=10)
    address = server.server_address
    server.shutdown()
    server.serve_forever()  # returns at once: the server was shut down first
    server.shutdown()       # and a second shutdown is harmless
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=5)
