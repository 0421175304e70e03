"""recpipe.common.prefetch: items in order, errors where they happened, the thread gone when the caller stops."""
from __future__ import annotations

import threading
import time

import pytest

from recpipe.common.prefetch import prefetch

pytestmark = pytest.mark.unit


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_items_come_in_order_from_another_thread():
    producers = []

    def items():
        for i in range(50):
            producers.append(threading.current_thread().name)
            yield i
    assert list(prefetch(items(), depth=2, name="t-order")) == list(range(50))
    assert set(producers) == {"t-order"} and not _threads("t-order")


def test_an_error_is_raised_after_the_items_before_it():
    def items():
        yield 1
        yield 2
        raise OSError("disk gone")
    got = []
    with pytest.raises(OSError, match="disk gone"):
        for i in prefetch(items(), name="t-error"):
            got.append(i)
    assert got == [1, 2] and not _threads("t-error")


def test_producer_stays_at_most_depth_ahead_and_stops_when_the_caller_does():
    made = []

    def items():
        for i in range(1000):
            made.append(i)
            yield i
    it = prefetch(items(), depth=2, name="t-stop")
    assert next(it) == 0
    time.sleep(0.3)  # time to run ahead, were it unbounded
    assert len(made) == 3  # the one handed out and `depth` more, the one in the making included
    it.close()
    assert not _threads("t-stop") and len(made) == 3


def test_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        prefetch([1], depth=0)
