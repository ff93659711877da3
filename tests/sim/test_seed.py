"""A simulation that starts from a running job's state (issue 38,
:mod:`asyncrl.sim.seed`): the latency a group in flight has left (drawn
conditioned on its age), the seeded groups' ledger (each ends in exactly one
state), the version numbers, the switch before the first step, and that a
plan from the run's state predicts the next steps better than the prefix that
fills a pipeline like the run's."""

from __future__ import annotations

import collections
import random
import statistics

import pytest

from asyncrl.config import config_from_dict
from asyncrl.controller import Controller, MemoryHistory
from asyncrl.controller.snapshot import LiveGroup, RunState, run_state
from asyncrl.errors import ConfigError
from asyncrl.metrics import MemorySink
from asyncrl.sim.backends import SimEngine, SimTask, SimTrainer
from asyncrl.sim.clock import run_virtual
from asyncrl.sim.latency import Empirical, make_latency_model
from asyncrl.sim.planner import ModelPlanner, _facts, predict
from asyncrl.sim.runner import simulate
from asyncrl.sim.seed import MIN_ABOVE, Tail, remaining, seed, start_of
from tests.sim.helpers import plan_autopilot, sim_config


# ------------------------------------------------------------ conditional draw
def test_an_age_with_enough_longer_latencies_draws_among_them() -> None:
    lat = [float(x) for x in range(1, 101)]  # 1..100 s
    tail, rng = Tail(lat), random.Random(0)
    draws = [tail.beyond(80.5, rng) for _ in range(4000)]
    assert set(draws) == {float(x) for x in range(81, 101)}  # each longer one, nothing else
    counts = collections.Counter(draws)
    assert max(counts.values()) < 1.5 * min(counts.values())  # uniformly among them
    # Age 0 (a group that just started) is the unconditioned bootstrap.
    assert {tail.beyond(0.0, rng) for _ in range(4000)} == set(lat)


def test_an_age_past_the_window_draws_from_the_fitted_lognormal_tail() -> None:
    """Fewer than MIN_ABOVE longer latencies (right after the latency grew, the
    groups in flight are older than what finished): the lognormal fitted to
    the window, conditioned on exceeding the age."""
    rng = random.Random(1)
    lat = [rng.lognormvariate(3.0, 0.5) for _ in range(500)]
    tail = Tail(lat)
    age = sorted(lat)[-MIN_ABOVE + 1]  # MIN_ABOVE - 1 are longer: not enough
    draws = [tail.beyond(age, rng) for _ in range(4000)]
    assert min(draws) > age
    fit = statistics.NormalDist.from_samples([__import__("math").log(x) for x in lat])
    p = fit.cdf(__import__("math").log(age))
    median = __import__("math").exp(fit.inv_cdf((1 + p) / 2))  # of X | X > age
    assert statistics.median(draws) == pytest.approx(median, rel=0.03)
    way_past = 50 * max(lat)
    assert all(tail.beyond(way_past, rng) >= way_past for _ in range(100))


def test_no_spread_to_fit_starts_the_group_over() -> None:
    tail, rng = Tail([10.0] * 20), random.Random(2)
    assert tail.beyond(5.0, rng) == 10.0  # 20 longer: the empirical conditional
    assert tail.beyond(12.0, rng) == 22.0  # none longer, nothing to fit: age + a draw


def test_what_each_in_flight_group_has_left() -> None:
    tail = Tail([float(x) for x in range(1, 101)])

    def group(phase: str, age: float | None) -> LiveGroup:
        return LiveGroup(3, None, None, 0, phase, age, 1)

    left, whole = remaining(group("generating", 90.0), tail, random.Random(0))
    assert whole > 90.0 and left == whole - 90.0
    left, whole = remaining(group("scoring", None), tail, random.Random(0))
    assert left == 0.0 and whole in tail.ordered  # generated: only its tokens are drawn
    for phase, age in [("backoff", None), ("generating", None)]:  # a new attempt, or unknown
        left, whole = remaining(group(phase, age), tail, random.Random(0))
        assert left == whole in tail.ordered
    state = RunState(7, 9, {}, (group("generating", 50.0), LiveGroup(6, None, 6, 40, "ready",
                                                                     None, 1),
                                group("scoring", None)), ())
    start = start_of(state, tail.ordered, random.Random(5))
    assert len(start.left) == 2 and start.left[0][1] > 50.0 and start.left[1][0] == 0.0
    assert start == start_of(state, tail.ordered, random.Random(5))  # one seeded draw


# ------------------------------------------------------- a run and its state
SHIFT = 20
NARROW = {"distribution": "lognormal", "median": 10.0, "sigma": 0.1}
LONG = {"distribution": "lognormal", "median": 60.0, "sigma": 0.1}


def _cfg(seed: int = 0, sampler: dict | None = None, phases: bool = True, inflight: int = 48,
         capacity: int = 48):
    return config_from_dict({
        "seed": seed, "grpo": {"num_prompts_per_step": 16, "num_generations_per_prompt": 2},
        "async_rl": {"sampler": sampler or {"name": "ready_first", "max_staleness_versions": 2},
                     "max_buffered_rollouts": capacity, "max_inflight_prompts": inflight,
                     "min_groups_for_streaming_train": 4},
        "simulate": {"steps": 60, "rollout_slots": 64, "train_step_s": 4.0,
                     "weight_sync_s": 1.0, "generation_latency_s": NARROW,
                     "phases": [{"at_step": SHIFT, "generation_latency_s": LONG}]
                     if phases else []}})


class _Keep(MemorySink):
    def write(self, record: dict) -> None:
        self.records.append(record)


def _run(cfg, steps: int, *, at: int | None = None, start=None, capacity: int | None = None,
         history: MemoryHistory | None = None):
    """``cfg``'s simulation built by hand (as ``simulate`` builds it), keeping
    every record and the ledger's history: the run's state after ``at`` steps,
    or a run from ``start`` (``capacity``: the one in force there)."""
    sim = cfg.simulate
    engine = SimEngine(make_latency_model(sim.generation_latency_s),
                       rollout_slots=sim.rollout_slots, seed=cfg.seed,
                       weight_sync_s=sim.weight_sync_s, tokens_per_s=sim.tokens_per_s,
                       phases=[(p.at_step, make_latency_model(p.generation_latency_s))
                               for p in sim.phases])
    sink, seen = _Keep(), {}
    first = start.state.version if start is not None else 0

    async def hook(controller: Controller, version: int) -> None:
        if version == at:
            seen["state"] = run_state(controller.ctx, controller.dispatcher)

    async def main() -> None:
        controller = seen["controller"] = Controller(
            task=SimTask(), engines=[engine],
            trainer=SimTrainer(train_step_s=sim.train_step_s),
            grpo=cfg.grpo.model_copy(update={"max_num_steps": first + steps}),
            async_rl=cfg.async_rl.model_copy(update={"stall_watchdog": None}), seed=cfg.seed,
            sinks=[sink], on_step_end=hook, ledger_history=history)
        if start is not None:
            seed(controller, engine, start, capacity or cfg.async_rl.max_buffered_rollouts)
        await controller.run()

    run_virtual(main(), loop="jump")
    return sink.records, seen, engine


def _long_latencies() -> list[float]:
    return make_latency_model(_cfg().simulate.phases[0].generation_latency_s).draw(
        random.Random(99), 4000)


def test_every_seeded_group_ends_in_exactly_one_state() -> None:
    """The run's state two steps after the latency grew, under windowed s=2
    (it evicts and aborts what falls out of the window): in a simulation
    from it every seeded group is trained, evicted, aborted or still pending,
    exactly once, and the ledger balances."""
    sampler = {"name": "windowed", "max_staleness_versions": 2}
    _, seen, _ = _run(_cfg(sampler=sampler), SHIFT + 2, at=SHIFT + 2)
    state = seen["state"]
    assert state.inflight >= 10 and len(state.groups) > state.inflight
    start = start_of(state, _long_latencies(), random.Random(0))
    history = MemoryHistory()
    records, seen, _ = _run(_cfg(sampler=sampler, phases=False), 12, start=start,
                            history=history)
    ledger = seen["controller"].ledger
    ends = collections.Counter(r.group_id for r in history.records)
    ends.update(ledger.live_ids())
    seeded = range(len(state.groups))  # the seeded groups are 0, 1, ... in dispatch order
    assert all(ends[gid] == 1 for gid in seeded) and max(ends.values()) == 1
    fate = collections.Counter(r.state for r in history.records if r.group_id in seeded)
    assert fate["trained"] and fate["aborted"] and fate["evicted"]  # every way out, exercised
    assert ledger.check_balance(seen["controller"]._holder_ids())[0]
    assert [r["step"] for r in records] == list(range(SHIFT + 2, SHIFT + 14))


def test_the_simulation_starts_at_the_runs_versions() -> None:
    """The trainer starts at the run's version (nothing is shifted): the first
    step trains the buffered groups at once, the seeded in-flight groups hold
    their generation slots from the first instant for what they have left."""
    _, seen, _ = _run(_cfg(), SHIFT + 2, at=SHIFT + 2)
    state = seen["state"]
    ready = [g for g in state.groups if g.phase == "ready"]
    start = start_of(state, _long_latencies(), random.Random(0))
    records, seen, engine = _run(_cfg(phases=False), 20, start=start)
    assert records[0]["step"] == state.version
    assert seen["controller"].version.value == state.version + 20
    # The seeded attempts started at 0 and took exactly what they had left
    # (new groups admitted at once start at 0 too: with a latency of their own).
    at_zero = collections.Counter(round(b - a, 6) for a, b, _ in engine.intervals if a == 0.0)
    seeded = collections.Counter(round(left, 6) for left, _ in start.left)
    assert len(seeded) == state.inflight and not seeded - at_zero
    if len(ready) >= 16:  # (then the first step needs no new group)
        assert records[0]["wall_time_s"] == pytest.approx(4.0 + 1.0)


def test_a_switch_before_the_first_step_keeps_the_seeded_groups_running() -> None:
    """``retune_at=(0, setting)`` with a state: a smaller in-flight bound,
    window and capacity apply before anything is admitted; the seeded groups
    keep their slots and permits (a shrink aborts nothing), and no new group
    is placed until fewer than the new bound are in flight."""
    _, seen, _ = _run(_cfg(), SHIFT + 2, at=SHIFT + 2)
    state = seen["state"]
    start = start_of(state, _long_latencies(), random.Random(0))
    small = {"max_inflight_prompts": 8, "window": 1, "max_buffered_rollouts": 32}
    res = simulate(_cfg(phases=False), steps=6, start_state=start, retune_at=(0, small))
    assert res.retunes[0]["version"] == state.version and res.retunes[0]["setting"] == small
    assert res.ledger["balanced"] and res.steps == 6
    starts = sorted(a for a, _, _ in res.engine.intervals)
    assert starts[:state.inflight] == [0.0] * state.inflight  # all seeded ones at once
    # The first new group waited until fewer than 8 were in flight.
    ends = sorted(b for _, b, _ in res.engine.intervals)
    first_new = starts[state.inflight]
    assert sum(e <= first_new for e in ends) >= state.inflight - 7


def test_a_state_needs_per_group_mode_and_a_time_based_model() -> None:
    _, seen, _ = _run(_cfg(), 3, at=3)
    start = start_of(seen["state"], [10.0, 11.0, 12.0], random.Random(0))
    cohort = _cfg(phases=False).model_copy(update={"simulate": _cfg(phases=False).simulate
                                                   .model_copy(update={"mode": "cohort"})})
    with pytest.raises(ConfigError, match="per_group"):
        simulate(cohort, steps=2, start_state=start)
    tokens = config_from_dict({"simulate": {"generation_latency_s": {
        "distribution": "tokens", "lengths": [[10, 10.0]], "base_s": 1.0,
        "per_token_s": 0.1}}}).simulate.generation_latency_s
    with pytest.raises(ConfigError, match="time-based"):
        simulate(_cfg(phases=False), steps=2, start_state=start,
                 latency=make_latency_model(tokens))


# -------------------------------------------- the state against the prefix
@pytest.mark.parametrize("run_seed", [0, 1, 2])
def test_planning_from_the_state_predicts_the_next_steps_better(run_seed: int) -> None:
    """Two steps after the latency grew sixfold, every group in flight is a long
    one, started at some point of the last minute. Both predictions of the next
    ``plan_steps`` steps under the setting in force get the same, right latency
    model (what differs is where they start): from the run's state the
    throughput is within 5% of what the run then did; from a pipeline filled
    by a prefix (every group started afresh) it is 15% or more off."""
    steps, at = 4, SHIFT + 2
    records, seen, _ = _run(_cfg(run_seed), at + steps, at=at)
    truth, _, _ = _facts(records, at, at + steps)
    lat = _long_latencies()
    latency = Empirical(tuple(lat), "the new latency")
    setting = {"max_inflight_prompts": 48, "window": 2, "max_buffered_rollouts": 48}
    plan_cfg = _cfg(run_seed, phases=False)
    state = start_of(seen["state"], lat, random.Random(run_seed))
    assert seen["state"].inflight == 32  # (the two batches the window lets run)
    from_state = predict(plan_cfg, latency, setting, steps, {}, start=setting, state=state)
    from_prefix = predict(plan_cfg, latency, setting, steps, {}, start=setting)
    err_state = abs(from_state.throughput / truth - 1)
    err_prefix = abs(from_prefix.throughput / truth - 1)
    assert err_state < 0.05 and err_prefix > 0.15, (truth, from_state, from_prefix)


class _Recording:
    """The inline planner, keeping every request and its answer."""

    def __init__(self, cfg) -> None:
        self.inner = ModelPlanner(cfg, inline=True)
        self.asked: list = []

    def submit(self, request):
        future = self.inner.submit(request)
        self.asked.append((request, future.result()))
        return future

    def close(self) -> None:
        self.inner.close()


def test_the_planners_process_plans_the_same_from_the_state() -> None:
    """A request's state crosses into the planner's process (``asyncrl train``'s
    way) and the plan there is the one made inline: the same draws of the
    time left, the same candidates."""
    cfg = sim_config(policy="ready_first", window=3, n=8, steps=8, slots=64,
                     latency={"distribution": "lognormal", "median": 10.0, "sigma": 1.0},
                     train_step_s=4.0, capacity=32, inflight=32, min_chunk=8,
                     autopilot=plan_autopilot(1.0, replan_every_steps=3, plan_steps=8))
    recording = _Recording(cfg)
    simulate(cfg, planner=recording)
    request, inline = next((r, a) for r, a in recording.asked if r.state.inflight)
    assert inline.model["inflight_at_start"] == request.state.inflight
    planner = ModelPlanner(cfg)
    try:
        result = planner.submit(request).result()
    finally:
        planner.close()
    assert result.candidates == inline.candidates and result.best == inline.best
