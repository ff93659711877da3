"""Controller state_dict / load_state_dict: resume with nothing lost."""

from __future__ import annotations

import asyncio
import collections
import json

import pytest

from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTrainer, lognormal_latency
from tests.vtime import advance, settle

SAMPLERS = [
    {"name": "in_order", "max_lookahead_versions": 1},
    {"name": "weight_fifo", "max_staleness_versions": 1},
    {"name": "windowed", "max_staleness_versions": 1},
    {"name": "ready_first", "max_staleness_versions": 2},
]


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: s["name"])
@pytest.mark.parametrize("kill_after", [0.5, 7.3])
def test_resume_from_a_step_checkpoint_loses_no_prompt(sampler: dict, kill_after: float) -> None:
    steps, ckpt_step = 20, 6
    kw = {"steps": steps, "capacity": 14, "inflight": 6,
          "rollout_failure": {"backoff_base_s": 0.3}}

    def engine(seed: int) -> FakeEngine:
        return FakeEngine(lognormal_latency(seed, sigma=1.0),
                          fail=lambda r: r.prompt.prompt_id % 11 == 5 and r.attempt == 1)

    saved: dict = {}

    async def snapshot(ctl, version: int) -> None:
        if version == ckpt_step:
            # A JSON round trip proves the state is plain data.
            saved["state"] = json.loads(json.dumps(ctl.state_dict()))
            saved["trainer"] = ctl.trainer.state_dict()

    first = make_controller(sampler, engines=[engine(1)], **kw)
    first.on_step_end = snapshot

    async def crash() -> None:
        run = asyncio.ensure_future(first.run())
        while first.steps_done < ckpt_step:  # no polling of wall time: virtual steps
            await first.buffer.wait_changed()
        await advance(kill_after)  # after the checkpoint
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    run_virtual(crash())
    assert saved["state"]["trainer_version"] == ckpt_step

    trainer = FakeTrainer()
    trainer.load_state_dict(saved["trainer"])
    # The resumed run appends to the same ledger history (ledger.jsonl in a run
    # directory), cut back to what it held at the checkpoint.
    resumed_engine = engine(2)
    resumed_engine.weight_version = ckpt_step  # as the runner loads it on resume
    second = make_controller(sampler, engines=[resumed_engine], trainer=trainer,
                             history=first.ledger.history, **kw)
    second.load_state_dict(saved["state"])
    result = run_virtual(second.run())

    ledger = result.summary["ledger"]
    assert ledger["balanced"], ledger
    assert result.steps == steps and second.version.value == steps
    records = second.ledger.records()
    # Prompts are taken from the source in order: every prompt id up to the
    # largest dispatched appears in the ledger exactly once (retries aside: a
    # retried group keeps its id), so nothing was skipped or dispatched twice.
    ids = collections.Counter(r.prompt_id for r in records)
    assert sorted(ids) == list(range(max(ids) + 1))
    assert set(ids.values()) == {1}
    assert ledger["trained"] == steps * 4
    # The resumed run kept stamping exactly like a fresh run would.
    if sampler["name"] == "in_order":
        for r in records:
            if r.state == "trained":
                assert r.target_step == r.end_step


def test_load_state_dict_after_run_started_is_refused() -> None:
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 0}, steps=2)

    async def main() -> None:
        run = asyncio.ensure_future(ctl.run())
        await settle()
        with pytest.raises(RuntimeError, match="before run"):
            ctl.load_state_dict(ctl.state_dict())
        await run

    run_virtual(main(), loop="jump")


def test_a_stop_before_the_resumed_groups_are_placed_loses_none() -> None:
    # A resumed run puts the checkpoint's in-flight groups back in the queue
    # (live in the ledger, not yet in the buffer). A stop that lands before the
    # placer takes them (a Ctrl-C during start-up) must count them as held, and
    # the next resume must still train every prompt once.
    sampler = {"name": "ready_first", "max_staleness_versions": 1}
    steps, ckpt_step = 10, 4
    kw = {"steps": steps, "per_step": 4, "capacity": 8, "inflight": 8}
    saved: dict = {}

    async def snapshot(ctl, version: int) -> None:
        if version == ckpt_step:
            saved["state"] = json.loads(json.dumps(ctl.state_dict()))
            saved["trainer"] = ctl.trainer.state_dict()
            ctl.request_stop()

    first = make_controller(sampler, engines=[FakeEngine(lognormal_latency(1))], **kw)
    first.on_step_end = snapshot
    run_virtual(first.run())
    assert saved["state"]["dispatch"]["inflight"], "the checkpoint must hold in-flight groups"

    def resumed(state: dict, trainer_state: dict) -> object:
        trainer = FakeTrainer()
        trainer.load_state_dict(trainer_state)
        engine = FakeEngine(lognormal_latency(2))
        engine.weight_version = state["trainer_version"]
        ctl = make_controller(sampler, engines=[engine], trainer=trainer,
                              history=first.ledger.history, **kw)
        ctl.load_state_dict(state)
        return ctl

    second = resumed(saved["state"], saved["trainer"])
    second.request_stop()  # before the placer has run at all
    result = run_virtual(second.run())
    assert result.steps == ckpt_step and result.summary["ledger"]["balanced"]

    third = resumed(json.loads(json.dumps(second.state_dict())), second.trainer.state_dict())
    result = run_virtual(third.run())
    ledger = result.summary["ledger"]
    assert ledger["balanced"] and result.steps == steps
    assert ledger["trained"] == steps * 4
    ids = collections.Counter(r.prompt_id for r in third.ledger.records())
    assert sorted(ids) == list(range(max(ids) + 1)) and set(ids.values()) == {1}
