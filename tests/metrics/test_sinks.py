from __future__ import annotations

import json
import math

from asyncrl.metrics import JsonlSink, MemorySink, TensorBoardSink, Timeline
from asyncrl.metrics.report import read_metrics


def test_jsonl_sink_writes_one_object_per_step_and_nan_as_null(tmp_path) -> None:
    sink = JsonlSink(tmp_path / "m.jsonl")
    sink.write({"step": 0, "reward_mean": math.nan, "staleness_hist": {"0": 1}})
    sink.write({"step": 1, "reward_mean": 0.5})
    sink.close()
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {"step": 0, "reward_mean": None, "staleness_hist": {"0": 1}},
        {"step": 1, "reward_mean": 0.5},
    ]


def test_resumed_metrics_keep_the_last_record_per_step(tmp_path) -> None:
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    for step, reward in ((0, 0.1), (1, 0.2), (1, 0.3), (2, 0.4)):
        sink.write({"step": step, "reward_mean": reward})
    sink.close()
    assert [r["reward_mean"] for r in read_metrics(tmp_path)] == [0.1, 0.3, 0.4]


def test_tensorboard_sink_writes_event_files(tmp_path) -> None:
    sink = TensorBoardSink(tmp_path / "tb")
    sink.write({"step": 0, "reward_mean": 0.5, "staleness_hist": {"0": 3, "2": 1},
                "sampler": "x"})
    sink.close()
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_memory_sink_and_timeline() -> None:
    sink = MemorySink()
    sink.write({"step": 0})
    sink.close({"steps": 1})
    assert sink.records == [{"step": 0}] and sink.summary == {"steps": 1}
    timeline = Timeline(max_intervals=2)
    for i in range(3):
        timeline.add("gen", 0, float(i), i + 1.0, "ok")
    assert len(timeline.to_list()) == 2
