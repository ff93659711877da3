"""Issue 12, cases 8 and 9: ``asyncrl validate`` runs every check ``train`` runs
before its first step (one preflight), and bad input is an error, not a traceback.

Each bad config goes through both commands of the real entry point: validate
must refuse it with the same message train refuses it with, and train must
refuse it before it writes anything into the run directory.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from asyncrl.cli import main

SAMPLING = Path(__file__).resolve().parents[1] / "sampling"
NUMBER_WORDS = Path(__file__).resolve().parents[2] / "examples" / "data" / "number_words.jsonl"

BASE = """
grpo: {num_prompts_per_step: 8, max_num_steps: 2}
async_rl: {max_buffered_rollouts: 16, min_groups_for_streaming_train: 8}
logging: {progress: never}
"""

CUSTOM = "async_rl.sampler={name: custom, target: 'bad_samplers:%s'%s}"

# (id, overrides, fragment of the error)
BAD = [
    ("device-banana", ["policy.device=banana"], "policy.device='banana' is not a torch device"),
    ("device-cuda-on-cpu", ["policy.device=cuda"], "CUDA is not available here"),
    ("heads-do-not-divide", ["policy.model.num_heads=3"],
     "hidden_size=64 is not divisible by policy.model.num_heads=3"),
    ("model-path-missing", ["policy.model_name_or_path=/nope/model"],
     "'/nope/model' is not an existing directory"),
    ("deterministic-windowed", ["deterministic=true", "async_rl.sampler.name=windowed"],
     "deterministic: true needs a sampler that pins"),
    ("custom-negative-window", [CUSTOM % ("NegativeCapacitySampler", ", window: -5")],
     "required_buffer_capacity(8) is -32"),
    ("custom-on-policy-not-bool", [CUSTOM % ("NotBoolOnPolicySampler", "")],
     "is_on_policy is 'no', not True or False"),
    ("custom-init-raises", [CUSTOM % ("RaisingSampler", ", window: 3")],
     "raised RuntimeError: window 3 is not supported"),
    ("custom-without-select", [CUSTOM % ("NoSelectSampler", "")],
     "missing select (BaseSampler has none"),
    ("buffer-too-small", ["async_rl.max_buffered_rollouts=8"], "below the 16 slots"),
    ("eval-holdout-on-a-built-in-task", ["eval.holdout=4"], "seeded stream of its own"),
    ("eval-holdout-too-large", [f"task={{name: dataset, path: {NUMBER_WORDS}, template: "
                                "'{word} ='}", "eval.holdout=10"], "leaves no training records"),
    ("char-vocab-above-model-vocab", ["policy.model.vocab_size=5"],
     "policy.model.vocab_size=5 is smaller than the tokenizer's vocabulary (15 ids)"),
    ("chat-template-without-one", [f"task={{name: dataset, path: {NUMBER_WORDS}, template: "
                                   "'{word} =', chat_template: true}"],
     "needs a pretrained tokenizer with a chat template"),
]


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(SAMPLING))  # bad_samplers.py
    path = tmp_path / "c.yaml"
    path.write_text(BASE)
    return path


@pytest.mark.parametrize(("overrides", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_validate_and_train_refuse_alike_before_the_first_step(
    config: Path, tmp_path: Path, capsys, overrides: list[str], fragment: str
) -> None:
    if "policy.device=cuda" in overrides and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["validate", "--config", str(config), *overrides]) == 2
    out, err = capsys.readouterr()
    assert fragment in err, err
    assert "config is valid" not in out and "Traceback" not in err

    run_dir = tmp_path / "run"
    assert main(["train", "--config", str(config), "--run-dir", str(run_dir), *overrides]) == 2
    train_err = capsys.readouterr().err
    assert fragment in train_err and "Traceback" not in train_err
    assert not run_dir.exists(), "train wrote into the run directory before refusing"


def test_a_model_directory_missing_files_is_named(config: Path, tmp_path: Path, capsys) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "gpt2"}')
    assert main(["validate", "--config", str(config),
                 f"policy.model_name_or_path={model}"]) == 2
    err = capsys.readouterr().err
    assert "lacks weights" in err and "a tokenizer" in err and "config.json;" not in err
    (model / "model.safetensors").write_bytes(b"")
    (model / "tokenizer.json").write_text("{}")
    # Every file there, but the tokenizer (loaded to check it encodes the
    # prompts) is no tokenizer.
    assert main(["validate", "--config", str(config),
                 f"policy.model_name_or_path={model}"]) == 2
    err = capsys.readouterr().err
    assert "could not load a causal LM and its tokenizer" in err and "Traceback" not in err
    (model / "config.json").write_text('{"model_type": "no_such_architecture"}')
    assert main(["validate", "--config", str(config),
                 f"policy.model_name_or_path={model}"]) == 2
    assert "config.json cannot be read" in capsys.readouterr().err


def test_a_good_custom_sampler_passes_the_same_checks(config: Path, capsys) -> None:
    assert main(["validate", "--config", str(config), "--json",
                 CUSTOM % ("NegativeCapacitySampler", ", window: 1")]) == 0
    assert '"required_buffer_capacity": 16' in capsys.readouterr().out


def test_a_tokenizer_that_cannot_encode_the_prompts_is_refused(
        config: Path, tmp_path: Path, capsys) -> None:
    # A character vocabulary of digits only (what a number task exports): the
    # arithmetic prompts' "+" and "=" would become its unknown token.
    from asyncrl.config import PolicyConfig
    from asyncrl.policy.build import build_policy
    from asyncrl.policy.hf import save_policy
    from asyncrl.tasks import CharTokenizer

    class Digits:
        tokenizer = CharTokenizer("0123456789")

    model, tokenizer = build_policy(PolicyConfig(), Digits())
    save_policy(model, tokenizer, tmp_path / "digits")
    assert main(["validate", "--config", str(config),
                 f"policy.model_name_or_path={tmp_path / 'digits'}"]) == 2
    err = capsys.readouterr().err
    assert "its tokenizer cannot encode '+', '='" in err and "Traceback" not in err


def test_verbose_prints_the_traceback_of_the_users_code_that_raised(config: Path, capsys) -> None:
    overrides = [CUSTOM % ("RaisingSampler", ", window: 3")]
    assert main(["validate", "--config", str(config), *overrides]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert main(["-v", "validate", "--config", str(config), *overrides]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "bad_samplers.py" in err


# ------------------------------------------------------ issue 28, item 4: vocabularies
def _save_model(path: Path, vocab_size: int, tokenizer) -> Path:
    """A tiny Llama whose embedding has ``vocab_size`` rows, saved with ``tokenizer``."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _refused_alike(config: Path, tmp_path: Path, capsys, overrides: list[str]) -> str:
    """validate and train both refuse with one line (the same); train writes nothing."""
    capsys.readouterr()  # what saving the model printed (its progress bar)
    assert main(["validate", "--config", str(config), *overrides]) == 2
    err = capsys.readouterr().err
    [line] = err.strip().splitlines()
    run_dir = tmp_path / "run"
    assert main(["train", "--config", str(config), "--run-dir", str(run_dir), *overrides]) == 2
    train_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert train_line.partition(" error: ")[2] == line.partition(" error: ")[2]
    assert not run_dir.exists(), "train wrote into the run directory before refusing"
    return line


def test_a_tokenizer_larger_than_the_models_embedding_is_refused(
        config: Path, tmp_path: Path, capsys) -> None:
    # The arithmetic task's 15 character ids, a model with 10 embedding rows: the
    # first "=" (id 14) failed in the engine's forward as an IndexError.
    from asyncrl.policy.hf import char_tokenizer_to_hf
    from asyncrl.tasks import ArithmeticTask

    model = _save_model(tmp_path / "small", 10, char_tokenizer_to_hf(ArithmeticTask().tokenizer))
    line = _refused_alike(config, tmp_path, capsys, [f"policy.model_name_or_path={model}"])
    assert "its tokenizer has 15 ids but the model's embedding has 10" in line, line
    assert "resize_token_embeddings" in line


def test_a_special_token_beyond_the_models_embedding_is_refused(
        config: Path, tmp_path: Path, capsys) -> None:
    # A tokenizer whose eos id (40) lies beyond its len() (8 tokens) and beyond the
    # model's 16 rows: its size fits, the first padded batch or eos would not.
    import tokenizers
    import transformers

    vocab = {"<pad>": 0, "1": 1, "2": 2, "3": 3, "+": 4, "=": 5, "0": 6, "<eos>": 40}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Split(
        tokenizers.Regex(r"[\s\S]"), behavior="isolated")
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<pad>")
    assert len(tokenizer) <= 16 < tokenizer.eos_token_id
    model = _save_model(tmp_path / "eos", 16, tokenizer)
    line = _refused_alike(config, tmp_path, capsys, [f"policy.model_name_or_path={model}"])
    assert "the tokenizer's eos id 40 is outside the model's embedding of 16 ids" in line, line
    assert "resize_token_embeddings(41)" in line


class _CharTask:
    """A library task bringing its own character tokenizer (the CLI's tasks build
    theirs from their text, a user's task may not): one prompt and answer."""

    name = "letters"
    target_reward = 1.0

    def __init__(self, chars: str, prompt: str = "ab=", answer: str = "ba",
                 vocab_size: int | None = None) -> None:
        from asyncrl.tasks import CharTokenizer

        self.tokenizer = CharTokenizer(chars)
        if vocab_size is not None:  # a tokenizer that miscounts its ids
            self.tokenizer.vocab_size = vocab_size
        self.text = (prompt, answer)

    def prompt_source(self, seed: int):
        from asyncrl.tasks import SeededPromptSource

        return SeededPromptSource(lambda rng, i: self.text, seed=seed, task=self.name)

    def reward(self, prompt, completion: str) -> float:
        return float(completion == prompt.answer)


@pytest.mark.parametrize(("task", "fragment"), [
    (_CharTask("ab"), "cannot encode '=' of the prompt 'ab='"),
    (_CharTask("a=", prompt="a=", answer="ab"), "cannot encode 'b' of the answer 'ab'"),
    (_CharTask("ab=", vocab_size=2),
     "the tokenizer's eos id 2 is outside the model's embedding of 2 ids"),
], ids=["prompt", "answer", "special-id-beyond-vocab-size"])
def test_a_from_scratch_vocabulary_covers_the_task(task, fragment: str) -> None:
    from asyncrl.config import load_config
    from asyncrl.errors import ConfigError
    from asyncrl.run.preflight import preflight

    cfg = load_config(None, ["grpo.num_prompts_per_step=8", "grpo.max_num_steps=2",
                             "async_rl.max_buffered_rollouts=16",
                             "async_rl.min_groups_for_streaming_train=8"])
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        preflight(cfg, task=task)
    assert preflight(cfg, task=_CharTask("ab=")).task is not None  # a covering one passes


class _Dry:
    """A prompt source that is exhausted from the start."""

    def next_prompt(self):
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class _DryTask(_CharTask):
    def prompt_source(self, seed: int):
        return _Dry()


@pytest.mark.parametrize(("task", "fragment"), [
    (_CharTask("ab=", prompt=""), "the task 'letters' (tests.cli.test_preflight:_CharTask): "
     "prompt 0 from prompt_source(seed=0) has the empty text ''"),
    (_CharTask("ab= ", prompt="  "), "has the empty text '  '"),
    (_DryTask("ab="), "the task 'letters' (tests.cli.test_preflight:_DryTask): "
     "prompt_source(seed=0).next_prompt() returned None at once, so a run would train 0 steps"),
], ids=["empty-prompt", "blank-prompt", "no-prompts"])
def test_a_task_without_prompts_to_train_on_is_refused(task, fragment: str, tmp_path) -> None:
    import asyncrl
    from asyncrl.errors import ConfigError

    # asyncrl.train with a Python task: refused before the run directory is made
    # (it trained 0 steps, or on empty prompts, and exited 0).
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        asyncrl.train({}, task=task, run_dir=run_dir, grpo__num_prompts_per_step=8,
                      grpo__max_num_steps=2, async_rl__max_buffered_rollouts=16,
                      async_rl__min_groups_for_streaming_train=8, logging__progress="never")
    assert not run_dir.exists()


@pytest.mark.parametrize(("records", "template", "fragment"), [
    ('{"prompt": "a=", "answer": "1"}\n{"prompt": "", "answer": "2"}\n', None,
     "record 2 (line 2): its 'prompt' (task.prompt_key) is empty or blank"),
    ('{"prompt": "   ", "answer": "2"}\n', None, "record 1 (line 1): its 'prompt'"),
    ('{"q": "a=", "c": "", "answer": "1"}\n{"q": " ", "c": "", "answer": "2"}\n', "'{q}{c}'",
     "record 2 (line 2): task.template '{q}{c}' makes an empty prompt of it"),
], ids=["empty", "blank", "template-of-blank-fields"])
def test_a_dataset_record_without_a_prompt_is_refused_naming_it(
        config: Path, tmp_path: Path, capsys, records: str, template: str | None,
        fragment: str) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text(records)
    task = f"task={{name: dataset, path: {data}" + (f", template: {template}}}" if template
                                                    else "}")
    line = _refused_alike(config, tmp_path, capsys, [task])
    assert f"dataset file '{data}', {fragment}" in line, line
    # A template with text of its own always makes a prompt.
    assert main(["validate", "--config", str(config), "--no-memory",
                 f"task={{name: dataset, path: {data}, template: 'say {{answer}}='}}"]) == 0


def test_model_keys_beside_a_pretrained_model_are_named_as_ignored(
        config: Path, tmp_path: Path, capsys) -> None:
    from asyncrl.config import dump_config, load_config
    from asyncrl.run.preflight import preflight
    from tests.pretrained import save_tiny_chat_model

    model = save_tiny_chat_model(tmp_path / "model")
    config.write_text(BASE + f"policy: {{model_name_or_path: {model}, model: {{num_layers: 1}}}}\n")
    assert main(["validate", "--config", str(config), "--no-memory",
                 "policy.model.hidden_size=128"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("warning: policy.model.hidden_size, policy.model.num_layers are ignored: "
            f"policy.model_name_or_path ({model}) gives the model's shape") in out, out
    # Train logs the same list; a key left at its default is none the user set,
    # and a resumed run's config.yaml holds every key with its default.
    cfg = load_config(config, [])
    assert any("num_layers is ignored" in w for w in preflight(cfg).facts["warnings"])
    (tmp_path / "full.yaml").write_text(dump_config(load_config(None, [
        f"policy.model_name_or_path={model}"])))
    assert not [w for w in preflight(load_config(tmp_path / "full.yaml", [])).facts["warnings"]
                if "ignored" in w]
