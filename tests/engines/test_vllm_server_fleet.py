"""``vllm_server``'s elastic fleet (issue 35) on the real engine, over in-process
stand-ins for the servers' HTTP API (tests/engines/fake_vllm_server.py), in
virtual time: a joining server is loaded with the newest weights before it
takes a group (and again when a sync comes meanwhile), ``remove`` drains or
hands the groups over with their tokens, and refused commands change nothing."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import torch

from asyncrl.config import GenerationConfig
from asyncrl.engines.vllm.server.engine import VLLMServerEngine
from asyncrl.engines.vllm.server.fleet import ServerFleet
from asyncrl.errors import EngineLeft, FleetError
from asyncrl.tasks.tokenizer import CharTokenizer
from asyncrl.types import GenerationRequest, Prompt
from tests.engines.fake_vllm_server import FakeServer
from tests.vtime import settle, virtual

WEIGHTS = {"w": torch.zeros(2)}


@contextlib.asynccontextmanager
async def engine_over(*serving: FakeServer, spare: tuple[FakeServer, ...] = (), max_size=3):
    known = {s.url: s for s in (*serving, *spare)}
    engine = VLLMServerEngine(
        list(serving), CharTokenizer("0123456789+= "), GenerationConfig(max_new_tokens=4),
        fleet=lambda e: ServerFleet(e, min_size=1, max_size=max_size,
                                    client_for=lambda url, key: known[url]))
    try:
        yield engine
    finally:
        for s in known.values():
            s.release()
        await engine.close()


def request(gid: int, engine: VLLMServerEngine) -> GenerationRequest:
    return GenerationRequest(group_id=gid, prompt=Prompt(gid, "1+1=", answer=2),
                             num_generations=2, start_weight=engine.weight_version)


def health(engine: VLLMServerEngine) -> dict[str, str]:
    return {m.name: m.health for m in engine.fleet.members()}


@virtual
async def test_a_joining_server_is_loaded_before_its_first_group_and_again_after_a_sync() -> None:
    a, b = FakeServer("http://a:1"), FakeServer("http://b:1")
    async with engine_over(a, spare=(b,)) as engine:
        await engine.update_weights(WEIGHTS, 1)
        await engine.update_weights(WEIGHTS, 2)
        busy = asyncio.ensure_future(engine.generate(request(0, engine)))  # on a, held
        b.hold_reload = asyncio.Event()
        join = asyncio.ensure_future(engine.fleet.add("http://b:1"))
        await b.reload_started.wait()
        assert health(engine)["http://b:1"] == "joining"
        sync = asyncio.ensure_future(engine.update_weights(WEIGHTS, 3))  # waits for the join
        await settle()
        assert b.reloads() == [] and engine.weight_version == 2
        b.hold_reload.set()
        member = await join
        await sync
        assert member.version == 2 and b.reloads() == [2, 3]  # joined at 2, then synced to 3
        first = asyncio.ensure_future(engine.generate(request(1, engine)))  # a is busy: b
        await settle()
        assert b.requests[0]["cache_salt"] == "v3"
        b.release()
        result = await first
        assert result.start_weight == 3
        assert {v for c in result.completions for v, _ in c.versions} == {3}
        a.release()
        await busy


@virtual
async def test_remove_with_abort_hands_the_groups_over_with_their_tokens() -> None:
    a, b = FakeServer("http://a:1"), FakeServer("http://b:1")
    async with engine_over(a, b) as engine:
        on_a = asyncio.ensure_future(engine.generate(request(0, engine)))
        on_b = asyncio.ensure_future(engine.generate(request(1, engine)))
        await settle()
        assert len(a.requests) == 1 and len(b.requests) == 1
        gone = await engine.fleet.remove("http://a:1", abort=True)
        assert gone.health == "gone" and a.closed
        assert [kind for kind, _ in a.calls].count("abort") == 1
        with pytest.raises(EngineLeft) as left:
            await on_a
        partial = left.value.partial
        assert [c.token_ids for c in partial.completions] == [[5], [5]]
        assert all(c.finish_reason is None for c in partial.completions)  # to be continued
        assert engine.urls == ["http://b:1"]
        b.release()
        assert (await on_b).completions[0].token_ids == [5, 6]


@virtual
async def test_remove_drains_a_server_letting_its_groups_finish() -> None:
    a, b = FakeServer("http://a:1"), FakeServer("http://b:1")
    async with engine_over(a, b) as engine:
        on_a = asyncio.ensure_future(engine.generate(request(0, engine)))
        on_b = asyncio.ensure_future(engine.generate(request(1, engine)))
        await settle()
        leaving = asyncio.ensure_future(engine.fleet.remove("http://a:1"))
        await settle()
        assert health(engine) == {"http://a:1": "draining", "http://b:1": "healthy"}
        # a holds one group, b one: without the drain a would get the next.
        nxt = asyncio.ensure_future(engine.generate(request(2, engine)))
        await settle()
        assert len(a.requests) == 1 and len(b.requests) == 2
        assert not leaving.done()
        a.release()
        assert (await on_a).completions[0].finish_reason == "stop"  # finished, not aborted
        await leaving
        assert "abort" not in [kind for kind, _ in a.calls] and engine.urls == ["http://b:1"]
        b.release()
        await asyncio.gather(on_b, nxt)


@virtual
async def test_refused_commands_change_nothing() -> None:
    a, dead = FakeServer("http://a:1"), FakeServer("http://dead:1", answers=False)
    async with engine_over(a, spare=(dead,), max_size=1) as engine:
        with pytest.raises(FleetError, match=r"above policy\.vllm_server\.max_servers=1"):
            await engine.fleet.add("http://dead:1")
        engine.fleet.max_size = 3
        with pytest.raises(FleetError, match="no vLLM server answers at http://dead:1"):
            await engine.fleet.add("http://dead:1")
        with pytest.raises(FleetError, match="already serves"):
            await engine.fleet.add("http://a:1")
        with pytest.raises(FleetError, match=r"below policy\.vllm_server\.min_servers=1"):
            await engine.fleet.remove("http://a:1")
        with pytest.raises(FleetError, match="cannot start more"):
            await engine.fleet.scale(2)
        with pytest.raises(FleetError, match="not a server of this run"):
            await engine.fleet.remove("http://zz:1")
        assert health(engine) == {"http://a:1": "healthy"} and dead.calls == []
        a.release()
        assert (await engine.generate(request(0, engine))).completions[0].finish_reason == "stop"


def test_the_engine_class_declares_its_fleet() -> None:
    """Read from the class too (``asyncrl validate`` reads capabilities before
    anything is built), not only from an instance."""
    from asyncrl.engines import EngineCapabilities

    assert EngineCapabilities.of(VLLMServerEngine).fleet


class FakeLaunched:
    """What ``launch`` returns for a server asyncrl starts: its URL and key, and stop()."""

    def __init__(self, server: FakeServer) -> None:
        self.url, self.key, self.server, self.stopped = server.url, None, server, False

    def stop(self) -> None:
        self.stopped = True


@virtual
async def test_scale_starts_servers_that_join_loaded_and_drains_the_newest_first() -> None:
    a = FakeServer("http://a:1")
    made: list[FakeLaunched] = []

    def start(count: int) -> list[FakeLaunched]:
        new = [FakeLaunched(FakeServer(f"http://s{len(made) + i}:1")) for i in range(count)]
        made.extend(new)
        return new

    engine = VLLMServerEngine(
        [a], CharTokenizer("0123456789+= "), GenerationConfig(max_new_tokens=4),
        fleet=lambda e: ServerFleet(e, min_size=1, max_size=3, start=start,
                                    client_for=lambda url, key: next(
                                        m.server for m in made if m.url == url)))
    try:
        await engine.update_weights(WEIGHTS, 1)
        await engine.fleet.scale(3)
        assert engine.urls == ["http://a:1", "http://s0:1", "http://s1:1"]
        assert [m.server.reloads() for m in made] == [[1], [1]]  # loaded before serving
        await engine.fleet.scale(1)
        assert engine.urls == ["http://a:1"] and [m.stopped for m in made] == [True, True]
        with pytest.raises(FleetError, match="below"):
            await engine.fleet.scale(0)
    finally:
        a.release()
        await engine.close()
