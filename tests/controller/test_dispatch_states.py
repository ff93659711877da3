"""The dispatcher's explicit states under random setups and faults.

Every run must either finish with a balanced ledger, stop gracefully naming a
stalled rollout side, or raise a RolloutStall naming a stalled trainer side; at
every step the dispatcher's counts must agree with the states of its entries.
"""

from __future__ import annotations

import asyncio
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.controller.entry import EntryState
from asyncrl.errors import RolloutStall, SetupError
from asyncrl.sampling import BaseSampler
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import FORGIVING, make_controller
from tests.fakes import FakeEngine, FakeTask, FakeTrainer, InlineScorer

WINDOW_KEY = {"in_order": "max_lookahead_versions", "weight_fifo": "max_staleness_versions",
              "windowed": "max_staleness_versions", "ready_first": "max_staleness_versions"}
PRE_SLOT = {EntryState.QUEUED, EntryState.AWAIT_INFLIGHT, EntryState.AWAIT_BUFFER}
STALL_S = 500.0


class EvenOnly(BaseSampler):
    """A broken custom policy: trains only even group ids and never evicts the
    odd ones, so the buffer can fill up with groups nobody will take."""

    gated, window = True, 1

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        ready = self.buffer.ready_in_weight_range(None, current_train_weight)
        even = [s for s in ready if s.group_id % 2 == 0][:max_prompt_groups]
        return self._take(even, min_prompt_groups)


class HangingTrainer(FakeTrainer):
    def __init__(self, hang_at: int, **kw) -> None:
        super().__init__(**kw)
        self.hang_at = hang_at

    async def finish_step(self, *, step: int) -> dict[str, float]:
        if step == self.hang_at:
            await asyncio.Event().wait()  # never set: a trainer that hangs
        return await super().finish_step(step=step)


class HangingScorer(InlineScorer):
    def __init__(self, task: FakeTask, hang_prompt: int) -> None:
        super().__init__(task)
        self.hang_prompt = hang_prompt

    async def score(self, prompt, completions):
        if prompt.prompt_id == self.hang_prompt:
            await asyncio.Event().wait()  # a reward that never returns
        return await super().score(prompt, completions)


@st.composite
def scenarios(draw):
    name = draw(st.sampled_from([*sorted(WINDOW_KEY), "even_only"]))
    if name == "even_only":
        sampler = {"name": "custom", "target": f"{__name__}:EvenOnly"}
    else:
        sampler = {"name": name, WINDOW_KEY[name]: draw(st.integers(0, 2))}
    return {
        "sampler": sampler,
        "per_step": draw(st.integers(1, 5)),
        "capacity": draw(st.integers(1, 16)),
        "min_chunk": draw(st.integers(1, 6)),
        "inflight": draw(st.integers(1, 10)),
        "engines": draw(st.integers(1, 2)),
        "failure_rate": draw(st.sampled_from([0.0, 0.0, 0.3])),
        "fault": draw(st.sampled_from(["none", "none", "engine", "trainer", "reward"])),
        "fault_at": draw(st.integers(0, 6)),
        "seed": draw(st.integers(0, 10_000)),
    }


def check_states(ctl) -> None:
    """The dispatcher's bookkeeping agrees with its entries' explicit states."""
    d = ctl.dispatcher
    active = list(d.active.values())
    assert all(e.state in PRE_SLOT for e in d.queue)
    assert all(e.state not in PRE_SLOT and e.state is not EntryState.LEFT for e in active)
    assert d.working == sum(e.state.working for e in active)
    assert d.inflight == sum(e.state.inflight for e in active) <= ctl.cfg.max_inflight_prompts
    buf = ctl.buffer
    assert len(buf) <= buf.capacity
    assert {s.group_id for s in buf.slots() if not s.ready} == set(d.active)
    ok, why = ctl.ledger.check_balance({s.group_id for s in buf.slots()})
    assert ok, why


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_run_finishes_or_names_the_side_that_stalled(sc) -> None:
    rng = random.Random(sc["seed"])
    fault, at = sc["fault"], sc["fault_at"]

    def latency(req) -> float:
        if fault == "engine" and req.prompt.prompt_id == at:
            return 1e9  # an engine that never answers for this group
        return rng.lognormvariate(0.0, 1.0)

    engines = [FakeEngine(latency, fail=lambda _r: rng.random() < sc["failure_rate"])
               for _ in range(sc["engines"])]
    trainer = HangingTrainer(at) if fault == "trainer" else FakeTrainer()
    task = FakeTask()
    scorer = HangingScorer(task, at) if fault == "reward" else InlineScorer(task)
    try:
        ctl = make_controller(
            sc["sampler"], engines=engines, trainer=trainer, task=task, scorer=scorer, steps=8,
            per_step=sc["per_step"], capacity=sc["capacity"], min_chunk=sc["min_chunk"],
            inflight=sc["inflight"],
            stall_watchdog={"stall_timeout_s": STALL_S, "interval_s": STALL_S / 10,
                            "stall_action": "abort"},
            rollout_failure={**FORGIVING, "max_infra_attempts_per_prompt": 2},
        )
    except SetupError:
        return  # refused up front (the deadlock-freedom test checks the reasons)

    async def each_step(c, _version: int) -> None:
        check_states(c)

    ctl.on_step_end = each_step
    try:
        result = run_virtual(ctl.run())
    except RolloutStall as exc:
        message = str(exc)
        if "deadlock" in message:
            # Found by the train pump from the dispatcher's states, not by the watchdog.
            assert sc["sampler"]["name"] == "custom", message
        elif fault == "trainer":
            assert "trainer side stalled" in message and "finish_step" in message, message
        else:
            raise AssertionError(f"a rollout-side stall must stop gracefully: {message}") from exc
        return
    if result.stop_reason == "stalled":  # stall_action: abort, on the rollout side
        assert fault in ("engine", "reward"), ctl.stop_message
        assert "rollout side stalled" in ctl.stop_message, ctl.stop_message
        # The interrupted step's groups are live too: the summary's check counts them.
        assert result.summary["ledger"]["balanced"]
        return
    assert fault != "trainer" or at >= 8
    assert result.steps == 8
    assert result.summary["ledger"]["balanced"]
    check_states(ctl)
