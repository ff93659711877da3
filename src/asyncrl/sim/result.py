"""What a simulated run reports, whichever mode ran it: :class:`SimResult`, its
columns (:data:`ROW_KEYS`) and the :class:`Bound` its efficiency is measured
against (:func:`asyncrl.sim.runner.physical_bound` computes it).

The per-group mode (:mod:`asyncrl.sim.runner`) and cohort mode
(:mod:`asyncrl.sim.cohort`) both build their result from here, so neither
imports the other's internals.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from asyncrl.config.sampler import CustomSamplerConfig
from asyncrl.sampling import WINDOW_FIELD, RetunableSampler
from asyncrl.sim.backends import SimEngine, SimTrainer

#: The columns of a result row, in table order (``asyncrl simulate --json`` prints exactly these).
ROW_KEYS = (
    "sampler",
    "steps",
    "virtual_time_s",
    "steps_per_hour",
    "efficiency",
    "trainer_idle_frac",
    "generator_util",
    "staleness_mean",
    "staleness_p95",
    "staleness_max",
    "token_staleness_mean",
    "token_staleness_p95",
    "token_staleness_max",
    "waste_frac",
    "masked_token_frac",
)


@dataclasses.dataclass(frozen=True)
class Bound:
    """The fastest possible step for a workload (see :func:`physical_bound`)."""

    trainer_step_s: float
    generation_step_s: float

    @property
    def step_s(self) -> float:
        return max(self.trainer_step_s, self.generation_step_s)

    @property
    def limited_by(self) -> str:
        return "trainer" if self.trainer_step_s >= self.generation_step_s else "generation"

    @property
    def steps_per_hour(self) -> float:
        return 3600.0 / self.step_s if self.step_s > 0 else math.inf

    def describe(self) -> str:
        return (
            f"physical bound: {self.step_s:.3g}s/step ({self.steps_per_hour:,.0f} steps/h), "
            f"{self.limited_by}-bound (trainer {self.trainer_step_s:.3g}s/step, "
            f"generation {self.generation_step_s:.3g}s/step)"
        )



@dataclasses.dataclass
class SimResult:
    """One simulated run: the row, plus what the plots and checks need."""

    sampler: str
    window: int | None
    steps: int
    virtual_time_s: float
    steps_per_hour: float
    efficiency: float
    trainer_idle_frac: float
    generator_util: float
    staleness_mean: float
    staleness_p95: int
    staleness_max: int
    #: Staleness of the trained *tokens* (``v - token version``, token-weighted).
    token_staleness_mean: float
    token_staleness_p95: int
    token_staleness_max: int
    waste_frac: float
    #: Trained tokens the loss masks leave out (``loss.max_token_staleness``,
    #: ``loss.truncated: mask``), as a fraction of all trained tokens.
    masked_token_frac: float
    bound: Bound
    ledger: dict[str, Any]
    stop_reason: str
    wall_s: float
    note: str = ""
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list, repr=False)
    staleness_hist: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)
    token_staleness_hist: dict[str, int] = dataclasses.field(default_factory=dict, repr=False)
    #: Trainer intervals from the controller's timeline plus the engine's slot
    #: occupancy, as dicts for :func:`asyncrl.metrics.plots.plot_timeline`.
    timeline: list[dict[str, Any]] = dataclasses.field(default_factory=list, repr=False)
    engine: SimEngine | None = dataclasses.field(default=None, repr=False)
    trainer: SimTrainer | None = dataclasses.field(default=None, repr=False)
    #: Re-tunes applied during the run (the autopilot's, Controller.retune's).
    retunes: list[dict[str, Any]] = dataclasses.field(default_factory=list, repr=False)
    #: The autopilot's decisions (``autopilot.jsonl``'s rows), empty when it is off.
    autopilot: list[dict[str, Any]] = dataclasses.field(default_factory=list, repr=False)
    #: The autopilot's profile at the end (``autopilot_profile.json``), None when it is off.
    profile: dict[str, Any] | None = dataclasses.field(default=None, repr=False)
    #: With ``simulate(retune_at=(k, setting))``: the settle point, the first step
    #: boundary after ``k`` at which every group dispatched before the switch had
    #: left the buffer (None: not within the run, or no switch).
    settled_at: int | None = None

    def autopilot_line(self) -> str:
        """One line on what the autopilot did ("" when it was off)."""
        if not self.autopilot:
            return ""
        changes = [(d["step"], d["setting"]) for d in self.autopilot
                   if d["setting"] != d["previous"] and d["action"] != "reuse"]
        final = self.autopilot[-1]["setting"]
        start = "".join(f"started from a profile at {_knobs(d['setting'])}; "
                        for d in self.autopilot if d["action"] == "reuse")
        moves = "; ".join(f"step {s}: {_knobs(k)}" for s, k in changes[:6])
        more = f"; ... {len(changes) - 6} more" if len(changes) > 6 else ""
        n = len(self.autopilot)
        return (f"autopilot ({self.autopilot[-1]['mode']}): {n} decision{'s' * (n != 1)}, "
                f"{start}{len(changes)} change{'s' * (len(changes) != 1)}"
                f"{': ' + moves + more if changes else ''}; "
                f"final {_knobs(final)}")

    @property
    def final_setting(self) -> dict[str, Any] | None:
        """The setting in force at the end (``max_inflight_prompts``, ``window``,
        ``max_buffered_rollouts``) when the run was re-tuned - by the autopilot,
        from a profile it reused, or ``Controller.retune`` - and None when it ran
        as configured."""
        return self.retunes[-1]["setting"] if self.retunes else None

    def window_text(self) -> str:
        """The table's window: the configured one, or ``configured->final`` when
        a re-tune left another window in force at the end."""
        configured = "-" if self.window is None else str(self.window)
        final = (self.final_setting or {}).get("window")
        return configured if final is None or final == self.window else f"{configured}->{final}"

    def row(self) -> dict[str, Any]:
        """The table row: exactly :data:`ROW_KEYS`, JSON-ready (NaN becomes None)."""
        out: dict[str, Any] = {}
        for key in ROW_KEYS:
            value = getattr(self, key)
            if isinstance(value, float) and not math.isfinite(value):
                value = None
            out[key] = value
        return out

    @property
    def step_time_s(self) -> float:
        return self.virtual_time_s / self.steps if self.steps else math.nan

    def timeline_until(self, steps: int = 20) -> float | None:
        """Virtual time at which step ``steps`` ended (None: the whole run)."""
        if len(self.records) <= steps:
            return None
        return float(self.records[steps - 1]["wall_time_s"])



def sampler_label(sampler_cfg: Any) -> str:
    if isinstance(sampler_cfg, CustomSamplerConfig):
        return sampler_cfg.target
    return str(sampler_cfg.name)


def sampler_window(sampler_cfg: Any) -> int | None:
    field = WINDOW_FIELD.get(getattr(sampler_cfg, "name", ""))
    return None if field is None else int(getattr(sampler_cfg, field))


def custom_window(sampler: object) -> tuple[int | None, str]:
    """A custom sampler's window for the table, read from the sampler itself (its
    config has no window field), and the note that says so."""
    if isinstance(sampler, RetunableSampler):
        return int(sampler.window), "window: the custom sampler's own (its window attribute)"
    return None, "window: not known (the custom sampler has no window attribute)"



def efficiency_of(bound: Bound, steps: int, elapsed: float, aborted: int,
                  note: str) -> tuple[float, str]:
    """The bound's step time over the achieved one, and ``note`` with why it is
    above 1 if it is."""
    step_time = elapsed / steps if steps else math.nan
    efficiency = bound.step_s / step_time if steps and step_time > 0 else math.nan
    if efficiency > 1.0 + 1e-9:
        # The fleet side of the bound assumes trained groups cost an average
        # latency each. A policy that aborts long groups part-way breaks that
        # (its trained groups skew short); otherwise the draws just came out
        # below their mean.
        why = ("slow groups were aborted (trained groups skew short)" if aborted
               else "the sampled latencies came out below their mean")
        note = "; ".join(x for x in (note, f"above the bound: {why}") if x)
    return efficiency, note


def percentile(hist: dict[str, int], q: float) -> int:
    """Nearest-rank percentile of an integer histogram (0 when empty)."""
    total = sum(hist.values())
    if not total:
        return 0
    rank = math.ceil(q * total)
    seen = 0
    for key in sorted(hist, key=int):
        seen += hist[key]
        if seen >= rank:
            return int(key)
    return max(int(k) for k in hist)


def _knobs(setting: dict[str, Any]) -> str:
    window = setting.get("window")
    return (f"in-flight {setting['max_inflight_prompts']}"
            + (f" window {window}" if window is not None else "")
            + f" capacity {setting['max_buffered_rollouts']}")
