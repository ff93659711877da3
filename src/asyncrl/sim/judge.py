"""The planner's verdicts on its predictions (:mod:`asyncrl.sim.planner`):
whether a candidate keeps the bounds (its settled facts and, planned from the
run's state, its switch: :func:`judged`), how far it breaks them, the model's
bias the run measured on the setting in force, and the pick."""

from __future__ import annotations

import dataclasses
from typing import Any

from asyncrl.controller.autoplan import Prediction

#: Predicted throughputs this close (relative) are a tie (see :func:`pick`).
TIE = 0.005


def keeps(p95: float, waste: float, bounds: dict[str, Any]) -> bool:
    """Whether a staleness p95 and a waste keep the bounds."""
    return not ((bounds.get("max_staleness_p95") is not None
                 and p95 > bounds["max_staleness_p95"])
                or (bounds.get("max_waste_frac") is not None
                    and waste > bounds["max_waste_frac"]))


def judged(p: Prediction, bounds: dict[str, Any], stay: Prediction | None = None) -> bool:
    """Whether ``p`` keeps the bounds: its settled facts do and, planned from
    the run's state, so do the facts of its whole horizon from the switch on
    (``transition_p95``, ``transition_waste``) - or those are no worse than
    ``stay``'s (the setting in force planned from the same state, with the
    same draws): the groups the run already admitted are trained as stale
    whatever the setting, and that staleness is no switch's doing; a switch
    that adds to it past a bound is refused."""
    if excess(p, bounds) > 0:
        return False
    if p.transition_waste is None or p.transition_p95 is None:
        return True  # no run state: the settled facts only (the prefix's rule)
    moved = (("max_staleness_p95", p.transition_p95, stay and stay.transition_p95),
             ("max_waste_frac", p.transition_waste, stay and stay.transition_waste))
    for key, value, staying in moved:
        bound = bounds.get(key)
        if bound is not None and value > max(bound, staying or 0.0):
            return False
    return True


def switch_judged(preds: list[Prediction], stay: Prediction | None,
                  bounds: dict[str, Any]) -> list[Prediction]:
    """Every prediction judged by :func:`judged` against ``stay`` (the setting
    in force: it keeps the bounds when its settled facts do)."""
    return [dataclasses.replace(p, keeps_bounds=judged(p, bounds, stay)) for p in preds]


def excess(c: Prediction, bounds: dict[str, Any]) -> float:
    """How far ``c`` is predicted to break the bounds (0: it keeps them), each
    bound's excess relative to the bound."""
    out = 0.0
    for key, value in (("max_staleness_p95", c.staleness_p95), ("max_waste_frac", c.waste_frac)):
        bound = bounds.get(key)
        if bound is not None and value > bound:
            out += (value - bound) / max(bound, 1e-3)
    return out


def _load(setting: dict[str, Any]) -> tuple[int, int, int]:
    return (setting["window"] or 0, setting["max_inflight_prompts"],
            setting["max_buffered_rollouts"])


def pick(candidates: list[Prediction], objective: str, min_gain: float,
         bounds: dict[str, Any]) -> Prediction | None:
    """The best candidate that keeps the bounds; when none does, the one that
    breaks them least (of equals, the most cautious). Throughputs within :data:`TIE`
    of the top are a tie (a trainer-bound pipeline has many settings at its
    bound): the least waste, then staleness p95, then the first listed (the
    setting in force is first) wins it, so that the same setting keeps winning
    plan after plan and the hysteresis can tell a trend from noise."""
    kept = [c for c in candidates if c.keeps_bounds]
    if not kept:  # the nearest to the bounds: a move that breaks them less is progress;
        # among equals the most cautious one (a model that cannot tell them apart on
        # a bound the run broke must not hold: fewer groups in flight, a narrower
        # window, a smaller buffer is what keeps staleness and waste down).
        return min(candidates, key=lambda c: (round(excess(c, bounds), 6), _load(c.setting)),
                   default=None)
    top = max(c.throughput for c in kept)
    band = min_gain if objective == "staleness" else TIE
    near = [c for c in kept if c.throughput >= (1 - band) * top]
    if objective == "staleness":
        return min(near, key=lambda c: (c.staleness_p95, c.waste_frac, -c.throughput))
    return min(near, key=lambda c: (round(c.waste_frac, 3), c.staleness_p95))


def measured_bias(current: Prediction, measured: dict[str, Any]) -> dict[str, float]:
    """The model's bias on the setting in force: the staleness p95 and waste the
    run measured above what the model predicts for the same setting (a
    short simulation misses part of a heavy tail, and the
    window's latencies miss the generations still running). Only a bias upward
    counts: the bounds are kept conservatively."""
    return {"staleness_p95": max(0.0, float(measured["staleness_p95"]) - current.staleness_p95),
            "waste_frac": max(0.0, float(measured["waste_frac"]) - current.waste_frac)}


def biased(p: Prediction, bias: dict[str, float], bounds: dict[str, Any]) -> Prediction:
    """``p`` with ``bias`` (:func:`measured_bias`) added, its bound check redone."""
    if not bias["staleness_p95"] and not bias["waste_frac"]:
        return p
    fixed = dataclasses.replace(p, staleness_p95=p.staleness_p95 + bias["staleness_p95"],
                                waste_frac=p.waste_frac + bias["waste_frac"])
    if p.transition_waste is not None and p.transition_p95 is not None:
        # (the whole horizon's facts are the same model's: the same bias)
        fixed = dataclasses.replace(fixed, transition_p95=p.transition_p95 + bias["staleness_p95"],
                                    transition_waste=p.transition_waste + bias["waste_frac"])
    return dataclasses.replace(fixed, keeps_bounds=judged(fixed, bounds))


def corrected(preds: list[Prediction], current: Prediction, measured: dict[str, Any],
              bounds: dict[str, Any], model: dict[str, Any]) -> list[Prediction]:
    """Every prediction with the model's bias on the setting in force added
    (:func:`measured_bias`, recorded in ``model``)."""
    bias = model["bias"] = measured_bias(current, measured)
    return [biased(p, bias, bounds) for p in preds]


__all__ = [
    "TIE",
    "biased",
    "corrected",
    "excess",
    "judged",
    "keeps",
    "measured_bias",
    "pick",
    "switch_judged",
]
