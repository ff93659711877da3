"""What ``asyncrl simulate --calibrate`` cannot vouch for, said in its output.

A fit always produces numbers; these checks say when some of them carry no
information or will mislead (docs/simulate.md, section 8):

* whether generation pauses during a weight sync, when too little sync time
  falls inside generations to tell (the engine's known behaviour is used), or
  when the fitted stall coefficient is far outside its meaningful 0-1;
* the latency model, when it explains none of the latencies' variation or the
  completions' lengths never varied (its per-token terms cannot be fitted);
* the whole fit, when the run's engine and trainer shared one device: their
  contention is in every fitted cost and depends on how the setup overlaps them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.engines.specs import engine_spec

#: A stall coefficient means "seconds of generation lost per second of sync": 0
#: (generation goes on) or about 1 (it pauses). Far above 1 it is the fit
#: spending a free column on noise, not a measurement.
MAX_PLAUSIBLE_STALL = 1.5
#: Below this fraction of the generation time spent in syncs, the fit cannot tell
#: whether the engine pauses during them; the engine's known behaviour decides.
MIN_STALL = 0.05
#: At or below this R^2 the latency model explains nothing of the variation.
MIN_LATENCY_R2 = 0.05
SECTION = "docs/simulate.md, section 8"


def pause_text(engine: str, pauses: bool, facts: dict[str, Any]) -> str:
    """Whether generation pauses during a sync, and on what that rests."""
    verdict = "generation pauses" if pauses else "generation goes on"
    if facts["pause_source"] == "fit":
        return f"{verdict}: fitted, stall coefficient {facts['sync_stall_coefficient']:.3g}"
    return f"{verdict}: the {engine} engine's known behaviour, the fit cannot tell"


def calibration_warnings(cfg: RunConfig, pauses: bool, facts: dict[str, Any],
                         longest: Sequence[int]) -> list[str]:
    """One line for each part of the fit the run could not inform."""
    out = []
    theta, engine = facts["sync_stall_coefficient"], cfg.policy.engine
    setting = str(pauses).lower()
    unreliable = (f"the fitted stall coefficient {theta:.4g} is far outside 0 to 1 (0: "
                  "generation goes on during a sync, 1: it pauses): an unreliable estimate")
    if facts["pause_source"] != "fit":
        out.append(
            "pause_generation_during_sync: the fit cannot tell whether generation pauses while "
            f"weights load: only {100 * facts['sync_in_generation_frac']:.1f}% of the "
            f"generation time fell inside a sync (it needs {MIN_STALL:.0%}); it is set to "
            f"{setting}, what the {engine} engine is known to do"
            + (f"; {unreliable}, not used" if theta > MAX_PLAUSIBLE_STALL else ""))
    elif theta > MAX_PLAUSIBLE_STALL:
        out.append(f"pause_generation_during_sync: {unreliable}; check the setting ({setting}) "
                   f"against what the {engine} engine does")
    out.extend(_latency_warnings(cfg, facts, longest))
    shared = shared_device(cfg)
    if shared:
        out.append(
            f"the run's engine and trainer shared {shared}: the fitted latencies and costs "
            "include their contention, which depends on how generation and training overlap, "
            "so predictions of other overlap settings (sampler, window, in-flight bound) will "
            "be off (by up to a third on a 2-core machine); calibrate on a run with "
            f"the engine on a device of its own (policy.engine_device). See {SECTION}")
    return out


def _latency_warnings(cfg: RunConfig, facts: dict[str, Any],
                      longest: Sequence[int]) -> list[str]:
    lengths = ""
    if len(set(longest)) <= 1:
        n, cap = (longest[0] if longest else 0), cfg.policy.generation.max_new_tokens
        lengths = (f"every group's longest completion had {n} tokens"
                   + (f" (policy.generation.max_new_tokens={cap})" if n == cap else ""))
    vary = ("calibrate on a run whose completions vary in length (a larger "
            "policy.generation.max_new_tokens, a task with longer answers)")
    if facts["latency_r2"] > MIN_LATENCY_R2:
        return [f"generation_latency_s: {lengths}, so the per-token cost cannot be told from "
                f"the base and longer completions are not predicted; {vary}"] if lengths else []
    why = "; ".join(x for x in (
        f"its fit explains none of the latencies' variation (R^2 {facts['latency_r2']:.2f})",
        lengths) if x)
    return [f"generation_latency_s: the latency model carries no information: {why}. The "
            f"simulation draws every generation near the run's mean "
            f"({facts['latency_mean_s']:.3g}s) whatever the lengths or the load, so it cannot "
            f"predict a setup that changes them; {vary} and whose load varies (a "
            "max_inflight_prompts above what one step needs)"]


def shared_device(cfg: RunConfig) -> str | None:
    """The device the run's engine and trainer both ran on, as words (None: they
    did not share one, or the run files cannot tell). Read from the config the
    run recorded: an engine that generates on the model it is given (local,
    custom) runs on ``policy.engine_device`` or else ``policy.device``, the
    trainer on ``policy.device``; vLLM picks its own device."""
    policy = cfg.policy
    if not engine_spec(policy).uses_given_model:
        return None
    device = _normal(policy.engine_device or policy.device)
    if device != _normal(policy.device):
        return None
    if cfg.cluster.backend == "local":
        return "the CPU" if device == "cpu" else f"one device ({device})"
    # On Ray each worker sees only the GPUs it was given: a shared GPU cannot be told.
    return "the CPU (if Ray placed them on one machine)" if device == "cpu" else None


def _normal(device: str) -> str:
    return "cuda:0" if device == "cuda" else device
