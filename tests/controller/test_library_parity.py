"""Issue 18, item 14: a script building a Controller runs rewards as ``asyncrl
train`` does - with the task config's reward pool (timeout, executor, workers),
not the pool's defaults. One config, both ways, deterministic: identical metrics,
and the config's reward timeout holds in both."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from asyncrl.config import config_from_dict
from asyncrl.controller import Controller, MemoryHistory
from asyncrl.run.backends import build_local_backends
from asyncrl.run.train import train
from asyncrl.tasks import build_task

pytestmark = pytest.mark.e2e

#: Released when the test ends; a hung reward call waits for it (at most 60 s).
_RELEASE = threading.Event()
#: The reward timeout: only the hang reaches it, however loaded the machine (the
#: other calls compare two strings).
TIMEOUT_S = 2.0


def hangs_on_seven(prompt, completion, answer, **record) -> float:
    """An exact-match reward that hangs on the record whose answer is 7."""
    if answer == "7":
        _RELEASE.wait(60.0)
    return 1.0 if completion.strip() == answer else 0.0


def config(data: Path):
    return config_from_dict({
        "seed": 1,
        "deterministic": True,
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "max_num_steps": 4},
        "async_rl": {"sampler": {"name": "in_order", "max_lookahead_versions": 1},
                     "max_buffered_rollouts": 4, "min_groups_for_streaming_train": 2,
                     "max_inflight_prompts": 4,
                     "rollout_failure": {"max_infra_attempts_per_prompt": 1,
                                         "max_consecutive_dropped_prompts": 4,
                                         "on_dropped_prompt": "replace"}},
        "task": {"name": "dataset", "path": str(data), "template": "{word} =",
                 "shuffle": False,
                 "reward": {"name": "custom", "target": f"{__name__}:hangs_on_seven",
                            "timeout_s": TIMEOUT_S, "num_workers": 2}},
        "policy": {"model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2,
                             "intermediate_size": 32, "max_position_embeddings": 16},
                   "generation": {"max_new_tokens": 2}},
        "logging": {"progress": "never", "tensorboard": False, "plots": False},
    })


#: Measurements of the process, not results of the run.
MEASURED = {"train/peak_memory_bytes"}


def comparable(record: dict) -> dict:
    keep = ("step", "reward_mean", "staleness_mean", "groups_trained", "groups_failed_infra",
            "prompts_replaced")
    return {k: v for k, v in record.items()
            if (k in keep or k.startswith("train/")) and k not in MEASURED}


def test_library_use_and_train_score_alike_and_keep_the_reward_timeout(tmp_path: Path) -> None:
    import json

    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    data = tmp_path / "words.jsonl"
    data.write_text("".join(json.dumps({"word": w, "answer": str(i)}) + "\n"
                            for i, w in enumerate(words)))
    cfg = config(data)
    try:
        summary = train(cfg, tmp_path / "cli")
        cli = [json.loads(line) for line in (tmp_path / "cli" / "metrics.jsonl").open()]
        cli_failed = [json.loads(line) for line in (tmp_path / "cli" / "ledger.jsonl").open()
                      if '"failed"' in line]

        async def library():
            task = build_task(cfg.task)
            engine, trainer = build_local_backends(cfg, task)
            history = MemoryHistory()
            controller = Controller(task=task, engines=[engine], trainer=trainer, grpo=cfg.grpo,
                                    async_rl=cfg.async_rl, seed=cfg.seed, deterministic=True,
                                    ledger_history=history)
            try:
                await controller.run()
            finally:
                await engine.close()
                await trainer.close()
            return controller, history

        controller, history = asyncio.run(library())
    finally:
        _RELEASE.set()
    assert summary["steps"] == controller.steps_done == 4
    assert len(controller.step_records) == len(cli)
    for lib_rec, cli_rec in zip(controller.step_records, cli):
        # metrics.jsonl rounds floats to 12 digits.
        a, b = comparable(lib_rec), comparable(cli_rec)
        assert a == pytest.approx(b, rel=1e-10, abs=1e-12), (a, b)
    lib_failed = [r for r in history.records if r.state == "failed"]
    for failed in ([r["error"] for r in cli_failed], [r.error for r in lib_failed]):
        assert len(failed) == 1 and f"timeout_s={TIMEOUT_S:g}s" in failed[0], failed
