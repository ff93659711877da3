"""The weight-transport seam: what a weight sync sends, how it travels, at which version.

The controller hands an engine ``(weights, version)`` after every optimizer step
and knows nothing else about the trip. An engine turns them into a
:class:`WeightUpdate` and gives it to its :class:`WeightTransport`, which makes
the engine's model hold them. A new way for weights to travel (shared memory, a
collective, HTTP) is a new transport - the controller does not change.

Transports of this project: :class:`InProcessTransport` (the local engine's,
and any engine whose model lives in this process: the load runs on the thread
that owns the model, between two decoding steps); the vLLM engine picks one of
:mod:`asyncrl.engines.vllm.transport` (``policy.vllm.weight_transport``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

__all__ = ["InProcessTransport", "Route", "WeightKind", "WeightTransport", "WeightUpdate"]

#: What is sent: every tensor of the model, one bucket of them (a large model's
#: update in parts, each loaded in turn), or LoRA adapters alone.
WeightKind = Literal["full", "bucket", "adapters"]
#: How it travels.
Route = Literal["in_process", "shared_memory", "ipc", "disk", "collective", "http"]


@dataclasses.dataclass(frozen=True)
class WeightUpdate:
    """One weight sync: the tensors (by parameter name), what they are, and the
    version the engine holds once they are loaded."""

    version: int
    tensors: Mapping[str, Any]
    kind: WeightKind = "full"

    def __post_init__(self) -> None:
        if self.version < 0:
            raise ValueError(f"a weight version is >= 0, got {self.version}")


@runtime_checkable
class WeightTransport(Protocol):
    """How updates reach one engine's model. An engine calls ``stage`` and then
    ``load`` once per update, one update at a time, in version order."""

    #: How the weights travel (for logs and ``asyncrl validate``).
    route: Route
    #: The kinds of update it carries.
    kinds: frozenset[WeightKind]

    async def stage(self, update: WeightUpdate) -> None:
        """Called while generation still runs, before the engine pauses it: work
        that may overlap generation (e.g. writing files)."""
        ...

    async def load(self, update: WeightUpdate) -> None:
        """Called while generation is paused: once it returns, the engine's model
        holds ``update`` (the engine then labels new tokens ``update.version``)."""
        ...


def check_kind(transport: WeightTransport, update: WeightUpdate) -> None:
    """Refuse an update a transport does not carry, naming both."""
    if update.kind not in transport.kinds:
        raise ValueError(
            f"the {transport.route} weight transport carries {sorted(transport.kinds)} "
            f"updates, not {update.kind!r}")


class InProcessTransport:
    """Weights copied into a model of this process: ``load_state_dict``, which
    converts them to the model's dtype and device.

    An engine that generates on a thread of its own calls :meth:`load_now` on
    that thread (so the load lands between two decoding steps, never inside
    one); :meth:`load` is the same call for an engine on the event loop's thread.
    """

    route: Route = "in_process"
    kinds: frozenset[WeightKind] = frozenset({"full"})

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    async def stage(self, update: WeightUpdate) -> None:
        check_kind(self, update)

    async def load(self, update: WeightUpdate) -> None:
        self.load_now(update)

    def load_now(self, update: WeightUpdate) -> None:
        """Load ``update`` on the calling thread (the one that owns the model)."""
        from asyncrl.policy.devices import adopt  # torch: not imported with the engine protocol

        check_kind(self, update)
        self.model.load_state_dict(update.tensors)
        adopt(update.tensors.values())  # the sender's tensors: not reused before read
