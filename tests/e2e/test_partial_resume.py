"""Nothing generated is lost at a stop (issue 21): SIGINT while groups are in the
middle of long generations, then a resume. The stop's checkpoint keeps every
generating group with its tokens so far; the resumed run continues each from
exactly those tokens (bit-identical ids, log-probs and versions), regenerates
none from scratch, counts them as ``groups_continued`` and balances its ledger."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import config_from_dict
from asyncrl.run.backends import build_backends
from asyncrl.run.resume import prepare_resume
from asyncrl.run.train import train
from asyncrl.tasks import build_task
from tests.pretrained import RecordingEngine

pytestmark = pytest.mark.e2e

CONFIG = {
    "seed": 3,
    "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 3, "max_num_steps": 40},
    "async_rl": {"sampler": {"name": "windowed", "max_staleness_versions": 2,
                             "staleness_of": "end_weight"},
                 "max_buffered_rollouts": 8, "min_groups_for_streaming_train": 1,
                 "max_inflight_prompts": 6},
    "task": {"name": "reverse"},
    "policy": {"model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                         "intermediate_size": 64},
               "generation": {"max_new_tokens": 40}},
    "loss": {"max_token_staleness": 4},
    "checkpoint": {"every_steps": 0},
    "logging": {"tensorboard": False, "plots": False, "progress": "never"},
}


class Recorder(RecordingEngine):
    """The run's engine, recording what each group was asked to continue and what
    it returned; sends this process a SIGINT at its ``sigint_at``-th group."""

    def __init__(self, engine: Any, sigint_at: int | None = None) -> None:
        super().__init__(engine)
        self.sigint_at = sigint_at
        self.calls = 0
        self.prefixes: dict[Any, Any] = {}  # group id -> prefix of its first request
        self.results: dict[Any, Any] = {}
        # Long generations: EOS made rare (the engine's own model only).
        engine.model.lm_head.register_forward_hook(self._rare_eos)

    def _rare_eos(self, module, inputs, output):
        output = output.clone()
        output[..., self.engine.tokenizer.eos_id] -= 4.0
        return output

    def __getattr__(self, name: str) -> Any:  # snapshot, device, ...
        return getattr(self.engine, name)

    async def generate(self, request: Any) -> Any:
        self.calls += 1
        self.prefixes.setdefault(request.group_id, request.prefix)
        if self.calls == self.sigint_at:
            os.kill(os.getpid(), signal.SIGINT)  # handled by the run's event loop
        result = await super().generate(request)
        self.results[request.group_id] = result
        return result


def backends(cfg: Any, run: Path, sigint_at: int | None = None) -> tuple[Any, Any]:
    engines, trainer = build_backends(cfg, build_task(cfg.task), work_dir=run)
    return [Recorder(engines[0], sigint_at)], trainer


def test_a_stop_keeps_the_tokens_and_the_resume_continues_them(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = config_from_dict(json.loads(json.dumps(CONFIG)))
    engines, trainer = backends(cfg, run, sigint_at=20)
    summary = train(cfg, run, backends=(engines, trainer))
    assert summary["stop_reason"] == "interrupted" and summary["ledger"]["balanced"]
    stopped_at = summary["steps"]

    cfg, ckpt = prepare_resume(run, [f"grpo.max_num_steps={stopped_at + 8}"])
    assert ckpt.step == stopped_at
    kept = {e["group_id"]: e["partial"] for e in ckpt.controller_state["dispatch"]["inflight"]
            if e["partial"] is not None}
    with_tokens = {g for g, p in kept.items()
                   if any(c["token_ids"] for c in p["completions"])}
    unfinished = {g for g, p in kept.items()
                  if any(c["finish_reason"] is None for c in p["completions"])}
    assert with_tokens and unfinished, "the stop came while groups were generating"

    engines, trainer = backends(cfg, run)
    resumed = train(cfg, run, resume=ckpt, backends=(engines, trainer))
    recorder = engines[0]
    assert resumed["ledger"]["balanced"] and resumed["steps"] == stopped_at + 8
    assert resumed["groups_continued"] == len(with_tokens)
    for gid, partial in kept.items():
        # The first request of the group continued from the saved tokens ...
        assert recorder.prefixes[gid].to_dict() == partial
        # ... and its result begins with them, bit for bit.
        for before, after in zip(partial["completions"], recorder.results[gid].completions):
            n = len(before["token_ids"])
            assert after.token_ids[:n] == before["token_ids"]
            assert after.logprobs[:n] == before["logprobs"]
            assert after.version_list()[:n] == [v for v, c in before["versions"]
                                                for _ in range(c)]
            if before["finish_reason"] is not None:
                assert after.finish_reason == before["finish_reason"] and len(after) == n
            assert len(after) <= 40 and after.finished
    ledger = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    ids = sorted(r["prompt_id"] for r in ledger)
    assert ids == list(range(len(ids))), "a prompt was lost or recorded twice"
