"""The ``async_rl.autopilot`` block: re-tune the staleness contract while the
run goes on (docs/autopilot.md; the mechanics are asyncrl.controller.retune).

Three modes: ``aimd`` (additive increase / multiplicative decrease of the
in-flight bound from what each step measured and the engines' load), ``runtime`` (a model of the
run, re-fitted from its own recent steps, plans the in-flight bound and the
capacity; the window stays) and ``plan`` (the same, and the window moves too).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictFloat, model_validator

from asyncrl.config.blocks import Block, NonNegFloat, NonNegInt, PosInt

Fraction = Annotated[StrictFloat, Field(ge=0, le=1)]
OpenFraction = Annotated[StrictFloat, Field(gt=0, lt=1)]
Factor = Annotated[StrictFloat, Field(gt=1)]


class AutopilotBounds(Block):
    """Constraints every move must keep (None: no constraint)."""

    #: 95th percentile of the trained groups' staleness (versions) over a window.
    max_staleness_p95: NonNegFloat | None = None
    #: Groups evicted or aborted per group dispatched-and-ended, over a window.
    max_waste_frac: Fraction | None = 0.05


#: What the model-based modes may change (``runtime`` never moves the window).
Knob = Literal["max_inflight_prompts", "window", "max_buffered_rollouts"]


class AutopilotConfig(Block):
    enabled: bool = False
    #: ``aimd``: the in-flight bound only, from measured trainer idle vs staleness/waste;
    #: ``runtime``: planned with the re-fitted model, window fixed; ``plan``: all knobs.
    mode: Literal["aimd", "runtime", "plan"] = "aimd"
    #: What a plan maximises among the settings that keep the bounds: groups
    #: trained per second, or (``staleness``) the least staleness p95 within
    #: ``min_gain`` of the best throughput.
    objective: Literal["throughput", "staleness"] = "throughput"
    bounds: AutopilotBounds = Field(default_factory=AutopilotBounds)
    #: The knobs a plan may move (``runtime`` leaves ``window`` out whatever this says).
    knobs: list[Knob] = Field(default_factory=lambda: ["max_inflight_prompts", "window",
                                                       "max_buffered_rollouts"])
    #: A plan's setting is applied only when it predicts at least this relative
    #: gain over the setting in force, and wins ``wins_needed`` re-plans in a row.
    min_gain: NonNegFloat = 0.03
    wins_needed: PosInt = 2
    #: Bounded moves: per re-plan, the in-flight bound and the capacity move by at
    #: most this fraction (at least one group), the window by at most one version.
    max_move: OpenFraction = 0.25
    #: Steps each candidate is measured for after the switch to it (it is switched
    #: to after ``plan_steps // 2`` steps under the setting in force; cohort mode:
    #: from an empty pipeline, the first quarter left out as its warm-up).
    plan_steps: PosInt = 24
    #: Steps of the run the model is fitted on (a sliding window; the newest).
    fit_steps: PosInt = 8
    #: One decision every so many steps; aimd measures these steps (the window),
    #: the model-based modes ``fit_steps`` steps, at least these.
    replan_every_steps: PosInt = 2
    #: Steps ignored at the start (and after a resume): start-up is not the workload.
    warmup_steps: NonNegInt = 2
    #: No change after this many steps (None: never freeze).
    freeze_after_steps: PosInt | None = None
    #: Grow the bound while the trainer idles more than this fraction of its steps.
    idle_high: Fraction = 0.05
    #: Additive increase: groups added to the bound per decision.
    increase: PosInt = 4
    #: Multiplicative decrease: the bound is multiplied by this on a broken bound.
    decrease: OpenFraction = 0.7
    min_inflight: PosInt = 1
    #: Upper clamp (None: the buffer capacity; a group in flight holds a slot).
    max_inflight: PosInt | None = None
    #: Start from a profile (``autopilot_profile.json``, or a run directory holding
    #: one) a run of the same workload wrote: the knobs in ``knobs`` begin at its
    #: setting instead of the configured one (asyncrl.controller.profile). A
    #: resumed run goes on with its checkpoint's setting and does not read it.
    reuse: str | None = None
    #: aimd reads the engines' load where they report it (vLLM, the simulator:
    #: asyncrl.engines.ReportsPressure); false: the step records only.
    engine_signals: bool = True
    #: KV-cache usage above this: trim the bound (times ``trim``).
    kv_high: Fraction = 0.9
    #: KV-cache usage below this while the trainer idles: grow the bound by
    #: ``grow_factor`` instead of ``increase`` groups.
    kv_low: Fraction = 0.5
    grow_factor: Factor = 1.5
    trim: OpenFraction = 0.9

    @model_validator(mode="after")
    def _clamps_in_order(self) -> AutopilotConfig:
        if self.max_inflight is not None and self.max_inflight < self.min_inflight:
            raise ValueError(f"max_inflight={self.max_inflight} is below min_inflight="
                             f"{self.min_inflight}; raise max_inflight or lower min_inflight")
        if self.kv_low >= self.kv_high:
            raise ValueError(f"kv_low={self.kv_low} is not below kv_high={self.kv_high}; "
                             "lower kv_low or raise kv_high")
        if not self.knobs:
            raise ValueError("knobs is empty: list what the autopilot may change, e.g. "
                             "knobs: [max_inflight_prompts, max_buffered_rollouts]")
        if self.reuse is not None and not self.reuse.strip():
            raise ValueError("reuse is empty: give the path of an autopilot_profile.json (or "
                             "of the run directory holding one), or reuse: null")
        if self.reuse is not None and not self.enabled:
            raise ValueError(f"reuse: {self.reuse} starts the autopilot from a profile, but "
                             "enabled is false; set enabled: true, or reuse: null")
        return self

    @property
    def plan_knobs(self) -> tuple[str, ...]:
        """The knobs a plan moves: ``knobs`` less the window in ``runtime`` mode."""
        return tuple(k for k in self.knobs if not (self.mode == "runtime" and k == "window"))


__all__ = ["AutopilotBounds", "AutopilotConfig", "Knob"]
