"""Server-side batching: concurrent predict calls on one version become one model call.

Once a batch's first request is taken, the batcher waits at most `timeout_s` for others (0, the
default: none; a batch is whatever queued while the previous model call ran); a batch holds at most
`max_rows` rows.
Requests are validated before they join (a bad one never spoils a batch); if a merged call still
fails, every request in it is retried alone, so errors stay with the request that caused them.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from recpipe.serving.server.metrics import Metrics
from recpipe.serving.server.registry import LoadedVersion

__all__ = ["Batcher", "Predictor"]


def _row_count(columns: dict[str, np.ndarray]) -> int:
    """Rows in a validated request (every column has as many)."""
    return len(next(iter(columns.values())))


@dataclass
class _Item:
    lv: LoadedVersion
    columns: dict[str, np.ndarray]
    rows: int
    notify: Callable[[], None]  # called on the batcher's thread once result or error is set
    result: Optional[dict] = None
    error: Optional[BaseException] = None
    submitted: float = field(default_factory=time.perf_counter)
    started: float = 0.0    # the model call it is part of: start and end (perf_counter)
    finished: float = 0.0


class Batcher:
    def __init__(self, max_rows: int, timeout_s: float, metrics: Metrics):
        self.max_rows, self.timeout_s, self.metrics = max_rows, timeout_s, metrics
        self._queue: "queue.Queue[_Item]" = queue.Queue()
        self._carry: Optional[_Item] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="batcher", daemon=True)
        self._thread.start()

    def submit(self, lv: LoadedVersion, columns: dict[str, np.ndarray]) -> dict:
        """Blocks the calling thread until its batch has run (the gRPC front end's threads)."""
        done = threading.Event()
        item = _Item(lv, columns, _row_count(columns), done.set)
        self._queue.put(item)
        done.wait()
        return self._result(item)

    async def submit_async(self, lv: LoadedVersion, columns: dict[str, np.ndarray]) -> dict:
        """Awaits its batch on the caller's event loop (the REST front end), which serves others meanwhile."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def wake() -> None:
            if not done.done():  # cancelled when the client went away
                done.set_result(None)
        item = _Item(lv, columns, _row_count(columns), lambda: loop.call_soon_threadsafe(wake))
        self._queue.put(item)
        await done
        return self._result(item)

    def _result(self, item: _Item) -> dict:
        if item.error is not None:
            raise item.error
        assert item.result is not None
        self.metrics.stage("queue", item.started - item.submitted)
        self.metrics.stage("model", item.finished - item.started)
        self.metrics.stage("handoff", time.perf_counter() - item.finished)
        return item.result

    def stop(self) -> None:
        self._stop.set()

    def _next(self, timeout: Optional[float]) -> Optional[_Item]:
        if self._carry is not None:
            item, self._carry = self._carry, None
            return item
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def _loop(self) -> None:
        while not self._stop.is_set():
            first = self._next(timeout=0.2)
            if first is None:
                continue
            batch, rows = [first], first.rows
            deadline = time.monotonic() + self.timeout_s
            while rows < self.max_rows:
                nxt = self._next(timeout=max(deadline - time.monotonic(), 0.0))
                if nxt is None:
                    break
                if nxt.lv is not first.lv or rows + nxt.rows > self.max_rows:
                    self._carry = nxt
                    break
                batch.append(nxt)
                rows += nxt.rows
            self._run(batch, rows)

    def _run(self, batch: list[_Item], rows: int) -> None:
        self.metrics.batch(rows)
        if len(batch) == 1:
            self._run_one(batch[0])
            return
        keys = list(batch[0].columns)
        started = time.perf_counter()
        try:
            merged = {k: np.concatenate([it.columns[k] for it in batch]) for k in keys}
            out = batch[0].lv.run(merged)
        except Exception:  # noqa: BLE001 - retried one by one below, each error reaches its own request
            for it in batch:
                self._run_one(it)
            return
        finished, start = time.perf_counter(), 0
        for it in batch:
            it.result = {k: v[start:start + it.rows] for k, v in out.items()}
            it.started, it.finished = started, finished
            start += it.rows
            it.notify()

    @staticmethod
    def _run_one(item: _Item) -> None:
        item.started = time.perf_counter()
        try:
            item.result = item.lv.run(item.columns)
        except Exception as e:  # noqa: BLE001 - handed to the waiting request (a gRPC thread or the event loop)
            item.error = e
        item.finished = time.perf_counter()
        item.notify()


class Predictor:
    """What the front ends call: validation, optional batching, metrics."""

    def __init__(self, metrics: Metrics, max_batch_rows: int = 0, batch_timeout_s: float = 0.0):
        self.metrics = metrics
        self.batcher = Batcher(max_batch_rows, batch_timeout_s, metrics) if max_batch_rows > 0 else None

    def predict(self, lv: LoadedVersion, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Validated, then run alone or in a batch; the stages' times go to the metrics."""
        columns = self._validated(lv, columns)
        if self.batcher is not None:
            return self.batcher.submit(lv, columns)
        t0 = time.perf_counter()
        out = lv.run(columns)
        self.metrics.stage("model", time.perf_counter() - t0)
        return out

    async def predict_async(self, lv: LoadedVersion, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """predict() on an event loop: the model call runs on the batcher's thread or, without
        batching, on the loop's default executor, and the loop serves other requests meanwhile."""
        columns = self._validated(lv, columns)
        if self.batcher is not None:
            return await self.batcher.submit_async(lv, columns)
        t0 = time.perf_counter()
        out = await asyncio.get_running_loop().run_in_executor(None, lv.run, columns)
        self.metrics.stage("model", time.perf_counter() - t0)
        return out

    def _validated(self, lv: LoadedVersion, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        columns = lv.validate(columns)
        self.metrics.stage("validate", time.perf_counter() - t0)
        if self.batcher is None:
            self.metrics.batch(_row_count(columns))
        return columns

    def stop(self) -> None:
        if self.batcher is not None:
            self.batcher.stop()
