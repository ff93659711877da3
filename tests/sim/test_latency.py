"""The four latency models: seeded sampling, analytic means, empirical files and their errors."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from asyncrl.config import (
    BimodalLatency,
    ConstantLatency,
    EmpiricalLatency,
    LognormalLatency,
    LognormalParams,
)
from asyncrl.errors import ConfigError
from asyncrl.sim.latency import (
    Bimodal,
    Constant,
    Empirical,
    Lognormal,
    Tokens,
    _accepted,
    make_latency_model,
)


def test_constant_draws_its_value_and_consumes_no_randomness() -> None:
    rng = random.Random(1)
    state = rng.getstate()
    model = make_latency_model(ConstantLatency(value=7.5))
    assert model.draw(rng, 4) == [7.5] * 4
    assert model.mean == 7.5
    assert rng.getstate() == state


def test_lognormal_is_seeded_and_has_the_configured_median_and_mean() -> None:
    model = make_latency_model(LognormalLatency(median=30.0, sigma=0.8))
    assert isinstance(model, Lognormal)
    a = model.draw(random.Random(3), 20_000)
    assert a == model.draw(random.Random(3), 20_000)
    assert a != model.draw(random.Random(4), 20_000)
    assert statistics.median(a) == pytest.approx(30.0, rel=0.03)
    assert model.mean == pytest.approx(30.0 * math.exp(0.8**2 / 2))
    assert statistics.fmean(a) == pytest.approx(model.mean, rel=0.03)


def test_bimodal_mixes_in_the_slow_fraction() -> None:
    cfg = BimodalLatency(fast=LognormalParams(median=10.0, sigma=0.1),
                         slow=LognormalParams(median=100.0, sigma=0.1), slow_fraction=0.2)
    model = make_latency_model(cfg)
    assert isinstance(model, Bimodal)
    draws = model.draw(random.Random(5), 20_000)
    slow = sum(x > 40 for x in draws) / len(draws)
    assert slow == pytest.approx(0.2, abs=0.01)
    expected = 0.8 * 10 * math.exp(0.005) + 0.2 * 100 * math.exp(0.005)
    assert model.mean == pytest.approx(expected)
    assert statistics.fmean(draws) == pytest.approx(expected, rel=0.02)
    assert draws == model.draw(random.Random(5), 20_000)


def test_empirical_resamples_the_file_and_skips_blanks_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "lat.txt"
    path.write_text("# seconds per group, from the engine log\n12.5\n\n  30\n7 # a fast one\n")
    model = make_latency_model(EmpiricalLatency(path=str(path)))
    assert isinstance(model, Empirical)
    assert model.values == (12.5, 30.0, 7.0)
    assert model.mean == pytest.approx((12.5 + 30 + 7) / 3)
    draws = model.draw(random.Random(0), 3000)
    assert set(draws) == {12.5, 30.0, 7.0}
    assert draws == model.draw(random.Random(0), 3000)


def test_empirical_relative_path_is_found_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "lat.txt").write_text("4\n")
    model = make_latency_model(EmpiricalLatency(path="lat.txt"), base_dir=tmp_path)
    assert model.mean == 4.0


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "does not exist"),
        ("", "holds no latencies"),
        ("# only a comment\n\n", "holds no latencies"),
        ("1.0\n2.0\nfast\n", "line 3: 'fast' is not a number"),
        ("1.0\n-2\n", "line 2: '-2' is not a finite latency >= 0"),
        ("nan\n", "line 1"),
    ],
)
def test_empirical_file_errors_name_the_path_and_line(tmp_path: Path, content, expected) -> None:
    path = tmp_path / "observed.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as err:
        make_latency_model(EmpiricalLatency(path=str(path)))
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_descriptions_mention_the_parameters() -> None:
    assert Constant(3.0).describe() == "constant 3s"
    assert "median 30s" in Lognormal(30.0, 0.5).describe()
    assert "8%" in Bimodal(Lognormal(1, 0), Lognormal(9, 0), 0.08).describe()


@pytest.mark.parametrize("model", [
    Constant(7.5), Constant(0.0), Lognormal(20.0, 1.5),
    Bimodal(Lognormal(2.0, 0.3), Lognormal(60.0, 0.5), 0.2),
    Empirical((0.001, 0.5, 2.5, 3.5, 1e4), "x.txt"),
    Tokens(((100, 80.0), (7, 7.0)), 0.5, 0.01, 0.001)])
@pytest.mark.parametrize("tokens_per_s", [1.0, 20.0, 0.3])
def test_works_of_a_batch_are_what_work_makes_of_each(model, tokens_per_s: float) -> None:
    # Cohort mode turns a batch of first attempts into Work at once; any
    # difference from work() (rounding half to even, ints, the float mean)
    # would make it drift from the per-group mode.
    samples = model.draw(random.Random(5), 2_000)
    expect = [model.work(sample, 1, tokens_per_s) for sample in samples]
    got = model.works(samples, tokens_per_s)
    assert got == expect
    assert [tuple(map(type, w)) for w in got] == [tuple(map(type, w)) for w in expect]


@pytest.mark.parametrize("k", [0, 1, 5, 4096, 20_000])
@pytest.mark.parametrize(("median", "sigma"), [(20.0, 0.6), (1.0, 2.0), (0.05, 0.01)])
def test_lognormal_draws_are_random_lognormvariate_to_the_bit(k: int, median: float,
                                                              sigma: float) -> None:
    # The draws are vectorized; both simulator modes, and every result a seed
    # gave before, rely on their being exactly lognormvariate's numbers, with
    # the generator left where lognormvariate leaves it.
    ours, ref = random.Random(k), random.Random(k)
    ours.random(), ref.random()  # anywhere in the twister's block
    expect = [ref.lognormvariate(math.log(median), sigma) for _ in range(k)]
    assert Lognormal(median, sigma).draw(ours, k) == expect
    assert ours.getstate() == ref.getstate()


def test_an_attempt_on_the_line_is_decided_by_math_log() -> None:
    # normalvariate keeps an attempt when z * z / 4 <= -log(u2), with math.log:
    # on the line (and one float either side) the vectorized test agrees.
    import numpy as np

    u2 = np.array([0.3, 0.3, 0.3, 0.999, 1.0])
    line = [-math.log(x) for x in u2.tolist()]
    zz = np.array([line[0], math.nextafter(line[1], math.inf),
                   math.nextafter(line[2], -math.inf), line[3], 0.0])
    assert _accepted(zz, u2).tolist() == [True, False, True, True, True]
