"""``asyncrl validate`` refuses every trainer layout that cannot run, with the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asyncrl.cli import main

QUICKSTART = str(Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml")
FSDP2 = ["trainer.strategy=fsdp", "trainer.world_size=2"]


def validate(capsys, *overrides: str) -> tuple[int, str]:
    code = main(["validate", "--config", QUICKSTART, *overrides])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.fixture
def one_gpu(monkeypatch) -> None:
    """This CPU machine seen as one with a single CUDA GPU and NCCL."""
    monkeypatch.setattr("asyncrl.run.preflight.check_device", lambda *a, **k: torch.device("cuda"))
    monkeypatch.setattr("asyncrl.run.preflight.check_model_source", lambda policy: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)


@pytest.mark.parametrize(("overrides", "expected"), [
    (["trainer.world_size=2"],
     "trainer.strategy=single runs in one process, but trainer.world_size=2; set "
     "trainer.strategy=fsdp"),
    ([*FSDP2, "trainer.backend=nccl"],
     "trainer.backend=nccl runs on CUDA GPUs only, but policy.device='cpu'"),
    ([*FSDP2, "policy.dtype=float16"],
     "trainer.strategy=fsdp does not support policy.dtype=float16"),
    ([*FSDP2, "policy.lora.r=8"], "trainer.strategy=fsdp does not shard LoRA adapters yet"),
    (["trainer.strategy=fsdp", "trainer.world_size=0"], "trainer.world_size"),
    (["trainer.strategy=ddp"], "trainer.strategy"),
])
def test_refused_layouts_name_the_key_and_the_fix(capsys, overrides, expected) -> None:
    code, out = validate(capsys, *overrides)
    assert code == 2 and expected in out, out


def test_more_ranks_than_gpus_is_refused(capsys, one_gpu) -> None:
    code, out = validate(capsys, *FSDP2, "policy.device=cuda")
    assert code == 2
    assert ("trainer.world_size=2 ranks need one GPU each with policy.device='cuda', but this "
            "machine has 1 visible; set trainer.world_size to at most 1") in out


def test_ray_ranks_without_a_gpu_each_are_refused(capsys, one_gpu) -> None:
    code, out = validate(capsys, *FSDP2, "policy.device=cuda", "cluster.backend=ray",
                         "cluster.trainer.num_gpus=0.5")
    assert code == 2 and "set cluster.trainer.num_gpus: 1" in out, out


def test_nccl_without_nccl_is_refused(capsys, one_gpu, monkeypatch) -> None:
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    code, out = validate(capsys, *FSDP2, "policy.device=cuda", "trainer.world_size=1")
    assert code == 2 and "has no NCCL" in out and "trainer.backend: gloo" in out, out


def test_a_valid_layout_is_described(capsys) -> None:
    code, out = validate(capsys, "--json", *FSDP2)
    assert code == 0 and json.loads(out)["trainer"] == "fsdp over 2 ranks (gloo, local processes)"
