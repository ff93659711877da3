"""The policy: the causal LM and tokenizer a run trains (``build``), saving it in
Hugging Face format (``hf``), the devices and dtypes it runs on (``devices``),
and the model's context against the task's prompts (``context_length``,
``prompt_lengths``).

The builders are imported on first use: importing this package (or its light
modules) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncrl.policy.build import (
        HFTokenizer,
        PolicyTokenizer,
        bind_task_tokenizer,
        build_policy,
        load_tokenizer,
        model_skeleton,
    )

__all__ = ["HFTokenizer", "PolicyTokenizer", "bind_task_tokenizer", "build_policy",
           "load_tokenizer", "model_skeleton"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("asyncrl.policy.build"), name)
    raise AttributeError(f"module 'asyncrl.policy' has no attribute {name!r}")
