"""The run summary, typed: what :meth:`Controller.summary` returns (made by
:func:`run_summary`), and what ``asyncrl train`` adds before it writes
``summary.json``.

Plain dicts at run time (they are written as JSON and read back by ``asyncrl
plot``, the simulator and the benchmarks); the types say which keys there are.
"""

from __future__ import annotations

from typing import Any, TypedDict

from asyncrl.controller.autopilot import Autopilot
from asyncrl.controller.context import RunContext
from asyncrl.controller.dispatch import Dispatcher
from asyncrl.controller.dynamic_sampling import dynamic_summary
from asyncrl.types import StopReason

__all__ = ["RunDirSummary", "RunSummary", "run_summary"]


class _Optional(TypedDict, total=False):
    #: With ``async_rl.autopilot``: its mode, the changes it made, the decisions
    #: kept and the final setting.
    autopilot: dict[str, Any]


class RunSummary(_Optional):
    """What :meth:`~asyncrl.controller.Controller.summary` returns (``autopilot``
    only when the autopilot is on)."""

    steps: int
    trainer_version: int
    #: A :class:`~asyncrl.types.StopReason` value, or a caller's own reason.
    stop_reason: str
    stop_message: str
    #: The sampler's class name.
    sampler: str
    is_on_policy: bool
    #: Prompt groups by ledger state, ``balanced`` (and ``imbalance`` when not).
    ledger: dict[str, Any]
    #: Failed attempts and dropped prompts by kind, ``stall_warnings``.
    failures: dict[str, Any]
    #: Prompts drawn, dispatched, and those left untrained (with why).
    prompts: dict[str, Any]
    #: ``grpo.dynamic_sampling``: the filter, groups per dispatch batch and, with
    #: a filter on, groups filtered (by reason), replaced, absorbed by the
    #: over-sampled surplus, and groups generated per group trained.
    dynamic_sampling: dict[str, Any]
    wall_time_s: float
    #: Group staleness (trained version minus start weight): mean, max, histogram.
    staleness_mean: float
    staleness_max: int
    staleness_hist: dict[str, int]
    #: Token staleness (per generated token's weight version).
    token_staleness_mean: float
    token_staleness_p95: int
    token_staleness_max: int
    token_staleness_hist: dict[str, int]
    groups_continued: int
    #: Steps whose optimizer step was skipped for a non-finite gradient (the
    #: trainer's ``skipped_nonfinite_step``): steps that trained nothing, or (with
    #: mini-batches) less than the whole step.
    skipped_nonfinite_steps: int
    #: Mean reward of the last ten steps (NaN without steps).
    reward_last10_mean: float
    trainer_idle_s: float
    max_inflight_seen: int
    max_buffer_seen: int
    #: The steps' time by part, in seconds and as fractions.
    time_split: dict[str, float]
    #: Generated and trained tokens, in all and per second.
    throughput: dict[str, float]
    #: Completion lengths: count, mean, min, max.
    completion_len: dict[str, Any]


class RunDirSummary(RunSummary, total=False):
    """``summary.json``: the controller's summary and what ``asyncrl train`` adds."""

    #: The final policy's directory (Hugging Face format); None when not written.
    final_dir: str | None
    #: Why there is no final policy (``final_dir`` null): the run failed, was
    #: stopped at once or its export failed; and the ``asyncrl export`` that
    #: writes a checkpoint's weights instead.
    final_note: str
    target_reward: float | None
    reached_target: bool
    run_dir: str
    #: After a signal, a stall or the ``save_by`` deadline: the command that
    #: resumes the run.
    resume_command: str
    #: With ``checkpoint.keep_best``: the best checkpoint kept (path, step,
    #: metric, value), None when no checkpoint logged the metric.
    best_checkpoint: dict[str, Any] | None
    #: The plots drawn into the run directory.
    plots: list[str]
    #: Seconds from the call of ``train`` (``asyncrl train``: after its imports)
    #: to the first step: checks, model, engines, resume. ``wall_time_s`` counts
    #: from there. None: the run stopped before its first step.
    startup_s: float | None


def run_summary(ctx: RunContext, dispatcher: Dispatcher, autopilot: Autopilot | None, *,
                holders: set[Any], stop_reason: StopReason | str, stop_message: str,
                stall_warnings: int, elapsed: float) -> RunSummary:
    """The run's summary now; ``holders``: the groups the ledger may call live
    (``Controller._holder_ids``), ``elapsed``: the run's seconds so far."""
    ledger, sampler = ctx.ledger, ctx.sampler
    ok, why = ledger.check_balance(holders)
    return {
        "steps": ctx.stats.steps_done,
        "trainer_version": ctx.version.value,
        "stop_reason": str(stop_reason),  # the plain value, as JSON writes it
        "stop_message": stop_message,
        "sampler": type(sampler).__name__,
        "is_on_policy": bool(sampler.is_on_policy),
        "ledger": {**ledger.counts(), "balanced": ok, **({"imbalance": why} if not ok else {})},
        "failures": {**ctx.drops.summary(), "stall_warnings": stall_warnings},
        "prompts": _prompt_accounts(ctx, dispatcher, stop_reason, stop_message),
        "dynamic_sampling": dynamic_summary(ctx.dynamic, sampler, ctx.grpo,
                                            ledger.counts()["trained"]),
        **ctx.stats.totals(elapsed),
        **({"autopilot": autopilot.summary()} if autopilot is not None else {}),
    }


def _prompt_accounts(ctx: RunContext, dispatcher: Dispatcher, stop_reason: StopReason | str,
                     stop_message: str) -> dict[str, Any]:
    """Every prompt read from the task: dispatched as a group (the ledger says
    what became of it; ``pending`` ones were not trained) or still waiting
    undispatched, each listed by id, with why the run left them untrained."""
    waiting = dispatcher.undispatched()
    pending = ctx.ledger.counts()["pending"]
    untrained = pending + sum(len(ids) for ids in waiting.values())
    return {"drawn": dispatcher.source.drawn, "dispatched": len(ctx.ledger),
            "untrained": {"pending": pending, **waiting},
            "untrained_reason": (f"the run stopped ({stop_reason}: {stop_message}) "
                                 "before they were trained" if untrained else "")}
