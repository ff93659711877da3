"""The simulator's token model: which weight version sampled each simulated token.

A simulated group generates its completions over its latency (see
:class:`~asyncrl.sim.latency.Work` for when each token is sampled). A weight
update that lands while it generates splits every completion's tokens into
run-length version spans exactly where it landed, so the controller's token
staleness, ``staleness_of: end_weight`` and the trainer's
``loss.max_token_staleness`` masks see the same record as in a real run.

Cost: the spans of a completion are built from the updates that landed while
its group generated, so a group costs O(updates) however many tokens it has;
the token ids and log-probs are zeros, views of one shared buffer
(:class:`Placeholders`), since nothing in a simulation reads a token's value.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any

from asyncrl.config import LossConfig
from asyncrl.record import Completion, VersionSpans, built_valid, counted
from asyncrl.sim.latency import Work
from asyncrl.trainers.masks import MaskStats, token_masks
from asyncrl.types import Rollout


class Placeholders:
    """Token ids and log-probs for simulated completions: zeros, as read-only
    views of one buffer per type that grows to the longest completion (a view
    has a length, indexes and iterates like a list, and costs no copy). The
    views of each length are made once."""

    def __init__(self) -> None:
        self._ids = memoryview(array("q")).toreadonly()
        self._logprobs = memoryview(array("d")).toreadonly()
        self._views: dict[int, tuple[memoryview, memoryview]] = {}

    def views(self, length: int) -> tuple[memoryview, memoryview]:
        """Token ids and log-probs of a completion of ``length`` tokens."""
        views = self._views.get(length)
        if views is None:
            if length > len(self._ids):
                self._grow(length)
            views = self._views[length] = (self._ids[:length], self._logprobs[:length])
        return views

    def ids(self, length: int) -> memoryview:
        return self.views(length)[0]

    def logprobs(self, length: int) -> memoryview:
        return self.views(length)[1]

    def _grow(self, length: int) -> None:
        # Views made before stay valid: they keep the old (zero) buffers alive.
        size = max(length, 2 * len(self._ids), 1024)
        self._ids = memoryview(array("q", bytes(8 * size))).toreadonly()
        self._logprobs = memoryview(array("d", bytes(8 * size))).toreadonly()


def version_spans(length: int, work: Work, start: float, version: int,
                  updates: Sequence[tuple[float, int]]) -> VersionSpans:
    """Spans of a completion of ``length`` tokens whose group started at
    ``start`` holding ``version``; ``updates`` are the ``(time, new version)``
    weight updates that landed since then, in order. A token sampled at the
    very instant of an update still has the old version."""
    token_s = work.token_s
    if length <= 0:
        return ()
    if token_s <= 0:  # every token sampled at once, before any update
        return ((version, length),)
    spans: list[tuple[int, int]] = []
    done = 0
    first = start + work.base_s
    for at, new_version in updates:
        # Tokens sampled by ``at``: token j is sampled at first + (j + 1) * token_s
        # (``int`` is ``floor`` here: a negative count adds nothing, as 0 would).
        upto = int((at - first) / token_s + 1e-9)
        if upto > done:
            if upto >= length:  # the rest was sampled before this update
                spans.append((version, length - done))
                return tuple(spans)
            spans.append((version, upto - done))
            done = upto
        version = new_version
    spans.append((version, length - done))
    return tuple(spans)


def last_version(length: int, work: Work, start: float, version: int,
                 updates: Sequence[tuple[float, int]], first: int = 0) -> int:
    """The version of the last span of ``version_spans(length, work, start,
    version, updates[first:])`` (its newest token's), read from the newest
    update back: an update lands before the last token is sampled, or the
    tokens before it are all there are."""
    token_s = work.token_s
    if token_s > 0:
        begin = start + work.base_s
        for i in range(len(updates) - 1, first - 1, -1):
            at, new_version = updates[i]
            if int((at - begin) / token_s + 1e-9) < length:  # a token comes after it
                return new_version
    return version


def tokens_by_version(groups: Sequence[Any], times: Sequence[float]) -> dict[int, int]:
    """The tokens of many groups' :func:`version_spans` summed per version,
    computed for all of them at once (cohort mode, per trained chunk), where
    update ``j`` lands at ``times[j]`` and makes version ``j + 1``. Each group
    (:class:`asyncrl.sim.cohort_fleet.Group`) started at ``t0``, generating
    ``work`` (``work.longest`` tokens, the first at ``t0 + work.base_s``, one
    every ``work.token_s``), holding version ``since`` (the updates landed by
    then), and saw updates ``since`` to ``until - 1`` land while it generated.

    version_spans' rule as one matrix: a group's tokens sampled by update ``u``
    are ``clip(int((times[u] - begin) / token_s + 1e-9), 0, length)`` (all of
    them when ``token_s <= 0``), none before its start and all after its end;
    its tokens of version ``u`` are the ones sampled after update ``u - 1``
    and by update ``u``. Versions with no tokens are left out."""
    import numpy as np  # here: only cohort mode pays for the import

    def column(get: Any, dtype: Any) -> Any:
        return np.fromiter(map(get, groups), dtype=dtype, count=len(groups))

    length, token_s = column(_LONGEST, np.int64), column(_TOKEN_S, float)
    begin = column(_T0, float) + column(_BASE_S, float)  # as version_spans adds them
    since, until = column(_SINCE, np.int64), column(_UNTIL, np.int64)
    lo, hi = int(since.min()), int(until.max())
    column = np.arange(lo, hi)[None, :]
    length = length[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sampled = np.trunc((np.asarray(times[lo:hi], dtype=float)[None, :] - begin[:, None])
                           / token_s[:, None] + 1e-9)
    sampled = np.clip(np.where(token_s[:, None] > 0, sampled, length), 0, length)
    sampled = np.where(column < since[:, None], 0, np.where(column >= until[:, None], length,
                                                            sampled))
    cuts = np.concatenate([np.zeros_like(length), sampled.astype(np.int64), length], axis=1)
    tokens = np.diff(cuts, axis=1).sum(axis=0).tolist()
    return {lo + j: n for j, n in enumerate(tokens) if n}


_T0, _SINCE, _UNTIL = attrgetter("t0"), attrgetter("since"), attrgetter("until")
_LONGEST, _TOKEN_S, _BASE_S = (attrgetter(f"work.{a}") for a in ("longest", "token_s", "base_s"))


def completion_lengths(work: Work, n: int) -> list[int]:
    """The lengths of a group's ``n`` completions: one of ``work.longest`` tokens,
    the others sharing the rest of ``n * work.mean`` as evenly as possible (at
    least one token each)."""
    if n == 1:
        return [work.longest]
    total = max(round(work.mean * n), work.longest + n - 1)
    q, r = divmod(total - work.longest, n - 1)
    return [work.longest, *[q + 1] * r, *[q] * (n - 1 - r)]


class CompletionFactory:
    """Builds the completions of simulated groups, sharing what it can: the
    placeholders per length, and one record for completions of equal length."""

    def __init__(self) -> None:
        self._zeros = Placeholders()

    def group(self, n: int, work: Work, start: float, version: int,
              updates: Sequence[tuple[float, int]]) -> list[Completion]:
        if work.mean >= work.longest:  # all alike (the time-based models): one record
            length = work.longest
            # No update landed while the group generated: one span, no search.
            spans = version_spans(length, work, start, version, updates) if updates else \
                ((version, length),)
            return [self._completion(length, spans)] * n
        made: dict[int, Completion] = {}
        out = []
        for length in completion_lengths(work, n):
            completion = made.get(length)
            if completion is None:
                completion = made[length] = self._completion(
                    length, version_spans(length, work, start, version, updates))
            out.append(completion)
        return out

    def _completion(self, length: int, spans: VersionSpans) -> Completion:
        ids, logprobs = self._zeros.views(length)
        # Valid by construction (spans of ``length`` tokens, non-decreasing versions):
        # the constructor's checks would cost ~15 % of a simulated group's record work.
        return built_valid(ids, logprobs, spans, "stop")  # type: ignore[arg-type]


def count_masked(rollout: Rollout, *, step: int, cfg: LossConfig, stats: MaskStats) -> None:
    """Add ``rollout``'s tokens and the ones the trainer's masks exclude at
    training step ``step`` to ``stats``: :func:`asyncrl.trainers.masks.token_masks`'s
    rule, counted per span instead of per token (the simulator's completions
    have no ``loss_mask``; one that has is handed to ``token_masks`` itself)."""
    count_masked_chunk((rollout,), step=step, cfg=cfg, stats=stats)


def count_masked_chunk(rollouts: Iterable[Rollout], *, step: int, cfg: LossConfig,
                       stats: MaskStats) -> None:
    """:func:`count_masked` for each of ``rollouts`` (a training chunk)."""
    oldest = None if cfg.max_token_staleness is None else step - cfg.max_token_staleness
    masks_truncated = cfg.truncated == "mask"
    tokens = masked = completions = truncated = 0
    for rollout in rollouts:
        # A simulated group's completions are often one shared record: counted once.
        records = counted(rollout.result.completions)
        for c, _ in records:
            if c.loss_mask is not None:
                token_masks(rollout, step=step, cfg=cfg, stats=stats)
                break
        else:
            for c, times in records:
                n = len(c.token_ids) * times
                tokens += n
                completions += times
                if c.finish_reason == "length":
                    truncated += times
                    if masks_truncated:
                        masked += n
                        continue
                if oldest is not None:
                    for version, count in c.versions:
                        if version < oldest:
                            masked += count * times
    stats.tokens += tokens
    stats.masked += masked
    stats.completions += completions
    stats.truncated += truncated
