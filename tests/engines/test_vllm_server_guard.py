"""Issue 28, item 10: every path of a vLLM server asyncrl starts wants the run's
key (the guard, on an ASGI app here; on real servers:
tests/engines/test_vllm_server_engine.py), and the key of servers given by URL
comes from the environment variable the config names."""

from __future__ import annotations

import asyncio
import importlib
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from asyncrl.cli import main
from asyncrl.config import config_from_dict
from asyncrl.engines.vllm.server.launch import GUARD, KEY_ENV, server_environment
from asyncrl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
MODULE = GUARD.rsplit(".", 1)[0]
KEY = "s3cret-key"


def load_guard(monkeypatch: pytest.MonkeyPatch):
    """The guard module as a server imports it, fresh (it reads the key at import)."""
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    return importlib.import_module(MODULE)


async def app(scope, receive, send) -> None:
    """What the guard protects: answers every request (and lifespan) with success."""
    if scope["type"] == "lifespan":
        await send({"type": "lifespan.startup.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"done"})


def test_every_path_and_method_needs_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    guarded = load_guard(monkeypatch).RequireKey(app)

    async def statuses(headers: list[tuple[str, str]]) -> set[int]:
        transport = httpx.ASGITransport(app=guarded)
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            seen = set()
            for method, path in (("POST", "/collective_rpc"), ("POST", "/pause"),
                                 ("POST", "/v1/completions"), ("GET", "/health"),
                                 ("GET", "/metrics"), ("OPTIONS", "/collective_rpc"),
                                 ("GET", "/v1/../collective_rpc")):
                response = await client.request(method, path, headers=headers)
                seen.add(response.status_code)
            return seen

    assert asyncio.run(statuses([])) == {401}
    assert asyncio.run(statuses([("Authorization", "Bearer wrong")])) == {401}
    assert asyncio.run(statuses([("Authorization", KEY)])) == {401}  # no scheme
    assert asyncio.run(statuses([("Authorization", f"Bearer {KEY}"),
                                 ("Authorization", "Bearer wrong")])) == {401}
    assert asyncio.run(statuses([("Authorization", f"Bearer {KEY}")])) == {200}


def test_websockets_without_the_key_are_closed_and_lifespan_passes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    guarded = load_guard(monkeypatch).RequireKey(app)
    sent: list[dict] = []

    async def send(message) -> None:
        sent.append(message)

    async def receive():
        return {"type": "lifespan.startup"}

    asyncio.run(guarded({"type": "websocket", "path": "/v1/realtime", "headers": []},
                        receive, send))
    assert sent == [{"type": "websocket.close", "code": 1008}]
    sent.clear()
    asyncio.run(guarded({"type": "lifespan"}, receive, send))
    assert sent == [{"type": "lifespan.startup.complete"}]


def test_a_server_without_a_key_does_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "")
    with pytest.raises(RuntimeError, match=f"{KEY_ENV} is not set"):
        load_guard(monkeypatch)
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(RuntimeError, match=f"{KEY_ENV} is not set"):
        load_guard(monkeypatch)


def test_the_key_reaches_a_started_server_by_its_environment_only() -> None:
    # policy.vllm_server.env cannot replace it (nor switch the RL endpoints' guard off).
    env = server_environment({KEY_ENV: "mine", "VLLM_CPU_OMP_THREADS_BIND": "0"}, KEY)
    assert env[KEY_ENV] == KEY and env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"


def by_url(**block) -> dict:
    return {"policy": {"engine": "vllm_server",
                       "vllm_server": {"urls": ["http://127.0.0.1:9"], **block}}}


def test_api_key_env_names_a_variable_for_servers_given_by_url(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="random key of their own"):
        config_from_dict({"policy": {"engine": "vllm_server",
                                     "vllm_server": {"num_servers": 1, "api_key_env": "K"}}})
    with pytest.raises(ConfigError, match="not the key itself"):
        config_from_dict(by_url(api_key_env="sk-12ab.cd"))
    block = config_from_dict(by_url(api_key_env="ASYNCRL_TEST_SERVER_KEY")).policy.vllm_server
    monkeypatch.setenv("ASYNCRL_TEST_SERVER_KEY", KEY)
    assert block.read_key() == KEY
    assert config_from_dict(by_url()).policy.vllm_server.read_key() is None


def test_an_unset_key_variable_is_one_line_naming_it_before_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(ROOT)
    name = f"ASYNCRL_TEST_KEY_{uuid.uuid4().hex[:8].upper()}"
    monkeypatch.delenv(name, raising=False)
    overrides = ["policy.engine=vllm_server", "policy.model.num_heads=2",
                 "policy.vllm_server.urls=[http://127.0.0.1:9]",
                 f"policy.vllm_server.api_key_env={name}"]
    run_dir = tmp_path / "run"
    for argv in (["validate"], ["train", "--run-dir", str(run_dir)]):
        assert main([*argv, "--config", "examples/quickstart.yaml", *overrides]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert f"the environment variable {name} is not set" in line, line
    assert not run_dir.exists()
