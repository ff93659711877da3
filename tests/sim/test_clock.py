"""The jump loop's lean pass (JumpClockLoop._run_once) against asyncio's own:
the same simulation, to the last float, with and without it."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import load_config
from asyncrl.sim import clock
from asyncrl.sim.clock import JumpClockLoop
from asyncrl.sim.result import SimResult
from asyncrl.sim.runner import simulate
from tests.vtime import advance

from .helpers import sim_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"
BIMODAL = {"distribution": "bimodal", "fast": {"median": 2.0, "sigma": 0.3},
           "slow": {"median": 30.0, "sigma": 0.3}, "slow_fraction": 0.15}


def _facts(result: SimResult) -> dict[str, Any]:
    """Everything a simulation decides; not the wall time it took."""
    engine = result.engine
    assert engine is not None
    return {
        **{f.name: getattr(result, f.name) for f in dataclasses.fields(result)
           if f.name not in ("wall_s", "engine", "trainer", "bound", "profile")},
        "intervals": engine.intervals, "attempts": engine.attempts, "aborts": engine.aborts,
        "failures": engine.failures, "busy_slot_s": engine.busy_slot_s, "syncs": engine.syncs,
    }


def _both_ways(monkeypatch: pytest.MonkeyPatch, run: Any) -> tuple[Any, Any]:
    lean = run()
    with monkeypatch.context() as m:
        m.setattr(clock, "_LEAN_HANDLES", False)
        assert not JumpClockLoop()._lean
        plain = run()
    return lean, plain


def test_the_lean_pass_is_taken_on_this_python() -> None:
    # Otherwise the comparisons below compare asyncio's pass with itself.
    loop = JumpClockLoop()
    try:
        assert loop._lean
    finally:
        loop.close()


@pytest.mark.parametrize("workload", ["balanced", "generation_bound", "training_bound",
                                      "long_tail"])
def test_an_example_workload_simulates_the_same_with_asyncios_pass(
        workload: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = EXAMPLES / f"{workload}.yaml"
    cfg = load_config(path)
    lean, plain = _both_ways(monkeypatch, lambda: _facts(
        simulate(cfg, steps=25, base_dir=path.parent)))
    assert lean == plain


@pytest.mark.parametrize("latency", [BIMODAL, 10.0], ids=["bimodal", "constant"])
@pytest.mark.parametrize("policy", ["windowed", "in_order"])
def test_failures_retries_aborts_and_ties_simulate_the_same(
        policy: str, latency: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Cancelled timers (aborts, retry back-offs: the pass drops them from the
    # heap's head) and, with constant latencies, timers due at the very instant
    # other callbacks run (the pass must interleave them as asyncio does).
    cfg = sim_config(policy=policy, window=1, n=6, slots=4, latency=latency, inflight=10,
                     capacity=14, min_chunk=2, failure_rate=0.2,
                     rollout_failure={"max_consecutive_dropped_prompts": 100,
                                      "on_dropped_prompt": "replace",
                                      "max_replacement_attempts": 100})
    lean, plain = _both_ways(monkeypatch, lambda: _facts(simulate(cfg, steps=20)))
    assert lean["attempts"] > lean["ledger"]["dispatched"]  # retries happened
    assert lean == plain


@pytest.mark.parametrize("lean", [True, False])
def test_a_callback_that_raises_goes_to_the_exception_handler(
        lean: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clock, "_LEAN_HANDLES", lean)
    loop = JumpClockLoop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))

    def boom() -> None:
        raise ValueError("from a callback")

    async def main() -> float:
        loop.call_soon(boom)
        loop.call_later(2.0, boom)
        await advance(3.0)  # the loop goes on after each
        return loop.time()

    try:
        assert loop._lean is lean
        assert loop.run_until_complete(main()) == 3.0
    finally:
        loop.close()
    assert [type(c["exception"]) for c in reported] == [ValueError, ValueError]
    assert all("Exception in callback" in c["message"] and "boom" in c["message"]
               for c in reported)
    assert all(isinstance(c["handle"], asyncio.Handle) for c in reported)
