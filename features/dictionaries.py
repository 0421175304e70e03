"""Work done once per dictionary, not once per batch: Parquet gives each batch of a row group its own copy
of the row group's whole dictionary (tens of thousands of values for an ID column), so per-value work on
one batch's dictionary (hashing it, looking its values up in a vocabulary) is reused by the next batch
when their dictionaries are equal.
"""
from __future__ import annotations

from typing import Callable, Generic, Hashable, TypeVar

import pyarrow as pa

__all__ = ["DictionaryMemo"]

T = TypeVar("T")


class DictionaryMemo(Generic[T]):
    """The last result of a function of a dictionary, per key, reused while the dictionary it was worked out
    for stays equal (compared by value: a memory comparison, ~0.1 ms for 100k IDs).

    Safe to share between threads: two threads racing on one key may both work the result out, and either
    is kept.
    """

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[pa.Array, T]] = {}

    def get(self, key: Hashable, dictionary: pa.Array, work: Callable[[pa.Array], T]) -> T:
        """`work(dictionary)`, or the result kept for `key` when it was worked out for an equal dictionary.

        Args:
            key: what the result is kept under (a column or feature name); one result per key.
            dictionary: a dictionary array's dictionary.
            work: a pure function of the dictionary's values.

        Returns:
            work's result for these values.
        """
        last = self._last.get(key)
        if last is not None and len(last[0]) == len(dictionary) and last[0].equals(dictionary):
            return last[1]
        value = work(dictionary)
        self._last[key] = (dictionary, value)
        return value
