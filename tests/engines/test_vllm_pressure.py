"""How loaded vLLM is (``asyncrl.engines.vllm.pressure``, issue 38): a server's
``/metrics`` text as ``prometheus_client`` writes vLLM's metrics, the
``vllm_server`` engine over stand-in servers, and the in-process gauge. (A real
vLLM's numbers: tests/engines/test_vllm_engine.py.)"""

from __future__ import annotations

import logging
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from asyncrl.config import GenerationConfig
from asyncrl.engines import EngineCapabilities, EnginePressure
from asyncrl.engines.vllm.pressure import PressureGauge, parse_metrics
from asyncrl.engines.vllm.server.engine import VLLMServerEngine
from asyncrl.tasks.tokenizer import CharTokenizer
from tests.engines.fake_vllm_server import FakeServer
from tests.vtime import virtual


def vllm_metrics(*cores: tuple[int, int, float, int]) -> str:
    """The exposition text of vLLM 0.32's scheduler metrics (its names and
    labels, vllm/v1/metrics/loggers.py), one label set per engine core:
    (running, waiting, KV-cache usage, preemptions)."""
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    running = Gauge("vllm:num_requests_running", "", labels, registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "", labels, registry=registry)
    kv = Gauge("vllm:kv_cache_usage_perc", "", labels, registry=registry)
    preempted = Counter("vllm:num_preemptions", "", labels, registry=registry)
    # A metric whose name starts like one read, to be left alone.
    Gauge("vllm:num_requests_waiting_by_reason", "", [*labels, "reason"],
          registry=registry).labels("m", "0", "capacity").set(99)
    for i, (r, w, k, p) in enumerate(cores):
        running.labels("m", str(i)).set(r)
        waiting.labels("m", str(i)).set(w)
        kv.labels("m", str(i)).set(k)
        preempted.labels("m", str(i)).inc(p)
    return generate_latest(registry).decode()


def test_a_servers_metrics_text_gives_its_pressure() -> None:
    assert parse_metrics(vllm_metrics((3, 1, 0.25, 2))) == EnginePressure(3, 1, 0.25, 2)
    # Data parallelism: the cores add up, the fullest KV cache counts.
    assert parse_metrics(vllm_metrics((3, 1, 0.25, 2), (5, 0, 0.5, 1))) == EnginePressure(
        8, 1, 0.5, 3)
    # A server without stats (--disable-log-stats) exports none: nothing to report.
    assert parse_metrics('python_info{version="3.11"} 1.0\n') is None


@virtual
async def test_the_server_engine_reports_its_live_servers_together() -> None:
    a, b, gone = FakeServer("http://a:1"), FakeServer("http://b:1"), FakeServer("http://c:1")
    a.metrics, b.metrics = vllm_metrics((3, 1, 0.25, 2)), vllm_metrics((4, 0, 0.75, 0))
    engine = VLLMServerEngine([a, b, gone], CharTokenizer("0123456789+= "),
                              GenerationConfig(max_new_tokens=4))
    try:
        assert EngineCapabilities.of(engine).pressure
        gone.answers = False  # /metrics refused: that server reports nothing
        assert await engine.pressure() == EnginePressure(7, 1, 0.75, 2, sources=2)
        b.metrics = "# no vLLM stats\n"
        assert await engine.pressure() == EnginePressure(3, 1, 0.25, 2)
        a.answers = False
        assert await engine.pressure() is None
    finally:
        await engine.close()


def _stats(running: int, waiting: int, kv: float) -> SimpleNamespace:
    # vLLM's SchedulerStats fields asyncrl reads (vllm/v1/metrics/stats.py).
    return SimpleNamespace(num_running_reqs=running, num_waiting_reqs=waiting,
                           num_skipped_waiting_reqs=1, kv_cache_usage=kv)


def test_the_in_process_gauge_keeps_the_newest_step_per_core(caplog) -> None:
    gauge = PressureGauge()
    assert gauge.read() is None  # before vLLM's first step
    gauge.observe(0, _stats(2, 0, 0.5), SimpleNamespace(num_preempted_reqs=1))
    gauge.observe(1, _stats(3, 2, 0.25), None)
    gauge.observe(0, _stats(4, 0, 1.0000001), SimpleNamespace(num_preempted_reqs=2))
    assert gauge.read() == EnginePressure(7, 4, 1.0, 3)
    # Stats of another shape never raise into vLLM's output handler: no report.
    with caplog.at_level(logging.WARNING, "asyncrl.engines.vllm"):
        gauge.observe(0, SimpleNamespace(), None)
    assert gauge.read() is None and "reports no pressure" in caplog.text



def test_the_in_process_gauge_keeps_the_highest_kv_usage_since_the_last_read() -> None:
    """A spike between two reads counts (aimd trims above a high mark): the read
    gives each core's highest KV-cache usage since the last one, the counts
    stay the newest, and the next read starts over from the usage in force."""
    gauge = PressureGauge()
    gauge.observe(0, _stats(2, 0, 0.4), None)
    gauge.observe(0, _stats(6, 3, 0.95), None)  # the spike ...
    gauge.observe(1, _stats(1, 0, 0.3), None)
    gauge.observe(0, _stats(3, 0, 0.5), None)  # ... drained before the read
    assert gauge.read() == EnginePressure(4, 2, 0.95, 0)
    # No step since: the usage stayed where the newest step left it.
    assert gauge.read() == EnginePressure(4, 2, 0.5, 0)
    gauge.observe(1, _stats(2, 0, 0.7), None)
    gauge.observe(1, _stats(1, 0, 0.2), None)
    assert gauge.read() == EnginePressure(4, 2, 0.7, 0)
    assert gauge.read() == EnginePressure(4, 2, 0.5, 0)  # core 0's, now the fullest
