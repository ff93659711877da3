"""The latency fit with the groups still running counted (issue 38).

Right after the latency grows, the window's finished generations are mostly
short ones: the long groups of the new workload have not finished yet, so a fit
from the finished ones alone says the latency is what it was. When the planner
has the run's state, each in-flight group's age is a right-censored
observation (its latency is *at least* its age), and :func:`censored_fit`
fits the latency distribution by the Kaplan-Meier (product-limit) estimate
over the finished latencies (events) and those ages (censored).

The planner resamples its fit uniformly (:class:`~asyncrl.sim.latency.Empirical`,
:class:`~asyncrl.sim.seed.Tail`), so the fit is returned as latencies at evenly
spaced quantiles of the estimate: one per observation, finished or censored.

**Beyond the largest observation.** Where the largest observation is an age,
the estimate leaves mass ``S`` (its survival there) undistributed: those groups
run longer than anything seen. That mass goes to the lognormal fitted to the
finished latencies (log-mean, log-sd), conditioned on exceeding the largest
observation (:func:`_beyond`); without a spread to fit (fewer than two distinct
finished latencies) it sits at the largest observation itself, the least the
data says. Both read low rather than high: the bounds' bias correction and the
next re-plan (which sees those groups finish) take it from there.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence


def kaplan_meier(events: Sequence[float],
                 censored: Sequence[float]) -> list[tuple[float, float]]:
    """The product-limit estimate: ``(t, S(t))`` after each distinct event time
    ``t``, ascending. At a time with both, the events come first (a group
    censored at ``t`` was still at risk at ``t``, the usual convention)."""
    ev, ce = sorted(events), sorted(censored)
    out, surv = [], 1.0
    i = 0
    while i < len(ev):
        t = ev[i]
        d = bisect.bisect_right(ev, t) - i
        # At risk at t: every observation >= t (events and censored alike).
        at_risk = (len(ev) - i) + (len(ce) - bisect.bisect_left(ce, t))
        surv *= 1.0 - d / at_risk
        out.append((t, surv))
        i += d
    return out


def censored_fit(events: Sequence[float], censored: Sequence[float]) -> list[float]:
    """Latencies at the quantiles ``(k + 0.5) / n`` of the Kaplan-Meier estimate
    (``n`` observations in all), the mass beyond the largest observation from
    the conditioned lognormal (module docstring). Without censored
    observations this is the finished latencies themselves, sorted."""
    if not censored:
        return sorted(events)
    steps = kaplan_meier(events, censored)
    cdf = [1.0 - s for _, s in steps]
    n = len(events) + len(censored)
    top = max(max(censored), max(events, default=0.0))
    rest = 1.0 - (cdf[-1] if cdf else 0.0)  # survival past the last event
    out = []
    for k in range(n):
        p = (k + 0.5) / n
        if cdf and p <= cdf[-1]:  # the first event time whose CDF reaches p
            out.append(steps[bisect.bisect_left(cdf, p)][0])
        else:  # the mass beyond the largest observation, by its own quantile
            out.append(_beyond(events, top, (p - (1.0 - rest)) / rest))
    return out


def _beyond(events: Sequence[float], top: float, q: float) -> float:
    """The ``q`` quantile of the lognormal fitted to ``events`` conditioned on
    exceeding ``top``; ``top`` itself when nothing can be fitted."""
    logs = [math.log(x) for x in events if x > 0]
    if len(set(logs)) < 2 or top <= 0:
        return top
    dist = statistics.NormalDist.from_samples(logs)
    lo = dist.cdf(math.log(top))
    u = min(lo + (1.0 - lo) * q, 1.0 - 1e-12)  # inv_cdf(1) is infinite
    return max(top, math.exp(dist.inv_cdf(u)))


__all__ = ["censored_fit", "kaplan_meier"]
