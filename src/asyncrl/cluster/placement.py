"""Can Ray place more rollout workers? ``fleet scale``'s up-front check, and the
numbers its messages give (docs/ray.md, "Scaling the workers").

A worker Ray cannot place waits in Ray's queue, silently, until
``cluster.actor_startup_timeout_s``. So before starting one the fleet compares
what the new workers ask for (``cluster.rollout_worker`` each) with what the
cluster could ever offer them: its total resources less what this run's own
actors hold (the trainer, and every worker that works or is starting). Only
that is grounds to refuse: what is *available* at this instant may be low for
a moment (another job's tasks, an actor being torn down), so a request that
fits the total but not the free resources is started and waits, bounded by the
timeout, with a line saying why.

The check adds up the nodes, so a request that fits in sum but on no single
node still waits (and the timeout names the numbers).

An autoscaler may add nodes: with ``cluster.address`` (or ``RAY_ADDRESS``) set
(the run joins a cluster someone started, which may autoscale) a request beyond the total is a
warning and the same bounded wait; with a Ray instance the run starts itself
(``address: null``) nothing adds nodes, and it is refused at once.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from asyncrl._util.text import plural
from asyncrl.config import ActorResources
from asyncrl.errors import FleetError

#: Ray keeps resources in fixed point (1e-4); a sum of fractions may miss by that.
_SLACK = 1e-6

Resources = Mapping[str, float]


def asks(res: ActorResources, count: float = 1) -> dict[str, float]:
    """What ``count`` actors of ``res`` ask Ray for, by Ray's resource name."""
    return {kind: amount * count for kind, amount in (("CPU", res.num_cpus),
                                                      ("GPU", res.num_gpus)) if amount > 0}


def _show(res: Resources, keys: list[str]) -> str:
    return ", ".join(f"{k} {res.get(k, 0.0):g}" for k in keys) or "nothing"


@dataclasses.dataclass(frozen=True)
class Placement:
    """What one rollout worker asks for, what the trainer holds, and where to
    read the cluster's resources now (``ray.available_resources`` and
    ``ray.cluster_resources``; a test passes its own)."""

    worker: Resources
    trainer: Resources
    #: The cluster may add nodes (``cluster.address`` set): wait, not refuse.
    autoscaling: bool
    available: Callable[[], Resources]
    total: Callable[[], Resources]

    def numbers(self) -> str:
        """'it asks for CPU 0.5 (cluster.rollout_worker); the cluster has CPU 0 of 2 available'."""
        keys = sorted(self.worker)
        available, total = self.available(), self.total()
        has = ", ".join(f"{k} {available.get(k, 0.0):g} of {total.get(k, 0.0):g}" for k in keys)
        return (f"it asks for {_show(self.worker, keys)} (cluster.rollout_worker); the "
                f"cluster has {has or 'room'} available")

    def most(self, total: Resources) -> int | None:
        """The most workers the cluster's ``total`` holds beside the trainer (None: no bound)."""
        fits = [(total.get(k, 0.0) - self.trainer.get(k, 0.0) + _SLACK) / need
                for k, need in self.worker.items()]
        return max(math.floor(min(fits)), 0) if fits else None

    def check(self, joining: int, working: int) -> str | None:
        """Before starting ``joining`` workers beside ``working`` (working or
        starting): FleetError when the cluster can never hold them and no
        autoscaler may add a node; else a warning line when they cannot be
        placed now (None: they fit now)."""
        total, available = self.total(), self.available()
        most = self.most(total)
        if most is not None and working + joining > most:
            if not self.autoscaling:
                keys = sorted(self.worker)
                held = {k: self.trainer.get(k, 0.0) + working * self.worker[k] for k in keys}
                fix = (f"or scale to {max(most, 1)} at most" if most >= 1 else
                       "or lower cluster.trainer's request")
                raise FleetError(
                    f"Ray cannot place {plural(joining, 'more rollout worker')}: "
                    f"each asks for {_show(self.worker, keys)} (cluster.rollout_worker); of the "
                    f"cluster's {_show(total, keys)} this run's trainer and "
                    f"{plural(working, 'worker')} hold {_show(held, keys)}. Lower "
                    f"cluster.rollout_worker.num_cpus/num_gpus, add nodes to the Ray cluster, "
                    f"{fix}")
            return (f"the Ray cluster cannot hold {working + joining} rollout workers now "
                    f"(at most {most}); waiting for its autoscaler to add a node")
        if any(joining * need > available.get(k, 0.0) + _SLACK for k, need in self.worker.items()):
            return ("Ray has too little free for it now (other jobs or actors hold the rest); "
                    "waiting for it to free up")
        return None


__all__ = ["Placement", "asks"]
