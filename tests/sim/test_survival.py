"""The latency fit with the in-flight groups counted as right-censored
observations and every group from its age at the fit window's start (issue 38,
:mod:`asyncrl.sim.survival`): the product-limit estimate on small cases
computed by hand, with and without delayed entry, a steady stream where the
fit without delayed entry is length-biased, the mass beyond the largest
observation, and the planner's fit from a run's state."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import random
import statistics

import pytest

from asyncrl.controller.autoplan import PlanResult
from asyncrl.controller.snapshot import LiveGroup
from asyncrl.sim.planner import ModelPlanner, _ages, _observed, fit_model
from asyncrl.sim.runner import simulate
from asyncrl.sim.survival import Observed, fit_latencies, observed, product_limit
from tests.sim.helpers import plan_autopilot, sim_config


def _plain(events: list[float], censored: list[float]) -> list[Observed]:
    """Observations all dispatched inside the window (no delayed entry)."""
    return ([Observed(0.0, t, True) for t in events]
            + [Observed(0.0, t, False) for t in censored])


def test_the_product_limit_estimate_by_hand() -> None:
    # At 1: 5 at risk, 1 event -> 4/5. At 2: 4 at risk, 2 events -> 4/5 * 2/4.
    # The 3 is censored: it leaves the risk set, so at 4: 1 at risk -> 0.
    assert product_limit(_plain([4.0, 2.0, 1.0, 2.0], [3.0])) == [
        (1.0, 0.8), (2.0, 0.4), (4.0, 0.0)]
    # An event and a censoring at the same time: the censored one was at risk.
    assert product_limit(_plain([2.0], [2.0, 5.0])) == [(2.0, pytest.approx(2 / 3))]
    # Quantiles (k + 0.5) / 5 = .1 .3 .5 .7 .9 against the CDF .2 (1), .6 (2), 1 (4).
    assert fit_latencies(_plain([4.0, 2.0, 1.0, 2.0], [3.0])) == [1.0, 2.0, 2.0, 4.0, 4.0]


def test_a_group_dispatched_before_the_window_is_at_risk_only_from_its_entry() -> None:
    # The 4 entered at age 2: at 1 the risk set is the other three -> 2/3; at 2
    # (the 1 gone, the 4 not yet in: entry < t is strict) two -> 2/3 * 1/2; at 4
    # only the 4 is left (the 3 was censored) -> 0.
    seen = [Observed(0.0, 1.0, True), Observed(0.0, 3.0, False),
            Observed(2.0, 4.0, True), Observed(0.0, 2.0, True)]
    assert product_limit(seen) == [(1.0, pytest.approx(2 / 3)), (2.0, pytest.approx(1 / 3)),
                                   (4.0, 0.0)]
    # Counted from age 0 it would be at risk at 1 and 2 too: 3/4, then 1/2.
    from_zero = [o._replace(entry=0.0) for o in seen]
    assert product_limit(from_zero) == [(1.0, 0.75), (2.0, pytest.approx(0.5)), (4.0, 0.0)]
    # One that entered at (or after) its exit was never seen alive: it says nothing.
    assert product_limit([*seen, Observed(5.0, 5.0, True)]) == product_limit(seen)
    # observed(): the age at the window's start, never below 0.
    assert observed(10.0, 25.0, 12.0, finished=True) == Observed(2.0, 15.0, True)
    assert observed(14.0, 25.0, 12.0, finished=False) == Observed(0.0, 11.0, False)


def _stationary_window(seed: int) -> tuple[list[Observed], list[float]]:
    """A steady stream of groups (one every 0.05 s from t=0 to t=2,000, lognormal
    latencies: median 10 s, sigma 0.8) seen by a fit window from t=1,970 to
    t=2,000: every group that finished in it or was still running at its end.
    Also every latency drawn (the workload's own distribution)."""
    rng = random.Random(seed)
    lo, hi, seen, drawn = 1970.0, 2000.0, [], []
    for k in range(40_000):
        start = k * 0.05
        latency = rng.lognormvariate(math.log(10.0), 0.8)
        drawn.append(latency)
        end = start + latency
        if end < lo:
            continue  # finished before the window: not seen
        seen.append(observed(start, min(end, hi), lo, finished=end <= hi))
    return seen, drawn


def test_in_a_steady_state_the_truncated_fit_is_the_workloads_and_the_naive_one_is_heavy(
        ) -> None:
    """The groups a window sees include the ones dispatched before it that
    were still running when it began: the long ones, over-represented. Counted
    from age 0 (the censored fit without delayed entry) they make the fitted
    p95 far heavier than the workload's; counted from their entry they do not."""
    seen, drawn = _stationary_window(seed=7)
    want_median, want_p95 = _quantile(drawn, 0.5), _quantile(drawn, 0.95)  # ~10 s, ~37 s
    truncated = fit_latencies(seen)
    naive = fit_latencies([o._replace(entry=0.0) for o in seen])
    assert len(truncated) == len(seen) and any(o.entry > 0 for o in seen)
    assert _quantile(truncated, 0.5) == pytest.approx(want_median, rel=0.05)
    assert _quantile(truncated, 0.95) == pytest.approx(want_p95, rel=0.1)
    # Length-biased: every group running at the window's start counts from 0.
    assert _quantile(naive, 0.5) > 1.2 * want_median
    assert _quantile(naive, 0.95) > 1.3 * want_p95


def _quantile(xs: list[float], q: float) -> float:
    return sorted(xs)[int(q * (len(xs) - 1))]


def test_without_censored_observations_and_delayed_entry_the_fit_is_the_finished_latencies(
        ) -> None:
    assert fit_latencies(_plain([3.0, 1.0, 2.0], [])) == [1.0, 2.0, 3.0]
    assert fit_latencies([]) == []


def test_the_mass_beyond_the_largest_age_comes_from_the_conditioned_lognormal() -> None:
    # Risk sets 6, 5, 4, 3: S after 4 is 2/6; the two ages (10) leave it beyond 10.
    fit = fit_latencies(_plain([1.0, 2.0, 3.0, 4.0], [10.0, 10.0]))
    assert fit[:4] == [1.0, 2.0, 3.0, 4.0]
    # Quantiles .75 and .917 of the estimate: .25 and .75 of the mass beyond 10.
    dist = statistics.NormalDist.from_samples([math.log(x) for x in (1, 2, 3, 4)])
    lo = dist.cdf(math.log(10.0))
    want = [math.exp(dist.inv_cdf(lo + (1 - lo) * q)) for q in (0.25, 0.75)]
    assert fit[4:] == pytest.approx(want) and 10.0 < fit[4] < fit[5]
    # Nothing to fit a lognormal to: the mass sits at the largest observation.
    assert fit_latencies(_plain([2.0, 2.0], [10.0])) == [2.0, 2.0, 10.0]


def test_the_tail_lognormal_is_fitted_once_per_fit(monkeypatch) -> None:
    """Re-fitting it for every quantile past the largest age made a re-plan at
    4,096 groups per step spend most of its time there (quadratic in the
    observations)."""
    fits = []
    real = statistics.NormalDist.from_samples.__func__

    def counted(cls, data):
        fits.append(1)
        return real(cls, data)

    monkeypatch.setattr(statistics.NormalDist, "from_samples", classmethod(counted))
    fit = fit_latencies(_plain([1.0 + k / 100 for k in range(200)], [50.0] * 100))
    assert sum(x >= 50.0 for x in fit) >= 90 and len(fits) == 1  # ~a third past 50


class _Recording:
    def __init__(self, cfg) -> None:
        self.inner = ModelPlanner(cfg, inline=True)
        self.asked: list = []

    def submit(self, request):
        self.asked.append(request)
        return self.inner.submit(request)

    def close(self) -> None:
        self.inner.close()


class _Holding:
    """Records every request and plans nothing (the setting stays)."""

    def __init__(self) -> None:
        self.asked: list = []

    def submit(self, request):
        self.asked.append(request)
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(PlanResult({}, [], None, None, 0.0, "held"))
        return done

    def close(self) -> None:
        pass


def _cfg():
    return sim_config(policy="ready_first", window=2, n=16, steps=24, slots=64,
                      latency={"distribution": "lognormal", "median": 10.0, "sigma": 0.1},
                      train_step_s=4.0, capacity=48, inflight=48, min_chunk=4,
                      autopilot=plan_autopilot(2.0))


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
    # Sixteen groups have run 20-27.5 s, twice the longest that finished; all
    # dispatched inside the fit window (it began with the run, 31 s ago), so
    # each is at risk from age 0.
    assert request.state.clock_s - 27.5 > request.records[0]["wall_time_s"] - \
        request.records[0]["step_time_s"]
    long = tuple(LiveGroup(0, None, None, 0, "generating", 20.0 + k / 2, 1) for k in range(16))
    state = dataclasses.replace(request.state, groups=long)
    fitted, _ = fit_model(cfg, dataclasses.replace(request, state=state))
    assert fitted["censored"] == 16 and fitted["generations"] == len(finished)
    assert len(fitted["latencies"]) == len(finished) + 16
    assert max(finished) < 13.0 and _p95(fitted["latencies"]) > 20.0
    assert fitted["latency_mean_s"] > alone["latency_mean_s"]


def test_right_after_the_latency_grows_the_fit_sees_the_groups_still_running() -> None:
    """At step 20 the median latency triples and its tail grows (sigma 0.6 ->
    1.0: p95 26 s -> 155 s). Four steps on, the window's finished generations
    are still mostly the old, short ones; the groups still generating have run
    for up to 100 s. Counted as censored, they lift the fitted p95 past half
    the new workload's, where the finished ones alone are below a third. The
    planner only records and holds: the run, and so what the fit sees, does not
    depend on the fit under test."""
    cfg = sim_config(policy="ready_first", window=4, n=16, steps=31, slots=128,
                     latency={"distribution": "lognormal", "median": 10.0, "sigma": 0.6},
                     phases=[{"at_step": 20, "generation_latency_s": {
                         "distribution": "lognormal", "median": 30.0, "sigma": 1.0}}],
                     train_step_s=4.0, capacity=80, inflight=80, min_chunk=4,
                     autopilot=plan_autopilot(4.0, fit_steps=8))
    new_p95 = 30.0 * math.exp(statistics.NormalDist().inv_cdf(0.95))
    recording = _Holding()
    simulate(cfg, planner=recording)
    request = next(r for r in recording.asked if r.step >= 30)
    assert request.state is not None and _ages(request)
    alone, _ = fit_model(cfg, dataclasses.replace(request, state=None))
    fitted, _ = fit_model(cfg, request)
    assert alone["latency_p95_s"] < new_p95 / 3, alone["latency_p95_s"]
    assert fitted["latency_p95_s"] > new_p95 / 2, (fitted["latency_p95_s"], _ages(request))


def test_in_a_steady_run_the_planners_fit_is_the_workloads() -> None:
    """A stationary run (lognormal latency, median 10 s, sigma 1.0: p95 52 s)
    whose fit window (8 steps, ~41 s) is shorter than the tail. About a
    quarter of the groups the window sees were dispatched before it; counted
    from their entry (the run's clock at the boundary against the records'),
    the planner's fit is the workload's, where counted from age 0 it is more
    than 1.5 times too heavy. Over the last ten requests (medians)."""
    cfg = sim_config(policy="ready_first", window=4, n=16, steps=60, slots=128,
                     latency={"distribution": "lognormal", "median": 10.0, "sigma": 1.0},
                     train_step_s=4.0, capacity=96, inflight=96, min_chunk=4,
                     autopilot=plan_autopilot(4.0, fit_steps=8))
    want_p95 = 10.0 * math.exp(statistics.NormalDist().inv_cdf(0.95))
    recording = _Holding()
    simulate(cfg, planner=recording)
    fitted, naive = [], []
    for request in recording.asked[-10:]:
        model, _ = fit_model(cfg, request)
        assert model is not None and model["censored"] > 0
        fitted.append(model)
        gens = [i for i in request.intervals if i["kind"] == "gen" and i["label"] == "ok"]
        seen = _observed(request, gens, _ages(request))
        assert sum(o.entry > 0 for o in seen) > len(seen) / 5
        naive.append(_p95(fit_latencies([o._replace(entry=0.0) for o in seen])))
    p95 = statistics.median(m["latency_p95_s"] for m in fitted)
    assert p95 == pytest.approx(want_p95, rel=0.2)
    assert statistics.median(statistics.median(m["latencies"]) for m in fitted) == \
        pytest.approx(10.0, rel=0.1)
    assert statistics.median(naive) > 1.5 * want_p95
