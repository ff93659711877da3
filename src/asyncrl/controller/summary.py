"""The run summary, typed: what :meth:`Controller.summary` returns, and what
``asyncrl train`` adds before it writes ``summary.json``.

Plain dicts at run time (they are written as JSON and read back by ``asyncrl
plot``, the simulator and the benchmarks); the types say which keys there are.
"""

from __future__ import annotations

from typing import Any, TypedDict

__all__ = ["RunDirSummary", "RunSummary"]


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
