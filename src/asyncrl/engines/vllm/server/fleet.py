"""``vllm_server``'s elastic fleet: servers join and leave the running engine
(issue 35; docs/fleet.md). The engine keeps one list of servers; this module
changes it under the engine's rules:

* **join** (``add URL``, or ``scale`` up, which starts servers as the engine
  started its first ones): the server is checked as at start-up (``connect``),
  then, under the engine's sync lock - so no weight sync interleaves, and the
  weights directory holds exactly the engine's version - it loads those weights
  and takes the version label. Only then is it in the list ``_pick`` chooses
  from, so its first group starts at the newest version, and every later sync
  includes it.
* **leave** (``remove URL``, or ``scale`` down, newest first): the server is
  marked draining (``_pick`` skips it; syncs still reach it, its groups keep
  generating); then its groups finish, or - ``abort``, or at the deadline - the
  server aborts them and each raises :class:`~asyncrl.errors.EngineLeft` with
  its tokens, which the controller continues on another server. Then it leaves
  the list; a server asyncrl started is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.engines.fleet import FleetMember, Health
from asyncrl.engines.vllm.server.http import ServerClient
from asyncrl.engines.vllm.server.launch import LaunchedServer, launch
from asyncrl.engines.vllm.server.wire import Server, connect
from asyncrl.errors import ConfigError, FleetError
from asyncrl.types import GroupId

if TYPE_CHECKING:
    from asyncrl.config import VLLMServerConfig

#: The VLLMServerEngine this fleet belongs to (not imported: it imports this module).
Engine = Any


class Starter:
    """Starts servers like the engine's first ones, numbered on after them (their
    seeds and log files); blocking, so the fleet calls it in a thread."""

    def __init__(self, model_dir: Path, args: Mapping[str, Any], log_dir: Path,
                 block: VLLMServerConfig) -> None:
        self.model_dir, self.args, self.log_dir, self.block = model_dir, args, log_dir, block
        self.next_index = block.server_count

    def __call__(self, count: int) -> Sequence[LaunchedServer]:
        first, self.next_index = self.next_index, self.next_index + count
        return launch(self.model_dir, self.args, count, log_dir=self.log_dir,
                      timeout_s=self.block.startup_timeout_s, env=self.block.env, first=first)


class ServerFleet:
    """The :class:`~asyncrl.engines.fleet.ElasticFleet` of a VLLMServerEngine."""

    def __init__(self, engine: Engine, *, min_size: int = 1,
                 max_size: int | None = None,
                 client_for: Callable[[str, str | None], ServerClient],
                 start: Callable[[int], Sequence[LaunchedServer]] | None = None) -> None:
        self.engine = engine
        self.min_size = min_size
        self.max_size = max_size if max_size is not None else 1 << 30
        self._client_for = client_for
        self._start = start
        #: Servers checked and loading the newest weights, not yet picked from.
        self.joining: list[Server] = []
        #: Groups being aborted on a leaving server: their generate raises EngineLeft.
        self.handover: set[GroupId] = set()
        #: One change at a time (a scale while a remove drains would count wrong).
        self._changing = asyncio.Lock()

    @classmethod
    def of(cls, engine: Engine, block: VLLMServerConfig, key: str | None, *,
           start: Callable[[int], Sequence[LaunchedServer]] | None = None) -> ServerFleet:
        """The fleet ``policy.vllm_server`` describes (bounds, timeouts, the servers'
        key: ``key`` for servers given by URL, a started server's own otherwise)."""
        return cls(engine, min_size=block.min_servers, max_size=block.max_servers,
                   client_for=lambda url, own: ServerClient(
                       url, timeout_s=block.request_timeout_s, key=own if own else key),
                   start=start)

    # ------------------------------------------------------------ reading
    def serving(self) -> list[Server]:
        return [s for s in self.engine._servers if s.alive and not s.draining]

    def members(self) -> list[FleetMember]:
        rows = [_member(s, "healthy" if s.alive and not s.draining
                        else "draining" if s.alive else "gone") for s in self.engine._servers]
        return rows + [_member(s, "joining") for s in self.joining]

    # ------------------------------------------------------------ commands
    async def add(self, url: str) -> FleetMember:
        async with self._changing:
            self._room_for(1)
            if any(s.client.url == url and s.alive for s in self.engine._servers):
                raise FleetError(f"fleet add: {url} already serves this run")
            engine = self.engine
            client = self._client_for(url, None)
            try:
                server = await asyncio.to_thread(connect, client, None, engine.weight_version,
                                                 engine.api_name)
            except ConfigError as exc:
                await client.close()
                raise FleetError(f"fleet add: {exc}") from None
            await self._join(server)
            return _member(server, "healthy")

    async def remove(self, name: str, *, abort: bool = False,
                     deadline_s: float | None = None) -> FleetMember:
        async with self._changing:
            server = next((s for s in self.serving() if s.client.url == name), None)
            if server is None:
                urls = ", ".join(s.client.url for s in self.serving()) or "none"
                raise FleetError(f"fleet remove: {name} is not a server of this run (serving: "
                                 f"{urls})")
            self._room_for(-1)
            await self._leave(server, abort=abort, deadline_s=deadline_s)
            return _member(server, "gone")

    async def scale(self, size: int) -> list[FleetMember]:
        async with self._changing:
            have = len(self.serving())
            self._room_for(size - have)
            if size > have:
                if self._start is None:
                    raise FleetError(
                        "fleet scale: this run drives servers given by URL and cannot start "
                        "more; start a server and join it with: asyncrl fleet RUN_DIR add URL")
                started = await asyncio.to_thread(self._start, size - have)
                for launched in started:
                    client = self._client_for(launched.url, launched.key)
                    server = await asyncio.to_thread(connect, client, launched,
                                                     self.engine.weight_version,
                                                     self.engine.api_name)
                    await self._join(server)
            for server in reversed(self.serving()[size:]):  # newest first
                await self._leave(server, abort=False, deadline_s=None)
            return self.members()

    # ------------------------------------------------------------ internals
    def _room_for(self, change: int) -> None:
        size = len(self.serving()) + change
        if size < self.min_size:
            raise FleetError(f"the fleet would have {size} servers, below "
                             f"policy.vllm_server.min_servers={self.min_size}; add one first "
                             "or lower min_servers")
        if size > self.max_size:
            raise FleetError(f"the fleet would have {size} servers, above "
                             f"policy.vllm_server.max_servers={self.max_size}; remove one "
                             "first or raise max_servers")

    async def _join(self, server: Server) -> None:
        """Bring ``server`` to the newest weights, then let it take groups."""
        engine = self.engine
        self.joining.append(server)
        try:
            async with engine._sync_lock:  # no sync interleaves: the directory is the version
                if engine.weights_written():
                    await engine._load_one(server, engine.weight_version)
                elif server.launched is None:
                    raise FleetError("fleet add: the run has not written its weights yet "
                                     "(no weight sync so far); add the server after step 1")
                server.version = engine.weight_version
                engine._servers.append(server)
        except BaseException:
            await _close(server)
            raise
        finally:
            self.joining.remove(server)

    async def _leave(self, server: Server, *, abort: bool, deadline_s: float | None) -> None:
        server.draining = True
        tasks = self._tasks_on(server)
        if tasks and not abort:
            _, late = await asyncio.wait(tasks, timeout=deadline_s)
            abort = bool(late)
        if abort:
            groups = [g for g, (_, s) in self.engine._running.items() if s is server]
            self.handover.update(groups)
            await self.engine.abort(groups)
        server.alive = False
        self.engine._servers.remove(server)
        await _close(server)

    def _tasks_on(self, server: Server) -> list[asyncio.Task[None]]:
        return [t for run, s in self.engine._running.values() if s is server
                for t in run.tasks if not t.done()]


def _member(server: Server, health: Health) -> FleetMember:
    return FleetMember(server.client.url, server.version, server.inflight, health)


async def _close(server: Server) -> None:
    with contextlib.suppress(Exception):
        await server.client.close()
    if server.launched is not None:
        await asyncio.to_thread(server.launched.stop)


__all__ = ["ServerFleet"]
