"""Simulation: the real controller against simulated backends, under virtual time.

``asyncrl.sim.clock`` (virtual-time event loops) is imported by tests that do
not need the rest, so the names below load lazily: importing the package does
not import the controller.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "simulate": "asyncrl.sim.runner",
    "compare": "asyncrl.sim.runner",
    "physical_bound": "asyncrl.sim.runner",
    "SimResult": "asyncrl.sim.result",
    "Bound": "asyncrl.sim.result",
    "SimEngine": "asyncrl.sim.backends",
    "SimTrainer": "asyncrl.sim.backends",
    "SimTask": "asyncrl.sim.backends",
    "make_latency_model": "asyncrl.sim.latency",
    "run_virtual": "asyncrl.sim.clock",
    "JumpClockLoop": "asyncrl.sim.clock",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'asyncrl.sim' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
