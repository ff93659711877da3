"""``asyncrl simulate --calibrate`` on run directories whose truth is known: a
"real" run made by the Controller with simulated backends of known costs, under
virtual time, written like ``asyncrl train`` writes a run. The fit must
recover the costs and predict another setup. (On real vLLM runs, whose speeds
the machine's load sways: benchmarks/bench_calibrate.py.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from asyncrl._util.jsonio import write_json
from asyncrl.cli import main
from asyncrl.config import RunConfig, config_from_dict, dump_config, load_config
from asyncrl.controller import Controller
from asyncrl.controller.ledger import MemoryHistory
from asyncrl.errors import ConfigError
from asyncrl.metrics import MemorySink
from asyncrl.sim.backends import SimEngine, SimTask, SimTrainer
from asyncrl.sim.calibrate import calibrate, concurrency, fit_nonnegative, steps_per_s
from asyncrl.sim.calibrate_checks import calibration_warnings, shared_device
from asyncrl.sim.clock import run_virtual
from asyncrl.sim.latency import Constant, make_latency_model
from asyncrl.sim.runner import simulate
from asyncrl.types import GenerationRequest, GroupResult, Prompt
from tests.vtime import advance

#: The "hardware" of the synthetic runs: load-dependent generation, per-token training.
TRUTH = {"base_s": 0.5, "per_token_s": 0.01, "per_token_per_group_s": 0.002}
TRAIN = {"train_step_s": 1.5, "train_per_token_s": 0.0004, "weight_sync_s": 0.8}


def run_config(sampler: dict, *, capacity: int, steps: int = 40) -> RunConfig:
    # Lengths from 20 to 200 tokens (the longest of a group), means below them.
    lengths = [[20 + 9 * (i % 21), round(15 + 6.5 * (i % 21), 2)] for i in range(63)]
    return config_from_dict({
        "seed": 3,
        "grpo": {"num_prompts_per_step": 8, "num_generations_per_prompt": 4,
                 "max_num_steps": steps},
        "async_rl": {"sampler": sampler, "max_buffered_rollouts": capacity,
                     "max_inflight_prompts": capacity, "min_groups_for_streaming_train": 4},
        "policy": {"generation": {"max_batch_sequences": 64}},
        "simulate": {"steps": steps, "rollout_slots": 16, **TRAIN,
                     "pause_generation_during_sync": True,
                     "generation_latency_s": {"distribution": "tokens", "lengths": lengths,
                                              **TRUTH}},
    })


def write_run(cfg: RunConfig, run_dir: Path, *, abort_s: float = 0.0,
              filter_rate: float = 0.0) -> dict:
    """Run ``cfg`` as a "real" run and write what ``asyncrl train`` writes
    (``filter_rate``: the fraction of its groups whose rewards are all equal)."""
    sim = cfg.simulate
    assert sim is not None
    engine = SimEngine(make_latency_model(sim.generation_latency_s), rollout_slots=16,
                       seed=cfg.seed, weight_sync_s=sim.weight_sync_s, pause_during_sync=True,
                       abort_s=abort_s, filter_rate=filter_rate)
    trainer = SimTrainer(train_step_s=sim.train_step_s, train_per_token_s=sim.train_per_token_s)
    sink, history = MemorySink(), MemoryHistory()
    holder: dict[str, Controller] = {}

    async def go() -> None:
        controller = holder["c"] = Controller(
            task=SimTask(), engines=[engine], trainer=trainer, grpo=cfg.grpo,
            async_rl=cfg.async_rl, seed=cfg.seed, sinks=[sink], ledger_history=history)
        await controller.run()

    run_virtual(go(), loop="jump")
    controller = holder["c"]
    run_dir.mkdir(parents=True)
    tree = cfg.model_dump(mode="json")
    del tree["simulate"]  # a real run's config has none
    (run_dir / "config.yaml").write_text(dump_config(config_from_dict(tree)))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sink.records))
    write_json(run_dir / "timeline.json", controller.timeline.to_list())
    records = [*history.records, *controller.ledger.live_records()]
    (run_dir / "ledger.jsonl").write_text(
        "".join(json.dumps(r.to_dict(), default=str) + "\n" for r in records))
    return controller.summary()


def test_fit_nonnegative_is_least_squares_within_the_constraint() -> None:
    rows = [(1.0, x) for x in range(10)]
    assert fit_nonnegative(rows, [2 + 3 * x for x in range(10)]) == pytest.approx([2, 3])
    # The best unconstrained slope is negative: the constrained fit drops it.
    assert fit_nonnegative(rows, [5 - 0.1 * x for x in range(10)]) == pytest.approx([4.55, 0])


def test_concurrency_is_the_time_averaged_load_during_each_span() -> None:
    attempts = [(0.0, 4.0), (1.0, 2.0), (2.0, 6.0)]
    # (0, 4): 4 s of its own, 1 s of (1, 2) and 2 s of (2, 6): 7 / 4.
    assert concurrency(attempts, attempts) == [1.75, 2.0, 1.5]


def test_pausing_generation_during_a_sync_stops_its_clock_and_its_tokens() -> None:
    # 10 s of work at 1 token/s; a 3 s sync from t = 4 pauses it: it ends at 13,
    # with 4 tokens of version 0 and 6 of version 1 (none sampled while paused).
    engine = SimEngine(Constant(10.0), rollout_slots=2, weight_sync_s=3.0, tokens_per_s=1.0,
                       pause_during_sync=True)

    async def main() -> tuple[GroupResult, float, GroupResult, float]:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(engine.generate(GenerationRequest(
            group_id="a", prompt=Prompt(0, ""), num_generations=1, start_weight=0)))
        await advance(4.0)
        sync = asyncio.ensure_future(engine.update_weights(None, 1))
        await advance(1.0)  # a group that starts while paused waits for the sync
        second = await engine.generate(GenerationRequest(
            group_id="b", prompt=Prompt(1, ""), num_generations=1, start_weight=0))
        t_second = loop.time()
        await sync
        return await first, 0.0, second, t_second

    first, _, second, t_second = run_virtual(main(), loop="jump")
    assert first.completions[0].versions == ((0, 4), (1, 6))
    assert second.completions[0].versions == ((1, 10),) and t_second == 17.0
    assert engine.busy_slot_s == pytest.approx(13.0 + 12.0)


def test_calibration_recovers_the_costs_and_predicts_another_sampler(tmp_path: Path) -> None:
    cfg_a = run_config({"name": "in_order", "max_lookahead_versions": 1}, capacity=16)
    cfg_b = run_config({"name": "windowed", "max_staleness_versions": 2}, capacity=24, steps=30)
    write_run(cfg_a, tmp_path / "a")
    summary_b = write_run(cfg_b, tmp_path / "b")

    cal = calibrate(tmp_path / "a")
    fit = cal.config.simulate
    assert fit is not None
    lat = fit.generation_latency_s
    assert lat.distribution == "tokens" and fit.pause_generation_during_sync
    # The load each group decoded under is only known to the fit as the number
    # of groups generating (some of them still before their first token): the
    # per-token costs come out within 10%, the trainer's exactly.
    for key, value in TRUTH.items():
        assert getattr(lat, key) == pytest.approx(value, rel=0.1), key
    for key, value in TRAIN.items():
        assert getattr(fit, key) == pytest.approx(value, rel=1e-6), key
    assert fit.rollout_slots == 16 and fit.steps == 40  # 64 sequences / 4 per group
    assert cal.facts["latency_r2"] > 0.99

    # The calibrated block predicts run b, another sampler and window.
    cfg = load_config(tmp_path / "b" / "config.yaml")
    predicted = simulate(cfg.model_copy(update={"simulate": fit.model_copy(
        update={"steps": 30})}))
    measured = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps_per_s(predicted.records) == pytest.approx(steps_per_s(measured), rel=0.1)
    assert predicted.staleness_mean == pytest.approx(summary_b["staleness_mean"], rel=0.1)


def test_calibration_charges_the_time_after_syncs_that_abort_to_the_aborts(
        tmp_path: Path) -> None:
    # windowed s=0 aborts at every sync; each abort call takes 0.3 s of the train
    # pump's time, which the fit finds between one sync and the next step.
    cfg = run_config({"name": "windowed", "max_staleness_versions": 0}, capacity=24, steps=20)
    write_run(cfg, tmp_path / "a", abort_s=0.3)
    fit = calibrate(tmp_path / "a").config.simulate
    assert fit is not None
    assert fit.abort_s == pytest.approx(0.3, rel=0.05)
    assert fit.train_step_s == pytest.approx(TRAIN["train_step_s"], rel=0.05)


def test_cli_writes_a_config_that_simulates(tmp_path: Path, capsys) -> None:
    write_run(run_config({"name": "in_order", "max_lookahead_versions": 1}, capacity=16,
                         steps=12), tmp_path / "a")
    out = tmp_path / "cal.yaml"
    assert main(["simulate", "--calibrate", str(tmp_path / "a"), "--out", str(out),
                 "simulate.steps=5"]) == 0
    text = capsys.readouterr().out
    assert "calibrated on" in text and str(out) in text
    assert load_config(out).simulate.steps == 5
    assert main(["simulate", "--config", str(out), "--json", "--no-plots", "--run-dir",
                 str(tmp_path / "sim")]) == 0
    assert json.loads(capsys.readouterr().out)[0]["steps"] == 5


def test_a_directory_without_a_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no config\.yaml there"):
        calibrate(tmp_path)
    write_run(run_config({"name": "in_order", "max_lookahead_versions": 1}, capacity=16,
                         steps=4), tmp_path / "a")
    lines = (tmp_path / "a" / "ledger.jsonl").read_text().splitlines()
    old = [{k: v for k, v in json.loads(x).items() if k not in ("gen_start", "tokens")}
           for x in lines]
    (tmp_path / "a" / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    with pytest.raises(ConfigError, match="generation timings and tokens"):
        calibrate(tmp_path / "a")


@pytest.mark.e2e
def test_a_run_too_short_to_fit_is_refused_naming_the_steps_needed(tmp_path: Path) -> None:
    """Issue 28, item 9: a 2-step run was fitted (R^2 0.00) and the command exited 0.
    A real ``asyncrl simulate`` process: the exit status and the one line it prints."""
    import os
    import subprocess
    import sys

    write_run(run_config({"name": "in_order", "max_lookahead_versions": 1}, capacity=16,
                         steps=2), tmp_path / "short")
    assert len((tmp_path / "short" / "metrics.jsonl").read_text().splitlines()) == 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)}
    proc = subprocess.run([sys.executable, "-m", "asyncrl", "simulate", "--calibrate",
                           str(tmp_path / "short")], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "metrics.jsonl has 2 training step(s), a fit needs at least 5" in line, line
    assert not (tmp_path / "short" / "simulate.yaml").exists()


def _with(cfg: RunConfig, **policy: object) -> RunConfig:
    tree = cfg.model_dump(mode="json")
    tree["policy"].update(policy)
    return config_from_dict(tree)


def test_calibration_says_what_the_run_could_not_inform(tmp_path: Path, capsys) -> None:
    """nu3 items 2 and 3: a quickstart run (every completion 2 tokens, engine and
    trainer on one CPU) printed "generation goes on" and a stall coefficient of
    14.96 where the fit could not tell, an R^2 of -0.00 without a word, and no
    word of the contention in every fitted cost."""
    cfg = run_config({"name": "in_order", "max_lookahead_versions": 1}, capacity=16, steps=12)
    tree = cfg.model_dump(mode="json")
    tree["simulate"]["generation_latency_s"]["lengths"] = [[2, 2.0]] * 10
    tree["policy"]["generation"]["max_new_tokens"] = 2
    write_run(config_from_dict(tree), tmp_path / "a")
    cal = calibrate(tmp_path / "a")
    assert cal.facts["pause_source"] == "engine default"
    assert not cal.config.simulate.pause_generation_during_sync  # the local engine's default
    text = cal.describe()
    assert ("(generation goes on: the local engine's known behaviour, the fit cannot tell)"
            in text)
    pause, latency, shared = cal.facts["warnings"]
    assert "the fit cannot tell whether generation pauses" in pause and "set to false" in pause
    assert "the latency model carries no information" in latency
    assert "every group's longest completion had 2 tokens (policy.generation." in latency
    assert "shared the CPU" in shared and "docs/simulate.md, section 8" in shared
    assert all(f"warning: {w}" in text for w in cal.facts["warnings"])
    # --json: the same as data, and on stderr for a reader of the pipe.
    assert main(["simulate", "--calibrate", str(tmp_path / "a"), "--out",
                 str(tmp_path / "cal.yaml"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["warnings"] == cal.facts["warnings"]
    assert err.count("asyncrl simulate --calibrate: warning: ") == 3


def test_a_run_that_informs_the_fit_gets_no_warning(tmp_path: Path) -> None:
    # Lengths and load vary, syncs fall inside generations, and the engine has a
    # device of its own.
    cfg = run_config({"name": "in_order", "max_lookahead_versions": 1}, capacity=16, steps=12)
    write_run(_with(cfg, engine_device="cuda:1"), tmp_path / "a")
    cal = calibrate(tmp_path / "a")
    assert cal.facts["pause_source"] == "fit" and cal.facts["warnings"] == []
    assert "(generation pauses: fitted, stall coefficient 1." in cal.describe()


def test_an_implausible_stall_coefficient_is_called_unreliable() -> None:
    cfg = run_config({"name": "in_order", "max_lookahead_versions": 1}, capacity=16)
    facts = {"pause_source": "fit", "sync_stall_coefficient": 14.96,
             "sync_in_generation_frac": 0.2, "latency_r2": 0.9, "latency_mean_s": 1.0}
    (warning,) = calibration_warnings(_with(cfg, engine_device="cuda:1"), True, facts, [3, 5])
    assert "stall coefficient 14.96 is far outside 0 to 1" in warning
    assert "an unreliable estimate" in warning
    facts["sync_stall_coefficient"] = 0.97
    assert calibration_warnings(_with(cfg, engine_device="cuda:1"), True, facts, [3, 5]) == []


@pytest.mark.parametrize("policy, backend, shared", [
    ({}, "local", "the CPU"),
    ({"engine_device": "cpu"}, "local", "the CPU"),
    ({"engine_device": "cuda:1"}, "local", None),
    ({"device": "cuda"}, "local", "one device (cuda:0)"),
    ({"device": "cuda:0", "engine_device": "cuda:1"}, "local", None),
    ({}, "ray", "the CPU (if Ray placed them on one machine)"),
    ({"device": "cuda"}, "ray", None),  # each worker sees only its own GPUs
    ({"engine": "vllm"}, "local", None),  # vLLM picks its own device
])
def test_the_shared_device_is_read_from_the_recorded_config(policy, backend, shared) -> None:
    cfg = _with(run_config({"name": "in_order", "max_lookahead_versions": 1}, capacity=16),
                **policy)
    tree = cfg.model_dump(mode="json")
    tree["cluster"]["backend"] = backend
    assert shared_device(config_from_dict(tree)) == shared
