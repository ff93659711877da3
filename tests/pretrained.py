"""A tiny pretrained-format chat model, saved by the test that needs it.

A 1-layer Llama with random weights and a one-token-per-character tokenizer
(``asyncrl.hf.char_tokenizer_to_hf``) that has a chat template, written with
``save_pretrained``: what ``policy.model_name_or_path`` expects, without a download.
"""

from __future__ import annotations

from pathlib import Path

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

    from asyncrl.hf import char_tokenizer_to_hf
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
