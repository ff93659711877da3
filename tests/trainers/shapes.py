"""Shared by the trainer tests at real shapes: small models of a given shape and
synthetic rollouts (token ids, off-policy behavior log-probs, spread rewards)
that need no engine."""

from __future__ import annotations

import torch

from asyncrl.config import ModelConfig, PolicyConfig
from asyncrl.policy.build import build_policy, model_config
from asyncrl.tasks.tokenizer import CharTokenizer
from asyncrl.types import Completion, GroupResult, Prompt, Rollout

TOKENIZER = CharTokenizer()
#: A Qwen2-style model small enough for exact comparisons: grouped-query
#: attention, q/k/v biases, tied embeddings, a vocabulary larger than the tokenizer's.
SMALL_QWEN2 = ModelConfig(architecture="qwen2", hidden_size=32, num_layers=2, num_heads=4,
                          num_key_value_heads=2, intermediate_size=64, vocab_size=300,
                          max_position_embeddings=256, rope_theta=1e6)
#: Qwen2.5-0.5B's shape at 2 layers (examples/qwen2_shape.yaml at reduced depth).
QWEN2_2_LAYERS = ModelConfig(architecture="qwen2", hidden_size=896, num_layers=2, num_heads=14,
                             num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                             max_position_embeddings=32768, rope_theta=1e6)


def small_policy(seed: int = 0, model: ModelConfig = SMALL_QWEN2, **policy):
    return build_policy(PolicyConfig(model=model, **policy), seed=seed)


def meta_model(model: ModelConfig = QWEN2_2_LAYERS) -> torch.nn.Module:
    """The model of shape ``model`` on the meta device: no memory, no compute."""
    import transformers

    cls = (transformers.Qwen2ForCausalLM if model.architecture == "qwen2"
           else transformers.LlamaForCausalLM)
    with torch.device("meta"):
        return cls(model_config(transformers, model, TOKENIZER)).eval()


def synthetic_rollouts(lengths: list[list[int]], *, vocab: int, prompt_len: int = 5,
                       seed: int = 0) -> list[Rollout]:
    """One group per entry of ``lengths`` (its completions' lengths), with random
    token ids below ``vocab``, behavior log-probs of another policy and rewards
    spread over [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for group, lens in enumerate(lengths):
        prompt = torch.randint(3, vocab, (prompt_len,), generator=g).tolist()
        completions = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lens]
        behavior = [(-4 * torch.rand(n, generator=g)).tolist() for n in lens]
        result = GroupResult((0, group), [1, *prompt],
                             [Completion.of(c, b, 0, "stop") for c, b in zip(completions, behavior)],
                             0)
        rewards = torch.rand(len(lens), generator=g).tolist()
        out.append(Rollout((0, group), Prompt(group, "", ""), result, rewards))
    return out
