"""build_policy: the from-scratch model and a transformers model from a local directory."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncrl.config import ModelConfig, PolicyConfig, ReverseTaskConfig
from asyncrl.engines import LocalEngine
from asyncrl.errors import ConfigError
from asyncrl.policy.build import HFTokenizer, build_policy
from asyncrl.tasks import ArithmeticTask, CharTokenizer, ReverseTask, Tokenizer
from asyncrl.trainers import GRPOTrainer
from asyncrl.types import GenerationRequest, Prompt, Rollout

transformers = pytest.importorskip("transformers")
TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def test_from_scratch_model_uses_the_task_vocabulary_and_seed():
    task = ReverseTask(ReverseTaskConfig(alphabet="xyz"))
    model, tok = build_policy(PolicyConfig(model=TINY), task, seed=3)
    assert tok is task.tokenizer
    assert model.config.vocab_size == tok.vocab_size
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 1
    assert not model.training  # eval mode: no dropout
    same, _ = build_policy(PolicyConfig(model=TINY), task, seed=3)
    other, _ = build_policy(PolicyConfig(model=TINY), task, seed=4)
    a, b, c = (m.state_dict() for m in (model, same, other))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_building_does_not_touch_the_global_rng():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    build_policy(PolicyConfig(model=TINY), ArithmeticTask(), seed=1)
    assert torch.equal(torch.rand(3), expected)


def test_task_without_tokenizer_gets_the_default_char_tokenizer():
    class Bare:
        name, target_reward = "bare", 0.9

    _, tok = build_policy(PolicyConfig(model=TINY), Bare())
    assert isinstance(tok, CharTokenizer) and tok.chars == CharTokenizer().chars


def test_bad_sizes_and_missing_paths_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="num_heads"):
        build_policy(PolicyConfig(model=ModelConfig(hidden_size=30, num_heads=4)), ArithmeticTask())
    with pytest.raises(ConfigError, match="not an existing directory"):
        build_policy(PolicyConfig(model_name_or_path=str(tmp_path / "nope")), ArithmeticTask())
    with pytest.raises(ConfigError, match="could not load"):
        build_policy(PolicyConfig(model_name_or_path=str(tmp_path)), ArithmeticTask())


def save_tiny_hf_model(path) -> None:
    """A tiny GPT-2 and a character-level fast tokenizer, written like a user would."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for c in "0123456789+-*= abcdefghijklmnopqrstuvwxyz":
        vocab[c] = len(vocab)
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Split(
        tokenizers.Regex("."), behavior="isolated"
    )
    backend.decoder = tokenizers.decoders.Fuse()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    config = transformers.GPT2Config(
        vocab_size=len(vocab), n_embd=32, n_layer=1, n_head=2, n_positions=64,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    tok.save_pretrained(path)


async def test_local_transformers_model_plugs_into_engine_and_trainer(tmp_path):
    save_tiny_hf_model(tmp_path)
    model, tok = build_policy(PolicyConfig(model_name_or_path=str(tmp_path)), ArithmeticTask())
    assert isinstance(tok, HFTokenizer) and isinstance(tok, Tokenizer)
    # Its tokenizer has a bos token but does not put it in front by itself (like
    # GPT-2's): prompts are encoded as it encodes them, without one (issue 18).
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, None, 2)
    assert tok.decode(tok.encode("3+5=")) == "3+5="
    assert not model.training and next(model.parameters()).dtype == torch.float32

    engine = LocalEngine(
        build_policy(PolicyConfig(model_name_or_path=str(tmp_path)), None)[0], tok, num_threads=1
    )
    prompts = [Prompt(0, "3+5=", "8"), Prompt(1, "12+30=", "42")]  # different lengths
    results = await asyncio.gather(
        *[engine.generate(GenerationRequest(p.prompt_id, p, 3)) for p in prompts]
    )
    assert results[0].prompt_ids == tok.encode("3+5=") == tok.tokenizer("3+5=")["input_ids"]
    trainer = GRPOTrainer(model, tok, num_threads=1)
    rollouts = [Rollout(r.group_id, p, r, [0.0, 0.5, 1.0]) for p, r in zip(prompts, results)]
    metrics = await trainer.train_chunk(rollouts, step=0)
    assert metrics["logprob_mismatch"] < 1e-4  # absolute positions right despite left padding
    assert "grad_norm" in await trainer.finish_step(step=0)
    await engine.update_weights(await trainer.get_weights(), 1)
    await engine.close()
    await trainer.close()


# ------------------------------------------------------ real-model shapes
def test_qwen2_shape_knobs_build_that_model():
    from tests.trainers.shapes import SMALL_QWEN2, small_policy

    model, tok = small_policy()
    config = model.config
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert config.vocab_size == SMALL_QWEN2.vocab_size > tok.vocab_size
    assert config.num_key_value_heads == 2 and config.num_attention_heads == 4
    assert config.rope_parameters["rope_theta"] == 1e6 and config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None  # Qwen2's biases
    assert attn.k_proj.out_features == 2 * 8  # two key/value heads of 8
    untied, _ = small_policy(model=SMALL_QWEN2.model_copy(update={"tie_word_embeddings": False}))
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight


def test_impossible_shapes_are_config_errors():
    with pytest.raises(ConfigError, match="num_key_value_heads=3"):
        build_policy(PolicyConfig(model=ModelConfig(num_heads=4, num_key_value_heads=3)),
                     ArithmeticTask())
    with pytest.raises(ConfigError, match=r"vocab_size=5 is smaller than the tokenizer"):
        build_policy(PolicyConfig(model=ModelConfig(vocab_size=5)), ArithmeticTask())


def test_the_old_micro_batch_key_names_its_replacement():
    from asyncrl.config import config_from_dict

    with pytest.raises(ConfigError, match="replaced by train_micro_batch_tokens"):
        config_from_dict({"policy": {"train_micro_batch_sequences": 8}})
    # A run written before the rename (config.yaml holds the old default) resumes.
    old = config_from_dict({"policy": {"train_micro_batch_sequences": 64}})
    assert old.policy.train_micro_batch_tokens == 8192
