"""A plan from the run's state judges the bounds over the whole simulated
horizon of a candidate, the switch included (issue 38): the simulated
transition is the run's own (its groups in flight, their ages), so a setting
whose switch breaks a bound is not taken - unless staying breaks it as much
(the groups the run already admitted are as stale whatever the setting).
The throughput is still measured over the ``plan_steps`` from the switch."""

from __future__ import annotations

import dataclasses
import random

from asyncrl.config import config_from_dict
from asyncrl.controller.autoplan import Prediction
from asyncrl.sim import judge, planner
from asyncrl.sim.judge import judged, switch_judged
from asyncrl.sim.latency import Empirical
from asyncrl.sim.planner import ModelPlanner, fit_model, plan, predict
from asyncrl.sim.runner import simulate
from asyncrl.sim.seed import start_of

BOUNDS = {"max_staleness_p95": 4.0, "max_waste_frac": 0.05}
WIDE = {"max_inflight_prompts": 32, "window": 3, "max_buffered_rollouts": 32}
NARROW = {**WIDE, "window": 1}


def _cfg():
    """ready_first s=3 on a heavy tail, the plan mode's autopilot re-planning
    every 4 steps: window 3 breaks a staleness p95 of 4, window 1 keeps it
    once settled, but the groups admitted under window 3 finish after the
    switch with their old staleness."""
    return config_from_dict({
        "seed": 0, "grpo": {"num_prompts_per_step": 8, "num_generations_per_prompt": 2},
        "async_rl": {"sampler": {"name": "ready_first", "max_staleness_versions": 3},
                     "max_buffered_rollouts": 32, "max_inflight_prompts": 32,
                     "min_groups_for_streaming_train": 8,
                     "autopilot": {"enabled": True, "mode": "plan", "replan_every_steps": 4,
                                   "plan_steps": 16,
                                   "bounds": {"max_staleness_p95": 4.0}}},
        "simulate": {"steps": 8, "rollout_slots": 64, "train_step_s": 4.0,
                     "weight_sync_s": 1.0, "generation_latency_s": {
                         "distribution": "lognormal", "median": 10.0, "sigma": 1.0}}})


class _First:
    """The inline planner, keeping the first request that carries groups in flight."""

    def __init__(self, cfg) -> None:
        self.inner = ModelPlanner(cfg, inline=True)
        self.request = None

    def submit(self, request):
        if self.request is None and request.state is not None and request.state.inflight:
            self.request = request
        return self.inner.submit(request)

    def close(self) -> None:
        self.inner.close()


def _request():
    """The run's first plan request with groups in flight (window 3 in force)."""
    cfg = _cfg()
    first = _First(cfg)
    simulate(cfg, planner=first)
    assert first.request is not None and first.request.setting == WIDE
    return cfg, first.request


def _predicted(cfg, request, setting: dict) -> Prediction:
    """``setting`` predicted from the request's state as :func:`plan` does."""
    model, why = fit_model(cfg, request)
    assert model is not None, why
    latency = Empirical(tuple(model.pop("latencies")), "the window")
    steps = request.plan_steps
    base = planner._plan_config(cfg, model, planner.prefix_steps(steps) + 2 * steps)
    state = start_of(request.state, latency.values,
                     random.Random(f"asyncrl-plan:{cfg.seed}:{request.step}"))
    return predict(base, latency, setting, steps, request.bounds, start=request.setting,
                   state=state)


def test_a_switch_that_breaks_the_bound_before_it_settles_does_not_keep_it() -> None:
    """Window 3 -> 1 from the run's state: the steady state past the settle
    point keeps the bound, the steps from the switch on (the window-3 groups
    finishing) break it; judged alone, the switch does not keep the bounds."""
    cfg, request = _request()
    narrow = _predicted(cfg, request, NARROW)
    assert narrow.settled_after is not None and narrow.settled_after > 0
    assert narrow.staleness_p95 <= 4.0 < narrow.transition_p95
    assert narrow.transition_waste == 0.0
    assert not narrow.keeps_bounds
    # The bound facts of the transition are the whole horizon's; the throughput
    # is not (the ``plan_steps`` from the switch).
    assert judge.excess(narrow, BOUNDS) == 0


def test_staleness_the_run_already_has_is_no_switchs_doing() -> None:
    """In a plan, staying on window 3 is staler still (before and after it
    settles): the narrowing adds nothing past the bound that staying would
    not, so it keeps the bounds and is the pick; a window wider than the one
    in force breaks them."""
    cfg, request = _request()
    result = plan(cfg, request)
    stay = result.current
    assert stay is not None and not stay.keeps_bounds
    narrow = next(c for c in result.candidates if c.setting == NARROW)
    assert 4.0 < narrow.transition_p95 <= stay.transition_p95 and narrow.keeps_bounds
    assert result.best is not None and result.best.setting["window"] == 1


def _p(tput: float, settled: float, moved: float, waste: float = 0.0) -> Prediction:
    return Prediction({"max_inflight_prompts": 32, "window": 2, "max_buffered_rollouts": 32},
                      tput, settled, 0.0, False, transition_p95=moved,
                      transition_waste=waste)


def test_a_switch_that_breaks_a_bound_staying_keeps_is_refused() -> None:
    """The faster candidate keeps the bound once settled but its switch breaks
    it where staying keeps it: refused, the slower one is picked. Were the
    transition no worse than staying's, or not known (a plan without the run's
    state), it would keep them."""
    stay, fast, slow = _p(1.0, 3.0, 4.0), _p(1.5, 4.0, 5.0), _p(1.2, 4.0, 4.0)
    judged_all = switch_judged([stay, fast, slow], stay, BOUNDS)
    assert [p.keeps_bounds for p in judged_all] == [True, False, True]
    assert judge.pick(judged_all, "throughput", 0.03, BOUNDS).throughput == 1.2
    assert judged(fast, BOUNDS, _p(1.0, 3.0, 5.0))  # staying is as stale
    assert not judged(_p(1.5, 3.0, 3.0, waste=0.06), BOUNDS, stay)  # waste counts too
    unknown = dataclasses.replace(fast, transition_p95=None, transition_waste=None)
    assert judged(unknown, BOUNDS, stay)  # the prefix's rule: the settled facts only
    assert not judged(_p(1.5, 5.0, 3.0), BOUNDS, stay)  # a fresh transition hides nothing
