"""The CPU run of bench_autopilot.py: the autopilot in real training runs.

The long-tail task (examples/long_tail.yaml) on the local engine, in real time:

1. **calibrate**: a short run at the example's own setting, fitted with
   ``asyncrl simulate --calibrate``'s code;
2. **phase 1's pick**: the ``--frontier`` grid on the calibrated simulator, the
   most throughput among the settings that keep the bounds (the oracle of the
   simulated part, on the calibrated workload);
3. **rounds** (``--cpu-repeats``): in each, the pick run fixed and with
   each autopilot mode from it, one after the other (the machine's load
   drifts, so the runs of a round share it; the order rotates by round): throughput in groups trained per second past the first
   two steps, staleness p95 of the trained groups, waste, the bounds, the
   autopilot's changes, the ledger.

The ratio of a mode's run to the fixed run of its round is the number; a real
run has no virtual clock, so it carries the machine's noise (the rounds' spread
says how much). On a small machine the model-based modes' planner shares the
cores with the run it plans for: that cost is in the ratio too.
"""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from asyncrl.cli import main as cli
from asyncrl.sim.calibrate import calibrate

#: Quiet, short, nothing written the benchmark does not read.
QUIET = ["logging.progress=never", "logging.plots=false", "logging.tensorboard=false",
         "checkpoint.every_steps=0"]


def train(config: Path, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    """One ``asyncrl train`` in this process; its step records and summary."""
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli(["train", "--config", str(config), "--run-dir", str(run_dir),
                    *QUIET, *overrides])
    if code != 0:
        raise SystemExit(f"asyncrl train {run_dir} ended with exit code {code}")
    records = [json.loads(line)
               for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    journal = run_dir / "autopilot.jsonl"
    decisions = ([json.loads(line) for line in journal.read_text().splitlines()]
                 if journal.exists() else [])
    return {"records": records, "decisions": decisions,
            "summary": json.loads((run_dir / "summary.json").read_text())}


def facts(run: dict[str, Any], skip: int, bounds: dict[str, float]) -> dict[str, Any]:
    """Throughput past the first ``skip`` steps, staleness p95, waste, bounds, changes."""
    records, summary = run["records"], run["summary"]
    part = records[skip:]
    span = part[-1]["wall_time_s"] - records[skip - 1]["wall_time_s"]
    trained = sum(r["groups_trained"] for r in part)
    stale = sorted(int(k) for r in part for k, c in r["staleness_hist"].items()
                   for _ in range(c))
    ledger = summary["ledger"]
    wasted = ledger["evicted"] + ledger["aborted"]
    out = {"throughput": trained / span,
           "staleness_p95": float(stale[int(0.95 * (len(stale) - 1))]) if stale else 0.0,
           "waste_frac": wasted / ledger["dispatched"] if ledger["dispatched"] else 0.0,
           "balanced": bool(ledger["balanced"]),
           "changes": (summary.get("autopilot") or {}).get("changes", 0),
           # why the autopilot did what it did last (the run's autopilot.jsonl)
           "last": (f"{run['decisions'][-1]['action']}: {run['decisions'][-1]['reason']}"
                    if run["decisions"] else "")}
    out["kept"] = all(out[k] <= b for k, b in bounds.items())
    return out


def pick(run_dir: Path, steps: int, oracle: Any) -> Any:
    """Phase 1's ``--frontier`` pick on the run's calibrated simulator."""
    cal = calibrate(run_dir)
    sim = cal.config.simulate
    assert sim is not None
    cfg = cal.config.model_copy(update={"simulate": sim.model_copy(update={"steps": steps})})
    cand, tput = oracle(cfg, steps)
    print(f"calibrated on {cal.facts['steps']} steps: measured "
          f"{cal.facts['measured_steps_per_s']:.3f} steps/s, simulated "
          f"{cal.facts['simulated_steps_per_s']:.3f}; the pick: {cand.label} "
          f"({tput:.3f} groups/s simulated)")
    return cand


def cpu_run(config: Path, *, steps: int, calibrate_steps: int, repeats: int,
            modes: list[str], pilot: dict[str, Any], bounds: dict[str, float], oracle: Any,
            sim_steps: int) -> dict[str, dict[str, Any]]:
    """Calibrate, pick, run the rounds (the module docstring). Per mode: the
    median ratio to the fixed pick, its spread, and whether every run kept the
    bounds and balanced its ledger."""
    skip = 2  # the first steps carry the start: model build, first forward passes
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    clean = dict.fromkeys(modes, True)
    with tempfile.TemporaryDirectory(prefix="bench-autopilot-cpu-") as tmp:
        root = Path(tmp)
        train(config, root / "calibrate", [f"grpo.max_num_steps={calibrate_steps}"])
        cand = pick(root / "calibrate", sim_steps, oracle)
        base = [*cand.overrides(), f"grpo.max_num_steps={steps}"]
        runs = [("fixed", [])] + [
            (m, [f"async_rl.autopilot={json.dumps({**pilot, 'mode': m})}"]) for m in modes]
        print(f"{'round':<5} {'run':<10} {'groups/s':>9} {'stale p95':>9} {'waste':>7} "
              f"{'bounds kept':>11} {'changes':>7} {'ledger':>8}")
        for i in range(repeats):
            got: dict[str, dict[str, Any]] = {}
            k = i % len(runs)  # each round starts one run later: no run is always first
            for name, extra in runs[k:] + runs[:k]:
                f = got[name] = facts(train(config, root / f"{name}-{i}", base + extra),
                                      skip, bounds)
                print(f"{i + 1:<5} {name:<10} {f['throughput']:>9.3f} "
                      f"{f['staleness_p95']:>9.0f} {f['waste_frac']:>7.3f} "
                      f"{'yes' if f['kept'] else 'NO':>11} {f['changes']:>7} "
                      f"{'balanced' if f['balanced'] else 'LOST':>8}")
                if f["last"]:
                    print(f"{'':<5} last decision: {f['last'][:150]}")
            for m in modes:
                ratios[m].append(got[m]["throughput"] / got["fixed"]["throughput"])
                clean[m] &= got[m]["kept"] and got[m]["balanced"]
    out = {}
    for m in modes:
        r = ratios[m]
        out[m] = {"median": statistics.median(r), "spread": (min(r), max(r)), "clean": clean[m]}
        print(f"cpu run: {m} / the fixed pick over {repeats} round(s): median "
              f"{out[m]['median']:.3f} (spread {min(r):.3f}-{max(r):.3f}); bounds kept and "
              f"ledger balanced in every run: {'yes' if clean[m] else 'NO'}")
    return out
