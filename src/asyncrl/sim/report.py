"""Presenting simulation results: the table, results.json and the plots of a run dir."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncrl._util.jsonio import dumps, write_json
from asyncrl.config import RunConfig, dump_config
from asyncrl.controller.profile import PROFILE_FILE
from asyncrl.sim.frontier import TOLERANCE
from asyncrl.sim.runner import ROW_KEYS, Bound, SimResult

#: Steps shown in a pump timeline plot: enough to see the pipeline's rhythm,
#: few enough that single groups stay visible.
TIMELINE_STEPS = 20


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f}min"
    return f"{seconds / 3600:.1f}h"


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 2, *, thousands: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:,.{digits}f}" if thousands else f"{x:.{digits}f}"


TABLE_COLUMNS = (
    "policy", "window", "virtual time", "steps/h", "efficiency", "trainer idle",
    "gen util", "stale mean", "p95", "max", "tok mean", "tok p95", "waste", "masked", "note",
)


def table_cells(result: SimResult) -> list[str]:
    """One table row as strings, in :data:`TABLE_COLUMNS` order."""
    return [
        result.sampler,
        result.window_text(),
        fmt_duration(result.virtual_time_s),
        _num(result.steps_per_hour, 1, thousands=True),
        _pct(result.efficiency),
        _pct(result.trainer_idle_frac),
        _pct(result.generator_util),
        _num(result.staleness_mean),
        str(result.staleness_p95),
        str(result.staleness_max),
        _num(result.token_staleness_mean),
        str(result.token_staleness_p95),
        _pct(result.waste_frac),
        _pct(result.masked_token_frac),
        result.note,
    ]


def rich_table(results: Sequence[SimResult], *, title: str = "") -> Any:
    """The table, with a mark, ``(n)``, in the note column of a row with a note;
    the notes go under it (:func:`table_notes`). At 160 columns the other
    columns leave the note column a few characters: a note in it took a line
    per word. No header is ever cut (a long custom sampler name squeezed them
    to ``windo``): each column is at least its header wide, and the policy
    column wraps a long name instead."""
    from rich.table import Table

    table = Table(title=title or None, title_justify="left")
    for name in TABLE_COLUMNS:
        numeric = name not in ("policy", "note")
        table.add_column(name, justify="right" if numeric else "left", min_width=len(name),
                         overflow="fold", no_wrap=name != "policy")
    noted = 0
    for result in results:
        cells = table_cells(result)
        if result.note:
            noted += 1
            cells[-1] = f"({noted})"
        table.add_row(*cells)
    return table


def table_notes(results: Sequence[SimResult]) -> list[str]:
    """The notes :func:`rich_table` marks, one line each: ``(n) policy: note``."""
    return [f"({n}) {r.sampler}: {r.note}"
            for n, r in enumerate((r for r in results if r.note), start=1)]


def plain_table(results: Sequence[SimResult]) -> str:
    """The same table as fixed-width text (benchmarks, logs)."""
    rows = [list(TABLE_COLUMNS)] + [table_cells(r) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
    lines = []
    for row in rows:
        cells = [c.ljust(w) if i in (0, len(row) - 1) else c.rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def bound_dict(bound: Bound) -> dict[str, Any]:
    return {
        "step_s": bound.step_s,
        "steps_per_hour": bound.steps_per_hour,
        "limited_by": bound.limited_by,
        "trainer_step_s": bound.trainer_step_s,
        "generation_step_s": bound.generation_step_s,
    }


def result_record(result: SimResult) -> dict[str, Any]:
    """What results.json keeps per policy: the row plus its context."""
    engine = result.engine
    return {
        **result.row(),
        "window": result.window,
        "final_setting": result.final_setting,
        "note": result.note,
        "step_time_s": _finite(result.step_time_s),
        "stop_reason": result.stop_reason,
        "ledger": result.ledger,
        "staleness_hist": result.staleness_hist,
        "token_staleness_hist": result.token_staleness_hist,
        "engine": None if engine is None else {
            "attempts": engine.attempts,
            "failures": engine.failures,
            "aborts": engine.aborts,
            "busy_slot_s": engine.busy_slot_s,
        },
        "wall_s": result.wall_s,
    }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "policy"


def workload_marks(cfg: RunConfig, records: Sequence[dict[str, Any]]) -> list[tuple[int, str]]:
    """Where the simulated workload changed, as (step, what) for the knobs plot:
    each ``simulate.phases`` entry at its ``at_step`` (the trainer version from
    which groups draw the new latency, the step trained at that version), each
    ``simulate.fleet`` change at the first step that ended after its ``at_s``
    (changes the run did not reach are left out)."""
    sim = cfg.simulate
    if sim is None:
        return []
    last = records[-1]["step"] if records else -1
    marks = [(p.at_step, f"workload phase {i} (step {p.at_step})")
             for i, p in enumerate(sim.phases, start=2) if p.at_step <= last]
    for change in sim.fleet:
        step = next((r["step"] for r in records if r.get("wall_time_s", -1.0) >= change.at_s),
                    None)
        if step is not None:
            marks.append((step, f"fleet: {change.rollout_slots} slots (step {step})"))
    return sorted(marks)


def write_run_dir(
    results: Sequence[SimResult],
    run_dir: str | Path,
    cfg: RunConfig,
    *,
    config_path: str | None = None,
    plots: bool = True,
) -> list[Path]:
    """results.json, config.yaml and (``plots``) per-policy timelines and
    staleness histograms plus the comparison bars. Returns the files written."""
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    (out / "config.yaml").write_text(dump_config(cfg))
    written.append(out / "config.yaml")
    if plots and results:
        from asyncrl.metrics.plots import plot_comparison, plot_staleness_hist, plot_timeline

        slots = cfg.simulate.rollout_slots if cfg.simulate else None
        run = out.resolve().name
        for result in results:
            name = _safe_name(result.sampler)
            until = result.timeline_until(TIMELINE_STEPS)
            shown = min(result.steps, TIMELINE_STEPS)
            written.append(plot_timeline(
                result.timeline, out / f"timeline_{name}.png", lanes=slots, max_time=until,
                title=f"{run}: {result.sampler}, first {shown} steps "
                      "(trainer below, generation slots above)",
            ))
            if result.staleness_hist:
                written.append(plot_staleness_hist(
                    result.staleness_hist, out / f"staleness_{name}.png",
                    title=f"{run}: {result.sampler}, staleness of trained groups"))
            if result.token_staleness_hist:
                written.append(plot_staleness_hist(
                    result.token_staleness_hist, out / f"token_staleness_{name}.png",
                    title=f"{run}: {result.sampler}, staleness of trained tokens", of="tokens"))
        written.append(plot_comparison([r.row() for r in results], out / "comparison.png",
                                       title=f"{run}: policies on the same workload"))
        for result in results:
            if result.autopilot:
                from asyncrl.metrics.plots import plot_knobs

                written.append(plot_knobs(result.records, out / f"autopilot_knobs_"
                                          f"{_safe_name(result.sampler)}.png", run,
                                          marks=workload_marks(cfg, result.records)))
    for result in results:
        if result.autopilot:  # every decision, as asyncrl train writes autopilot.jsonl
            path = out / f"autopilot_{_safe_name(result.sampler)}.jsonl"
            path.write_text("".join(dumps(d) + "\n" for d in result.autopilot))
            written.append(path)
        if result.profile is not None:  # what async_rl.autopilot.reuse reads
            name = PROFILE_FILE if len(results) == 1 else \
                f"autopilot_profile_{_safe_name(result.sampler)}.json"
            write_json(out / name, result.profile, indent=2)
            written.append(out / name)
    payload = {
        "config": config_path,
        "bound": bound_dict(results[0].bound) if results else None,
        "columns": list(ROW_KEYS),
        "results": [result_record(r) for r in results],
        "files": [p.name for p in written] + ["results.json"],
    }
    write_json(out / "results.json", payload, indent=2)
    written.append(out / "results.json")
    return written


# ------------------------------------------------------------------ frontier
FRONTIER_COLUMNS = (
    "", "config", "efficiency", "tok p95", "waste", "stale mean", "tok mean", "masked", "steps/h",
)


def _mark(point: Any) -> str:
    """The first column: the user's config (on the frontier or not), the closest
    frontier config to an off-frontier one, the rest of the frontier."""
    if point.is_user:
        return "yours (on frontier)" if point.on_frontier else "yours"
    return "closest" if point.is_closest else ("frontier" if point.on_frontier else "")


def _frontier_cells(point: Any) -> list[str]:
    r = point.result
    return [_mark(point), point.candidate.label, _pct(r.efficiency), str(r.token_staleness_p95),
            _pct(r.waste_frac), _num(r.staleness_mean), _num(r.token_staleness_mean),
            _pct(r.masked_token_frac), _num(r.steps_per_hour, 1, thousands=True)]


def frontier_rows(front: Any) -> list[Any]:
    """The points a frontier table shows: the frontier, then the user's if it is off it."""
    rows = list(front.frontier)
    if not front.user.on_frontier:
        rows.append(front.user)
    return rows


def rich_frontier_table(front: Any, *, title: str = "") -> Any:
    from rich.table import Table

    table = Table(title=title or None, title_justify="left")
    for name in FRONTIER_COLUMNS:
        table.add_column(name, justify="left" if name in ("", "config") else "right",
                         no_wrap=name != "config")
    for point in frontier_rows(front):
        style = "bold" if point.is_closest else ("yellow" if point.is_user else None)
        table.add_row(*_frontier_cells(point), style=style)
    return table


def recommendation(front: Any) -> str:
    """One paragraph: where the user's config sits and what to change. Off the
    frontier: the closest frontier config at least as good on all three. On it:
    nothing beats it, and its neighbours on the frontier (as the table lists it,
    best efficiency first) are the nearest other trade-offs, one on either side."""
    user, best = front.user, front.closest
    if user.is_closest:
        up, down = front.neighbours(user)
        sides = [f"{_compared(user, p)}, {_trade(user, p)}" for p in (up, down)
                 if p is not None]
        return (f"your config ({user.candidate.label}) is on the frontier: no swept config beats "
                "it on efficiency, token-staleness p95 and waste at once. " + (
                    "The nearest trade-offs on the frontier: " + "; ".join(sides) + "."
                    if sides else "It is the only config on the frontier."))
    return (f"your config ({user.candidate.label}) is off the frontier; the closest frontier "
            f"config at least as good on all three is {_trade(user, best)}.")


def _compared(user: Any, other: Any) -> str:
    """How ``other`` compares with ``user``, in words: on efficiency always, on
    token-staleness p95 and waste where they differ (within the frontier's
    tolerance a difference does not count, as when the frontier was marked)."""
    words = []
    for key, higher, lower, same in (("efficiency", "more efficient", "less efficient",
                                      "as efficient"),
                                     ("token_staleness_p95", "staler", "fresher", ""),
                                     ("waste_frac", "more waste", "less waste", "")):
        diff = other.objective(key) - user.objective(key)
        word = higher if diff > TOLERANCE[key] else lower if diff < -TOLERANCE[key] else same
        if word:
            words.append(word)
    return ", ".join(words)


def _pcts(a: float, b: float) -> tuple[str, str]:
    """Two fractions as percentages, with the decimals (up to 3) that tell them apart."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return _pct(a), _pct(b)
    for digits in (1, 2, 3):
        x, y = (f"{100 * v:.{digits}f}%" for v in (a, b))
        if x != y:
            return x, y
    return _pct(a), _pct(b)


def _trade(user: Any, other: Any) -> str:
    """``other``'s label, how each objective changes from ``user``'s, and its overrides."""
    u, o = user.result, other.result
    before, after = _pcts(u.efficiency, o.efficiency)
    return (f"{other.candidate.label} (efficiency {before} -> {after}, "
            f"token-staleness p95 {u.token_staleness_p95} -> {o.token_staleness_p95}, waste "
            f"{_pct(u.waste_frac)} -> {_pct(o.waste_frac)}; run it with "
            + " ".join(f"'{x}'" for x in other.candidate.overrides()) + ")")


def write_frontier_dir(front: Any, run_dir: str | Path, cfg: RunConfig, *,
                       config_path: str | None = None, plots: bool = True) -> list[Path]:
    """config.yaml, frontier.json (every point) and (``plots``) frontier.png."""
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_config(cfg))
    written = [out / "config.yaml"]
    if plots:
        from asyncrl.sim.frontier_plot import plot_frontier

        written.append(plot_frontier(front, out / "frontier.png",
                                     title=f"{out.resolve().name}: policies on one workload"))
    payload = {
        "config": config_path,
        "bound": bound_dict(front.user.result.bound),
        "points": [p.row() for p in front.points],
        "refused": [{"config": c.label, "error": e} for c, e in front.refused],
        "recommendation": recommendation(front),
        "files": [p.name for p in written] + ["frontier.json"],
    }
    write_json(out / "frontier.json", payload, indent=2)
    written.append(out / "frontier.json")
    return written
