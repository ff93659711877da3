"""``asyncrl simulate --calibrate`` on a real vLLM-CPU run predicts another run.

Calibrated on the shared ``windowed`` run (window 0: generation-bound, every
sync aborts the groups in flight), the simulator predicts the shared
``in_order`` run (lookahead 1: trainer-bound, generation overlapping training):
another sampler, window, buffer and in-flight bound on the same model and task.
Steps per second (of the steady state, from the end of the first step: see
:func:`asyncrl.sim.calibrate.steps_per_s`) must come within 25% of what the
run measured (measured misses on a quiet machine: 5-8%; the two real runs do
not see the same load when other jobs share the cores), mean staleness within
15%.

Opt-in (``tests/heavy.py``): how far the two real runs' speeds drift apart is
the machine's, not the fit's. On this shared 2-core machine the steps/s miss was
5-8% on quiet runs, but 33% with other jobs running and once 35% inside ``make
test`` itself (its second xdist worker loading the cores unevenly between the
two runs). The fit's logic is tested without real time in tests/sim/test_calibrate.py. The
in_order run is shared with tests/e2e/test_vllm_train.py and test_vllm_output.py.
"""

from __future__ import annotations

import pytest

from asyncrl.config import load_config
from asyncrl.sim.calibrate import calibrate, steps_per_s
from asyncrl.sim.runner import simulate
from tests.e2e.vllm_runs import SharedRuns
from tests.heavy import HEAVY

pytestmark = [pytest.mark.e2e, pytest.mark.slow, HEAVY]

RATE_TOLERANCE = 0.25
STALENESS_TOLERANCE = 0.15


def test_calibrated_on_one_vllm_run_the_simulator_predicts_another(
        vllm_runs: SharedRuns) -> None:
    source, target = vllm_runs.get("windowed"), vllm_runs.get("in_order")
    cal = calibrate(source.run_dir)
    fit = cal.config.simulate
    assert fit is not None
    # vLLM pauses its requests while it loads weights (in this run every group
    # that spans a sync is aborted, so the fit cannot see it: vLLM is known to).
    assert fit.pause_generation_during_sync
    assert fit.generation_latency_s.distribution == "tokens"

    cfg = load_config(target.run_dir / "config.yaml")
    assert cfg.async_rl.sampler.name != cal.config.async_rl.sampler.name
    predicted = simulate(cfg.model_copy(update={"simulate": fit.model_copy(
        update={"steps": len(target.records)})}), record_intervals=False)

    measured_rate, predicted_rate = steps_per_s(target.records), steps_per_s(predicted.records)
    measured_staleness = target.summary["staleness_mean"]
    report = (f"steps/s measured {measured_rate:.3f}, predicted {predicted_rate:.3f}; staleness "
              f"measured {measured_staleness:.3f}, predicted {predicted.staleness_mean:.3f}; "
              f"{cal.describe()}")
    assert predicted_rate == pytest.approx(measured_rate, rel=RATE_TOLERANCE), report
    assert predicted.staleness_mean == pytest.approx(measured_staleness,
                                                     rel=STALENESS_TOLERANCE), report
