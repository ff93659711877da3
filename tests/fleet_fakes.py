"""A fake engine with an elastic fleet (issue 35), for controller tests in virtual time.

``FleetEngine`` is one :class:`~asyncrl.engines.RolloutEngine` over named
members; its ``fleet`` is an :class:`~asyncrl.engines.fleet.ElasticFleet`.
A group takes ``latency`` virtual seconds on the least-loaded healthy member
and generates ``tokens`` tokens per completion, each labelled with the version
the member held. A member that leaves with ``abort`` hands its groups back with
the tokens generated so far (proportional to the time they ran) as
:class:`~asyncrl.errors.EngineLeft`. A joining member loads the newest weights
(``load_s`` virtual seconds, under the lock weight syncs take) before it is picked.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from asyncrl.engines.fleet import FleetMember
from asyncrl.errors import EngineLeft, FleetError
from asyncrl.types import Completion, GenerationRequest, GroupAborted, GroupResult
from tests.vtime import advance


@dataclasses.dataclass(eq=False)
class Member:
    name: str
    version: int
    health: str = "healthy"
    running: dict[Any, asyncio.Future[None]] = dataclasses.field(default_factory=dict)


class FakeFleet:
    def __init__(self, engine: FleetEngine, min_size: int, max_size: int) -> None:
        self.engine, self.min_size, self.max_size = engine, min_size, max_size

    def members(self) -> list[FleetMember]:
        return [FleetMember(m.name, m.version, len(m.running), m.health)  # type: ignore[arg-type]
                for m in self.engine.members]

    def _serving(self) -> list[Member]:
        return [m for m in self.engine.members if m.health == "healthy"]

    async def add(self, url: str) -> FleetMember:
        if "not-a-server" in url:
            raise FleetError(f"fleet add: no vLLM server answers at {url}")
        if len(self._serving()) + 1 > self.max_size:
            raise FleetError(f"above max_servers={self.max_size}")
        member = Member(url, -1, "joining")
        self.engine.members.append(member)
        async with self.engine.sync_lock:  # no sync interleaves with the load
            await advance(self.engine.load_s)
            member.version = self.engine.weight_version
            member.health = "healthy"
        self.engine.joined.append((url, member.version))
        return self.members()[-1]

    async def remove(self, name: str, *, abort: bool = False,
                     deadline_s: float | None = None) -> FleetMember:
        member = next((m for m in self._serving() if m.name == name), None)
        if member is None:
            raise FleetError(f"fleet remove: {name} is not a server of this run")
        if len(self._serving()) - 1 < self.min_size:
            raise FleetError(f"below min_servers={self.min_size}")
        member.health = "draining"
        if abort:
            for fut in member.running.values():
                if not fut.done():
                    fut.set_exception(EngineLeft(f"{name} left"))
        elif member.running:
            await asyncio.wait(list(member.running.values()))
        member.health = "gone"
        return self.members()[self.engine.members.index(member)]

    async def scale(self, size: int) -> list[FleetMember]:
        """Up only: the first new server joins, any further one fails to start
        (a command that fails part-way, having changed the fleet)."""
        if size <= len(self._serving()):
            raise FleetError("scale: only up in this fake")
        await self.add(f"http://scaled-{len(self.engine.members)}:1")
        if size > len(self._serving()):
            raise FleetError(f"scale {size}: the next server did not start")
        return self.members()


class FleetEngine:
    def __init__(self, names: list[str], *, latency: float = 10.0, tokens: int = 4,
                 load_s: float = 1.0, min_size: int = 1, max_size: int = 4) -> None:
        self.members = [Member(n, 0) for n in names]
        self.latency, self.tokens, self.load_s = latency, tokens, load_s
        self.weight_version = 0
        self.sync_lock = asyncio.Lock()
        self.fleet = FakeFleet(self, min_size, max_size)
        #: (member, start weight, prefix tokens per completion) of every attempt.
        self.attempts: list[tuple[str, int, int]] = []
        #: (member, start weight, version the member held) at each attempt's start.
        self.held: list[tuple[str, int, int]] = []
        self.joined: list[tuple[str, int]] = []

    async def generate(self, request: GenerationRequest) -> GroupResult:
        member = min((m for m in self.members if m.health == "healthy"),
                     key=lambda m: len(m.running))
        start = request.start_weight if request.start_weight is not None else member.version
        prefix = request.prefix
        had = len(prefix.completions[0].token_ids) if prefix is not None else 0
        self.attempts.append((member.name, start, had))
        self.held.append((member.name, start, member.version))
        loop = asyncio.get_running_loop()
        fut = member.running[request.group_id] = loop.create_future()
        t0 = loop.time()
        timer = loop.call_later(self.latency, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        except EngineLeft as left:
            ran = int(self.tokens * (loop.time() - t0) / self.latency)
            left.partial = self._result(request, member, start, ran, finished=False)
            raise
        finally:
            timer.cancel()
            del member.running[request.group_id]
        return self._result(request, member, start, self.tokens - had, finished=True)

    def _result(self, request: GenerationRequest, member: Member, start: int, k: int, *,
                finished: bool) -> GroupResult:
        made = [Completion([7] * k, [-0.1] * k, ((member.version, k),) if k else (),
                           "stop" if finished else None, str(i))
                for i in range(request.num_generations)]
        prefix = request.prefix
        if prefix is not None:
            made = [p.continued(c) for p, c in zip(prefix.completions, made)]
        return GroupResult(request.group_id, [1, 2], made, start)

    async def update_weights(self, weights: Any, version: int) -> None:
        async with self.sync_lock:
            for m in self.members:
                if m.health in ("healthy", "draining"):
                    m.version = version
            self.weight_version = version

    async def abort(self, group_ids: Any) -> None:
        for m in self.members:
            for gid in group_ids:
                fut = m.running.get(gid)
                if fut is not None and not fut.done():
                    fut.set_exception(GroupAborted(gid))

    async def close(self) -> None:
        return None
