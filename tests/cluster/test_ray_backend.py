"""The Ray backend end to end: real actors on a local Ray instance, real worker deaths.

Every test runs ``asyncrl.run.train.train`` on a tiny config; the actors' start-up
(a Python process importing torch and transformers each) is most of the time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import CustomEngineConfig, load_config
from asyncrl.errors import RolloutWorkersLost, TrainerLost
from asyncrl.run.backends import build_backends
from asyncrl.run.train import train
from asyncrl.tasks import build_task
from tests.cluster.conftest import Probe, tiny_config

pytestmark = [pytest.mark.e2e, pytest.mark.ray]
ray = pytest.importorskip("ray", reason="the Ray backend needs the optional 'ray' package")


def _start(cfg: Any, **probe: Any) -> tuple[Any, list[Any], Any, Probe]:
    task = build_task(cfg.task)
    engines, trainer = build_backends(cfg, task)
    return task, engines, trainer, Probe(engines, trainer, **probe)


def _assert_complete(summary: dict[str, Any], steps: int) -> None:
    ledger = summary["ledger"]
    assert summary["stop_reason"] == "max_num_steps", summary["stop_message"]
    assert summary["steps"] == steps
    assert ledger["balanced"], ledger
    assert ledger["failed"] == 0 and ledger["aborted"] == 0
    assert ledger["trained"] == 4 * steps
    # in_order with max_lookahead_versions=1 trains nothing staler than one version.
    assert summary["staleness_max"] <= 1


def _assert_lost_groups_retried(probe: Probe, victim: Any) -> None:
    assert victim.lost_groups, "the killed worker had a group in flight"
    done = {gid: (idx, attempt) for idx, gid, attempt, *_ in probe.results}
    for gid in victim.lost_groups:
        assert gid in done, f"group {gid} lost with the worker was never generated again"
        assert done[gid][1] >= 2, "a retry is a new attempt of the same group"


def _assert_versions_in_order(engine: Any) -> None:
    for incarnation in engine.versions:
        assert incarnation == sorted(set(incarnation)), engine.versions
    flat = [v for incarnation in engine.versions for v in incarnation]
    assert flat == sorted(flat), f"a worker went back to older weights: {engine.versions}"


def test_two_workers_run_balanced_with_ordered_weight_versions(ray_local, tmp_path: Path):
    steps = 6
    cfg = tiny_config(steps=steps)
    task, engines, trainer, probe = _start(cfg)
    summary = train(cfg, tmp_path, task=task, backends=(engines, trainer))

    _assert_complete(summary, steps)
    # Same run directory as the local backend.
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "timeline.json"):
        assert (tmp_path / name).is_file(), name
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(steps))
    assert all(r["staleness_max"] <= 1 for r in records)

    # Both workers took groups: the controller balanced the load over them.
    assert {idx for idx, *_ in probe.results} == {0, 1}
    # A worker never generates with weights newer than the trainer's, and a group
    # that spans a weight update ends on newer weights than it started on.
    for _, gid, _, start, end, trainer_version in probe.results:
        assert start <= end <= trainer_version, (gid, start, end, trainer_version)
    # Weights travel as one object-store ref per version, never through the driver.
    assert len(probe.weight_refs) == steps
    assert all(isinstance(ref, ray.ObjectRef) for ref in probe.weight_refs)
    # Each worker loaded every version, in order, as it recorded them itself.
    for engine in engines:
        assert probe.worker_log[engine.index] == list(range(steps + 1))
        assert engine.versions == [list(range(steps + 1))]
        assert engine.restarts == 0


def test_worker_removed_by_ray_kill_its_groups_retry_on_the_other(ray_local, tmp_path: Path):
    steps = 6
    cfg = tiny_config(steps=steps, max_worker_restarts=0)
    task, engines, trainer, probe = _start(cfg, kill=(0, "ray.kill"))
    summary = train(cfg, tmp_path, task=task, backends=(engines, trainer))

    _assert_complete(summary, steps)
    victim, survivor = engines
    assert probe.killed_pid is not None
    # No restart left: the run finished on the other worker alone.
    assert victim.state == "lost" and not victim.healthy and victim.restarts == 0
    _assert_lost_groups_retried(probe, victim)
    retried_on = {idx for idx, gid, *_ in probe.results if gid in victim.lost_groups}
    assert retried_on == {survivor.index}
    assert survivor.versions == [list(range(steps + 1))]


def test_sigkilled_worker_is_restarted_with_the_current_weights(ray_local, tmp_path: Path):
    steps = 5
    # One worker: its lost groups can only finish on its restarted incarnation.
    cfg = tiny_config(steps=steps, num_rollout_workers=1, max_worker_restarts=1)
    task, engines, trainer, probe = _start(cfg, kill=(0, "sigkill"), kill_at_version=2)
    summary = train(cfg, tmp_path, task=task, backends=(engines, trainer))

    _assert_complete(summary, steps)
    (engine,) = engines
    assert engine.restarts == 1 and engine.healthy
    assert engine.pid != probe.killed_pid
    _assert_lost_groups_retried(probe, engine)
    # The new incarnation started from the version the run had reached, not from 0.
    first, second = engine.versions
    assert first[-1] >= 2 and second[0] >= first[-1]
    assert second[-1] == steps
    _assert_versions_in_order(engine)
    assert probe.worker_log[0] == second


def test_losing_the_last_worker_fails_the_run_clearly(ray_local, tmp_path: Path):
    cfg = tiny_config(steps=5, num_rollout_workers=1, max_worker_restarts=0)
    task, engines, trainer, _ = _start(cfg, kill=(0, "ray.kill"))
    with pytest.raises(RolloutWorkersLost, match=r"(?s)restart left.*Resume from the last checkpoint"):
        train(cfg, tmp_path, task=task, backends=(engines, trainer))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "error"


def test_trainer_death_fails_the_run_with_a_resume_hint(ray_local, tmp_path: Path):
    import os
    import signal

    cfg = tiny_config(steps=5, num_rollout_workers=1)
    task, engines, trainer, _ = _start(cfg)
    train_chunk = trainer.train_chunk

    async def dying_train_chunk(rollouts: Any, *, step: int) -> Any:
        if step == 1:
            os.kill(trainer.pid, signal.SIGKILL)
        return await train_chunk(rollouts, step=step)

    trainer.train_chunk = dying_train_chunk
    with pytest.raises(TrainerLost, match=r"trainer actor .* died.*[Rr]esume from the last checkpoint"):
        train(cfg, tmp_path, task=task, backends=(engines, trainer))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["stop_reason"] == "error"


def test_partial_tokens_cross_the_actor_boundary(ray_local):
    """A worker reads a generating group's tokens (snapshot) and hands them back
    when it is aborted (GroupAborted.partial through Ray); a request continuing
    them (prefix) comes back with the very same tokens first."""
    import asyncio

    from asyncrl.types import GenerationRequest, GroupAborted

    cfg = tiny_config(num_rollout_workers=1)
    task = build_task(cfg.task)
    (engine,), trainer = build_backends(cfg, task)
    prompt = task.prompt_source(0).next_prompt()

    async def scenario() -> None:
        try:
            running = asyncio.ensure_future(engine.generate(
                GenerationRequest("long", prompt, 3, max_new_tokens=24, temperature=1.0)))
            await engine.generate(GenerationRequest("short", prompt, 1, max_new_tokens=1))
            snap = (await engine.snapshot(["long"]))["long"]
            await engine.abort(["long"])
            with pytest.raises(GroupAborted) as stopped:
                await running
            partial = stopped.value.partial
            assert partial.num_tokens >= snap.num_tokens
            done = await engine.generate(GenerationRequest("long", prompt, 3, max_new_tokens=24,
                                                           prefix=partial))
            for kept, whole in zip(partial.completions, done.completions):
                assert whole.token_ids[: len(kept)] == kept.token_ids and whole.finished
        finally:
            await engine.close()
            await trainer.close()

    asyncio.run(scenario())


def test_a_sharded_trainer_runs_as_rank_actors(ray_local, tmp_path: Path):
    """trainer.strategy=fsdp on Ray: two rank actors in one placement group, the
    weights from rank 0 to the worker through the object store, every step
    trained by both ranks. (That fsdp learns what single learns:
    tests/distributed/test_runs.py, deterministically; on Ray, over seeds:
    benchmarks/bench_convergence.py, ``ray_fsdp``.)"""
    from asyncrl.config import load_config

    steps = 3
    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml", [
        f"grpo.max_num_steps={steps}", "trainer.strategy=fsdp", "trainer.world_size=2",
        "cluster.backend=ray", "cluster.num_rollout_workers=1",
        "cluster.rollout_worker.num_cpus=0.5", "cluster.trainer.num_cpus=0.5",
        "checkpoint.every_steps=0", "logging.progress=never", "logging.tensorboard=false",
        "logging.plots=false"])
    summary = train(cfg, tmp_path)
    assert summary["steps"] == steps and summary["ledger"]["balanced"], summary["ledger"]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(steps))
    assert all(r["train/world_size"] == 2 for r in records)
    assert (tmp_path / "final" / "config.json").is_file()


def test_a_rollout_function_drives_the_ray_workers(ray_local, tmp_path: Path, monkeypatch):
    """``task.rollout`` with ``cluster.backend: ray`` (docs/rollouts.md): the
    function runs in the driver, each of its turns a generate on a worker (stop
    strings and environment prefixes cross the actor boundary), and its records
    keep the per-token contract."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the config's data path is relative to the repository
    monkeypatch.syspath_prepend(str(root / "examples"))
    from tests.e2e import tool_use_probe
    from tests.e2e.test_tool_use import check_records

    tool_use_probe.RECORDS.clear()
    steps = 2
    cfg = load_config("examples/tool_use.yaml", [
        "task.rollout=tests.e2e.tool_use_probe:calculator", f"grpo.max_num_steps={steps}",
        "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
        "async_rl.max_buffered_rollouts=8", "async_rl.min_groups_for_streaming_train=2",
        "async_rl.max_inflight_prompts=8", "cluster.backend=ray",
        "cluster.num_rollout_workers=1", "cluster.rollout_worker.num_cpus=0.5",
        "cluster.trainer.num_cpus=0.5", "checkpoint.every_steps=0", "logging.progress=never",
        "logging.plots=false"])
    summary = train(cfg, tmp_path / "run")
    _assert_complete(summary, steps)
    assert check_records(tool_use_probe.RECORDS) > 0  # the environment answered calls


def test_the_custom_engine_of_the_docs_trains_on_ray(ray_local, tmp_path: Path, monkeypatch):
    """The engine of docs/engines.md, built in each worker by the same factory as
    in-process; it lacks snapshot and abort, which the workers declare."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples"))
    steps = 2
    base = tiny_config(steps=steps, num_rollout_workers=1)
    cfg = base.model_copy(update={"policy": base.policy.model_copy(update={
        "engine": "custom",
        "custom_engine": CustomEngineConfig(target="custom_engine:PlainTorchEngine")})})
    task, engines, trainer, probe = _start(cfg)
    assert all(not e.capabilities.snapshot and not e.capabilities.abort for e in engines)
    summary = train(cfg, tmp_path, task=task, backends=(engines, trainer))
    _assert_complete(summary, steps)
    for engine in engines:
        assert probe.worker_log[engine.index] == list(range(steps + 1))


def test_the_rollout_workers_scale_up_and_down_through_the_fleet_channel(ray_local,
                                                                        tmp_path: Path):
    """Issue 35 on local Ray: one worker of rollout_workers {min 1, max 2}; the
    first group after step 1 waits while `fleet scale 2` starts the second (it
    joins at the newest weights); the first group the second worker takes after
    step 3 is still in flight when `fleet scale 1` drains it: that group
    finishes, nothing is lost, the slot is vacant again."""
    import asyncio

    from asyncrl.run.fleet_channel import request as fleet_request

    steps = 6
    cfg = tiny_config(steps=steps, num_rollout_workers=1,
                      rollout_workers={"min": 1, "max": 2})
    task, engines, trainer, _probe = _start(cfg)
    assert [e.state for e in engines] == ["alive", "vacant"]
    first, second = engines
    seen: dict[str, Any] = {}
    gen_first, gen_second = first.generate, second.generate

    async def on_first(request):
        if first.weight_version >= 1 and "scaling" not in seen:
            seen["scaling"] = True  # before the await: groups are sent concurrently
            seen["newest_before"] = first.pool.version
            seen["up"] = await asyncio.to_thread(fleet_request, tmp_path,
                                                 {"op": "scale", "size": 2})
        return await gen_first(request)

    async def on_second(request):
        call = asyncio.ensure_future(gen_second(request))
        if second.weight_version >= 3 and "draining" not in seen:
            seen["draining"] = True
            await asyncio.sleep(0)  # the group is sent: in flight on the worker
            seen["in_flight"] = (request.group_id, second.inflight)
            seen["down"] = asyncio.ensure_future(asyncio.to_thread(
                fleet_request, tmp_path, {"op": "scale", "size": 1}))
        result = await call
        seen.setdefault("second_groups", []).append(request.group_id)
        return result

    first.generate, second.generate = on_first, on_second
    summary = train(cfg, tmp_path, task=task, backends=(engines, trainer))

    _assert_complete(summary, steps)
    # Its incarnation caught up before it turned healthy: from the weights it
    # started with to (at least) the newest the run had when the command came.
    joined = second.versions[1]
    assert joined[-1] >= seen["newest_before"] >= 1 and joined == sorted(joined)
    assert any(line.split()[:2] == ["worker", "1"] and line.endswith("healthy")
               for line in seen["up"])
    gid, inflight = seen["in_flight"]
    assert inflight >= 1 and gid in seen["second_groups"]  # drained: it finished
    assert not any(line.startswith("worker 1") for line in seen["down"].result())
    assert second.state == "vacant" and first.state == "alive"
    _assert_versions_in_order(second)


def test_a_worker_the_cluster_cannot_hold_is_refused_at_once(ray_local):
    """Ray's own numbers: the instance's 4 CPUs are held by the trainer (1) and the
    one worker (3) of rollout_workers {min 1, max 2}; `scale 2` is refused before
    any actor is asked for, naming the request, the total and the fix."""
    import asyncio

    from asyncrl.errors import FleetError

    cfg = tiny_config(num_rollout_workers=1, rollout_workers={"min": 1, "max": 2},
                      rollout_worker={"num_cpus": 3}, trainer={"num_cpus": 1})
    _, engines, trainer, _ = _start(cfg)

    async def scale_then_close() -> str:
        try:
            await engines[0].fleet.scale(2)
        except FleetError as exc:
            return str(exc)
        finally:
            await asyncio.gather(*(e.close() for e in engines), trainer.close())
        raise AssertionError("scale 2 was not refused")

    assert asyncio.run(scale_then_close()) == (
        "Ray cannot place 1 more rollout worker: each asks for CPU 3 (cluster.rollout_worker); "
        "of the cluster's CPU 4 this run's trainer and 1 worker hold CPU 4. Lower "
        "cluster.rollout_worker.num_cpus/num_gpus, add nodes to the Ray cluster, or scale to "
        "1 at most")
    assert [e.state for e in engines] == ["alive", "vacant"] and engines[1].incarnations == 0
