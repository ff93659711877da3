"""Shared by the sharded-trainer tests: fixed rollouts, configs, a trainer pair."""

from __future__ import annotations

import random
from typing import Any

import torch

from asyncrl.config import RunConfig, config_from_dict
from asyncrl.tasks import build_task
from asyncrl.types import Completion, GroupResult, Rollout

#: One layer, 32 wide: every test model here is this small.
TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 32}


def config(**blocks: Any) -> RunConfig:
    tree: dict[str, Any] = {
        "seed": 0,
        "task": {"name": "arithmetic", "max_operand": 9},
        "policy": {"model": dict(TINY), "generation": {"max_new_tokens": 4},
                   # ~4 sequences a micro-batch: chunks take several passes
                   "train_micro_batch_tokens": 48},
        "logging": {"progress": "never", "tensorboard": False, "plots": False},
    }
    for key, value in blocks.items():
        tree[key] = {**tree[key], **value} if isinstance(value, dict) and key in tree else value
    return config_from_dict(tree)


def fsdp(cfg: RunConfig, world_size: int = 2) -> RunConfig:
    trainer = cfg.trainer.model_copy(update={"strategy": "fsdp", "world_size": world_size})
    return cfg.model_copy(update={"trainer": trainer})


def fixed_rollouts(cfg: RunConfig, n_groups: int, n: int = 4, *, seed: int = 0,
                   lengths: list[int] | None = None) -> list[Rollout]:
    """Groups of made-up completions (random tokens, behaviour log-probs and
    rewards), reproducible from ``seed``; ``lengths`` fixes the completion lengths
    (0: an empty completion), else they are 0..4 at random."""
    task = build_task(cfg.task)
    tok = task.tokenizer
    rng = random.Random(seed)
    source = task.prompt_source(seed)
    out = []
    for g in range(n_groups):
        prompt = source.next_prompt()
        ids = tok.encode(prompt.text)
        sizes = lengths if lengths is not None else [rng.randint(0, 4) for _ in range(n)]
        completions = [[rng.randrange(tok.vocab_size) for _ in range(k)] for k in sizes]
        behavior = [[-rng.uniform(0.5, 3.0) for _ in c] for c in completions]
        result = GroupResult((seed, g), ids, [Completion.of(c, b, 0, "stop")
                                              for c, b in zip(completions, behavior)], 0)
        out.append(Rollout((seed, g), prompt, result, [rng.random() for _ in sizes]))
    return out


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
