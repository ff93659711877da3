"""What the PNG plots show: titles with the run name, the timeline legend, percentages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.metrics import plots
from asyncrl.metrics.report import write_plots


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """Keep every figure the plot functions save, by file name."""
    kept: dict[str, object] = {}
    real_save = plots._save

    def save(fig, path: Path) -> Path:
        kept[path.name] = fig
        fig.canvas.draw()  # texts and legends are laid out, as in the real file
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", save)
    return kept


def _texts(fig) -> list[str]:
    out = [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        out.append(ax.get_title())
        legend = ax.get_legend()
        if legend is not None:
            out.extend(t.get_text() for t in legend.get_texts())
    return out


def test_run_plots_carry_the_run_name_and_the_timeline_a_legend(tmp_path, figures) -> None:
    run = tmp_path / "my-run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "wall_time_s": i, "reward_mean": None if i == 1 else i / 4,
                    "staleness_hist": {"1": 2}}) + "\n" for i in range(4)))
    (run / "timeline.json").write_text(json.dumps([
        {"kind": "gen", "lane": 0, "start": 0.0, "end": 1.0, "label": "ok"},
        {"kind": "gen", "lane": 1, "start": 0.0, "end": 0.5, "label": "aborted"},
        {"kind": "train", "lane": 0, "start": 1.0, "end": 1.5, "label": "0"},
        {"kind": "step", "lane": 0, "start": 1.5, "end": 1.55, "label": "0"},
        {"kind": "sync", "lane": 0, "start": 1.55, "end": 1.6, "label": "0"},
    ]))
    write_plots(run)
    assert set(figures) == {"reward_vs_step.png", "reward_vs_time.png", "staleness_hist.png",
                            "pump_timeline.png"}
    for name, fig in figures.items():
        assert any(t.startswith("my-run: ") for t in _texts(fig)), name
    legend = _texts(figures["pump_timeline.png"])
    assert {"generation", "generation aborted", "training", "optimizer step",
            "weight sync"} <= set(legend)


def test_comparison_shows_efficiency_in_percent(tmp_path, figures) -> None:
    rows = [{"sampler": "in_order", "efficiency": 0.5, "trainer_idle_frac": 0.25,
             "generator_util": 1.0, "waste_frac": 0.0, "staleness_mean": 0.8}]
    plots.plot_comparison(rows, tmp_path / "comparison.png", title="sim-x: policies")
    fig = figures["comparison.png"]
    by_title = {ax.get_title(): ax for ax in fig.axes}
    efficiency = by_title["efficiency (%)"]
    assert efficiency.patches[0].get_height() == pytest.approx(50.0)
    assert by_title["staleness mean (versions)"].patches[0].get_height() == pytest.approx(0.8)
    assert "sim-x: policies" in _texts(fig)


def test_the_reward_plots_draw_the_eval_curve_where_the_run_evaluated(tmp_path, figures) -> None:
    records = [{"step": s, "wall_time_s": 0.5 * s, "reward_mean": s / 10,
                **({"eval/reward_mean": 0.05 * s} if s % 3 == 2 else {})} for s in range(9)]
    plots.plot_reward(records, tmp_path, target=0.9, run_name="r")
    for name in ("reward_vs_step.png", "reward_vs_time.png"):
        ax = figures[name].axes[0]
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert "eval" in _texts(figures[name])
        xs, ys = lines["eval"].get_data()
        assert list(ys) == pytest.approx([0.1, 0.25, 0.4])
        assert list(xs) == ([2, 5, 8] if name == "reward_vs_step.png" else [1.0, 2.5, 4.0])


def test_the_training_curves_show_what_the_run_logged(tmp_path, figures) -> None:
    records = [{"step": s, "train/loss": 1.0 / (s + 1), "train/entropy": 2.0 - s / 10,
                "train/grad_norm": 0.5 + s, "rollout/completion_len_mean": 10.0 + s,
                "rollout/completion_len_p50": 9 + s, "rollout/completion_len_p90": 14 + s,
                "rollout/completion_len_max": 20, "rollout/completion_clipped_frac": s / 10,
                "step_time_s": 3.0, "trainer_idle_s": 1.0, "time/train_s": 1.25,
                "time/optimizer_step_s": 0.5, "weight_sync_s": 0.25, "time/eval_s": 0.0,
                "time/other_s": 0.0} for s in range(5)]
    plots.plot_training_curves(records, tmp_path, run_name="r")
    # No train/kl in the records (kl_coef 0): no KL plot.
    assert set(figures) == {"loss_vs_step.png", "entropy_vs_step.png", "grad_norm_vs_step.png",
                            "completion_len_vs_step.png", "step_time_vs_step.png"}
    xs, ys = figures["loss_vs_step.png"].axes[0].get_lines()[0].get_data()
    assert list(xs) == [0, 1, 2, 3, 4] and list(ys) == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4, 1 / 5])
    assert "r: loss vs step" in _texts(figures["loss_vs_step.png"])
    lengths = _texts(figures["completion_len_vs_step.png"])
    assert {"max", "p90", "mean", "p50", "clipped (right)"} <= set(lengths)
    split = figures["step_time_vs_step.png"].axes[0]
    tops = {}
    for bar in split.patches:  # stacked: each step's bars reach its step time
        x = round(bar.get_x() + bar.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    assert tops == pytest.approx(dict.fromkeys(range(5), 3.0))
    assert "training (forward/backward)" in _texts(figures["step_time_vs_step.png"])


def _knob_panels(fig) -> dict[str, object]:
    """The knobs plot's panels by the first line of their y label."""
    return {ax.get_ylabel().split("\n")[0]: ax for ax in fig.axes}


def _line(ax, label_start: str):
    (line,) = [ln for ln in ax.get_lines() if ln.get_label().startswith(label_start)]
    return line


def test_the_knobs_plot_gives_each_knob_its_own_panel(tmp_path, figures) -> None:
    """In-flight bound and capacity in the hundreds, the window in single
    versions: one panel each on a shared step axis, drawn as steps, a marker
    per applied change, the workload's phase across every panel, and legends
    beside the panels rather than over the lines."""
    inflight = [192, 192, 81, 81, 310, 310]
    capacity = [192, 192, 192, 81, 310, 310]
    window = [2, 3, 3, 3, 3, 14]
    records = [{"step": s, "autopilot/max_inflight_prompts": float(inflight[s]),
                "autopilot/max_buffered_rollouts": float(capacity[s]),
                "autopilot/window": float(window[s])} for s in range(6)]
    plots.plot_training_curves(records, tmp_path, run_name="r")
    assert "autopilot_knobs_vs_step.png" in figures
    plots.plot_knobs(records, tmp_path / "k.png", "r", marks=[(3, "workload phase 2")])
    fig = figures["k.png"]
    panels = _knob_panels(fig)
    assert list(panels) == ["in-flight bound", "buffer capacity", "window"]
    top, middle, bottom = fig.axes
    assert all(ax.get_shared_x_axes().joined(top, ax) for ax in fig.axes)
    assert [ax.get_xlabel() for ax in fig.axes] == ["", "", "training step"]
    assert top.get_title() == "r: autopilot knobs vs step"
    for ax, values, changed in ((top, inflight, [2, 4]), (middle, capacity, [3, 4]),
                                (bottom, window, [1, 5])):
        held = _line(ax, "in force")
        assert held.get_drawstyle() == "steps-post"
        assert list(held.get_ydata()) == values
        markers = _line(ax, "change applied")
        assert list(markers.get_xdata()) == changed
        assert list(markers.get_ydata()) == [values[s] for s in changed]
        assert markers.get_label() == f"change applied ({len(changed)})"
        phase = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [3, 3]]
        assert len(phase) == 1  # the phase line crosses every panel
        legend = ax.get_legend().get_window_extent()
        assert legend.x0 >= ax.get_window_extent().x1  # beside the panel, not over it
    assert "workload phase 2" in _texts(fig)
    assert fig.get_size_inches()[1] >= 1.5 * len(fig.axes)


def test_the_knobs_plot_without_a_window_has_two_panels(tmp_path, figures) -> None:
    records = [{"step": s, "autopilot/max_inflight_prompts": 8.0 + 4 * (s >= 2),
                "autopilot/max_buffered_rollouts": 16.0} for s in range(4)]
    plots.plot_knobs(records, tmp_path / "k.png")
    assert list(_knob_panels(figures["k.png"])) == ["in-flight bound", "buffer capacity"]
    assert list(_line(figures["k.png"].axes[0], "change applied").get_xdata()) == [2]
