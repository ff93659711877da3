"""Run the real Controller against simulated backends under virtual time.

:func:`simulate` is one run; :func:`compare` runs several built-in policies on
the same workload; :func:`physical_bound` is the step time no policy can beat.
docs/simulate.md derives the bound and explains every column of the result.
The result, its columns and the bound's type are in :mod:`asyncrl.sim.result`
(cohort mode builds the same result); the serial reference, the other
yardstick, is in :mod:`asyncrl.sim.reference`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from asyncrl._util.collector import fewer_gc_passes
from asyncrl.buffer import RolloutBuffer
from asyncrl.config import RunConfig, SimulateConfig
from asyncrl.controller import Controller
from asyncrl.controller.profile import profile_of
from asyncrl.controller.stats import KEEP_RECORDS
from asyncrl.errors import ConfigError
from asyncrl.metrics import MemorySink
from asyncrl.sampling import (
    WINDOW_FIELD,
    OverSamplingSampler,
    create_sampler,
    parse_sampler_config,
)
from asyncrl.sim.backends import SimEngine, SimTask, SimTrainer
from asyncrl.sim.clock import LoopKind, run_virtual
from asyncrl.sim.cohort_result import cohort_result
from asyncrl.sim.latency import LatencyModel, make_latency_model
from asyncrl.sim.result import (
    ROW_KEYS,
    Bound,
    SimResult,
    custom_window,
    efficiency_of,
    percentile,
    sampler_label,
    sampler_window,
)
from asyncrl.sim.seed import Start, seed
from asyncrl.types import StopReason

#: The built-in policies ``compare`` knows, in the order the docs discuss them.
BUILTIN_POLICIES = tuple(WINDOW_FIELD)

#: Window used for compared policies when the config's own sampler is custom.
DEFAULT_COMPARE_WINDOW = 1

NO_SIMULATE_BLOCK = (
    "the config has no 'simulate' block, so there is nothing to simulate. Add one, e.g.\n"
    "simulate:\n"
    "  steps: 1000\n"
    "  rollout_slots: 64\n"
    "  generation_latency_s: {distribution: lognormal, median: 30, sigma: 0.6}\n"
    "  train_step_s: 20\n"
    "  weight_sync_s: 2\n"
    "or start from one of examples/sim/*.yaml (a key.path override such as "
    "simulate.steps=200 also creates the block with defaults)"
)


def physical_bound(cfg: RunConfig, latency: LatencyModel | None = None, *,
                   base_dir: str | Path | None = None) -> Bound:
    """No step can be faster than the trainer, nor than the fleet generating its groups.

    * trainer: ``train_step_s + weight_sync_s + train_per_group_s * n +
      train_per_token_s * (expected completion tokens of n groups)``: the train
      pump does all of it, one step after the other;
    * generation: ``n * E[latency] / ((1 - failure_rate) (1 - f)) / rollout_slots``:
      a step consumes ``n`` groups, each occupying a slot for its latency, and a
      failed attempt costs a whole latency too (``1 / (1 - p)`` attempts per
      group on average), as does a group the dynamic-sampling filter drops
      (``f``: :func:`filtered_fraction`, ``1 / (1 - f)`` groups per trained one);
      ``rollout_slots`` of them run at once at best (a latency that grows with
      the load is taken at full load, where the fleet is fastest).
    """
    sim = _sim_block(cfg)
    model = latency if latency is not None else make_latency_model(
        sim.generation_latency_s, base_dir=base_dir)
    n = cfg.grpo.num_prompts_per_step
    tokens = n * cfg.grpo.num_generations_per_prompt * model.mean_tokens(sim.tokens_per_s)
    trainer = (sim.train_step_s + sim.weight_sync_s + sim.train_per_group_s * n
               + sim.train_per_token_s * tokens)
    generation = (n * model.mean_at(sim.rollout_slots) / (1.0 - sim.failure_rate)
                  / (1.0 - filtered_fraction(cfg)) / sim.rollout_slots)
    return Bound(trainer, generation)


def filtered_fraction(cfg: RunConfig) -> float:
    """The fraction of finished groups the run filters: ``simulate.filter_rate``
    (the groups that come back with equal rewards) when ``grpo.dynamic_sampling``
    has a filter, else 0 (without one those groups are trained like any other)."""
    sim = _sim_block(cfg)
    return sim.filter_rate if cfg.grpo.dynamic_sampling.enabled else 0.0


def _sim_block(cfg: RunConfig) -> SimulateConfig:
    if cfg.simulate is None:
        raise ConfigError(NO_SIMULATE_BLOCK)
    return cfg.simulate


def simulate(
    cfg: RunConfig,
    *,
    sampler_override: Any = None,
    steps: int | None = None,
    base_dir: str | Path | None = None,
    record_intervals: bool = True,
    note: str = "",
    on_step: Callable[[int], None] | None = None,
    clock: LoopKind = "jump",
    latency: LatencyModel | None = None,
    planner: Any = None,
    retune_at: tuple[int, dict[str, Any]] | None = None,
    stop_after: tuple[int, int] | None = None,
    start_state: Start | None = None,
) -> SimResult:
    """Run ``cfg``'s setup for ``steps`` (default ``simulate.steps``) steps under virtual time.

    ``sampler_override`` (a sampler config model or dict) replaces
    ``async_rl.sampler``; everything else is the config as written, so the
    Controller's setup validation applies (a :class:`~asyncrl.errors.SetupError`
    propagates). ``base_dir`` is where a relative empirical latency path is
    looked up first (the CLI passes the config file's directory). ``on_step``
    is called with the number of finished steps after each one (progress bars).
    ``clock`` picks the virtual-time loop (see :mod:`asyncrl.sim.clock`); the
    default is the fast one, ``"looptime"`` is there to cross-check it.
    ``latency`` replaces the model ``simulate.generation_latency_s`` describes
    (the autopilot's planner fits one). ``planner``: the model-based autopilot's
    (:class:`asyncrl.sim.planner.ModelPlanner` with ``inline=True``: it answers
    at once, since the virtual clock stands still while it plans).
    ``retune_at``: ``(k, setting)`` asks for ``setting`` (the re-tune knobs:
    ``max_inflight_prompts``, ``window``, ``max_buffered_rollouts``) at the step
    boundary after step ``k`` through :meth:`Controller.retune`, as a running
    job's autopilot does (a setting equal to the one in force asks for nothing,
    as an autopilot that holds); ``k = 0``: before the first step, before
    anything is admitted (``Retuner.start_from``). Per-group mode only. The
    result's ``settled_at`` is the *settle point*: the steps done at the first
    later step boundary at which every group dispatched before the switch has
    left the buffer (the autopilot's own rule,
    :class:`asyncrl.controller.autoplan.PlannedAutopilot`). ``stop_after``
    (with ``retune_at``): ``(a, b)`` stops the run at the first step boundary
    at least ``a`` steps past the switch and ``b`` past the settle point
    (``steps`` stays the most it runs). ``start_state``
    (:class:`asyncrl.sim.seed.Start`): the run starts from a running job's
    state instead of an empty pipeline - its trainer version, its buffered and
    in-flight groups, its queued prompts (per-group mode, a time-based latency
    model); ``steps`` then counts from that version, and the config's knobs are
    the setting in force there. The planner simulates each candidate this way,
    with ``retune_at=(0, candidate)``.
    """
    sim = _sim_block(cfg)
    if latency is None:
        latency = make_latency_model(sim.generation_latency_s, base_dir=base_dir)
    num_steps = steps if steps is not None else sim.steps
    if num_steps < 1:
        raise ConfigError(f"steps must be >= 1, got {num_steps}")
    first = start_state.state.version if start_state is not None else 0
    grpo = cfg.grpo.model_copy(update={"max_num_steps": first + num_steps})
    # No stall watchdog: a wall-clock safety net means nothing in virtual time,
    # where a heavy-tailed latency is not a stall and a deadlock is caught exactly.
    async_rl = cfg.async_rl.model_copy(update={"stall_watchdog": None})
    if sampler_override is not None:
        async_rl = async_rl.model_copy(
            update={"sampler": parse_sampler_config(sampler_override)})
    capacity = async_rl.max_buffered_rollouts
    if start_state is not None:  # room for the run's slots; it follows down (seed)
        async_rl = async_rl.model_copy(update={"max_buffered_rollouts": max(
            capacity, len(start_state.state.groups))})
    if sim.mode == "cohort":
        if retune_at is not None or start_state is not None:
            raise ConfigError("simulate(retune_at=..., start_state=...) needs simulate.mode: "
                              "per_group (cohort mode cannot re-tune mid-run, nor start "
                              "from a running job's groups)")
        return cohort_result(cfg, async_rl.sampler, latency, num_steps,
                             bound=physical_bound(cfg, latency), note=note,
                             record_intervals=record_intervals, on_step=on_step)
    engine = SimEngine(latency, rollout_slots=sim.rollout_slots, seed=cfg.seed,
                       failure_rate=sim.failure_rate, filter_rate=sim.filter_rate,
                       weight_sync_s=sim.weight_sync_s,
                       record_intervals=record_intervals, tokens_per_s=sim.tokens_per_s,
                       pause_during_sync=sim.pause_generation_during_sync,
                       abort_s=sim.abort_s,
                       phases=[(p.at_step, make_latency_model(p.generation_latency_s))
                               for p in sim.phases],
                       fleet=[(c.at_s, c.rollout_slots) for c in sim.fleet])
    trainer = SimTrainer(train_step_s=sim.train_step_s, train_per_group_s=sim.train_per_group_s,
                         train_per_token_s=sim.train_per_token_s, loss=cfg.loss)
    sink = _FirstRecords()
    holder: dict[str, Controller] = {}
    pilot = async_rl.autopilot
    if planner is None and pilot.enabled and pilot.mode != "aimd":
        raise ConfigError(
            f"async_rl.autopilot.mode: {pilot.mode} plans with the simulator: pass "
            "planner=asyncrl.sim.planner.ModelPlanner(cfg, inline=True) (asyncrl simulate "
            "does), or simulate with mode: aimd or the autopilot off")

    switch = _Switch(*retune_at, stop_after) if retune_at is not None else None
    window = sampler_window(async_rl.sampler)

    async def _step_hook(controller: Controller, version: int) -> None:
        if switch is not None:
            switch.at_boundary(controller, version)
        if on_step is not None:
            on_step(version)

    async def _run() -> None:
        # Built inside the loop so every asyncio primitive binds to the virtual one.
        controller = holder["c"] = Controller(
            task=SimTask(), engines=[engine], trainer=trainer, grpo=grpo, async_rl=async_rl,
            seed=cfg.seed, deterministic=cfg.deterministic, sinks=[sink],
            on_step_end=_step_hook if on_step is not None or retune_at is not None else None,
            planner=planner,
        )
        nonlocal window, note
        if window is None:  # a custom sampler: its own, read before a re-tune can move it
            window, custom = custom_window(controller.sampler)
            note = "; ".join(x for x in (note, custom) if x)
        engine.on_resize.append(controller.fleet.fleet_changed)  # what a real fleet change does
        engine.schedule_fleet()
        if start_state is not None:
            seed(controller, engine, start_state, capacity)
        if switch is not None:
            switch.begin(controller)
        await controller.run()

    t0 = time.perf_counter()
    with _quiet_group_warnings(), fewer_gc_passes():
        run_virtual(_run(), loop=clock)
    wall = time.perf_counter() - t0
    controller = holder["c"]
    result = _result(controller, engine, trainer, sink, sim, physical_bound(cfg, latency), wall,
                     note, sampler_label(async_rl.sampler), window)
    result.settled_at = switch.settled_at if switch is not None else None
    return result


@dataclasses.dataclass
class _Switch:
    """``simulate(retune_at=(at, setting), stop_after=...)``: the change after
    ``at`` steps, then the settle point (:func:`simulate`); steps are counted
    from the trainer version the run starts at (a running job's, from a state)."""

    at: int
    setting: dict[str, Any]
    stop_after: tuple[int, int] | None
    #: The trainer version the run starts at (``at`` and the settle point count from it).
    first: int = 0
    #: The buffer's next dispatch seq at the switch: every group below it was
    #: dispatched under the setting before.
    before_seq: int | None = None
    settled_at: int | None = None

    def begin(self, controller: Controller) -> None:
        """Before the run: a switch after 0 steps applies now."""
        self.first = controller.version.value
        if self.at == 0:
            self._switch(controller, lambda **knobs: controller.retuner.start_from(knobs))

    def _switch(self, controller: Controller, ask: Callable[..., Any]) -> None:
        self.before_seq = controller.buffer.next_seq
        now = controller.retuner.target.as_dict()
        if {**now, **self.setting} != now:
            ask(**self.setting)

    def at_boundary(self, controller: Controller, version: int) -> None:
        done = version - self.first
        if done == self.at:  # applied at this step boundary
            self._switch(controller, controller.retune)
            return
        if self.before_seq is None:
            return
        if self.settled_at is None:
            oldest = controller.buffer.oldest_seq()
            if oldest is None or oldest >= self.before_seq:
                self.settled_at = done
        if self.settled_at is not None and self.stop_after is not None:
            after_switch, after_settle = self.stop_after
            if done >= max(self.at + after_switch, self.settled_at + after_settle):
                controller.request_stop(StopReason.STOPPED, "measured past the settle point")


class _FirstRecords(MemorySink):
    """The first :data:`KEEP_RECORDS` step records (what the timeline plot and
    the tests read); past them a run keeps only the summary's aggregates, so a
    long simulation does not grow with its steps."""

    def write(self, record: dict[str, Any]) -> None:
        if len(self.records) < KEEP_RECORDS:
            self.records.append(record)


@contextlib.contextmanager
def _quiet_group_warnings() -> Iterator[None]:
    """Silence the controller's one-warning-per-failed-attempt while simulating.

    With ``failure_rate`` set they are expected by the thousand, and the
    result reports them as counts. Debug logging (``asyncrl -v``) keeps them.
    """
    logger = logging.getLogger("asyncrl.controller")
    if logger.getEffectiveLevel() < logging.WARNING:
        yield
        return
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


def _result(
    controller: Controller,
    engine: SimEngine,
    trainer: SimTrainer,
    sink: MemorySink,
    sim: SimulateConfig,
    bound: Bound,
    wall: float,
    note: str,
    label: str,
    window: int | None,
) -> SimResult:
    summary = sink.summary or controller.summary()
    steps = int(summary["steps"])
    elapsed = float(summary["wall_time_s"])
    ledger = dict(summary["ledger"])
    hist = {str(k): int(v) for k, v in summary["staleness_hist"].items()}
    token_hist = {str(k): int(v) for k, v in summary.get("token_staleness_hist", {}).items()}
    masks = trainer.mask_stats
    dispatched = ledger["dispatched"]
    timeline = [
        {"kind": i.kind, "lane": i.lane, "start": i.start, "end": i.end, "label": i.label}
        for i in controller.timeline.intervals
        if i.kind != "gen"
    ]
    timeline.extend(
        {"kind": "gen", "lane": 0, "start": a, "end": b, "label": outcome}
        for a, b, outcome in engine.intervals
    )
    efficiency, note = efficiency_of(bound, steps, elapsed, ledger["aborted"], note)
    return SimResult(
        sampler=label,
        window=window,
        steps=steps,
        virtual_time_s=elapsed,
        steps_per_hour=3600.0 * steps / elapsed if elapsed > 0 else math.inf,
        efficiency=efficiency,
        trainer_idle_frac=float(summary["trainer_idle_s"]) / elapsed if elapsed > 0 else 0.0,
        generator_util=engine.busy_slot_s / sim.slot_seconds(elapsed) if elapsed > 0 else 0.0,
        staleness_mean=float(summary["staleness_mean"]),
        staleness_p95=percentile(hist, 0.95),
        staleness_max=int(summary["staleness_max"]),
        token_staleness_mean=float(summary.get("token_staleness_mean", 0.0)),
        token_staleness_p95=int(summary.get("token_staleness_p95", 0)),
        token_staleness_max=int(summary.get("token_staleness_max", 0)),
        waste_frac=(ledger["evicted"] + ledger["aborted"]) / dispatched if dispatched else 0.0,
        masked_token_frac=masks.masked / masks.tokens if masks.tokens else 0.0,
        bound=bound,
        ledger=ledger,
        stop_reason=str(summary["stop_reason"]),
        wall_s=wall,
        note=note,
        records=sink.records,
        staleness_hist=hist,
        token_staleness_hist=token_hist,
        timeline=timeline,
        engine=engine,
        trainer=trainer,
        retunes=list(controller.retuner.applied),
        autopilot=list(controller.autopilot.decisions) if controller.autopilot else [],
        profile=profile_of(controller.autopilot, steps) if controller.autopilot else None,
    )


# ----------------------------------------------------------------- compare
def compare_window(cfg: RunConfig) -> int:
    """The window every compared policy gets: the config's sampler's own
    (lookahead for in_order, staleness for the others), or 1 for a custom one."""
    window = sampler_window(cfg.async_rl.sampler)
    return DEFAULT_COMPARE_WINDOW if window is None else window


def policy_config(cfg: RunConfig, name: str) -> tuple[Any, str]:
    """The sampler config ``name`` runs with in a comparison, and a note.

    The config's own sampler is used as written (with all its knobs); other
    built-ins get :func:`compare_window`.
    """
    if name not in WINDOW_FIELD:
        raise ConfigError(
            f"--compare: unknown policy {name!r}; choose from {', '.join(BUILTIN_POLICIES)} "
            "(custom samplers run without --compare)"
        )
    own = cfg.async_rl.sampler
    if getattr(own, "name", None) == name:
        return own, ""
    window = compare_window(cfg)
    note = "" if sampler_window(own) is not None else f"window {window} (config sampler is custom)"
    return parse_sampler_config({"name": name, WINDOW_FIELD[name]: window}), note


def fit_capacity(cfg: RunConfig, sampler_cfg: Any) -> tuple[RunConfig, str]:
    """Raise ``max_buffered_rollouts`` to what ``sampler_cfg`` needs, if it is short.

    A comparison is about the policies, so a policy whose required capacity
    the config does not meet runs with exactly the capacity it needs (the
    Controller would otherwise refuse it) and its row says so.
    """
    n = cfg.grpo.num_prompts_per_step
    have = cfg.async_rl.max_buffered_rollouts
    sampler = create_sampler(RolloutBuffer(max(have, 1)), sampler_cfg)
    if isinstance(sampler, OverSamplingSampler):  # the capacity of over-sampled batches
        sampler.set_batch_multiplier(cfg.grpo.dynamic_sampling.batch_multiplier)
    need = sampler.required_buffer_capacity(n)
    if need is None or need <= have:
        return cfg, ""
    raised = cfg.model_copy(update={
        "async_rl": cfg.async_rl.model_copy(update={"max_buffered_rollouts": need}),
    })
    return raised, f"max_buffered_rollouts raised {have}->{need} (policy needs {need})"


def compare(
    cfg: RunConfig,
    names: Sequence[str],
    *,
    steps: int | None = None,
    base_dir: str | Path | None = None,
    record_intervals: bool = True,
    on_start: Callable[[str], None] | None = None,
    on_step: Callable[[int], None] | None = None,
    on_done: Callable[[SimResult], None] | None = None,
) -> list[SimResult]:
    """Run each named built-in policy on ``cfg``'s workload (same seed, same latencies)."""
    _sim_block(cfg)
    results = []
    for name in names:
        sampler_cfg, note = policy_config(cfg, name)
        run_cfg, cap_note = fit_capacity(cfg, sampler_cfg)
        if on_start is not None:
            on_start(name)
        result = simulate(
            run_cfg,
            sampler_override=sampler_cfg,
            steps=steps,
            base_dir=base_dir,
            record_intervals=record_intervals,
            note="; ".join(x for x in (note, cap_note) if x),
            on_step=on_step,
        )
        results.append(result)
        if on_done is not None:
            on_done(result)
    return results


#: ROW_KEYS, Bound and SimResult are re-exported: callers import them from here.
__all__ = ["BUILTIN_POLICIES", "NO_SIMULATE_BLOCK", "ROW_KEYS", "Bound", "SimResult", "compare",
           "compare_window", "filtered_fraction", "fit_capacity", "physical_bound",
           "policy_config", "simulate"]
