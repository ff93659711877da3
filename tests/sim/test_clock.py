"""The jump loop's lean pass (JumpClockLoop._run_once) against asyncio's own:
the same simulation, to the last float, with and without it."""

from __future__ import annotations

import asyncio
import contextlib
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


def _on_a_loop(lean: bool, monkeypatch: pytest.MonkeyPatch, scenario: Any,
               start: float = 0.0) -> tuple[Any, list[tuple[Any, ...]]]:
    """Run ``scenario(loop, log)`` on a jump loop with the lean pass on or off;
    its result and the log it wrote."""
    monkeypatch.setattr(clock, "_LEAN_HANDLES", lean)
    loop = JumpClockLoop(start)
    log: list[tuple[Any, ...]] = []
    try:
        assert loop._lean is lean
        result = loop.run_until_complete(scenario(loop, log))
    finally:
        loop.close()
    return result, log


def test_a_callback_that_raises_is_reported_as_asyncio_reports_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> None:
        raise ValueError("from a callback")

    async def scenario(loop: JumpClockLoop, log: list[tuple[Any, ...]]) -> float:
        loop.set_exception_handler(lambda _loop, context: log.append(
            (context["message"], type(context["exception"]), type(context["handle"]))))
        loop.call_soon(boom)
        loop.call_later(2.0, boom)
        await advance(3.0)  # the loop goes on after each
        return loop.time()

    lean, plain = (_on_a_loop(flag, monkeypatch, scenario) for flag in (True, False))
    assert lean == plain
    assert lean[0] == 3.0 and len(lean[1]) == 2
    assert lean[1][0][0].startswith("Exception in callback") and "boom" in lean[1][0][0]


async def _busy_scenario(loop: JumpClockLoop, log: list[tuple[Any, ...]]) -> float:
    """Ties, a timer heap that rebuilds, call_soon chains, a timeout, settled(),
    an executor thread and a wait past asyncio's longest (24 h): the paths the
    lean pass takes itself and those it hands to asyncio's."""
    now = loop.time()
    handles = [loop.call_at(now + 1 + i % 7, lambda i=i: log.append(("timer", i, loop.time())))
               for i in range(150)]
    for handle in handles[:100]:  # most of a long heap cancelled: asyncio rebuilds it
        handle.cancel()

    def chain(k: int) -> None:
        log.append(("soon", k, loop.time()))
        if k:
            loop.call_soon(chain, k - 1)

    loop.call_soon(chain, 4)
    loop.call_at(now, lambda: log.append(("due now", loop.time())))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.Event().wait(), 2.5)
    log.append(("timed out", loop.time()))
    await loop.settled()
    log.append(("settled", loop.time()))
    log.append(("thread", await loop.run_in_executor(None, sum, [1, 2, 3]), loop.time()))
    await advance(3 * 86_400.0)
    log.append(("three days on", loop.time()))
    return loop.time()


@pytest.mark.parametrize("start", [0.0, 12_345.678])
def test_the_paths_handed_to_asyncio_run_the_same_both_ways(
        start: float, monkeypatch: pytest.MonkeyPatch) -> None:
    lean, plain = (_on_a_loop(flag, monkeypatch, _busy_scenario, start)
                   for flag in (True, False))
    assert lean == plain
    assert lean[0] == start + 2.5 + 3 * 86_400.0
    timers = [e for e in lean[1] if e[0] == "timer"]
    assert sorted(i for _, i, _ in timers) == list(range(100, 150))  # the live ones, once
    assert all(at == start + 1 + i % 7 for _, i, at in timers)
    assert [at for *_, at in timers] == sorted(at for *_, at in timers)


class _Bounded(JumpClockLoop):
    """Fails instead of spinning: a pass that runs nothing, over and over."""

    def _run_once(self) -> None:
        self.passes = getattr(self, "passes", 0) + 1
        if self.passes > 1_000:
            raise RuntimeError("the loop spins")
        super()._run_once()


@pytest.mark.parametrize("lean", [True, False])
def test_a_timer_is_due_on_a_clock_past_two_to_the_24_seconds(
        lean: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # There a float step exceeds the clock resolution (now + 1e-9 == now):
    # a timer due exactly now must still run.
    monkeypatch.setattr(clock, "_LEAN_HANDLES", lean)
    for start in (16_000_000.0, 17_000_000.0, 2.0**40):
        loop = _Bounded(start)
        try:
            loop.run_until_complete(advance(1.0))
            assert loop.time() == start + 1.0
        finally:
            loop.close()
