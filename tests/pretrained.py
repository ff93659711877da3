"""A tiny pretrained-format chat model, saved by the test that needs it, and a
small chat workload for it (the local engine's and vLLM's end-to-end tests).

A 1-layer Llama with random weights and a one-token-per-character tokenizer
(``asyncrl.policy.hf.char_tokenizer_to_hf``) that has a chat template, written with
``save_pretrained``: what ``policy.model_name_or_path`` expects, without a download.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Roles in brackets, the bos token first, a newline after every message.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)
CHARS = ("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
         "+-*/=<>:;?!.,$#'\"()[]{}\\ \n")


def save_tiny_chat_model(out: Path, *, seed: int = 0, hidden_size: int = 32) -> Path:
    """Two heads of ``hidden_size // 2``; vLLM's CPU kernels need ``hidden_size=128``."""
    import torch
    import transformers

    from asyncrl.policy.hf import char_tokenizer_to_hf
    from asyncrl.tasks import CharTokenizer

    chars = CharTokenizer(CHARS)
    tokenizer = char_tokenizer_to_hf(chars)
    tokenizer.chat_template = CHAT_TEMPLATE
    config = transformers.LlamaConfig(
        vocab_size=chars.vocab_size, hidden_size=hidden_size, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, intermediate_size=2 * hidden_size,
        max_position_embeddings=512, pad_token_id=chars.pad_id, bos_token_id=chars.bos_id,
        eos_token_id=chars.eos_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


#: The prompts of :func:`write_sums`, before any template.
SUMS = {f"{a}+{b}=" for a in range(3) for b in range(3)}


def write_sums(path: Path) -> Path:
    """Nine sums as JSONL records with a ``level`` field (what ``reward_fns:graded`` reads)."""
    path.write_text("".join(json.dumps({"question": f"{a}+{b}", "answer": str(a + b),
                                        "level": a + b}) + "\n"
                            for a in range(3) for b in range(3)))
    return path


def chat_sums_overrides(model_dir: Path, data: Path) -> list[str]:
    """A dataset task over ``data`` (:func:`write_sums`), chat-templated by the
    model in ``model_dir``, scored by ``reward_fns:graded``, 3 steps."""
    return ["grpo.max_num_steps=3", f"policy.model_name_or_path={model_dir}",
            "policy.generation.max_new_tokens=3", "task.name=dataset", f"task.path={data}",
            "task.prompt_key=question", 'task.template="{question}="', "task.chat_template=true",
            "task.reward.name=custom", "task.reward.target=reward_fns:graded"]


class RecordingEngine:
    """A real engine (local or vLLM), recording the prompt text of every request."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.texts: list[str] = []
        self.prompt_ids: list[list[int]] = []

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    async def generate(self, request: Any) -> Any:
        self.texts.append(request.prompt.text)
        result = await self.engine.generate(request)
        self.prompt_ids.append(result.prompt_ids)
        return result

    async def update_weights(self, weights: Any, version: int) -> None:
        await self.engine.update_weights(weights, version)

    async def abort(self, group_ids: Any) -> None:
        await self.engine.abort(group_ids)

    async def invalidate_cache(self) -> None:
        await self.engine.invalidate_cache()

    async def close(self) -> None:
        await self.engine.close()
