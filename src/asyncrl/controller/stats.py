"""Step metrics and run totals: what the controller reports, computed in one place."""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl._util.bounded import KEEP
from asyncrl.buffer import Slot
from asyncrl.record import counted

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


@dataclasses.dataclass
class TrainedRecords:
    """What the records of a step's trained groups hold, read in one pass over
    their completions' version spans (O(spans): a record shared by several
    completions is read once, times their number)."""

    #: The groups' rewards, in order.
    rewards: list[float]
    #: ``step - version`` of every token, counted (token staleness).
    hist: collections.Counter[int]
    #: Tokens sampled after their group's first weight update (``version > start_weight``).
    after: int
    #: ``end_weight - start_weight`` of each group.
    spans: list[int]
    #: Completion lengths in tokens, counted, and how many were cut off at the
    #: token limit (``finish_reason`` length).
    lengths: collections.Counter[int]
    clipped: int

    @property
    def tokens(self) -> int:
        """Every trained token (the spans of a completion cover its tokens)."""
        return sum(self.hist.values())


def read_trained(trained: Sequence[tuple[Slot, int]], step: int) -> TrainedRecords:
    """The :class:`TrainedRecords` of the groups step ``step`` trains."""
    rewards: list[float] = []
    hist: dict[int, int] = {}
    lengths: dict[int, int] = {}
    after = clipped = 0
    spans = []
    hist_get, lengths_get = hist.get, lengths.get  # once per step, not per span
    for slot, _ in trained:
        rollout = slot.payload
        rewards += rollout.rewards
        result = rollout.result
        start = end = result.start_weight
        for completion, times in counted(result.completions):
            size = len(completion.token_ids)
            lengths[size] = lengths_get(size, 0) + times
            if completion.finish_reason == "length":
                clipped += times
            for version, count in completion.versions:
                age, count = step - version, count * times
                hist[age] = hist_get(age, 0) + count
                if version > start:
                    after += count
                    if version > end:
                        end = version
        spans.append(end - start)  # end: the result's end_weight
    return TrainedRecords(rewards, collections.Counter(hist), after, spans,
                          collections.Counter(lengths), clipped)


def token_facts(trained: Sequence[tuple[Slot, int]], step: int) -> dict[str, Any]:
    """Token-level staleness of the groups a step trains: ``step - version`` of
    every token, the fraction of tokens sampled after their group's first weight
    update (``version > start_weight``) and each group's version span
    (``end_weight - start_weight``)."""
    return _token_facts(read_trained(trained, step))


def _token_facts(records: TrainedRecords) -> dict[str, Any]:
    hist, spans = records.hist, records.spans
    tokens = records.tokens
    return {
        "train/token_staleness_mean": (sum(k * n for k, n in hist.items()) / tokens
                                       if tokens else math.nan),
        "train/token_staleness_p95": hist_quantile(hist, 0.95) if tokens else 0,
        "train/token_staleness_max": max(hist, default=0),
        "train/tokens_after_update_frac": records.after / tokens if tokens else 0.0,
        "train/group_version_span_mean": mean(spans),
        "train/group_version_span_max": max(spans, default=0),
        "token_staleness_hist": {str(k): hist[k] for k in sorted(hist)},
    }


def completion_lengths(trained: Sequence[tuple[Slot, int]]) -> tuple[collections.Counter[int], int]:
    """The lengths (in tokens) of the completions a step trains, counted, and how
    many were cut off at the token limit (``finish_reason`` length)."""
    records = read_trained(trained, 0)
    return records.lengths, records.clipped


def completion_facts(lengths: collections.Counter[int], clipped: int) -> dict[str, Any]:
    """``rollout/completion_len_*`` (mean, p50, p90, max, min) and the clipped fraction."""
    n = sum(lengths.values())
    if not n:
        return {}
    return {
        "rollout/completion_len_mean": sum(k * c for k, c in lengths.items()) / n,
        "rollout/completion_len_p50": hist_quantile(lengths, 0.5),
        "rollout/completion_len_p90": hist_quantile(lengths, 0.9),
        "rollout/completion_len_max": max(lengths),
        "rollout/completion_len_min": min(lengths),
        "rollout/completion_clipped_frac": clipped / n,
    }


#: Step-record keys that measure time or momentary occupancy, not what was
#: trained: deterministic mode reproduces every other key exactly.
TIMING_KEYS = frozenset({"wall_time_s", "step_time_s", "trainer_idle_s", "generator_util",
                         "groups_per_s", "weight_sync_s", "buffer_ready", "inflight",
                         "rollout/generated_tokens"})
TIMING_PREFIXES = ("time/", "throughput/")


def measures_timing(key: str) -> bool:
    """True for a step-record key that depends on timing (see :data:`TIMING_KEYS`)."""
    return key in TIMING_KEYS or key.startswith(TIMING_PREFIXES)


#: The numbers every step's ``metrics.jsonl`` record holds besides the trainer's
#: own (``train/<name>``) and the evaluation's (``eval/<name>``, at eval steps):
#: what ``checkpoint.keep_best.metric`` may rank by (tests/checkpoint checks the
#: list against a real run's records).
STEP_METRICS = (
    "reward_mean", "staleness_mean", "staleness_max", "step", "trainer_version",
    "wall_time_s", "step_time_s", "groups_trained", "groups_evicted", "groups_aborted",
    "groups_failed", "groups_failed_data", "groups_failed_infra", "prompts_replaced",
    "prompts_skipped", "trainer_idle_s", "weight_sync_s", "buffer_ready", "inflight",
    "generator_util", "groups_per_s", "time/train_s", "time/optimizer_step_s", "time/eval_s",
    "time/other_s", "time/generation_s", "throughput/generated_tokens_per_s",
    "throughput/trained_tokens_per_s", "rollout/completion_len_mean",
    "rollout/completion_len_min", "rollout/completion_len_max", "rollout/completion_len_p50",
    "rollout/completion_len_p90", "rollout/completion_clipped_frac",
    "rollout/generated_tokens", "rollout/trained_tokens", "train/token_staleness_mean",
    "train/token_staleness_p95", "train/token_staleness_max",
)


#: The trainer side's time split of a step (``time/<key>`` per step, summed in the
#: summary's ``time_split``); with ``trainer_idle_s`` and ``weight_sync_s`` they add
#: up to ``step_time_s``.
TRAINER_TIMES = ("train_s", "optimizer_step_s", "eval_s", "other_s")


@dataclasses.dataclass(frozen=True)
class StepMark:
    """The running integrals when a step began: a step's share is the difference."""

    time: float
    busy_area: float
    generating: float
    generated_tokens: int


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
        #: Steps whose optimizer step the trainer skipped for a non-finite gradient.
        self.skipped_steps = 0
        self.max_inflight_seen = 0
        self.max_buffer_seen = 0
        self._inflight = 0
        self._busy_area = 0.0
        self._busy_mark = 0.0
        #: Engine generate calls running, and the time at least one was (integrated).
        self._generating = 0
        self._generating_s = 0.0
        self._generating_mark = 0.0
        #: Run totals (summary.json), kept across a resume.
        self.generated_tokens = 0
        self.trained_tokens = 0
        self.time_totals: collections.Counter[str] = collections.Counter()
        #: Trained completions: how many, their tokens, how many were clipped.
        self.completions: collections.Counter[str] = collections.Counter()
        self.completion_len_max = 0
        self.completion_len_min: int | None = None
        #: Called for every step record; their numbers join it (``autopilot/*``).
        self.extras: list[Callable[[], dict[str, float]]] = []

    def start(self, now: float) -> None:
        self.t0 = now - self.elapsed_before
        self._busy_mark = now
        self._generating_mark = now

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

    def generation_changed(self, now: float, delta: int) -> None:
        """An engine's ``generate`` call began (+1) or ended (-1)."""
        generating = self._generating
        if generating:
            self._generating_s += now - self._generating_mark
        self._generating_mark = now
        self._generating = generating + delta

    def tokens_generated(self, tokens: int) -> None:
        """An engine returned ``tokens`` completion tokens it generated."""
        self.generated_tokens += tokens

    def mark(self, now: float) -> StepMark:
        """The start of a step (``step_record`` measures from it)."""
        self.generation_changed(now, 0)
        return StepMark(now, self.busy_area(now), self._generating_s, self.generated_tokens)

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
        start: StepMark,
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
        times: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        """The ``metrics.jsonl`` record of step ``step``; updates the run totals.
        ``times``: the trainer side's seconds by :data:`TRAINER_TIMES` key (the
        rest of the step, ``other_s``, is computed)."""
        duration = max(now - start.time, 1e-12)
        staleness = [s for _, s in trained]
        records = read_trained(trained, step)
        rewards = records.rewards
        hist = collections.Counter(staleness)
        self.staleness_hist.update(hist)
        self.trainer_idle_total += idle
        self.steps_done += 1
        busy = self.busy_area(now) - start.busy_area
        lengths, clipped = records.lengths, records.clipped
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
            **self._time_split(now, start, duration, idle, sync_s, times or {}),
            **self._throughput(start, duration, records.tokens),
            **completion_facts(lengths, clipped),
            **_token_facts(records),
        }
        self.token_staleness_hist.update(records.hist)
        self._add_completions(lengths, clipped)
        self.failed_this_step = 0
        for key in sorted({k for _, m in chunk_metrics for k in m}):
            vals = [(n, m[key]) for n, m in chunk_metrics if key in m]
            weight = sum(n for n, _ in vals) or 1
            record[f"train/{key}"] = sum(n * x for n, x in vals) / weight
        for key, value in step_metrics.items():
            record[f"train/{key}"] = value
        self.skipped_steps += bool(step_metrics.get("skipped_nonfinite_step"))
        for extra in self.extras:
            record.update(extra())
        self.records.append(record)
        return record

    def _time_split(self, now: float, start: StepMark, duration: float, idle: float,
                    sync_s: float, times: dict[str, float]) -> dict[str, float]:
        """``time/<key>``: where the trainer side's step went, and how long the
        engines generated meanwhile (at least one ``generate`` call running)."""
        split = {key: float(times.get(key, 0.0)) for key in TRAINER_TIMES[:-1]}
        # What the others leave: sampler calls, bookkeeping (never below 0 by rounding).
        split["other_s"] = max(0.0, duration - idle - sync_s - sum(split.values()))
        self.generation_changed(now, 0)
        generating = self._generating_s - start.generating
        for key, value in (*split.items(), ("trainer_idle_s", idle), ("weight_sync_s", sync_s),
                           ("generation_s", generating), ("step_s", duration)):
            self.time_totals[key] += value
        return {**{f"time/{k}": v for k, v in split.items()}, "time/generation_s": generating}

    def _throughput(self, start: StepMark, duration: float,
                    trained_tokens: int) -> dict[str, float]:
        """Completion tokens the engines returned during the step and those the
        step trained, with their rates over the step's time."""
        generated = self.generated_tokens - start.generated_tokens
        self.trained_tokens += trained_tokens
        return {"rollout/generated_tokens": generated, "rollout/trained_tokens": trained_tokens,
                "throughput/generated_tokens_per_s": generated / duration,
                "throughput/trained_tokens_per_s": trained_tokens / duration}

    def _add_completions(self, lengths: collections.Counter[int], clipped: int) -> None:
        if not lengths:
            return
        self.completions["count"] += sum(lengths.values())
        self.completions["tokens"] += sum(k * c for k, c in lengths.items())
        self.completions["clipped"] += clipped
        self.completion_len_max = max(self.completion_len_max, max(lengths))
        low = min(lengths)
        self.completion_len_min = (low if self.completion_len_min is None
                                   else min(self.completion_len_min, low))

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
            "skipped_nonfinite_steps": self.skipped_steps,
            "reward_last10_mean": mean([r["reward_mean"] for r in last]),
            "trainer_idle_s": self.trainer_idle_total,
            "max_inflight_seen": self.max_inflight_seen,
            "max_buffer_seen": self.max_buffer_seen,
            "time_split": self._time_totals(),
            "throughput": {
                "generated_tokens": self.generated_tokens,
                "trained_tokens": self.trained_tokens,
                "generated_tokens_per_s": self.generated_tokens / elapsed if elapsed > 0 else 0.0,
                "trained_tokens_per_s": self.trained_tokens / elapsed if elapsed > 0 else 0.0,
            },
            "completion_len": self._completion_totals(),
        }

    def _time_totals(self) -> dict[str, float]:
        """The steps' time, summed by part, and each part's fraction of it."""
        t = self.time_totals
        steps = t["step_s"]
        parts = ("trainer_idle_s", "train_s", "optimizer_step_s", "weight_sync_s", "eval_s",
                 "other_s", "generation_s")
        return {"steps_s": steps, **{key: t[key] for key in parts},
                **{f"{key[:-2]}_frac": t[key] / steps if steps > 0 else 0.0 for key in parts}}

    def _completion_totals(self) -> dict[str, Any]:
        n = self.completions["count"]
        return {"completions": n,
                "mean": self.completions["tokens"] / n if n else 0.0,
                "min": self.completion_len_min or 0, "max": self.completion_len_max,
                "clipped_frac": self.completions["clipped"] / n if n else 0.0}

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
            "skipped_steps": self.skipped_steps,
            "groups_continued": self.groups_continued,
            "staleness_hist": {str(k): n for k, n in self.staleness_hist.items()},
            "token_staleness_hist": {str(k): n for k, n in self.token_staleness_hist.items()},
            "trainer_idle_s": self.trainer_idle_total,
            "elapsed_s": elapsed,
            "generated_tokens": self.generated_tokens,
            "trained_tokens": self.trained_tokens,
            "time_totals": dict(self.time_totals),
            "completions": dict(self.completions),
            "completion_len_max": self.completion_len_max,
            "completion_len_min": self.completion_len_min,
        }

    def load_state_dict(self, state: dict[str, Any], steps_done: int) -> None:
        self.steps_done = steps_done
        self.failed_groups = int(state.get("failed_groups", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.staleness_hist = collections.Counter(
            {int(k): int(n) for k, n in state.get("staleness_hist", {}).items()}
        )
        self.token_staleness_hist = collections.Counter(
            {int(k): int(n) for k, n in state.get("token_staleness_hist", {}).items()}
        )
        self.groups_continued = int(state.get("groups_continued", 0))
        self.trainer_idle_total = float(state.get("trainer_idle_s", 0.0))
        self.elapsed_before = float(state.get("elapsed_s", 0.0))
        # Checkpoints from before these totals start them at zero.
        self.generated_tokens = int(state.get("generated_tokens", 0))
        self.trained_tokens = int(state.get("trained_tokens", 0))
        self.time_totals = collections.Counter(state.get("time_totals", {}))
        self.completions = collections.Counter(state.get("completions", {}))
        self.completion_len_max = int(state.get("completion_len_max", 0))
        low = state.get("completion_len_min")
        self.completion_len_min = None if low is None else int(low)
