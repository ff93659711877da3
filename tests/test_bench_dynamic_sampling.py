"""benchmarks/bench_dynamic_sampling.py's measure: wall time and generated tokens
when the held-out reward first reaches the target (its runs:
``python benchmarks/bench_dynamic_sampling.py --smoke``)."""

from __future__ import annotations

import math

import pytest

from tests.benchscripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_dynamic_sampling")


def rows(evals: dict[int, float], steps: int = 10) -> list[dict]:
    out = []
    for step in range(steps):
        row = {"step": step, "wall_time_s": 2.0 * (step + 1), "rollout/generated_tokens": 100}
        if step in evals:
            row["eval/reward_mean"] = evals[step]
        out.append(row)
    return out


def test_the_target_is_the_mean_of_the_last_three_evaluations(bench) -> None:
    # evaluations at steps 1, 3, 5, 7: means of three 0.42 (steps 1-5), then 0.75 (3-7)
    got = bench.to_target(rows({1: 0.25, 3: 0.5, 5: 0.5, 7: 1.25}), target=0.75)
    assert got == (16.0, 800.0, 0.75)
    # tokens count every step's generation, evaluated or not
    assert bench.to_target(rows({0: 1.0, 1: 1.0, 2: 1.0}), target=0.5)[:2] == (6.0, 300.0)


def test_a_run_that_never_reaches_the_target_is_infinitely_slow(bench) -> None:
    wall, tokens, last = bench.to_target(rows({1: 0.1, 3: 0.2, 5: 0.3}), target=0.9)
    assert math.isinf(wall) and math.isinf(tokens) and last == pytest.approx(0.2)
    assert bench.ratio(math.inf, 10.0) == math.inf and bench.ratio(5.0, 10.0) == 0.5
    # a baseline that never got there measures nothing
    assert math.isnan(bench.ratio(5.0, math.inf)) and math.isnan(bench.ratio(math.inf, math.inf))
