"""``asyncrl simulate --frontier``: the grid, the Pareto set and the recommendation."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import yaml

from asyncrl.cli import main
from asyncrl.config import config_from_dict
from asyncrl.sim.frontier import Candidate, Point, candidates, mark
from asyncrl.sim.runner import ROW_KEYS

CONFIG = {
    "seed": 7,
    "grpo": {"num_prompts_per_step": 6, "num_generations_per_prompt": 2},
    "async_rl": {
        # windowed s=2 with room for five steps: more run-ahead than it can use,
        # so groups wait long enough to be evicted.
        "sampler": {"name": "windowed", "max_staleness_versions": 2},
        "max_buffered_rollouts": 30,
        "min_groups_for_streaming_train": 3,
        "max_inflight_prompts": 30,
    },
    "simulate": {
        "steps": 30,
        "rollout_slots": 12,
        "generation_latency_s": {"distribution": "lognormal", "median": 5.0, "sigma": 1.0},
        "train_step_s": 4.0,
        "weight_sync_s": 0.5,
    },
}


def test_the_grid_sweeps_window_capacity_inflight_and_staleness_of() -> None:
    grid = candidates(config_from_dict(CONFIG))
    labels = [c.label for c in grid]
    assert len(labels) == len(set(labels)) == 25
    assert "in_order s=0 cap 6" in labels  # synchronous GRPO is a point too
    for c in grid:
        s = c.sampler[{"in_order": "max_lookahead_versions"}.get(c.sampler["name"],
                                                                 "max_staleness_versions")]
        # Gated policies get what they need; windowed also twice the buffer.
        assert c.inflight == 6 * (s + 1)
        assert c.capacity in ((6 * (s + 1), 12 * (s + 1)) if c.sampler["name"] == "windowed"
                              else (6 * (s + 1),))
        has_measure = c.sampler["name"] in ("windowed", "weight_fifo")
        assert ("staleness_of" in c.sampler) == has_measure
    assert {"windowed s=4 end_weight cap 30", "windowed s=4 end_weight cap 60 in-flight 30",
            "weight_fifo s=1 end_weight cap 12", "ready_first s=2 cap 18"} <= set(labels)
    # A candidate turns into overrides a config file takes.
    end = next(c for c in grid if c.label == "windowed s=4 end_weight cap 30")
    from asyncrl.config import apply_overrides

    tree = apply_overrides(json.loads(json.dumps(CONFIG)), end.overrides())
    cfg = config_from_dict(tree)
    assert cfg.async_rl.sampler.staleness_of == "end_weight"
    assert (cfg.async_rl.max_buffered_rollouts, cfg.async_rl.max_inflight_prompts) == (30, 30)


def point(eff: float, p95: int, waste: float, *, user: bool = False) -> Point:
    result = types.SimpleNamespace(efficiency=eff, token_staleness_p95=p95, waste_frac=waste)
    cand = Candidate({"name": "windowed", "max_staleness_versions": p95}, int(eff * 100), 1)
    return Point(cand, result, is_user=user)  # type: ignore[arg-type]


def test_the_frontier_is_the_undominated_set_and_the_closest_dominates_the_user() -> None:
    user = point(0.80, 4, 0.20, user=True)
    near = point(0.85, 4, 0.10)       # dominates the user, close to it
    far = point(0.99, 1, 0.00)        # dominates the user, far from it... and dominates near
    trade = point(1.00, 9, 0.30)      # the fastest: on the frontier, no better than the user
    tie = point(0.9995, 9, 0.3005)    # within tolerance of `trade`: stands behind it
    worse = point(0.50, 9, 0.50)
    points = [user, near, far, trade, tie, worse]
    mark(points)
    assert [p.on_frontier for p in points] == [False, False, True, True, False, False]
    assert far.is_closest and not near.is_closest and not user.is_closest


def test_a_user_on_the_frontier_is_its_own_recommendation() -> None:
    user, other = point(0.9, 2, 0.1, user=True), point(0.95, 5, 0.1)
    mark([user, other])
    assert user.on_frontier and other.on_frontier and user.is_closest


def test_closest_is_the_nearest_of_the_dominating_frontier_points() -> None:
    user = point(0.50, 5, 0.10, user=True)
    a = point(0.55, 5, 0.10)   # a small step from the user
    b = point(0.50, 0, 0.00)   # also dominates, further away once scaled
    mark([user, a, b, point(0.60, 9, 0.50)])
    assert a.on_frontier and b.on_frontier and a.is_closest


def test_the_words_of_an_on_frontier_recommendation_match_its_numbers() -> None:
    """nu3 item 4: on examples/sim/partial_rollouts.yaml the user's config (on the
    frontier) was labelled "yours closest", and its neighbour of the same
    efficiency was called "more efficient ... (efficiency 99.7% -> 99.7%".
    The numbers of that sweep's three frontier points at the top."""
    from rich.console import Console

    from asyncrl.sim.frontier import Frontier
    from asyncrl.sim.report import recommendation, rich_frontier_table

    def run(label: str, eff: float, p95: int, waste: float, *, user: bool = False) -> Point:
        result = types.SimpleNamespace(
            efficiency=eff, token_staleness_p95=p95, waste_frac=waste, staleness_mean=1.0,
            token_staleness_mean=1.0, masked_token_frac=0.0, steps_per_hour=1.0)
        name, s, *rest = label.split()
        cand = Candidate({"name": name, "max_staleness_versions": int(s[2:]),
                          **({"staleness_of": "end_weight"} if "end_weight" in rest else {})},
                         192, 192)
        return Point(cand, result, is_user=user)  # type: ignore[arg-type]

    user = run("windowed s=2 end_weight", 0.997158352184, 11, 0.000757920266788, user=True)
    same = run("windowed s=2", 0.997158352184, 2, 0.326302856558)
    slower = run("ready_first s=2", 0.948752096239, 10, 0.0)
    close = run("windowed s=4", 0.99739375856, 4, 0.163570627104)
    front = Frontier([user, same, slower], refused=[])
    mark(front.points)
    assert user.on_frontier and front.neighbours(user) == (same, slower)
    text = recommendation(front)
    assert "more efficient" not in text, text
    assert ("nearest trade-offs on the frontier: as efficient, fresher, more waste, "
            "windowed s=2 cap 192 (efficiency 99.7% -> 99.7%,") in text, text
    assert "; less efficient, fresher, ready_first s=2 cap 192 (efficiency 99.7% -> 94.9%," in text
    # Efficiencies that differ below the first decimal show the decimals that tell them apart.
    front = Frontier([user, close, slower], refused=[])
    mark(front.points)
    assert "as efficient, fresher, more waste, windowed s=4 cap 192 (efficiency 99.72% -> " \
        "99.74%," in recommendation(front)
    console = Console(record=True, width=200)
    console.print(rich_frontier_table(front))
    table = console.export_text()
    assert "yours (on frontier)" in table and "closest" not in table


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def test_cli_frontier_marks_the_config_and_recommends_a_better_one(
        config_file: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "front"
    assert main(["simulate", "--config", str(config_file), "--frontier", "--steps", "12",
                 "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "your config (windowed s=2 cap 30) is off the frontier" in out
    assert "frontier.json and 1 plot: frontier.png)" in out  # not "1 plots"
    saved = json.loads((run / "frontier.json").read_text())
    assert (run / "frontier.png").is_file() and (run / "config.yaml").is_file()
    points = saved["points"]
    assert len(points) == 26 and all(set(ROW_KEYS) <= set(p) for p in points)
    (user,) = [p for p in points if p["is_user"]]
    (best,) = [p for p in points if p["is_closest"]]
    assert user["config"] == "windowed s=2 cap 30" and not user["on_frontier"]
    assert best["on_frontier"] and best["config"] in saved["recommendation"]
    assert best["efficiency"] >= user["efficiency"] - 1e-3
    assert best["waste_frac"] <= user["waste_frac"] + 1e-3
    assert best["token_staleness_p95"] <= user["token_staleness_p95"]
    assert all(p["steps"] == 12 for p in points)
    assert " ".join(f"'{o}'" for o in best["overrides"]) in out.replace("\n", "")


@pytest.mark.e2e
def test_cli_on_the_frontier_shows_the_nearest_trade_offs_on_either_side(
        config_file: Path, tmp_path: Path) -> None:
    """Issue 28, item 9: a config already on the frontier got "is on the frontier"
    and nothing else, while the README says --frontier recommends one. It now names
    its neighbours on the frontier, with their numbers and overrides. A real
    ``asyncrl simulate`` process, on a frontier point with a neighbour either side."""
    import os
    import subprocess
    import sys

    from asyncrl.sim.frontier import sweep

    first = sweep(config_from_dict(CONFIG), steps=12)
    middle = first.frontier[len(first.frontier) // 2]
    assert 0 < first.frontier.index(middle) < len(first.frontier) - 1
    run = tmp_path / "front"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)}
    proc = subprocess.run(
        [sys.executable, "-m", "asyncrl", "simulate", "--config", str(config_file), "--frontier",
         "--steps", "12", "--no-plots", "--run-dir", str(run), *middle.candidate.overrides()],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((run / "frontier.json").read_text())
    (user,) = [p for p in saved["points"] if p["is_user"]]
    assert user["config"] == middle.candidate.label and user["on_frontier"] and user["is_closest"]
    front = sorted((p for p in saved["points"] if p["on_frontier"]),
                   key=lambda p: (-p["efficiency"], p["token_staleness_p95"]))
    i = front.index(user)
    up, down = front[i - 1], front[i + 1]
    text = saved["recommendation"]
    assert "is on the frontier" in text and "The nearest trade-offs on the frontier: " in text
    # The words before each neighbour say how it compares (as efficient within 0.1 points).
    before_up = text.split(f", {up['config']} (efficiency")[0].rsplit(": ", 1)[1]
    assert before_up.startswith(("more efficient", "as efficient")), text
    assert "less efficient, " in text.split(f", {down['config']} (efficiency")[0], text
    for other in (up, down):
        assert " ".join(f"'{o}'" for o in other["overrides"]) in text
    assert text in proc.stdout.splitlines()  # printed as one line, overrides whole


@pytest.mark.parametrize("argv, message", [
    (["--frontier", "--compare", "windowed"], "drop --compare"),
    (["--out", "x.yaml"], "--out goes with --calibrate"),
])
def test_cli_refuses_combinations_that_mean_nothing(config_file, capsys, argv, message) -> None:
    assert main(["simulate", "--config", str(config_file), *argv]) != 0
    assert message in capsys.readouterr().err


def test_cli_needs_a_config_or_a_run_to_calibrate(capsys) -> None:
    assert main(["simulate"]) != 0
    assert "--config FILE (or --calibrate RUN_DIR" in capsys.readouterr().err
