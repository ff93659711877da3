"""A cohort-mode run (:mod:`asyncrl.sim.cohort`) as the :class:`SimResult` the
per-group mode gives, so ``asyncrl simulate`` reports both the same way."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.controller.stats import hist_quantile
from asyncrl.sim.cohort import simulate_cohort
from asyncrl.sim.latency import LatencyModel
from asyncrl.sim.result import (
    Bound,
    SimResult,
    efficiency_of,
    percentile,
    sampler_label,
    sampler_window,
)


def cohort_result(cfg: RunConfig, sampler_cfg: Any, latency: LatencyModel, steps: int, *,
                  bound: Bound, note: str = "", record_intervals: bool = True,
                  on_step: Callable[[int], None] | None = None) -> SimResult:
    """:func:`asyncrl.sim.runner.simulate` in cohort mode: the same :class:`SimResult`."""
    run, wall = simulate_cohort(cfg, sampler_cfg, latency, steps,
                                record_intervals=record_intervals, on_step=on_step)
    sim = run.sim
    elapsed, done = run.now, run.v
    c = run.counts
    pending = run.inflight + run.policy.ready
    ledger = {"dispatched": run.dispatched, "trained": c["trained"], "evicted": c["evicted"],
              "aborted": c["aborted"], "failed": 0, "failed_infra": 0, "failed_data": 0,
              "filtered": 0, "pending": pending,
              "balanced": run.dispatched == (c["trained"] + c["evicted"] + c["aborted"]
                                              + pending)}
    efficiency, note = efficiency_of(bound, done, elapsed, c["aborted"],
                                     "; ".join(x for x in (note, "cohort mode") if x))
    hist = {str(k): n for k, n in sorted(run.staleness.items())}
    tokens = run.token_staleness
    n_tokens = sum(tokens.values())
    n_groups = sum(run.staleness.values())
    timeline = [*run.timeline, *({"kind": "gen", "lane": 0, "start": a, "end": b, "label": o}
                                 for a, b, o in run.fleet.intervals)]
    return SimResult(
        sampler=sampler_label(sampler_cfg), window=sampler_window(sampler_cfg), steps=done,
        virtual_time_s=elapsed,
        steps_per_hour=3600.0 * done / elapsed if elapsed > 0 else math.inf,
        efficiency=efficiency,
        trainer_idle_frac=run.idle_total / elapsed if elapsed > 0 else 0.0,
        generator_util=(run.fleet.busy_slot_s / (sim.rollout_slots * elapsed)
                        if elapsed > 0 else 0.0),
        staleness_mean=(sum(k * n for k, n in run.staleness.items()) / n_groups
                        if n_groups else 0.0),
        staleness_p95=percentile(hist, 0.95), staleness_max=max(run.staleness, default=0),
        token_staleness_mean=(sum(k * n for k, n in tokens.items()) / n_tokens
                              if n_tokens else 0.0),
        token_staleness_p95=hist_quantile(tokens, 0.95) if n_tokens else 0,
        token_staleness_max=max(tokens, default=0),
        waste_frac=(c["evicted"] + c["aborted"]) / run.dispatched if run.dispatched else 0.0,
        masked_token_frac=run.tokens_masked / run.tokens_trained if run.tokens_trained else 0.0,
        bound=bound, ledger=ledger, stop_reason="max_num_steps", wall_s=wall, note=note,
        records=run.records, staleness_hist=hist,
        token_staleness_hist={str(k): n for k, n in sorted(tokens.items())},
        timeline=timeline, engine=run.fleet, trainer=None,  # type: ignore[arg-type]
    )


__all__ = ["cohort_result"]
