"""A step whose optimizer step the trainer skipped (a non-finite gradient) trained
nothing: the run says so (a warning naming the likely cause, once per cause), the
summary counts such steps, and a run that skipped every step says that at the end."""

from __future__ import annotations

import logging
import math

import pytest

from asyncrl.cli.train import print_summary
from asyncrl.sim.clock import run_virtual
from asyncrl.types import Completion, GenerationRequest, GroupResult
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTrainer

IN_ORDER = {"name": "in_order"}


class SkippingTrainer(FakeTrainer):
    """Reports a skipped optimizer step (as GRPOTrainer does for a NaN gradient)
    from ``from_step`` on."""

    def __init__(self, from_step: int = 0) -> None:
        super().__init__()
        self.from_step = from_step

    async def finish_step(self, *, step: int) -> dict[str, float]:
        metrics = await super().finish_step(step=step)
        if step >= self.from_step:
            metrics.update(grad_norm=math.nan, skipped_nonfinite_step=1.0)
        return metrics


class NanEngine(FakeEngine):
    """Returns NaN behavior log-probs, as the trial's NanLogprobs engine did."""

    async def generate(self, request: GenerationRequest) -> GroupResult:
        r = await super().generate(request)
        cs = [Completion(c.token_ids, [math.nan] * len(c.token_ids), c.versions,
                         c.finish_reason, c.text) for c in r.completions]
        return GroupResult(r.group_id, r.prompt_ids, cs, r.start_weight)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_nan_logprobs_skip_every_step_and_the_run_says_so(caplog, capsys) -> None:
    ctl = make_controller(IN_ORDER, engines=[NanEngine()], trainer=SkippingTrainer(), steps=4)
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        result = run_virtual(ctl.run())
    assert result.summary["skipped_nonfinite_steps"] == 4
    lines = _warnings(caplog)
    first = [w for w in lines if w.startswith("step 0 trained nothing")]
    assert len(first) == 1 and "non-finite (NaN or inf) log-probs from the engine" in first[0]
    assert "fix the engine's logprobs" in first[0]
    # Deduplicated: one full line, then per-step counts.
    assert not any(w.startswith("step 1 trained nothing") for w in lines)
    assert any("the same failure hit 1 more step(s) too (optimizer step skipped; steps 1)"
               in w for w in lines)
    assert any(w.startswith("every step of this run (4) skipped its optimizer step")
               for w in lines)
    print_summary(_console(), {**result.summary, "run_dir": "r", "target_reward": None})
    out = capsys.readouterr().out
    assert "all 4 steps skipped their optimizer step: the run trained NOTHING" in out


def test_a_skip_with_finite_inputs_blames_the_model_and_some_skips_are_not_all(caplog,
                                                                                capsys) -> None:
    ctl = make_controller(IN_ORDER, trainer=SkippingTrainer(from_step=2), steps=4)
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        result = run_virtual(ctl.run())
    assert result.summary["skipped_nonfinite_steps"] == 2
    lines = _warnings(caplog)
    assert any(w.startswith("step 2 trained nothing") and "lower policy.optimizer.lr" in w
               for w in lines)
    assert not any(w.startswith("every step") for w in lines)
    print_summary(_console(), {**result.summary, "run_dir": "r", "target_reward": None})
    assert "2 of 4 steps skipped their optimizer step" in capsys.readouterr().out


def test_a_run_without_skips_says_nothing(caplog, capsys) -> None:
    ctl = make_controller(IN_ORDER, steps=3)
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        result = run_virtual(ctl.run())
    assert result.summary["skipped_nonfinite_steps"] == 0
    assert not any("trained nothing" in w for w in _warnings(caplog))
    print_summary(_console(), {**result.summary, "run_dir": "r", "target_reward": None})
    assert "skipped" not in capsys.readouterr().out


def _console():
    from rich.console import Console

    return Console(width=200)
