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
the spare pool, with the group's ``target_step`` stamp, pin and batch), until
the replacement would go past the budget: then the run stops with
:class:`~asyncrl.errors.DynamicSamplingBudgetExceeded`. A group stamped for a
step that has been trained already is not replaced: nothing waits for it.
"""

from __future__ import annotations

import collections
from typing import Any

from asyncrl.config import GRPOConfig
from asyncrl.config.dynamic_sampling import DynamicSamplingConfig
from asyncrl.controller.entry import Entry
from asyncrl.controller.validation import groups_per_batch
from asyncrl.errors import DynamicSamplingBudgetExceeded
from asyncrl.sampling import GroupFilter, PromptGroupSampler, build_filter

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
        #: Replacements one batch may make: (max_gen_batches - 1) more batches' worth.
        self.max_replacements = (cfg.max_gen_batches - 1) * groups_per_batch
        #: Per batch: [groups filtered, replacements made].
        self.batches: dict[BatchKey, list[int]] = {}
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
        it or its step is gone. Raises :class:`DynamicSamplingBudgetExceeded`
        when a replacement would go past ``max_gen_batches``."""
        self._filtered += 1
        self.totals["filtered"] += 1
        key = reason if reason in self.by_reason or len(self.by_reason) < KEEP_REASONS \
            else "other"
        self.by_reason[key] += 1
        batch = entry.batch_index
        counts = self.batches.setdefault(batch, [0, 0])
        counts[0] += 1
        self._touched.add(batch)
        if entry.stamp is not None and entry.stamp < assembling:
            return False  # its step was trained without it
        filtered, replaced = counts
        if self.k + replaced - filtered >= self.n:
            self.totals["absorbed"] += 1
            return False
        if replaced >= self.max_replacements:
            raise DynamicSamplingBudgetExceeded(self._budget_message(batch, counts))
        return True

    def replaced(self, batch: BatchKey) -> None:
        """A replacement for a group of ``batch`` was queued."""
        self.batches[batch][1] += 1
        self.totals["replaced"] += 1

    def _budget_message(self, batch: BatchKey, counts: list[int]) -> str:
        cfg = self.cfg
        generated = self.k + counts[1]
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
        used = max((self.k + self.batches.get(b, (0, 0))[1] for b in self._touched),
                   default=self.k)
        metrics = {
            "train/filtered_frac": self._filtered / finished if finished else 0.0,
            "train/generated_per_trained": finished / trained if trained else 0.0,
            "train/filter_budget_used": used / (self.cfg.max_gen_batches * self.k),
        }
        self.totals["kept"] += self._kept
        self._kept = self._filtered = 0
        self._touched.clear()
        old = [b for b in self.batches if b is None or b < step - FORGET_AFTER]
        for b in old:
            del self.batches[b]
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
        return {"batches": [[b, *c] for b, c in self.batches.items()],
                "totals": dict(self.totals), "by_reason": dict(self.by_reason),
                "kept": self._kept, "filtered": self._filtered}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches = {b: [int(f), int(r)] for b, f, r in state.get("batches", ())}
        self.totals = collections.Counter(state.get("totals", {}))
        self.by_reason = collections.Counter(state.get("by_reason", {}))
        self._kept = int(state.get("kept", 0))
        self._filtered = int(state.get("filtered", 0))


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


__all__ = ["DynamicSampling", "build_dynamic_sampling", "dynamic_summary"]
