"""Step metrics and run totals: what the controller reports, computed in one place."""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence
from typing import Any

from asyncrl._bounded import KEEP
from asyncrl.buffer import Slot

#: Step records kept in memory (every one is in metrics.jsonl).
KEEP_RECORDS = KEEP


def mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else math.nan


def hist_quantile(hist: collections.Counter[int], q: float) -> int:
    """The smallest value at or below which a fraction ``q`` of the counts lie."""
    total = sum(hist.values())
    seen = 0
    for value in sorted(hist):
        seen += hist[value]
        if seen >= q * total:
            return value
    return 0


def token_facts(trained: Sequence[tuple[Slot, int]], step: int) -> dict[str, Any]:
    """Token-level staleness of the groups a step trains: ``step - version`` of
    every token, the fraction of tokens sampled after their group's first weight
    update (``version > start_weight``) and each group's version span
    (``end_weight - start_weight``)."""
    hist: collections.Counter[int] = collections.Counter()
    after = 0
    spans = []
    for slot, _ in trained:
        result = slot.payload.result
        start = result.start_weight
        spans.append(result.end_weight - start)
        for completion in result.completions:
            for version, count in completion.versions:
                hist[step - version] += count
                if version > start:
                    after += count
    tokens = sum(hist.values())
    return {
        "train/token_staleness_mean": (sum(k * n for k, n in hist.items()) / tokens
                                       if tokens else math.nan),
        "train/token_staleness_p95": hist_quantile(hist, 0.95) if tokens else 0,
        "train/token_staleness_max": max(hist, default=0),
        "train/tokens_after_update_frac": after / tokens if tokens else 0.0,
        "train/group_version_span_mean": mean(spans),
        "train/group_version_span_max": max(spans, default=0),
        "token_staleness_hist": {str(k): hist[k] for k in sorted(hist)},
    }


class RunStats:
    """Counters the pumps update as they go, turned into one record per step
    (``metrics.jsonl``) and the run summary (``summary.json``).

    ``generator_util`` integrates the number of groups in flight over time: the
    dispatcher reports every change of that number with :meth:`inflight_changed`.
    """

    def __init__(self, max_inflight: int) -> None:
        self.max_inflight = max_inflight
        self.t0 = 0.0
        #: Wall time of the runs this one resumes.
        self.elapsed_before = 0.0
        self.steps_done = 0
        #: The newest step records (a run of 10^6 steps keeps only these in memory;
        #: every record is in metrics.jsonl).
        self.records: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP_RECORDS)
        self.staleness_hist: collections.Counter[int] = collections.Counter()
        self.token_staleness_hist: collections.Counter[int] = collections.Counter()
        #: Groups resumed with the tokens they had at a stop that then finished.
        self.groups_continued = 0
        self.trainer_idle_total = 0.0
        self.failed_groups = 0
        self.failed_this_step = 0
        self.max_inflight_seen = 0
        self.max_buffer_seen = 0
        self._inflight = 0
        self._busy_area = 0.0
        self._busy_mark = 0.0

    def start(self, now: float) -> None:
        self.t0 = now - self.elapsed_before
        self._busy_mark = now

    # ----------------------------------------------------------- live updates
    def inflight_changed(self, now: float, inflight: int) -> None:
        self._busy_area += self._inflight * (now - self._busy_mark)
        self._busy_mark = now
        self._inflight = inflight
        if inflight > self.max_inflight_seen:
            self.max_inflight_seen = inflight

    def buffer_size(self, size: int) -> None:
        if size > self.max_buffer_seen:
            self.max_buffer_seen = size

    def busy_area(self, now: float) -> float:
        self.inflight_changed(now, self._inflight)
        return self._busy_area

    def group_failed(self) -> int:
        self.failed_groups += 1
        self.failed_this_step += 1
        return self.failed_groups

    # ------------------------------------------------------------ step record
    def step_record(
        self,
        *,
        step: int,
        now: float,
        step_start: float,
        busy_at_start: float,
        idle: float,
        trained: Sequence[tuple[Slot, int]],
        chunk_metrics: Sequence[tuple[int, dict[str, float]]],
        step_metrics: dict[str, float],
        evicted: int,
        aborted: int,
        sync_s: float,
        buffer_ready: int,
        inflight: int,
        failures: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        """The ``metrics.jsonl`` record of step ``step``; updates the run totals."""
        duration = max(now - step_start, 1e-12)
        staleness = [s for _, s in trained]
        rewards = [r for slot, _ in trained for r in slot.payload.rewards]
        hist = collections.Counter(staleness)
        self.staleness_hist.update(hist)
        self.trainer_idle_total += idle
        self.steps_done += 1
        busy = self.busy_area(now) - busy_at_start
        record: dict[str, Any] = {
            "step": step,
            "trainer_version": step + 1,
            "wall_time_s": now - self.t0,
            "step_time_s": duration,
            "reward_mean": mean(rewards),
            "staleness_mean": mean(staleness),
            "staleness_max": max(staleness) if staleness else 0,
            "staleness_hist": {str(k): hist[k] for k in sorted(hist)},
            "groups_trained": len(trained),
            "groups_evicted": evicted,
            "groups_aborted": aborted,
            "groups_failed": self.failed_this_step,
            **(failures or {}),
            "trainer_idle_s": idle,
            "weight_sync_s": sync_s,
            "buffer_ready": buffer_ready,
            "inflight": inflight,
            "generator_util": busy / (duration * self.max_inflight),
            "groups_per_s": len(trained) / duration,
            **token_facts(trained, step),
        }
        self.token_staleness_hist.update(
            {int(k): n for k, n in record["token_staleness_hist"].items()})
        self.failed_this_step = 0
        for key in sorted({k for _, m in chunk_metrics for k in m}):
            vals = [(n, m[key]) for n, m in chunk_metrics if key in m]
            weight = sum(n for n, _ in vals) or 1
            record[f"train/{key}"] = sum(n * x for n, x in vals) / weight
        for key, value in step_metrics.items():
            record[f"train/{key}"] = value
        self.records.append(record)
        return record

    # ----------------------------------------------------------------- totals
    def totals(self, elapsed: float) -> dict[str, Any]:
        """The summary's statistics (the controller adds ledger and stop reason)."""
        n = sum(self.staleness_hist.values())
        last = list(self.records)[-10:]
        return {
            "wall_time_s": elapsed,
            "staleness_mean": (
                sum(k * c for k, c in self.staleness_hist.items()) / n if n else 0.0
            ),
            "staleness_max": max(self.staleness_hist, default=0),
            "staleness_hist": {str(k): self.staleness_hist[k] for k in sorted(self.staleness_hist)},
            **self._token_totals(),
            "groups_continued": self.groups_continued,
            "reward_last10_mean": mean([r["reward_mean"] for r in last]),
            "trainer_idle_s": self.trainer_idle_total,
            "max_inflight_seen": self.max_inflight_seen,
            "max_buffer_seen": self.max_buffer_seen,
        }

    def _token_totals(self) -> dict[str, Any]:
        hist = self.token_staleness_hist
        n = sum(hist.values())
        return {
            "token_staleness_mean": sum(k * c for k, c in hist.items()) / n if n else 0.0,
            "token_staleness_p95": hist_quantile(hist, 0.95) if n else 0,
            "token_staleness_max": max(hist, default=0),
            "token_staleness_hist": {str(k): hist[k] for k in sorted(hist)},
        }

    # ------------------------------------------------------------ persistence
    def state_dict(self, elapsed: float) -> dict[str, Any]:
        return {
            "failed_groups": self.failed_groups,
            "groups_continued": self.groups_continued,
            "staleness_hist": {str(k): n for k, n in self.staleness_hist.items()},
            "token_staleness_hist": {str(k): n for k, n in self.token_staleness_hist.items()},
            "trainer_idle_s": self.trainer_idle_total,
            "elapsed_s": elapsed,
        }

    def load_state_dict(self, state: dict[str, Any], steps_done: int) -> None:
        self.steps_done = steps_done
        self.failed_groups = int(state.get("failed_groups", 0))
        self.staleness_hist = collections.Counter(
            {int(k): int(n) for k, n in state.get("staleness_hist", {}).items()}
        )
        self.token_staleness_hist = collections.Counter(
            {int(k): int(n) for k, n in state.get("token_staleness_hist", {}).items()}
        )
        self.groups_continued = int(state.get("groups_continued", 0))
        self.trainer_idle_total = float(state.get("trainer_idle_s", 0.0))
        self.elapsed_before = float(state.get("elapsed_s", 0.0))
