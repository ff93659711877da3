"""Generation-latency models for the simulator: constant, lognormal, bimodal,
empirical, and ``tokens`` (lengths and load, what ``--calibrate`` fits).

A model turns the ``simulate.generation_latency_s`` config block into three things:

* :meth:`LatencyModel.draw`: ``k`` seeded samples at once (the simulated engine
  draws in batches because one Python call per group is the simulator's hot path).
  A sample is a latency in seconds, or for ``tokens`` a group's lengths;
* :meth:`LatencyModel.work`: what one sample means for a group that starts while
  ``busy`` groups generate (itself included): its latency and when each of its
  tokens is sampled (a :class:`Work`);
* :meth:`LatencyModel.mean_at`: the expected latency at that load, which the
  physical bound uses. It is analytic for the parametric models and the sample
  mean for the empirical ones.

Token timing: every completion of a group gets its first token ``base_s`` after
the group starts and one more every ``token_s``. The time-based models have no
lengths of their own: a completion generates ``simulate.tokens_per_s`` tokens
per second of its group's latency, all of a group's completions alike.

All randomness comes from the ``random.Random`` the caller passes in, so a run
is a pure function of the config seed.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from asyncrl.config import (
    BimodalLatency,
    ConstantLatency,
    EmpiricalLatency,
    LatencyConfig,
    LognormalLatency,
    TokenLatency,
)
from asyncrl.errors import ConfigError


class Work(NamedTuple):
    """One group's generation: ``latency`` seconds in its slot; each completion's
    token ``j`` (from 0) is sampled at ``base_s + (j + 1) * token_s``; the longest
    completion has ``longest`` tokens (it ends the group) and the mean one ``mean``.
    (A named tuple: one is made per simulated group.)"""

    latency: float
    base_s: float
    token_s: float
    longest: int
    mean: float


#: ``Work`` from a tuple of its fields, in C (``Work(*fields)`` is a Python call).
_new_work = functools.partial(tuple.__new__, Work)


class LatencyModel:
    """Base class of the models. The time-based ones draw latencies in seconds."""

    #: The latency depends on how many groups decode at the same time: the fleet
    #: then shares one engine (:mod:`asyncrl.sim.sharing`), with
    #: :meth:`seconds_per_token` for a decode step.
    load_dependent = False

    def seconds_per_token(self, decoding: int) -> float:
        """One decode step while ``decoding`` groups decode (load-dependent models)."""
        raise NotImplementedError

    @property
    def mean(self) -> float:
        """Expected latency in seconds (of a group generating alone)."""
        raise NotImplementedError

    def mean_at(self, busy: int) -> float:
        """Expected latency of a group while ``busy`` groups generate (itself included)."""
        return self.mean

    def mean_tokens(self, tokens_per_s: float) -> float:
        """Expected tokens of a completion."""
        return self.mean * tokens_per_s

    def draw(self, rng: random.Random, k: int) -> list[Any]:
        """``k`` independent samples (latencies in seconds for the time-based models)."""
        raise NotImplementedError

    def work(self, sample: Any, busy: int, tokens_per_s: float) -> Work:
        """What ``sample`` takes for a group that starts while ``busy`` groups
        generate (itself included); ``tokens_per_s`` is ``simulate.tokens_per_s``."""
        latency = float(sample)
        longest = max(1, round(latency * tokens_per_s))
        return Work(latency, 0.0, latency / longest, longest, float(longest))

    def works(self, samples: list[Any], tokens_per_s: float) -> list[Work]:
        """:meth:`work` of each of ``samples`` for a group that generates alone
        (``busy = 1``), the very same numbers computed for all at once (cohort
        mode reads a batch of first attempts at a time). A model that overrides
        :meth:`work` overrides this too."""
        import numpy as np  # here: only cohort mode pays for the import

        latency = np.array(samples, dtype=float)
        # rint rounds half to even like round(); the operations are IEEE's, so
        # each value is the one work() computes.
        longest = np.maximum(np.rint(latency * tokens_per_s), 1.0)
        return list(map(_new_work, zip(latency.tolist(), itertools.repeat(0.0),
                                       (latency / longest).tolist(),
                                       longest.astype(np.int64).tolist(), longest.tolist())))

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
        if type(rng) is random.Random:
            return _lognormvariates(rng, k, mu, sigma)
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


@dataclass(frozen=True)
class Tokens(LatencyModel):
    """``base_s + longest * (per_token_s + per_token_per_group_s * (busy - 1))``
    at a steady load of ``busy`` groups, with ``(longest, mean)`` lengths
    resampled from observed groups. In the simulated engine the load is
    whatever decodes at each step (see :mod:`asyncrl.sim.sharing`)."""

    lengths: tuple[tuple[int, float], ...]
    base_s: float
    per_token_s: float
    per_token_per_group_s: float

    load_dependent = True

    def seconds_per_token(self, decoding: int) -> float:
        return self.per_token_s + self.per_token_per_group_s * max(decoding - 1, 0)

    @property
    def mean(self) -> float:
        return self.mean_at(1)

    def mean_at(self, busy: int) -> float:
        longest = math.fsum(n for n, _ in self.lengths) / len(self.lengths)
        return self.base_s + longest * self.seconds_per_token(busy)

    def mean_tokens(self, tokens_per_s: float) -> float:
        return math.fsum(m for _, m in self.lengths) / len(self.lengths)

    def draw(self, rng: random.Random, k: int) -> list[Any]:
        values, n, uniform = self.lengths, len(self.lengths), rng.random
        return [values[int(uniform() * n)] for _ in range(k)]

    def works(self, samples: list[Any], tokens_per_s: float) -> list[Work]:
        return [self.work(sample, 1, tokens_per_s) for sample in samples]

    def work(self, sample: Any, busy: int, tokens_per_s: float) -> Work:
        longest, mean = sample
        token_s = self.seconds_per_token(busy)
        return Work(self.base_s + longest * token_s, self.base_s, token_s, longest, mean)

    def describe(self) -> str:
        longest = math.fsum(n for n, _ in self.lengths) / len(self.lengths)
        return (f"tokens: {len(self.lengths)} observed groups (longest completion "
                f"{longest:.3g} tokens on average), {self.base_s:.3g}s + "
                f"{self.per_token_s:.3g}s/token + {self.per_token_per_group_s:.3g}s/token "
                "per other group")


def _lognormvariates(rng: random.Random, k: int, mu: float, sigma: float) -> list[float]:
    """``[rng.lognormvariate(mu, sigma) for _ in range(k)]``, the very same
    numbers, and ``rng`` left where those calls leave it, in a few vectorized
    passes instead of three Python calls per draw (the simulator's hot path).

    ``random.Random`` is the Mersenne Twister that numpy's ``MT19937`` also is:
    started from ``rng``'s state it yields the same 32-bit words, and
    ``random()`` makes a float of two of them (27 and 26 bits, exact in
    float64). ``normalvariate`` is Kinderman and Monahan's ratio of uniforms:
    each attempt reads two ``random()`` and is kept when ``z * z / 4 <= -log(u2)``;
    the attempts are independent, so the kept ones, in order, are the draws.
    The arithmetic is the same IEEE operations in the same order, and ``exp``
    is ``math``'s, as in ``random``. tests/sim/test_latency.py checks it against
    ``rng.lognormvariate`` itself."""
    if k <= 0:
        return []
    import numpy as np  # here: the CLI does not pay for the import

    version, internal, gauss_next = rng.getstate()
    bits = np.random.MT19937()
    bits.state = {"bit_generator": "MT19937",
                  "state": {"key": np.array(internal[:-1], dtype=np.uint32),
                            "pos": internal[-1]}}
    zs = []
    while True:
        before = bits.state
        attempts = k + k // 2 + 16  # ~1.37 attempts per draw
        words = bits.random_raw(4 * attempts).reshape(attempts, 4)
        u1 = _unit_floats(words[:, 0], words[:, 1])
        u2 = 1.0 - _unit_floats(words[:, 2], words[:, 3])
        z = random.NV_MAGICCONST * (u1 - 0.5) / u2
        kept = np.flatnonzero(_accepted(z * z / 4.0, u2))[:k]
        zs.append(z[kept])
        k -= len(kept)
        if not k:
            # The attempts after the last kept one were never made: rng goes on
            # from there, as if the draws were its own.
            bits.state = before
            bits.random_raw(4 * (int(kept[-1]) + 1))
            state = bits.state["state"]
            rng.setstate((version, (*state["key"].tolist(), int(state["pos"])), gauss_next))
            return list(map(math.exp, (mu + np.concatenate(zs) * sigma).tolist()))


def _unit_floats(high: Any, low: Any) -> Any:
    """``random.random()`` of each pair of 32-bit words."""
    return ((high >> 5) * 67108864.0 + (low >> 6)) * (1.0 / 9007199254740992.0)


def _accepted(zz: Any, u2: Any) -> Any:
    """``zz <= -log(u2)`` for each attempt, with ``math.log``'s verdict: numpy's
    log may differ from it in the last bits, so the attempts that close to the
    line are decided again with ``math.log`` itself."""
    import numpy as np

    neg_log = -np.log(u2)
    kept = zz <= neg_log
    for i in np.flatnonzero(np.abs(zz - neg_log) <= 1e-12 * neg_log).tolist():
        kept[i] = zz[i] <= -math.log(u2[i])
    return kept


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
    if isinstance(cfg, TokenLatency):
        return Tokens(tuple((int(n), float(m)) for n, m in cfg.lengths), cfg.base_s,
                      cfg.per_token_s, cfg.per_token_per_group_s)
    raise TypeError(f"unknown latency config {type(cfg).__name__}")
