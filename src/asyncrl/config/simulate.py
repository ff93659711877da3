"""The ``simulate`` block: what ``asyncrl simulate`` models instead of the
engines and the trainer (docs/simulate.md)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, StrictFloat, model_validator

from asyncrl.config.blocks import Block, NonNegFloat, PosFloat, PosInt


class ConstantLatency(Block):
    distribution: Literal["constant"] = "constant"
    value: NonNegFloat = 30.0


class LognormalLatency(Block):
    distribution: Literal["lognormal"] = "lognormal"
    median: PosFloat = 30.0
    sigma: NonNegFloat = 0.6


class LognormalParams(Block):
    median: PosFloat
    sigma: NonNegFloat


class BimodalLatency(Block):
    distribution: Literal["bimodal"] = "bimodal"
    fast: LognormalParams = LognormalParams(median=20.0, sigma=0.3)
    slow: LognormalParams = LognormalParams(median=120.0, sigma=0.3)
    slow_fraction: Annotated[StrictFloat, Field(ge=0, le=1)] = 0.1


class EmpiricalLatency(Block):
    distribution: Literal["empirical"] = "empirical"
    path: str


class TokenLatency(Block):
    """A group's latency from its completion lengths and the load, as fitted by
    ``asyncrl simulate --calibrate``: ``base_s + longest * (per_token_s +
    per_token_per_group_s * groups generating)`` (docs/simulate.md)."""

    distribution: Literal["tokens"] = "tokens"
    #: Observed groups, resampled: ``[longest completion, mean completion]`` in tokens.
    lengths: Annotated[list[tuple[PosInt, PosFloat]], Field(min_length=1)]
    #: Per group, whatever its length (prefill, scheduling).
    base_s: NonNegFloat = 0.0
    #: One decode step of a group generating alone.
    per_token_s: NonNegFloat
    #: What each other group generating at the same time adds to a decode step.
    per_token_per_group_s: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _mean_within_longest(self) -> TokenLatency:
        for i, (longest, mean) in enumerate(self.lengths):
            if mean > longest:
                raise ValueError(f"lengths[{i}] = [{longest}, {mean}]: the mean completion "
                                 "cannot be longer than the longest")
        return self


LatencyConfig = Annotated[
    Union[ConstantLatency, LognormalLatency, BimodalLatency, EmpiricalLatency,  # noqa: UP007
          TokenLatency],
    Field(discriminator="distribution"),
]


#: What a workload phase may switch to: the time-based models drawn per group.
PhaseLatencyConfig = Annotated[
    Union[ConstantLatency, LognormalLatency, BimodalLatency],  # noqa: UP007
    Field(discriminator="distribution"),
]


class WorkloadPhase(Block):
    """From trainer version ``at_step`` on, groups that start draw their
    latency from ``generation_latency_s`` (a workload that changes mid-run)."""

    at_step: PosInt
    generation_latency_s: PhaseLatencyConfig


class FleetChange(Block):
    """From virtual second ``at_s`` on, the fleet has ``rollout_slots`` slots
    (a preemptible fleet: slots added or taken away mid-run). A shrink drains:
    a removed slot finishes the group it holds, then is gone (docs/fleet.md)."""

    at_s: PosFloat
    rollout_slots: PosInt


class SimulateConfig(Block):
    steps: PosInt = 1000
    rollout_slots: PosInt = 64
    generation_latency_s: LatencyConfig = Field(default_factory=LognormalLatency)
    train_step_s: NonNegFloat = 20.0
    #: Extra trainer time per trained group (streaming cost), on top of train_step_s.
    train_per_group_s: NonNegFloat = 0.0
    weight_sync_s: NonNegFloat = 2.0
    failure_rate: Annotated[StrictFloat, Field(ge=0, lt=1)] = 0.0
    #: Probability that a prompt's group comes back with all rewards equal (all
    #: right or all wrong), which ``grpo.dynamic_sampling``'s filter drops: it
    #: cost its generation and is replaced. Tied to the prompt, like its latency.
    filter_rate: Annotated[StrictFloat, Field(ge=0, lt=1)] = 0.0
    #: Tokens every completion generates per second of its group's latency (the
    #: token model of the time-based latency distributions; ``tokens`` latency
    #: has lengths of its own).
    tokens_per_s: PosFloat = 20.0
    #: Extra trainer time per trained completion token (streaming cost), on top of
    #: train_per_group_s.
    train_per_token_s: NonNegFloat = 0.0
    #: The fleet stands still while weights sync (as vLLM does: it pauses its
    #: running requests while it loads new weights); false: it keeps generating
    #: with the old weights meanwhile.
    pause_generation_during_sync: bool = False
    #: Seconds an engine takes to abort the groups in flight a sync made hopeless
    #: (one call per sync that aborts any), on the train pump's path.
    abort_s: NonNegFloat = 0.0
    #: ``per_group``: the real controller, one task per group; ``cohort``: the
    #: built-in policies replayed on a plain event queue, ~10x faster, for
    #: datacenter-sized workloads (asyncrl.sim.cohort says what it covers).
    mode: Literal["per_group", "cohort"] = "per_group"
    #: Later phases of the workload, by ascending ``at_step`` (docs/autopilot.md).
    phases: list[WorkloadPhase] = Field(default_factory=list)
    #: The fleet schedule: slot counts from given virtual times on, by ascending
    #: ``at_s`` (docs/fleet.md).
    fleet: list[FleetChange] = Field(default_factory=list)

    @model_validator(mode="after")
    def _phases_in_order(self) -> SimulateConfig:
        _schedule([p.at_step for p in self.phases], self.mode, "phases: at_step",
                  "phases need", "the cohort mode replays one latency model")
        if self.phases and self.generation_latency_s.distribution in ("tokens", "empirical"):
            raise ValueError("phases need a time-based simulate.generation_latency_s "
                             "(constant, lognormal or bimodal), got "
                             f"{self.generation_latency_s.distribution}")
        return self

    @model_validator(mode="after")
    def _fleet_in_order(self) -> SimulateConfig:
        _schedule([c.at_s for c in self.fleet], self.mode, "fleet: at_s",
                  "a fleet schedule needs", "the cohort mode has a fixed fleet")
        return self

    def slot_seconds(self, until: float) -> float:
        """Slot-seconds the schedule offers from 0 to ``until`` (what the
        generator utilisation divides by)."""
        total, since, slots = 0.0, 0.0, self.rollout_slots
        for change in self.fleet:
            if change.at_s >= until:
                break
            total += slots * (change.at_s - since)
            since, slots = change.at_s, change.rollout_slots
        return total + slots * max(until - since, 0.0)


def _schedule(at: list[float], mode: str, key: str, needs: str, why: str) -> None:
    """A schedule (``phases``, ``fleet``): changes in time order, per-group mode only."""
    if at != sorted(set(at)):
        raise ValueError(f"{key} must strictly increase, got {at}")
    if at and mode == "cohort":
        raise ValueError(f"{needs} mode: per_group ({why}); set simulate.mode: per_group")
