"""Issue 12, cases 4 and 6, through the ``asyncrl`` entry point: a final
checkpoint at every normal end of a run, torn JSONL lines, checkpoints whose
files pass the checksum but whose content does not fit."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest

from asyncrl.cli import main

pytestmark = pytest.mark.e2e

BASE = [
    "seed=3", "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
    "async_rl.max_buffered_rollouts=8", "async_rl.min_groups_for_streaming_train=2",
    "async_rl.max_inflight_prompts=8", "policy.model.hidden_size=32",
    "policy.model.num_layers=1", "policy.model.num_heads=2",
    "policy.model.intermediate_size=64", "logging.tensorboard=false", "logging.plots=false",
    "logging.progress=never",
]


def train(tmp_path: Path, run: str, *overrides: str) -> Path:
    config = tmp_path / "c.yaml"
    config.write_text("seed: 3\n")
    assert main(["train", "--config", str(config), "--run-dir", str(tmp_path / run),
                 *BASE, *overrides]) == 0
    return tmp_path / run


def names(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def resign(checkpoint: Path, name: str, data: bytes) -> None:
    """Replace a file and its manifest entry: the checksums pass, the content is wrong."""
    (checkpoint / name).write_bytes(data)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


# ------------------------------------------------------------------------ case 4
@pytest.mark.parametrize(("overrides", "stop", "expected"), [
    # every_steps 0 means no periodic checkpoints, but the final one is written.
    (["checkpoint.every_steps=0", "grpo.max_num_steps=3"], "max_num_steps", ["step-000003"]),
    # The prompt source runs dry between steps: written after the run, nothing in flight.
    (["checkpoint.every_steps=0", "grpo.max_num_steps=9", "task.num_prompts=8"],
     "source_exhausted", ["step-000002"]),
    # ... or in the middle of a step: the last, smaller step ends the run.
    (["checkpoint.every_steps=2", "grpo.max_num_steps=9", "task.num_prompts=10"],
     "incomplete_step", ["step-000002", "step-000003"]),
])
def test_every_normal_end_writes_a_final_checkpoint(tmp_path, capsys, overrides, stop, expected):
    run = train(tmp_path, "run", *overrides)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == stop and summary["ledger"]["balanced"]
    assert names(run) == expected
    final = json.loads((run / "checkpoints" / expected[-1] / "controller.json").read_text())
    assert final["trainer_version"] == summary["steps"]
    if stop == "source_exhausted":
        capsys.readouterr()
        before = (run / "summary.json").read_bytes()
        assert main(["train", "--resume", str(run)]) == 0
        assert "its task has no prompts left" in capsys.readouterr().out
        assert (run / "summary.json").read_bytes() == before


# ------------------------------------------------------------------------ case 6
def test_a_torn_metrics_line_is_dropped_with_one_warning(tmp_path, capsys, caplog) -> None:
    run = train(tmp_path, "run", "grpo.max_num_steps=4", "checkpoint.every_steps=2")
    shutil.rmtree(run / "checkpoints" / "step-000004")  # killed after step 3, mid-write:
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 4, "reward_mean": 0.2, "wall_ti')
    caplog.set_level(logging.WARNING, logger="asyncrl")
    assert main(["plot", str(run)]) == 0
    torn = [r for r in caplog.records if "unreadable line" in r.getMessage()]
    assert len(torn) == 1 and "line 5" in torn[0].getMessage()
    caplog.clear()
    assert main(["train", "--resume", str(run), "grpo.max_num_steps=5"]) == 0
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]
    assert sum("unreadable line" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("damage", ["controller-not-a-state", "controller-without-ledger",
                                    "trainer-without-optimizer", "config-not-a-config"])
def test_a_checkpoint_with_the_wrong_schema_falls_back(tmp_path, capsys, caplog, damage) -> None:
    run = train(tmp_path, "run", "grpo.max_num_steps=4", "checkpoint.every_steps=2")
    newest = run / "checkpoints" / "step-000004"
    if damage == "controller-not-a-state":
        resign(newest, "controller.json", b'{"hello": "world"}')
    elif damage == "controller-without-ledger":
        state = json.loads((newest / "controller.json").read_text())
        del state["ledger"]
        resign(newest, "controller.json", json.dumps(state).encode())
    elif damage == "trainer-without-optimizer":
        import io

        import torch

        state = torch.load(newest / "trainer.pt", weights_only=True)
        del state["optimizer"]
        buf = io.BytesIO()
        torch.save(state, buf)
        resign(newest, "trainer.pt", buf.getvalue())
    else:
        resign(newest, "config.yaml", b"grpo: {num_prompts_per_step: many}\n")
    caplog.set_level(logging.WARNING, logger="asyncrl")
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "grpo.max_num_steps=5"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "KeyError" not in err.split("(")[0]
    falling = [r.getMessage() for r in caplog.records if "falling back" in r.getMessage()]
    assert len(falling) == 1 and "step-000004" in falling[0], falling
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 5 and summary["ledger"]["balanced"]
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]  # steps 2 and 3 trained again from step-000002
    # The broken checkpoint is set aside, so keep_last never keeps it over a good one.
    assert "rejected-step-000004" in names(run) and "step-000005" in names(run)
