"""Weights & Biases: the scalars TensorBoard gets, plus the run's config.

``logging.wandb: {project, name, mode, tags}``. wandb is an optional extra
(``pip install 'asyncrl[wandb]'``), imported only when this sink is built.
``mode: offline`` needs no network: the run is written under ``RUN_DIR/wandb/``
and ``wandb sync`` uploads it later. A resumed run starts a new wandb run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl.errors import require
from asyncrl.metrics.sinks import scalars


class WandbSink:
    """A :class:`~asyncrl.metrics.MetricsSink` logging to one wandb run."""

    def __init__(self, cfg: Any, run_dir: str | Path, config: dict[str, Any]) -> None:
        self._wandb = require("wandb", "wandb", "logging.wandb")
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run = self._wandb.init(
            project=cfg.project, name=cfg.name, mode=cfg.mode, tags=list(cfg.tags),
            dir=str(run_dir), config=config,
            # No console capture, git probing or code upload: asyncrl prints its own
            # progress, and the run directory already holds the resolved config.
            settings=self._wandb.Settings(silent=True, console="off", disable_git=True,
                                          save_code=False),
        )

    def write(self, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=int(record.get("step", 0)))

    def close(self, summary: dict[str, Any] | None = None) -> None:
        if summary:
            flat = {**summary, **{f"ledger/{k}": v for k, v in
                                  (summary.get("ledger") or {}).items()}}
            self.run.summary.update(scalars(flat))
        self.run.finish()
        if self._wandb.run is None:
            # Flush and stop wandb's service process now rather than at exit, so
            # the offline files are complete when the run returns.
            self._wandb.teardown()
