"""Cohort mode's fleet (:mod:`asyncrl.sim.cohort`): the generation slots, the
groups that hold them, and the first attempts' latencies, read from the same
seeded stream as the per-group engine's (common random numbers)."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from asyncrl.sim.cohort_policies import WAITING
from asyncrl.sim.latency import LatencyModel, Work
from asyncrl.sim.streams import DRAW_BATCH, Stream, component_rng


class Group:
    """One prompt group while it is live (reserved, in flight or ready). Only
    what it has so far is set: one is made per group, so its making is kept short."""

    __slots__ = ("ew", "prompt", "seq", "since", "slot", "stamp", "state", "sw", "t0", "until",
                 "work")
    # Set when it starts: t0, work (its latency and tokens), since (the weight
    # updates landed by then, which is the engine version it starts with) and,
    # while a timeline is recorded, slot (which one it holds). Set when it finishes:
    # until (the weight updates landed by then) and, for a policy that measures
    # end weights, ew (its newest token's version).
    t0: float
    work: Work
    since: int
    slot: int
    until: int
    ew: int

    def __init__(self, seq: int, prompt: int, stamp: int | None, sw: int) -> None:
        self.seq, self.prompt, self.stamp, self.sw = seq, prompt, stamp, sw
        self.state = WAITING


class _Window:
    """A seeded stream read at increasing indexes only: what was handed out is
    forgotten, so memory stays one batch (and one read) however long the run."""

    __slots__ = ("_base", "_buf", "_draw", "_rng")

    def __init__(self, rng: Any, draw: Callable[[Any, int], list[Any]]) -> None:
        self._rng, self._draw = rng, draw
        self._buf: list[Any] = []
        self._base = 0  # the index of _buf[0]

    def at(self, index: int) -> Any:
        return self.run(index, 1)[0]

    def run(self, index: int, count: int) -> list[Any]:
        """The items at ``index`` .. ``index + count - 1``."""
        j = index - self._base
        if j < 0:
            raise IndexError(f"index {index} was handed out already")
        buf = self._buf
        if j + count > len(buf):
            done = min(j, len(buf))  # every index below ``index`` is done: forget them
            del buf[:done]
            self._base += done
            j -= done
            while j + count > len(buf):
                buf.extend(self._draw(self._rng, DRAW_BATCH))
        return buf[j:j + count]


class Fleet:
    """The generation slots, FIFO, and the first attempts' latencies (what the
    per-group engine holds; :func:`asyncrl.sim.reference.serial_reference_s`
    reads :meth:`first_attempt_latency` too)."""

    def __init__(self, latency: LatencyModel, *, slots: int, seed: int,
                 tokens_per_s: float) -> None:
        self.latency = latency
        self.tokens_per_s = tokens_per_s
        self.seed = seed
        # The per-group engine's draws for first attempts (common random numbers),
        # held as the Work each one means (a time-based model's ignores the load).
        self.first = _Window(component_rng(seed, "latency"), self._draw_work)
        self._replay: Stream | None = None
        self.slots = self.free = slots
        self.waiting: collections.deque[Group] = collections.deque()
        self.max_busy = 0  # most slots busy at once
        self.busy_slot_s = 0.0
        self.attempts = 0
        self.failures = 0
        self.aborts = 0
        self.intervals: list[tuple[float, float, str]] = []
        #: Free slot numbers (only while a timeline is recorded), lowest on top.
        self.slot_ids: list[int] = []

    def work(self, prompt_id: int) -> Work:
        """The first attempt of prompt ``prompt_id`` (prompts start in order)."""
        return self.first.at(prompt_id)  # type: ignore[no-any-return]

    def first_attempt_latency(self, prompt_id: int) -> float:
        """Any prompt's first-attempt latency, drawn again from the seed (the run
        itself forgot them)."""
        if self._replay is None:
            self._replay = Stream(component_rng(self.seed, "latency"), self.latency.draw)
        return self.latency.work(self._replay.at(prompt_id), 1, self.tokens_per_s).latency

    def _draw_work(self, rng: Any, k: int) -> list[Work]:
        return self.latency.works(self.latency.draw(rng, k), self.tokens_per_s)
