"""Checkpoint files: atomic write, manifest verification, fallback, pruning, config checks."""

from __future__ import annotations

import json

import pytest
import torch

from asyncrl.checkpoint import (
    list_checkpoints,
    load_latest,
    verify,
    write_checkpoint,
)
from asyncrl.config import RunConfig, config_from_dict
from asyncrl.errors import CheckpointError
from asyncrl.run.resume import config_changes, config_differences


def save(run_dir, step: int, keep_last: int = 3):
    return write_checkpoint(
        run_dir, step,
        controller_state={"trainer_version": step, "ready": [], "note": f"s{step}"},
        trainer_state={"model": {"w": torch.full((3,), float(step))}, "version": step},
        config_yaml="seed: 0\n", keep_last=keep_last,
    )


def test_round_trip_and_newest_first(tmp_path) -> None:
    for step in (2, 4, 6):
        save(tmp_path, step)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000006", "step-000004",
                                                           "step-000002"]
    ckpt = load_latest(tmp_path)
    assert ckpt.step == 6 and ckpt.skipped == []
    assert torch.equal(ckpt.trainer_state["model"]["w"], torch.full((3,), 6.0))
    manifest = json.loads((ckpt.path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"controller.json", "trainer.pt", "config.yaml"}


def test_keep_last_prunes_old_checkpoints_and_crash_leftovers(tmp_path) -> None:
    leftover = tmp_path / "checkpoints" / ".step-000001.abc"
    leftover.mkdir(parents=True)
    for step in range(1, 6):
        save(tmp_path, step, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000005", "step-000004"]
    assert not leftover.exists()


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest"])
def test_a_corrupted_newest_checkpoint_falls_back_to_the_previous(tmp_path, damage) -> None:
    save(tmp_path, 2)
    newest = save(tmp_path, 4)
    target = newest / "trainer.pt"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:20])
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "delete":
        target.unlink()
    else:
        (newest / "manifest.json").unlink()
    assert verify(newest) is not None
    ckpt = load_latest(tmp_path)
    assert ckpt.step == 2
    assert len(ckpt.skipped) == 1 and "step-000004 is invalid" in ckpt.skipped[0]


def test_no_valid_checkpoint_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="is not a run directory"):
        load_latest(tmp_path)
    (tmp_path / "config.yaml").write_text("{}\n")
    with pytest.raises(CheckpointError, match="has no checkpoints"):
        load_latest(tmp_path)
    broken = save(tmp_path, 2)
    (broken / "controller.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"no valid checkpoint.*controller\.json has 2 bytes"
                       r".*no older checkpoint to fall back to"):
        load_latest(tmp_path)


def test_unpickling_arbitrary_objects_is_refused(tmp_path) -> None:
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = save(tmp_path, 2)
    torch.save({"x": Evil()}, path / "trainer.pt")
    # Re-sign the manifest so only the weights_only guard stands in the way.
    manifest = json.loads((path / "manifest.json").read_text())
    import hashlib

    data = (path / "trainer.pt").read_bytes()
    manifest["files"]["trainer.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_latest(tmp_path)


def test_config_differences_name_immutable_changes_only() -> None:
    old = RunConfig()
    harmless = config_from_dict({"grpo": {"max_num_steps": 999}, "logging": {"plots": False},
                                 "checkpoint": {"every_steps": 3}})
    assert config_differences(old, harmless) == []
    changed = config_from_dict({"async_rl": {"sampler": {"name": "in_order",
                                                         "max_lookahead_versions": 3}},
                                "grpo": {"num_prompts_per_step": 4}})
    diffs = config_differences(old, changed)
    assert diffs == ["grpo.num_prompts_per_step: 8 -> 4",
                     "async_rl.sampler.max_lookahead_versions: 1 -> 3"]
    # Issue 18, case 10: the keys of a block that changed, not the whole block.
    assert config_differences(old, config_from_dict({"task": {"max_operand": 5}})) == [
        "task.max_operand: 3 -> 5"]


LINEAR = "torch.optim.lr_scheduler.LinearLR"


def test_a_value_that_changes_form_is_one_change_line() -> None:
    """policy.scheduler's list form for its short form (or a torch scheduler for
    the short form, or None for it) is one line, not a line per key of either."""
    listed = config_from_dict({"policy": {"scheduler": [
        {"name": LINEAR, "kwargs": {"total_iters": 5}},
        {"name": "torch.optim.lr_scheduler.ConstantLR"}, {"milestones": [5]}]}})
    named = config_from_dict({"policy": {"scheduler": {"name": LINEAR}}})
    short = config_from_dict({"policy": {"scheduler": {"warmup_steps": 5},
                                         "optimizer": {"lr": 0.002}}})
    for old in (listed, named, RunConfig()):
        changes = config_changes(old, short)
        assert [c.partition(":")[0] for c in changes] == ["policy.optimizer.lr",
                                                          "policy.scheduler"], changes
        assert changes[1].endswith(" -> {'warmup_steps': 5, 'warmup_start_factor': 0.1, "
                                   "'decay': 'constant', 'decay_steps': None, "
                                   "'min_lr_ratio': 0.0}")
    # The same form: the keys that changed, as before.
    longer = config_from_dict({"policy": {"scheduler": {"warmup_steps": 7}}})
    assert config_changes(short, longer) == ["policy.optimizer.lr: 0.002 -> 0.001",
                                             "policy.scheduler.warmup_steps: 5 -> 7"]


def test_resume_with_a_changed_sampler_is_refused_with_the_difference_named(tmp_path) -> None:
    from asyncrl.config import dump_config
    from asyncrl.run.resume import prepare_resume

    cfg = RunConfig()
    write_checkpoint(tmp_path, 4, controller_state={"trainer_version": 4},
                     trainer_state={"version": 4}, config_yaml=dump_config(cfg), keep_last=2)
    with pytest.raises(CheckpointError) as err:
        prepare_resume(tmp_path, ["async_rl.sampler.name=windowed"])
    assert "async_rl.sampler.name: 'in_order' -> 'windowed'" in str(err.value)
    resumed, ckpt = prepare_resume(tmp_path, ["grpo.max_num_steps=999"])
    assert resumed.grpo.max_num_steps == 999 and ckpt.step == 4
