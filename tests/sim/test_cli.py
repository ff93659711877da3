"""``asyncrl simulate`` end to end through the CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from asyncrl.cli import main
from asyncrl.sampling import WindowedSampler
from asyncrl.sim.report import TABLE_COLUMNS
from asyncrl.sim.result import custom_window
from asyncrl.sim.runner import ROW_KEYS

CONFIG = {
    "seed": 7,
    "grpo": {"num_prompts_per_step": 6, "num_generations_per_prompt": 2},
    "async_rl": {
        "sampler": {"name": "in_order", "max_lookahead_versions": 1},
        "max_buffered_rollouts": 12,
        "min_groups_for_streaming_train": 3,
        "max_inflight_prompts": 12,
    },
    "simulate": {
        "steps": 12,
        "rollout_slots": 6,
        "generation_latency_s": {"distribution": "lognormal", "median": 5.0, "sigma": 0.8},
        "train_step_s": 4.0,
        "weight_sync_s": 0.5,
    },
}


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def run_json(capsys, *argv: str) -> list[dict]:
    capsys.readouterr()
    assert main(["simulate", *argv, "--json", "--no-plots"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def test_json_output_is_a_list_with_exactly_the_row_keys(config_file, tmp_path, capsys) -> None:
    rows = run_json(capsys, "--config", str(config_file), "--run-dir", str(tmp_path / "r"))
    assert len(rows) == 1
    assert list(rows[0]) == list(ROW_KEYS)
    assert rows[0]["sampler"] == "in_order" and rows[0]["steps"] == 12


def test_same_config_and_seed_give_identical_json(config_file, tmp_path, capsys) -> None:
    argv = ["--config", str(config_file), "--compare", "windowed,ready_first"]
    first = run_json(capsys, *argv, "--run-dir", str(tmp_path / "a"))
    second = run_json(capsys, *argv, "--run-dir", str(tmp_path / "b"))
    assert first == second
    other = run_json(capsys, *argv, "--run-dir", str(tmp_path / "c"), "seed=8")
    assert other != first


def test_compare_gives_one_row_per_policy_in_order(config_file, tmp_path, capsys) -> None:
    rows = run_json(capsys, "--config", str(config_file), "--run-dir", str(tmp_path / "r"),
                    "--compare", "in_order,weight_fifo,windowed,ready_first", "--steps", "5")
    assert [r["sampler"] for r in rows] == ["in_order", "weight_fifo", "windowed", "ready_first"]
    assert all(list(r) == list(ROW_KEYS) and r["steps"] == 5 for r in rows)
    saved = json.loads((tmp_path / "r" / "results.json").read_text())
    assert [r["sampler"] for r in saved["results"]] == [r["sampler"] for r in rows]
    assert saved["bound"]["limited_by"] in ("trainer", "generation")


def test_overrides_apply(config_file, tmp_path, capsys) -> None:
    rows = run_json(capsys, "--config", str(config_file), "--run-dir", str(tmp_path / "r"),
                    "simulate.steps=4", "simulate.train_step_s=100")
    assert rows[0]["steps"] == 4
    assert rows[0]["virtual_time_s"] > 4 * 100


def test_table_plots_and_run_dir(config_file, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(["simulate", "--config", str(config_file), "--run-dir", str(run_dir),
                 "--compare", "in_order,windowed", "--steps", "6"]) == 0
    out = capsys.readouterr().out
    assert "in_order" in out and "windowed" in out
    assert "physical bound:" in out
    for name in ("results.json", "config.yaml", "comparison.png", "timeline_in_order.png",
                 "timeline_windowed.png", "staleness_in_order.png"):
        assert (run_dir / name).is_file(), name


def test_a_note_is_marked_in_the_table_and_printed_whole_under_it(config_file, tmp_path,
                                                                 capsys) -> None:
    """A new user's trial: at 160 columns (output to a pipe) the note column got a
    few characters, one word a line. The row now holds a mark, the note a line."""
    assert main(["simulate", "--config", str(config_file), "--run-dir", str(tmp_path / "r"),
                 "--compare", "in_order,windowed", "--steps", "4", "--no-plots",
                 "async_rl.sampler.name=windowed", "async_rl.sampler.max_staleness_versions=1",
                 "async_rl.max_buffered_rollouts=6", "async_rl.max_inflight_prompts=6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    [row] = [line for line in lines if line.startswith("│ in_order")]
    assert row.rstrip(" │").endswith("(1)"), row
    [windowed] = [line for line in lines if line.startswith("│ windowed")]
    assert windowed.split("│")[-2].strip() == "", windowed  # no note, no mark
    below = lines.index("(1) in_order: max_buffered_rollouts raised 6->12 (policy needs 12)")
    assert lines[below - 1].startswith("└")  # right under the table


class AWindowedSamplerWithAVeryLongClassName(WindowedSampler):
    """A custom sampler (target ``tests.sim.test_cli:...``) with a long name."""


def test_a_long_custom_sampler_name_cuts_no_header_and_its_window_is_noted(
        config_file, tmp_path, capsys) -> None:
    """A new user's trial: a long custom target squeezed the headers to ``windo``,
    ``virtual tim``, ``efficienc``, and its window showed ``-`` with no note."""
    target = f"{__name__}:{AWindowedSamplerWithAVeryLongClassName.__name__}"
    assert main(["simulate", "--config", str(config_file), "--run-dir", str(tmp_path / "r"),
                 "--steps", "4", "--no-plots",
                 f"async_rl.sampler={{name: custom, target: '{target}', "
                 "max_staleness_versions: 2}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    [header] = [line for line in lines if line.startswith("┃ policy")]
    assert [c.strip() for c in header.strip("┃").split("┃")] == list(TABLE_COLUMNS)
    top = lines.index(header) + 2  # below the header's rule
    row = lines[top].split("│")
    assert row[2].strip() == "2" and row[-2].strip() == "(1)", lines[top]
    wrapped = "".join(line.split("│")[1].strip() for line in lines[top:]
                      if line.startswith("│"))
    assert wrapped == target  # wrapped, whole
    assert f"(1) {target}: window: the custom sampler's own (its window attribute)" in lines


def test_a_custom_sampler_without_a_window_says_so() -> None:
    assert custom_window(object()) == (
        None, "window: not known (the custom sampler has no window attribute)")


def test_the_autopilot_is_on_record_in_the_output_and_the_run_dir(config_file, tmp_path,
                                                                 capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(["simulate", "--config", str(config_file), "--run-dir", str(run_dir),
                 "--steps", "8", "async_rl.autopilot.enabled=true",
                 "async_rl.autopilot.mode=runtime", "async_rl.autopilot.plan_steps=4",
                 "async_rl.autopilot.warmup_steps=2", "async_rl.autopilot.replan_every_steps=3"
                 ]) == 0
    out = capsys.readouterr().out
    assert "autopilot (runtime): 2 decisions" in out
    rows = [json.loads(line) for line in
            (run_dir / "autopilot_in_order.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 8] and all("candidates" in r for r in rows)
    assert (run_dir / "autopilot_knobs_in_order.png").is_file()


def test_config_without_simulate_block_is_an_error(tmp_path, capsys) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in CONFIG.items() if k != "simulate"}))
    assert main(["simulate", "--config", str(path), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "no 'simulate' block" in err and "generation_latency_s" in err


@pytest.mark.parametrize(("extra", "message"), [
    (["--compare", "in_order,fifo"], "unknown policy 'fifo'"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["simulate.rollout_slots=0"], "rollout_slots"),
    (["async_rl.max_buffered_rollouts=6"], "max_buffered_rollouts=6"),
    (["--compare", "in_order", "async_rl.autopilot.enabled=true",
      "async_rl.autopilot.mode=plan"], "drop --compare to simulate the config's sampler"),
    (["simulate.mode=cohort", "async_rl.autopilot.enabled=true"],
     "set simulate.mode=per_group to simulate the autopilot"),
])
def test_bad_arguments_explain_themselves(config_file, tmp_path, capsys, extra, message) -> None:
    assert main(["simulate", "--config", str(config_file), "--run-dir", str(tmp_path / "r"),
                 "--no-plots", *extra]) == 2
    assert message in capsys.readouterr().err


def test_empirical_latencies_beside_the_config(tmp_path, capsys) -> None:
    (tmp_path / "observed.txt").write_text("4.0\n6.0\n")
    cfg = {**CONFIG, "simulate": {**CONFIG["simulate"],
                                  "generation_latency_s": {"distribution": "empirical",
                                                           "path": "observed.txt"}}}
    path = tmp_path / "emp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    rows = run_json(capsys, "--config", str(path), "--run-dir", str(tmp_path / "r"))
    assert rows[0]["steps"] == 12
    (tmp_path / "observed.txt").write_text("4.0\nslow\n")
    assert main(["simulate", "--config", str(path), "--run-dir", str(tmp_path / "r2")]) == 2
    assert "line 2" in capsys.readouterr().err


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"


def test_the_four_examples_exist() -> None:
    names = {p.stem for p in EXAMPLES.glob("*.yaml")}
    assert {"balanced", "generation_bound", "training_bound", "long_tail"} <= names


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_examples_load_and_run_briefly(example, tmp_path, capsys) -> None:
    rows = run_json(capsys, "--config", str(example), "--run-dir", str(tmp_path / "r"),
                    "--steps", "3")
    assert rows[0]["steps"] == 3


def test_progress_display_follows_policies_and_steps(capsys) -> None:
    from asyncrl.cli.simulate import _progress

    with _progress(True, 2, 5) as (on_start, on_step):
        for name in ("in_order", "windowed"):
            on_start(name)
            for step in range(1, 6):
                on_step(step)
    with _progress(False, 2, 5) as callbacks:
        assert callbacks == (None, None)


def test_failures_are_counted_not_logged_one_by_one(config_file, tmp_path, capsys) -> None:
    assert main(["simulate", "--config", str(config_file), "--run-dir", str(tmp_path / "r"),
                 "--json", "--no-plots", "simulate.failure_rate=0.3",
                 "async_rl.rollout_failure.max_consecutive_dropped_prompts=1000",
                 "async_rl.rollout_failure.on_dropped_prompt=replace",
                 "async_rl.rollout_failure.max_replacement_attempts=1000"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)[0]["steps"] == 12
    assert "retrying" not in captured.err
    saved = json.loads((tmp_path / "r" / "results.json").read_text())["results"][0]
    assert saved["engine"]["failures"] > 0
    assert saved["ledger"]["balanced"]


def _strict_json(text: str):
    """Parse JSON the way non-Python readers do: NaN and Infinity are errors."""
    def refuse(name: str):
        raise AssertionError(f"invalid JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def test_zero_times_give_valid_json_not_a_traceback(tmp_path, capsys) -> None:
    # Issue 12, case 9: every time 0 made steps/h infinite and json.dumps raise.
    cfg = {**CONFIG, "simulate": {"steps": 5, "rollout_slots": 6, "train_step_s": 0,
                                  "weight_sync_s": 0, "generation_latency_s":
                                  {"distribution": "constant", "value": 0}}}
    path = tmp_path / "zero.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "r"
    rows = _strict_json(json.dumps(run_json(capsys, "--config", str(path), "--run-dir", str(out))))
    assert rows[0]["steps_per_hour"] is None and rows[0]["steps"] == 5
    results = _strict_json((out / "results.json").read_text())
    assert results["bound"]["steps_per_hour"] is None
    assert main(["simulate", "--config", str(path), "--run-dir", str(tmp_path / "t")]) == 0
    assert "inf" not in capsys.readouterr().out.split("physical bound")[0]


def test_no_plots_does_not_claim_plots(config_file, tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["simulate", "--config", str(config_file), "--run-dir", str(out),
                 "--no-plots"]) == 0
    text = capsys.readouterr().out
    assert "no plots (--no-plots)" in text and ".png" not in text
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "results.json"]
    assert main(["simulate", "--config", str(config_file), "--run-dir", str(tmp_path / "p")]) == 0
    text = capsys.readouterr().out
    assert "comparison.png" in text and (tmp_path / "p" / "comparison.png").is_file()


def test_help_points_to_the_autopilot_and_its_example_runs(tmp_path, capsys,
                                                            monkeypatch) -> None:
    """``asyncrl simulate --help`` says the simulator runs the autopilot and a
    workload that changes mid-run, and where to read on; its example command
    is a config the simulator accepts, with both in it."""
    from asyncrl.cli.simulate import EPILOG
    from asyncrl.config import load_config

    with pytest.raises(SystemExit) as done:
        main(["simulate", "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # (argparse wraps the lines)
    for words in ("async_rl.autopilot block", "simulate.phases", "docs/autopilot.md"):
        assert words in out, out
    command = EPILOG.split("e.g.: asyncrl simulate ")[1].split()
    monkeypatch.chdir(EXAMPLES.parents[1])  # the example's path is the repository's
    cfg = load_config(command[1], command[2:])
    assert cfg.async_rl.autopilot.enabled and cfg.async_rl.autopilot.mode == "plan"
    assert cfg.simulate is not None and cfg.simulate.phases
    rows = run_json(capsys, *command, "--run-dir", str(tmp_path / "r"), "--steps", "3")
    assert rows[0]["steps"] == 3


def test_a_run_dir_that_holds_a_run_or_a_simulation_is_refused_before_simulating(
        config_file, tmp_path, capsys) -> None:
    # A training run: its config.yaml must survive (a resume reads it), so it is refused
    # even with --overwrite, with nothing written.
    run = tmp_path / "train-run"
    (run / "checkpoints" / "step-000004").mkdir(parents=True)
    (run / "config.yaml").write_text("grpo: {num_prompts_per_step: 8}\n")
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / ".asyncrl.lock").write_text("")  # a run's lock: not listed as content
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for extra in ([], ["--overwrite"]):
        capsys.readouterr()
        assert main(["simulate", "--config", str(config_file), "--run-dir", str(run),
                     "--no-plots", *extra]) == 2
        err = capsys.readouterr().err
        assert "holds a training run" in err and f"--run-dir {run}-2" in err, err
        assert ".asyncrl.lock" not in err
        assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("x")
    assert main(["simulate", "--config", str(config_file), "--run-dir", str(other)]) == 2
    assert "is not empty and holds no simulation" in capsys.readouterr().err

    # An earlier simulation: refused, then replaced with --overwrite, its stale plots gone.
    sim = tmp_path / "sim"
    assert main(["simulate", "--config", str(config_file), "--run-dir", str(sim),
                 "--compare", "windowed,ready_first"]) == 0
    assert (sim / "timeline_ready_first.png").is_file()
    capsys.readouterr()
    assert main(["simulate", "--config", str(config_file), "--run-dir", str(sim)]) == 2
    assert "holds an earlier simulation" in capsys.readouterr().err
    assert main(["simulate", "--config", str(config_file), "--run-dir", str(sim),
                 "--overwrite"]) == 0
    results = json.loads((sim / "results.json").read_text())
    assert [r["sampler"] for r in results["results"]] == ["in_order"]
    assert sorted(p.name for p in sim.iterdir()) == sorted(results["files"])
