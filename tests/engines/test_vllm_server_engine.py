"""``policy.engine: vllm_server`` on real ``vllm serve`` processes (CPU build).

Two servers start once for the module (~50 s here, both at once on two
cores), by asyncrl itself (the ``fleet`` engine, ``num_servers: 2``); the run
and the engines of the tests drive them by URL (``policy.vllm_server.urls``,
their key in the variable ``api_key_env`` names), each loading its policy's
starting weights into them first. The tests run in file order: the run kills a
server, the last test stops them all and checks that nothing is left running.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psutil
import pytest

from asyncrl.config import RunConfig, config_from_dict
from asyncrl.engines import RolloutEngine, WeightTransport
from asyncrl.engines.vllm.server.engine import VLLMServerEngine
from asyncrl.engines.vllm.server.fleet import ServerFleet
from asyncrl.engines.vllm.server.launch import KEY_ENV
from asyncrl.engines.vllm.setup import descendants
from asyncrl.errors import ConfigError, FleetError
from asyncrl.policy.build import build_policy
from asyncrl.run.fleet_channel import request as fleet_request
from asyncrl.run.options import trainer_options
from asyncrl.run.train import train
from asyncrl.tasks import build_task
from asyncrl.trainers.grpo import GRPOTrainer
from asyncrl.types import GenerationRequest, GroupAborted
from tests.vllm_support import VLLM_MODEL

pytestmark = pytest.mark.e2e
QUIET = {"progress": "never", "tensorboard": False, "plots": False}
#: Where the tests' servers given by URL find the fleet's key.
KEY_VAR = "ASYNCRL_TEST_VLLM_SERVER_KEY"


def server_config(servers: dict[str, Any], **blocks: Any) -> RunConfig:
    tree: dict[str, Any] = {
        "seed": 0,
        "policy": {"engine": "vllm_server", "model": dict(VLLM_MODEL), "vllm_server": servers,
                   "generation": {"max_new_tokens": 8, "temperature": 0.8}},
        "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": 4,
                 "max_num_steps": 4},
        # On-policy and synchronous: each step's groups are generated after the sync.
        "async_rl": {"sampler": {"name": "in_order", "max_lookahead_versions": 0},
                     "max_buffered_rollouts": 4, "min_groups_for_streaming_train": 4,
                     "max_inflight_prompts": 4},
        # The entropy bonus moves the weights at every step, whatever the rewards
        # (a random policy's groups are often all wrong: no policy gradient).
        "loss": {"entropy_coef": 0.01},
        "checkpoint": {"every_steps": 0},
        "logging": dict(QUIET),
    }
    for key, value in blocks.items():
        tree[key] = {**tree.get(key, {}), **value}
    return config_from_dict(tree)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    cfg = server_config({"num_servers": 2})
    task = build_task(cfg.task)
    model, tokenizer = build_policy(cfg.policy, task, seed=cfg.seed)
    before = descendants()
    work_dir = tmp_path_factory.mktemp("fleet")
    engine = VLLMServerEngine.for_policy(cfg.policy, model, tokenizer, seed=cfg.seed,
                                         work_dir=work_dir)
    pids = set().union(*(s.pids for s in engine.launched))
    key = engine.launched[0].key
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv(KEY_VAR, key)
            yield SimpleNamespace(engine=engine, urls=engine.urls, task=task,
                                  tokenizer=tokenizer, model=model, before=before, pids=pids,
                                  key=key, work_dir=work_dir)
    finally:
        asyncio.run(engine.close())


def by_url(urls: list[str], **block: Any) -> RunConfig:
    """A run on the fleet's servers, their key in :data:`KEY_VAR`."""
    return server_config({"urls": urls, "api_key_env": KEY_VAR, **block})


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_config_names_the_servers_or_their_count() -> None:
    with pytest.raises(ConfigError, match=r"either urls .* or num_servers"):
        server_config({"urls": ["http://127.0.0.1:1"], "num_servers": 2})
    with pytest.raises(ConfigError, match="not a base URL"):
        server_config({"urls": ["127.0.0.1:8000"]})
    with pytest.raises(ConfigError, match=r"cluster\.backend: local"):
        server_config({"num_servers": 1}, cluster={"backend": "ray"})
    with pytest.raises(ConfigError, match=r"no vLLM server answers at http://127\.0\.0\.1:9"):
        cfg = server_config({"urls": ["http://127.0.0.1:9"]})
        VLLMServerEngine.for_policy(cfg.policy, *build_policy(cfg.policy, build_task(cfg.task),
                                                              seed=0), seed=0)


#: Requests anyone who reaches a server could send: the weight-loading RPC
#: itself (a harmless method of it), a completion, a pause, and what vLLM's own
#: --api-key leaves open besides.
OPEN_DOORS = [("POST", "/collective_rpc", {"method": "check_health"}),
              ("POST", "/v1/completions", {"model": "asyncrl-policy", "prompt": [1, 2],
                                           "max_tokens": 1}),
              ("POST", "/pause", None), ("GET", "/is_paused", None), ("GET", "/health", None),
              ("GET", "/metrics", None)]


def test_every_path_of_a_started_server_wants_the_runs_key(fleet):
    """Issue 28, item 10: without the run's key (none, or another) every request
    is refused, the RL endpoints included; the key opens them; it reached the
    server by its environment, not its command line (``ps`` shows that to all)."""
    url, key = fleet.urls[0], fleet.key
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        for method, path, body in OPEN_DOORS:
            answer = httpx.request(method, url + path, json=body, headers=headers, timeout=60)
            assert answer.status_code == 401, (path, headers, answer.status_code, answer.text)
    with_key = {"Authorization": f"Bearer {key}"}
    answer = httpx.post(url + "/collective_rpc", json={"method": "check_health"},
                        headers=with_key, timeout=60)
    assert answer.status_code == 200, answer.text
    assert httpx.get(url + "/is_paused", headers=with_key, timeout=60).json() == {
        "is_paused": False}
    for launched in fleet.engine.launched:
        assert psutil.Process(launched.proc.pid).environ()[KEY_ENV] == key
    for pid in fleet.pids:
        assert key not in " ".join(psutil.Process(pid).cmdline()), pid


def test_servers_given_by_url_need_the_key_their_variable_holds(fleet, monkeypatch):
    def connect(cfg: RunConfig) -> None:
        VLLMServerEngine.for_policy(cfg.policy, fleet.model, fleet.tokenizer, seed=0)

    with pytest.raises(ConfigError, match=r"asks for a key \(HTTP 401\): set policy\.vllm_server"
                                          r"\.api_key_env"):
        connect(server_config({"urls": fleet.urls[:1]}))
    monkeypatch.setenv(KEY_VAR, "not-the-key")
    with pytest.raises(ConfigError, match=r"refused asyncrl's key \(HTTP 401\)"):
        connect(by_url(fleet.urls[:1]))


async def _first_tokens(engine: VLLMServerEngine, request: GenerationRequest) -> asyncio.Task:
    """Start ``request`` and return its task once its first tokens have arrived."""
    arrived = asyncio.Event()
    originals = {}
    for server in engine._servers:  # a spy on what the servers stream
        originals[server] = original = server.client.stream

        async def spy(path, body, _original=original):
            async for event in _original(path, body):
                yield event
                arrived.set()

        server.client.stream = spy
    try:
        task = asyncio.ensure_future(engine.generate(request))
        waiter = asyncio.ensure_future(arrived.wait())
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    finally:
        for server, original in originals.items():
            server.client.stream = original
    return task


async def _sync_lands_mid_group(engine: VLLMServerEngine, prompt, weights) -> list[list[int]]:
    """Long groups, each with a weight sync (same weights, next version) as soon
    as its first tokens arrive, until one has tokens of both versions (the random
    policy may end every completion before the sync lands); checks every token's
    version on the way. The versions of that group's tokens."""
    for attempt in range(10):
        v = engine.weight_version
        request = GenerationRequest(f"long{attempt}", prompt, 16, max_new_tokens=48,
                                    temperature=1.0)
        task = await _first_tokens(engine, request)
        await engine.update_weights(weights, v + 1)
        result = await task
        versions = [c.version_list() for c in result.completions]
        assert all(vs == sorted(vs) and set(vs) <= {v, v + 1} for vs in versions)
        assert result.start_weight == v and result.end_weight == max(map(max, versions))
        if any(vs[0] == v and vs[-1] == v + 1 for vs in versions):
            return versions
    raise AssertionError("no weight sync landed in the middle of a completion in 10 groups")


def test_tokens_carry_the_version_they_were_sampled_with_and_an_abort_keeps_them(fleet):
    engine, prompt = fleet.engine, fleet.task.prompt_source(0).next_prompt()
    weights = {k: v.clone() for k, v in fleet.model.state_dict().items()}

    async def scenario():
        assert isinstance(engine, RolloutEngine) and engine.healthy
        await _sync_lands_mid_group(engine, prompt, weights)
        task = await _first_tokens(engine, GenerationRequest("cut", prompt, 4,
                                                             max_new_tokens=48))
        await engine.abort(["cut"])
        with pytest.raises(GroupAborted) as aborted:
            await task
        partial = aborted.value.partial
        assert partial is not None and partial.num_tokens >= 1
        resumed = await engine.generate(GenerationRequest("cut", prompt, 4, max_new_tokens=48,
                                                          prefix=partial))
        for before, after in zip(partial.completions, resumed.completions):
            assert after.token_ids[: len(before)] == before.token_ids and after.finished

    asyncio.run(scenario())


def test_the_generate_api_labels_each_token_as_the_ordering_does(fleet, caplog):
    """api: generate: the server's own labels; they agree with the versions
    the engine orders the streamed tokens by (a warning would say otherwise)."""
    cfg = by_url(fleet.urls, api="generate")
    engine = VLLMServerEngine.for_policy(cfg.policy, fleet.model, fleet.tokenizer, seed=0,
                                         weight_version=fleet.engine.weight_version)
    weights = {k: v.clone() for k, v in fleet.model.state_dict().items()}
    prompt = fleet.task.prompt_source(0).next_prompt()

    async def scenario():
        try:
            return await _sync_lands_mid_group(engine, prompt, weights)
        finally:
            await engine.close()

    with caplog.at_level(logging.WARNING, logger="asyncrl.engines.vllm_server"):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if "server labels them" in r.getMessage()]


def fleet_changes_mid_run(engine: VLLMServerEngine, run_dir: Path, first: str, second: str,
                          seen: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the run's control channel (a thread calling what ``asyncrl fleet``
    calls): the first request to ``first`` after step 1 adds ``second`` before it
    goes on; the first one after step 2 removes ``first`` with ``--abort`` once
    it has streamed its first tokens, and streams on only once the server has
    begun to leave, so that group is in flight and is handed over whatever the
    machine's load (under two CPU hogs it once finished before the removal
    landed). ``seen`` gets the versions ``second`` held at its first request."""
    server = next(s for s in engine._servers if s.client.url == first)
    original = server.client.stream
    leaving = asyncio.Event()
    leave = ServerFleet._leave

    async def marked_leave(self, server, **how):
        leaving.set()  # (its body marks the server draining before its first await)
        await leave(self, server, **how)

    monkeypatch.setattr(ServerFleet, "_leave", marked_leave)

    async def stream(path, body):
        if server.version >= 1 and "adding" not in seen:
            seen["adding"] = True  # before the await: groups stream here concurrently
            seen["refused"] = [await asyncio.to_thread(refused, run_dir, message) for message in (
                {"op": "add", "url": "http://127.0.0.1:9"},  # nothing listens there
                {"op": "remove", "url": first},  # the only server: below min_servers
                {"op": "scale", "size": 3})]  # above max_servers
            seen["added"] = await asyncio.to_thread(
                fleet_request, run_dir, {"op": "add", "url": second})
            joined = next(s for s in engine._servers if s.client.url == second)
            joined_stream = joined.client.stream

            async def first_on_second(path, body):
                seen.setdefault("second_first", (joined.version, engine.weight_version,
                                                 body["cache_salt"]))
                async for event in joined_stream(path, body):
                    yield event

            joined.client.stream = first_on_second
        async for event in original(path, body):
            yield event
            if server.version >= 2 and "removed" not in seen:
                seen["removed"] = asyncio.ensure_future(asyncio.to_thread(
                    fleet_request, run_dir, {"op": "remove", "url": first, "abort": True}))
                await leaving.wait()  # in flight until its server leaves

    server.client.stream = stream


def refused(run_dir: Path, message: dict) -> str:
    with pytest.raises(FleetError) as refusal:
        fleet_request(run_dir, message)
    return str(refusal.value)


def test_a_run_grows_to_two_servers_then_hands_the_first_ones_groups_over(fleet, tmp_path,
                                                                          monkeypatch):
    """Issue 35's acceptance on real servers: a synchronous run on one server;
    after step 1 ``fleet add`` joins the second (at the newest weights), after
    step 2 ``fleet remove --abort`` takes the first away with a group in flight,
    which continues on the second from its tokens. On-policy at every step,
    ledger balanced, nothing regenerated from scratch."""
    cfg = by_url(fleet.urls[:1], min_servers=1, max_servers=2)
    cfg = cfg.model_copy(update={"grpo": cfg.grpo.model_copy(update={"max_num_steps": 3})})
    model, tokenizer = build_policy(cfg.policy, fleet.task, seed=cfg.seed)
    engine = VLLMServerEngine.for_policy(cfg.policy, model, tokenizer, seed=cfg.seed)
    trainer = GRPOTrainer.from_options(trainer_options(cfg), model=model, tokenizer=tokenizer)
    seen: dict = {}
    fleet_changes_mid_run(engine, tmp_path / "run", fleet.urls[0], fleet.urls[1], seen,
                          monkeypatch)
    summary = train(cfg, tmp_path / "run", backends=([engine], trainer))
    assert summary["ledger"]["balanced"] and summary["steps"] == 3
    # Refused mid-run, one line each, the run unaffected (it went on to finish).
    no_server, below, above = seen["refused"]
    assert "no vLLM server answers at http://127.0.0.1:9" in no_server
    assert "below policy.vllm_server.min_servers=1" in below
    assert "above policy.vllm_server.max_servers=2" in above
    assert all("\n" not in line for line in seen["refused"])
    assert any("added " + fleet.urls[1] in line for line in seen["added"])
    held, newest, salt = seen["second_first"]
    assert held == newest and salt == f"v{newest}"  # its first group: the newest weights
    assert f"removed {fleet.urls[0]}" in seen["removed"].result()
    assert summary["groups_continued"] >= 1
    assert engine.urls == [fleet.urls[1]]
    for r in records(tmp_path / "run"):
        assert r["staleness_max"] == 0
        assert r["train/logprob_mismatch_max"] <= 1e-3, r
    assert not (tmp_path / "run" / ".asyncrl.fleet").exists()


def kill_at_next_request(engine: VLLMServerEngine, url: str, launched) -> None:
    """The first request sent to the server at ``url`` after the first training
    step kills it first (SIGKILL, its whole process group, waited for): a group
    is dispatched to it when it dies. (Killed between steps instead, the weight
    sync finds it gone first and no group is lost; killed while a request
    streams, a short completion may already sit whole in the socket's buffer.)"""
    server = next(s for s in engine._servers if s.client.url == url)
    original = server.client.stream

    async def stream(path, body):
        if server.version >= 1 and launched.running:
            launched.kill()
            await asyncio.to_thread(launched.proc.wait)
        async for event in original(path, body):
            yield event

    server.client.stream = stream


def test_a_synchronous_run_is_on_policy_and_goes_on_when_a_server_is_killed(fleet, tmp_path,
                                                                            caplog):
    """Four on-policy steps over both servers; after the first, one is killed:
    its groups fail as infra (EngineUnavailable, retried on the other) and the
    run trains every step on the server left, on-policy at every step."""
    cfg = by_url(fleet.urls)
    model, tokenizer = build_policy(cfg.policy, fleet.task, seed=cfg.seed)
    engine = VLLMServerEngine.for_policy(cfg.policy, model, tokenizer, seed=cfg.seed)
    trainer = GRPOTrainer.from_options(trainer_options(cfg), model=model, tokenizer=tokenizer)
    assert isinstance(engine.transport, WeightTransport) and engine.transport.route == "http"
    victim = fleet.engine.launched[1]
    kill_at_next_request(engine, fleet.urls[1], victim)
    with caplog.at_level(logging.INFO, logger="asyncrl"):
        summary = train(cfg, tmp_path / "run", backends=([engine], trainer))
    assert summary["ledger"]["balanced"] and summary["steps"] == 4
    assert engine.urls == [fleet.urls[0]] and not victim.running
    lost = [r.getMessage() for r in caplog.records if "lost with engine" in r.getMessage()]
    assert lost and all(fleet.urls[1] in m for m in lost)
    rows = records(tmp_path / "run")
    assert len(rows) == 4
    for r in rows:
        assert r["staleness_max"] == 0
        assert r["train/logprob_mismatch_max"] <= 1e-3, r
    assert all(r["train/grad_norm"] > 0 for r in rows)  # every sync brought new weights
    # The servers' key: its variable's name in the config, the key nowhere.
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert {"config.yaml", "summary.json"} <= {p.name for p in written}
    assert f"api_key_env: {KEY_VAR}" in (tmp_path / "run" / "config.yaml").read_text()
    logs = list(fleet.work_dir.glob("vllm_server_*.log"))
    assert len(logs) == 2
    for path in written + logs:
        assert fleet.key.encode() not in path.read_bytes(), path
    assert caplog.records and fleet.key not in caplog.text


def test_close_stops_every_server_it_started(fleet):
    asyncio.run(fleet.engine.close())
    alive = []
    for pid in fleet.pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    assert not alive, f"server processes outlived close: {alive}"
    assert not descendants() - fleet.before
