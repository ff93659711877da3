"""PNG plots of a run: reward curves, training curves (loss, entropy, KL, grad
norm, completion length, the step's time split), staleness histogram, pump
timeline, comparisons.

matplotlib runs headless (Agg); every function writes one file and returns its path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _titled(run_name: str, what: str) -> str:
    return f"{run_name}: {what}" if run_name else what


def _float(value: Any) -> float:
    """A metric as a float; null (a non-finite value in the JSON) becomes NaN, a gap in the line."""
    return math.nan if value is None else float(value)


def plot_reward(records: Sequence[dict[str, Any]], out_dir: Path,
                target: float | None = None, run_name: str = "") -> list[Path]:
    """Reward against step and against wall time (two files), with the eval
    curve (``eval/reward_mean``, held-out prompts) where the run evaluated."""
    plt = _plt()
    steps = [r["step"] for r in records]
    times = [_float(r.get("wall_time_s")) for r in records]
    rewards = [_float(r.get("reward_mean")) for r in records]
    evaluated = [(r["step"], _float(r.get("wall_time_s")), _float(r["eval/reward_mean"]))
                 for r in records if r.get("eval/reward_mean") is not None]
    paths = []
    for axis, xs, xlabel, name in ((0, steps, "training step", "reward_vs_step.png"),
                                   (1, times, "wall time (s)", "reward_vs_time.png")):
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.plot(xs, rewards, lw=1.5, label="mean reward")
        if evaluated:
            ax.plot([e[axis] for e in evaluated], [e[2] for e in evaluated], "o-", ms=3,
                    lw=1.2, color="tab:orange", label="eval")
        if target is not None:
            ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target:g}")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean reward")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(_titled(run_name, f"reward vs {xlabel.split(' (')[0]}"))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        paths.append(_save(fig, out_dir / name))
    return paths


#: One curve per file: metrics.jsonl key, y-axis label, file name.
CURVES = (("train/loss", "loss", "loss_vs_step.png"),
          ("train/entropy", "entropy (nats/token)", "entropy_vs_step.png"),
          ("train/kl", "KL to the reference (k3)", "kl_vs_step.png"),
          ("train/grad_norm", "gradient norm (before clipping)", "grad_norm_vs_step.png"))
#: Completion-length curves (tokens) of the completions each step trained.
LENGTHS = (("rollout/completion_len_max", "max"), ("rollout/completion_len_p90", "p90"),
           ("rollout/completion_len_mean", "mean"), ("rollout/completion_len_p50", "p50"))
#: The trainer side's time split of a step, bottom to top (they add up to step_time_s).
TIME_PARTS = (("trainer_idle_s", "idle (waiting for rollouts)", "#c8c8c8"),
              ("time/train_s", "training (forward/backward)", "#4c72b0"),
              ("time/optimizer_step_s", "optimizer step", "#2a3f6b"),
              ("weight_sync_s", "weight sync", "#8172b2"),
              ("time/eval_s", "evaluation", "#dd8452"),
              ("time/other_s", "other", "#937860"))


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of ``key``, over the records that have it."""
    have = [r for r in records if key in r]
    return [r["step"] for r in have], [_float(r[key]) for r in have]


def plot_training_curves(records: Sequence[dict[str, Any]], out_dir: Path,
                         run_name: str = "") -> list[Path]:
    """Loss, entropy, KL, grad norm, completion length and the step's time split
    against step, one file each; a metric the run did not log gets none (KL
    without ``kl_coef``, a custom trainer's missing keys)."""
    plt = _plt()
    paths = []
    for key, label, name in CURVES:
        steps, values = _series(records, key)
        if not steps:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.6))
        ax.plot(steps, values, lw=1.5)
        ax.set_xlabel("training step")
        ax.set_ylabel(label)
        ax.set_title(_titled(run_name, f"{key.split('/', 1)[1]} vs step"))
        ax.grid(alpha=0.3)
        paths.append(_save(fig, out_dir / name))
    if any(LENGTHS[0][0] in r for r in records):
        paths.append(_plot_lengths(records, out_dir / "completion_len_vs_step.png", run_name))
    if any("time/train_s" in r for r in records):
        paths.append(_plot_time_split(records, out_dir / "step_time_vs_step.png", run_name))
    if any(AUTOPILOT_KNOBS[0][0] in r for r in records):
        paths.append(plot_knobs(records, out_dir / "autopilot_knobs_vs_step.png", run_name))
    return paths


#: The knobs the autopilot moves, as step records hold them (``autopilot/*``),
#: with the y-axis label of each one's panel.
AUTOPILOT_KNOBS = (("autopilot/max_inflight_prompts", "in-flight bound\n(groups)"),
                   ("autopilot/max_buffered_rollouts", "buffer capacity\n(groups)"),
                   ("autopilot/window", "window\n(versions)"))


def knob_changes(steps: Sequence[int], values: Sequence[float]) -> list[tuple[int, float]]:
    """(step, new value) wherever a knob's value differs from the step before:
    where a change was applied (a record holds the setting in force during its step)."""
    return [(s, v) for s, v, before in zip(steps[1:], values[1:], values) if v != before]


def plot_knobs(records: Sequence[dict[str, Any]], out: Path, run_name: str = "",
               marks: Sequence[tuple[int, str]] = ()) -> Path:
    """The staleness contract's knobs over the run (``async_rl.autopilot``): one
    panel per knob on a shared step axis - the in-flight bound and the capacity
    run in the hundreds, the window in single versions, so no knob flattens
    another - as steps (a value holds until the next change), a marker where a
    change was applied, and ``marks`` (step, what: a workload phase, a fleet
    change) as a dashed line across every panel."""
    from matplotlib.ticker import MaxNLocator

    plt = _plt()
    knobs = [(key, label) for key, label in AUTOPILOT_KNOBS if any(key in r for r in records)]
    fig, axes = plt.subplots(len(knobs), 1, sharex=True, squeeze=False,
                             figsize=(8, 0.7 + 1.7 * len(knobs)))
    for ax, (key, label) in zip(axes[:, 0], knobs):
        steps, values = _series(records, key)
        ax.plot(steps, values, drawstyle="steps-post", lw=1.6, color="tab:blue",
                label="in force")
        changed = knob_changes(steps, values)
        ax.plot([s for s, _ in changed], [v for _, v in changed], "o", ms=4.5,
                color="tab:red", label=f"change applied ({len(changed)})")
        for step, what in marks:  # named once, in the top panel's legend
            ax.axvline(step, color="gray", ls="--", lw=1,
                       label=what if ax is axes[0, 0] else "_nolegend_")
        ax.set_ylabel(label)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
        ax.margins(y=0.15)  # a flat line stays off the frame
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                  frameon=False)
    axes[-1, 0].set_xlabel("training step")
    axes[0, 0].set_title(_titled(run_name, "autopilot knobs vs step"))
    return _save(fig, out)


def _plot_lengths(records: Sequence[dict[str, Any]], out: Path, run_name: str) -> Path:
    """Completion length (max, p90, mean, p50) and, on its own axis, the fraction
    cut off at the token limit."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for key, label in LENGTHS:
        ax.plot(*_series(records, key), lw=1.3, label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel("completion length (tokens)")
    clipped = ax.twinx()
    clipped.plot(*_series(records, "rollout/completion_clipped_frac"), color="gray", ls="--",
                 lw=1, label="clipped (right)")
    clipped.set_ylabel("clipped fraction")
    clipped.set_ylim(-0.02, 1.02)
    ax.set_title(_titled(run_name, "completion length vs step"))
    ax.grid(alpha=0.3)
    handles = ax.get_legend_handles_labels()
    more = clipped.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], loc="best", fontsize="small")
    return _save(fig, out)


def _plot_time_split(records: Sequence[dict[str, Any]], out: Path, run_name: str) -> Path:
    """Stacked bars: where each step's time went on the trainer side."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    steps = [r["step"] for r in records]
    bottom = [0.0] * len(records)
    for key, label, color in TIME_PARTS:
        values = [_float(r.get(key, 0.0)) for r in records]
        values = [0.0 if math.isnan(v) else v for v in values]
        ax.bar(steps, values, bottom=bottom, width=1.0, color=color, label=label, lw=0)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xlabel("training step")
    ax.set_ylabel("seconds")
    ax.set_title(_titled(run_name, "step time split"))
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small", frameon=False)
    return _save(fig, out)


def plot_staleness_hist(hist: dict[str, int], out: Path, title: str = "", *,
                        of: str = "groups") -> Path:
    """A staleness histogram of trained ``groups`` (``v - start_weight``) or
    ``tokens`` (``v - token version``)."""
    plt = _plt()
    keys = sorted(int(k) for k in hist)
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.bar([str(k) for k in keys], [hist[str(k)] for k in keys],
           color="#4c72b0" if of == "groups" else "#dd8452")
    ax.set_xlabel(f"staleness of trained {of[:-1]} (versions)")
    ax.set_ylabel(of)
    ax.set_title(title or "staleness histogram")
    return _save(fig, out)


def plot_timeline(intervals: Sequence[dict[str, Any]], out: Path, *, lanes: int | None = None,
                  title: str = "pump timeline", max_time: float | None = None) -> Path:
    """Gantt chart: one row per generation lane, one row for the trainer.

    Generation intervals are packed into lanes greedily (a lane holds one group
    at a time), so the picture shows how many generations overlapped training.
    """
    plt = _plt()
    # Times relative to the first event: the controller's clock has an arbitrary origin.
    t0 = min((i["start"] for i in intervals), default=0.0)
    intervals = [{**i, "start": i["start"] - t0, "end": i["end"] - t0} for i in intervals]
    gens = sorted((i for i in intervals if i["kind"] == "gen"), key=lambda i: i["start"])
    train = [i for i in intervals if i["kind"] in _TRAIN_COLORS]  # every trainer-busy interval
    if max_time is not None:
        gens = [i for i in gens if i["start"] <= max_time]
        train = [i for i in train if i["start"] <= max_time]
    lane_end: list[float] = []
    placed: list[tuple[int, dict[str, Any]]] = []
    for iv in gens:
        for lane, end in enumerate(lane_end):
            if end <= iv["start"]:
                lane_end[lane] = iv["end"]
                placed.append((lane, iv))
                break
        else:
            if lanes is not None and len(lane_end) >= lanes:
                lane = min(range(len(lane_end)), key=lane_end.__getitem__)
                lane_end[lane] = max(lane_end[lane], iv["end"])
            else:
                lane_end.append(iv["end"])
                lane = len(lane_end) - 1
            placed.append((lane, iv))
    n_lanes = max(len(lane_end), 1)
    colors = _GEN_COLORS
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.12 * min(n_lanes, 64)))
    for lane, iv in placed:
        ax.broken_barh([(iv["start"], max(iv["end"] - iv["start"], 1e-9))], (lane + 1.5, 0.8),
                       color=colors.get(iv["label"], "#55a868"), lw=0)
    for iv in train:
        ax.broken_barh([(iv["start"], max(iv["end"] - iv["start"], 1e-9))], (0, 0.9),
                       color=_TRAIN_COLORS[iv["kind"]], lw=0)
    ax.set_yticks([0.45, 1.5 + n_lanes / 2])
    ax.set_yticklabels(["trainer", f"generation\n({n_lanes} lanes)"])
    ax.set_xlabel("time (s)")
    ax.set_title(title)
    _timeline_legend(ax, {iv["label"] for _, iv in placed}, {iv["kind"] for iv in train})
    return _save(fig, out)


#: Colour of a generation interval by its outcome label, and of a trainer interval by kind.
_GEN_COLORS = {"ok": "#55a868", "failed": "#c44e52", "retry": "#c44e52", "aborted": "#dd8452",
               "lost": "#937860"}
_GEN_NAMES = {"ok": "generation", "failed": "generation failed", "retry": "generation failed",
              "aborted": "generation aborted", "lost": "generation lost (worker died)"}
_TRAIN_COLORS = {"train": "#4c72b0", "step": "#2a3f6b", "sync": "#8172b2"}
_TRAIN_NAMES = {"train": "training", "step": "optimizer step", "sync": "weight sync"}


def _timeline_legend(ax: Any, gen_labels: set[str], train_kinds: set[str]) -> None:
    """A legend with one entry per colour that appears in the chart."""
    from matplotlib.patches import Patch

    entries: dict[str, str] = {}
    for label in sorted(gen_labels, key=lambda x: (x != "ok", x)):
        label = label if label in _GEN_COLORS else "ok"
        entries.setdefault(_GEN_NAMES[label], _GEN_COLORS[label])
    for kind in _TRAIN_COLORS:
        if kind in train_kinds:
            entries[_TRAIN_NAMES[kind]] = _TRAIN_COLORS[kind]
    if entries:
        ax.legend(handles=[Patch(color=c, label=n) for n, c in entries.items()],
                  loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small",
                  frameon=False)


def plot_comparison(rows: Sequence[dict[str, Any]], out: Path, title: str = "") -> Path:
    """Bars per policy: efficiency, trainer idle, generator util and waste in %
    (as in the table of ``asyncrl simulate``), staleness in versions."""
    plt = _plt()
    metrics = [("efficiency", "efficiency (%)", 100.0),
               ("trainer_idle_frac", "trainer idle (%)", 100.0),
               ("generator_util", "generator util (%)", 100.0),
               ("waste_frac", "waste (%)", 100.0),
               ("staleness_mean", "staleness mean (versions)", 1.0)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(3 * len(metrics), 3.4))
    names = [r["sampler"] for r in rows]
    for ax, (key, label, scale) in zip(axes, metrics):
        ax.bar(names, [scale * float(r.get(key) or 0.0) for r in rows], color="#4c72b0")
        ax.set_title(label)
        if scale == 100.0:
            ax.set_ylim(0, 105)
        ax.tick_params(axis="x", rotation=45)
    if title:
        fig.suptitle(title)
    return _save(fig, out)
