"""The policy in Hugging Face format: what ``final/``, ``asyncrl export`` and the
vLLM engine read.

:func:`save_policy` writes a directory that ``AutoModelForCausalLM.from_pretrained``
and ``AutoTokenizer.from_pretrained`` load (weights as safetensors, ``config.json``,
the tokenizer files) and that ``policy.model_name_or_path`` accepts again. A
built-in :class:`~asyncrl.tasks.CharTokenizer` is saved as an equivalent
``PreTrainedTokenizerFast`` (one token per character, same ids), so the saved
model reads exactly the ids it was trained on.

transformers is an optional extra, imported only here and only when called.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from asyncrl.errors import ConfigError, require
from asyncrl.tasks.tokenizer import BOS, EOS, PAD, CharTokenizer, Tokenizer

#: Where a LoRA run's ``final/`` (and an export of it) keeps the adapter.
ADAPTER_DIR = "adapter"


def char_tokenizer_to_hf(tokenizer: CharTokenizer) -> Any:
    """A ``PreTrainedTokenizerFast`` with exactly ``tokenizer``'s ids: pad, bos and
    eos first, then one token per character, no normalisation and no merges; like
    training, ``tokenizer(text)`` puts bos in front (``add_special_tokens=False``
    leaves it out)."""
    transformers = require("transformers", "hf", "saving the policy in Hugging Face format")
    tokenizers = require("tokenizers", "hf", "saving the policy in Hugging Face format")
    vocab = {PAD: tokenizer.pad_id, BOS: tokenizer.bos_id, EOS: tokenizer.eos_id}
    vocab.update({c: i + 3 for i, c in enumerate(tokenizer.chars)})
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=PAD))
    # Every character is its own token, newlines included (a dataset task's
    # vocabulary may hold them; "." would leave a run of them as one piece).
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Split(
        tokenizers.Regex(r"[\s\S]"), behavior="isolated"
    )
    backend.decoder = tokenizers.decoders.Fuse()  # join tokens without spaces
    # tokenizer(text) starts with bos, as every prompt does in training (encode_prompt):
    # the exported policy reads a prompt exactly as it was trained to.
    backend.post_processor = tokenizers.processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, tokenizer.bos_id)])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=PAD,
        clean_up_tokenization_spaces=False,
    )


def hf_tokenizer(tokenizer: Tokenizer) -> Any:
    """The transformers tokenizer behind ``tokenizer`` (converted for a CharTokenizer)."""
    inner = getattr(tokenizer, "tokenizer", None)  # asyncrl.policy.build.HFTokenizer
    if inner is not None and hasattr(inner, "save_pretrained"):
        return inner
    if isinstance(tokenizer, CharTokenizer):
        return char_tokenizer_to_hf(tokenizer)
    raise ConfigError(
        f"cannot save a {type(tokenizer).__name__} in Hugging Face format: use a "
        "CharTokenizer or a transformers tokenizer (policy.model_name_or_path)"
    )


def save_policy(
    model: Any,
    tokenizer: Tokenizer,
    out_dir: str | Path,
    *,
    state_dict: Mapping[str, Any] | None = None,
    adapter_dir: str | Path | None = None,
) -> Path:
    """Write ``model`` (with ``state_dict`` loaded into a copy of it, when given) and
    its tokenizer to ``out_dir`` in Hugging Face format, atomically; the directory
    ``adapter_dir`` (a LoRA adapter as peft saves it) is copied in as ``out_dir/adapter``.

    The directory is written under a temporary name next to ``out_dir`` and
    renamed into place, so a reader never sees half a model; an existing
    ``out_dir`` is replaced.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    hf_tok = hf_tokenizer(tokenizer)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if state_dict is not None:
            import copy

            model = copy.deepcopy(model)
            model.load_state_dict(dict(state_dict))
        with _no_progress_bars():
            model.save_pretrained(tmp, safe_serialization=True)
            hf_tok.save_pretrained(tmp)
            if adapter_dir is not None:
                shutil.copytree(adapter_dir, tmp / ADAPTER_DIR)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers draws a progress bar per save; a run's log is no place for it."""
    hf_logging = require("transformers", "hf", "saving the policy").utils.logging
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
