"""End to end (real time, short): the autopilot in a real CPU run on the
long-tail task (issue 38), and the simulator's planner fitted to that run in a
process of its own, as ``asyncrl train`` runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.controller.autoplan import PlanRequest
from asyncrl.sim.planner import ModelPlanner

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8


def test_the_autopilot_retunes_a_real_run_and_the_planner_fits_it(tmp_path: Path,
                                                                   capsys) -> None:
    run_dir = tmp_path / "run"
    # Two groups in flight for eight a step: the trainer idles, so aimd raises the bound.
    code = main(["train", "--config", str(ROOT / "examples" / "long_tail.yaml"),
                 "--run-dir", str(run_dir), f"grpo.max_num_steps={STEPS}",
                 "async_rl.max_inflight_prompts=2", "async_rl.autopilot.enabled=true",
                 "async_rl.autopilot.warmup_steps=1", "async_rl.autopilot.replan_every_steps=2",
                 "logging.progress=never", "logging.plots=false", "logging.tensorboard=false",
                 "checkpoint.every_steps=0"])
    assert code == 0
    assert "autopilot       aimd: " in capsys.readouterr().out  # the end-of-run line
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ledger"]["balanced"] and summary["steps"] == STEPS
    assert summary["autopilot"]["changes"] >= 1
    assert summary["staleness_max"] <= 4  # the sampler's bound (windowed, s = 4)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    bounds = [r["autopilot/max_inflight_prompts"] for r in records]
    assert bounds[-1] > 2 and all(r["inflight"] <= b for r, b in zip(records, bounds))
    decisions = [json.loads(line)
                 for line in (run_dir / "autopilot.jsonl").read_text().splitlines()]
    assert any(d["setting"] != d["previous"] for d in decisions)
    # The profile a new run can start from (autopilot.reuse): the final setting.
    assert json.loads((run_dir / "autopilot_profile.json").read_text())["setting"] == \
        summary["autopilot"]["final"]

    # The planner of mode runtime, fitted to this run's own steps, in a process.
    cfg = load_config(run_dir / "config.yaml")
    request = PlanRequest(
        step=STEPS, setting={"max_inflight_prompts": bounds[-1], "window": 4,
                             "max_buffered_rollouts": 8},
        knobs=("max_inflight_prompts", "max_buffered_rollouts"),
        bounds={"max_staleness_p95": 4.0, "max_waste_frac": 0.05}, objective="throughput",
        max_move=0.25, plan_steps=8, records=records,
        intervals=json.loads((run_dir / "timeline.json").read_text()), engines=1)
    planner = ModelPlanner(cfg)
    try:
        result = planner.submit(request).result()
    finally:
        planner.close()
    assert result.model["train_step_s"] >= 0 and result.model["generations"] >= 8
    assert result.current is not None and result.current.setting == request.setting
    assert {c.setting["window"] for c in result.candidates} == {4}
