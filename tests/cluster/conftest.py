"""A local Ray instance shared by the Ray tests of one module, and run helpers."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import RunConfig, config_from_dict


@pytest.fixture(scope="module")
def ray_local() -> Iterator[Any]:
    """One Ray instance per test module; four logical CPUs fit a trainer and two
    workers on a two-core machine (the tiny model leaves the cores mostly idle).

    Its workers run at the test's own priority: Ray starts them at nice 15 by
    default, and beside any other busy process (an xdist worker, a CPU hog) they
    then got a sliver of the cores - with two hogs, three tests took 612 s
    instead of 42 s, and tests met pytest's 300-s timeout."""
    ray = pytest.importorskip("ray", reason="the Ray backend needs the optional 'ray' package")
    os.environ.setdefault("RAY_DISABLE_IMPORT_WARNING", "1")
    # Read by the raylet ray.init starts (Ray spells its config variables so).
    os.environ["RAY_worker_niceness"] = "0"  # noqa: SIM112
    if ray.is_initialized():  # some Ray calls start a default instance on their own
        ray.shutdown()
    # The workers import a custom engine's module (examples/custom_engine.py) as a
    # user's workers would: from their PYTHONPATH, inherited from this process.
    examples = str(Path(__file__).resolve().parents[2] / "examples")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH"), examples) if p)
    # address="local": an instance of its own, whatever RAY_ADDRESS or the
    # address file a `ray start` on this machine left in /tmp/ray say (a stale
    # one made every ray.init() here try to join a cluster that was gone).
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def tiny_config(*, steps: int = 6, **cluster: Any) -> RunConfig:
    """A run that takes well under a second once the actors are up."""
    return config_from_dict({
        "seed": 3,
        "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": 4,
                 "max_num_steps": steps},
        "async_rl": {"sampler": {"name": "in_order", "max_lookahead_versions": 1},
                     "max_buffered_rollouts": 8, "min_groups_for_streaming_train": 2,
                     "max_inflight_prompts": 8},
        "policy": {"model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2,
                             "intermediate_size": 64, "max_position_embeddings": 32},
                   "generation": {"max_new_tokens": 4}},
        "cluster": {"backend": "ray", "num_rollout_workers": 2,
                    "rollout_worker": {"num_cpus": 0.5}, "trainer": {"num_cpus": 0.5},
                    **cluster},
        "logging": {"progress": "never", "tensorboard": False, "plots": False},
    })


class Probe:
    """Wraps the proxies of a run: records every finished group and the versions
    each worker loaded, and kills one worker (once) when asked to."""

    def __init__(self, engines: list[Any], trainer: Any, *, kill: tuple[int, str] | None = None,
                 kill_at_version: int = 1) -> None:
        self.engines = engines
        self.trainer = trainer
        self.kill = kill
        self.kill_at_version = kill_at_version
        self.killed_pid: int | None = None
        #: (engine index, group id, attempt, start_weight, end_weight, trainer version)
        self.results: list[tuple[int, Any, int, int, int, int]] = []
        #: engine index -> versions its last incarnation recorded loading
        self.worker_log: dict[int, list[int]] = {}
        self.weight_refs: list[Any] = []
        for engine in engines:
            self._wrap(engine)
        get_weights = trainer.get_weights

        async def recording_get_weights() -> Any:
            ref = await get_weights()
            self.weight_refs.append(ref)
            return ref

        trainer.get_weights = recording_get_weights

    def _wrap(self, engine: Any) -> None:
        generate, close = engine.generate, engine.close

        async def probing_generate(request: Any) -> Any:
            if self._should_kill(engine) and self.kill[1] == "sigkill":
                # The group is sent, then the process dies within the same turn of
                # the loop: far sooner than the worker could finish the group.
                call = asyncio.ensure_future(generate(request))
                await asyncio.sleep(0)
                self._kill(engine)
                result = await call
            elif self._should_kill(engine):
                # ray.kill acts asynchronously: a group sent just before it could
                # still finish, one sent just after it never does.
                self._kill(engine)
                result = await generate(request)
            else:
                result = await generate(request)
            self.results.append((engine.index, request.group_id, request.attempt,
                                 result.start_weight, result.end_weight, self.trainer.version))
            return result

        async def probing_close() -> None:
            if engine.healthy:
                self.worker_log[engine.index] = await engine.loaded_versions()
            await close()

        engine.generate, engine.close = probing_generate, probing_close

    def _should_kill(self, engine: Any) -> bool:
        return (self.kill is not None and self.killed_pid is None
                and engine.index == self.kill[0] and engine.healthy
                and engine.weight_version >= self.kill_at_version)

    def _kill(self, engine: Any) -> None:
        import ray

        self.killed_pid = engine.pid
        if self.kill[1] == "sigkill":
            os.kill(engine.pid, signal.SIGKILL)
        else:
            ray.kill(engine.actor)
