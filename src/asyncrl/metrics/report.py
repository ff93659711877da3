"""Files of a run directory: summary, timeline, and the plots drawn from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl.metrics.plots import plot_reward, plot_staleness_hist, plot_timeline


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    records = []
    for line in path.read_text().splitlines():
        if line.strip():
            records.append(json.loads(line))
    # A resumed run appends; if a step was logged twice keep the last one.
    by_step = {r["step"]: r for r in records}
    return [by_step[k] for k in sorted(by_step)]


def write_plots(run_dir: Path) -> list[Path]:
    """Reward vs step and vs wall time, staleness histogram, pump timeline."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    out = run_dir / "plots"
    paths = plot_reward(records, out, target=summary.get("target_reward"))
    hist: dict[str, int] = {}
    for r in records:
        for k, n in (r.get("staleness_hist") or {}).items():
            hist[k] = hist.get(k, 0) + int(n)
    if hist:
        paths.append(plot_staleness_hist(hist, out / "staleness_hist.png"))
    timeline = run_dir / "timeline.json"
    if timeline.is_file():
        intervals = json.loads(timeline.read_text())
        paths.append(plot_timeline(intervals, out / "pump_timeline.png",
                                   **_first_steps_window(intervals, steps=20)))
    return paths


def _first_steps_window(intervals: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Limit a long run's timeline to its first ``steps`` steps, so bars stay readable."""
    syncs = sorted(i["end"] for i in intervals if i["kind"] == "sync")
    if len(syncs) <= steps:
        return {}
    t0 = min(i["start"] for i in intervals)
    return {"max_time": syncs[steps - 1] - t0, "title": f"pump timeline (first {steps} steps)"}
