"""Generation-latency models for the simulator: constant, lognormal, bimodal, empirical.

A model turns the ``simulate.generation_latency_s`` config block into two things:

* :meth:`LatencyModel.draw`: ``k`` seeded samples at once (the simulated engine
  draws in batches because one Python call per group is the simulator's hot path);
* :attr:`LatencyModel.mean`: the expected latency, which the physical bound uses.
  It is analytic for the parametric models and the sample mean for empirical.

All randomness comes from the ``random.Random`` the caller passes in, so a run
is a pure function of the config seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from asyncrl.config import (
    BimodalLatency,
    ConstantLatency,
    EmpiricalLatency,
    LatencyConfig,
    LognormalLatency,
)
from asyncrl.errors import ConfigError


class LatencyModel:
    """Base class of the four models."""

    @property
    def mean(self) -> float:
        """Expected latency in seconds."""
        raise NotImplementedError

    def draw(self, rng: random.Random, k: int) -> list[float]:
        """``k`` independent latencies in seconds."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Constant(LatencyModel):
    value: float

    @property
    def mean(self) -> float:
        return self.value

    def draw(self, rng: random.Random, k: int) -> list[float]:
        # No draw from rng: a constant consumes no randomness, so switching a
        # component to constant leaves every other stream unchanged.
        return [self.value] * k

    def describe(self) -> str:
        return f"constant {self.value:g}s"


@dataclass(frozen=True)
class Lognormal(LatencyModel):
    """``median * exp(sigma * Z)``: the median is ``median`` and the mean
    ``median * exp(sigma**2 / 2)``; ``sigma >= 1`` is a heavy tail."""

    median: float
    sigma: float

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma**2 / 2)

    def draw(self, rng: random.Random, k: int) -> list[float]:
        mu, sigma = math.log(self.median), self.sigma
        lognorm = rng.lognormvariate
        return [lognorm(mu, sigma) for _ in range(k)]

    def describe(self) -> str:
        return f"lognormal median {self.median:g}s sigma {self.sigma:g}"


@dataclass(frozen=True)
class Bimodal(LatencyModel):
    """A mixture: with probability ``slow_fraction`` the slow lognormal, else the fast one
    (e.g. most answers short, a few that run to the token limit)."""

    fast: Lognormal
    slow: Lognormal
    slow_fraction: float

    @property
    def mean(self) -> float:
        f = self.slow_fraction
        return (1 - f) * self.fast.mean + f * self.slow.mean

    def draw(self, rng: random.Random, k: int) -> list[float]:
        fast_mu, fast_sigma = math.log(self.fast.median), self.fast.sigma
        slow_mu, slow_sigma = math.log(self.slow.median), self.slow.sigma
        f = self.slow_fraction
        uniform, lognorm = rng.random, rng.lognormvariate
        return [
            lognorm(slow_mu, slow_sigma) if uniform() < f else lognorm(fast_mu, fast_sigma)
            for _ in range(k)
        ]

    def describe(self) -> str:
        return (
            f"bimodal {1 - self.slow_fraction:.0%} ~{self.fast.median:g}s / "
            f"{self.slow_fraction:.0%} ~{self.slow.median:g}s"
        )


@dataclass(frozen=True)
class Empirical(LatencyModel):
    """Observed latencies, resampled uniformly with replacement (a bootstrap)."""

    values: tuple[float, ...]
    path: str

    @property
    def mean(self) -> float:
        return math.fsum(self.values) / len(self.values)

    def draw(self, rng: random.Random, k: int) -> list[float]:
        values, n, uniform = self.values, len(self.values), rng.random
        return [values[int(uniform() * n)] for _ in range(k)]

    def describe(self) -> str:
        return f"empirical {len(self.values)} samples from {self.path} (mean {self.mean:.3g}s)"


def load_latency_file(path: str | Path) -> tuple[float, ...]:
    """Parse one latency in seconds per line; blank lines and ``#`` comments are skipped.

    Every problem is a :class:`ConfigError` naming the file (and the line), since
    the file is part of the configuration.
    """
    p = Path(path)
    hint = "write one latency in seconds per line (e.g. exported from your engine's logs)"
    if not p.is_file():
        raise ConfigError(
            f"simulate.generation_latency_s.path: latency file {str(p)!r} does not exist; {hint}"
        )
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"latency file {str(p)!r} cannot be read ({exc}); {hint}") from None
    values: list[float] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            value = float(line)
        except ValueError:
            raise ConfigError(
                f"latency file {str(p)!r}, line {lineno}: {raw.strip()!r} is not a number; {hint}"
            ) from None
        if not math.isfinite(value) or value < 0:
            raise ConfigError(
                f"latency file {str(p)!r}, line {lineno}: {raw.strip()!r} is not a finite "
                f"latency >= 0; {hint}"
            )
        values.append(value)
    if not values:
        raise ConfigError(f"latency file {str(p)!r} holds no latencies; {hint}")
    return tuple(values)


def resolve_latency_path(path: str, base_dir: str | Path | None) -> Path:
    """A relative path is looked up beside the config file first, then in the cwd."""
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir is not None:
        beside = Path(base_dir) / p
        if beside.is_file():
            return beside
    return p


def make_latency_model(cfg: LatencyConfig, *, base_dir: str | Path | None = None) -> LatencyModel:
    """The model a ``generation_latency_s`` block describes."""
    if isinstance(cfg, ConstantLatency):
        return Constant(cfg.value)
    if isinstance(cfg, LognormalLatency):
        return Lognormal(cfg.median, cfg.sigma)
    if isinstance(cfg, BimodalLatency):
        return Bimodal(
            Lognormal(cfg.fast.median, cfg.fast.sigma),
            Lognormal(cfg.slow.median, cfg.slow.sigma),
            cfg.slow_fraction,
        )
    if isinstance(cfg, EmpiricalLatency):
        path = resolve_latency_path(cfg.path, base_dir)
        return Empirical(load_latency_file(path), str(path))
    raise TypeError(f"unknown latency config {type(cfg).__name__}")
