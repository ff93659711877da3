"""``simulate.phases``: a workload that changes mid-run, and the autopilot in
simulation (issue 38)."""

from __future__ import annotations

import pytest

from asyncrl.config import config_from_dict
from asyncrl.errors import ConfigError
from asyncrl.sim.runner import simulate

from .helpers import periods, sim_config


def _with_phases(cfg, phases, **sim):
    return cfg.model_copy(update={"simulate": cfg.simulate.model_copy(
        update={"phases": config_from_dict({"simulate": {"phases": phases}}).simulate.phases,
                **sim})})


def test_latency_switches_at_the_phase_step() -> None:
    """Synchronous in_order, constant latency: a step is latency + train + sync,
    so the per-step period jumps exactly where the phase starts."""
    cfg = sim_config(policy="in_order", window=0, steps=8, latency=10.0, train_step_s=3.0,
                     weight_sync_s=1.0)
    cfg = _with_phases(cfg, [{"at_step": 5, "generation_latency_s":
                              {"distribution": "constant", "value": 40.0}}])
    result = simulate(cfg)
    assert periods(result) == pytest.approx([14.0] * 5 + [44.0] * 3)


def test_phases_are_checked() -> None:
    base = {"generation_latency_s": {"distribution": "constant", "value": 1.0}}
    with pytest.raises(ConfigError, match="at_step must strictly increase"):
        config_from_dict({"simulate": {"phases": [{"at_step": 5, **base},
                                                  {"at_step": 5, **base}]}})
    with pytest.raises(ConfigError, match="phases need mode: per_group"):
        config_from_dict({"simulate": {"mode": "cohort", "phases": [{"at_step": 5, **base}]}})
    with pytest.raises(ConfigError, match="generation_latency_s"):
        config_from_dict({"simulate": {"phases": [{"at_step": 5, "generation_latency_s": {
            "distribution": "empirical", "path": "x.json"}}]}})


def test_aimd_runs_in_simulation_and_keeps_the_ledger() -> None:
    """Start with an in-flight bound of 2 on a fleet of 16 slots: the trainer
    idles, aimd grows the bound, and the run is faster than the fixed one."""
    def run(autopilot):
        cfg = sim_config(policy="windowed", window=2, n=8, steps=30, slots=16, latency=10.0,
                         capacity=24, inflight=2, min_chunk=8,
                         **({"autopilot": autopilot} if autopilot else {}))
        return simulate(cfg)

    fixed, tuned = run(None), run({"enabled": True, "increase": 4})
    assert tuned.ledger["balanced"]
    assert tuned.virtual_time_s < 0.6 * fixed.virtual_time_s


def test_the_knobs_plot_marks_where_the_workload_and_the_fleet_changed(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncrl simulate's knobs plot draws the phase at its step and a fleet
    change at the first step that ended after it, across every panel."""
    from asyncrl.metrics import plots
    from asyncrl.sim.report import write_run_dir

    kept = {}
    real_save = plots._save

    def save(fig, path):
        kept[path.name] = fig
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", save)
    cfg = sim_config(policy="windowed", window=2, n=8, steps=12, slots=16, latency=10.0,
                     capacity=24, inflight=2, min_chunk=8,
                     autopilot={"enabled": True, "increase": 4})
    fleet = config_from_dict({"simulate": {"fleet": [{"at_s": 45.0, "rollout_slots": 8}]}})
    cfg = _with_phases(cfg, [{"at_step": 8, "generation_latency_s":
                              {"distribution": "constant", "value": 30.0}}],
                       fleet=fleet.simulate.fleet)
    result = simulate(cfg)
    write_run_dir([result], tmp_path, cfg)
    times = [r["wall_time_s"] for r in result.records]
    fleet_step = next(i for i, t in enumerate(times) if t >= 45.0)
    assert 0 < fleet_step < 8  # (the check below tells the two lines apart)
    fig = kept["autopilot_knobs_windowed.png"]
    for ax in fig.axes:
        crossing = sorted(ln.get_xdata()[0] for ln in ax.get_lines()
                          if ln.get_linestyle() == "--")
        assert crossing == [fleet_step, 8]
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "workload phase 2 (step 8)" in labels
    assert f"fleet: 8 slots (step {fleet_step})" in labels
