"""The ready slots of the rollout buffer by an integer key (start weight,
target step or end weight): a sampler's query reads its answer, never the
whole buffer (costs: :mod:`asyncrl.buffer.rollout_buffer`)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator
from typing import Generic, Protocol, TypeVar

from sortedcontainers import SortedDict


class _Sequenced(Protocol):
    dispatch_seq: int


S = TypeVar("S", bound=_Sequenced)


class ReadyIndex(Generic[S]):
    """Ready slots (anything with a ``dispatch_seq``) bucketed by an integer
    key, each bucket in dispatch order.

    A bucket is a plain dict ``dispatch_seq -> slot``: adding and dropping are
    dict operations. Slots become ready in any order, so a bucket that took a
    slot older than its newest is put back in dispatch order (one sort, in C)
    only when a query reads it.

    ``monotone`` says the key never decreased along dispatch order (true for
    start weights, since the trainer version only grows): then dispatch order
    across buckets is simply key order, and a range query walks buckets lazily
    instead of merging them.
    """

    __slots__ = ("_buckets", "_unsorted", "monotone")

    def __init__(self) -> None:
        self._buckets: SortedDict = SortedDict()  # key -> {seq: slot}
        self._unsorted: set[int] = set()  # keys whose bucket is out of dispatch order
        self.monotone = True

    def add(self, key: int, slot: S) -> None:
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = {slot.dispatch_seq: slot}
            return
        if slot.dispatch_seq < next(reversed(bucket)):
            self._unsorted.add(key)
        bucket[slot.dispatch_seq] = slot

    def discard(self, key: int, slot: S) -> None:
        bucket = self._buckets[key]
        del bucket[slot.dispatch_seq]
        if not bucket:
            del self._buckets[key]
            self._unsorted.discard(key)

    def _ordered(self, key: int) -> dict[int, S]:
        """The bucket of ``key``, in dispatch order."""
        bucket = self._buckets[key]
        if key in self._unsorted:
            self._unsorted.discard(key)
            items = sorted(bucket.items())
            bucket.clear()
            bucket.update(items)
        return bucket

    def keys_in(self, lo: int | None, hi: int | None, reverse: bool = False) -> Iterator[int]:
        return self._buckets.irange(lo, hi, reverse=reverse)

    def in_range(
        self, lo: int | None, hi: int | None, *, limit: int | None, key_desc: bool = False
    ) -> list[S]:
        """Ready slots with ``lo <= key <= hi`` (None: unbounded).

        Dispatch order across buckets, or, with ``key_desc``, highest key first
        and dispatch order inside a key.
        """
        # Nothing in range, the common answer of an eviction check: say so
        # without building a range iterator (the first key is one cheap call).
        buckets = self._buckets
        if not buckets or (lo is None and hi is not None and next(iter(buckets)) > hi):
            return []
        ordered = self._ordered
        if key_desc or self.monotone:
            stream: Iterable[S] = itertools.chain.from_iterable(
                ordered(k).values() for k in self.keys_in(lo, hi, reverse=key_desc)
            )
        else:
            keys = list(self.keys_in(lo, hi))
            stream = (slot for _, slot in heapq.merge(*(ordered(k).items() for k in keys)))
        return list(itertools.islice(stream, limit))

    def count(self, key: int) -> int:
        bucket = self._buckets.get(key)
        return len(bucket) if bucket else 0
