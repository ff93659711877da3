"""Config of the ``vllm serve`` engine (``policy.engine: vllm_server``), the
``policy.vllm_server`` block. Apart from :mod:`asyncrl.config.policy` so that
the engine (:mod:`asyncrl.engines.vllm.server.engine`) and its block can be read
together; docs/engines.md, "vLLM servers over HTTP", explains every key."""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, model_validator

from asyncrl.config.blocks import Block, PosFloat, PosInt
from asyncrl.errors import ConfigError


class VLLMServerConfig(Block):
    """Which OpenAI-compatible vLLM servers generate the rollouts, and how they
    are reached. Started servers take their engine settings from ``policy.vllm``."""

    #: Base URLs (``http://host:port``) of running vLLM servers to drive, started
    #: with ``VLLM_SERVER_DEV_MODE=1``, ``--logprobs-mode processed_logprobs`` and
    #: ``--generation-config vllm`` (see docs/engines.md). Empty: asyncrl starts
    #: ``num_servers`` servers on 127.0.0.1 itself and stops them at the end.
    urls: tuple[str, ...] = ()
    #: Which generation API the engine calls: ``completions`` (``/v1/completions``,
    #: any vLLM server; token versions ordered against the engine's pause/resume)
    #: or ``generate`` (vLLM's token-in/token-out ``/inference/v1/generate``, which
    #: labels the tokens with the weight version that sampled them; servers need
    #: ``--enable-scale-out``, which the servers asyncrl starts have).
    api: Literal["completions", "generate"] = "completions"
    #: How many servers asyncrl starts when ``urls`` is empty (None: 1).
    num_servers: PosInt | None = None
    #: Directory the weights are written to for the servers' ``reload_weights``;
    #: every server must read it at this same path (a shared filesystem for
    #: servers on other machines). None: a temporary directory (servers on this machine).
    weights_dir: str | None = None
    #: Seconds a started server may take to come up (importing vLLM and torch,
    #: loading the model): about 30 s on a small CPU machine.
    startup_timeout_s: PosFloat = 600.0
    #: Seconds a control call (pause, weight load, resume, abort) may take, and
    #: the longest silence of a generation stream, before the server counts as lost.
    request_timeout_s: PosFloat = 300.0
    #: Environment variables of started servers (e.g. ``VLLM_CPU_OMP_THREADS_BIND``
    #: to give each server its own cores).
    env: dict[str, str] = Field(default_factory=dict)
    #: For servers given by URL: the name of the environment variable holding
    #: their key, sent with every request (``Authorization: Bearer``). The name,
    #: never the key: this config is written into the run directory. None: no
    #: key. Servers asyncrl starts get a random key of their own each run.
    api_key_env: str | None = None
    #: The fewest and most servers ``asyncrl fleet`` may leave the running job
    #: with (``scale``, ``add``, ``remove``; docs/fleet.md). None: no upper bound.
    min_servers: PosInt = 1
    max_servers: PosInt | None = None

    @model_validator(mode="after")
    def _urls_or_count(self) -> VLLMServerConfig:
        if self.urls and self.num_servers is not None:
            raise ValueError(
                "give either urls (servers to drive) or num_servers (servers asyncrl "
                "starts), not both")
        for url in self.urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(
                    f"urls: {url!r} is not a base URL; write it as http://host:port")
        if self.api_key_env is not None:
            if not self.urls:
                raise ValueError(
                    "api_key_env names the key of servers given by urls; the servers "
                    "asyncrl starts get a random key of their own each run (remove it)")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
                raise ValueError(
                    "api_key_env is the name of an environment variable (like "
                    "VLLM_SERVER_KEY), not the key itself: export the key in it")
        top = self.max_servers
        if top is not None and not self.min_servers <= self.server_count <= top:
            raise ValueError(
                f"the run starts with {self.server_count} servers, outside min_servers="
                f"{self.min_servers} .. max_servers={top}: widen the bounds")
        if self.server_count < self.min_servers:
            raise ValueError(
                f"the run starts with {self.server_count} servers, below min_servers="
                f"{self.min_servers}: lower min_servers or start more")
        return self

    def read_key(self) -> str | None:
        """The key of the servers given by URL, from the environment variable
        ``api_key_env`` names (None when it names none); a ConfigError naming the
        variable when it is unset or empty."""
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env, "")
        if not key:
            raise ConfigError(
                f"policy.vllm_server.api_key_env: the environment variable "
                f"{self.api_key_env} is not set (or empty); export the servers' key in it "
                "before starting asyncrl, or remove api_key_env for servers without one")
        return key

    @property
    def launches(self) -> bool:
        """True when asyncrl starts the servers itself."""
        return not self.urls

    @property
    def server_count(self) -> int:
        return len(self.urls) if self.urls else (self.num_servers or 1)


__all__ = ["VLLMServerConfig"]
