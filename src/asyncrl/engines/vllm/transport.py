"""How the vLLM engine's weights travel (``policy.vllm.weight_transport``).

* ``disk``: the update is written as safetensors into a directory of the
  engine's while generation goes on (:meth:`DiskTransport.stage`), then vLLM's
  ``reload_weights`` reads it while generation is paused. It works wherever
  vLLM does (CPU and CUDA) and is what every CPU run here uses: the tested way
  out when IPC fails on a GPU.
* ``ipc``: one CUDA GPU; the tensors are handed to vLLM's worker as CUDA IPC
  handles through vLLM's weight-transfer API (no copy through host memory).
* ``auto``: ipc on CUDA with ``tensor_parallel_size`` 1, else disk.

:func:`choose_route` is the selection, kept apart from vLLM so that it is tested
without a GPU.
"""

from __future__ import annotations

import base64
import os
import pickle
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from asyncrl.engines.transport import WeightUpdate, check_kind
from asyncrl.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["DiskTransport", "IpcTransport", "choose_route", "transport_for"]

Control = Callable[[Awaitable[Any]], Awaitable[Any]]


def choose_route(setting: str, *, cuda: bool, tensor_parallel_size: int) -> Literal["ipc", "disk"]:
    """The route ``policy.vllm.weight_transport`` means on this platform; a
    :class:`ConfigError` naming the fix when ``ipc`` cannot work here."""
    if setting == "disk":
        return "disk"
    ipc_works = cuda and tensor_parallel_size == 1
    if setting == "auto":
        return "ipc" if ipc_works else "disk"
    if setting != "ipc":
        raise ConfigError(f"policy.vllm.weight_transport: unknown {setting!r}; choose from "
                          "auto, ipc, disk")
    if not cuda:
        raise ConfigError("policy.vllm.weight_transport: ipc needs vLLM on a CUDA GPU, but this "
                          "vLLM runs on another platform; set weight_transport: disk (or auto)")
    if tensor_parallel_size != 1:
        raise ConfigError(
            f"policy.vllm.weight_transport: ipc hands weights to one GPU, but "
            f"policy.vllm.tensor_parallel_size={tensor_parallel_size}; set weight_transport: "
            "disk (or auto)")
    return "ipc"


class DiskTransport:
    """Safetensors in ``directory``, loaded by vLLM's ``reload_weights``."""

    route = "disk"
    kinds = frozenset({"full"})

    def __init__(self, llm: Any, control: Control, directory: Path) -> None:
        self._llm, self._control, self.directory = llm, control, directory

    async def stage(self, update: WeightUpdate) -> None:
        import asyncio

        check_kind(self, update)
        await asyncio.to_thread(write_safetensors, update.tensors, self.directory)

    async def load(self, update: WeightUpdate) -> None:
        await self._control(self._llm.collective_rpc(
            "reload_weights", kwargs={"weights_path": str(self.directory)}))


class IpcTransport:
    """CUDA IPC handles through vLLM's weight-transfer API (set up at the first load)."""

    route = "ipc"
    kinds = frozenset({"full"})

    def __init__(self, llm: Any, control: Control) -> None:
        self._llm, self._control = llm, control
        self._ready = False

    async def stage(self, update: WeightUpdate) -> None:
        check_kind(self, update)

    async def load(self, update: WeightUpdate) -> None:
        if not self._ready:
            await self._control(init_ipc_transfer(self._llm))
            self._ready = True
        await send_weights_ipc(self._llm, update.tensors, self._control)


def transport_for(route: str, llm: Any, control: Control, directory: Path
                  ) -> DiskTransport | IpcTransport:
    """The transport of a route :func:`choose_route` gave."""
    return IpcTransport(llm, control) if route == "ipc" else DiskTransport(llm, control, directory)


def ipc_engine_args(args: dict[str, Any]) -> dict[str, Any]:
    """vLLM's engine arguments for the ipc route (before vLLM starts)."""
    # The IPC handles hold torch types, which only pickle carries; vLLM's worker
    # accepts pickled handles only with this set before it starts.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    return {**args, "weight_transfer_config": {"backend": "ipc"}}


def write_safetensors(weights: Mapping[str, torch.Tensor], directory: Path) -> Path:
    """Write ``weights`` as ``directory/model.safetensors`` (atomically) for vLLM's
    ``reload_weights``; returns the directory."""
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    storages: set[int] = set()
    for name, tensor in weights.items():
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        # Tied weights share one storage, which safetensors refuses to write twice.
        # Both names are written: vLLM's in-place reload leaves a tied output
        # layer on the old weights when only the embedding comes (measured: the
        # engine then falls off policy after a sync).
        if ptr in storages:
            t = t.clone()
        storages.add(ptr)
        tensors[name] = t
    partial = directory / "model.safetensors.partial"  # not *.safetensors: never loaded
    save_file(tensors, str(partial))
    os.replace(partial, directory / "model.safetensors")
    return directory


async def init_ipc_transfer(llm: Any) -> None:
    """CUDA: set up vLLM's IPC weight-transfer backend (once per engine)."""
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

    await llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info={"packed": False}))


async def send_weights_ipc(llm: Any, weights: Mapping[str, torch.Tensor],
                           control: Callable[[Awaitable[Any]], Awaitable[Any]]) -> None:
    """CUDA: hand ``weights`` to vLLM's worker as CUDA IPC handles, each vLLM
    call awaited through ``control``.

    Untested in this project (its machines have no GPU): written against vLLM
    0.32's IPC weight-transfer backend (``IPCWeightTransferUpdateInfo``); the
    engine must have started with ``weight_transfer_config={"backend": "ipc"}``
    and ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (pickled handles).
    """
    import torch
    from torch.multiprocessing.reductions import reduce_tensor
    from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

    device = torch.device("cuda", torch.cuda.current_device())
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    names, dtypes, shapes, handles, keep = [], [], [], [], []
    for name, tensor in weights.items():
        t = tensor.detach().to(device).contiguous()
        keep.append(t)  # the worker maps this memory until the update finishes
        names.append(name)
        dtypes.append(str(t.dtype).removeprefix("torch."))
        shapes.append(list(t.shape))
        handles.append({uuid: reduce_tensor(t)[1]})
    info = {"names": names, "dtype_names": dtypes, "shapes": shapes,
            "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode()}
    await control(llm.start_weight_update())
    await control(llm.update_weights(WeightTransferUpdateRequest(update_info=info)))
    await control(llm.finish_weight_update())
    torch.cuda.synchronize(device)
    del keep
    torch.cuda.ipc_collect()
