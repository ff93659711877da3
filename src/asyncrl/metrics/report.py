"""Files of a run directory: summary, timeline, and the plots drawn from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl._util.jsonio import read_json, read_jsonl
from asyncrl.metrics.plots import (
    plot_reward,
    plot_staleness_hist,
    plot_timeline,
    plot_training_curves,
)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The per-step records of ``metrics.jsonl``, in step order (torn lines dropped)."""
    records = read_jsonl(Path(run_dir) / "metrics.jsonl")
    # A resumed run appends; if a step was logged twice keep the last one.
    by_step = {r["step"]: r for r in records if isinstance(r.get("step"), int)}
    return [by_step[k] for k in sorted(by_step)]


def write_plots(run_dir: Path) -> list[Path]:
    """Reward vs step and vs wall time, the training curves (loss, entropy, KL,
    grad norm, completion length, step time split: those the run logged),
    staleness histograms (groups and tokens), pump timeline."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    summary_path = run_dir / "summary.json"
    summary = read_json(summary_path, default={}) if summary_path.is_file() else {}
    out = run_dir / "plots"
    name = run_dir.resolve().name
    paths = plot_reward(records, out, target=summary.get("target_reward"), run_name=name)
    paths += plot_training_curves(records, out, run_name=name)
    for key, of, file in (("staleness_hist", "groups", "staleness_hist.png"),
                          ("token_staleness_hist", "tokens", "token_staleness_hist.png")):
        hist: dict[str, int] = {}
        for r in records:
            for k, n in (r.get(key) or {}).items():
                hist[k] = hist.get(k, 0) + int(n)
        if hist:
            paths.append(plot_staleness_hist(hist, out / file, of=of,
                                             title=f"{name}: staleness of trained {of}"))
    timeline = run_dir / "timeline.json"
    if timeline.is_file():
        intervals = read_json(timeline, default=[])
        window = {"title": "pump timeline", **_first_steps_window(intervals, steps=20)}
        window["title"] = f"{name}: {window['title']}"
        paths.append(plot_timeline(intervals, out / "pump_timeline.png", **window))
    return paths


def _first_steps_window(intervals: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Limit a long run's timeline to its first ``steps`` steps, so bars stay readable."""
    syncs = sorted(i["end"] for i in intervals if i["kind"] == "sync")
    if len(syncs) <= steps:
        return {}
    t0 = min(i["start"] for i in intervals)
    return {"max_time": syncs[steps - 1] - t0, "title": f"pump timeline (first {steps} steps)"}
