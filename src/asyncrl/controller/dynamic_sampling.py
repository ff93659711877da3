"""Dynamic sampling at commit (``grpo.dynamic_sampling``, DAPO): what becomes of
a group the filter rejects, and the budget that bounds how much one step may
generate.

The unit of the budget is the **dispatch batch**: every ``admit`` lets one
batch of ``k = groups_per_batch(n)`` groups go (``n = num_prompts_per_step``,
``k = ceil(batch_multiplier * n)``), and each batch is there to feed one
training step (under ``in_order`` exactly step ``d`` of batch ``d``; under the
other samplers the step that takes its groups). "Per step" in the async runtime
therefore means *per dispatch batch*: a batch, its replacements included, may
generate at most ``max_gen_batches * k`` groups.

A rejected group is recorded ``filtered`` (it never takes a ready slot). While
its batch still has ``n`` groups that may be kept (``k`` admitted, plus
replacements, less the filtered ones), the over-sampled surplus absorbs it.
Otherwise it is replaced through the failure path's machinery (a prompt from
the spare pool, with the group's ``target_step`` stamp, pin and batch). A
replacement that would go past the budget is queued all the same but *owed*
(:attr:`~asyncrl.controller.entry.Entry.owed`): it is not generated, and the
run stops with :class:`~asyncrl.errors.DynamicSamplingBudgetExceeded`. The
checkpoint keeps it queued, so the run resumed after the fix generates it once
the new setting allows (a higher ``max_gen_batches`` or ``batch_multiplier``, or
``filter: none``) - its step gets the group an uninterrupted run would have
replaced, rather than wait forever for it - and stops again at the same budget
when nothing changed (:meth:`DynamicSampling.settle`). A group stamped for a
step that has been trained already is not replaced: nothing waits for it.

A batch keeps the size it was admitted with: one admitted before a resume
that raised ``batch_multiplier`` has ``k`` groups of the old multiplier and a
budget of ``max_gen_batches`` times the new ``k``.
"""

from __future__ import annotations

import collections
from typing import Any

from asyncrl.config import GRPOConfig
from asyncrl.config.dynamic_sampling import DynamicSamplingConfig
from asyncrl.controller.entry import Entry
from asyncrl.controller.validation import groups_per_batch
from asyncrl.errors import BackendBug, DynamicSamplingBudgetExceeded
from asyncrl.sampling import GroupFilter, PromptGroupSampler, build_filter
from asyncrl.types import GroupId

#: Distinct filter reasons the summary counts one by one; the rest are "other".
KEEP_REASONS = 20
#: Batches this far behind the step being trained forget their counts (a group
#: that late is counted afresh: the checkpoint does not grow with the run).
FORGET_AFTER = 64

BatchKey = int | None


class DynamicSampling:
    """The filter's accounting, per dispatch batch. Only built when the filter is
    on: with ``filter: none`` the dispatcher never calls into it."""

    def __init__(self, cfg: DynamicSamplingConfig, group_filter: GroupFilter,
                 groups_per_step: int, groups_per_batch: int) -> None:
        self.cfg = cfg
        self.filter = group_filter
        self.n = groups_per_step
        self.k = groups_per_batch
        #: Groups one batch may generate, its replacements included.
        self.budget = cfg.max_gen_batches * groups_per_batch
        #: Per batch: [groups filtered, replacements made, replacements owed].
        self.batches: dict[BatchKey, list[int]] = {}
        #: [first batch, groups per batch] from that batch on: a resume may
        #: change batch_multiplier, and a batch keeps the size it was admitted with.
        self.sizes: list[list[int]] = [[0, groups_per_batch]]
        self.totals: collections.Counter[str] = collections.Counter()
        self.by_reason: collections.Counter[str] = collections.Counter()
        #: This step's counts: kept and filtered groups, and the batches touched.
        self._kept = self._filtered = 0
        self._touched: set[BatchKey] = set()

    # ------------------------------------------------------------ the pumps
    def kept(self) -> None:
        """A finished group passed the filter (it is committed)."""
        self._kept += 1

    def filtered(self, entry: Entry, reason: str, *, assembling: int) -> bool:
        """``entry``'s group was rejected for ``reason`` while step ``assembling``
        is being filled: True when it must be replaced (then the caller queues a
        replacement and calls :meth:`replaced`), False when the surplus absorbs
        it or its step is gone."""
        self._filtered += 1
        self.totals["filtered"] += 1
        key = reason if reason in self.by_reason or len(self.by_reason) < KEEP_REASONS \
            else "other"
        self.by_reason[key] += 1
        batch = entry.batch_index
        counts = self._counts(batch)
        counts[0] += 1
        self._touched.add(batch)
        if entry.stamp is not None and entry.stamp < assembling:
            return False  # its step was trained without it
        filtered, replaced, owed = counts
        if self.size(batch) + replaced + owed - filtered >= self.n:
            self.totals["absorbed"] += 1
            return False
        return True

    def replaced(self, batch: BatchKey) -> DynamicSamplingBudgetExceeded | None:
        """A replacement for a group of ``batch`` was queued. None when the budget
        allows generating it; else the error that stops the run, and the
        replacement is owed: the caller marks it so, and it waits in the queue
        (in the checkpoint) for :meth:`settle` in the resumed run. Owed ones
        count for the surplus, so the groups filtered while the run stops are not
        replaced twice."""
        counts = self._counts(batch)
        if self.size(batch) + counts[1] + counts[2] < self.budget:
            counts[1] += 1
            self.totals["replaced"] += 1
            return None
        counts[2] += 1
        return DynamicSamplingBudgetExceeded(self._budget_message(batch, counts))

    def settle(self, batch: BatchKey) -> DynamicSamplingBudgetExceeded | None:
        """An owed replacement of ``batch`` is next in line (a resumed run): None
        when the budget in force allows generating it now (it counts as made),
        else the error that stops the run again, the replacement still owed."""
        counts = self._counts(batch)
        if self.size(batch) + counts[1] < self.budget:
            counts[1] += 1
            counts[2] = max(0, counts[2] - 1)
            self.totals["replaced"] += 1
            return None
        return DynamicSamplingBudgetExceeded(self._budget_message(batch, counts))

    def size(self, batch: BatchKey) -> int:
        """The groups ``batch`` was admitted with."""
        if batch is None:
            return self.k
        return next((k for first, k in reversed(self.sizes) if first <= batch), self.sizes[0][1])

    def _counts(self, batch: BatchKey) -> list[int]:
        return self.batches.setdefault(batch, [0, 0, 0])

    def filter_bug(self, error: Exception, group: GroupId) -> BackendBug:
        """The filter raised ``error`` on ``group``: a bug in the filter."""
        bug = BackendBug(
            f"the filter {type(self.filter).__qualname__} (grpo.dynamic_sampling.filter) "
            f"raised {type(error).__name__}: {error} on group {group!r}; a filter returns None "
            "or a reason and never raises. Fix it, then resume the run")
        bug.__cause__ = error
        return bug

    def _budget_message(self, batch: BatchKey, counts: list[int]) -> str:
        cfg = self.cfg
        generated = self.size(batch) + counts[1]
        return (
            f"dispatch batch {batch} generated {generated} groups ({cfg.max_gen_batches} "
            f"batch(es) of {self.k}); once the filter {cfg.filter!r} had rejected {counts[0]} "
            f"of them, at most {generated - counts[0]} could pass, fewer than the "
            f"num_prompts_per_step={self.n} groups its step needs (groups still generating "
            "are filtered as they finish: summary.json counts those too): "
            f"grpo.dynamic_sampling.max_gen_batches={cfg.max_gen_batches} is used up. "
            "Most groups carry no signal (every completion gets the same reward: the task is "
            "too easy or too hard for the policy). Raise grpo.dynamic_sampling.max_gen_batches "
            "or batch_multiplier, make the task's difficulty fit the policy, or set "
            "grpo.dynamic_sampling.filter: none")

    def step_done(self, step: int, trained: int) -> dict[str, float]:
        """Step ``step`` trained ``trained`` groups: its ``metrics.jsonl`` entries.

        ``train/filtered_frac``: of the groups that finished during the step, the
        share filtered; ``train/generated_per_trained``: groups that finished
        per group trained; ``train/filter_budget_used``: of ``max_gen_batches``,
        the share the most demanding batch touched during the step has used."""
        finished = self._kept + self._filtered
        used = max((self.size(b) + self.batches.get(b, (0, 0))[1] for b in self._touched),
                   default=self.k)
        metrics = {
            "train/filtered_frac": self._filtered / finished if finished else 0.0,
            "train/generated_per_trained": finished / trained if trained else 0.0,
            "train/filter_budget_used": used / self.budget,
        }
        self.totals["kept"] += self._kept
        self._kept = self._filtered = 0
        self._touched.clear()
        old = [b for b in self.batches if b is None or b < step - FORGET_AFTER]
        for b in old:
            del self.batches[b]
        while len(self.sizes) > 1 and self.sizes[1][0] < step - FORGET_AFTER:
            del self.sizes[0]
        return metrics

    # -------------------------------------------------------------- reports
    def summary(self, trained: int) -> dict[str, Any]:
        """For ``summary.json``: what the filter did over the run."""
        finished = self.totals["kept"] + self._kept + self.totals["filtered"]
        return {"filter": self.cfg.filter, "groups_per_batch": self.k,
                "filtered": self.totals["filtered"], "replaced": self.totals["replaced"],
                "absorbed_by_surplus": self.totals["absorbed"],
                "filtered_by_reason": dict(self.by_reason),
                "generated_per_trained": finished / trained if trained else 0.0}

    # ---------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        return {"batches": [[b, *c] for b, c in self.batches.items()], "sizes": [list(s) for s in self.sizes],
                "totals": dict(self.totals), "by_reason": dict(self.by_reason),
                "kept": self._kept, "filtered": self._filtered}

    def load_state_dict(self, state: dict[str, Any], *, admitted: int) -> None:
        """``admitted``: the batches admitted before the resume (they keep their size)."""
        # A checkpoint from before the owed count has [batch, filtered, replaced].
        self.batches = {c[0]: [int(c[1]), int(c[2]), int(c[3]) if len(c) > 3 else 0]
                        for c in state.get("batches", ())}
        self.sizes = [[int(b), int(k)] for b, k in state.get("sizes", ())] or [[0, self.k]]
        if self.sizes[-1][1] != self.k:  # batch_multiplier changed: batches from here on
            if self.sizes[-1][0] >= admitted:
                del self.sizes[-1]
            self.sizes.append([admitted, self.k])
        self.totals = collections.Counter(state.get("totals", {}))
        self.by_reason = collections.Counter(state.get("by_reason", {}))
        self._kept = int(state.get("kept", 0))
        self._filtered = int(state.get("filtered", 0))


def settle_owed(dynamic: DynamicSampling | None,
                entry: Entry) -> DynamicSamplingBudgetExceeded | None:
    """``entry``, an owed replacement, is next in line: None when it may be
    generated now (then it is owed no longer; with ``filter: none`` no budget
    holds it back), else the error that stops the run again."""
    if dynamic is not None and (over := dynamic.settle(entry.batch_index)) is not None:
        return over
    entry.owed = False
    return None


def build_dynamic_sampling(grpo: GRPOConfig,
                           sampler: PromptGroupSampler) -> DynamicSampling | None:
    """The accounting for ``grpo.dynamic_sampling`` (after ``validate_setup`` set
    the sampler's over-sampling), or None with ``filter: none``."""
    group_filter = build_filter(grpo.dynamic_sampling)
    if group_filter is None:
        return None
    return DynamicSampling(grpo.dynamic_sampling, group_filter, grpo.num_prompts_per_step,
                           groups_per_batch(sampler, grpo))


def dynamic_summary(dynamic: DynamicSampling | None, sampler: PromptGroupSampler,
                    grpo: GRPOConfig, trained: int) -> dict[str, Any]:
    """The summary's ``dynamic_sampling`` entry (the filter and the batch size
    only, with ``filter: none``)."""
    if dynamic is None:
        return {"filter": "none", "groups_per_batch": groups_per_batch(sampler, grpo)}
    return dynamic.summary(trained)


__all__ = ["DynamicSampling", "build_dynamic_sampling", "dynamic_summary", "settle_owed"]
