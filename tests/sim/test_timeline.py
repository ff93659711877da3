"""Issue 18, case 8: the pump timeline draws every interval the trainer is busy
- chunks, the optimizer step and the weight sync - in training and in
simulation. The optimizer step used to be left out: on ``long_tail`` the
trainer's lane showed thin ticks while the table said it was idle 7.7% of the time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.metrics import plots
from asyncrl.sim.runner import simulate

ROOT = Path(__file__).resolve().parents[2]
STEPS = 10


def trainer_bars(fig) -> list[tuple[float, float]]:
    """(start, end) of every bar drawn on the trainer's row (y from 0)."""
    bars = []
    for collection in fig.axes[0].collections:
        for path in collection.get_paths():
            xs, ys = path.vertices[:, 0], path.vertices[:, 1]
            if ys.min() == 0:
                bars.append((float(xs.min()), float(xs.max())))
    return bars


def test_the_trainer_lane_covers_all_its_busy_time_and_is_drawn(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(ROOT / "examples" / "sim" / "long_tail.yaml")
    result = simulate(cfg, steps=STEPS)
    lane = [i for i in result.timeline if i["kind"] != "gen"]
    busy = sum(i["end"] - i["start"] for i in lane)
    # Busy plus idle is the whole run: nothing the trainer does is missing.
    idle = result.trainer_idle_frac * result.virtual_time_s
    assert busy + idle == pytest.approx(result.virtual_time_s, rel=1e-6)
    steps = [i for i in lane if i["kind"] == "step"]  # train_step_s=25 each
    assert len(steps) == STEPS and all(i["end"] - i["start"] == pytest.approx(25.0)
                                       for i in steps)

    figures = []
    real_save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig)
                        or real_save(fig, path))
    plots.plot_timeline(result.timeline, tmp_path / "timeline.png")
    bars = trainer_bars(figures[0])
    assert sum(end - start for start, end in bars) == pytest.approx(busy, rel=1e-6)
    assert sum(end - start == pytest.approx(25.0) for start, end in bars) == STEPS
