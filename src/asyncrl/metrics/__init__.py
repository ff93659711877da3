"""Metrics sinks (JSONL, TensorBoard, memory) and the pump timeline."""

from asyncrl.metrics.sinks import JsonlSink, MemorySink, MetricsSink, TensorBoardSink
from asyncrl.metrics.timeline import Interval, Timeline

__all__ = ["Interval", "JsonlSink", "MemorySink", "MetricsSink", "TensorBoardSink", "Timeline"]
