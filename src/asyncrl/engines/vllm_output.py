"""Where vLLM's own output goes: a log file at default verbosity, the terminal with ``-v``.

vLLM prints a lot that is no news to an asyncrl user: a dozen start-up
warnings about the CPU build, and on every weight sync a progress bar
("Loading safetensors checkpoint shards") and a warning per rotary embedding
("RotaryEmbedding: Failed to load weights", harmless: it has no weights). Six
hundred syncs made 1,800 lines that broke the live progress bar.

So when the engine is given a log file (``asyncrl train`` gives it
``RUN_DIR/vllm.log``) and asyncrl is not verbose (``asyncrl -v`` sets the
``asyncrl`` loggers to DEBUG), vLLM writes there: its processes' stdout and
stderr, and its logger in every process, this one included (through
``VLLM_LOGGING_CONFIG_PATH``, which vLLM reads whenever it configures logging).
What vLLM logs while it is imported (before any engine, e.g. by ``asyncrl
validate``) is dropped at default verbosity; its errors always show. A run then
prints what a local run prints plus one line naming the log, and failures name
the log file. A user's own ``VLLM_LOGGING_CONFIG_PATH`` or
``VLLM_CONFIGURE_LOGGING=0`` is left alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import logging.config
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

log = logging.getLogger("asyncrl.engines.vllm")

_CONFIG_ENV = "VLLM_LOGGING_CONFIG_PATH"


def verbose() -> bool:
    """True when vLLM's own output should be shown (``asyncrl -v``)."""
    return log.isEnabledFor(logging.DEBUG)


@contextlib.contextmanager
def quiet_import() -> Iterator[None]:
    """Meanwhile (importing vLLM), records up to WARNING are dropped unless
    asyncrl is verbose: vLLM logs its platform notes while it is imported,
    before any engine has a log file for them."""
    if verbose():
        yield
        return
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


def _logging_config(path: Path) -> dict[str, Any]:
    """vLLM's logger, writing to ``path``: its own format, at VLLM_LOGGING_LEVEL."""
    level = os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"vllm": {
            "()": "vllm.logging_utils.NewLineFormatter", "log_level": level,
            "datefmt": "%m-%d %H:%M:%S",
            "format": "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"}},
        "handlers": {"vllm": {"class": "logging.FileHandler", "filename": str(path),
                              "formatter": "vllm", "level": level}},
        "loggers": {"vllm": {"handlers": ["vllm"], "level": level, "propagate": False}},
    }


class VLLMOutput:
    """vLLM's output for one engine: ``log_file`` (appended to), or this process's
    own stdout and stderr when it is None or asyncrl is verbose."""

    def __init__(self, log_file: str | Path | None) -> None:
        self.path = Path(log_file) if log_file is not None and not verbose() else None
        #: What vLLM's processes get as stdout and stderr (None: this process's).
        self.stream: IO[str] | None = None
        self._config: Path | None = None
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.stream = self.path.open("a", buffering=1)
        if os.environ.get(_CONFIG_ENV) or os.environ.get("VLLM_CONFIGURE_LOGGING") == "0":
            return  # the user configured vLLM's logging
        config = _logging_config(self.path)
        fd, name = tempfile.mkstemp(prefix="asyncrl-vllm-logging-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            json.dump(config, fh)
        self._config = Path(name)
        os.environ[_CONFIG_ENV] = name  # vLLM's processes, and vLLM here when it reconfigures
        logging.config.dictConfig(config)  # vLLM's logger in this process, now

    def announce(self) -> None:
        """Say once, where vLLM's output goes (called when vLLM has started)."""
        if self.path is not None:
            print(f"asyncrl: vLLM started; its own output goes to {self.path} "
                  "(asyncrl -v shows it here)", file=sys.stderr)

    def where(self) -> str:
        """Where to read vLLM's output, for messages."""
        return f"vLLM's log ({self.path})" if self.path is not None else "vLLM's log above"

    def close(self) -> None:
        """After vLLM has shut down (it logs while it does): its processes' stream
        and the logging config file go. vLLM's logger in this process keeps
        writing to the log file."""
        if self._config is not None:
            if os.environ.get(_CONFIG_ENV) == str(self._config):
                os.environ.pop(_CONFIG_ENV, None)
            self._config.unlink(missing_ok=True)
            self._config = None
        if self.stream is not None:
            self.stream.close()
            self.stream = None
