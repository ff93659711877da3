"""The latency fit with the in-flight groups counted as right-censored
observations (issue 38, :mod:`asyncrl.sim.survival`): the Kaplan-Meier
estimate on small cases computed by hand, the mass beyond the largest
observation, and the planner's fit from a run's state."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from asyncrl.config import config_from_dict
from asyncrl.controller.snapshot import LiveGroup
from asyncrl.sim.planner import ModelPlanner, _ages, fit_model
from asyncrl.sim.runner import simulate
from asyncrl.sim.survival import censored_fit, kaplan_meier


def test_the_product_limit_estimate_by_hand() -> None:
    # At 1: 5 at risk, 1 event -> 4/5. At 2: 4 at risk, 2 events -> 4/5 * 2/4.
    # The 3 is censored: it leaves the risk set, so at 4: 1 at risk -> 0.
    assert kaplan_meier([4.0, 2.0, 1.0, 2.0], [3.0]) == [(1.0, 0.8), (2.0, 0.4), (4.0, 0.0)]
    # An event and a censoring at the same time: the censored one was at risk.
    assert kaplan_meier([2.0], [2.0, 5.0]) == [(2.0, pytest.approx(2 / 3))]
    # Quantiles (k + 0.5) / 5 = .1 .3 .5 .7 .9 against the CDF .2 (1), .6 (2), 1 (4).
    assert censored_fit([4.0, 2.0, 1.0, 2.0], [3.0]) == [1.0, 2.0, 2.0, 4.0, 4.0]


def test_without_censored_observations_the_fit_is_the_finished_latencies() -> None:
    assert censored_fit([3.0, 1.0, 2.0], []) == [1.0, 2.0, 3.0]


def test_the_mass_beyond_the_largest_age_comes_from_the_conditioned_lognormal() -> None:
    # Risk sets 6, 5, 4, 3: S after 4 is 2/6; the two ages (10) leave it beyond 10.
    fit = censored_fit([1.0, 2.0, 3.0, 4.0], [10.0, 10.0])
    assert fit[:4] == [1.0, 2.0, 3.0, 4.0]
    # Quantiles .75 and .917 of the estimate: .25 and .75 of the mass beyond 10.
    dist = statistics.NormalDist.from_samples([math.log(x) for x in (1, 2, 3, 4)])
    lo = dist.cdf(math.log(10.0))
    want = [math.exp(dist.inv_cdf(lo + (1 - lo) * q)) for q in (0.25, 0.75)]
    assert fit[4:] == pytest.approx(want) and 10.0 < fit[4] < fit[5]
    # Nothing to fit a lognormal to: the mass sits at the largest observation.
    assert censored_fit([2.0, 2.0], [10.0]) == [2.0, 2.0, 10.0]


class _Recording:
    def __init__(self, cfg) -> None:
        self.inner = ModelPlanner(cfg, inline=True)
        self.asked: list = []

    def submit(self, request):
        self.asked.append(request)
        return self.inner.submit(request)

    def close(self) -> None:
        self.inner.close()


def _cfg():
    return config_from_dict({
        "grpo": {"num_prompts_per_step": 16, "num_generations_per_prompt": 2},
        "async_rl": {"sampler": {"name": "ready_first", "max_staleness_versions": 2},
                     "max_buffered_rollouts": 48, "max_inflight_prompts": 48,
                     "min_groups_for_streaming_train": 4,
                     "autopilot": {"enabled": True, "mode": "plan", "replan_every_steps": 2,
                                   "warmup_steps": 2, "plan_steps": 4,
                                   "bounds": {"max_staleness_p95": 2.0}}},
        "simulate": {"steps": 24, "rollout_slots": 64, "train_step_s": 4.0,
                     "weight_sync_s": 1.0, "generation_latency_s": {
                         "distribution": "lognormal", "median": 10.0, "sigma": 0.1}}})


def _p95(xs: list[float]) -> float:
    return sorted(xs)[int(0.95 * (len(xs) - 1))]


def test_long_in_flight_ages_make_the_fit_heavier_and_a_request_without_state_is_unchanged(
        ) -> None:
    cfg = _cfg()
    recording = _Recording(cfg)
    simulate(cfg, planner=recording)
    request = next(r for r in recording.asked if r.state is not None and r.state.inflight)
    finished = [float(i["end"]) - float(i["start"]) for i in request.intervals
                if i["kind"] == "gen" and i["label"] == "ok"]
    alone, _ = fit_model(cfg, dataclasses.replace(request, state=None))
    assert alone["latencies"] == finished and alone["censored"] == 0  # exact, as before
    # Sixteen groups have run 40-55 s: four times the longest that finished.
    long = tuple(LiveGroup(0, None, None, 0, "generating", 40.0 + k, 1) for k in range(16))
    state = dataclasses.replace(request.state, groups=long)
    fitted, _ = fit_model(cfg, dataclasses.replace(request, state=state))
    assert fitted["censored"] == 16 and fitted["generations"] == len(finished)
    assert len(fitted["latencies"]) == len(finished) + 16
    assert max(finished) < 15.0 and _p95(fitted["latencies"]) > 40.0
    assert fitted["latency_mean_s"] > alone["latency_mean_s"]


def test_right_after_the_latency_grows_the_fit_sees_the_groups_still_running() -> None:
    """At step 20 the median latency triples and its tail grows (sigma 0.6 ->
    1.0: p95 26 s -> 155 s). Four steps on, the window's finished generations
    are still mostly the old, short ones; the groups still generating have run
    for up to 100 s. Counted as censored, they lift the fitted p95 past half
    the new workload's, where the finished ones alone are below a third."""
    cfg = config_from_dict({
        "grpo": {"num_prompts_per_step": 16, "num_generations_per_prompt": 2},
        "async_rl": {"sampler": {"name": "ready_first", "max_staleness_versions": 4},
                     "max_buffered_rollouts": 80, "max_inflight_prompts": 80,
                     "min_groups_for_streaming_train": 4,
                     "autopilot": {"enabled": True, "mode": "plan", "replan_every_steps": 2,
                                   "warmup_steps": 2, "plan_steps": 4, "fit_steps": 8,
                                   "bounds": {"max_staleness_p95": 4.0}}},
        "simulate": {"steps": 25, "rollout_slots": 128, "train_step_s": 4.0,
                     "weight_sync_s": 1.0, "generation_latency_s": {
                         "distribution": "lognormal", "median": 10.0, "sigma": 0.6},
                     "phases": [{"at_step": 20, "generation_latency_s": {
                         "distribution": "lognormal", "median": 30.0, "sigma": 1.0}}]}})
    new_p95 = 30.0 * math.exp(statistics.NormalDist().inv_cdf(0.95))
    recording = _Recording(cfg)
    simulate(cfg, planner=recording)
    request = next(r for r in recording.asked if r.step >= 24)
    assert request.state is not None and _ages(request)
    alone, _ = fit_model(cfg, dataclasses.replace(request, state=None))
    fitted, _ = fit_model(cfg, request)
    assert alone["latency_p95_s"] < new_p95 / 3, alone["latency_p95_s"]
    assert fitted["latency_p95_s"] > new_p95 / 2, (fitted["latency_p95_s"], _ages(request))
