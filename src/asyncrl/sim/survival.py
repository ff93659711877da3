"""The latency fit from a fit window that saw groups only in part (issue 38).

The planner fits the generation latency on a sliding window of the run (its
newest ``fit_steps`` steps). Two things bias the generations it sees there:

* **right censoring.** Right after the latency grows, the window's finished
  generations are mostly short ones: the long groups of the new workload have
  not finished yet. A group still generating at the boundary is a censored
  observation: its latency is *at least* its age.
* **left truncation.** A group dispatched before the window began is seen only
  because it was still generating when the window began: long groups are
  over-represented among those (length bias; in a steady state a group is in
  flight at a given moment in proportion to its latency). Counted from age 0
  they make the fit heavier than the workload.

Each group the window saw is an :class:`Observed`: it *enters* observation at
the age it had when the window began (``entry``, 0 for one dispatched inside
the window: delayed entry) and *leaves* at its latency (finished) or at its age
at the boundary (still generating). :func:`product_limit` is the
product-limit (Kaplan-Meier) estimate with delayed entry: at each latency ``t``
that finished, the survival is multiplied by ``1 - d / n``, ``d`` the groups
that finished at ``t`` and ``n`` the risk set, the groups with
``entry < t <= exit`` (a group that entered at ``t`` or later had not been seen
at ``t``; one censored at ``t`` was still at risk).

The planner resamples its fit uniformly (:class:`~asyncrl.sim.latency.Empirical`,
:class:`~asyncrl.sim.seed.Tail`), so :func:`fit_latencies` returns latencies at
evenly spaced quantiles of the estimate, one per observation.

**Beyond the largest observation.** Where the largest observation is an age,
the estimate leaves mass ``S`` (its survival there) undistributed: those groups
run longer than anything seen. That mass goes to the lognormal fitted to the
finished latencies (log-mean, log-sd), conditioned on exceeding the largest
observation (:class:`_Beyond`); without a spread to fit (fewer than two
distinct finished latencies) it sits at the largest observation itself, the
least the data says. Both read low rather than high: the bounds' bias
correction and the next re-plan (which sees those groups finish) take it from
there.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import NamedTuple


class Observed(NamedTuple):
    """One group as the fit window saw it (module docstring)."""

    #: Its age when the window began; 0 when it was dispatched inside the window.
    entry: float
    #: Its latency (``finished``), or its age at the window's end (still generating).
    exit: float
    finished: bool


def observed(start: float, end: float, window_start: float, *, finished: bool) -> Observed:
    """The :class:`Observed` of a group dispatched at ``start`` and seen until
    ``end`` (its finish, or the window's end) by a window that began at
    ``window_start`` (all on one clock)."""
    return Observed(max(0.0, window_start - start), max(0.0, end - start), finished)


def _seen(observations: Iterable[Observed]) -> list[Observed]:
    """The observations in some risk set: a group that entered at (or after)
    its exit was never seen alive in the window, and says nothing."""
    return [o for o in observations if o.entry == 0.0 or o.entry < o.exit]


def product_limit(observations: Iterable[Observed]) -> list[tuple[float, float]]:
    """The product-limit estimate with delayed entry and right censoring:
    ``(t, S(t))`` after each distinct finished latency ``t``, ascending."""
    seen = _seen(observations)
    events = sorted(o.exit for o in seen if o.finished)
    # A group dispatched inside the window is at risk from age 0 on (-inf: it
    # counts at an event at age 0 too); the others from just past their entry.
    entries = sorted(o.entry if o.entry > 0.0 else -math.inf for o in seen)
    exits = sorted(o.exit for o in seen)
    out, surv, i = [], 1.0, 0
    while i < len(events):
        t = events[i]
        d = bisect.bisect_right(events, t) - i
        # Entered before t, minus left before t (a group leaves after it enters).
        at_risk = bisect.bisect_left(entries, t) - bisect.bisect_left(exits, t)
        surv *= 1.0 - d / at_risk
        out.append((t, surv))
        i += d
    return out


def fit_latencies(observations: Iterable[Observed]) -> list[float]:
    """Latencies at the quantiles ``(k + 0.5) / n`` of :func:`product_limit`'s
    estimate (``n`` the observations it used), the mass beyond the largest
    observation from the conditioned lognormal (module docstring)."""
    seen = _seen(observations)
    if not seen:
        return []
    steps = product_limit(seen)
    cdf = [1.0 - s for _, s in steps]
    reached = cdf[-1] if cdf else 0.0
    beyond = _Beyond([o.exit for o in seen if o.finished], max(o.exit for o in seen))
    n = len(seen)
    out = []
    for k in range(n):
        p = (k + 0.5) / n
        if p <= reached:  # the first finished latency whose CDF reaches p
            out.append(steps[bisect.bisect_left(cdf, p)][0])
        else:  # the mass beyond the largest observation, by its own quantile
            out.append(beyond.quantile((p - reached) / (1.0 - reached)))
    return out


class _Beyond:
    """The lognormal fitted to the finished latencies, conditioned on exceeding
    ``top`` (fitted once: a fit asks it for every quantile past the estimate)."""

    def __init__(self, finished: Sequence[float], top: float) -> None:
        logs = [math.log(x) for x in finished if x > 0]
        self.top = top
        self.dist = (statistics.NormalDist.from_samples(logs)
                     if len(set(logs)) >= 2 and top > 0 else None)
        self.lo = self.dist.cdf(math.log(top)) if self.dist is not None else 1.0

    def quantile(self, q: float) -> float:
        """Its ``q`` quantile; ``top`` itself when nothing could be fitted."""
        if self.dist is None:
            return self.top
        u = min(self.lo + (1.0 - self.lo) * q, 1.0 - 1e-12)  # inv_cdf(1) is infinite
        return max(self.top, math.exp(self.dist.inv_cdf(u)))


__all__ = ["Observed", "fit_latencies", "observed", "product_limit"]
