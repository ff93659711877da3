"""The built-in planner of the model-based autopilot modes (``runtime``, ``plan``).

A plan (:func:`plan`) answers a :class:`~asyncrl.controller.autoplan.PlanRequest`
in three steps:

1. **fit** the run's recent window (:func:`fit_model`): the trainer's costs
   with ``--calibrate``'s fit (:func:`asyncrl.sim.calibrate.fit_trainer`: chunk
   seconds per trained token, the optimizer step, the sync, the abort cost) and
   the generation latency as the window's own finished generations, resampled
   (an empirical, time-based model: it follows a workload that shifts, but
   not the load dependence ``--calibrate``'s ``tokens`` model fits offline);
   with the run's state, the groups still generating count too, as
   right-censored observations of their ages, and every group from the age it
   had when the window began (a product-limit fit with delayed entry,
   :mod:`asyncrl.sim.survival`: right after the latency grows, the long
   groups have not finished yet; those dispatched before the window are the
   long ones);
2. **search** the settings one bounded move from the one in force
   (:func:`candidate_settings`: the window by one version - ``plan`` mode only -,
   the in-flight bound and the capacity by ``max_move``, alone or together; the
   capacity never below what the window needs) on the fitted workload, every
   candidate with the same seed (common random numbers: differences are the
   settings', not the draws'), simulated from the run's exact state at the
   decision (the request's :class:`~asyncrl.controller.snapshot.RunState`,
   loaded by :mod:`asyncrl.sim.seed`: the trainer at the run's version, the
   buffered groups, the in-flight ones running for the time they have left,
   drawn once per plan from the fitted latencies conditioned on their ages)
   and switched to before the first step (:func:`predict`: throughput from
   the switch; the bound facts from the settle point on and, from the run's
   state, over the whole horizon from the switch as well - a switch that
   breaks a bound the setting in force keeps is refused,
   :func:`~asyncrl.sim.judge.judged`); a request without a state switches
   after a prefix under the setting in force that fills the pipeline like
   the run's (its bound facts from the settle point on only); from 1,024
   groups per step in cohort mode, from an empty pipeline (it cannot re-tune
   mid-run nor start from a run's groups); each prediction corrected by the
   model's bias on the setting in force (:func:`~asyncrl.sim.judge.corrected`:
   what the run measured above what the model predicted);
3. **pick** (:func:`~asyncrl.sim.judge.pick`): the most throughput among
   the candidates that keep the bounds (``objective: staleness``: the least
   staleness p95 within ``min_gain`` of it); when none keeps them, the one
   nearest to them; the autopilot adds the gain threshold and hysteresis.

:class:`ModelPlanner` runs plans in a separate process (a real run: the event
loop, the pumps and the trainer never wait for it) or inline (virtual time).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import math
import multiprocessing
import random
import time
from typing import Any

from asyncrl.buffer import RolloutBuffer
from asyncrl.config import AutopilotConfig, RunConfig, SimulateConfig
from asyncrl.controller.autoplan import PlanRequest, PlanResult, Prediction
from asyncrl.controller.stats import hist_quantile
from asyncrl.errors import ConfigError, SetupError
from asyncrl.sampling import WINDOW_FIELD, create_sampler, parse_sampler_config
from asyncrl.sim.calibrate import fit_trainer
from asyncrl.sim.judge import biased, corrected, judged, keeps, measured_bias, pick, switch_judged
from asyncrl.sim.latency import Empirical
from asyncrl.sim.runner import simulate
from asyncrl.sim.seed import Start, start_of
from asyncrl.sim.survival import Observed, fit_latencies, observed

#: Fewer finished generations in the window than this: no fit, no plan.
MIN_GENERATIONS = 8
#: From this many groups per step the candidates run in cohort mode.
COHORT_FROM = 1024


def fit_model(cfg: RunConfig, request: PlanRequest) -> tuple[dict[str, Any] | None, str]:
    """The model of the request's window (a ``simulate`` block's numbers and the
    latencies), or None and why not."""
    gens = [i for i in request.intervals if i["kind"] == "gen" and i["label"] == "ok"]
    if len(gens) < MIN_GENERATIONS or len(request.records) < 2:
        return None, (f"too little data to fit: {len(gens)} finished generations and "
                      f"{len(request.records)} steps in the window")
    finished = [float(i["end"]) - float(i["start"]) for i in gens]
    ages = _ages(request)
    # With the run's state, the groups still generating count as censored
    # observations, and every group is counted from the age it had when the
    # window began (sim/survival.py: right after the latency grows the finished
    # ones are mostly the short ones; the groups dispatched before the window
    # are the long ones). Without it, the finished ones as they are.
    latencies = fit_latencies(_observed(request, gens, ages)) if ages else finished
    records = request.records
    groups = [{"state": "trained", "end_step": r["step"],
               "tokens": int(r.get("rollout/trained_tokens", 0))} for r in records]
    trainer, _ = fit_trainer(records, request.intervals, groups)
    n_gen = cfg.grpo.num_generations_per_prompt
    generated = sum(r.get("rollout/generated_tokens", 0) for r in records)
    busy = n_gen * math.fsum(finished)  # completion-seconds: tokens_per_s of each
    sim = cfg.simulate or SimulateConfig()
    slots = request.rollout_slots or (sim.rollout_slots if cfg.simulate is not None else
                                      request.engines * max(
                                          1, cfg.policy.generation.max_batch_sequences // n_gen))
    return {**trainer, "rollout_slots": slots,
            "tokens_per_s": generated / busy if generated and busy > 0 else sim.tokens_per_s,
            "latency_mean_s": math.fsum(latencies) / len(latencies),
            "latency_p95_s": sorted(latencies)[int(0.95 * (len(latencies) - 1))],
            "generations": len(finished), "censored": len(ages), "latencies": latencies}, ""


def _observed(request: PlanRequest, gens: list[dict[str, Any]],
              ages: list[float]) -> list[Observed]:
    """Every group the fit window saw (:class:`~asyncrl.sim.survival.Observed`):
    the finished generations and the ages of the groups still generating, on
    the records' clock (the window began when its first step did)."""
    first, last = request.records[0], request.records[-1]
    since = float(first["wall_time_s"]) - float(first.get("step_time_s") or 0.0)
    assert request.state is not None  # ages come from the state
    clock = request.state.clock_s
    now = float(last["wall_time_s"]) if clock is None else clock
    out = [observed(float(i["start"]), float(i["end"]), since, finished=True) for i in gens]
    out += [observed(now - age, now, since, finished=False) for age in ages]
    return out


def _ages(request: PlanRequest) -> list[float]:
    """The ages of the request's groups generating a first attempt (the ones
    whose age is known: :attr:`~asyncrl.controller.snapshot.LiveGroup.age_s`)."""
    if request.state is None:
        return []
    return [g.age_s for g in request.state.groups
            if g.end_weight is None and g.phase == "generating" and g.age_s is not None]


def _required(cfg: RunConfig, window: int | None) -> int:
    sampler = _sampler(cfg, window)
    n = cfg.grpo.num_prompts_per_step
    need = create_sampler(RolloutBuffer(1), sampler).required_buffer_capacity(n)
    return max(need or 1, cfg.async_rl.min_groups_for_streaming_train)


def _sampler(cfg: RunConfig, window: int | None) -> Any:
    own = cfg.async_rl.sampler  # the run's (see _with_sampler)
    field = WINDOW_FIELD.get(getattr(own, "name", ""))
    if window is None or field is None:
        return own
    return parse_sampler_config({**own.model_dump(), field: window})


def candidate_settings(cfg: RunConfig, request: PlanRequest) -> list[dict[str, Any]]:
    """The setting in force (first) and the bounded moves from it (see the
    module docstring); each with a capacity the window allows."""
    cur, knobs, m = request.setting, set(request.knobs), request.max_move
    inflight, window, cap = (cur["max_inflight_prompts"], cur["window"],
                             cur["max_buffered_rollouts"])

    def moves(x: int, knob: str) -> list[int]:
        if knob not in knobs:
            return [x, x, x]
        return [x, max(x + 1, round(x * (1 + m))), max(1, min(x - 1, round(x * (1 - m))))]

    ins, caps = moves(inflight, "max_inflight_prompts"), moves(cap, "max_buffered_rollouts")
    windows = [window]
    if "window" in knobs and window is not None:
        windows += [window + 1] + ([window - 1] if window > 0 else [])
    pairs = [(0, 0), (1, 1), (2, 2), (1, 0), (2, 0), (0, 1), (0, 2)]
    out, seen = [], set()
    for w in windows:
        need = _required(cfg, w)
        for a, b in pairs if w == window else pairs[:3]:
            c = caps[b]
            if c < need:
                if "max_buffered_rollouts" not in knobs:
                    continue
                c = need  # capacity follows the window (the Retuner's rule)
            setting = {"max_inflight_prompts": ins[a], "window": w, "max_buffered_rollouts": c}
            key = tuple(setting.values())
            if key not in seen:
                seen.add(key)
                out.append(setting)
    return out


def escape_settings(cfg: RunConfig, request: PlanRequest) -> list[dict[str, Any]]:
    """When the setting in force is predicted to break a bound: the settings
    that may restore it in one move (a bound is a constraint, not a gain, so
    the one-move limit of :func:`candidate_settings` does not apply): every
    narrower window (``plan`` mode), each with the in-flight bound (and the
    capacity, where it is a knob) cut by up to three ``max_move`` steps; the
    capacity never below what the window needs."""
    cur, knobs, m = request.setting, set(request.knobs), request.max_move
    inflight, window, cap = (cur["max_inflight_prompts"], cur["window"],
                             cur["max_buffered_rollouts"])
    windows = [window]
    if "window" in knobs and window is not None:
        windows += list(range(window - 1, -1, -1))
    cuts = [(1 - m) ** k for k in range(4)]
    out = []
    for w in windows:
        need = _required(cfg, w)
        for f in cuts:
            i = max(1, round(inflight * f)) if "max_inflight_prompts" in knobs else inflight
            c = max(need, round(cap * f)) if "max_buffered_rollouts" in knobs else cap
            setting = {"max_inflight_prompts": i, "window": w, "max_buffered_rollouts": c}
            if c >= need and setting not in out:
                out.append(setting)
    return out


def _plan_config(cfg: RunConfig, model: dict[str, Any], steps: int) -> RunConfig:
    sim = cfg.simulate or SimulateConfig()
    cohort = (cfg.grpo.num_prompts_per_step >= COHORT_FROM and sim.failure_rate == 0
              and not sim.pause_generation_during_sync and model["abort_s"] == 0)
    block = sim.model_copy(update={
        "steps": steps, "phases": [], "mode": "cohort" if cohort else "per_group",
        **{k: model[k] for k in ("rollout_slots", "tokens_per_s", "train_step_s",
                                 "train_per_token_s", "weight_sync_s", "abort_s")},
        "train_per_group_s": 0.0})
    async_rl = cfg.async_rl.model_copy(update={"autopilot": AutopilotConfig()})
    return cfg.model_copy(update={"simulate": block, "async_rl": async_rl,
                                  "deterministic": False})


def predict(cfg: RunConfig, latency: Empirical, setting: dict[str, Any], steps: int,
            bounds: dict[str, Any], *, start: dict[str, Any] | None = None,
            state: Start | None = None) -> Prediction:
    """Simulate ``setting`` on the fitted workload.

    With ``state`` (the run's state at the decision, ``start`` the setting in
    force there) the simulation starts from the run's own groups
    (:mod:`asyncrl.sim.seed`) and ``setting`` is asked for before its first
    step, through the controller's own re-tune path, as the autopilot will ask
    for it at that step boundary (``setting == start`` asks for nothing: staying
    is measured the same way). With ``start`` alone (a request without a state)
    the pipeline is filled first: :func:`prefix_steps` steps under ``start``,
    then the switch. The throughput is measured over the ``steps`` steps from
    the switch (what the transition costs counts against the candidate); the
    staleness p95 and waste the bounds are checked on from the *settle point*
    on (the first step boundary at which every group dispatched before the
    switch has ended, the autopilot's rule): the new setting's steady state,
    not the old groups finishing; with ``state`` the transition is judged too
    (``transition_p95``, ``transition_waste``: every step from the switch on,
    see :func:`~asyncrl.sim.judge.judged`). The run goes on past ``steps`` (up to
    ``2 * steps`` after the switch) until ``steps // 2`` steps past the settle
    point are measured; when fewer than ``steps // 4`` are, the bounds are
    checked on every step from the switch on instead (conservative for a
    narrowing; the prediction's ``settled_after`` is then None). Without
    either, or in cohort mode (it cannot re-tune mid-run), ``setting`` runs
    from an empty pipeline for ``steps`` steps, measured past the first quarter."""
    assert cfg.simulate is not None
    if start is None or cfg.simulate.mode != "per_group":
        res = simulate(_with_knobs(cfg, setting), sampler_override=_sampler(cfg, setting["window"]),
                       latency=latency, record_intervals=False, steps=steps)
        skip = min(steps // 4, len(res.records) - 1)
        tput, p95, waste = _facts(res.records, skip, len(res.records))
        return Prediction(setting, tput, p95, waste, keeps(p95, waste, bounds))
    prefix = 0 if state is not None else prefix_steps(steps)
    res = simulate(_with_knobs(cfg, start), sampler_override=_sampler(cfg, start["window"]),
                   latency=latency, record_intervals=False, steps=prefix + 2 * steps,
                   retune_at=(prefix, setting), stop_after=(steps, steps // 2),
                   start_state=state)
    records, settled = res.records, res.settled_at
    tput, moved_p95, _ = _facts(records, prefix, min(prefix + steps, len(records)))
    if settled is not None and len(records) - settled >= max(1, steps // 4):
        _, p95, waste = _facts(records, settled, len(records))
    else:  # not settled in time: every step from the switch on
        settled = None
        _, p95, waste = _facts(records, prefix, len(records))
    moved_waste = None
    if state is not None:
        # From the run's own groups the simulated switch is the run's (the
        # groups in flight, their ages, the queue): what it does before it
        # settles is what the run will train, so the bounds are judged over
        # the whole horizon from the switch, transition included (a setting
        # whose switch breaks a bound is not taken; see judged()). The
        # throughput stays measured over the ``steps`` from the switch - the
        # transition's cost counts, the overrun past it (run only to reach the
        # settle point) does not - and the settled facts are kept as well: a
        # fresh transition must not hide a steady state that breaks a bound.
        # (Without the state the prefix's pipeline is only like the run's:
        # its transition is not the run's and is not judged.)
        _, moved_p95, moved_waste = _facts(records, prefix, len(records))
    out = Prediction(setting, tput, p95, waste, False, transition_p95=moved_p95,
                     settled_after=None if settled is None else settled - prefix,
                     transition_waste=moved_waste)
    return dataclasses.replace(out, keeps_bounds=judged(out, bounds))


def prefix_steps(steps: int) -> int:
    """Steps a prediction without the run's state runs the setting in force
    before it changes (half of ``plan_steps``, at least two): the pipeline
    fills like the run's."""
    return max(2, steps // 2)


def _with_knobs(cfg: RunConfig, setting: dict[str, Any]) -> RunConfig:
    return cfg.model_copy(update={"async_rl": cfg.async_rl.model_copy(update={
        "max_inflight_prompts": setting["max_inflight_prompts"],
        "max_buffered_rollouts": setting["max_buffered_rollouts"]})})


def _facts(records: list[dict[str, Any]], lo: int, hi: int) -> tuple[float, float, float]:
    """(groups trained per second, staleness p95, waste) of ``records[lo:hi]``."""
    part = records[lo:hi]
    if not part:
        return 0.0, 0.0, 0.0
    span = part[-1]["wall_time_s"] - (records[lo - 1]["wall_time_s"] if lo else 0.0)
    trained = sum(r["groups_trained"] for r in part)
    wasted = sum(r["groups_evicted"] + r["groups_aborted"] for r in part)
    hist: collections.Counter[int] = collections.Counter()
    for r in part:
        hist.update({int(k): n for k, n in r["staleness_hist"].items()})
    p95 = float(hist_quantile(hist, 0.95)) if hist else 0.0
    waste = wasted / (wasted + trained) if wasted + trained else 0.0
    return trained / span if span > 0 else 0.0, p95, waste


def _with_sampler(cfg: RunConfig, request: PlanRequest) -> RunConfig:
    """``cfg`` with the run's own sampler block (a simulation may override it)."""
    if request.sampler is None:
        return cfg
    sampler = parse_sampler_config(request.sampler)
    return cfg.model_copy(update={"async_rl": cfg.async_rl.model_copy(
        update={"sampler": sampler})})


def plan(cfg: RunConfig, request: PlanRequest, min_gain: float = 0.0) -> PlanResult:
    """One re-plan: fit, search, pick (the module docstring)."""
    t0 = time.perf_counter()
    cfg = _with_sampler(cfg, request)
    model, why = fit_model(cfg, request)
    if model is None:
        return PlanResult({}, [], None, None, time.perf_counter() - t0, why)
    latency = Empirical(tuple(model.pop("latencies")), f"the last {len(request.records)} steps")
    base = _plan_config(cfg, model, prefix_steps(request.plan_steps) + 2 * request.plan_steps)
    state = None
    if request.state is not None and base.simulate is not None \
            and base.simulate.mode == "per_group":
        # Drawn once: every candidate starts from the same groups with the same
        # time left (common random numbers).
        state = start_of(request.state, latency.values,
                         random.Random(f"asyncrl-plan:{cfg.seed}:{request.step}"))
        model["inflight_at_start"] = request.state.inflight

    def predicted(settings: list[dict[str, Any]]) -> list[Prediction]:
        out = []
        for setting in settings:
            try:
                out.append(predict(base, latency, setting, request.plan_steps, request.bounds,
                                   start=request.setting, state=state))
            except (SetupError, ConfigError):  # RetuneRefused is a SetupError
                continue  # a setting the controller refuses is no candidate
        return out

    preds = predicted(candidate_settings(cfg, request))
    current = preds[0] if preds and preds[0].setting == request.setting else None
    bias = {"staleness_p95": 0.0, "waste_frac": 0.0}
    if current is not None and request.measured is not None:
        bias = measured_bias(current, request.measured)
        model["bias"] = bias
        preds = [biased(p, bias, request.bounds) for p in preds]
    if current is not None:
        preds = switch_judged(preds, preds[0], request.bounds)
        current = preds[0]
    if current is not None and not current.keeps_bounds:
        seen = [p.setting for p in preds]
        more = [s for s in escape_settings(cfg, request) if s not in seen]
        preds += switch_judged([biased(p, bias, request.bounds) for p in predicted(more)],
                               current, request.bounds)
    best = pick(preds, request.objective, min_gain, request.bounds)
    return PlanResult(model, preds, best, current, time.perf_counter() - t0)


@dataclasses.dataclass
class ModelPlanner:
    """:func:`plan` for one run's config, as the autopilot's
    :class:`~asyncrl.controller.autoplan.Planner`: in a process of its own
    (``inline=False``: ``asyncrl train``), or at once on a helper thread the
    caller waits for (``inline=True``: virtual time, where a nested simulation
    cannot run on the thread of the running loop and must not let time pass)."""

    cfg: RunConfig
    inline: bool = False
    _pool: concurrent.futures.Executor | None = dataclasses.field(default=None, repr=False)

    def submit(self, request: PlanRequest) -> concurrent.futures.Future[PlanResult]:
        min_gain = self.cfg.async_rl.autopilot.min_gain
        if self.inline:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                future = pool.submit(plan, self.cfg, request, min_gain)
            return future  # done: leaving the block waited for it
        if self._pool is None:
            # spawn: a fork of a process with torch and engine threads is unsafe.
            self._pool = concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool.submit(plan, self.cfg, request, min_gain)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


__all__ = [
    "ModelPlanner",
    "biased",
    "candidate_settings",
    "corrected",
    "escape_settings",
    "fit_model",
    "judged",
    "measured_bias",
    "pick",
    "plan",
    "predict",
    "switch_judged",
]
