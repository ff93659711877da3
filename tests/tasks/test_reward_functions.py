"""Built-in reward functions on hand-written cases, custom rewards, bad targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.config.dataset import (
    CustomRewardConfig,
    DatasetTaskConfig,
    ExactMatchRewardConfig,
    MathVerifyRewardConfig,
    RegexRewardConfig,
)
from asyncrl.errors import ConfigError, RewardError
from asyncrl.tasks import DatasetTask, build_scorer
from asyncrl.tasks.rewards import ExactMatch, MathVerify, Regex, load_custom_reward

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


# ------------------------------------------------------------ exact_match
@pytest.mark.parametrize(("options", "completion", "answer", "expected"), [
    ({}, "42", "42", 1.0),
    ({}, " 42\n", "42", 1.0),
    ({}, "41", "42", 0.0),
    ({}, "42", 42, 1.0),                      # a number answer compares as text
    ({}, "b", ["a", "b"], 1.0),               # a list answer: any of them
    ({"strip": False}, " 42", "42", 0.0),
    ({"ignore_case": True}, "Paris", "PARIS", 1.0),
    ({}, "Paris", "PARIS", 0.0),
    ({"collapse_whitespace": True}, "New   York", "New York", 1.0),
    ({}, "New   York", "New York", 0.0),
    ({"partial_credit": 0.5}, "13", "12", 0.25),   # 1 of 2 characters in place
    ({"partial_credit": 0.5}, "123", "12", 0.5 * 2 / 3),
])
def test_exact_match(options: dict, completion: str, answer: object, expected: float) -> None:
    reward = ExactMatch(ExactMatchRewardConfig(**options))
    assert reward("q", completion, answer) == pytest.approx(expected)


# ------------------------------------------------------------------ regex
@pytest.mark.parametrize(("options", "completion", "expected"), [
    ({"pattern": r"\d+"}, "the answer is 7", 1.0),
    ({"pattern": r"\d+"}, "seven", 0.0),
    ({"pattern": r"\d+", "full_match": True}, "the answer is 7", 0.0),
    ({"pattern": r"\d+", "full_match": True}, "77", 1.0),
    ({"pattern": r"^<think>.*</think>"}, "<think>hm</think> 4", 1.0),
])
def test_regex(options: dict, completion: str, expected: float) -> None:
    assert Regex(RegexRewardConfig(**options))("q", completion, None) == expected


# ------------------------------------------------------------ math_verify
@pytest.mark.parametrize(("completion", "answer", "expected"), [
    ("1/2", "0.5", 1.0),
    ("The answer is 0.5", "1/2", 1.0),
    ("so we get \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("First 3 apples, then 5: total \\boxed{8}", "8", 1.0),
    ("The answer is $10$.", 10, 1.0),
    ("She sold 72 clips.", "Natalia sold 48/2 = 24 clips in May.\n#### 72", 1.0),  # GSM8K answer
    ("1,000", "1000", 1.0),
    ("\\boxed{3}", "0.5", 0.0),
    ("no idea", "2", 0.0),
    ("she sold 72 clips and 3 more", "72", 0.0),  # the last number counts
])
def test_math_verify_on_equivalent_forms(completion: str, answer: object, expected: float) -> None:
    pytest.importorskip("math_verify")
    assert MathVerify(MathVerifyRewardConfig())("q", completion, answer) == expected


def test_math_verify_reads_the_gsm8k_sample_answers() -> None:
    pytest.importorskip("math_verify")
    sample = HERE.parents[1] / "examples" / "data" / "gsm8k_sample.jsonl"
    reward = MathVerify()
    for line in sample.read_text().splitlines():
        record = json.loads(line)
        number = record["answer"].rsplit("####", 1)[1].strip()
        assert reward(record["question"], f"so it is \\boxed{{{number}}}", record["answer"]) == 1.0
        assert reward(record["question"], f"{int(float(number)) + 1}", record["answer"]) == 0.0


def test_math_verify_needs_a_parsable_reference() -> None:
    pytest.importorskip("math_verify")
    with pytest.raises(ValueError, match="could not parse the reference answer"):
        MathVerify()("q", "1", "no number here")


# ----------------------------------------------------------------- custom
def write_records(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"question": "1+1", "answer": "2", "level": 1, "source": "a"},
        {"question": "2+3", "answer": "5", "level": 2, "source": "b"},
    ]))
    return path


def test_custom_reward_gets_the_raw_prompt_answer_and_other_fields(tmp_path: Path) -> None:
    import reward_fns

    reward_fns.CALLS.clear()
    task = DatasetTask(DatasetTaskConfig(
        path=str(write_records(tmp_path / "d.jsonl")), prompt_key="question",
        template="Q: {question}=", shuffle=False,
        reward=CustomRewardConfig(target="reward_fns:graded")))
    source = task.prompt_source(0)
    first, second = source.next_prompt(), source.next_prompt()
    assert task.reward(first, "2") == 1.0 and task.reward(first, "3") == 0.0
    assert task.reward(second, "4") == 0.5  # level 2: half marks, from the record
    # The record's fields other than the prompt and the answer keys.
    assert reward_fns.CALLS[0] == ("Q: 1+1=", "2", "2", {"level": 1, "source": "a"})


async def test_custom_async_reward_through_the_pool_and_directly(tmp_path: Path) -> None:
    task = DatasetTask(DatasetTaskConfig(
        path=str(write_records(tmp_path / "d.jsonl")), prompt_key="question", shuffle=False,
        reward=CustomRewardConfig(target="reward_fns:graded_async")))
    prompt = task.prompt_source(0).next_prompt()
    scorer = build_scorer(task, task.cfg)
    try:
        assert await scorer.score(prompt, ["2", "7", " 2 "]) == [1.0, 0.0, 1.0]
    finally:
        await scorer.close()
    # The direct path works inside a running loop too (it uses a thread of its own).
    assert task.reward(prompt, "2") == 1.0


def test_custom_reward_errors_are_reward_errors_with_the_text(tmp_path: Path) -> None:
    task = DatasetTask(DatasetTaskConfig(
        path=str(write_records(tmp_path / "d.jsonl")), prompt_key="question",
        reward=CustomRewardConfig(target="reward_fns:raises_on_x")))
    prompt = task.prompt_source(0).next_prompt()
    with pytest.raises(RewardError, match=r"reward_fns:raises_on_x raised ValueError: cannot "
                                          r"score 'ax' \(at .*reward_fns.py:\d+ in raises_on_x\)"):
        task.reward(prompt, "ax")


# ------------------------------------------------------------ bad targets
BAD_TARGETS = [
    ("reward_fns.graded", ["is not of the form 'module:function'", "target: my_rewards:score"]),
    ("reward_fns:", ["is not of the form 'module:function'"]),
    ("asyncrl_no_such_rewards:score", ["module 'asyncrl_no_such_rewards' cannot be imported",
                                       "installed or on PYTHONPATH"]),
    ("reward_fns:nope", ["has no attribute 'nope'", "check the function name", "graded"]),
    ("reward_fns:NOT_CALLABLE", ["is not a function (it is not callable)"]),
    ("reward_fns:no_record", ["cannot be called as no_record(prompt, completion, answer, **record)",
                              "['level', 'source']", "def no_record(prompt, completion, answer, **record)"]),
    ("reward_fns:two_args", ["cannot be called as two_args(prompt, completion, answer, **record)"]),
]


@pytest.mark.parametrize(("target", "fragments"), BAD_TARGETS, ids=[t for t, _ in BAD_TARGETS])
def test_bad_custom_target_names_the_target_and_the_fix(target: str, fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_custom_reward(CustomRewardConfig(target=target), ["level", "source"])
    message = str(info.value)
    assert f"task.reward.target {target!r}" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"


def test_a_module_that_fails_to_import_is_named(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "needs_dep_reward.py").write_text("import asyncrl_missing_dependency\n")
    (tmp_path / "broken_reward.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"was found but importing it failed.*install "
                                          "'asyncrl_missing_dependency'"):
        load_custom_reward(CustomRewardConfig(target="needs_dep_reward:score"))
    with pytest.raises(ConfigError, match="raised RuntimeError: boom at import"):
        load_custom_reward(CustomRewardConfig(target="broken_reward:score"))


def test_a_function_without_record_fields_is_fine_when_the_data_has_none() -> None:
    assert load_custom_reward(CustomRewardConfig(target="reward_fns:no_record"), []) is not None


def test_the_process_executor_needs_a_picklable_reward(tmp_path: Path) -> None:
    from asyncrl.tasks.rewards import RewardPool

    with pytest.raises(ConfigError, match=r"cannot be pickled.*executor: thread"):
        RewardPool(lambda prompt, completion: 1.0, executor="process")
