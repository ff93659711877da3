"""Issue 12, case 11: progress stays visible when stderr is not a terminal."""

from __future__ import annotations

import io
import math
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.metrics.progress import Eta, ProgressLines, ProgressSink, progress_sink


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def record(step: int, t: float) -> dict:
    return {"step": step, "wall_time_s": t, "step_time_s": 1.0, "reward_mean": 0.25 * (step % 4),
            "staleness_mean": 1.0, "groups_trained": 8}


@pytest.mark.parametrize(("mode", "stream", "kind"), [
    ("auto", io.StringIO(), ProgressLines), ("always", io.StringIO(), ProgressLines),
    ("lines", Terminal(), ProgressLines), ("auto", Terminal(), ProgressSink),
    ("never", io.StringIO(), type(None)),
])
def test_the_mode_and_the_stream_pick_the_display(mode, stream, kind) -> None:
    sink = progress_sink(mode, 10, stream=stream)
    assert isinstance(sink, kind)
    if sink is not None:
        sink.close()


def test_lines_come_every_interval_and_at_the_end() -> None:
    out = io.StringIO()
    sink = ProgressLines(10, every_s=3.0, stream=out)
    for step in range(10):  # one step per second of run time
        sink.write(record(step, step + 1.0))
    lines = out.getvalue().splitlines()
    assert [line.split()[3] for line in lines] == ["1/10", "4/10", "7/10", "10/10"]
    assert lines[1] == ("asyncrl train: step 4/10 (40%)  reward 0.750  staleness 1.00  "
                        "8.0 groups/s  elapsed 4s  eta 6s")
    assert lines[-1].endswith("eta 0s")


def test_a_resumed_run_counts_rate_and_eta_from_its_own_start() -> None:
    out = io.StringIO()
    sink = ProgressLines(100, start_step=50, every_s=0.0, stream=out)
    sink.write(record(50, 1000.0))  # wall time continues the run it resumes
    sink.write(record(51, 1002.0))
    sink.write(record(52, 1004.0))
    last = out.getvalue().splitlines()[-1]
    # 24 groups in 5 s (from the start of this process's first step); 2 s a step
    # after the first, 47 steps left.
    assert "step 53/100 (53%)" in last and "4.8 groups/s" in last and "eta 1m34s" in last


def test_the_eta_leaves_out_the_first_step_and_waits_for_two_more() -> None:
    """Issue 28, item 9: a first step of 60 s (vLLM's warm-up) made the ETA of a
    run of 1 s steps read hours. The records' run clock is the (fake) clock here."""
    eta = Eta(100)
    assert math.isnan(eta.update(1, 60.0))  # the first step: no pace yet
    assert math.isnan(eta.update(2, 61.0))  # one step after it: not yet
    assert eta.update(3, 62.0) == pytest.approx(97.0)  # 1 s a step, 97 steps left
    assert eta.update(10, 75.0) == pytest.approx(90 * 15 / 9)  # the pace since step 1
    out = io.StringIO()
    sink = ProgressLines(100, every_s=0.0, stream=out)
    for step, t in enumerate((60.0, 61.0, 62.0)):
        sink.write({**record(step, t), "step_time_s": 60.0 if step == 0 else 1.0})
    assert [line.split()[-1] for line in out.getvalue().splitlines()] == ["-", "-", "1m37s"]


def test_the_bar_shows_the_same_eta() -> None:
    from rich.console import Console

    out = Terminal()
    sink = ProgressSink(100, console=Console(file=out, force_terminal=False, width=200))
    for step, t in enumerate((60.0, 61.0, 62.0)):
        sink.write(record(step, t))
    sink.close()  # draws the bar's last state
    assert "step    3/100" in out.getvalue() and "eta 1m37s" in out.getvalue(), out.getvalue()


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["auto", "always"])
def test_train_redirected_prints_progress_lines(tmp_path: Path, mode: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "grpo: {num_prompts_per_step: 4, num_generations_per_prompt: 4, max_num_steps: 3}\n"
        "async_rl: {max_buffered_rollouts: 8, min_groups_for_streaming_train: 4}\n"
        "policy: {model: {hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}}\n"
        f"logging: {{tensorboard: false, plots: false, progress: {mode}, progress_every_s: 0}}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "asyncrl", "train", "--config", str(config),
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("asyncrl train: step ")]
    assert [x.split()[3] for x in lines] == ["1/3", "2/3", "3/3"], proc.stderr
    for line in lines:
        for part in ("reward ", "staleness ", " groups/s", "eta "):
            assert part in line
