"""Failures are classified where they are raised, and the run does what the class says.

At each boundary (the local engine, the Ray proxy, the reward pool, a custom
engine, a custom reward) the error raised has a kind: ``infra`` (retried with
backoff, on another engine), ``data`` (retried at once, then skipped or the
run fails naming the budget) or none - a bug: not retried, the run stops at
once, at a safe point, naming the component.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from asyncrl.errors import (
    BackendBug,
    EngineUnavailable,
    GenerationError,
    GenerationTimeout,
    PromptError,
    RewardError,
    RewardTimeout,
    RewardWorkerLost,
    TokenizationError,
    TooManyFailedGroups,
    TrainerError,
    failure_kind,
)
from asyncrl.sim.clock import run_virtual
from asyncrl.types import Completion, GenerationRequest, GroupResult, Prompt
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTask, FakeTrainer, InlineScorer
from tests.vtime import advance

IN_ORDER = {"name": "in_order", "max_lookahead_versions": 1}


def request(prompt_id: int = 0, text: str = "1+1=") -> GenerationRequest:
    return GenerationRequest(f"g{prompt_id}", Prompt(prompt_id, text, answer="2"), 2)


# ------------------------------------------------------------------ the kinds
@pytest.mark.parametrize(("error", "kind"), [
    (GenerationError, "infra"), (GenerationTimeout, "infra"), (EngineUnavailable, "infra"),
    (RewardTimeout, "infra"), (RewardWorkerLost, "infra"),
    (RewardError, "data"), (PromptError, "data"), (TokenizationError, "data"),
    (ValueError, None), (RuntimeError, None), (TooManyFailedGroups, None),
])
def test_every_failure_class_says_infra_or_data(error, kind) -> None:
    assert failure_kind(error("x")) == kind


# ------------------------------------------------------- local engine boundary
def _local_generate(req: GenerationRequest, forward_error: BaseException | None = None):
    """What the local engine's ``generate`` raises for ``req`` (its forward
    raising ``forward_error``, if given)."""
    from tests.engines.test_local_engine import make_engine

    async def main():
        engine = make_engine(max_new_tokens=2)
        if forward_error is not None:
            def explode(module, inputs, output):
                raise forward_error

            engine.model.lm_head.register_forward_hook(explode)
        try:
            return await engine.generate(req)
        finally:
            await engine.close()

    return asyncio.run(main())


def test_local_engine_device_failure_is_infra() -> None:
    with pytest.raises(GenerationError) as err:
        _local_generate(request(), RuntimeError("CUDA error: an illegal memory access"))
    assert failure_kind(err.value) == "infra"


def test_local_engine_bug_in_a_forward_passes_through_unclassified() -> None:
    with pytest.raises(TypeError):
        _local_generate(request(), TypeError("forward() got an unexpected keyword argument"))


def test_local_engine_prompt_it_cannot_tokenize_is_data() -> None:
    with pytest.raises(TokenizationError, match="prompt 7 cannot be tokenized") as err:
        _local_generate(request(7, text="1+1=§"))
    assert failure_kind(err.value) == "data"


# ------------------------------------------------------------ Ray proxy boundary
class _Ref:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __await__(self):
        raise self.error
        yield  # pragma: no cover - makes this a generator


class _Actor:
    def __init__(self, error: BaseException) -> None:
        self.generate = type("M", (), {"remote": lambda _self, _r: _Ref(error)})()


def _ray_generate(error: BaseException) -> BaseException:
    pytest.importorskip("ray")
    from asyncrl.cluster.proxies import RayEngine, WorkerPool

    async def main() -> BaseException:
        engine = RayEngine(WorkerPool(None, 0), 0, lambda *a: None, _Actor(error),
                           {"pid": 1, "node_id": "n", "version": 0}, max_restarts=0,
                           startup_timeout_s=1.0)
        try:
            await engine.generate(request())
        except BaseException as exc:
            return exc
        raise AssertionError("generate did not raise")

    return asyncio.run(main())


def test_ray_worker_death_is_infra_retried_at_once() -> None:
    from ray.exceptions import RayActorError

    error = _ray_generate(RayActorError(error_msg="the worker died"))
    assert isinstance(error, EngineUnavailable) and failure_kind(error) == "infra"


def test_ray_transport_failure_is_infra() -> None:
    from ray.exceptions import ObjectLostError

    error = _ray_generate(ObjectLostError("ab" * 14, None, "generate"))
    assert isinstance(error, GenerationError) and failure_kind(error) == "infra"
    assert "Ray failed to return group" in str(error)


def test_ray_worker_errors_keep_the_class_they_were_raised_with() -> None:
    from ray.exceptions import RayTaskError

    typed = _ray_generate(RayTaskError("generate", "tb", TokenizationError("bad prompt"))
                          .as_instanceof_cause())
    assert failure_kind(typed) == "data"
    untyped = _ray_generate(RayTaskError("generate", "tb", KeyError("oops"))
                            .as_instanceof_cause())
    assert failure_kind(untyped) is None  # a bug in the worker's code


# ---------------------------------------------------------- reward pool boundary
def _raises_on_one(prompt: Prompt, completion: str) -> float:
    raise ZeroDivisionError("the reward divided by zero")


def test_custom_reward_raising_is_data() -> None:
    from asyncrl.tasks.rewards import RewardPool

    async def main() -> BaseException:
        pool = RewardPool(_raises_on_one, num_workers=1, timeout_s=None)
        try:
            with pytest.raises(RewardError) as err:
                await pool.score(Prompt(3, "p"), ["a"])
        finally:
            await pool.close()
        return err.value

    error = asyncio.run(main())
    assert failure_kind(error) == "data" and "ZeroDivisionError" in str(error)


# ------------------------------------------------- what the run does, per class
class Recording(FakeEngine):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[int, int]] = []

    async def generate(self, request):
        self.seen.append((request.prompt.prompt_id, request.attempt))
        return await super().generate(request)


def test_infra_failure_is_retried_with_backoff_on_another_engine() -> None:
    engines = [Recording(1.0, fail=lambda r: r.prompt.prompt_id == 0 and r.attempt == 1)
               for _ in range(2)]
    ctl = make_controller(IN_ORDER, engines=engines, steps=2,
                          rollout_failure={"backoff_base_s": 4.0, "max_backoff_s": 4.0})
    result = run_virtual(ctl.run())
    assert result.summary["ledger"]["failed"] == 0
    first = next(i for i, e in enumerate(engines) if (0, 1) in e.seen)
    assert (0, 2) in engines[1 - first].seen  # the retry went to the other engine
    retry = next(r for r in ctl.ledger.records() if r.prompt_id == 0)
    assert retry.attempts == 2 and retry.finish_time >= 1.0 + 4.0 + 1.0  # waited the backoff


def test_data_failure_is_retried_at_once_then_skipped_within_the_budget() -> None:
    task = FakeTask()
    scorer = InlineScorer(task, fail=lambda p: p.prompt_id == 1)
    ctl = make_controller(IN_ORDER, task=task, scorer=scorer, steps=3,
                          rollout_failure={"max_skipped_prompts": 1,
                                           "on_dropped_prompt": "replace",
                                           "backoff_base_s": 100.0, "max_backoff_s": 100.0})
    result = run_virtual(ctl.run())
    (failed,) = [r for r in ctl.ledger.records() if r.state == "failed"]
    assert failed.prompt_id == 1 and failed.failure == "data" and failed.attempts == 2
    assert failed.finish_time < 10  # no backoff between data attempts
    assert result.steps == 3 and result.summary["failures"]["prompts_skipped"] == 1
    assert result.summary["ledger"]["failed_data"] == 1


def test_data_failure_beyond_max_skipped_prompts_stops_the_run_naming_it() -> None:
    task = FakeTask()
    scorer = InlineScorer(task, fail=lambda p: p.prompt_id == 1)
    ctl = make_controller(IN_ORDER, task=task, scorer=scorer, steps=3)
    with pytest.raises(TooManyFailedGroups, match="max_skipped_prompts=0") as err:
        run_virtual(ctl.run())
    assert isinstance(err.value.__cause__, RewardError)  # the original error, propagated
    assert ctl.stopped_at_safe_point


def test_after_a_data_budget_stop_the_fixed_run_trains_the_group_that_stopped_it() -> None:
    # Issue 28, item 9: "fix the reward, then resume" ended in a deadlock - the
    # failed group's step waited for it forever. The group that used the budget up
    # is not dropped: it stays pending, and the fixed run tries it again.
    task = FakeTask()
    ctl = make_controller(IN_ORDER, task=task, steps=3,
                          scorer=InlineScorer(task, fail=lambda p: p.prompt_id == 1),
                          rollout_failure={"min_step_batch_fraction": 0.5})
    with pytest.raises(TooManyFailedGroups):
        run_virtual(ctl.run())
    assert ctl.stopped_at_safe_point
    state, trainer_state = ctl.state_dict(), ctl.trainer.state_dict()
    assert 1 in [d["prompt"]["prompt_id"] for d in state["dispatch"]["inflight"]]
    trainer = FakeTrainer()
    trainer.load_state_dict(trainer_state)
    fixed = make_controller(IN_ORDER, task=task, steps=3, trainer=trainer,
                            history=ctl.ledger.history,
                            rollout_failure={"min_step_batch_fraction": 0.5})
    fixed.engines[0].weight_version = state["trainer_version"]  # as the runner loads it
    fixed.load_state_dict(state)
    result = run_virtual(fixed.run())
    assert result.steps == 3 and result.summary["ledger"]["balanced"]
    assert not [r for r in fixed.ledger.records() if r.state == "failed"]
    (group,) = [r for r in fixed.ledger.records() if r.prompt_id == 1]
    assert group.state == "trained" and group.attempts == 3  # two before the stop, one after
    assert result.summary["ledger"]["trained"] == 3 * 4  # every step at full size


class BuggyEngine(FakeEngine):
    """A user's engine with a bug: it raises an error that says neither infra nor data."""

    async def generate(self, request):
        if request.prompt.prompt_id == 2:
            raise KeyError("sampling_params")
        return await super().generate(request)


def test_custom_engine_untyped_error_stops_the_run_at_once_naming_the_engine() -> None:
    engine = BuggyEngine(1.0)
    ctl = make_controller(IN_ORDER, engines=[engine], steps=10)
    with pytest.raises(BackendBug) as err:
        run_virtual(ctl.run())
    text = str(err.value)
    assert "tests.controller.test_failure_classes.BuggyEngine" in text and "KeyError" in text
    assert isinstance(err.value.__cause__, KeyError)
    record = ctl.ledger[2]
    assert record.attempts == 1 and record.state == "inflight"  # not retried; kept pending
    assert ctl.stopped_at_safe_point and ctl.steps_done < 2
    assert ctl.summary()["ledger"]["balanced"]


class ContractBreakingEngine(FakeEngine):
    """An engine whose result for the first group that starts at weight 1
    breaks the record's contract in one way (``how``), with its completions one
    shared record or distinct ones."""

    def __init__(self, how: str, shared: bool) -> None:
        super().__init__(1.0)
        self.how, self.shared = how, shared
        self.broken: int | None = None

    async def generate(self, request):
        result = await super().generate(request)
        if request.start_weight != 1 or self.broken not in (None, request.group_id):
            return result
        self.broken = request.group_id
        start, n = result.start_weight, request.num_generations
        if self.how == "count":
            return GroupResult(result.group_id, [1], [Completion([3], [0.0], ((start, 1),),
                                                                 "stop")] * (n + 1), start)
        if self.how == "start_weight":
            result.start_weight = start + 1
            return result
        if self.how == "dict":  # not a GroupResult at all
            return {"group_id": result.group_id, "completions": result.completion_texts}
        bad = (Completion([3], [0.0], ((start, 1),), None) if self.how == "unfinished" else
               Completion([3], [0.0], ((start - 1, 1),), "stop"))
        good = Completion([3], [0.0], ((start, 1),), "stop")
        result.completions = [bad] * n if self.shared else [good] * (n - 1) + [bad]
        return result


@pytest.mark.parametrize("shared", [True, False], ids=["one shared record", "distinct records"])
@pytest.mark.parametrize(("how", "says"), [
    ("unfinished", "has no finish_reason"),
    ("old_version", "tokens of weight version 0, older than the group's start weight 1"),
    ("count", "completions for num_generations=2"),
    ("start_weight", "start_weight 2, but the request said 1"),
    ("dict", "ContractBreakingEngine) returned dict from generate; return an "
             "asyncrl.types.GroupResult(group_id, prompt_ids, completions, start_weight) (group "),
])
def test_an_engine_result_that_breaks_the_record_stops_the_run_naming_what(
        how, says, shared) -> None:
    engine = ContractBreakingEngine(how, shared)
    ctl = make_controller(IN_ORDER, engines=[engine], steps=10)
    with pytest.raises(BackendBug, match=r"ContractBreakingEngine\) returned ") as err:
        run_virtual(ctl.run())
    assert says in str(err.value) and "raised" not in str(err.value)
    assert "breaks the engine's contract is a bug in the engine" in str(err.value)
    assert ctl.ledger[engine.broken].attempts == 1  # a bug: not retried
    assert ctl.summary()["ledger"]["balanced"]


class RecordingEngine(FakeEngine):
    """Keeps every request it is asked to generate."""

    def __init__(self) -> None:
        super().__init__(1.0, fail=lambda r: r.prompt.prompt_id == 1 and r.attempt == 1)
        self.requests: list[GenerationRequest] = []

    async def generate(self, request):
        self.requests.append(request)
        return await super().generate(request)


def test_each_attempt_asks_for_its_group_by_field() -> None:
    """The controller builds each attempt's request positionally (cheaper, once
    per attempt): every field lands where its name says. Prompt 1's first
    attempt fails as infra and is retried."""
    engine = RecordingEngine()
    ctl = make_controller(IN_ORDER, engines=[engine], steps=3)
    run_virtual(ctl.run())
    by_prompt: dict[int, list[GenerationRequest]] = {}
    for r in engine.requests:
        by_prompt.setdefault(r.prompt.prompt_id, []).append(r)
    for prompt_id, requests in by_prompt.items():
        record = next(rec for rec in ctl.ledger.records() if rec.prompt_id == prompt_id)
        assert [r.attempt for r in requests] == list(range(1, len(requests) + 1))
        for r in requests:
            assert (r.group_id, r.num_generations, r.start_weight) == (
                record.group_id, ctl.grpo.num_generations_per_prompt, record.start_weight)
            assert (r.seed, r.weight_version, r.temperature, r.top_p, r.max_new_tokens,
                    r.prefix) == (None, None, None, None, None, None)
    assert len(by_prompt[1]) == 2 and by_prompt[1][0].start_weight == 0


class BuggyScorer(InlineScorer):
    async def score(self, prompt, completions):
        if prompt.prompt_id == 1:
            raise AttributeError("'NoneType' object has no attribute 'answer'")
        return await super().score(prompt, completions)


def test_scorer_untyped_error_is_a_bug_of_the_scorer() -> None:
    task = FakeTask()
    ctl = make_controller(IN_ORDER, task=task, scorer=BuggyScorer(task), steps=5)
    with pytest.raises(BackendBug, match=r"the scorer tests\.controller\.test_failure_classes"
                                         r"\.BuggyScorer raised AttributeError"):
        run_virtual(ctl.run())


def test_several_bugs_are_all_reported() -> None:
    class TwoBugs(FakeEngine):
        async def generate(self, request):
            if request.prompt.prompt_id in (0, 1):
                raise (ValueError if request.prompt.prompt_id else KeyError)("bug")
            return await super().generate(request)

    ctl = make_controller(IN_ORDER, engines=[TwoBugs(1.0)], steps=5)
    with pytest.raises(BackendBug) as err:
        run_virtual(ctl.run())
    notes = "\n".join(getattr(err.value, "__notes__", ()))
    assert "1 more error(s) stopped this run too" in notes and "BackendBug" in notes


def test_the_same_bug_in_every_group_is_one_error_naming_the_groups(caplog) -> None:
    # Issue 28, item 5: eight groups hitting one bug printed eight ERROR lines and
    # "7 more error(s)". Now: one stop line, one error, the other groups as a note.
    engine = FakeEngine(1.0, fail=lambda r: True, error=lambda text: IndexError("out of range"))
    ctl = make_controller(IN_ORDER, engines=[engine], steps=5, inflight=8)
    with caplog.at_level(logging.DEBUG, "asyncrl.controller"), pytest.raises(BackendBug) as err:
        run_virtual(ctl.run())
    notes = getattr(err.value, "__notes__", [])
    assert len(notes) == 1 and notes[0].startswith("the same error hit 7 more group(s) too: ")
    assert "more error(s)" not in "".join(notes)
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1 and loud[0].startswith("stopping the run at its next safe point"), loud
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_failed_attempts_of_one_kind_are_logged_once_then_counted(caplog) -> None:
    class Flaky(FakeEngine):  # every group's first attempt fails alike, the retry works
        def __init__(self) -> None:
            super().__init__()
            self.failed: list = []  # the groups whose first attempt raised

        async def generate(self, request):
            if request.attempt == 1:
                await advance(1.0)
                self.failed.append(request.group_id)
                raise GenerationError(f"device lost while generating group {request.group_id}")
            return await super().generate(request)

    engine = Flaky()
    ctl = make_controller(IN_ORDER, engines=[engine], steps=2, inflight=8,
                          rollout_failure={"backoff_base_s": 0.5})
    with caplog.at_level(logging.WARNING, "asyncrl.controller"):
        run_virtual(ctl.run())
    lines = [r.getMessage() for r in caplog.records]
    [first] = [line for line in lines if "failed as infra" in line]
    assert "failed as infra in engine 0 (tests.controller" in first
    counted = [line for line in lines if line.startswith("the same failure hit")]
    assert len(engine.failed) > 8, lines
    assert sum(int(line.split()[4]) for line in counted) == len(engine.failed) - 1, lines
    assert "device lost while generating group ..." in counted[0]


# -------------------------------------- errors raised while a group is aborted
class RaisesWhenAborted(FakeEngine):
    """A cancelled attempt raises instead of ending quietly (a cleanup error)."""

    def __init__(self, error: type[BaseException], *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.abort_error = error

    async def generate(self, request):
        try:
            return await super().generate(request)
        except asyncio.CancelledError:
            raise self.abort_error(f"cleanup of group {request.group_id} failed") from None


@pytest.mark.parametrize("max_infra", [1, 3])
def test_a_typed_error_while_aborting_is_never_a_retry(max_infra, caplog) -> None:
    # weight_fifo, window 0: every weight sync aborts the groups still generating
    # with the old weights; each of them raises while it is cancelled.
    engine = RaisesWhenAborted(GenerationError, latency=lambda r: 5.0 if r.prompt.prompt_id % 4 == 3
                               else 1.0)
    ctl = make_controller({"name": "windowed", "max_staleness_versions": 0}, engines=[engine],
                          steps=6, capacity=8, min_chunk=1,
                          rollout_failure={"max_infra_attempts_per_prompt": max_infra})
    with caplog.at_level(logging.WARNING, "asyncrl.controller"):
        result = run_virtual(ctl.run())
    ledger = result.summary["ledger"]
    assert ledger["balanced"] and ledger["aborted"] > 0 and ledger["failed"] == 0
    assert all(r.attempts == 1 for r in ctl.ledger.records() if r.state == "aborted")
    assert "while being aborted" in caplog.text


def test_a_bug_while_aborting_stops_the_run_and_every_one_is_reported() -> None:
    engine = RaisesWhenAborted(ValueError, latency=lambda r: 5.0 if r.prompt.prompt_id % 4 == 3
                               else 1.0)
    ctl = make_controller({"name": "windowed", "max_staleness_versions": 0}, engines=[engine],
                          steps=6, capacity=8, min_chunk=1)
    with pytest.raises(BackendBug, match=r"while group .* was being aborted"):
        run_virtual(ctl.run())
    assert ctl.summary()["ledger"]["balanced"]


# --------------------------------------------------------------- supervision
def test_a_failing_background_task_of_a_backend_reaches_the_run() -> None:
    from asyncrl._util import supervision

    class SpawningEngine(FakeEngine):
        async def generate(self, request):
            if request.prompt.prompt_id == 3:
                supervision.spawn(self._broken(), name="engine-housekeeping")
            return await super().generate(request)

        async def _broken(self):
            await advance(0.5)
            raise OSError("lost the shared-memory segment")

    ctl = make_controller(IN_ORDER, engines=[SpawningEngine(1.0)], steps=20)
    with pytest.raises(BackendBug, match=r"background task 'engine-housekeeping'.*OSError"):
        run_virtual(ctl.run())
    assert ctl.stopped_at_safe_point and ctl.steps_done < 20


def test_trainer_unaffected_by_classification() -> None:
    # A trainer error is not an attempt failure: it fails the run at once, as the
    # trainer's (TrainerError, the trainer's own error its cause), never retried.
    ctl = make_controller(IN_ORDER, trainer=FakeTrainer(fail_at_step=1), steps=4)
    with pytest.raises(TrainerError, match="injected trainer failure") as caught:
        run_virtual(ctl.run())
    assert isinstance(caught.value.__cause__, ValueError)
    assert not ctl.stopped_at_safe_point
