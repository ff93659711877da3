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


def _log_to(stream: IO[str], level: str) -> tuple[list[logging.Handler], int, bool]:
    """vLLM's logger in this process writes to ``stream`` (a handler of its own
    instead of vLLM's stdout one; not dictConfig, which would close every
    handler of the process); returns what it had, to give back."""
    logger = logging.getLogger("vllm")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    for old in saved[0]:
        logger.removeHandler(old)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s",
                                           "%m-%d %H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return saved


class VLLMOutput:
    """vLLM's output for one engine: ``log_file`` (appended to), or this process's
    own stdout and stderr when it is None or asyncrl is verbose."""

    def __init__(self, log_file: str | Path | None) -> None:
        self.path = Path(log_file) if log_file is not None and not verbose() else None
        #: What vLLM's processes get as stdout and stderr (None: this process's).
        self.stream: IO[str] | None = None
        self._config: Path | None = None
        self._saved: tuple[list[logging.Handler], int, bool] | None = None
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
        self._saved = _log_to(self.stream, config["loggers"]["vllm"]["level"])  # here, now

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
        and the logging config file go, and vLLM's logger here gets its
        handlers back."""
        if self._config is not None:
            if os.environ.get(_CONFIG_ENV) == str(self._config):
                os.environ.pop(_CONFIG_ENV, None)
            self._config.unlink(missing_ok=True)
            self._config = None
        if self._saved is not None:  # vLLM's logger here: its handlers back
            logger = logging.getLogger("vllm")
            ours = str(self.path.resolve()) if self.path is not None else None
            for handler in list(logger.handlers):
                stream = getattr(handler, "stream", None)
                if stream is self.stream or getattr(handler, "baseFilename", None) == ours:
                    logger.removeHandler(handler)
                    if stream is not self.stream:
                        handler.close()  # vLLM's own file handler from our config
            handlers, level, propagate = self._saved
            for handler in handlers:
                logger.addHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate
            self._saved = None
        if self.stream is not None:
            self.stream.close()
            self.stream = None


__all__ = ["VLLMOutput", "quiet_import", "verbose"]
