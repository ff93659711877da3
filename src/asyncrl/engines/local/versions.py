"""Pinned weight versions of the local engine (deterministic mode).

The engine keeps a host copy of every weight version it loads until the
controller says no dispatch batch is pinned to it any more
(``retain_weight_versions``), so that a request pinned to a version
(``GenerationRequest.weight_version``) is generated with exactly those weights,
whatever the engine holds by then.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch

from asyncrl.types import GenerationError, GroupId

Weights = Mapping[str, torch.Tensor]


class PinnedVersions:
    """Weight versions kept for pinned requests, and a model for each in use."""

    def __init__(self, enabled: bool, model: torch.nn.Module, version: int) -> None:
        self.enabled = enabled
        self._snapshots: dict[int, Weights] = {}
        self._models: dict[int, torch.nn.Module] = {}
        if enabled:  # a copy: the model's own tensors change with the next update
            self._snapshots[version] = {k: v.detach().to("cpu", copy=True)
                                        for k, v in model.state_dict().items()}

    def record(self, version: int, weights: Weights) -> None:
        """A version just loaded (a no-op unless enabled): ``weights`` as given
        when on the host (the trainer sent a copy of its own), else a host copy
        (snapshots are saved in checkpoints; device memory is for generating)."""
        if self.enabled:
            self._snapshots[version] = {k: v.detach().to("cpu") for k, v in weights.items()}

    def check(self, group_id: GroupId, version: int) -> None:
        if version not in self._snapshots:
            raise GenerationError(
                f"group {group_id!r} is pinned to weight version {version}, which this engine "
                f"no longer holds (it keeps {sorted(self._snapshots)}); deterministic runs need "
                "LocalEngine(pin_versions=True), and the controller to retain the version"
            )

    def keep_only(self, keep: set[int]) -> None:
        for old in [v for v in self._snapshots if v not in keep]:
            del self._snapshots[old]
            self._models.pop(old, None)

    def snapshots(self) -> dict[int, Weights]:
        return dict(self._snapshots)

    def restore(self, snapshots: Mapping[int, Weights]) -> None:
        for version, weights in snapshots.items():
            self._snapshots.setdefault(int(version), weights)

    def model(self, version: int, like: torch.nn.Module) -> torch.nn.Module:
        """The model of a pinned version: its own copy, even when ``like`` (the
        engine's model) holds that version - the main model and a copy with
        equal weights can differ in the last bits, and which one ran must not
        depend on timing."""
        model = self._models.get(version)
        if model is None:
            model = copy.deepcopy(like)
            model.load_state_dict(self._snapshots[version])
            self._models[version] = model
        return model
