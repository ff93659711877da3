"""Small configs for the simulator tests (a few groups per step, a few dozen steps)."""

from __future__ import annotations

from typing import Any

from asyncrl.config import RunConfig, config_from_dict
from asyncrl.sampling import WINDOW_FIELD


def sampler(name: str, window: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, WINDOW_FIELD[name]: window, **extra}


def sim_config(
    *,
    policy: str = "in_order",
    window: int = 1,
    n: int = 8,
    steps: int = 30,
    slots: int | None = None,
    latency: dict[str, Any] | float = 10.0,
    train_step_s: float = 3.0,
    weight_sync_s: float = 1.0,
    train_per_group_s: float = 0.0,
    failure_rate: float = 0.0,
    filter_rate: float = 0.0,
    dynamic_sampling: dict[str, Any] | None = None,
    capacity: int | None = None,
    inflight: int | None = None,
    min_chunk: int | None = None,
    seed: int = 0,
    deterministic: bool = False,
    phases: list[dict[str, Any]] | None = None,
    **async_rl: Any,
) -> RunConfig:
    """A config whose buffer and in-flight bound fit ``window + 1`` steps of groups."""
    if not isinstance(latency, dict):
        latency = {"distribution": "constant", "value": float(latency)}
    fit = n * (window + 1)
    return config_from_dict({
        "seed": seed,
        "deterministic": deterministic,
        "grpo": {"num_prompts_per_step": n, "num_generations_per_prompt": 2,
                 "dynamic_sampling": dynamic_sampling or {}},
        "async_rl": {
            "sampler": sampler(policy, window),
            "max_buffered_rollouts": capacity if capacity is not None else fit,
            "max_inflight_prompts": inflight if inflight is not None else fit,
            "min_groups_for_streaming_train": min_chunk if min_chunk is not None else n,
            **async_rl,
        },
        "simulate": {
            "steps": steps,
            "rollout_slots": slots if slots is not None else n,
            "generation_latency_s": latency,
            "train_step_s": train_step_s,
            "weight_sync_s": weight_sync_s,
            "train_per_group_s": train_per_group_s,
            "failure_rate": failure_rate,
            "filter_rate": filter_rate,
            "phases": phases or [],
        },
    })


def plan_autopilot(p95: float, **extra: Any) -> dict[str, Any]:
    """``async_rl.autopilot`` of mode plan for the planner's tests: a plan every
    2 steps after 2, each candidate measured over 4 steps, staleness p95 <= ``p95``."""
    return {"enabled": True, "mode": "plan", "replan_every_steps": 2, "warmup_steps": 2,
            "plan_steps": 4, "bounds": {"max_staleness_p95": p95}, **extra}


def step_ends(result) -> list[float]:
    """Virtual time at the end of each step (after its weight sync)."""
    return [float(r["wall_time_s"]) for r in result.records]


def periods(result) -> list[float]:
    ends = step_ends(result)
    return [b - a for a, b in zip([0.0, *ends], ends)]
