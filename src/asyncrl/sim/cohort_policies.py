"""The built-in staleness policies, as cohort mode replays them (:mod:`asyncrl.sim.cohort`).

Each class keeps the ready groups the way its sampler
(:mod:`asyncrl.sampling.policies`) queries the buffer, so that ``evict``,
``eligible`` and ``take`` return what ``evict`` and ``select`` would, at O(log n)
per group: groups become ready in any order, so the ones a policy takes in
dispatch order sit in a heap keyed by dispatch number (stale entries, of
groups evicted meanwhile, are skipped when they come up).

``v`` is the trainer version (the step being trained) and ``s`` the window.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.config.sampler import CustomSamplerConfig
from asyncrl.errors import ConfigError
from asyncrl.sim.latency import LatencyModel

#: Group states (cohort.Group.state).
WAITING, RUNNING, READY, GONE = range(4)


class Policy:
    """Admission gate and abort rule, from the sampler's derived facts."""

    #: Admission waits at the gate ``d <= v + s``.
    gated = True
    #: The window's measure: "start_weight" or "end_weight".
    measure = "start_weight"
    #: :meth:`placed` and :meth:`left` count the slots by start weight.
    counts_live = False
    #: :meth:`aborts` can be true (else the run skips looking for hopeless groups).
    aborts_inflight = False

    def __init__(self, window: int) -> None:
        self.window = window
        self.ready = 0  # ready groups held (what ``eligible`` draws from)

    def floor(self, v: int) -> int:
        return max(0, v - self.window)

    def admits(self, d: int, v: int) -> bool:
        return not self.gated or d <= v + self.window

    def stamp(self, d: int) -> int | None:
        return None

    def aborts(self, start_weight: int, v: int) -> bool:
        """After the sync to version ``v``: is an in-flight group of that start
        weight hopeless (``should_abort_inflight``)?"""
        return False

    # Dispatch and readiness (weight_fifo counts every slot by its start weight).
    def placed(self, g: Any) -> None:
        return None

    def left(self, g: Any) -> None:
        """``g`` left the buffer (trained, evicted or aborted)."""
        return None

    def add_ready(self, groups: list[Any]) -> None:
        """``groups`` finished, in this order (all those of one pass of the
        event loop: one call for them)."""
        raise NotImplementedError

    def evict(self, v: int) -> list[Any]:
        return []

    def eligible(self, v: int) -> int:
        raise NotImplementedError

    def take(self, v: int, k: int) -> list[Any]:
        raise NotImplementedError


class _SeqHeap:
    """Ready groups in dispatch order: their dispatch numbers in a heap (an int
    compares faster than a tuple) and the groups by number; entries of groups no
    longer READY are skipped."""

    __slots__ = ("groups", "heap")

    def __init__(self) -> None:
        self.heap: list[int] = []
        self.groups: dict[int, Any] = {}

    def push(self, groups: Iterable[Any]) -> None:
        heap, by_seq, push = self.heap, self.groups, heapq.heappush
        for g in groups:
            push(heap, g.seq)
            by_seq[g.seq] = g

    def peek(self) -> Any | None:
        heap, groups = self.heap, self.groups
        while heap and groups[heap[0]].state != READY:
            del groups[heapq.heappop(heap)]
        return groups[heap[0]] if heap else None

    def pop(self, k: int) -> list[Any]:
        heap, groups, out = self.heap, self.groups, []
        pop, take = heapq.heappop, groups.pop
        while len(out) < k:
            g = take(pop(heap))
            if g.state == READY:
                out.append(g)
        return out

    def ready(self) -> list[Any]:
        """Every ready group held (in no particular order)."""
        return [g for g in self.groups.values() if g.state == READY]


class InOrder(Policy):
    """Batch ``d`` is stamped ``d`` and trained at step ``d``; generation runs ``s`` ahead."""

    def __init__(self, window: int) -> None:
        super().__init__(window)
        self.by_target: dict[int, list[Any]] = {}

    def stamp(self, d: int) -> int | None:
        return d

    def add_ready(self, groups: list[Any]) -> None:
        self.ready += len(groups)
        for g in groups:
            self.by_target.setdefault(g.stamp, []).append(g)

    def eligible(self, v: int) -> int:
        return len(self.by_target.get(v, ()))

    def take(self, v: int, k: int) -> list[Any]:
        # A step's quota is its batch: every ready group of it fits (k is all).
        out = self.by_target.pop(v)
        self.ready -= len(out)
        return out


class _Ordered(Policy):
    """Policies that take ready groups in dispatch order."""

    def __init__(self, window: int) -> None:
        super().__init__(window)
        self.order = _SeqHeap()

    def add_ready(self, groups: list[Any]) -> None:
        self.ready += len(groups)
        self.order.push(groups)

    def eligible(self, v: int) -> int:
        return self.ready

    def take(self, v: int, k: int) -> list[Any]:
        self.ready -= k
        return self.order.pop(k)


class ReadyFirst(_Ordered):
    """Whatever finished first, in dispatch order; nothing evicted or aborted."""


class Windowed(_Ordered):
    """Any ready group whose start weight is at most ``s`` versions old; never gated."""

    gated = False
    aborts_inflight = True

    def aborts(self, start_weight: int, v: int) -> bool:
        return start_weight < v - self.window

    def evict(self, v: int) -> list[Any]:
        # Start weights never decrease along dispatch order: the oldest come first.
        lo, out = self.floor(v), []
        order = self.order
        while (g := order.peek()) is not None and g.sw < lo:
            out.extend(order.pop(1))
        self.ready -= len(out)
        return out


class _ByEndWeight:
    """Ready groups bucketed by end weight (each bucket in dispatch order)."""

    def __init__(self) -> None:
        self.buckets: dict[int, _SeqHeap] = {}
        self.counts: dict[int, int] = {}

    def add(self, g: Any) -> None:
        bucket = self.buckets.get(g.ew)
        if bucket is None:
            bucket = self.buckets[g.ew] = _SeqHeap()
        bucket.push((g,))
        self.counts[g.ew] = self.counts.get(g.ew, 0) + 1

    def below(self, lo: int) -> Iterator[int]:
        return iter([w for w in self.buckets if w < lo])

    def drop(self, w: int) -> list[Any]:
        """Every ready group of end weight ``w`` (the bucket goes)."""
        bucket = self.buckets.pop(w)
        self.counts.pop(w, None)
        return bucket.ready()


class WindowedEnd(Windowed):
    """``windowed`` with ``staleness_of: end_weight``: the window bounds the
    newest tokens' version; nothing in flight is aborted."""

    measure = "end_weight"
    aborts_inflight = False

    def __init__(self, window: int) -> None:
        super().__init__(window)
        # Ready groups by end weight, to evict a whole version at once (taking
        # goes by dispatch order, over all of them).
        self.by_end: dict[int, list[Any]] = {}

    def aborts(self, start_weight: int, v: int) -> bool:
        return False

    def add_ready(self, groups: list[Any]) -> None:
        self.ready += len(groups)
        self.order.push(groups)
        by_end = self.by_end
        for g in groups:
            bucket = by_end.get(g.ew)
            if bucket is None:
                by_end[g.ew] = [g]
            else:
                bucket.append(g)

    def evict(self, v: int) -> list[Any]:
        lo, out = self.floor(v), []
        for w in [w for w in self.by_end if w < lo]:
            out += [g for g in self.by_end.pop(w) if g.state == READY]
        self.ready -= len(out)
        return out


class WeightFifo(Policy):
    """Only the oldest start weight in the window that any slot holds (ready or
    in flight) is trained: its ready groups, in dispatch order."""

    counts_live = True
    aborts_inflight = True

    def __init__(self, window: int) -> None:
        super().__init__(window)
        self.order = _SeqHeap()
        self.live: dict[int, int] = {}  # start weight -> slots holding it
        self.ready_at: dict[int, int] = {}  # start weight -> ready groups

    def aborts(self, start_weight: int, v: int) -> bool:
        return start_weight < v - self.window

    def placed(self, g: Any) -> None:
        self.live[g.sw] = self.live.get(g.sw, 0) + 1

    def left(self, g: Any) -> None:
        n = self.live[g.sw] - 1
        if n:
            self.live[g.sw] = n
        else:
            del self.live[g.sw]

    def add_ready(self, groups: list[Any]) -> None:
        self.ready += len(groups)
        self.order.push(groups)
        for g in groups:
            self.ready_at[g.sw] = self.ready_at.get(g.sw, 0) + 1

    def _oldest(self, v: int) -> int | None:
        for w in range(self.floor(v), v + 1):
            if w in self.live:
                return w
        return None

    def evict(self, v: int) -> list[Any]:
        lo, out = self.floor(v), []
        order = self.order
        while (g := order.peek()) is not None and g.sw < lo:
            out.extend(order.pop(1))
            self.ready_at[g.sw] -= 1
        self.ready -= len(out)
        return out

    def eligible(self, v: int) -> int:
        oldest = self._oldest(v)
        return 0 if oldest is None else self.ready_at.get(oldest, 0)

    def take(self, v: int, k: int) -> list[Any]:
        # The oldest start weight's ready groups come first in dispatch order.
        out = self.order.pop(k)
        for g in out:
            self.ready_at[g.sw] -= 1
        self.ready -= k
        return out


class WeightFifoEnd(Policy):
    """``weight_fifo`` with ``staleness_of: end_weight``: the oldest end weight
    among the ready groups in the window; nothing in flight holds it back."""

    measure = "end_weight"

    def __init__(self, window: int) -> None:
        super().__init__(window)
        self.by_end = _ByEndWeight()

    def add_ready(self, groups: list[Any]) -> None:
        self.ready += len(groups)
        for g in groups:
            self.by_end.add(g)

    def _oldest(self, v: int) -> int | None:
        counts = self.by_end.counts
        for w in range(self.floor(v), v + 1):
            if counts.get(w):
                return w
        return None

    def evict(self, v: int) -> list[Any]:
        out = []
        for w in self.by_end.below(self.floor(v)):
            out.extend(self.by_end.drop(w))
        self.ready -= len(out)
        return out

    def eligible(self, v: int) -> int:
        oldest = self._oldest(v)
        return 0 if oldest is None else self.by_end.counts[oldest]

    def take(self, v: int, k: int) -> list[Any]:
        oldest = self._oldest(v)
        assert oldest is not None
        out = self.by_end.buckets[oldest].pop(k)
        self.by_end.counts[oldest] -= k
        self.ready -= k
        return out


def make_policy(sampler_cfg: Any) -> Policy:
    """The cohort-mode policy of a built-in sampler config (:func:`check` says which)."""
    name = sampler_cfg.name
    if name == "in_order":
        return InOrder(sampler_cfg.max_lookahead_versions)
    window = sampler_cfg.max_staleness_versions
    if name == "ready_first":
        return ReadyFirst(window)
    end = getattr(sampler_cfg, "staleness_of", "start_weight") == "end_weight"
    if name == "windowed":
        return WindowedEnd(window) if end else Windowed(window)
    if name == "weight_fifo":
        return WeightFifoEnd(window) if end else WeightFifo(window)
    raise ValueError(f"no cohort-mode policy for sampler {name!r}")


def check(cfg: RunConfig, sampler_cfg: Any, latency: LatencyModel) -> None:
    """Refuse what cohort mode does not model, with the field and the fix."""
    sim = cfg.simulate
    assert sim is not None
    fix = "or use simulate.mode: per_group (the real controller)"
    problems = []
    if isinstance(sampler_cfg, CustomSamplerConfig):
        problems.append(f"async_rl.sampler is custom ({sampler_cfg.target}); cohort mode "
                        "replays the built-in policies only")
    elif getattr(sampler_cfg, "sample_freshest_first", False):
        problems.append("async_rl.sampler.sample_freshest_first: true is not modelled")
    if latency.load_dependent:
        problems.append("simulate.generation_latency_s is load-dependent (tokens); cohort "
                        "mode needs a time-based model (constant, lognormal, bimodal, empirical)")
    if sim.failure_rate:
        problems.append(f"simulate.failure_rate={sim.failure_rate:g}: set it to 0")
    if sim.filter_rate:
        problems.append(f"simulate.filter_rate={sim.filter_rate:g}: set it to 0 (cohort "
                        "mode has no dynamic-sampling filter)")
    if cfg.grpo.dynamic_sampling.batch_multiplier != 1.0:
        problems.append("grpo.dynamic_sampling.batch_multiplier="
                        f"{cfg.grpo.dynamic_sampling.batch_multiplier:g}: set it to 1")
    if sim.pause_generation_during_sync:
        problems.append("simulate.pause_generation_during_sync: set it to false")
    if sim.abort_s:
        problems.append(f"simulate.abort_s={sim.abort_s:g}: set it to 0")
    if cfg.deterministic:
        problems.append("deterministic: true: set it to false")
    if problems:
        raise ConfigError("simulate.mode: cohort cannot simulate this config: "
                          + "; ".join(problems) + f" ({fix})")
