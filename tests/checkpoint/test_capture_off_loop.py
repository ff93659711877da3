"""Capturing the checkpoint of a model of >= 50 M parameters does not stall the
event loop.

The trainer's state (a copy of the weights and of AdamW's two moments: ~600 MB
here) is captured in a worker thread (and written in another, as it always
was); the loop goes on serving the rollout side. How long the loop stalls is a
measurement, so benchmarks/bench_failures.py reports it, writing included, by
model size; the test checks the mechanism: the loop serves while the copy is in
progress.
"""

from __future__ import annotations

import asyncio
import threading
import types
from pathlib import Path
from typing import Any

import torch

from asyncrl.checkpoint.hook import CheckpointHook
from asyncrl.config import CheckpointConfig
from asyncrl.tasks.tokenizer import CharTokenizer
from asyncrl.trainers.capabilities import TrainerCapabilities
from asyncrl.trainers.grpo import GRPOTrainer


class _Layers(torch.nn.Sequential):
    """Square layers; the last one stands for the output layer the trainer looks up."""

    def get_output_embeddings(self) -> torch.nn.Module:
        return self[-1]


def big_trainer(params: int = 50_000_000) -> GRPOTrainer:
    """A GRPOTrainer over ``params`` parameters with its optimizer state filled.
    (The weights stay uninitialised: only their size matters here.)"""
    width = 4096
    layers = -(-params // (width * width))
    model = _Layers(*(torch.nn.Linear(width, width, bias=False, device="meta")
                      for _ in range(layers))).to_empty(device="cpu")
    trainer = GRPOTrainer(model, CharTokenizer())
    for p in trainer.params:  # AdamW's state after a step, without computing one
        trainer.optimizer.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p),
                                      "exp_avg_sq": torch.zeros_like(p)}
    return trainer


def fake_controller(trainer: GRPOTrainer) -> types.SimpleNamespace:
    return types.SimpleNamespace(trainer=trainer, engines=[object()], deterministic=False,
                                 trainer_capabilities=TrainerCapabilities.of(trainer),
                                 state_dict=lambda: {"trainer_version": 1},
                                 version=types.SimpleNamespace(value=1))


def test_checkpoint_of_a_50m_parameter_model_keeps_the_loop_serving(tmp_path: Path) -> None:
    """While the trainer's state is being copied, the loop runs a callback the copy
    schedules on it, and the copy waits for that callback. On the loop thread the
    copy would wait for itself: the callback could not run until the copy ended.
    (How long the loop stalls is a measurement: benchmarks/bench_failures.py.)"""
    trainer = big_trainer()
    assert sum(p.numel() for p in trainer.model.parameters()) >= 50_000_000
    hook = CheckpointHook(tmp_path, CheckpointConfig(), config_yaml="seed: 0\n")
    controller = fake_controller(trainer)
    copy_state = trainer.state_dict
    served_during_the_copy: list[bool] = []

    def state_dict_that_needs_the_loop() -> dict:
        answered = threading.Event()
        loop.call_soon_threadsafe(answered.set)
        # The bound only ends a failure (the loop blocked by this very copy).
        served_during_the_copy.append(answered.wait(timeout=20))
        return copy_state()

    trainer.state_dict = state_dict_that_needs_the_loop  # type: ignore[method-assign]

    async def main() -> Any:
        nonlocal loop
        loop = asyncio.get_running_loop()
        return await hook.capture(controller, 1)

    loop: asyncio.AbstractEventLoop | None = None
    captured = asyncio.run(main())
    assert served_during_the_copy == [True]
    state = captured.trainer_state
    assert len(state["optimizer"]["state"]) == len(trainer.params)  # the whole of it
    assert sum(t.numel() for t in state["model"].values()) >= 50_000_000
