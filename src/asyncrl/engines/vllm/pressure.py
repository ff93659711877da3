"""How loaded vLLM is (:class:`~asyncrl.engines.ReportsPressure`), for both vLLM
engines: requests running and waiting, KV-cache usage, preemptions so far.

* In process (``VLLMEngine``): vLLM hands a stat logger its scheduler's
  numbers after every engine step, on the engine's event loop (vLLM 0.32's
  ``StatLoggerBase``; the engine passes :func:`stat_loggers` to ``AsyncLLM``). The
  :class:`PressureGauge` keeps the newest requests running and waiting and the
  *highest* KV-cache usage since the last read, so ``pressure()`` only reads
  them: the aimd autopilot reads once per decision, steps apart, and trims above
  a high mark, so a spike between two reads must count (the newest sample alone
  could be taken just after it drained).
* Over HTTP (``VLLMServerEngine``): each live server's Prometheus ``/metrics``,
  parsed with ``prometheus_client``'s parser: ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` (a fraction,
  despite its name) and the counter ``vllm:num_preemptions`` (sample
  ``vllm:num_preemptions_total``), summed over vLLM's per-engine labels (the
  highest KV-cache usage). The KV-cache usage is a Prometheus *gauge*: the
  server exports only its value at the moment ``/metrics`` is read (no maximum
  over time, and polling it between decisions would be a request per interval
  to every server), so over HTTP it is a point sample and a spike between two
  reads is missed (one that ran out of KV cache still shows: its preemptions
  are a counter, which the aimd rule cuts on first). A server that runs without stats
  (``--disable-log-stats``; the servers asyncrl starts run with them) exports
  none of them and reports nothing; so does a server that does not answer in
  :data:`METRICS_TIMEOUT_S` (its health is the engine's business).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from asyncrl.engines.capabilities import EnginePressure
from asyncrl.engines.vllm.server.http import ServerClient, ServerGone, ServerRefused

log = logging.getLogger("asyncrl.engines.vllm")

#: Seconds a server's ``/metrics`` may take (the train pump waits for it).
METRICS_TIMEOUT_S = 5.0

#: The Prometheus samples read, by what they count.
SAMPLES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
           "vllm:kv_cache_usage_perc": "kv", "vllm:num_preemptions_total": "preemptions"}


class PressureGauge:
    """The newest scheduler numbers of an in-process vLLM, per vLLM engine core
    (several with data parallelism), each core's highest KV-cache usage since
    the last :meth:`read`, and the preemptions counted so far."""

    def __init__(self) -> None:
        #: Per core: (running, waiting, KV-cache usage) of its newest step.
        self._cores: dict[int, tuple[int, int, float]] = {}
        #: Per core: the highest KV-cache usage since the last read (invariant:
        #: >= the newest step's, for every core in ``_cores``).
        self._kv_peak: dict[int, float] = {}
        self._preemptions = 0
        self._failed = False

    def observe(self, core: int, scheduler: Any, iteration: Any) -> None:
        """One engine step's stats (vLLM's ``SchedulerStats`` and ``IterationStats``,
        either may be None). Never raises: it runs inside vLLM's output handler,
        whose failure would stop generation."""
        try:
            if iteration is not None:
                self._preemptions += int(iteration.num_preempted_reqs)
            if scheduler is not None:
                waiting = scheduler.num_waiting_reqs + scheduler.num_skipped_waiting_reqs
                kv = float(scheduler.kv_cache_usage)
                self._cores[core] = (int(scheduler.num_running_reqs), int(waiting), kv)
                self._kv_peak[core] = max(self._kv_peak.get(core, kv), kv)
        except Exception as exc:  # vLLM's stats changed shape: report nothing
            if not self._failed:
                log.warning("vLLM's stats are not what asyncrl reads (%r): the engine "
                            "reports no pressure", exc)
            self._failed = True

    def read(self) -> EnginePressure | None:
        """The newest requests running and waiting, the highest KV-cache usage
        since the last read (of the fullest core) and the preemptions so far;
        None before vLLM's first step, or when its stats could not be read.
        The peaks start over from each core's newest usage: with no step
        between two reads, the usage stayed at it."""
        if self._failed or not self._cores:
            return None
        cores = self._cores.values()
        kv = max(self._kv_peak.values())
        self._kv_peak = {core: c[2] for core, c in self._cores.items()}
        return EnginePressure(sum(c[0] for c in cores), sum(c[1] for c in cores),
                              _fraction(kv), self._preemptions)


def stat_loggers(gauge: PressureGauge) -> list[Any]:
    """The stat loggers for ``AsyncLLM(stat_loggers=...)``: one class that feeds
    ``gauge`` (imports vLLM); none, logged, when this vLLM has no such base
    (the engine then runs and reports no pressure)."""
    try:
        from vllm.v1.metrics.loggers import StatLoggerBase
    except ImportError as exc:
        log.warning("this vLLM has no StatLoggerBase (%r): the engine reports no pressure", exc)
        return []

    class GaugeLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        # Loose on purpose: it runs in vLLM's output handler, and a newer vLLM
        # that passes another argument must not stop generation.
        def record(self, scheduler_stats: Any = None, iteration_stats: Any = None,
                   *args: Any, engine_idx: int = 0, **kwargs: Any) -> None:
            gauge.observe(engine_idx, scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            return None

    return [GaugeLogger]


def parse_metrics(text: str) -> EnginePressure | None:
    """The pressure in a vLLM server's ``/metrics`` text (None: it has none)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {"running": 0.0, "waiting": 0.0, "preemptions": 0.0}
    kv: list[float] = []
    seen = set()
    # Only the lines of the four samples (the text has every histogram too).
    text = "\n".join(line for line in text.splitlines()
                     if line.startswith(("vllm:num_requests_", "vllm:kv_cache_usage_perc",
                                         "vllm:num_preemptions_total")))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            what = SAMPLES.get(sample.name)
            if what == "kv":
                kv.append(sample.value)
            elif what is not None:
                totals[what] += sample.value
            if what is not None:
                seen.add(what)
    if not {"running", "waiting"} <= seen:
        return None
    return EnginePressure(int(totals["running"]), int(totals["waiting"]),
                          _fraction(max(kv)) if kv else None, int(totals["preemptions"]))


async def servers_pressure(clients: Iterable[ServerClient]) -> EnginePressure | None:
    """The servers' pressure as one, read from all of them at once."""
    texts = await asyncio.gather(*(_metrics(c) for c in clients))
    return EnginePressure.combine(_parsed(t) for t in texts if t is not None)


def _parsed(text: str) -> EnginePressure | None:
    """One server's text; one that does not parse reports nothing (the others count)."""
    try:
        return parse_metrics(text)
    except ValueError as exc:
        log.warning("a vLLM server's /metrics did not parse (%r): it reports no pressure", exc)
        return None


async def _metrics(client: ServerClient) -> str | None:
    try:
        return await client.get_text("/metrics", timeout_s=METRICS_TIMEOUT_S)
    except (ServerGone, ServerRefused) as exc:
        log.debug("no /metrics from %s: %s", client.url, exc)
        return None


def _fraction(value: float) -> float:
    """vLLM's KV-cache usage, kept in [0, 1] (float rounding may step past 1)."""
    return min(1.0, max(0.0, value))
