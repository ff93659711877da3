"""Prompts through a pretrained tokenizer's chat template; the reward sees the raw prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.pretrained import save_tiny_chat_model

from asyncrl.config import PolicyConfig
from asyncrl.config.dataset import DatasetTaskConfig
from asyncrl.errors import ConfigError
from asyncrl.policy.build import HFTokenizer, PolicyTokenizer, load_tokenizer
from asyncrl.policy.build import bind_task_tokenizer as bind
from asyncrl.tasks import DatasetTask
from asyncrl.tasks.tokenizer import encode_prompt

pytest.importorskip("transformers")
pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_chat_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "1+1", "answer": "2", "level": 1}) + "\n")
    return path


def bind_task_tokenizer(task: DatasetTask, policy: PolicyConfig) -> None:
    bind(task, PolicyTokenizer(policy))


def dataset_task(data: Path, **kw: object) -> DatasetTask:
    return DatasetTask(DatasetTaskConfig(path=str(data), prompt_key="question",
                                         template="q: {question}=", **kw))


def test_the_engine_sees_the_chat_template_and_the_reward_the_raw_prompt(
        model_dir: Path, data: Path) -> None:
    task = dataset_task(data, chat_template=True, system_prompt="be brief")
    policy = PolicyConfig(model_name_or_path=str(model_dir))
    bind_task_tokenizer(task, policy)
    prompt = task.prompt_source(0).next_prompt()
    assert prompt.text == "<bos>[system]be brief\n[user]q: 1+1=\n[assistant]"
    assert task.prepare_reward(prompt).text == "q: 1+1="
    tokenizer = load_tokenizer(policy)
    assert isinstance(tokenizer, HFTokenizer)
    ids = encode_prompt(tokenizer, prompt.text)
    # The template writes the bos token itself: exactly one bos, in front.
    assert ids[0] == tokenizer.bos_id and ids.count(tokenizer.bos_id) == 1
    assert tokenizer.decode(ids) == prompt.text.removeprefix("<bos>")
    assert tokenizer.eos_id == 2 and tokenizer.pad_id == 0  # from the tokenizer's files


def test_without_system_prompt_there_is_only_the_user_turn(model_dir: Path, data: Path) -> None:
    task = dataset_task(data, chat_template=True)
    bind_task_tokenizer(task, PolicyConfig(model_name_or_path=str(model_dir)))
    assert task.prompt_source(0).next_prompt().text == "<bos>[user]q: 1+1=\n[assistant]"


def test_chat_template_needs_a_tokenizer_that_has_one(data: Path, tmp_path: Path) -> None:
    task = dataset_task(data, chat_template=True)
    with pytest.raises(ConfigError, match=r"needs a pretrained tokenizer with a chat template.*"
                                          "CharTokenizer"):
        bind_task_tokenizer(task, PolicyConfig())  # from scratch: a character tokenizer
    with pytest.raises(ConfigError, match="no tokenizer was bound"):
        task.prompt_source(0).next_prompt()
    plain = save_tiny_chat_model(tmp_path / "plain")
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    for extra in plain.glob("chat_template.*"):
        extra.unlink()
    with pytest.raises(ConfigError, match="needs a pretrained tokenizer with a chat template"):
        bind_task_tokenizer(task, PolicyConfig(model_name_or_path=str(plain)))


def test_without_chat_template_the_prompt_is_the_templated_text(model_dir: Path,
                                                                 data: Path) -> None:
    task = dataset_task(data)
    bind_task_tokenizer(task, PolicyConfig(model_name_or_path=str(model_dir)))
    assert task.prompt_source(0).next_prompt().text == "q: 1+1="
