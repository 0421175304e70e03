"""An HTTP/1.1 server on one event loop (uvloop when installed), parsing with httptools (llhttp, in C).

The REST front end's transport: the loop thread reads, parses and answers every connection, and hands
each complete request to an async application. Nothing about TF Serving lives here (recpipe.serving.server.rest).

Why a loop and not a thread per request: a request's Python work is short (JSON, validation) and the
model call happens on another thread (the batcher, or the executor); threads that each take the GIL
for a moment wait far longer for it than they work (`recpipe bench serve` measures both).

Limits, each answered or cut off, never a silent hang:
  - a request line + headers over MAX_HEAD_BYTES: 431, connection closed;
  - a POST without Content-Length (and not chunked): 411; a body over max_body_bytes (declared or
    while arriving chunked): 413; both close the connection (the body is never read);
  - malformed HTTP: 400, connection closed; a request asking for a protocol upgrade is answered as if it
    had not asked, and the connection closed;
  - a request not received whole within request_deadline_s of its first byte (slow-loris), and a
    connection idle for idle_timeout_s with nothing in flight: closed;
  - more than max_connections open: the new one gets 503 and is closed.
Pipelined requests are answered in order; each response leaves in one write (header and body).
"""
from __future__ import annotations

import asyncio
import email.utils
import logging
import socket
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Awaitable, Callable, Optional

import httptools

from recpipe.common.ports import bind_error
from recpipe.serving.server.limits import MAX_HEAD_BYTES

__all__ = ["Request", "Response", "HttpServer"]

log = logging.getLogger("recpipe.serving")
_PIPELINE_DEPTH = 16         # parsed requests waiting on one connection before it stops reading


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes
    read_s: float = 0.0                    # from the end of the headers to the last body byte
    reject: Optional[tuple[int, str]] = None  # answered with this status and message, then closed


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes


App = Callable[[Request], Awaitable[Response]]


class _Reject(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class _Date:
    """The Date header's value, formatted once a second."""

    def __init__(self):
        self._second, self._value = -1, ""

    def get(self) -> str:
        now = int(time.time())
        if now != self._second:
            self._second, self._value = now, email.utils.formatdate(now, usegmt=True)
        return self._value


def encode_response(r: Response, keep_alive: bool, date: str) -> bytes:
    close = "" if keep_alive else "Connection: close\r\n"
    head = (f"HTTP/1.1 {r.status} {HTTPStatus(r.status).phrase}\r\nServer: recpipe\r\nDate: {date}\r\n"
            f"Content-Type: {r.content_type}\r\nContent-Length: {len(r.body)}\r\n{close}\r\n")
    return head.encode("latin-1") + r.body


class _Connection(asyncio.Protocol):
    """One client connection: httptools calls the on_* methods while data_received feeds it."""

    def __init__(self, server: "HttpServer"):
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Optional[asyncio.Transport] = None
        self.pending: deque[tuple[Request, bool]] = deque()
        self.task: Optional[asyncio.Task] = None
        self.receiving_since: Optional[float] = None  # first byte of the request being received
        self.last_active = time.monotonic()
        self.stopped_reading = False  # after a reject: nothing more is parsed
        self.paused = False
        self.can_write = asyncio.Event()
        self.can_write.set()
        self._new_message()

    def _new_message(self) -> None:
        self.url, self.head_bytes, self.body, self.body_bytes = b"", 0, [], 0
        self.content_length: Optional[int] = None
        self.chunked = self.expect_continue = False
        self.headers_done = 0.0

    # ------------------------------------------------------------------ transport events
    def connection_made(self, transport) -> None:
        self.transport = transport
        if len(self.server.connections) >= self.server.max_connections:
            self.stopped_reading = True
            self._enqueue(Request("", "", b"", reject=(503, "too many connections")), keep_alive=False)
            return
        self.server.connections.add(self)

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.can_write.set()

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def data_received(self, data: bytes) -> None:
        if self.stopped_reading:
            return
        self.last_active = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            reject = e.__context__ if isinstance(e.__context__, _Reject) else _Reject(400, f"bad request: {e}")
            self._stop_reading(reject)
        except httptools.HttpParserUpgrade:  # the request is whole; it is answered as if Upgrade were absent
            self.stopped_reading = True      # (RFC 9110 7.8) and the connection closed: nothing after it is parsed
            if self.pending:
                self.pending.append((self.pending.pop()[0], False))
            else:
                self.transport.close()
        except httptools.HttpParserError as e:
            self._stop_reading(_Reject(400, f"malformed HTTP request: {e}"))

    def _stop_reading(self, reject: _Reject) -> None:
        self.stopped_reading = True
        self.receiving_since = None
        self._enqueue(Request(self._method(), self._path(), b"", reject=(reject.status, reject.message)),
                      keep_alive=False)

    # ------------------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        self._new_message()
        self.receiving_since = time.monotonic()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        name = name.lower()
        if name == b"content-length":
            try:
                self.content_length = int(value)
            except ValueError:
                raise _Reject(400, "Content-Length is not a number") from None
        elif name == b"transfer-encoding":
            self.chunked = b"chunked" in value.lower()
        elif name == b"expect":
            self.expect_continue = value.lower() == b"100-continue"

    def _count_head(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _Reject(431, f"request line and headers over {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        self.headers_done = time.monotonic()
        if self._method() == "POST":
            if self.content_length is None and not self.chunked:
                raise _Reject(411, "Content-Length required")
            if (self.content_length or 0) > self.server.max_body_bytes:
                raise _Reject(413, f"request body over {self.server.max_body_bytes} bytes")
        if self.expect_continue:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.server.max_body_bytes:
            raise _Reject(413, f"request body over {self.server.max_body_bytes} bytes")
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.receiving_since = None
        read_s = time.monotonic() - self.headers_done if self.body else 0.0
        self._enqueue(Request(self._method(), self._path(), b"".join(self.body), read_s),
                      keep_alive=self.parser.should_keep_alive())
        self._new_message()

    def _method(self) -> str:
        try:
            return self.parser.get_method().decode("latin-1")
        except httptools.HttpParserError:
            return ""

    def _path(self) -> str:
        try:
            return httptools.parse_url(self.url).path.decode("latin-1") if self.url else ""
        except httptools.HttpParserInvalidURLError:
            return self.url.decode("latin-1")

    # ------------------------------------------------------------------ answering, in order
    def _enqueue(self, request: Request, keep_alive: bool) -> None:
        self.pending.append((request, keep_alive))
        if len(self.pending) >= _PIPELINE_DEPTH and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        if self.task is None or self.task.done():
            self.task = self.server.loop.create_task(self._answer())

    async def _answer(self) -> None:
        while self.pending:
            request, keep_alive = self.pending.popleft()
            try:
                response = await self.server.app(request)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the app's bug: a 500, never a connection left hanging
                log.exception("HTTP %s %s: the app failed", request.method, request.path)
                response, keep_alive = Response(500, "application/json", b'{"error": "internal server error"}'), False
            await self.can_write.wait()
            if self.transport.is_closing():
                return
            keep_alive = keep_alive and request.reject is None
            self.transport.write(encode_response(response, keep_alive, self.server.date.get()))
            self.last_active = time.monotonic()
            if not keep_alive:
                self.transport.close()
                return
            if self.paused and len(self.pending) < _PIPELINE_DEPTH // 2:
                self.paused = False
                self.transport.resume_reading()

    def busy(self) -> bool:
        return bool(self.pending) or (self.task is not None and not self.task.done())


class HttpServer:
    """Binds at construction; serve_forever() runs the loop in the calling thread until shutdown().

    A port in use is an OSError naming it: the socket takes SO_REUSEADDR (a restart binds at once over the
    previous one's TIME_WAIT connections) but never SO_REUSEPORT, which would let a second server share a
    port it already serves on and the kernel split the clients between the two."""

    def __init__(self, app: App, host: str, port: int, threads: int, request_deadline_s: float,
                 idle_timeout_s: float, max_connections: int, max_body_bytes: int):
        self.app, self.max_connections, self.max_body_bytes = app, max_connections, max_body_bytes
        self.request_deadline_s, self.idle_timeout_s = request_deadline_s, idle_timeout_s
        self.connections: set[_Connection] = set()
        self.date = _Date()
        self.loop = _new_loop()
        # the app's blocking calls (a model call without batching, tf.Example scoring) run here
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="rest")
        self.loop.set_default_executor(self.executor)
        try:
            sock = socket.create_server((host, port), backlog=1024, reuse_port=False)
        except OSError as e:
            self.executor.shutdown(wait=False)
            self.loop.close()
            raise bind_error("REST", host, port, e) from None
        self.server_address: tuple[str, int] = sock.getsockname()[:2]
        self._server = self.loop.run_until_complete(self.loop.create_server(lambda: _Connection(self), sock=sock))
        self._sweep_every = max(min(request_deadline_s / 3, idle_timeout_s / 3, 30.0), 0.5)
        self._ended = threading.Event()
        self._state_lock = threading.Lock()
        self._state = "new"  # -> "running" (serve_forever) or "closed" (shutdown before it ran)

    def serve_forever(self) -> None:
        with self._state_lock:
            if self._state != "new":
                return
            self._state = "running"
        asyncio.set_event_loop(self.loop)
        self.loop.call_later(self._sweep_every, self._sweep)
        try:
            self.loop.run_forever()
        finally:
            self._close_everything()
            self._ended.set()

    def _sweep(self) -> None:
        """Close slow-loris requests and idle keep-alive connections."""
        now = time.monotonic()
        for c in list(self.connections):
            late = c.receiving_since is not None and now - c.receiving_since > self.request_deadline_s
            idle = c.receiving_since is None and not c.busy() and now - c.last_active > self.idle_timeout_s
            if late or idle:
                c.transport.close()
        self.loop.call_later(self._sweep_every, self._sweep)

    def _close_everything(self) -> None:
        self._server.close()
        for c in list(self.connections):
            c.transport.close()
        tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.run_until_complete(asyncio.sleep(0.05))  # the closes above happen on the loop
        self.loop.run_until_complete(self._server.wait_closed())
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.loop.close()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the loop from its own thread (connections and the listening socket closed there); with
        no loop running (never started, or already ended), close here."""
        with self._state_lock:
            state, self._state = self._state, "closed"
        if state == "running":  # stops run_forever even if it has not begun yet
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._ended.wait(timeout_s)
        elif state == "new":
            self._close_everything()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio's own loop works too
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
