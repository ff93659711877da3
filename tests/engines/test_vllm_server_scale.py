"""``asyncrl fleet scale`` on servers asyncrl starts itself (issue 35): a run
on one ``vllm serve`` process grows to two through the run's control channel,
the second serving at the newest weights, then shrinks back to one with a
group in flight on the server that leaves. Heavy (a second server starts
mid-run: minutes on 2 cores): ``ASYNCRL_HEAVY_E2E=1``. The server given by
URL is covered in ``make test`` (test_vllm_server_engine.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from asyncrl.engines.vllm.server.engine import VLLMServerEngine
from asyncrl.engines.vllm.setup import descendants
from asyncrl.policy.build import build_policy
from asyncrl.run.fleet_channel import request as fleet_request
from asyncrl.run.options import trainer_options
from asyncrl.run.train import train
from asyncrl.tasks import build_task
from asyncrl.trainers.grpo import GRPOTrainer
from tests.engines.test_vllm_server_engine import records, server_config
from tests.heavy import HEAVY

pytestmark = [pytest.mark.e2e, HEAVY]


def scale_mid_run(engine: VLLMServerEngine, run_dir: Path, seen: dict) -> None:
    """The first request after step 1 scales the fleet to 2 and waits for the
    answer (the new server started, loaded and joined) before it goes on; the
    first request after step 2 on the first server scales back to 1 with the
    group it streams in flight (scale down drains the newest: the second).
    From step 3 on, the first server's requests wait for that answer (the
    second server drained, closed and gone), so the run cannot end before it:
    once a 5-step run ended first and the answer never came."""
    first = engine._servers[0]
    original = first.client.stream

    async def stream(path, body):
        shrink = seen.get("shrunk")
        if shrink is not None and first.version >= 3:
            await asyncio.wait({shrink})  # the drain needs only the second server's groups
        if first.version >= 1 and "grown" not in seen:
            seen["grown"] = await asyncio.to_thread(
                fleet_request, run_dir, {"op": "scale", "size": 2})
            second = engine._servers[1]
            second_stream = second.client.stream

            async def on_second(path, body):
                seen.setdefault("second_first", (second.version, engine.weight_version))
                async for event in second_stream(path, body):
                    yield event

            second.client.stream = on_second
        async for event in original(path, body):
            yield event
        if first.version >= 2 and "shrunk" not in seen and "second_first" in seen:
            seen["shrunk"] = asyncio.ensure_future(asyncio.to_thread(
                fleet_request, run_dir, {"op": "scale", "size": 1}))

    first.client.stream = stream


def test_scale_starts_a_second_server_at_the_newest_weights_and_drains_it(tmp_path) -> None:
    cfg = server_config({"num_servers": 1, "min_servers": 1, "max_servers": 2},
                        grpo={"max_num_steps": 5})
    task = build_task(cfg.task)
    before = descendants()
    model, tokenizer = build_policy(cfg.policy, task, seed=cfg.seed)
    engine = VLLMServerEngine.for_policy(cfg.policy, model, tokenizer, seed=cfg.seed,
                                         work_dir=tmp_path / "servers")
    trainer = GRPOTrainer.from_options(trainer_options(cfg), model=model, tokenizer=tokenizer)
    seen: dict = {}
    scale_mid_run(engine, tmp_path / "run", seen)
    summary = train(cfg, tmp_path / "run", backends=([engine], trainer))
    assert summary["ledger"]["balanced"] and summary["steps"] == 5
    assert "scaled to 2" in seen["grown"], seen["grown"]
    held, newest = seen["second_first"]
    assert held == newest  # the second server's first group: at the newest weights
    assert "scaled to 1" in seen["shrunk"].result() and len(engine.urls) == 1
    for r in records(tmp_path / "run"):  # synchronous: on-policy at every step
        assert r["staleness_max"] == 0 and r["train/logprob_mismatch_max"] <= 1e-3, r
    assert not set(descendants()) - set(before), "a server asyncrl started is still running"
