"""Context length (issue 18, case 1): ``validate``/``train`` refuse a longest
prompt plus ``max_new_tokens`` over the model's context with the numbers and the
fix; an engine refuses a prompt that does not fit with ``PromptTooLong``.

(The same limit on real vLLM: tests/engines/test_vllm_engine.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.cli import main
from asyncrl.config import config_from_dict, load_config
from asyncrl.controller.evaluation import build_evaluation
from asyncrl.engines import LocalEngine
from asyncrl.engines.specs import context_cap
from asyncrl.errors import ConfigError, PromptTooLong
from asyncrl.policy.build import PolicyTokenizer, bind_task_tokenizer, build_policy
from asyncrl.policy.context_length import check_context, engine_context
from asyncrl.run.preflight import preflight
from asyncrl.tasks import build_task
from asyncrl.types import GenerationRequest, Prompt

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "examples" / "quickstart.yaml")


def test_validate_refuses_a_completion_that_cannot_fit_with_the_numbers_and_the_fix(
        capsys) -> None:
    # The case: 8 positions, 30 new tokens. The engines used to disagree
    # silently (the local one went past the context, vLLM cut at it).
    assert main(["validate", "--config", QUICKSTART, "policy.model.max_position_embeddings=8",
                 "policy.generation.max_new_tokens=30"]) == 2
    err = capsys.readouterr().err
    assert "error: context length: the longest prompt (5 tokens: '3+3=')" in err
    assert "needs 35 positions, but the context is 8" in err
    assert "policy.model.max_position_embeddings to 35 or more" in err
    assert "policy.generation.max_new_tokens to 3 or less" in err
    assert len(err.strip().splitlines()) == 1


def check(*overrides: str, tree: dict | None = None) -> dict:
    cfg = load_config(QUICKSTART, list(overrides)) if tree is None else config_from_dict(tree)
    tokenizer = PolicyTokenizer(cfg.policy)
    task, evaluator = build_evaluation(cfg.eval, build_task(cfg.task), task_cfg=cfg.task,
                                       seed=cfg.seed, tokenizer=tokenizer)
    bind_task_tokenizer(task, tokenizer)
    return check_context(cfg.policy, task, tokenizer.get(task), evaluator,
                         cap=context_cap(cfg.policy))


def test_a_config_that_fits_reports_its_context_and_longest_prompt() -> None:
    # "9+9=" plus bos: 5 tokens; 59 new tokens fill the 64 positions exactly.
    assert check("task.max_operand=9", "policy.generation.max_new_tokens=59") == {
        "context_length": 64, "longest_prompt_tokens": 5}
    with pytest.raises(ConfigError, match="needs 65 positions"):
        check("task.max_operand=9", "policy.generation.max_new_tokens=60")
    # A string task's bound: "rev " + 12 characters + "=" + bos.
    assert check("task.name=reverse", "task.max_length=12")["longest_prompt_tokens"] == 18


def test_vllm_max_model_len_is_the_context_and_may_not_exceed_the_model() -> None:
    vllm = ["policy.engine=vllm", "policy.model.num_heads=2"]
    with pytest.raises(ConfigError, match=r"max_model_len=128 is above the model's context "
                                          r"\(policy.model.max_position_embeddings=64\)"):
        check(*vllm, "policy.vllm.max_model_len=128")
    with pytest.raises(ConfigError, match=r"context is 6 \(policy.vllm.max_model_len=6\).*"
                                          r"Raise policy.vllm.max_model_len to 7 or more"):
        check(*vllm, "policy.vllm.max_model_len=6")
    # Beyond the model's context too: both settings must grow.
    with pytest.raises(ConfigError, match=r"Raise policy.model.max_position_embeddings and "
                                          r"policy.vllm.max_model_len to 70 or more"):
        check(*vllm, "policy.vllm.max_model_len=32", "policy.generation.max_new_tokens=65")
    cfg = load_config(QUICKSTART, [*vllm, "policy.vllm.max_model_len=32"])
    assert engine_context(cfg.policy, context_cap(cfg.policy)).tokens == 32


def write_words(path: Path, longest: str) -> Path:
    records = [{"word": w, "answer": "1"} for w in ("one", longest, "two")]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_dataset_is_scanned_and_the_longest_record_is_named(tmp_path: Path) -> None:
    data = write_words(tmp_path / "words.jsonl", "a much longer word than the others")
    task = ["task.name=dataset", f"task.path={data}", 'task.template="{word} ="']
    with pytest.raises(ConfigError) as err:
        check(*task, "policy.model.max_position_embeddings=32")
    message = str(err.value)
    assert "the longest prompt (37 tokens, " in message and "line 2" in message
    assert f"leave the longest prompts out of {data}" in message
    # Held-out prompts with their own, longer limit.
    holdout = [*task, "eval.holdout=1", "eval.max_new_tokens=61"]
    with pytest.raises(ConfigError, match=r"a held-out eval prompt.*eval.max_new_tokens=61"):
        check(*holdout)


def test_a_pretrained_tokenizers_scan_is_cached_by_content(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.tasks.dataset import DatasetTask
    from tests.pretrained import save_tiny_chat_model

    monkeypatch.setenv("ASYNCRL_CACHE_DIR", str(tmp_path / "cache"))
    model = save_tiny_chat_model(tmp_path / "model")
    data = write_words(tmp_path / "words.jsonl", "seventeen")
    overrides = [f"policy.model_name_or_path={model}", "task.name=dataset", f"task.path={data}",
                 'task.template="{word} ="', "task.chat_template=true"]
    scans = []
    original = DatasetTask.make_prompt
    monkeypatch.setattr(DatasetTask, "make_prompt",
                        lambda self, i, **kw: scans.append(i) or original(self, i, **kw))
    # The chat template's text counts: "<bos>[user]seventeen =\n[assistant]" is 30 tokens.
    assert check(*overrides)["longest_prompt_tokens"] == 30
    assert len(scans) == 3 + 1  # every record, then the longest one's text for messages
    scans.clear()
    assert check(*overrides)["longest_prompt_tokens"] == 30
    assert len(scans) == 1  # from the cache
    write_words(data, "eighteen")  # new content: scanned again
    assert check(*overrides)["longest_prompt_tokens"] == 29
    assert len(list((tmp_path / "cache" / "prompt_lengths").iterdir())) == 2


def test_preflight_runs_the_check_and_returns_the_facts() -> None:
    cfg = load_config(QUICKSTART, [])
    assert preflight(cfg).facts["context_length"] == 64
    with pytest.raises(ConfigError, match="context length"):
        preflight(load_config(QUICKSTART, ["policy.generation.max_new_tokens=64"]))


async def test_the_local_engine_refuses_a_prompt_that_does_not_fit() -> None:
    cfg = config_from_dict({"policy": {"model": {"hidden_size": 32, "num_heads": 2,
                                                 "num_layers": 1, "max_position_embeddings": 16},
                                       "generation": {"max_new_tokens": 6}}})
    task = build_task(cfg.task)
    model, tokenizer = build_policy(cfg.policy, task)
    engine = LocalEngine(model, tokenizer, cfg.policy.generation, num_threads=1)
    try:
        assert engine.context_length == 16
        with pytest.raises(PromptTooLong, match=r"is 11 tokens: with max_new_tokens=6 it needs "
                                                r"17 positions, more than the model's context "
                                                r"of 16"):
            await engine.generate(GenerationRequest("g", Prompt(0, "1111111+1="), 2))
        fits = await engine.generate(GenerationRequest("h", Prompt(1, "111111+1="), 2))
        assert all(len(c) <= 6 for c in fits.completion_ids)
    finally:
        await engine.close()
