"""Read ahead: produce an iterator's items on a background thread while the caller works on the last one.

Worth it where producing an item mostly runs outside the interpreter lock (decoding Parquet in Arrow's
C++, numpy), so the producer and the consumer use two cores.
"""
from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator, TypeVar

__all__ = ["prefetch"]

T = TypeVar("T")

_DONE = object()


class _Raised:
    def __init__(self, error: BaseException):
        self.error = error


def prefetch(items: Iterable[T], depth: int = 1, name: str = "prefetch") -> Iterator[T]:
    """Iterate `items` on a thread of its own, at most `depth` items ahead of the caller.

    Args:
        items: any iterable; it is iterated only on the background thread.
        depth: how many items may exist besides the caller's, the one in the making included (memory:
            that many items more).
        name: the thread's name (seen in stack dumps and profilers).

    Returns:
        An iterator yielding the same items in the same order.

    Raises:
        Whatever iterating `items` raises, re-raised in the caller at that point of the sequence.
        Closing the returned iterator early (or an error in the caller) stops the thread after the item
        it is producing.
    """
    if depth < 1:
        raise ValueError(f"prefetch depth must be at least 1, got {depth}")
    return _prefetched(items, depth, name)


def _prefetched(items: Iterable[T], depth: int, name: str) -> Iterator[T]:
    """prefetch's generator: the thread starts with the first item asked for. The thread takes a slot before
    it produces an item and the caller gives it back when it takes the item, so at most `depth` items exist
    besides the caller's, the one in the making included."""
    out: queue.SimpleQueue = queue.SimpleQueue()
    slots = threading.Semaphore(depth)
    stop = threading.Event()

    def produce() -> None:
        iterator = iter(items)
        while True:
            while not slots.acquire(timeout=0.1):
                if stop.is_set():
                    return
            if stop.is_set():
                return
            try:
                item = next(iterator)
            except StopIteration:
                out.put(_DONE)
                return
            except BaseException as e:  # handed to the caller, who raises it
                out.put(_Raised(e))
                return
            out.put(item)

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = out.get()
            slots.release()
            if item is _DONE:
                return
            if isinstance(item, _Raised):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()
