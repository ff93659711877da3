"""End to end (real time, short): ``asyncrl train`` per sampler family.

Each run trains the quickstart model for a few steps and checks the run
directory of docs/design.md ("What a run writes"): a balanced ledger, the metrics and summary schemas,
the sampler's staleness bound, TensorBoard events and valid PNG plots. (Whether
each sampler learns depends on how its asynchronous run interleaves, so it is
measured over seeds in benchmarks/bench_convergence.py, not asserted here.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.cli import main

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

METRIC_KEYS = {"step", "trainer_version", "wall_time_s", "reward_mean", "staleness_mean",
               "staleness_max", "groups_trained", "groups_evicted", "groups_aborted",
               "groups_failed", "trainer_idle_s", "buffer_ready", "inflight"}
LEDGER_KEYS = {"dispatched", "trained", "evicted", "aborted", "failed", "pending", "balanced"}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("sampler", ["in_order", "weight_fifo", "windowed", "ready_first"])
def test_train_per_sampler(sampler: str, tmp_path: Path, capsys) -> None:
    run_dir = tmp_path / "run"
    steps = 8
    code = main(["train", "--config", str(ROOT / "examples" / f"{sampler}.yaml"),
                 "--run-dir", str(run_dir), f"grpo.max_num_steps={steps}",
                 "logging.progress=never", "checkpoint.every_steps=0"])
    assert code == 0
    out = capsys.readouterr().out
    assert "run finished" in out and str(run_dir) in out

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(steps))
    for record in records:
        assert set(record) >= METRIC_KEYS, METRIC_KEYS - set(record)
        assert record["trainer_version"] == record["step"] + 1
        assert record["groups_trained"] == 8
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["ledger"]) >= LEDGER_KEYS and summary["ledger"]["balanced"]
    assert summary["steps"] == steps and summary["stop_reason"] == "max_num_steps"
    # Start-up (imports, model, engines) is reported beside the steps' wall time.
    assert summary["startup_s"] >= 0 and "s of start-up)" in out
    bound = {"in_order": 1, "weight_fifo": 1, "windowed": 1, "ready_first": None}[sampler]
    if bound is not None:
        assert summary["staleness_max"] <= bound

    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    plots = sorted(p.name for p in (run_dir / "plots").glob("*.png"))
    # No kl_vs_step.png: the examples train without a KL term (loss.kl_coef 0).
    assert plots == ["completion_len_vs_step.png", "entropy_vs_step.png",
                     "grad_norm_vs_step.png", "loss_vs_step.png", "pump_timeline.png",
                     "reward_vs_step.png", "reward_vs_time.png", "staleness_hist.png",
                     "step_time_vs_step.png", "token_staleness_hist.png"]
    for name in plots:
        assert (run_dir / "plots" / name).read_bytes()[:8] == PNG
    assert (run_dir / "config.yaml").is_file()


def test_bad_config_fails_fast_with_the_key_named(tmp_path: Path, capsys) -> None:
    code = main(["train", "--config", str(ROOT / "examples" / "quickstart.yaml"),
                 "--run-dir", str(tmp_path / "r"), "loss.off_policy_corection=tis"])
    assert code == 2
    err = capsys.readouterr().err
    assert "loss.off_policy_corection: unknown key" in err and "off_policy_correction" in err
