"""The stall watchdog: ``warn`` keeps the run going, ``abort`` stops it gracefully
(checkpoint, summary, resume command), and simulation never has one."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from asyncrl.config import config_from_dict
from asyncrl.errors import RolloutStall
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.controller.test_dispatch_states import HangingTrainer
from tests.fakes import FakeEngine, FakeTask, FakeTrainer

IN_ORDER = {"name": "in_order", "max_lookahead_versions": 0}


def watchdog(action: str, timeout: float = 30.0, interval: float = 10.0) -> dict:
    return {"stall_timeout_s": timeout, "interval_s": interval, "stall_action": action}


def test_warn_names_the_stalled_side_every_interval_and_the_run_completes(caplog) -> None:
    # Prompt 5's generation takes 100 s, then the engine answers again.
    engine = FakeEngine(lambda r: 100.0 if r.prompt.prompt_id == 5 else 1.0)
    ctl = make_controller(IN_ORDER, engines=[engine], steps=4,
                          stall_watchdog=watchdog("warn"))
    with caplog.at_level(logging.WARNING, "asyncrl.controller"):
        result = run_virtual(ctl.run())
    assert result.stop_reason == "max_num_steps" and result.summary["ledger"]["balanced"]
    lines = [r.getMessage() for r in caplog.records if "stall_action: warn" in r.getMessage()]
    # Stalled from t~2 to t~101: one line at 30 s, then one per 10 s interval.
    assert 6 <= len(lines) <= 8, lines
    assert all("rollout side stalled" in line and "step 1" in line for line in lines)
    assert result.summary["failures"]["stall_warnings"] == len(lines)


def test_abort_on_the_trainer_side_fails_the_run() -> None:
    ctl = make_controller(IN_ORDER, trainer=HangingTrainer(2), steps=5,
                          stall_watchdog=watchdog("abort"))
    with pytest.raises(RolloutStall, match="trainer side stalled: finish_step of step 2"):
        run_virtual(ctl.run())


class BlockingTrainer(FakeTrainer):
    """At step ``at``, blocks the event loop for ``seconds`` in train_chunk, as a
    trainer calling blocking code inside its async method would (in virtual
    time: the clock moves while the callback runs, and nothing else can)."""

    def __init__(self, at: int, seconds: float) -> None:
        super().__init__(step_time=2.0)
        self.at, self.seconds = at, seconds

    async def train_chunk(self, rollouts, *, step: int):
        if step == self.at:
            self.at = -1  # once
            asyncio.get_running_loop()._advance(self.seconds)  # JumpClockLoop's clock
        return await super().train_chunk(rollouts, step=step)


@pytest.mark.parametrize("action", ["warn", "abort"])
def test_a_blocked_event_loop_is_named_not_blamed_on_a_side(action: str, caplog) -> None:
    # When the loop comes back the trainer is mid-step: the old message blamed
    # "the trainer side ... running for 0s", and abort raised instead of stopping.
    ctl = make_controller(IN_ORDER, trainer=BlockingTrainer(2, 100.0), steps=4,
                          stall_watchdog=watchdog(action))
    with caplog.at_level(logging.WARNING, "asyncrl.controller"):
        result = run_virtual(ctl.run(), loop="jump")
    says = "the event loop was blocked - the watchdog's own timer fired"
    if action == "warn":
        lines = [r.getMessage() for r in caplog.records if "stall_action: warn" in r.getMessage()]
        assert len(lines) == 1 and says in lines[0], lines
        assert result.stop_reason == "max_num_steps"
    else:  # the loop runs again: a graceful stop with a checkpoint, not a RolloutStall
        assert result.stop_reason == "stalled" and says in result.summary["stop_message"]
    assert result.summary["ledger"]["balanced"]


class HangingEngine(FakeEngine):
    """Never answers for one prompt (until released)."""

    def __init__(self, hang_prompt: int) -> None:
        super().__init__(0.0)
        self.hang_prompt = hang_prompt
        self.release: asyncio.Event | None = None

    async def generate(self, request):
        if request.prompt.prompt_id == self.hang_prompt:
            self.release = self.release or asyncio.Event()
            await self.release.wait()
        return await super().generate(request)


@pytest.mark.e2e
def test_abort_stops_gracefully_with_a_checkpoint_and_the_run_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.checkpoint import load_latest
    from asyncrl.controller import partials
    from asyncrl.run.train import train

    # The hung engine ignores the stop's abort as well: the stop waits out its
    # grace for the tokens (30 s; 1 s here, in real time), then cancels the group.
    # The run is in real time (train() runs its own loop), so the watchdog's
    # timeout is one only the hang reaches: steps 0 and 1 commit within
    # milliseconds, but a loaded machine can pause this process for longer.
    monkeypatch.setattr(partials, "STOP_GRACE_S", 1.0)

    cfg = config_from_dict({
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "max_num_steps": 5},
        "async_rl": {"sampler": IN_ORDER, "max_buffered_rollouts": 2,
                     "min_groups_for_streaming_train": 2, "max_inflight_prompts": 2,
                     "stall_watchdog": watchdog("abort", timeout=3.0, interval=0.5)},
        "logging": {"progress": "never", "tensorboard": False, "plots": False},
        "checkpoint": {"every_steps": 1},
    })
    task = FakeTask()
    summary = train(cfg, tmp_path / "run", task=task,
                    backends=([HangingEngine(hang_prompt=5)], FakeTrainer(step_time=0.0)))
    assert summary["stop_reason"] == "stalled" and summary["steps"] == 2
    assert "rollout side stalled" in summary["stop_message"]
    assert summary["resume_command"] == f"asyncrl train --resume {tmp_path / 'run'}"
    assert summary["ledger"]["balanced"] and summary["ledger"]["pending"] >= 1
    ckpt = load_latest(tmp_path / "run")
    assert ckpt.step == 2  # the state the stall stopped in, prompt 5 still in flight
    assert any(e["prompt"]["prompt_id"] == 5 for e in ckpt.controller_state["dispatch"]["inflight"])
    # The engine answers again: the resumed run generates prompt 5 and finishes.
    resumed = train(cfg, resume=ckpt, task=task,
                    backends=([FakeEngine(0.0)], FakeTrainer(step_time=0.0)))
    assert resumed["stop_reason"] == "max_num_steps" and resumed["steps"] == 5
    assert resumed["ledger"]["balanced"] and resumed["ledger"]["trained"] == 10


def test_simulate_never_stops_on_the_watchdog(tmp_path: Path) -> None:
    # Issue 18, item 12: a heavy-tailed latency (lognormal, sigma 2) in virtual time
    # is not a stall, however small the watchdog's timeout.
    from asyncrl.sim.runner import simulate

    cfg = config_from_dict({
        "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": 2},
        "async_rl": {"sampler": {"name": "in_order", "max_lookahead_versions": 1},
                     "max_buffered_rollouts": 8, "min_groups_for_streaming_train": 2,
                     "max_inflight_prompts": 8,
                     "stall_watchdog": watchdog("abort", timeout=2.0, interval=1.0)},
        "simulate": {"steps": 30, "rollout_slots": 4, "train_step_s": 1.0,
                     "generation_latency_s": {"distribution": "lognormal", "median": 5.0,
                                              "sigma": 2.0}},
    })
    result = simulate(cfg)
    assert result.steps == 30 and result.stop_reason == "max_num_steps"
    assert result.ledger["balanced"]
