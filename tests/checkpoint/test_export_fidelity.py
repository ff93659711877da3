"""Issue 18, case 2: the exported policy is the trained policy at inference.

Training puts bos in front of every prompt; the tokenizer in ``final/`` used
not to, so ``from_pretrained`` + ``generate`` saw other input than training did.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest
import torch

from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.engines import LocalEngine
from asyncrl.policy.build import HFTokenizer
from asyncrl.policy.hf import char_tokenizer_to_hf
from asyncrl.tasks import CharTokenizer, build_task
from asyncrl.tasks.tokenizer import encode_prompt
from asyncrl.types import GenerationRequest, Prompt
from tests.checkpoint.test_final_and_fallback import BASE

transformers = pytest.importorskip("transformers")

#: Every prompt the task makes (operands 0..9), and some it never saw.
PROMPTS = [f"{a}+{b}=" for a in range(10) for b in range(10)] + ["", "1", "=+", "99+99="]


@pytest.mark.e2e
def test_final_reads_prompts_as_training_did_and_generates_what_the_engine_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("task: {max_operand: 9}\n")
    overrides = [*BASE, "task.max_operand=9", "grpo.max_num_steps=6", "checkpoint.every_steps=0"]
    assert main(["train", "--config", str(config), "--run-dir", str(tmp_path / "run"),
                 *overrides]) == 0
    final = tmp_path / "run" / "final"
    cfg = load_config(str(config), overrides)
    trained_tokenizer = build_task(cfg.task).tokenizer  # what the engines encoded with

    exported = transformers.AutoTokenizer.from_pretrained(final)
    for text in PROMPTS:
        assert exported(text)["input_ids"] == encode_prompt(trained_tokenizer, text), text

    # Greedy decoding from final/ with transformers equals the engine's greedy
    # completion with the same weights (the final version), token for token.
    model = transformers.AutoModelForCausalLM.from_pretrained(final).eval()
    engine = LocalEngine(copy.deepcopy(model), trained_tokenizer, cfg.policy.generation,
                         num_threads=1)
    limit = cfg.policy.generation.max_new_tokens

    async def engine_greedy() -> list[list[int]]:
        try:
            results = await asyncio.gather(*(engine.generate(GenerationRequest(
                i, Prompt(i, text), 1, temperature=0.0)) for i, text in enumerate(PROMPTS[:40])))
            return [r.completion_ids[0] for r in results]
        finally:
            await engine.close()

    expected = asyncio.run(engine_greedy())
    with torch.no_grad():
        for text, want in zip(PROMPTS[:40], expected):
            ids = exported(text, return_tensors="pt")["input_ids"]
            out = model.generate(ids, do_sample=False, max_new_tokens=limit,
                                 pad_token_id=exported.pad_token_id)
            assert out[0, ids.shape[1]:].tolist() == want, text


def test_a_pretrained_tokenizer_is_trained_on_as_it_encodes_by_itself() -> None:
    chars = CharTokenizer("0123456789+=")
    adds_bos = char_tokenizer_to_hf(chars)
    assert HFTokenizer(adds_bos).bos_id == chars.bos_id
    # A tokenizer with a bos token it does not add itself (as GPT-2's): prompts
    # are not given one in training either, so that its exports agree too.
    plain = char_tokenizer_to_hf(chars)
    plain.backend_tokenizer.post_processor = None
    wrapped = HFTokenizer(plain)
    assert wrapped.bos_id is None
    for hf, ours in ((adds_bos, HFTokenizer(adds_bos)), (plain, wrapped)):
        for text in ("1+2=", "99+0="):
            assert hf(text)["input_ids"] == encode_prompt(ours, text)
