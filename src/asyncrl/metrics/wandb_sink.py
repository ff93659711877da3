"""Weights & Biases: the scalars TensorBoard gets, plus the run's config.

``logging.wandb: {project, name, mode, tags}``. wandb is an optional extra
(``pip install 'asyncrl[wandb]'``), imported only when this sink is built.
``mode: offline`` needs no network: the run is written under ``RUN_DIR/wandb/``
and ``wandb sync`` uploads it later. A resumed run starts a new wandb run.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from asyncrl.errors import ConfigError, require
from asyncrl.metrics.sinks import scalars

#: Where W&B keeps its login (``wandb login`` writes a netrc entry for the host).
DEFAULT_HOST = "https://api.wandb.ai"


def has_credentials() -> bool:
    """True when wandb would find a login without asking: ``WANDB_API_KEY`` (or
    an identity token file), or a netrc entry for the W&B host (``wandb login``)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or DEFAULT_HOST).hostname
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return host is not None and netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_wandb(cfg: Any) -> None:
    """Preflight of ``logging.wandb`` (None: off): wandb installed and, in
    ``online`` mode, a login it can use without a prompt."""
    if cfg is None or cfg.mode == "disabled":
        return
    require("wandb", "wandb", "logging.wandb")
    online = cfg.mode == "online" and os.environ.get("WANDB_MODE") not in ("offline", "disabled")
    if online and not has_credentials():
        raise ConfigError(
            "logging.wandb.mode: online needs a W&B login, and none is configured (no "
            "WANDB_API_KEY, no `wandb login`). Log in with `wandb login`, set WANDB_API_KEY, "
            "or use logging.wandb.mode: offline (upload later with `wandb sync`)"
        )


class WandbSink:
    """A :class:`~asyncrl.metrics.MetricsSink` logging to one wandb run."""

    def __init__(self, cfg: Any, run_dir: str | Path, config: dict[str, Any]) -> None:
        self._wandb = require("wandb", "wandb", "logging.wandb")
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.run = self._wandb.init(
                project=cfg.project, name=cfg.name, mode=cfg.mode, tags=list(cfg.tags),
                dir=str(run_dir), config=config,
                # No console capture, git probing or code upload: asyncrl prints its own
                # progress, and the run directory already holds the resolved config.
                settings=self._wandb.Settings(silent=True, console="off", disable_git=True,
                                              save_code=False),
            )
        except Exception as exc:  # wandb's own errors: one line, not its traceback
            raise ConfigError(
                f"logging.wandb: wandb could not start a run ({type(exc).__name__}: {exc}); "
                "check the login and the network, or use logging.wandb.mode: offline"
            ) from exc

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
