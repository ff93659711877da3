"""Each engine kind ``policy.engine`` names, described once.

An :class:`EngineSpec` says what the rest of asyncrl needs to know about a kind
of engine before one is built: which class it is, whether it reads the
``policy.vllm`` block (its seed and ``max_model_len``), whether it generates
on the model object it is given or loads a saved copy, whether its generation
pauses while new weights load, and the checks it needs before the run starts.
Code that depends on the kind asks its spec (:func:`engine_spec`) rather than
testing the name; :mod:`asyncrl.engines.factory` builds each kind.

A new engine kind is one entry of :data:`ENGINE_SPECS`, one builder in the
factory and its name in ``config.EngineName`` (a test checks the three agree).
"""

from __future__ import annotations

import dataclasses
import pkgutil
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncrl.config import PolicyConfig

__all__ = ["ENGINE_SPECS", "EngineSpec", "context_cap", "engine_spec"]


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """What one engine kind is (see the module docstring)."""

    name: str
    #: The engine class, ``"module:Class"``; None: the config names it
    #: (``policy.custom_engine.target``, checked by the factory).
    target: str | None
    #: Generates on the model object it is built over (so a model an in-process
    #: trainer updates must be copied for it); False: it loads the model saved
    #: to disk into processes of its own (vLLM).
    uses_given_model: bool = True
    #: Generates with vLLM and reads ``policy.vllm``: its ``seed`` (else the
    #: run's) and ``max_model_len`` (the context the prompts must fit).
    reads_vllm_block: bool = False
    #: Generation pauses while new weights load (what the simulator assumes when
    #: a calibration run shows no generation across a weight sync).
    pauses_on_sync: bool = False
    #: The pre-run checks of this kind beyond the policy's device and model
    #: (vLLM installed, its engine_args, a server key that can be read); may
    #: import heavy packages, starts nothing.
    check: Callable[[PolicyConfig], None] | None = None

    def engine_class(self) -> type:
        """The engine class (imported; nothing is built). Not for ``custom``."""
        assert self.target is not None, "a custom engine's class is the config's target"
        cls = pkgutil.resolve_name(self.target)
        assert isinstance(cls, type)
        return cls


def _check_vllm(policy: PolicyConfig) -> None:
    from asyncrl.engines.vllm.setup import check_config

    check_config(policy)


def _check_vllm_servers(policy: PolicyConfig) -> None:
    if policy.vllm_server.launches:  # the servers it starts run vLLM here
        _check_vllm(policy)
    policy.vllm_server.read_key()  # the key of servers given by URL is there


#: Every engine kind, by its ``policy.engine`` name.
ENGINE_SPECS: Mapping[str, EngineSpec] = {
    "local": EngineSpec("local", "asyncrl.engines.local.engine:LocalEngine"),
    "vllm": EngineSpec("vllm", "asyncrl.engines.vllm.inprocess:VLLMEngine",
                       uses_given_model=False, reads_vllm_block=True, pauses_on_sync=True,
                       check=_check_vllm),
    "vllm_server": EngineSpec("vllm_server", "asyncrl.engines.vllm.server.engine:VLLMServerEngine",
                              uses_given_model=False, reads_vllm_block=True, pauses_on_sync=True,
                              check=_check_vllm_servers),
    "custom": EngineSpec("custom", None),
}


def engine_spec(policy: PolicyConfig) -> EngineSpec:
    """The spec of the engine ``policy.engine`` names."""
    return ENGINE_SPECS[policy.engine]


def context_cap(policy: PolicyConfig) -> int | None:
    """The engine's own cap on the context (``policy.vllm.max_model_len`` on an
    engine that reads the vLLM block), or None: the model's context."""
    return policy.vllm.max_model_len if engine_spec(policy).reads_vllm_block else None
