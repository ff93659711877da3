"""Planning from the run's current state (issue 38): ``simulate(retune_at=...)``
switches the setting at a step boundary through the controller's own re-tune
path and finds the settle point; the planner measures each candidate from a
full pipeline - its throughput from the switch (the transition counts), its
bound facts from the settle point on (the new setting's steady state). Here
the pipeline is filled by a prefix (a request without the run's state);
tests/sim/test_seed.py starts from the run's own groups."""

from __future__ import annotations

import collections
import dataclasses

import pytest

from asyncrl.config import config_from_dict
from asyncrl.controller import Controller
from asyncrl.controller.stats import hist_quantile
from asyncrl.errors import ConfigError
from asyncrl.metrics import MemorySink
from asyncrl.sim import planner
from asyncrl.sim.backends import SimEngine, SimTask, SimTrainer
from asyncrl.sim.clock import run_virtual
from asyncrl.sim.latency import make_latency_model
from asyncrl.sim.planner import predict, prefix_steps
from asyncrl.sim.runner import simulate

HEAVY = {"distribution": "lognormal", "median": 10.0, "sigma": 1.0}
WIDE = {"max_inflight_prompts": 32, "window": 3, "max_buffered_rollouts": 32}
NARROW = {**WIDE, "window": 1}
BOUNDS = {"max_staleness_p95": 4.0, "max_waste_frac": 0.05}


def _cfg(mode: str = "per_group"):
    """ready_first with window 3 (WIDE) on a heavy tail: the groups admitted
    under it finish long after a switch to window 1."""
    return config_from_dict({
        "seed": 0, "grpo": {"num_prompts_per_step": 8, "num_generations_per_prompt": 2},
        "async_rl": {"sampler": {"name": "ready_first", "max_staleness_versions": 3},
                     "max_buffered_rollouts": 32, "max_inflight_prompts": 32,
                     "min_groups_for_streaming_train": 8},
        "simulate": {"steps": 30, "rollout_slots": 64, "generation_latency_s": HEAVY,
                     "train_step_s": 4.0, "weight_sync_s": 1.0, "mode": mode}})


class _Keep(MemorySink):
    """Every record as written (``simulate``'s sink: no rounding)."""

    def write(self, record: dict) -> None:
        self.records.append(record)


def _by_hand(cfg, k: int, setting: dict, steps: int) -> tuple[list[dict], int | None]:
    """The run ``simulate`` makes, built here with a step hook that calls
    ``Controller.retune`` after step ``k`` and finds the first later boundary
    at which no group dispatched before it is left in the buffer."""
    sim = cfg.simulate
    engine = SimEngine(make_latency_model(sim.generation_latency_s),
                       rollout_slots=sim.rollout_slots, seed=cfg.seed,
                       weight_sync_s=sim.weight_sync_s, record_intervals=False,
                       tokens_per_s=sim.tokens_per_s)
    trainer = SimTrainer(train_step_s=sim.train_step_s, train_per_group_s=0.0,
                         train_per_token_s=sim.train_per_token_s, loss=cfg.loss)
    sink = _Keep()
    seen: dict[str, int] = {}

    async def hook(controller: Controller, version: int) -> None:
        if version == k:
            seen["before"] = controller.buffer.next_seq
            controller.retune(**setting)
        elif "before" in seen and "settled" not in seen:
            live = [s.dispatch_seq for s in controller.buffer.slots()]
            if not live or min(live) >= seen["before"]:
                seen["settled"] = version

    async def main() -> None:
        controller = Controller(
            task=SimTask(), engines=[engine], trainer=trainer,
            grpo=cfg.grpo.model_copy(update={"max_num_steps": steps}),
            async_rl=cfg.async_rl.model_copy(update={"stall_watchdog": None}),
            seed=cfg.seed, sinks=[sink], on_step_end=hook)
        await controller.run()

    run_virtual(main(), loop="jump")  # (simulate's default clock)
    return sink.records, seen.get("settled")


def test_retune_at_is_the_controllers_retune_at_that_step_boundary() -> None:
    cfg = _cfg()
    res = simulate(cfg, steps=20, record_intervals=False, retune_at=(6, NARROW))
    records, settled = _by_hand(cfg, 6, NARROW, 20)
    assert res.records == records
    assert res.settled_at == settled and 6 < settled < 20
    assert [(r["version"], r["setting"]) for r in res.retunes] == [(6, NARROW)]
    # The switch changed the run from step 7 on, not before.
    plain = simulate(cfg, steps=20, record_intervals=False)
    assert plain.records[:6] == res.records[:6] and plain.records[6:] != res.records[6:]
    assert plain.settled_at is None and plain.retunes == []


def test_staying_asks_for_nothing_but_finds_the_settle_point() -> None:
    """``retune_at`` with the setting in force: the very run without it (the
    planner's "stay as is" candidate is measured on the same footing)."""
    cfg = _cfg()
    plain = simulate(cfg, steps=20, record_intervals=False)
    stay = simulate(cfg, steps=20, record_intervals=False, retune_at=(6, WIDE))
    assert stay.records == plain.records and stay.retunes == []
    assert stay.settled_at == _by_hand(cfg, 6, WIDE, 20)[1] is not None


def test_stop_after_stops_past_the_switch_and_the_settle_point() -> None:
    cfg = _cfg()
    full = simulate(cfg, steps=40, record_intervals=False, retune_at=(6, NARROW))
    for after in [(2, 1), (20, 1), (2, 5)]:
        cut = simulate(cfg, steps=40, record_intervals=False, retune_at=(6, NARROW),
                       stop_after=after)
        assert cut.settled_at == full.settled_at
        assert cut.steps == max(6 + after[0], full.settled_at + after[1]) == len(cut.records)
        assert cut.records == full.records[:cut.steps] and cut.ledger["balanced"]


def test_cohort_mode_cannot_switch_mid_run() -> None:
    with pytest.raises(ConfigError, match="per_group"):
        simulate(_cfg("cohort"), steps=4, retune_at=(2, NARROW))


# ------------------------------------------------------------------ planner
def _p95(records: list[dict]) -> float:
    hist: collections.Counter[int] = collections.Counter()
    for r in records:
        hist.update({int(k): n for k, n in r["staleness_hist"].items()})
    return float(hist_quantile(hist, 0.95))


def _latency():
    return make_latency_model(_cfg().simulate.generation_latency_s)


def _switched(cfg, setting: dict, steps: int):
    """The simulation a prediction of ``setting`` from WIDE (the config's own) runs."""
    prefix = prefix_steps(steps)
    return prefix, simulate(cfg, steps=prefix + 2 * steps, record_intervals=False,
                            latency=_latency(), retune_at=(prefix, setting),
                            stop_after=(steps, steps // 2))


def test_a_narrowing_is_judged_on_the_new_windows_steady_state() -> None:
    """Window 3 -> 1: the groups admitted under window 3 finish after the switch
    with the old window's staleness (p95 7); the bounds are checked from the
    settle point on, where the narrow window's own steady state shows (the one
    a run of it from an empty pipeline measures), and the narrowing keeps them."""
    cfg, lat, steps = _cfg(), _latency(), 16
    warm = predict(cfg, lat, NARROW, steps, BOUNDS, start=WIDE)
    cold = predict(cfg, lat, NARROW, steps, BOUNDS)
    assert abs(warm.staleness_p95 - cold.staleness_p95) <= 1 and warm.keeps_bounds
    assert warm.transition_p95 == 7.0 >= warm.staleness_p95 + 3
    prefix, res = _switched(cfg, NARROW, steps)
    records, settled = res.records, res.settled_at
    assert warm.settled_after == settled - prefix > 0
    assert warm.staleness_p95 == _p95(records[settled:])
    assert warm.transition_p95 == _p95(records[prefix:prefix + steps])


def test_the_throughput_counts_the_transition() -> None:
    """Measured over the ``plan_steps`` from the switch, not from the settle point."""
    cfg, lat, steps = _cfg(), _latency(), 16
    warm = predict(cfg, lat, NARROW, steps, BOUNDS, start=WIDE)
    prefix, res = _switched(cfg, NARROW, steps)
    r = res.records

    def rate(lo: int, hi: int) -> float:
        return sum(x["groups_trained"] for x in r[lo:hi]) / (r[hi - 1]["wall_time_s"]
                                                            - r[lo - 1]["wall_time_s"])

    assert warm.throughput == pytest.approx(rate(prefix, prefix + steps), rel=1e-12)
    settled = rate(res.settled_at, len(r))
    assert abs(warm.throughput - settled) > 0.02 * settled  # (the test tells them apart)


def test_staying_is_measured_like_every_other_candidate() -> None:
    cfg, lat, steps = _cfg(), _latency(), 16
    stay = predict(cfg, lat, WIDE, steps, BOUNDS, start=WIDE)
    prefix, res = _switched(cfg, WIDE, steps)
    assert res.retunes == [] and stay.settled_after == res.settled_at - prefix
    assert stay.staleness_p95 == _p95(res.records[res.settled_at:])
    assert stay.transition_p95 == _p95(res.records[prefix:prefix + steps])


def test_a_change_that_does_not_settle_in_time_is_judged_from_the_switch(monkeypatch) -> None:
    """No settle point within the horizon: the bounds are checked on every step
    from the switch on (the transition included: conservative for a narrowing)."""
    cfg, lat, steps = _cfg(), _latency(), 16
    real = planner.simulate
    monkeypatch.setattr(planner, "simulate",
                        lambda *a, **k: dataclasses.replace(real(*a, **k), settled_at=None))
    warm = predict(cfg, lat, NARROW, steps, BOUNDS, start=WIDE)
    prefix, res = _switched(cfg, NARROW, steps)
    assert warm.settled_after is None
    assert warm.staleness_p95 == _p95(res.records[prefix:]) >= 7.0 and not warm.keeps_bounds


def test_cohort_mode_plans_from_an_empty_pipeline() -> None:
    cfg, lat = _cfg("cohort"), _latency()
    warm = predict(cfg, lat, NARROW, 8, BOUNDS, start=WIDE)
    assert warm == predict(cfg, lat, NARROW, 8, BOUNDS)
    assert warm.settled_after is None and warm.transition_p95 is None
