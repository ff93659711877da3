"""The ``async_rl.autopilot`` block: re-tune the staleness contract while the
run goes on (docs/autopilot.md; the mechanics are asyncrl.controller.retune).

Only ``mode: aimd`` exists so far: additive increase / multiplicative decrease
of the in-flight bound from what each step measured (the trainer's idle
fraction against the staleness and waste bounds).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictFloat, model_validator

from asyncrl.config.blocks import Block, NonNegFloat, NonNegInt, PosInt

Fraction = Annotated[StrictFloat, Field(ge=0, le=1)]
OpenFraction = Annotated[StrictFloat, Field(gt=0, lt=1)]


class AutopilotBounds(Block):
    """Constraints every move must keep (None: no constraint)."""

    #: 95th percentile of the trained groups' staleness (versions) over a window.
    max_staleness_p95: NonNegFloat | None = None
    #: Groups evicted or aborted per group dispatched-and-ended, over a window.
    max_waste_frac: Fraction | None = 0.05


class AutopilotConfig(Block):
    enabled: bool = False
    #: ``aimd``: the in-flight bound only, from measured trainer idle vs staleness/waste.
    mode: Literal["aimd"] = "aimd"
    bounds: AutopilotBounds = Field(default_factory=AutopilotBounds)
    #: Steps measured per decision (the window); one decision every so many steps.
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

    @model_validator(mode="after")
    def _clamps_in_order(self) -> AutopilotConfig:
        if self.max_inflight is not None and self.max_inflight < self.min_inflight:
            raise ValueError(f"max_inflight={self.max_inflight} is below min_inflight="
                             f"{self.min_inflight}; raise max_inflight or lower min_inflight")
        return self


__all__ = ["AutopilotBounds", "AutopilotConfig"]
