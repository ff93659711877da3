"""Where per-step metrics go: one small interface, several sinks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from asyncrl._util.jsonio import dumps


@runtime_checkable
class MetricsSink(Protocol):
    def write(self, record: dict[str, Any]) -> None:
        """Called by the train pump once per finished training step."""
        ...

    def close(self, summary: dict[str, Any] | None = None) -> None:
        """Called once when the run ends, with the final summary."""
        ...


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers (not booleans, not ``step``): what TensorBoard
    and wandb plot."""
    return {key: value for key, value in record.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(float(value))}


class MemorySink:
    """Keeps records in a list (tests, the simulator, plots)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.summary: dict[str, Any] | None = None

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def close(self, summary: dict[str, Any] | None = None) -> None:
        self.summary = summary


class JsonlSink:
    """``metrics.jsonl``: one JSON object per step, flushed as it is written so a
    killed run keeps every finished step."""

    def __init__(self, path: str | Path, *, append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a" if append else "w", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(dumps(record) + "\n")
        self._fh.flush()

    def close(self, summary: dict[str, Any] | None = None) -> None:
        if not self._fh.closed:
            self._fh.close()


class TensorBoardSink:
    """TensorBoard event files: every numeric field as a scalar, the staleness
    histogram as a histogram."""

    def __init__(self, logdir: str | Path, *, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run hides the events a killed run wrote after its checkpoint.
        self._writer = SummaryWriter(log_dir=str(logdir), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        for key, value in scalars(record).items():
            self._writer.add_scalar(key, value, step)
        hist = record.get("staleness_hist")
        if hist:
            values = [int(k) for k, n in hist.items() for _ in range(int(n))]
            if values:
                import numpy as np

                self._writer.add_histogram("staleness", np.asarray(values), step)
        self._writer.flush()

    def close(self, summary: dict[str, Any] | None = None) -> None:
        self._writer.close()
