"""The public face (issue 30, item 0): ``asyncrl.train`` and ``asyncrl.build_controller``
take a config in any of its forms with keyword overrides, ``build_controller``
closes what it built and only that, the protocols users implement are exported,
and ``import asyncrl`` stays light."""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import asyncrl
from asyncrl.buffer import RolloutBuffer
from asyncrl.cli import main
from asyncrl.config import load_config, resolve_config
from asyncrl.config.strict_yaml import load_yaml
from asyncrl.errors import ConfigError, UsageError
from asyncrl.run import assemble
from asyncrl.sampling import create_sampler
from tests.fakes import FakeEngine, FakeTask, FakeTrainer, InlineScorer

REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "examples" / "quickstart.yaml"


def quick_dict() -> dict[str, Any]:
    return load_yaml(QUICK.read_text(), str(QUICK))


# ------------------------------------------------------------------ the root
# The simulator's path too (asyncrl simulate, the planner's process), and every
# command's parser (asyncrl --help, and a Ctrl-C while it loads): torch would add
# ~1.5-2 s to each start.
@pytest.mark.e2e
@pytest.mark.parametrize("statement", [
    "import asyncrl", "import asyncrl.sim.runner", "import asyncrl.cli.simulate",
    "from asyncrl.cli import build_parser; build_parser()"])
def test_import_asyncrl_imports_no_torch_and_no_backend(statement: str) -> None:
    code = (f"import sys; {statement}; print(sorted(m for m in ('torch', 'transformers', "
            "'ray', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_root_exports_the_entry_points_and_the_protocols_users_implement() -> None:
    from asyncrl.engines.base import RolloutEngine
    from asyncrl.metrics import MetricsSink
    from asyncrl.tasks.base import PromptSource, Task
    from asyncrl.trainers.base import Trainer

    assert asyncrl.train is assemble.train
    assert asyncrl.build_controller is assemble.build_controller
    assert (asyncrl.Task, asyncrl.PromptSource, asyncrl.RolloutEngine, asyncrl.Trainer,
            asyncrl.MetricsSink) == (Task, PromptSource, RolloutEngine, Trainer, MetricsSink)
    assert all(hasattr(asyncrl, name) for name in asyncrl.__all__)
    assert {"train", "build_controller"} <= set(dir(asyncrl))


# ------------------------------------------------------------ config forms
TINY = {"grpo__max_num_steps": 2, "logging__progress": "never", "logging__tensorboard": False,
        "logging__plots": False, "checkpoint__every_steps": 0}


def test_a_path_a_dict_and_a_run_config_give_the_command_lines_config() -> None:
    cli = load_config(QUICK, ["grpo.max_num_steps=2", "logging.progress=never",
                              "logging.tensorboard=false", "logging.plots=false",
                              "checkpoint.every_steps=0"])
    tree = quick_dict()
    for form in (QUICK, str(QUICK), tree, load_config(QUICK)):
        assert resolve_config(form, TINY) == cli
    assert tree == quick_dict()  # the caller's dict is not changed


def test_a_run_config_without_overrides_is_used_as_it_is() -> None:
    cfg = load_config(QUICK)
    assert resolve_config(cfg) is cfg


def test_a_swap_replaces_the_block_as_on_the_command_line() -> None:
    swapped = resolve_config(QUICK, {"async_rl__sampler__name": "windowed",
                                     "async_rl__sampler__max_staleness_versions": 2})
    assert swapped == load_config(QUICK, ["async_rl.sampler.max_staleness_versions=2",
                                          "async_rl.sampler.name=windowed"])


@pytest.mark.parametrize(("overrides", "says"), [
    ({"grpo__max_num_stepz": 2},
     "invalid keyword override: grpo.max_num_stepz: unknown key. did you mean 'max_num_steps'?"),
    ({"grpo__max_num_steps": 0},
     'grpo.max_num_steps: Input should be greater than or equal to 1 (got 0) '
     '(from the keyword override "grpo__max_num_steps=0")'),
    ({"__grpo": 1}, "keyword override '__grpo' is not a config key with '__' for each dot"),
    # One '_' where the keyword needs '__' for the dot: the key it meant, spelled as a keyword.
    ({"grpo_max_num_steps": 3},
     'grpo_max_num_steps: unknown key. valid keys here: async_rl, checkpoint, checkpointing, '
     'cluster, deterministic, eval, grpo, logging, loss, policy, seed, simulate, task, trainer '
     '(from the keyword override "grpo_max_num_steps=3": did you mean grpo__max_num_steps=3, '
     "with '__' for each dot?)"),
    ({"async_rl__sampler_max_lookahead_versions": 2},  # one of two dots, inside a union block
     "did you mean async_rl__sampler__max_lookahead_versions=2, with '__' for each dot?"),
    ({"task_max_operand": 3}, "did you mean task__max_operand=3,"),
])
def test_a_bad_override_is_one_line_naming_the_field(overrides, says) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_config(QUICK, overrides)
    assert says in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("overrides", [{"grpo_max_num_stepz": 3}, {"grpo__max_num_steps": 0},
                                       {"loss_fn__foo": 1}])
def test_no_keyword_is_suggested_where_no_config_key_fits(overrides) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_config(QUICK, overrides)
    assert "with '__' for each dot" not in str(info.value), str(info.value)


def test_a_config_of_another_type_is_refused_naming_the_forms() -> None:
    with pytest.raises(ConfigError, match="config: got int; pass a RunConfig, a dict"):
        resolve_config(7)  # type: ignore[arg-type]


# -------------------------------------------------------------------- train
@pytest.mark.e2e
@pytest.mark.parametrize("form", ["path", "dict", "RunConfig"])
def test_train_runs_a_config_of_each_form_with_overrides(form: str, tmp_path: Path) -> None:
    config = {"path": QUICK, "dict": quick_dict(), "RunConfig": load_config(QUICK)}[form]
    summary = asyncrl.train(config, run_dir=tmp_path / "run", **TINY)
    assert summary["steps"] == 2 and summary["stop_reason"] == "max_num_steps"
    assert summary["ledger"]["balanced"] and summary["ledger"]["trained"] == 2 * 8
    assert load_config(tmp_path / "run" / "config.yaml") == resolve_config(QUICK, TINY)
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (written["steps"], written["ledger"]) == (summary["steps"], summary["ledger"])


class SignalAfterFirstStep:
    """A metrics sink that sends this process a real SIGINT once a step is done:
    a user's Ctrl-C while asyncrl.train runs."""

    def write(self, record: dict[str, Any]) -> None:
        if record["step"] == 0:
            signal.raise_signal(signal.SIGINT)

    def close(self, summary: dict[str, Any] | None = None) -> None:
        pass


@pytest.mark.e2e
def test_train_speaks_to_its_python_caller_about_an_old_run_and_how_to_resume(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys) -> None:
    """A new user's trial: after a Ctrl-C asyncrl.train returned without a word on
    how to go on, and a second call on the run's directory was told to pass
    --overwrite, which a script cannot."""
    run = tmp_path / "run"
    steps = {**TINY, "grpo__max_num_steps": 4}
    with caplog.at_level(logging.WARNING, logger="asyncrl.assemble"):
        summary = asyncrl.train(QUICK, run_dir=run, sinks=[SignalAfterFirstStep()], **steps)
    assert summary["stop_reason"] == "interrupted" and summary["steps"] < 4
    [said] = [r.getMessage() for r in caplog.records if r.name == "asyncrl.assemble"]
    assert said == ("the run stopped before grpo.max_num_steps (interrupted); continue it "
                    f"with: asyncrl train --resume {run}"), said
    # What it says works: the run goes on to its max_num_steps.
    assert main(shlex.split(said.split("continue it with: ")[1])[1:]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    capsys.readouterr()

    with pytest.raises(ConfigError) as err:
        asyncrl.train(QUICK, run_dir=run, **steps)
    text = str(err.value)
    assert text.startswith(f"run_dir={str(run)!r} already holds a run"), text
    assert (f"Continue it with: asyncrl.train(resume={str(run)!r}); start it "
            "over with overwrite=True") in text
    assert f"pick another run_dir, e.g. run_dir={str(run) + '-2'!r}" in text
    assert "--overwrite" not in text and "--run-dir" not in text
    assert asyncrl.train(QUICK, run_dir=run, overwrite=True, **steps)["steps"] == 4


class OtherTask(FakeTask):
    name = "other"


FAKES_CONFIG = {"grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2},
                "async_rl": {"sampler": {"name": "in_order", "max_lookahead_versions": 1},
                             "max_buffered_rollouts": 4, "min_groups_for_streaming_train": 2,
                             "max_inflight_prompts": 4},
                "logging": {"progress": "never", "tensorboard": False, "plots": False},
                "checkpoint": {"every_steps": 1}}


@pytest.mark.e2e
def test_a_run_with_components_from_python_resumes_only_with_them(tmp_path: Path,
                                                                    capsys) -> None:
    """A new user's trial: a run given its task in Python resumed from the command
    line on the config's built-in task, without a word (other prompts; with another
    vocabulary, a size mismatch deep in the model)."""
    run = tmp_path / "run"

    def fakes() -> dict[str, Any]:
        return {"engines": [FakeEngine(0.0)], "trainer": FakeTrainer(step_time=0.0)}

    summary = asyncrl.train(FAKES_CONFIG, run_dir=run, task=FakeTask(), **fakes(),
                            grpo__max_num_steps=2)
    assert summary["steps"] == 2
    assert json.loads((run / "components.json").read_text())["task"] == "tests.fakes.FakeTask"

    capsys.readouterr()
    assert main(["train", "--resume", str(run), "grpo.max_num_steps=4"]) == 2
    err = capsys.readouterr().err
    assert "was trained with components passed to asyncrl.train in Python (task " \
           "tests.fakes.FakeTask, engines ['tests.fakes.FakeEngine']" in err, err
    assert f"asyncrl.train(resume={str(run)!r}, task=..., engines=..., trainer=...)" in err
    with pytest.raises(ConfigError, match=r"passed to asyncrl\.train in Python \(task "):
        asyncrl.train(resume=run, grpo__max_num_steps=4)
    with pytest.raises(ConfigError, match=r"with task tests\.test_public_face\.OtherTask: it "
                                          r"trained with the task tests\.fakes\.FakeTask"):
        asyncrl.train(resume=run, task=OtherTask(), **fakes(), grpo__max_num_steps=4)
    assert json.loads((run / "summary.json").read_text())["steps"] == 2  # nothing ran

    resumed = asyncrl.train(resume=run, task=FakeTask(), **fakes(), grpo__max_num_steps=4)
    assert resumed["steps"] == 4 and resumed["ledger"]["balanced"]
    assert resumed["ledger"]["trained"] == 4 * 2
    with pytest.raises(UsageError, match="not both"):
        asyncrl.train(FAKES_CONFIG, resume=run)


def test_resuming_a_run_built_from_its_config_alone_says_nothing_of_components(
        tmp_path: Path, caplog) -> None:
    """Every command-line resume warned "components.json is unreadable ([Errno 2] No
    such file ...)": such a run has no components.json, by design."""
    from asyncrl.run.components import check_resume

    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        check_resume(tmp_path, {})
    assert not caplog.records, caplog.text
    (tmp_path / "components.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="asyncrl"):
        check_resume(tmp_path, {})
    assert "components.json is unreadable" in caplog.text  # a damaged one is still said


def test_a_run_failing_as_its_signal_handlers_go_in_is_not_told_its_export_failed(
        tmp_path: Path, monkeypatch) -> None:
    """Found in review: an error before the run's main try left it "not failed", and
    summary.json's final_note blamed an export that never ran."""
    from asyncrl.run import train as run_train

    def broken(self, loop) -> None:
        raise RuntimeError("install broke")

    monkeypatch.setattr(run_train.GracefulStop, "install", broken)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="install broke"):
        asyncrl.train(FAKES_CONFIG, run_dir=run, task=FakeTask(), engines=[FakeEngine(0.0)],
                      trainer=FakeTrainer(step_time=0.0), grpo__max_num_steps=2)
    note = json.loads((run / "summary.json").read_text())["final_note"]
    assert note.startswith("not exported (the run stopped with an error)"), note


def test_train_refuses_a_bad_override_before_it_writes_anything(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"grpo\.max_num_stepz: unknown key"):
        asyncrl.train(QUICK, run_dir=tmp_path / "run", grpo__max_num_stepz=2)
    assert not (tmp_path / "run").exists()


def test_train_from_async_code_points_at_build_controller() -> None:
    async def main() -> None:
        asyncrl.train(QUICK, **TINY)

    with pytest.raises(UsageError, match=r"async with asyncrl\.build_controller"):
        asyncio.run(main())


# --------------------------------------------------------- build_controller
class OwnedEngine(FakeEngine):
    def __init__(self, closed: list[object]) -> None:
        super().__init__(latency=0.0)
        self.closed = closed

    async def close(self) -> None:
        self.closed.append(self)


class OwnedTrainer(FakeTrainer):
    def __init__(self, closed: list[object]) -> None:
        super().__init__(step_time=0.0)
        self.closed = closed

    async def close(self) -> None:
        self.closed.append(self)


class OwnedScorer(InlineScorer):
    def __init__(self, task: Any, closed: list[object]) -> None:
        super().__init__(task)
        self.closed = closed

    async def close(self) -> None:
        self.closed.append(self)


class Built:
    """What build_controller built through its builders (fakes), and what was closed."""

    def __init__(self) -> None:
        self.made: list[object] = []
        self.closed: list[object] = []

    def backends(self, cfg: Any, task: Any, work_dir: Any = None, *,
                 policy_tokenizer: Any = None) -> tuple[list, Any]:
        engines = [OwnedEngine(self.closed), OwnedEngine(self.closed)]
        trainer = OwnedTrainer(self.closed)
        self.made += [*engines, trainer]
        return engines, trainer

    def scorer(self, task: Any, task_cfg: Any = None) -> OwnedScorer:
        scorer = OwnedScorer(task, self.closed)
        self.made.append(scorer)
        return scorer

    def each_closed_once(self) -> bool:
        return sorted(map(id, self.closed)) == sorted(map(id, self.made))


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Built:
    import asyncrl.tasks

    seen = Built()
    monkeypatch.setattr(assemble, "build_backends", seen.backends)
    monkeypatch.setattr(assemble, "build_scorer", seen.scorer)
    monkeypatch.setattr(asyncrl.tasks, "build_scorer", seen.scorer)  # the evaluator's pool
    return seen


def test_build_controller_closes_what_it_built_after_the_run(built: Built) -> None:
    async def main() -> asyncrl.RunResult:
        async with asyncrl.build_controller(QUICK, grpo__max_num_steps=2, eval__every_steps=1,
                                            eval__num_prompts=2) as controller:
            result = await controller.run()
            assert built.closed == []  # nothing is closed while the block runs
        return result

    assert asyncio.run(main()).steps == 2
    assert len(built.made) == 5  # two engines, the trainer, the reward and eval pools
    assert built.each_closed_once()


def test_build_controller_closes_what_it_built_when_the_block_raises(built: Built) -> None:
    async def main() -> None:
        async with asyncrl.build_controller(QUICK, grpo__max_num_steps=2):
            raise ValueError("the script's own bug")

    with pytest.raises(ValueError, match="the script's own bug"):
        asyncio.run(main())
    assert len(built.made) == 4 and built.each_closed_once()


def test_build_controller_closes_what_it_built_when_the_block_is_cancelled(built: Built) -> None:
    async def main() -> None:
        entered = asyncio.Event()

        async def script() -> None:
            async with asyncrl.build_controller(QUICK, grpo__max_num_steps=2):
                entered.set()
                await asyncio.Event().wait()  # until cancelled

        task = asyncio.create_task(script())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert len(built.made) == 4 and built.each_closed_once()


def test_build_controller_closes_what_it_built_when_the_controller_is_refused(
        built: Built) -> None:
    sampler = create_sampler(RolloutBuffer(16), {"name": "in_order"})

    async def main() -> None:
        async with asyncrl.build_controller(QUICK, sampler=sampler):  # no buffer= with it
            pass

    with pytest.raises(UsageError, match="needs the buffer the sampler was built over"):
        asyncio.run(main())
    assert len(built.made) == 4 and built.each_closed_once()


@pytest.mark.parametrize("body_raises", [False, True])
def test_build_controller_leaves_what_it_was_handed_open(built: Built, body_raises: bool) -> None:
    mine: list[object] = []
    engine, trainer = OwnedEngine(mine), OwnedTrainer(mine)

    async def main() -> None:
        async with asyncrl.build_controller(QUICK, engines=[engine], trainer=trainer,
                                            grpo__max_num_steps=2) as controller:
            await controller.run()
            if body_raises:
                raise ValueError("after the run")

    if body_raises:
        with pytest.raises(ValueError, match="after the run"):
            asyncio.run(main())
    else:
        asyncio.run(main())
    assert engine.generated > 0 and trainer.steps == [0, 1]  # they did run
    assert mine == []  # the caller's: not closed
    assert len(built.made) == 1 and built.each_closed_once()  # the reward pool it built


def test_build_controller_needs_engines_and_trainer_together() -> None:
    async def main() -> None:
        async with asyncrl.build_controller(QUICK, engines=[FakeEngine()]):
            pass

    with pytest.raises(UsageError, match="pass engines= and trainer= together"):
        asyncio.run(main())
