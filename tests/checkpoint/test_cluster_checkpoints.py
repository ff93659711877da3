"""Issue 39: checkpoints for jobs on shared clusters, without a real clock.

* ``save_by``: the prediction (one more step and a checkpoint) on a fake clock,
  and the hook asking the run to stop at the right step;
* the write off the training path: the hook returns while the write is in
  flight, and a write that fails is raised at the next save, naming it;
* ``keep_best``: the newest plus the best k stay, on a metric that goes up and down;
* ``save_optimizer: false``: snapshots without the optimizer, passed over by resume.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
import types
from pathlib import Path

import pytest
import torch

from asyncrl.checkpoint import CheckpointHook, load_latest
from asyncrl.checkpoint import store as store_module
from asyncrl.checkpoint.deadline import SaveBy
from asyncrl.checkpoint.retention import Entry, kept
from asyncrl.checkpoint.store import list_checkpoints, read_manifest
from asyncrl.config import KeepBest, config_from_dict, dump_config
from asyncrl.errors import CheckpointError, ConfigError
from asyncrl.run.export import best_step
from asyncrl.run.resume import prepare_resume
from asyncrl.tasks.tokenizer import CharTokenizer
from asyncrl.trainers.capabilities import TrainerCapabilities
from asyncrl.trainers.grpo import GRPOTrainer
from asyncrl.types import StopReason


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class _Layers(torch.nn.Sequential):
    def get_output_embeddings(self) -> torch.nn.Module:
        return self[-1]


def small_trainer() -> GRPOTrainer:
    torch.manual_seed(0)
    return GRPOTrainer(_Layers(torch.nn.Linear(4, 4, bias=False)), CharTokenizer())


class FakeController:
    """What the hook reads of a controller, with step records the test writes."""

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.trainer = trainer
        self.trainer_capabilities = TrainerCapabilities.of(trainer)
        self.engines = [object()]
        self.deterministic = False
        self.version = types.SimpleNamespace(value=0)
        self.step_records: list[dict] = []
        self.stops: list[tuple[str, str]] = []

    def state_dict(self) -> dict:
        return {"trainer_version": self.version.value}

    async def read_partials(self) -> None:
        return None

    def request_stop(self, reason: str, message: str) -> None:
        self.stops.append((reason, message))

    async def step(self, hook: CheckpointHook, **metrics: float) -> None:
        """One step: its record, then the hook (as the train pump calls it)."""
        v = self.version.value = self.version.value + 1
        self.step_records.append({"trainer_version": v, **metrics})
        await hook(self, v)


def cfg(**checkpoint):
    return config_from_dict({"checkpoint": checkpoint})


def make_hook(run_dir: Path, config, **kwargs) -> CheckpointHook:
    """The hook as a run builds it: its checkpoint block and the resolved config."""
    return CheckpointHook(run_dir, config.checkpoint, dump_config(config), **kwargs)


# ------------------------------------------------------------------ save_by
def test_save_by_is_a_quoted_duration() -> None:
    assert cfg(save_by="00:01:02:03").checkpoint.save_by_s == 3600 + 120 + 3
    with pytest.raises(ConfigError, match="quote it"):
        cfg(save_by=216000)  # what YAML makes of an unquoted 1:00:00:00
    with pytest.raises(ConfigError, match="DD:HH:MM:SS"):
        cfg(save_by="01:00:00")


def test_the_prediction_is_the_longest_recent_step_plus_the_last_checkpoint() -> None:
    clock = FakeClock()
    deadline = SaveBy(100, clock=clock, started_at=0.0)
    for t in (10, 20):  # two steps of 10 s
        clock.t = t
        deadline.step_done()
    # No checkpoint measured yet: it is taken to last as long as a step.
    assert deadline.predicted_s() == 20
    clock.t = 80
    assert not deadline.must_stop()  # 80 + 20 ends at the deadline, not after it
    clock.t = 80.5
    assert deadline.must_stop()
    deadline.checkpoint_took(30)
    clock.t = 60
    assert not deadline.must_stop()
    clock.t = 60.5
    assert deadline.must_stop()  # 60.5 + 10 + 30 > 100


def test_a_slow_step_counts_until_it_leaves_the_window() -> None:
    clock = FakeClock()
    deadline = SaveBy(1000, clock=clock, started_at=0.0)
    clock.t = 50
    deadline.step_done()  # the first step (with the engines' warm-up)
    for _ in range(3):
        clock.t += 1
        deadline.step_done()
    assert deadline.predicted_s() == 100
    clock.t += 1
    deadline.step_done()
    assert deadline.predicted_s() == 2


def test_the_deadline_counts_from_the_given_start() -> None:
    clock = FakeClock(500.0)
    assert SaveBy(60, clock=clock, started_at=450.0).at == 510.0


def test_a_deadline_start_up_used_up_is_named_in_the_stop_message() -> None:
    clock = FakeClock(40.0)
    in_time = SaveBy(60, clock=clock, started_at=0.0)
    in_time.note_start()  # 20 s still left
    assert in_time.startup_s is None and "s left" in in_time.message(1)
    clock.t = 75.0
    late = SaveBy(60, clock=clock, started_at=0.0)
    late.note_start()
    clock.t = 80.0
    late.step_done()
    assert late.must_stop()
    assert late.message(1) == (
        "checkpoint.save_by deadline: it allows 60s, but start-up took 75s: the deadline had "
        "passed before the first step; stopped after step 1 with a checkpoint (exit code 75). "
        "Raise checkpoint.save_by well above the start-up time")


def test_the_hook_stops_the_run_before_the_step_that_would_miss_the_deadline(
        tmp_path: Path) -> None:
    clock = FakeClock()
    hook = make_hook(tmp_path, cfg(save_by="00:00:01:00", every_steps=0), clock=clock,
                          started_at=0.0)
    controller = FakeController(small_trainer())

    async def run() -> None:
        while not controller.stops:
            clock.t += 10  # steps of 10 s: one more step and its checkpoint take 20 s
            await controller.step(hook)

    asyncio.run(run())
    # At 40 s, 20 s more end at 60 s (in time); at 50 s they would end at 70 s.
    assert controller.version.value == 5 and clock.t == 50
    reason, message = controller.stops[0]
    assert reason is StopReason.SAVE_BY and "exit code 75" in message
    assert list_checkpoints(tmp_path) == []  # the final checkpoint is the one it writes

    async def final() -> Path:
        return await hook.write_final(controller)

    assert asyncio.run(final()).name == "step-000005"


def test_a_slow_checkpoint_write_moves_the_stop_earlier(tmp_path: Path) -> None:
    clock = FakeClock()
    hook = make_hook(tmp_path, cfg(save_by="00:00:01:00", every_steps=2), clock=clock,
                          started_at=0.0)
    trainer = small_trainer()
    copy = trainer.state_dict

    def slow_copy() -> dict:  # the capture takes 15 s of the fake clock
        clock.t += 15
        return copy()

    trainer.state_dict = slow_copy  # type: ignore[method-assign]
    controller = FakeController(trainer)

    async def run() -> None:
        while not controller.stops:
            clock.t += 5
            await controller.step(hook)
            await hook.flush()

    asyncio.run(run())
    # Steps of 5 s; the checkpoint after step 2 (at 10 s) takes 15 s to capture, so
    # step 3 ends at 30 s after an interval of 20 s: 30 + 20 + 15 s > 60 s.
    assert hook.save_by.checkpoint_s == 15
    assert hook.save_by.predicted_s() == 35
    assert controller.version.value == 3 and clock.t == 30


# ------------------------------------------------- the write, off the path
def test_the_hook_returns_while_its_write_is_in_flight(tmp_path: Path, monkeypatch) -> None:
    release = threading.Event()
    save = store_module._torch_save

    def held_save(obj, fh) -> None:
        # The bound only ends a failure (a hook that waits for its own write).
        assert release.wait(timeout=60)
        save(obj, fh)

    monkeypatch.setattr(store_module, "_torch_save", held_save)
    hook = make_hook(tmp_path, cfg(every_steps=1))
    controller = FakeController(small_trainer())

    async def run() -> None:
        await asyncio.wait_for(controller.step(hook), timeout=30)
        assert hook.writing  # the train pump goes on; the write goes on beside it
        assert list_checkpoints(tmp_path) == []  # not renamed into place before it is whole
        release.set()
        await hook.flush()
        assert not hook.writing

    asyncio.run(run())
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000001"]


def test_a_write_that_fails_is_raised_at_the_next_save_naming_it(tmp_path: Path,
                                                                  monkeypatch) -> None:
    def read_only(obj, fh) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(store_module, "_torch_save", read_only)
    hook = make_hook(tmp_path, cfg(every_steps=2))
    controller = FakeController(small_trainer())

    async def run() -> None:
        for _ in range(4):  # step 2's write fails in the background; step 4 saves again
            await controller.step(hook)

    with pytest.raises(CheckpointError) as err:
        asyncio.run(run())
    text = str(err.value)
    assert "step-000002" in text and "Read-only file system" in text and "--resume" in text
    assert list_checkpoints(tmp_path) == []
    assert not any(tmp_path.joinpath("checkpoints").iterdir())  # no half checkpoint left


# ---------------------------------------------------------------- keep_best
def test_retention_keeps_the_newest_plus_the_best_k() -> None:
    values = [0.5, 0.9, 0.3, 0.1, 0.7, 0.2]
    found = [Entry(Path(f"s{i}"), i, v) for i, v in enumerate(values, 1)]
    best_max = kept(found, 1, KeepBest(k=2, metric="m", mode="max"))
    assert best_max == {Path("s6"), Path("s2"), Path("s5")}
    best_min = kept(found, 1, KeepBest(k=2, metric="m", mode="min"))
    assert best_min == {Path("s6"), Path("s4")}  # the newest is one of the best two
    missing = [*found[:-1], Entry(Path("s7"), 7, None)]  # a step without the metric
    assert kept(missing, 1, KeepBest(k=1, metric="m")) == {Path("s7"), Path("s2")}


def test_keep_best_on_a_metric_that_goes_up_and_down(tmp_path: Path) -> None:
    config = cfg(every_steps=1, keep_last=1,
                 keep_best={"k": 2, "metric": "eval/reward_mean", "mode": "max"})
    hook = make_hook(tmp_path, config)
    controller = FakeController(small_trainer())
    values = [0.5, 0.9, 0.3, 0.1, 0.7, 0.2]

    async def run() -> None:
        for value in values:
            await controller.step(hook, **{"eval/reward_mean": value})
        await controller.step(hook)  # a step without evaluation: no metric, newest
        await hook.flush()

    asyncio.run(run())
    names = sorted(p.name for p in list_checkpoints(tmp_path))
    assert names == ["step-000002", "step-000005", "step-000007"]
    assert read_manifest(tmp_path / "checkpoints" / "step-000002")["metric"] == {
        "name": "eval/reward_mean", "value": 0.9}
    (tmp_path / "config.yaml").write_text(dump_config(config))
    assert best_step(tmp_path) == 2
    assert hook.best()["step"] == 2


def test_a_metric_the_run_never_logs_is_refused_with_the_list() -> None:
    from asyncrl.run.preflight import check_keep_best

    with pytest.raises(ConfigError) as err:
        check_keep_best(cfg(keep_best={"k": 1, "metric": "eval/accuracy"}))
    text = str(err.value)
    assert "never logged" in text and "reward_mean" in text and "eval block" in text
    check_keep_best(cfg(keep_best={"k": 1, "metric": "reward_mean"}))
    check_keep_best(cfg(keep_best={"k": 1, "metric": "train/loss"}))
    check_keep_best(config_from_dict({"checkpoint": {"keep_best": {"k": 1,
                                                                    "metric": "eval/pass@1"}},
                                      "eval": {"num_generations": 2, "temperature": 1.0}}))


def test_a_train_metric_the_trainer_never_reports_is_told_once_with_the_likely_name(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """train/<name> is the trainer's to name (validate lets it pass): the first step
    record without it is told, not silently ranked last for the whole run."""
    config = cfg(every_steps=1, keep_best={"k": 1, "metric": "train/los", "mode": "min"})
    hook = make_hook(tmp_path, config)
    controller = FakeController(small_trainer())

    async def run() -> None:
        for loss in (0.5, 0.4):
            await controller.step(hook, **{"train/loss": loss, "train/grad_norm": 1.0})
        await hook.flush()

    with caplog.at_level(logging.WARNING, logger="asyncrl.checkpoint"):
        asyncio.run(run())
    told = [r.getMessage() for r in caplog.records if "keep_best.metric" in r.getMessage()]
    assert len(told) == 1
    assert "'train/los'" in told[0] and "did you mean 'train/loss'?" in told[0]
    caplog.clear()
    right = make_hook(tmp_path / "right", cfg(every_steps=1, keep_best={
        "k": 1, "metric": "train/loss", "mode": "min"}))

    async def run_right() -> None:
        await controller.step(right, **{"train/loss": 0.3})
        await right.flush()

    with caplog.at_level(logging.WARNING, logger="asyncrl.checkpoint"):
        asyncio.run(run_right())
    assert not [r for r in caplog.records if "keep_best.metric" in r.getMessage()]


# ---------------------------------------------------- weights-only snapshots
def test_snapshots_hold_no_optimizer_and_resume_passes_them_over(tmp_path: Path) -> None:
    config = cfg(every_steps=1, keep_last=2, save_optimizer=False)
    (tmp_path / "config.yaml").write_text(dump_config(config))
    hook = make_hook(tmp_path, config)
    controller = FakeController(small_trainer())

    async def run() -> None:
        await controller.step(hook)
        await hook.flush()
        await hook.write_final(controller)  # the run stops: a whole checkpoint
        for _ in range(3):
            await controller.step(hook)
        await hook.flush()

    asyncio.run(run())
    names = sorted(p.name for p in list_checkpoints(tmp_path))
    # The two newest snapshots, and the newest whole checkpoint (step 1) a resume needs.
    assert names == ["step-000001", "step-000003", "step-000004"]
    newest = load_latest(tmp_path)
    assert newest.step == 4 and "optimizer" not in newest.trainer_state
    assert read_manifest(tmp_path / "checkpoints" / "step-000004")["resumable"] is False
    _, ckpt = prepare_resume(tmp_path, [])
    assert ckpt.step == 1 and "optimizer" in ckpt.trainer_state


def test_only_snapshots_cannot_be_resumed_and_the_error_says_why(tmp_path: Path) -> None:
    config = cfg(every_steps=1, save_optimizer=False)
    (tmp_path / "config.yaml").write_text(dump_config(config))
    hook = make_hook(tmp_path, config)
    controller = FakeController(small_trainer())

    async def run() -> None:
        await controller.step(hook)
        await hook.flush()

    asyncio.run(run())
    with pytest.raises(CheckpointError, match="weights-only snapshots"):
        prepare_resume(tmp_path, [])


# ------------------------------------------------------------ every_minutes
def test_every_minutes_checkpoints_by_the_clock_beside_every_steps(tmp_path: Path) -> None:
    clock = FakeClock()
    hook = make_hook(tmp_path, cfg(every_minutes=1.0, every_steps=10, keep_last=10),
                          clock=clock)
    controller = FakeController(small_trainer())

    async def run() -> None:
        for t in (25, 50, 75, 100, 125, 150, 175, 200, 225, 250):  # steps of 25 s
            clock.t = t
            await controller.step(hook)
            await hook.flush()

    asyncio.run(run())
    # 60 s after the start (at step 3, 75 s), 60 s after that one began (step 6,
    # 150 s), step 9 (225 s); and step 10 by every_steps.
    assert [p.name for p in sorted(list_checkpoints(tmp_path))] == [
        "step-000003", "step-000006", "step-000009", "step-000010"]


def test_the_write_runs_on_a_thread_of_lower_priority(tmp_path: Path, monkeypatch) -> None:
    import os

    niceness: list[int] = []
    save = store_module._torch_save

    def noting_save(obj, fh) -> None:
        niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        save(obj, fh)

    monkeypatch.setattr(store_module, "_torch_save", noting_save)
    hook = make_hook(tmp_path, cfg(every_steps=1))
    controller = FakeController(small_trainer())

    async def run() -> None:
        await controller.step(hook)
        await hook.flush()

    asyncio.run(run())
    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert niceness == [min(here + 10, 19)]
