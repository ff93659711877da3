"""``async_rl.autopilot.reuse`` (issue 38, Build item 3): a run with the
autopilot writes its profile beside itself, and a new run of the same workload
starts from it - in virtual time through the simulator, which runs the real
controller. Every refusal names the field and the fix; a resumed run goes on
with its checkpoint's setting, not the profile's."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.cli import main
from asyncrl.config import config_from_dict, dump_config
from asyncrl.config.strict_yaml import load_yaml
from asyncrl.controller.profile import PROFILE_FILE, profile_of
from asyncrl.errors import ConfigError, RetuneRefused
from asyncrl.run.resume import without_reuse
from asyncrl.sim.clock import run_virtual
from asyncrl.sim.planner import ModelPlanner
from asyncrl.sim.report import TABLE_COLUMNS, plain_table, table_cells
from asyncrl.sim.runner import simulate
from tests.controller.conftest import make_controller
from tests.controller.test_retune import BoundChecker
from tests.fakes import FakeEngine, FakeTask, FakeTrainer

CONFIGURED = {"max_inflight_prompts": 4, "window": 2, "max_buffered_rollouts": 12}
SIM: dict[str, Any] = {
    "seed": 3,
    "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": 2},
    "async_rl": {"sampler": {"name": "in_order", "max_lookahead_versions": 2},
                 "max_buffered_rollouts": 12, "max_inflight_prompts": 4,
                 "min_groups_for_streaming_train": 4,
                 "autopilot": {"enabled": True, "mode": "aimd", "warmup_steps": 1,
                               "replan_every_steps": 1}},
    "simulate": {"steps": 10, "rollout_slots": 32, "train_step_s": 4.0, "weight_sync_s": 0.5,
                 "generation_latency_s": {"distribution": "lognormal", "median": 10.0,
                                          "sigma": 0.5}},
}


def _tree(**pilot: Any) -> dict[str, Any]:
    tree = copy.deepcopy(SIM)
    tree["async_rl"]["autopilot"].update(pilot)
    return tree


def _knobs(record: dict[str, Any]) -> dict[str, int]:
    return {k: int(record[f"autopilot/{k}"]) for k in CONFIGURED}


def _profile(tmp_path: Path, **changes: Any) -> Path:
    """A profile of SIM's workload (as a run writes it), with ``changes``."""
    setting = {**CONFIGURED, **changes.pop("setting", {})}
    profile = {"format": 1, "step": 10, "mode": "aimd", "sampler": "in_order",
               "num_prompts_per_step": 4, "setting": setting, "model": None, **changes}
    path = tmp_path / PROFILE_FILE
    path.write_text(json.dumps(profile))
    return path


def test_a_simulated_run_writes_its_profile(tmp_path: Path, capsys) -> None:
    config = tmp_path / "sim.yaml"
    config.write_text(yaml.safe_dump(SIM))
    run_dir = tmp_path / "run"
    assert main(["simulate", "--config", str(config), "--run-dir", str(run_dir),
                 "--no-plots"]) == 0
    profile = json.loads((run_dir / PROFILE_FILE).read_text())
    decisions = [json.loads(line) for line in
                 (run_dir / "autopilot_in_order.jsonl").read_text().splitlines()]
    assert {k: profile[k] for k in ("format", "step", "mode", "sampler",
                                    "num_prompts_per_step", "model")} == {
        "format": 1, "step": 10, "mode": "aimd", "sampler": "in_order",
        "num_prompts_per_step": 4, "model": None}
    # The setting in force at the end: the last one the autopilot asked for,
    # which aimd moved away from the configured one.
    assert profile["setting"] == decisions[-1]["setting"] != CONFIGURED


def test_a_new_run_starts_at_the_profiles_setting(tmp_path: Path) -> None:
    first = simulate(config_from_dict(_tree()))
    assert first.profile is not None and first.profile["setting"] != CONFIGURED
    (tmp_path / PROFILE_FILE).write_text(json.dumps(first.profile))
    second = simulate(config_from_dict(_tree(reuse=str(tmp_path))))  # the run directory
    # In force for the whole first step, applied before anything was admitted.
    assert _knobs(second.records[0]) == first.profile["setting"]
    assert second.retunes[0]["version"] == 0
    start = second.autopilot[0]
    assert start["action"] == "reuse" and start["step"] == 0
    assert start["previous"] == CONFIGURED and start["setting"] == first.profile["setting"]
    assert second.ledger["balanced"]
    assert "started from a profile at in-flight" in second.autopilot_line()


def test_a_smaller_window_and_capacity_are_in_force_from_the_first_step(tmp_path: Path) -> None:
    # A shrink before the first admission holds nothing: no group started under
    # the configured window, so the 8 slots window 1 needs are enough (window 2
    # needs 12, which a hold of the configured window would have kept).
    path = _profile(tmp_path, setting={"max_inflight_prompts": 6, "window": 1,
                                       "max_buffered_rollouts": 8})
    result = simulate(config_from_dict(_tree(reuse=str(path))))
    assert all(_knobs(r)["window"] == 1 and _knobs(r)["max_buffered_rollouts"] <= 8
               for r in result.records)
    assert _knobs(result.records[0]) == {"max_inflight_prompts": 6, "window": 1,
                                         "max_buffered_rollouts": 8}
    assert result.staleness_max <= 1 and result.stop_reason == "max_num_steps"


def test_simulates_table_shows_the_window_the_run_ended_with(tmp_path: Path, capsys) -> None:
    """The table's window is the configured one while it stays in force, and
    ``configured->final`` once a re-tune (here: the profile reused) changed it;
    results.json gives the final setting beside the configured window."""
    config = tmp_path / "sim.yaml"
    config.write_text(yaml.safe_dump(SIM))
    aimd = simulate(config_from_dict(SIM), steps=4)
    # aimd moved the in-flight bound only: the window column stays as configured.
    assert aimd.retunes and aimd.final_setting["window"] == 2
    assert table_cells(aimd)[TABLE_COLUMNS.index("window")] == "2"
    setting = {"max_inflight_prompts": 6, "window": 1, "max_buffered_rollouts": 8}
    path = _profile(tmp_path, setting=setting)
    run_dir = tmp_path / "run"
    assert main(["simulate", "--config", str(config), "--run-dir", str(run_dir), "--no-plots",
                 "--steps", "4", f"async_rl.autopilot.reuse={path}"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "in_order" in line)
    assert row.split("│")[2].strip() == "2->1", row
    record = json.loads((run_dir / "results.json").read_text())["results"][0]
    assert record["window"] == 2 and record["final_setting"]["window"] == 1
    # Never re-tuned: the table and results.json say so.
    plain = simulate(config_from_dict(_tree(enabled=False)), steps=2)
    assert plain.final_setting is None and plain.window_text() == "2"
    assert "2->" not in plain_table([plain])


def test_only_the_knobs_the_autopilot_may_move_start_from_the_profile(tmp_path: Path) -> None:
    path = _profile(tmp_path, setting={"max_inflight_prompts": 6, "window": 1,
                                       "max_buffered_rollouts": 16})
    result = simulate(config_from_dict(_tree(
        reuse=str(path), knobs=["max_inflight_prompts", "max_buffered_rollouts"])), steps=2)
    assert result.autopilot[0]["action"] == "reuse"
    assert _knobs(result.records[0]) == {"max_inflight_prompts": 6, "window": 2,
                                         "max_buffered_rollouts": 16}


def test_a_refused_setting_names_the_field_and_the_fix(tmp_path: Path) -> None:
    path = _profile(tmp_path, setting={"max_buffered_rollouts": 8})  # window 2 needs 12
    with pytest.raises(RetuneRefused) as caught:
        simulate(config_from_dict(_tree(reuse=str(path))), steps=2)
    message = str(caught.value)
    assert message.startswith(f"async_rl.autopilot.reuse: {path} starts the run with "
                              "{'max_buffered_rollouts': 8}")
    assert "below the 12 slots" in message and "set async_rl.autopilot.reuse: null" in message


def test_a_profile_outside_the_autopilots_clamps_is_refused(tmp_path: Path) -> None:
    """aimd never moves the bound outside [min_inflight, max_inflight]: a profile
    must not start it there either."""
    path = _profile(tmp_path, setting={"max_inflight_prompts": 9})
    with pytest.raises(ConfigError, match=r"async_rl\.autopilot\.reuse: .* starts the run with "
                       r"max_inflight_prompts=9, outside async_rl\.autopilot's clamps "
                       r"\[min_inflight=1, max_inflight=6\]; widen the clamps"):
        simulate(config_from_dict(_tree(reuse=str(path), max_inflight=6)), steps=2)
    res = simulate(config_from_dict(_tree(reuse=str(path), max_inflight=9)), steps=2)
    assert _knobs(res.records[0])["max_inflight_prompts"] == 9
    # aimd's default clamp is the buffer capacity (the profile's, when it sets one).
    big = _profile(tmp_path, setting={"max_inflight_prompts": 20})
    with pytest.raises(ConfigError, match=r"outside async_rl\.autopilot's clamps "
                       r"\[min_inflight=1, the buffer capacity=12\]"):
        simulate(config_from_dict(_tree(reuse=str(big))), steps=2)


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"sampler": "windowed"}, "is a profile of sampler 'windowed', this run has "
                              "async_rl.sampler: 'in_order'"),
    ({"num_prompts_per_step": 8}, "is a profile of num_prompts_per_step 8, this run has "
                                  "grpo.num_prompts_per_step: 4"),
    ({"format": 2}, "is not an autopilot profile of format 1 (format: 2)"),
    ({"setting": None}, "has no 'setting'"),
], ids=["sampler", "num_prompts_per_step", "format", "no-setting"])
def test_a_profile_of_another_workload_is_refused(tmp_path: Path, changes: dict,
                                                  fragment: str) -> None:
    path = _profile(tmp_path)
    profile = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps(profile))
    with pytest.raises(ConfigError) as caught:
        simulate(config_from_dict(_tree(reuse=str(path))), steps=2)
    message = str(caught.value)
    assert message.startswith(f"async_rl.autopilot.reuse: {path} ")
    assert fragment in message and message.endswith("or set async_rl.autopilot.reuse: null")


def test_a_missing_or_unreadable_profile_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^async_rl.autopilot.reuse: .*autopilot_profile"
                                          r"\.json does not exist; give the path"):
        simulate(config_from_dict(_tree(reuse=str(tmp_path))), steps=2)  # a dir without one
    (tmp_path / "torn.json").write_text('{"format": 1, "sett')
    with pytest.raises(ConfigError, match=r"^async_rl.autopilot.reuse: .*torn.json is not "
                                          "readable JSON"):
        simulate(config_from_dict(_tree(reuse=str(tmp_path / "torn.json"))), steps=2)


def test_the_config_key_round_trips_and_needs_the_autopilot() -> None:
    cfg = config_from_dict(_tree(reuse="runs/sim-1"))
    again = config_from_dict(load_yaml(dump_config(cfg), "dumped"))
    assert again.async_rl.autopilot.reuse == "runs/sim-1" and again == cfg
    with pytest.raises(ConfigError, match="reuse: runs/sim-1 starts the autopilot from a "
                                          "profile, but enabled is false; set enabled: true"):
        config_from_dict(_tree(reuse="runs/sim-1", enabled=False))
    with pytest.raises(ConfigError, match="reuse is empty"):
        config_from_dict(_tree(reuse=" "))
    # asyncrl train --resume goes on with the checkpoint's setting: the profile is not read.
    resumed = without_reuse(cfg)
    assert resumed.async_rl.autopilot.reuse is None
    assert resumed.model_copy(update={"async_rl": cfg.async_rl}) == cfg


def test_the_profile_keeps_the_models_numbers_only() -> None:
    ctl = make_controller({"name": "windowed", "max_staleness_versions": 2},
                          autopilot={"enabled": True})
    pilot = ctl.autopilot
    assert pilot is not None
    pilot.model = {"train_step_s": 4.0, "generations": 12, "latencies": [1.0, 2.0],
                   "note": "text", "bias": {"staleness_p95": 0.5, "waste_frac": math.nan}}
    profile = profile_of(pilot, 3)
    assert profile["model"] == {"train_step_s": 4.0, "generations": 12,
                                "bias": {"staleness_p95": 0.5}}
    assert profile["sampler"] == "windowed" and profile["step"] == 3


def test_a_model_based_run_writes_its_fitted_model() -> None:
    cfg = config_from_dict(_tree(mode="runtime", plan_steps=4, warmup_steps=2,
                                 replan_every_steps=3))
    result = simulate(cfg, steps=8, planner=ModelPlanner(cfg, inline=True))
    model = result.profile["model"]
    assert model["generations"] > 0 and "latencies" not in model
    assert json.loads(json.dumps(model, allow_nan=False)) == model


def _controller(steps: int, *, version: int = 0, **pilot: Any):
    engine = FakeEngine(lambda r: 1.0 + (r.group_id % 3))
    engine.weight_version = version  # a resume loads the checkpoint's weights
    return make_controller({"name": "in_order", "max_lookahead_versions": 2},
                           engines=[engine], trainer=FakeTrainer(step_time=1.0), steps=steps,
                           per_step=4, capacity=12, min_chunk=4, inflight=4,
                           autopilot={"enabled": True, "warmup_steps": 1,
                                      "replan_every_steps": 1, **pilot})


def test_a_resumed_run_goes_on_with_its_checkpoint_not_the_profile(tmp_path: Path) -> None:
    first = _controller(4, max_inflight=5)
    profiles: list[dict] = []
    first.autopilot.on_profile = profiles.append
    run_virtual(first.run())
    # Written before the first step, at each applied change and at the end.
    assert profiles[0]["step"] == 0 and profiles[-1]["step"] == 4
    assert profiles[-1]["setting"] == first.retuner.target.as_dict()
    state = first.state_dict()
    checkpointed = first.retuner.target.as_dict()

    path = _profile(tmp_path, setting={"max_inflight_prompts": 3, "window": 1,
                                       "max_buffered_rollouts": 8})
    resumed = _controller(6, version=4, max_inflight=5, reuse=str(path))
    resumed.load_state_dict(state)
    checker = BoundChecker(resumed)
    result = run_virtual(resumed.run())
    assert result.summary["ledger"]["balanced"] and checker.violations == []
    assert _knobs(resumed.step_records[0]) == checkpointed
    assert all(d["action"] != "reuse" for d in resumed.autopilot.decisions)
    assert all(a["version"] > 4 for a in resumed.retuner.applied)


BASE = """
grpo: {num_prompts_per_step: 8, max_num_steps: 2}
async_rl: {max_buffered_rollouts: 16, min_groups_for_streaming_train: 8,
           autopilot: {enabled: true}}
logging: {progress: never}
"""


def test_validate_and_train_check_the_profile_alike(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(BASE)
    good = {"format": 1, "step": 5, "mode": "aimd", "sampler": "in_order",
            "num_prompts_per_step": 8, "model": None,
            "setting": {"max_inflight_prompts": 12, "window": 1, "max_buffered_rollouts": 16}}
    (tmp_path / "good.json").write_text(json.dumps(good))
    (tmp_path / "bad.json").write_text(json.dumps(
        {**good, "setting": {**good["setting"], "max_buffered_rollouts": 8}}))
    assert main(["validate", "--config", str(config), "--json", "--no-memory",
                 f"async_rl.autopilot.reuse={tmp_path / 'good.json'}"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["autopilot_reuse"] == {"path": str(tmp_path / "good.json"),
                                        "knobs": {"max_inflight_prompts": 12}}
    assert main(["validate", "--config", str(config), "--no-memory",
                 f"async_rl.autopilot.reuse={tmp_path / 'good.json'}"]) == 0
    assert "autopilot starts from (reuse)" in capsys.readouterr().out
    bad = f"async_rl.autopilot.reuse={tmp_path / 'bad.json'}"
    assert main(["validate", "--config", str(config), bad]) == 2
    err = capsys.readouterr().err
    assert "async_rl.autopilot.reuse:" in err and "below the 16 slots" in err
    run_dir = tmp_path / "run"
    assert main(["train", "--config", str(config), "--run-dir", str(run_dir), bad]) == 2
    assert "below the 16 slots" in capsys.readouterr().err
    assert not run_dir.exists(), "train wrote into the run directory before refusing"


def _train(run_dir: Path, *, overwrite: bool = False, **pilot: Any) -> dict[str, Any]:
    """asyncrl train with the fakes, two steps."""
    from asyncrl.run.train import train

    cfg = config_from_dict({
        "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": 2, "max_num_steps": 2},
        "async_rl": {"max_buffered_rollouts": 12, "min_groups_for_streaming_train": 4,
                     "max_inflight_prompts": 4, "autopilot": pilot},
        "logging": {"progress": "never", "tensorboard": False},
    })
    return train(cfg, run_dir, overwrite=overwrite, task=FakeTask(),
                 backends=([FakeEngine(0.0)], FakeTrainer(step_time=0.0)))


@pytest.mark.e2e  # train() runs in real time
def test_overwrite_leaves_no_autopilot_file_of_the_old_run(tmp_path: Path) -> None:
    """--overwrite deletes the old run's autopilot.jsonl, knobs plot and profile
    - a profile left behind would start a later reuse from another run's
    setting - except the profile the new run itself starts from (reuse)."""
    run_dir = tmp_path / "run"
    assert _train(run_dir, enabled=True, warmup_steps=0, replan_every_steps=1)["ledger"][
        "balanced"]
    old = [run_dir / PROFILE_FILE, run_dir / "autopilot.jsonl",
           run_dir / "plots" / "autopilot_knobs_vs_step.png"]
    assert all(p.is_file() for p in old)
    old_profile = json.loads(old[0].read_text())
    assert _train(run_dir, overwrite=True, enabled=True, reuse=str(run_dir))["steps"] == 2
    assert json.loads(old[0].read_text())["step"] == 2  # this run's own, from the old one's
    assert json.loads(old[1].read_text().splitlines()[0])["reason"].startswith(
        f"started from {old[0]} (written at step {old_profile['step']}")
    assert _train(run_dir, overwrite=True)["steps"] == 2  # the autopilot off
    assert not any(p.exists() for p in old), [p.name for p in old if p.exists()]
