"""The simulator's planner for the model-based autopilot modes (issue 38), in
virtual time: the candidates are bounded moves, the fit recovers the
workload's costs from the run's own window, plans are deterministic, ``plan``
moves the window where ``runtime`` cannot, and a stationary workload settles."""

from __future__ import annotations

from asyncrl.config import AutopilotConfig, config_from_dict
from asyncrl.controller.autoplan import PlanRequest, Prediction
from asyncrl.sim.planner import (
    ModelPlanner,
    candidate_settings,
    corrected,
    escape_settings,
    pick,
)
from asyncrl.sim.runner import simulate


def _cfg(mode: str, *, latency: dict, steps: int = 20, p95: float = 4.0,
         sampler: dict | None = None) -> object:
    return config_from_dict({
        "seed": 0,
        "grpo": {"num_prompts_per_step": 8, "num_generations_per_prompt": 2,
                 "max_num_steps": steps},
        "async_rl": {"sampler": sampler or {"name": "ready_first", "max_staleness_versions": 3},
                     "max_buffered_rollouts": 32, "max_inflight_prompts": 32,
                     "min_groups_for_streaming_train": 8,
                     "autopilot": {"enabled": True, "mode": mode, "warmup_steps": 2,
                                   "replan_every_steps": 3, "plan_steps": 8,
                                   "bounds": {"max_staleness_p95": p95,
                                              "max_waste_frac": 0.05}}},
        "simulate": {"steps": steps, "rollout_slots": 64, "generation_latency_s": latency,
                     "train_step_s": 4.0, "weight_sync_s": 1.0}})


def _run(cfg):
    res = simulate(cfg, planner=ModelPlanner(cfg, inline=True), record_intervals=False)
    assert res.ledger["balanced"]
    return res


HEAVY = {"distribution": "lognormal", "median": 10.0, "sigma": 1.0}


def test_candidates_are_bounded_moves_the_window_allows() -> None:
    cfg = _cfg("plan", latency=HEAVY, sampler={"name": "in_order", "max_lookahead_versions": 2})
    setting = {"max_inflight_prompts": 20, "window": 2, "max_buffered_rollouts": 24}
    request = PlanRequest(step=5, setting=setting, knobs=("max_inflight_prompts", "window",
                                                          "max_buffered_rollouts"),
                          bounds={}, objective="throughput", max_move=0.25, plan_steps=8,
                          records=[], intervals=[], engines=1)
    found = candidate_settings(cfg, request)
    assert found[0] == setting and len(found) == len({tuple(s.values()) for s in found})
    for s in found:
        assert 15 <= s["max_inflight_prompts"] <= 25 and abs(s["window"] - 2) <= 1
        # in_order with lookahead s needs n (s + 1) slots: capacity follows the window.
        assert s["max_buffered_rollouts"] >= 8 * (s["window"] + 1)
        assert s["max_buffered_rollouts"] in (18, 24, 30) or s["window"] == 3
    assert {s["window"] for s in found} == {1, 2, 3}
    runtime = candidate_settings(cfg, PlanRequest(**{**request.__dict__, "knobs": (
        "max_inflight_prompts", "max_buffered_rollouts")}))
    # (The capacity's move down, 18, is below the 24 slots window 2 needs: raised to 24.)
    assert {s["window"] for s in runtime} == {2} and len(runtime) == 5


def test_escapes_reach_every_narrower_window_with_deeper_cuts() -> None:
    """When the setting in force is predicted to break a bound, the plan also
    weighs the settings that restore it in one move: every narrower window
    (``plan``), the in-flight bound cut by up to three max_move steps."""
    cfg = _cfg("plan", latency=HEAVY, sampler={"name": "in_order", "max_lookahead_versions": 3})
    setting = {"max_inflight_prompts": 40, "window": 3, "max_buffered_rollouts": 40}
    knobs = ("max_inflight_prompts", "window", "max_buffered_rollouts")
    request = PlanRequest(step=5, setting=setting, knobs=knobs, bounds={},
                          objective="throughput", max_move=0.5, plan_steps=8, records=[],
                          intervals=[], engines=1)
    found = escape_settings(cfg, request)
    assert {s["window"] for s in found} == {0, 1, 2, 3}
    assert {s["max_inflight_prompts"] for s in found} == {40, 20, 10, 5}
    for s in found:  # in_order with lookahead s needs n (s + 1) slots
        assert s["max_buffered_rollouts"] == max(8 * (s["window"] + 1),
                                                 s["max_inflight_prompts"])
    runtime = escape_settings(cfg, PlanRequest(**{**request.__dict__, "knobs": knobs[:1]}))
    assert runtime == [{**setting, "max_inflight_prompts": n} for n in (40, 20, 10, 5)]


def test_the_fit_recovers_the_workload_and_plans_are_deterministic() -> None:
    cfg = _cfg("plan", latency={"distribution": "constant", "value": 6.0}, steps=8)
    first, again = _run(cfg), _run(cfg)
    model = first.autopilot[0]["model"]
    assert abs(model["train_step_s"] - 4.0) < 1e-6 and abs(model["weight_sync_s"] - 1.0) < 1e-6
    assert abs(model["latency_mean_s"] - 6.0) < 1e-9 and model["rollout_slots"] == 64

    def strip(rows):
        return [{k: v for k, v in r.items() if k != "plan_s"} for r in rows]

    assert strip(first.autopilot) == strip(again.autopilot)


def test_plan_moves_the_window_to_keep_a_bound_runtime_cannot() -> None:
    """Window 3 with a heavy tail breaks a staleness p95 bound of 1: plan shrinks
    the window; runtime holds it and moves only the in-flight bound and capacity."""
    planned = _run(_cfg("plan", latency=HEAVY, p95=1.0, steps=16))
    windows = [d["setting"]["window"] for d in planned.autopilot]
    assert windows[-1] < 3 and planned.retunes
    # A broken bound is restored in one move, not a version per plan.
    first = next(d for d in planned.autopilot if d["action"] == "apply")
    assert first["previous"]["window"] - first["setting"]["window"] >= 2
    runtime = _run(_cfg("runtime", latency=HEAVY, p95=1.0, steps=16))
    assert {d["setting"]["window"] for d in runtime.autopilot} == {3}


def test_a_stationary_workload_settles() -> None:
    """No change mid-run: at most two changes after the warm-up."""
    res = _run(_cfg("plan", latency={"distribution": "lognormal", "median": 6.0, "sigma": 0.5},
                    steps=26))
    changes = [d for d in res.autopilot if d["setting"] != d["previous"]]
    assert len(res.autopilot) >= 7 and len(changes) <= 2


def _p(inflight: int, window: int, tput: float, p95: float, waste: float = 0.0,
       keeps: bool = True) -> Prediction:
    return Prediction({"max_inflight_prompts": inflight, "window": window,
                       "max_buffered_rollouts": 32}, tput, p95, waste, keeps)


BOUNDS = {"max_staleness_p95": 4.0, "max_waste_frac": 0.05}


def test_the_pick_keeps_the_bounds_then_breaks_them_least_and_cautiously() -> None:
    fast_but_stale = _p(32, 3, 3.0, 6.0, keeps=False)
    kept = [_p(24, 2, 2.0, 3.0), _p(16, 2, 2.005, 2.0, waste=0.01)]
    # Within TIE of the top throughput: the least waste wins the tie.
    assert pick([fast_but_stale, *kept], "throughput", 0.03, BOUNDS) is kept[0]
    assert pick([fast_but_stale, *kept], "staleness", 0.03, BOUNDS) is kept[1]
    # None keeps them: the nearest; of equally broken ones the most cautious.
    broken = [_p(32, 3, 3.0, 6.0, keeps=False), _p(24, 3, 2.0, 6.0, keeps=False),
              _p(40, 3, 3.5, 7.0, keeps=False)]
    assert pick(broken, "throughput", 0.03, BOUNDS) is broken[1]


def test_predictions_carry_the_bias_the_run_measured_upward_only() -> None:
    current, other = _p(32, 3, 2.0, 4.0), _p(24, 2, 1.9, 2.0)
    model: dict = {}
    fixed = corrected([current, other], current, {"staleness_p95": 7.0, "waste_frac": 0.0},
                      BOUNDS, model)
    assert [p.staleness_p95 for p in fixed] == [7.0, 5.0] and not any(p.keeps_bounds for p in fixed)
    assert model["bias"] == {"staleness_p95": 3.0, "waste_frac": 0.0}
    same = corrected([current, other], current, {"staleness_p95": 1.0, "waste_frac": 0.0},
                     BOUNDS, model)
    assert same == [current, other]


def test_cohort_steps_record_their_staleness_histogram() -> None:
    """A plan reads each step's staleness histogram, in cohort mode too (from
    1,024 groups per step the planner simulates in cohort mode)."""
    cfg = _cfg("aimd", latency=HEAVY, steps=6)
    cohort = cfg.model_copy(update={
        "simulate": cfg.simulate.model_copy(update={"mode": "cohort"}),
        "async_rl": cfg.async_rl.model_copy(update={"autopilot": AutopilotConfig()})})
    res = simulate(cohort, record_intervals=False)
    for r in res.records:
        assert sum(r["staleness_hist"].values()) == r["groups_trained"]
    assert sum(sum(r["staleness_hist"].values()) for r in res.records) == res.ledger["trained"]
