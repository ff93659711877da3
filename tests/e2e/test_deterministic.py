"""Deterministic mode end to end: identical metrics, and an exact replay after resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.controller.stats import measures_timing
from asyncrl.run.resume import prepare_resume
from asyncrl.run.train import train

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
#: Besides the fields that measure time (measures_timing): the process's memory.
MEMORY = {"train/peak_memory_bytes"}
STEPS = 16


def config(*extra: str):
    return load_config(ROOT / "examples" / "quickstart.yaml", [
        "deterministic=true", f"grpo.max_num_steps={STEPS}", "logging.progress=never",
        "logging.tensorboard=false", "logging.plots=false", "checkpoint.every_steps=0",
        "async_rl.sampler.max_lookahead_versions=2", "async_rl.max_buffered_rollouts=24",
        "async_rl.min_groups_for_streaming_train=2", *extra])


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not measures_timing(k) and k not in MEMORY}
            for r in rows]


def test_same_config_gives_identical_metrics_and_resume_replays_exactly(tmp_path: Path) -> None:
    first = tmp_path / "a"
    train(config(), first)
    second = tmp_path / "b"
    train(config(), second)
    assert metrics(first) == metrics(second)

    # A run that checkpoints at step 6 and goes on to step 9 before it stops (as
    # if killed: what it did after the checkpoint is discarded on resume) must,
    # resumed, replay steps 6.. exactly like the uninterrupted run.
    killed = tmp_path / "c"
    train(config("checkpoint.every_steps=6", "grpo.max_num_steps=9"), killed)
    shutil.rmtree(killed / "checkpoints" / "step-000009")  # the final one: killed before it
    cfg, ckpt = prepare_resume(killed, [f"grpo.max_num_steps={STEPS}"])
    assert ckpt.step == 6
    train(cfg, killed, resume=ckpt)
    resumed = metrics(killed)
    assert [r["step"] for r in resumed] == list(range(STEPS))
    assert resumed[6:] == metrics(first)[6:]
