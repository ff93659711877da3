"""Rollout functions: the session's record, the wrapper engine's contract,
failure classification and loading ``task.rollout``."""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path

import pytest

from asyncrl.cli import main
from asyncrl.controller import MemoryHistory
from asyncrl.errors import (
    BackendBug,
    ConfigError,
    EngineRewardError,
    GenerationError,
    GroupAborted,
    TooManyFailedGroups,
)
from asyncrl.rollouts import (
    EngineSession,
    RolloutFunctionEngine,
    RolloutFunctionError,
    RolloutOutput,
    RolloutSession,
    load_rollout,
)
from asyncrl.sim.clock import run_virtual
from asyncrl.types import Completion, GenerationRequest, Prompt
from tests.controller.conftest import make_controller
from tests.fakes import FakeTask, FakeTrainer, InlineScorer
from tests.rollouts.scripted import TOKENIZER, ScriptedEngine

PROMPT = Prompt(0, "3+4=", answer="7")


def tool_script(prompt: Prompt, so_far: str, row: int) -> str:
    """The policy calls the tool, then answers what the tool said (row 1 answers at once)."""
    if row == 1:
        return "7$"
    return "calc(3+4)xy$" if not so_far else so_far.rsplit("=", 1)[1] + "$"


async def one_call(prompt: Prompt, session: RolloutSession) -> RolloutOutput:
    transcripts = await session.generate(session.start(), stop=")")
    transcripts = [t if t.finished else session.append(t, "=7") for t in transcripts]
    transcripts = await session.generate(transcripts)
    return RolloutOutput(transcripts, [float(t.text.endswith("7")) for t in transcripts])


def request(n: int = 2, start: int | None = 3, group_id: object = "g") -> GenerationRequest:
    return GenerationRequest(group_id=group_id, prompt=PROMPT, num_generations=n,
                             start_weight=start)


def run(coro):
    return run_virtual(coro)


# ------------------------------------------------------------------ session
def test_policy_tokens_keep_the_engines_versions_and_environment_tokens_are_masked() -> None:
    """Turn 1 at version 3, a weight update, turn 2 at version 5: each policy token
    has the version that sampled it; the tool's tokens have loss_mask 0, log-prob
    0 and the version of the policy token before them."""
    engine = ScriptedEngine(tool_script)
    engine.weight_version = 3

    async def main():
        session = EngineSession(engine, request(), TOKENIZER)
        first = await session.generate(session.start(), stop=")")
        await engine.update_weights(None, 5)
        called = session.append(first[0], "=7")
        return session, first, await session.generate([called, first[1]])

    session, first, (done, direct) = run(main())
    # Cut right after ")": the tokens sampled after it ("xy", EOS) are dropped.
    assert first[0].text == "calc(3+4)" and first[0].finish_reason is None
    assert direct is first[1] and direct.text == "7" and direct.finish_reason == "stop"
    assert done.text == "calc(3+4)=77" and done.finish_reason == "stop"
    assert done.token_ids == [*TOKENIZER.encode("calc(3+4)=77"), TOKENIZER.eos_id]
    assert done.mask_list() == [1] * 9 + [0, 0] + [1, 1]
    assert done.version_list() == [3] * 9 + [3, 3] + [5, 5]
    assert done.logprobs == [-0.25] * 9 + [0.0, 0.0] + [-0.25] * 2
    assert session.turns == 2 and session.prompt_ids == [TOKENIZER.bos_id]
    # One engine request per turn, under the group's id, continuing the transcripts.
    second = engine.requests[1]
    assert second.group_id == "g" and second.start_weight == 3
    assert second.prefix.completions[0].mask_list() == [1] * 9 + [0, 0]


def test_environment_tokens_before_any_policy_token_take_the_start_weight() -> None:
    session = EngineSession(ScriptedEngine(tool_script), request(n=1, start=4), TOKENIZER)
    (t,) = session.start()
    t = session.append(t, [5, 6])
    assert t.token_ids == [5, 6] and t.version_list() == [4, 4] and t.mask_list() == [0, 0]
    assert session.finish(t, "length").finish_reason == "length"


def test_a_transcript_the_session_did_not_make_is_refused() -> None:
    session = EngineSession(ScriptedEngine(tool_script), request(n=1), TOKENIZER)
    forged = Completion.of([5], [-0.1], 9, None)
    with pytest.raises(ValueError, match="not made by this session"):
        session.append(forged, "=7")
    finished = session.finish(session.start()[0])
    with pytest.raises(ValueError, match="finished transcript"):
        session.append(finished, "=7")


# ------------------------------------------------------------- the wrapper
def wrapped(fn, script=tool_script, **kw) -> RolloutFunctionEngine:
    return RolloutFunctionEngine(ScriptedEngine(script, **kw), fn, TOKENIZER, name="t:fn")


def test_the_wrapper_returns_the_functions_record_and_rewards() -> None:
    result = run(wrapped(one_call).generate(request(start=None)))
    assert result.group_id == "g" and result.start_weight == 0  # the engine's version
    assert result.rewards == [1.0, 1.0] and result.prompt_ids == [TOKENIZER.bos_id]
    assert result.problem(start_weight=0, num_generations=2) is None


async def _raises_zero(prompt, session):
    await session.generate(session.start())
    return 1 / 0


async def _raises_infra(prompt, session):
    raise GenerationError("the tool server is down")


async def _returns_a_list(prompt, session):
    return await session.generate(session.start())


async def _forges(prompt, session):
    return RolloutOutput([Completion.of([5], [-0.1], 3, "stop")] * 2)


async def _one_reward(prompt, session):
    return RolloutOutput(await session.generate(session.start()), [1.0])


async def _leaves_unfinished(prompt, session):
    return RolloutOutput(await session.generate(session.start(), stop=")"))


@pytest.mark.parametrize(("fn", "match"), [
    (_raises_zero, r"task.rollout='t:fn' raised ZeroDivisionError"),
    (_returns_a_list, r"returned list; return asyncrl.rollouts.RolloutOutput"),
    (_forges, r"not made by this session"),
    (_leaves_unfinished, r"unfinished transcripts \[0\]; end each with session.finish"),
    (_one_reward, r"returned 1 reward for 2 completions"),
])
def test_a_bug_of_the_function_is_unclassified_and_names_it(fn, match) -> None:
    with pytest.raises(RolloutFunctionError, match=match):
        run(wrapped(fn).generate(request()))


def test_a_classified_failure_of_the_function_passes_through() -> None:
    with pytest.raises(GenerationError, match="tool server"):
        run(wrapped(_raises_infra).generate(request()))


def test_an_engine_bug_under_the_session_stays_the_engines() -> None:
    """An unclassified error of the engine reaches the controller as it is (a bug
    of the engine), not as one of the function that was awaiting it."""
    def broken(prompt, so_far, row):
        raise KeyError("engine internals")

    with pytest.raises(KeyError, match="engine internals"):
        run(wrapped(one_call, script=broken).generate(request()))


def test_abort_stops_a_function_in_its_environment_step_without_a_partial() -> None:
    in_step = asyncio.Event()

    async def slow_tool(prompt, session):
        await session.generate(session.start(), stop=")")
        in_step.set()
        await asyncio.Event().wait()  # an environment step that never ends

    async def main():
        engine = wrapped(slow_tool)
        task = asyncio.ensure_future(engine.generate(request()))
        await in_step.wait()  # the turn is done; the function is in its environment step
        await engine.abort(["g"])
        with pytest.raises(GroupAborted) as err:
            await task
        return engine, err.value

    engine, aborted = run(main())
    assert aborted.partial is None and engine.engine.aborted == ["g"]
    assert not hasattr(engine, "snapshot")  # checkpoints keep no mid-rollout tokens


# ------------------------------------------------------------ in a run
def _controller(fn, steps: int = 6, scorer: InlineScorer | None = None):
    engine = RolloutFunctionEngine(ScriptedEngine(tool_script), fn, TOKENIZER, name="t:fn")
    task = FakeTask()
    return make_controller({"name": "in_order", "max_lookahead_versions": 1}, engines=[engine],
                           trainer=FakeTrainer(), task=task, scorer=scorer or InlineScorer(task),
                           steps=steps, history=MemoryHistory())


async def _task_scores(prompt, session):
    return RolloutOutput((await one_call(prompt, session)).completions)


@pytest.mark.parametrize("fn", [one_call, _task_scores])
def test_a_run_of_rollout_functions_balances_its_ledger(fn) -> None:
    scorer = InlineScorer(FakeTask())
    ctl = _controller(fn, scorer=scorer)
    run(ctl.run())
    ledger = ctl.summary()["ledger"]
    assert ledger["balanced"] and ledger["trained"] == 6 * 4
    # Rewards from the function, or (rewards=None) from the task's scorer.
    assert (scorer.calls > 0) == (fn is _task_scores)


def test_a_bug_in_the_function_stops_the_run_naming_it() -> None:
    ctl = _controller(_raises_zero)
    with pytest.raises(BackendBug, match=r"task.rollout='t:fn' raised ZeroDivisionError") as err:
        run(ctl.run())
    assert isinstance(err.value.__cause__.__cause__, ZeroDivisionError)
    assert ctl.stopped_at_safe_point and ctl.summary()["ledger"]["balanced"]


async def _nan_rewards(prompt, session):
    return RolloutOutput(await session.generate(session.start()), [float("nan"), 0.0])


async def _text_rewards(prompt, session):
    return RolloutOutput(await session.generate(session.start()), [1.0, "1"])


@pytest.mark.parametrize(("fn", "shown"), [(_nan_rewards, "nan for completion 0"),
                                           (_text_rewards, "'1' for completion 1")])
def test_rewards_of_the_function_that_are_not_finite_numbers_name_it(fn, shown) -> None:
    """Data (retried, as a reward function's would be), but the error and the fix
    name the rollout function that returned them, not a reward function."""
    with pytest.raises(EngineRewardError, match=rf"task.rollout='t:fn' returned reward {shown}; "
                                                "return a finite float per completion"):
        run(wrapped(fn).generate(request()))
    ctl = _controller(fn)
    with pytest.raises(TooManyFailedGroups) as err:
        run(ctl.run())
    text = str(err.value)
    assert f"EngineRewardError: the rollout function task.rollout='t:fn' returned reward {shown}" \
        in text
    assert "Fix the rollout function or engine the error names (it returned the rewards)" in text
    assert "reward function" not in text
    assert ctl.summary()["ledger"]["balanced"]


# ----------------------------------------------------------------- loading
@pytest.fixture
def user_module(monkeypatch):
    module = types.ModuleType("my_rollouts")

    async def good(prompt, session):
        return RolloutOutput([])

    def not_async(prompt, session):
        return None

    async def no_session(prompt):
        return None

    module.good, module.not_async, module.no_session = good, not_async, no_session
    monkeypatch.setitem(sys.modules, "my_rollouts", module)
    return module


def test_load_rollout_takes_an_async_function_of_prompt_and_session(user_module) -> None:
    assert load_rollout("my_rollouts:good") is user_module.good


@pytest.mark.parametrize(("target", "match"), [
    ("my_rollouts:not_async", r"^task.rollout 'my_rollouts:not_async' is not an async function; "
                              r"define it as async def not_async\(prompt, session\)"),
    ("my_rollouts:no_session", r"no_session\(prompt\) cannot be called as "
                               r"no_session\(prompt, session\)"),
    ("my_rollouts:missing", r"has no attribute 'missing'; check the function name \(public "
                            r"function names there: good, no_session, not_async\)"),
    ("no_such_module:fn", r"module 'no_such_module' cannot be imported"),
])
def test_a_bad_target_gets_one_line_naming_the_fix(user_module, target, match) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        load_rollout(target)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------ asyncrl validate
QUICKSTART = str(Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml")


@pytest.mark.parametrize(("target", "message"), [
    ("json", "task.rollout: 'json' is not of the form 'module:function'"),
    ("json:dumps", "task.rollout 'json:dumps' is not an async function; define it as "
                   "async def dumps(prompt, session) -> RolloutOutput"),
])
def test_validate_refuses_a_bad_rollout_target_in_one_line(target, message, capsys) -> None:
    code = main(["validate", "--config", QUICKSTART, "--no-memory", f"task.rollout={target}"])
    err = capsys.readouterr().err.strip()
    assert code != 0 and message in err and len(err.splitlines()) == 1


def test_validate_shows_the_rollout_function(user_module, capsys) -> None:
    code = main(["validate", "--config", QUICKSTART, "--no-memory", "--json",
                 "task.rollout=my_rollouts:good"])
    assert code == 0
    assert '"rollout": "my_rollouts:good (task.rollout)"' in capsys.readouterr().out
