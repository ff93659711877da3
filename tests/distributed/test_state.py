"""Trainer-state layouts: optimizer states keyed by index and by name convert
both ways exactly; masters win over low-precision weights."""

from __future__ import annotations

import torch

from asyncrl.trainers.state import (
    indexed_optimizer_state,
    is_sharded,
    master_weights,
    named_optimizer_state,
    unshard_state,
)


def test_optimizer_state_round_trips_between_indices_and_names() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    indexed = opt.state_dict()
    names = [n for n, _ in model.named_parameters()]
    named = named_optimizer_state(indexed, names)
    assert list(named["state"]) == names
    assert named["param_groups"][0]["params"] == names
    back = indexed_optimizer_state(named)
    assert back["param_groups"] == indexed["param_groups"]
    for i, state in indexed["state"].items():
        for key, value in state.items():
            assert torch.equal(back["state"][i][key], value)
    # A fresh optimizer loads it: the layout is torch's own.
    torch.optim.AdamW(model.parameters(), lr=1e-3).load_state_dict(back)


def test_master_weights_prefer_the_float32_masters() -> None:
    master = torch.tensor([1.0001, 2.0])
    classic = {"model": {"w": master.bfloat16(), "b": torch.ones(1, dtype=torch.bfloat16)},
               "master": {"w": master}}
    weights = master_weights(classic)
    assert weights["w"] is master
    assert weights["b"].dtype == torch.float32


def test_a_classic_state_is_not_sharded_and_passes_through() -> None:
    state = {"model": {}, "optimizer": {"state": {}, "param_groups": []}, "version": 0}
    assert not is_sharded(state) and unshard_state(state) is state
