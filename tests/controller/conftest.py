from __future__ import annotations

from typing import Any

import pytest

from asyncrl.config import AsyncRLConfig, GRPOConfig
from asyncrl.controller import Controller, MemoryHistory
from tests.fakes import FakeEngine, FakeTask, FakeTrainer, InlineScorer

#: rollout_failure settings that absorb every failure: a group out of attempts is
#: replaced by a fresh prompt with its stamp (tests about other things use it).
FORGIVING = {
    "max_infra_attempts_per_prompt": 3,
    "max_data_attempts_per_prompt": 3,
    "backoff_base_s": 0.5,
    "max_skipped_prompts": 10**9,
    "max_consecutive_dropped_prompts": 10**9,
    "on_dropped_prompt": "replace",
    "max_replacement_attempts": 10**9,
}


def make_controller(
    sampler: dict[str, Any],
    *,
    engines: list[FakeEngine] | None = None,
    trainer: FakeTrainer | None = None,
    task: FakeTask | None = None,
    steps: int = 30,
    per_step: int = 4,
    capacity: int = 12,
    min_chunk: int = 2,
    inflight: int = 8,
    scorer: InlineScorer | None = None,
    deterministic: bool = False,
    history: MemoryHistory | None = None,
    evaluator: Any = None,
    buffer: Any = None,
    sampler_instance: Any = None,
    prompts: Any = None,
    dynamic_sampling: dict[str, Any] | None = None,
    planner: Any = None,
    **async_kw: Any,
) -> Controller:
    task = task or FakeTask()
    return Controller(
        task=task,
        engines=engines or [FakeEngine()],
        trainer=trainer or FakeTrainer(),
        grpo=GRPOConfig(num_prompts_per_step=per_step, num_generations_per_prompt=2,
                        max_num_steps=steps, dynamic_sampling=dynamic_sampling or {}),
        async_rl=AsyncRLConfig(sampler=sampler, max_buffered_rollouts=capacity,
                               min_groups_for_streaming_train=min_chunk,
                               max_inflight_prompts=inflight, **async_kw),
        deterministic=deterministic,
        scorer=scorer or InlineScorer(task),
        ledger_history=history if history is not None else MemoryHistory(),
        evaluator=evaluator,
        buffer=buffer,
        sampler=sampler_instance,
        prompts=prompts,
        planner=planner,
    )


@pytest.fixture
def controller_factory():
    return make_controller
