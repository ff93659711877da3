"""Tasks' and trainers' optional members are explicit protocols (issue 30, item 3):
read from the class (nothing evaluated), used only where present, listed by
``asyncrl validate``; a required member missing is refused, and a public name
like an optional member misspelled is reported rather than silently ignored."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from tests.fakes import FakeEngine, FakeTask, FakeTrainer

import asyncrl
from asyncrl.config import load_config
from asyncrl.config.dataset import DatasetTaskConfig
from asyncrl.errors import UsageError
from asyncrl.run.preflight import preflight
from asyncrl.tasks import ArithmeticTask, DatasetTask, ReverseTask, SeededPromptSource, SortTask
from asyncrl.types import Prompt

QUICK = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


class OnlyRequired:
    """The four members of the Task protocol, and nothing else."""

    name = "copy"
    target_reward = 0.9

    def prompt_source(self, seed: int) -> SeededPromptSource:
        return SeededPromptSource(lambda rng, i: (f"{rng.randint(0, 9)}=", "1"), seed=seed,
                                  task=self.name)

    def reward(self, prompt: Prompt, completion: str) -> float:
        return float(completion == prompt.answer)


class Misspelled(OnlyRequired):
    def prepare_rewards(self, prompt: Prompt) -> Prompt:  # meant: prepare_reward
        return prompt


def dataset_task(tmp_path: Path) -> DatasetTask:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"q": f"{i}+1=", "a": str(i + 1)}) + "\n"
                            for i in range(4)))
    return DatasetTask(DatasetTaskConfig(path=str(path), prompt_key="q", answer_key="a"))


def fake_checks(task: Any, trainer: Any = None) -> dict[str, Any]:
    """preflight's facts for ``task`` with the caller's (fake) backends."""
    cfg = load_config(QUICK)
    return preflight(cfg, task=task, backends=([FakeEngine()], trainer or FakeTrainer())).facts


# ------------------------------------------------------------ what is read
def test_the_built_in_tasks_capabilities() -> None:
    from asyncrl.tasks.capabilities import TaskCapabilities

    for task in (ArithmeticTask(), ReverseTask(), SortTask()):
        assert TaskCapabilities.of(task).names() == ["tokenizer", "longest_prompt_text", "cfg"]
    assert TaskCapabilities.of(OnlyRequired()).names() == []


def test_a_dataset_task_has_records_and_reading_its_capabilities_builds_nothing(tmp_path) -> None:
    from asyncrl.tasks.capabilities import TaskCapabilities

    task = dataset_task(tmp_path)
    caps = TaskCapabilities.of(task)
    assert caps.lacking() == ["longest_prompt_text"]  # its records are scanned instead
    # The tokenizer (a scan of every record) and the reward are cached properties:
    # reading the capabilities evaluated neither.
    assert "tokenizer" not in vars(task) and "pooled_reward" not in vars(task)


def test_the_built_in_trainers_capabilities() -> None:
    from asyncrl.trainers.capabilities import TrainerCapabilities
    from asyncrl.trainers.distributed.trainer import DistributedTrainer
    from asyncrl.trainers.grpo import GRPOTrainer

    assert TrainerCapabilities.of(GRPOTrainer).names() == ["final_state_dict"]
    assert TrainerCapabilities.of(DistributedTrainer).names() == ["sharded_state_dict"]
    assert TrainerCapabilities.of(FakeTrainer()).names() == []


def test_no_built_in_class_has_a_name_like_a_missing_optional_member(tmp_path) -> None:
    from asyncrl.engines.capabilities import EngineCapabilities
    from asyncrl.engines.local.engine import LocalEngine
    from asyncrl.tasks.capabilities import TaskCapabilities
    from asyncrl.trainers.capabilities import TrainerCapabilities
    from asyncrl.trainers.distributed.trainer import DistributedTrainer
    from asyncrl.trainers.grpo import GRPOTrainer

    tasks = [ArithmeticTask(), ReverseTask(), SortTask(), dataset_task(tmp_path), FakeTask()]
    assert [m for t in tasks for m in TaskCapabilities.misspelled(t)] == []
    assert [m for t in (GRPOTrainer, DistributedTrainer, FakeTrainer)
            for m in TrainerCapabilities.misspelled(t)] == []
    assert [m for e in (LocalEngine, FakeEngine) for m in EngineCapabilities.misspelled(e)] == []


# ---------------------------------------------------------- what is reported
def test_a_misspelled_optional_member_is_reported_and_not_used() -> None:
    facts = fake_checks(Misspelled())
    assert facts["task_capabilities"] == []
    [warning] = facts["warnings"]
    assert "Misspelled.prepare_rewards is no member of asyncrl.tasks.Task" in warning
    assert "did you mean the optional member 'prepare_reward'?" in warning


def test_a_misspelled_optional_trainer_member_is_reported() -> None:
    class Trainer(FakeTrainer):
        def final_state_dcit(self) -> dict[str, Any]:  # meant: final_state_dict
            return self.state_dict()

    facts = fake_checks(FakeTask(), Trainer())
    assert facts["trainer_capabilities"] == [] and facts["engine_capabilities"] is None
    assert any("Trainer.final_state_dcit is no member of asyncrl.trainers.Trainer" in w
               and "'final_state_dict'" in w for w in facts["warnings"]), facts["warnings"]


def test_build_controller_logs_the_misspelling(caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    async def main() -> None:
        async with asyncrl.build_controller(QUICK, task=Misspelled(), engines=[FakeEngine()],
                                            trainer=FakeTrainer()):
            pass

    with caplog.at_level(logging.WARNING, "asyncrl"):
        asyncio.run(main())
    assert "Misspelled.prepare_rewards" in caplog.text


def test_a_task_without_a_required_member_is_refused_naming_it() -> None:
    class NoReward:
        name, target_reward = "x", 1.0

        def prompt_source(self, seed: int) -> Any:
            return None

        def rewards(self, prompt: Prompt, completion: str) -> float:
            return 0.0

    with pytest.raises(UsageError, match=r"the task NoReward does not satisfy asyncrl\.tasks\.Task:"
                                         r" it lacks reward \(it has 'rewards'\)"):
        fake_checks(NoReward())


def test_a_trainer_without_a_required_member_is_refused_naming_it() -> None:
    class NoClose:
        async def train_chunk(self, rollouts: Any, *, step: int) -> dict:
            return {}

        async def finish_step(self, *, step: int) -> dict:
            return {}

        async def get_weights(self) -> Any:
            return None

        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, state: dict) -> None:
            pass

    with pytest.raises(UsageError, match=r"the trainer NoClose .* it lacks close;"):
        fake_checks(FakeTask(), NoClose())


def test_an_engine_with_a_plain_def_generate_is_told_so() -> None:
    class SyncGenerate(FakeEngine):
        def generate(self, request: Any) -> Any:  # type: ignore[override]
            return None

    cfg = load_config(QUICK)
    with pytest.raises(UsageError, match=r"the engine SyncGenerate does not satisfy .*: generate "
                                         r"is not 'async def'; define each required member as "
                                         r"an 'async def' method"):
        preflight(cfg, task=FakeTask(), backends=([SyncGenerate()], FakeTrainer()))


# ------------------------------------------------------------------ training
@pytest.mark.e2e
def test_a_task_with_only_the_required_members_trains(tmp_path: Path) -> None:
    summary = asyncrl.train(QUICK, run_dir=tmp_path / "run", task=OnlyRequired(),
                            grpo__max_num_steps=2, logging__progress="never",
                            logging__tensorboard=False, logging__plots=False)
    assert summary["steps"] == 2 and summary["stop_reason"] == "max_num_steps"
    assert summary["ledger"]["trained"] == 2 * 8 and summary["target_reward"] == 0.9
    # summary.json holds only the keys the typed summary declares.
    from asyncrl.controller import RunDirSummary

    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(written) == set(summary)
    assert set(summary) <= RunDirSummary.__required_keys__ | RunDirSummary.__optional_keys__
