"""``asyncrl simulate --frontier``: the trade-offs of the built-in policies on one workload.

The config's workload (its ``simulate`` block, ``grpo`` and ``loss``) is run
with a small grid of the built-in policies' knobs — the window, the buffer
capacity, the in-flight bound and ``staleness_of`` — and every run is scored
on three objectives: **efficiency** (higher is better), **token-staleness
p95** and **waste** (lower is better). The Pareto set is the runs no other run
beats on one objective without losing on another. The config as written runs
too; if it is off the frontier, the recommendation is the nearest frontier
config that is at least as good on all three (docs/simulate.md, section 7).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.errors import SetupError
from asyncrl.sampling import WINDOW_FIELD, parse_sampler_config
from asyncrl.sim.runner import SimResult, _sim_block, sampler_window, simulate

#: Windows every built-in is swept over (in_order also runs synchronous, s = 0).
WINDOWS = (1, 2, 4)
#: Steps per run when the command line gives none: enough for the pipeline to
#: settle, few enough that the whole sweep takes seconds.
DEFAULT_STEPS = 100
#: Differences below these do not count when one run is compared with another
#: (efficiency and waste are fractions; a p95 is a whole number of versions).
TOLERANCE = {"efficiency": 1e-3, "token_staleness_p95": 0.0, "waste_frac": 1e-3}


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One point of the sweep: a sampler config, capacity and in-flight bound."""

    sampler: dict[str, Any]
    capacity: int
    inflight: int

    @property
    def key(self) -> str:
        return json.dumps([self.sampler, self.capacity, self.inflight], sort_keys=True)

    @property
    def label(self) -> str:
        s = self.sampler
        name = s["name"]
        field = WINDOW_FIELD.get(name)
        parts = [s.get("target", name) if field is None else f"{name} s={s[field]}"]
        if s.get("staleness_of") == "end_weight":
            parts.append("end_weight")
        if s.get("sample_freshest_first"):
            parts.append("freshest first")
        parts.append(f"cap {self.capacity}")
        if self.inflight != self.capacity:
            parts.append(f"in-flight {self.inflight}")
        return " ".join(parts)

    def overrides(self) -> list[str]:
        """The ``key.path=value`` overrides that turn a config into this one."""
        body = ", ".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}"
                         for k, v in self.sampler.items())
        return [f"async_rl.sampler={{{body}}}", f"async_rl.max_buffered_rollouts={self.capacity}",
                f"async_rl.max_inflight_prompts={self.inflight}"]


@dataclasses.dataclass
class Point:
    candidate: Candidate
    result: SimResult
    is_user: bool = False
    on_frontier: bool = False
    is_closest: bool = False

    def objective(self, key: str) -> float:
        value = float(getattr(self.result, key))
        return value if math.isfinite(value) else (0.0 if key == "efficiency" else math.inf)

    def row(self) -> dict[str, Any]:
        return {"config": self.candidate.label, "overrides": self.candidate.overrides(),
                **self.result.row(), "on_frontier": self.on_frontier, "is_user": self.is_user,
                "is_closest": self.is_closest}


@dataclasses.dataclass
class Frontier:
    points: list[Point]
    #: Candidates the Controller refused (their setup error), for the notes.
    refused: list[tuple[Candidate, str]]

    @property
    def user(self) -> Point:
        return next(p for p in self.points if p.is_user)

    @property
    def closest(self) -> Point:
        return next(p for p in self.points if p.is_closest)

    @property
    def frontier(self) -> list[Point]:
        return sorted((p for p in self.points if p.on_frontier),
                      key=lambda p: (-p.objective("efficiency"),
                                     p.objective("token_staleness_p95")))

    def neighbours(self, point: Point) -> tuple[Point | None, Point | None]:
        """The frontier points next to ``point`` (on the frontier) in :attr:`frontier`'s
        order: the next more efficient one and the next less efficient one (None at an end)."""
        front = self.frontier
        i = front.index(point)
        return (front[i - 1] if i > 0 else None, front[i + 1] if i + 1 < len(front) else None)


def user_candidate(cfg: RunConfig) -> Candidate:
    a = cfg.async_rl
    return Candidate(a.sampler.model_dump(), a.max_buffered_rollouts, a.max_inflight_prompts)


def candidates(cfg: RunConfig) -> list[Candidate]:
    """The grid for ``cfg`` (see the module docstring), without duplicates."""
    n = cfg.grpo.num_prompts_per_step
    own = sampler_window(cfg.async_rl.sampler)
    windows = sorted({*WINDOWS, *([own] if own else [])})
    out: list[Candidate] = []
    for name, field in WINDOW_FIELD.items():
        fields = type(parse_sampler_config({"name": name})).model_fields
        measures = ("start_weight", "end_weight") if "staleness_of" in fields else (None,)
        for s in ([0, *windows] if name == "in_order" else windows):
            for measure in measures:
                sampler: dict[str, Any] = {"name": name, field: s}
                if measure is not None:
                    sampler["staleness_of"] = measure
                sampler = parse_sampler_config(sampler).model_dump()
                # Gated policies admit (s + 1) steps ahead, what they need. windowed is
                # bounded by capacity alone: it gets that, and twice the buffer with
                # the in-flight bound kept at that (finished groups wait longer, fewer
                # groups queue in the engine).
                need = n * (s + 1)
                out.append(Candidate(sampler, need, need))
                if name == "windowed":
                    out.append(Candidate(sampler, 2 * need, need))
    seen: set[str] = set()
    return [c for c in out if not (c.key in seen or seen.add(c.key))]


def sweep(
    cfg: RunConfig,
    *,
    steps: int | None = None,
    base_dir: str | Path | None = None,
    on_start: Callable[[str], None] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> Frontier:
    """Run the user's config and the grid, and mark the frontier and the closest point."""
    steps = steps if steps is not None else min(_sim_block(cfg).steps, DEFAULT_STEPS)
    mine = user_candidate(cfg)
    grid = [c for c in candidates(cfg) if c.key != mine.key]
    points: list[Point] = []
    refused: list[tuple[Candidate, str]] = []
    for i, cand in enumerate([mine, *grid]):
        if on_start is not None:
            on_start(cand.label)
        # A grid point is its own setting: it does not start from a profile to reuse.
        run_cfg = cfg if i == 0 else cfg.model_copy(update={"async_rl": cfg.async_rl.model_copy(
            update={"max_buffered_rollouts": cand.capacity,
                    "max_inflight_prompts": cand.inflight,
                    "autopilot": cfg.async_rl.autopilot.model_copy(update={"reuse": None})})})
        try:
            result = simulate(run_cfg, sampler_override=None if i == 0 else cand.sampler,
                              steps=steps, base_dir=base_dir, record_intervals=False,
                              on_step=on_step)
        except SetupError as exc:
            if i == 0:
                raise
            refused.append((cand, str(exc)))
            continue
        points.append(Point(cand, result, is_user=i == 0))
    mark(points)
    return Frontier(points, refused)


OBJECTIVES = (("efficiency", -1), ("token_staleness_p95", 1), ("waste_frac", 1))


def _better_or_equal(a: Point, b: Point) -> bool:
    """``a`` is at least as good as ``b`` on every objective (within TOLERANCE)."""
    return all(sign * (a.objective(k) - b.objective(k)) <= TOLERANCE[k] for k, sign in OBJECTIVES)


def _strictly_better_somewhere(a: Point, b: Point) -> bool:
    return any(sign * (b.objective(k) - a.objective(k)) > TOLERANCE[k] for k, sign in OBJECTIVES)


def dominates(a: Point, b: Point) -> bool:
    return _better_or_equal(a, b) and _strictly_better_somewhere(a, b)


def mark(points: Sequence[Point]) -> None:
    """Set ``on_frontier`` (no other point dominates it, and no earlier one ties
    with it on all three) and ``is_closest``: the user's point if it is on the
    frontier, else the frontier point nearest to it (objectives scaled by their
    range over all points) among those that dominate it."""
    kept: list[Point] = []
    for p in points:
        p.on_frontier = not any(dominates(q, p) for q in points if q is not p)
        # Of points that tie on every objective, the first (the user's, then grid
        # order: the simpler config) stands for all.
        if p.on_frontier and any(_better_or_equal(q, p) and _better_or_equal(p, q)
                                 for q in kept):
            p.on_frontier = False
        elif p.on_frontier:
            kept.append(p)
    user = next(p for p in points if p.is_user)
    if user.on_frontier:
        user.is_closest = True
        return
    spans = {}
    for key, _ in OBJECTIVES:
        values = [p.objective(key) for p in points if math.isfinite(p.objective(key))]
        spans[key] = (max(values) - min(values)) if values else 0.0

    def distance(p: Point) -> float:
        return math.fsum(((p.objective(k) - user.objective(k)) / spans[k]) ** 2
                         for k, _ in OBJECTIVES if spans[k] > 0)

    frontier = [p for p in points if p.on_frontier]
    # Within TOLERANCE dominance is not quite transitive: when no frontier point
    # dominates the user's, the nearest one is still the recommendation.
    better = [p for p in frontier if dominates(p, user)] or frontier
    min(better, key=distance).is_closest = True
