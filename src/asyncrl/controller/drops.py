"""What becomes of a prompt that ran out of attempts: the failure budgets,
replacement from a pool of spare prompts, and the steps that shrink.

A prompt whose group exhausts its data budget is *skipped* (at most
``max_skipped_prompts`` over the run); one that exhausts its infra budget is
*dropped* (at most ``max_consecutive_dropped_prompts`` in a row: any commit
resets the count). Either way the group it would have been is missing from a
step, and ``on_dropped_prompt`` decides:

* ``replace``: a fresh prompt from the spare pool takes the group's place, with
  its stamp, pin and dispatch batch (not through ``admit``), up to
  ``max_replacement_attempts`` fresh prompts per lost group; when those or the
  spares run out, the step shrinks instead;
* ``shrink``: the step the group was meant for trains on one group fewer - its
  ``target_step`` when the sampler stamps one, else the step of its dispatch
  batch (or the step in progress, if that one has gone by). A step never
  shrinks below ``ceil(min_step_batch_fraction * num_prompts_per_step)``.

A budget that runs out raises :class:`~asyncrl.errors.TooManyFailedGroups`
naming it, from the error that used it up; the controller then stops the run
at its next safe point with a checkpoint. The group that would have used the
budget up is not dropped: it stays pending, and the run resumed after the fix
tries it again, so no step is left short of a group by the stop.

The spare pool is refilled with one dispatch batch of prompts from the task
whenever a replacement finds it below ``replacement_reserve_prompts``. Once the
task's prompts run out, the admitter takes the spares that are left into the
last batches (:meth:`DropPolicy.release_spare`): a finite source trains every
prompt it drew.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from asyncrl.config.failures import RolloutFailureConfig
from asyncrl.controller.entry import Entry
from asyncrl.controller.failure_log import error_line
from asyncrl.errors import (
    EngineRewardError,
    FailureKind,
    PromptError,
    RewardError,
    RewardTimeout,
    RewardWorkerLost,
    TooManyFailedGroups,
    failure_kind,
)
from asyncrl.types import Prompt, prompt_from_dict, prompt_label, prompt_to_dict

#: Dropped prompts the summary lists by name (the newest); all of them are in ledger.jsonl.
KEEP_DROPPED = 100
#: Counters reported per step and in total.
COUNTERS = ("groups_failed_infra", "groups_failed_data", "prompts_skipped", "prompts_replaced")
#: Counters reported in total only.
TOTALS = ("steps_shrunk", "groups_shrunk")

Draw = Callable[[int], list[Prompt]]


def _fix(error: BaseException) -> str:
    """What to do about the failure that used a budget up, for the component
    that raised it (the reward's failures are not the engines' to fix)."""
    if isinstance(error, RewardTimeout):
        return ("The reward is too slow or hangs: fix it, or raise the timeout the error "
                "names (task.reward.executor: process kills a hung call)")
    if isinstance(error, RewardWorkerLost):
        return "The reward's worker process died: fix the reward (its error is printed above)"
    if isinstance(error, EngineRewardError):
        return "Fix the rollout function or engine the error names (it returned the rewards)"
    if isinstance(error, RewardError):
        # Not "where it raised": a reward that returned nan, None or a list raised nothing.
        return "Fix the reward function (the error says what went wrong)"
    if isinstance(error, PromptError):
        return "Fix the task or the data (the error names the prompt)"
    if failure_kind(error) == "data":
        return "Fix the reward, the task or the data"
    return "Check the engines (their logs say why)"


class DropPolicy:
    def __init__(self, cfg: RolloutFailureConfig, num_prompts_per_step: int) -> None:
        self.cfg = cfg
        self.n = num_prompts_per_step
        self.floor = cfg.step_floor(num_prompts_per_step)
        #: Prompts that exhausted their data budget, over the whole run.
        self.skipped = 0
        #: Prompts that exhausted their infra budget since the last commit.
        self.consecutive = 0
        #: Groups each step lost to shrinking (step -> count), until it is trained.
        self.credits: dict[int, int] = {}
        self.spares: collections.deque[Prompt] = collections.deque()
        self.totals: collections.Counter[str] = collections.Counter()
        self.this_step: collections.Counter[str] = collections.Counter()
        self.by_reason: collections.Counter[str] = collections.Counter()
        self.recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP_DROPPED)

    # ------------------------------------------------------------ the pumps
    def committed(self) -> None:
        """A group reached the buffer: an infra outage, if any, is over."""
        self.consecutive = 0

    def quota(self, step: int) -> int:
        """Groups step ``step`` trains on: ``num_prompts_per_step`` less its losses."""
        return self.n - self.credits.get(step, 0)

    def step_done(self, step: int) -> dict[str, int]:
        """Step ``step`` was trained: its counters for ``metrics.jsonl``."""
        lost = self.credits.pop(step, 0)
        if lost:
            self.totals["steps_shrunk"] += 1
            self.totals["groups_shrunk"] += lost
        counts = {key: self.this_step[key] for key in COUNTERS}
        self.this_step.clear()
        return counts

    def drop(self, entry: Entry, kind: FailureKind, error: BaseException, *, step: int,
             draw: Draw) -> Entry | None:
        """``entry``'s group ran out of ``kind`` attempts while step ``step`` is being
        assembled: charge the budgets, then the replacement to queue (None: the
        step shrank).

        Raises :class:`TooManyFailedGroups` when dropping the group would use a
        budget up (a skip or a drop too many, or its step below the floor). Then
        nothing is charged: the group is not dropped but stays pending, and the
        checkpoint keeps it, so the run resumed after the fix tries it again
        (with a fresh budget of attempts) and its step waits for it rather than
        for a group that will never come."""
        rf = self.cfg
        who = f"group {entry.group_id!r}, {prompt_label(entry.prompt)}"
        target = max(step, entry.stamp if entry.stamp is not None
                     else entry.batch_index if entry.batch_index is not None else step)
        if kind == "data" and self.skipped + 1 > rf.max_skipped_prompts:
            raise TooManyFailedGroups(
                f"{self.skipped + 1} prompt(s) failed max_data_attempts_per_prompt="
                f"{rf.max_data_attempts_per_prompt} times as data, more than "
                f"async_rl.rollout_failure.max_skipped_prompts={rf.max_skipped_prompts}; "
                f"the last, {who}: {error_line(error)}. {_fix(error)}, or "
                f"raise {self._allow('max_skipped_prompts')} to skip such prompts") from error
        if kind == "infra" and self.consecutive + 1 > rf.max_consecutive_dropped_prompts:
            raise TooManyFailedGroups(
                f"{self.consecutive + 1} prompt(s) in a row failed "
                f"max_infra_attempts_per_prompt={rf.max_infra_attempts_per_prompt} times as "
                f"infrastructure, more than async_rl.rollout_failure."
                f"max_consecutive_dropped_prompts={rf.max_consecutive_dropped_prompts}; the "
                f"last, {who}: {error_line(error)}. {_fix(error)}, or raise "
                f"max_infra_attempts_per_prompt or {self._allow('max_consecutive_dropped_prompts')}"
                " to ride out an outage") from error
        replacement = None
        if rf.on_dropped_prompt == "replace" and entry.replacements < rf.max_replacement_attempts:
            replacement = self.replacement(entry, draw, charged=True)
        lost = self.credits.get(target, 0) + 1
        if replacement is None and self.n - lost < self.floor:
            fix = ("raise max_replacement_attempts or replacement_reserve_prompts"
                   if rf.on_dropped_prompt == "replace" else "use on_dropped_prompt: replace")
            raise TooManyFailedGroups(
                f"step {target} lost {lost} of its num_prompts_per_step={self.n} groups and "
                f"would train on {self.n - lost}, below the floor of {self.floor} "
                f"(async_rl.rollout_failure.min_step_batch_fraction="
                f"{rf.min_step_batch_fraction:g}); the last lost: {who}, {kind}: "
                f"{error_line(error)}. Fix what fails, {fix}, or lower "
                "min_step_batch_fraction") from error
        # Dropped for good: charge the budgets and record it.
        if kind == "data":
            self.skipped += 1
            self._count("prompts_skipped")
        else:
            self.consecutive += 1
        self._count(f"groups_failed_{kind}")
        self.by_reason[f"{kind}: {type(error).__name__}"] += 1
        record = {"prompt_id": entry.prompt.prompt_id, "group_id": entry.group_id,
                  "kind": kind, "attempts": entry.attempts, "target_step": entry.stamp,
                  "error": error_line(error)}
        source = entry.prompt.meta.get("source")
        if source is not None:  # where a user finds the prompt (a dataset's file and line)
            record["source"] = source
        self.recent.append(record)
        if replacement is not None:
            self._count("prompts_replaced")
            record["outcome"] = "replaced"
            return replacement
        record["outcome"] = f"step {target} shrank"
        self.credits[target] = lost
        return None

    def _allow(self, budget: str) -> str:
        """How to let a run drop prompts under ``budget``: raising it alone does
        nothing when no step may shrink (``min_step_batch_fraction`` puts the floor
        at ``num_prompts_per_step``, as the default 0.9 does below 10 prompts):
        the first drop would stop the run at the floor instead - so say to replace."""
        if self.cfg.on_dropped_prompt == "shrink" and self.n - 1 < self.floor:
            return (f"{budget} together with on_dropped_prompt: replace (a step of "
                    f"num_prompts_per_step={self.n} may not shrink: min_step_batch_fraction="
                    f"{self.cfg.min_step_batch_fraction:g} puts its floor at {self.floor})")
        return budget

    def replacement(self, entry: Entry, draw: Draw, *, charged: bool) -> Entry | None:
        """A fresh prompt from the spare pool in ``entry``'s place, with its stamp,
        pin and dispatch batch (None: the pool and the task are dry). ``charged``:
        it counts against ``max_replacement_attempts`` (a failure's replacement;
        a filtered group's has its own budget, :mod:`asyncrl.controller.dynamic_sampling`)."""
        spare = self._spare(draw)
        if spare is None:
            return None
        return Entry(spare, entry.stamp, entry.pin, batch_index=entry.batch_index,
                     replacements=entry.replacements + charged)

    def release_spare(self) -> Prompt | None:
        """The task's prompts ran out: a spare to admit as an ordinary prompt (None:
        the pool is empty). Drawn prompts are trained, not stranded in the pool;
        a later drop, finding the pool empty, shrinks its step instead."""
        return self.spares.popleft() if self.spares else None

    def _spare(self, draw: Draw) -> Prompt | None:
        if len(self.spares) < max(1, self.cfg.replacement_reserve_prompts):
            self.spares.extend(draw(self.n))
        return self.spares.popleft() if self.spares else None

    def _count(self, key: str) -> None:
        self.totals[key] += 1
        self.this_step[key] += 1

    # -------------------------------------------------------------- reports
    def summary(self) -> dict[str, Any]:
        """For ``summary.json``: the counts, why prompts were dropped, the newest ones."""
        return {**{key: self.totals[key] for key in (*COUNTERS, *TOTALS)},
                "dropped_by_reason": dict(self.by_reason),
                "dropped_prompts": list(self.recent)}

    # ---------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        return {"skipped": self.skipped, "consecutive": self.consecutive,
                "credits": {str(k): v for k, v in self.credits.items()},
                "spares": [prompt_to_dict(p) for p in self.spares],
                "totals": dict(self.totals), "by_reason": dict(self.by_reason),
                "recent": list(self.recent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped = int(state.get("skipped", 0))
        self.consecutive = int(state.get("consecutive", 0))
        self.credits = {int(k): int(v) for k, v in state.get("credits", {}).items()}
        self.spares = collections.deque(prompt_from_dict(p) for p in state.get("spares", ()))
        self.totals = collections.Counter(state.get("totals", {}))
        self.by_reason = collections.Counter(state.get("by_reason", {}))
        self.recent = collections.deque(state.get("recent", ()), maxlen=KEEP_DROPPED)


__all__ = ["COUNTERS", "DropPolicy"]
