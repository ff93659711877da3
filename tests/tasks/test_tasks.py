"""Built-in tasks: tokenizer, rewards, seeded and resumable prompt order, factory."""

from __future__ import annotations

import re

import pytest

from asyncrl.config import ArithmeticTaskConfig, ReverseTaskConfig, SortTaskConfig
from asyncrl.errors import ConfigError
from asyncrl.tasks import (
    ArithmeticTask,
    CharTokenizer,
    PromptSource,
    ReverseTask,
    SortTask,
    Task,
    Tokenizer,
    build_task,
    match_reward,
)
from asyncrl.types import Prompt

ALL_TASKS = [ArithmeticTask(), ReverseTask(), SortTask()]


# ---------------------------------------------------------------- tokenizer
def test_char_tokenizer_roundtrip_and_special_ids():
    tok = CharTokenizer()
    assert isinstance(tok, Tokenizer)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    text = "12+34=46 abc<>"
    ids = tok.encode(text)
    assert min(ids) >= 3 and max(ids) < tok.vocab_size
    assert tok.decode(ids) == text
    # special and out-of-range ids decode to nothing
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id, 10_000]) == text


def test_char_tokenizer_rejects_unknown_characters():
    tok = CharTokenizer("0123456789")
    with pytest.raises(ValueError, match="'x'"):
        tok.encode("1x")
    with pytest.raises(ValueError, match="distinct"):
        CharTokenizer("aa")
    with pytest.raises(ValueError, match="not in the built-in"):
        CharTokenizer.for_text("A")


def test_for_text_ids_do_not_depend_on_sample_order():
    assert CharTokenizer.for_text("ba", "=").chars == CharTokenizer.for_text("=ab").chars == "ab="


def test_for_text_takes_lists_of_strings_and_names_anything_else():
    # Issue 28, item 9: a list raised a raw "sequence item 0: expected str instance".
    prompts, answers = ["1+2=", "3+4="], ("3", "7")
    assert CharTokenizer.for_text(prompts, answers, " ").chars == "12347+= "
    assert CharTokenizer.for_text(iter(["ab"])).chars == "ab"
    for bad, named in ((["1+2=", 3], "got int 3 in a list"), (5, "got int 5"),
                       (b"ab", "got bytes b'ab'"), ([None], "got NoneType None in a list")):
        with pytest.raises(TypeError, match=re.escape(named)) as err:
            CharTokenizer.for_text(bad)
        assert "takes strings, or iterables of strings" in str(err.value)


@pytest.mark.parametrize("task", ALL_TASKS, ids=lambda t: t.name)
def test_task_tokenizer_covers_every_prompt_and_answer(task):
    src = task.prompt_source(seed=3)
    for _ in range(200):
        p = src.next_prompt()
        assert task.tokenizer.decode(task.tokenizer.encode(p.text + p.answer)) == p.text + p.answer


# ------------------------------------------------------------------ rewards
def test_match_reward_exact_and_partial_credit():
    assert match_reward("abc", "abc") == 1.0
    assert match_reward("  abc \n", "abc") == 1.0  # surrounding whitespace ignored
    # 0.5 * positional matches / longer length
    assert match_reward("abd", "abc") == pytest.approx(0.5 * 2 / 3)
    assert match_reward("ab", "abc") == pytest.approx(0.5 * 2 / 3)
    assert match_reward("abcx", "abc") == pytest.approx(0.5 * 3 / 4)  # extra chars cost
    assert match_reward("cba", "abc") == pytest.approx(0.5 * 1 / 3)
    assert match_reward("", "abc") == 0.0
    assert match_reward("xyz", "abc") == 0.0


def test_arithmetic_reward_partial_by_default_exact_only_on_request():
    p = Prompt(0, "7+6=", "13")
    partial = ArithmeticTask()
    assert partial.reward(p, "13") == partial.reward(p, " 13\n") == 1.0
    assert partial.reward(p, "12") == pytest.approx(0.25)  # tens digit right
    assert partial.reward(p, "1") == pytest.approx(0.25)
    assert partial.reward(p, "31") == 0.0
    assert partial.reward(p, "13+") == pytest.approx(0.5 * 2 / 3)
    exact = ArithmeticTask(ArithmeticTaskConfig(partial_credit=0.0))
    assert exact.reward(p, "13") == 1.0
    assert exact.reward(p, "12") == exact.reward(p, "1") == exact.reward(p, "") == 0.0


def test_partial_credit_weight():
    assert match_reward("abd", "abc", partial_credit=0.3) == pytest.approx(0.3 * 2 / 3)
    assert match_reward("abd", "abc", partial_credit=0.0) == 0.0
    with pytest.raises(ValueError):
        ReverseTaskConfig(partial_credit=1.0)  # exact answers must stay strictly best


def test_every_task_reward_is_in_unit_interval_and_exact_answer_scores_one():
    for task in ALL_TASKS:
        src = task.prompt_source(seed=0)
        for _ in range(50):
            p = src.next_prompt()
            assert task.reward(p, p.answer) == 1.0
            for wrong in ["", "0", "zz", p.answer + "1", p.answer[::-1] + "=", "9" * 12]:
                r = task.reward(p, wrong)
                assert 0.0 <= r <= 1.0
                if wrong.strip() != p.answer:
                    assert r <= 0.5


def test_arithmetic_prompts_and_answers():
    task = ArithmeticTask(ArithmeticTaskConfig(max_operand=12, operators="+-*"))
    src = task.prompt_source(seed=1)
    seen_ops = set()
    for _ in range(300):
        p = src.next_prompt()
        a, op, b = _split(p.text)
        seen_ops.add(op)
        assert 0 <= a <= 12 and 0 <= b <= 12
        assert int(p.answer) == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert task.reward(p, p.answer) == 1.0
    assert seen_ops == {"+", "-", "*"}


def _split(text: str) -> tuple[int, str, int]:
    assert text.endswith("=")
    for i, c in enumerate(text[1:], start=1):
        if c in "+-*":
            return int(text[:i]), c, int(text[i + 1 : -1])
    raise AssertionError(text)


def test_string_tasks_answers():
    rev = ReverseTask(ReverseTaskConfig(min_length=1, max_length=6, alphabet="xyz"))
    srt = SortTask(SortTaskConfig(min_length=1, max_length=6, alphabet="xyz"))
    for task, fn in [(rev, lambda s: s[::-1]), (srt, lambda s: "".join(sorted(s)))]:
        src = task.prompt_source(seed=0)
        for _ in range(100):
            p = src.next_prompt()
            word, s = p.text[:-1].split(" ")
            assert word == task.word and 1 <= len(s) <= 6 and set(s) <= set("xyz")
            assert p.answer == fn(s)
    p = Prompt(0, "rev abc=", "cba")
    assert rev.reward(p, "cba") == 1.0
    assert rev.reward(p, "cbb") == pytest.approx(0.5 * 2 / 3)


def test_target_rewards_are_documented_values():
    assert all(t.target_reward == 0.9 for t in ALL_TASKS)


# ------------------------------------------------------------- prompt order
def _take(src: PromptSource, n: int) -> list[Prompt]:
    return [src.next_prompt() for _ in range(n)]


@pytest.mark.parametrize("task", ALL_TASKS, ids=lambda t: t.name)
def test_same_seed_same_order_different_seed_different_order(task):
    a, b, c = (_take(task.prompt_source(seed=s), 30) for s in (7, 7, 8))
    assert a == b
    assert [p.text for p in a] != [p.text for p in c]
    assert [p.prompt_id for p in a] == list(range(30))


@pytest.mark.parametrize("task", ALL_TASKS, ids=lambda t: t.name)
def test_restored_position_continues_the_exact_sequence(task):
    reference = _take(task.prompt_source(seed=5), 40)
    src = task.prompt_source(seed=5)
    _take(src, 17)
    state = src.state_dict()
    resumed = task.prompt_source(seed=999)  # the checkpoint restores the seed too
    resumed.load_state_dict(state)
    assert _take(resumed, 23) == reference[17:]
    assert _take(src, 23) == reference[17:]  # saving did not disturb the original


def test_num_prompts_ends_the_stream_and_survives_restore():
    task = ArithmeticTask(ArithmeticTaskConfig(num_prompts=5))
    src = task.prompt_source(0)
    assert all(p is not None for p in _take(src, 5))
    assert src.next_prompt() is None
    fresh = task.prompt_source(0)
    fresh.load_state_dict({"seed": 0, "position": 4})
    assert fresh.next_prompt().prompt_id == 4
    assert fresh.next_prompt() is None


# --------------------------------------------------------- factory, checks
def test_build_task_from_models_and_dicts():
    assert isinstance(build_task(ArithmeticTaskConfig()), ArithmeticTask)
    assert isinstance(build_task(ReverseTaskConfig()), ReverseTask)
    assert isinstance(build_task({"name": "sort", "alphabet": "xy"}), SortTask)
    for task in ALL_TASKS:
        assert isinstance(task, Task)
        assert isinstance(task.prompt_source(0), PromptSource)
    with pytest.raises(ConfigError):
        build_task({"name": "nope"})
    with pytest.raises(ConfigError):
        build_task(object())


@pytest.mark.parametrize(
    "make",
    [
        lambda: ArithmeticTask(ArithmeticTaskConfig(operators="/")),
        lambda: ArithmeticTask(ArithmeticTaskConfig(operators="")),
        lambda: ReverseTask(ReverseTaskConfig(min_length=5, max_length=2)),
        lambda: SortTask(SortTaskConfig(alphabet="aA")),
        lambda: SortTask(SortTaskConfig(alphabet="aa")),
    ],
)
def test_invalid_task_configs_name_the_key(make):
    with pytest.raises(ConfigError, match="task\\."):
        make()


def test_long_tail_lengths_have_a_heavy_tail():
    """lengths: long_tail draws lognormal (sigma 1) lengths around median_length,
    clipped to [min_length, max_length]: a few strings are ~10x the median."""
    cfg = ReverseTaskConfig(lengths="long_tail", median_length=2, min_length=1, max_length=20)
    source = ReverseTask(cfg).prompt_source(0)
    lengths = sorted(len(source.next_prompt().answer) for _ in range(2000))
    assert lengths[len(lengths) // 2] == 2 and lengths[0] >= 1 and lengths[-1] == 20
    assert 0.01 < sum(n >= 10 for n in lengths) / len(lengths) < 0.1
    with pytest.raises(ConfigError, match="median_length=30 is outside"):
        ReverseTask(ReverseTaskConfig(lengths="long_tail", median_length=30, max_length=20))
