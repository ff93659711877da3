"""``VLLMServerEngine``: rollouts from one or more OpenAI-compatible vLLM servers
(``vllm serve``) over HTTP, behind the :class:`~asyncrl.engines.RolloutEngine`
protocol (``policy.engine: vllm_server``). See docs/engines.md, "vLLM servers
over HTTP".

How the protocol maps onto the servers:

* ``generate`` - the group goes to the live server with the fewest groups in
  flight, as one streamed ``/v1/completions`` request with the prompt's token
  ids (``n = num_generations``; a continued group: one request per unfinished
  completion, prompt + its tokens), ``logprobs=0`` and the sampled token ids.
  The servers run with ``--logprobs-mode processed_logprobs``: each token's
  log-prob under the distribution it was sampled from, as the in-process engine
  reports it.
* Per-token versions - the completions API labels no token with a weight
  version, so the engine orders the streamed tokens against its own
  pause/resume: a server samples nothing between ``/pause`` (``mode=keep``) and
  ``/resume``, and vLLM answers ``/pause`` only after the step running then has
  finished and its output has reached the request streams. Tokens read before
  the engine sends ``/resume`` were sampled with the old weights, tokens read
  after with the new ones.
* ``update_weights`` - the weights are written once as safetensors into a
  directory every server reads; then per server: ``/pause?mode=keep``,
  ``/collective_rpc`` ``reload_weights`` from that directory,
  ``/update_weight_version``, ``/resume``. Requests keep running across it.
* ``abort`` - ``/abort_requests`` with the groups' request ids; each stream then
  ends with the tokens it had (``GroupAborted`` with them as ``partial``).
* A dead server (connection refused or broken, ``/health`` not answering, or a
  started server's process gone) is dropped for the rest of the run: its groups
  raise :class:`~asyncrl.errors.EngineUnavailable` (infra, retried at once on
  the other servers), weight syncs skip it, and only when none is left does the
  engine raise :class:`~asyncrl.errors.BackendLost`.
* ``close`` - stops the servers asyncrl started (their whole process groups).
* ``fleet`` - servers join and leave while the run goes on (``asyncrl fleet``;
  :mod:`asyncrl.engines.vllm.server.fleet`); ``pressure`` - their ``/metrics``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import shutil
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from asyncrl.config import GenerationConfig
from asyncrl.engines.capabilities import EnginePressure
from asyncrl.engines.classify import encode_prompt_or_fail
from asyncrl.engines.completions import partial_result, refuse_pinned, start_weight, with_texts
from asyncrl.engines.transport import WeightUpdate, check_kind
from asyncrl.engines.vllm import setup
from asyncrl.engines.vllm.pressure import servers_pressure
from asyncrl.engines.vllm.server.fleet import ServerFleet, Starter
from asyncrl.engines.vllm.server.http import ServerClient, ServerGone, ServerRefused
from asyncrl.engines.vllm.server.launch import LaunchedServer, launch
from asyncrl.engines.vllm.server.wire import APIS, Server, add_choice, connect
from asyncrl.engines.vllm.stream import Run, Sub
from asyncrl.engines.vllm.transport import write_safetensors
from asyncrl.errors import (
    BackendLost,
    ConfigError,
    EngineLeft,
    EngineUnavailable,
    GenerationError,
    GroupAborted,
    PromptError,
)
from asyncrl.policy.context_length import check_prompt_fits
from asyncrl.tasks.tokenizer import Tokenizer
from asyncrl.types import GenerationRequest, GroupId, GroupResult

if TYPE_CHECKING:
    import torch

    from asyncrl.config import PolicyConfig

log = logging.getLogger("asyncrl.engines.vllm_server")

#: Seconds an aborted group's streams may take to end after ``/abort_requests``
#: before they are closed from this side (which aborts them too).
ABORT_GRACE_S = 5.0


class VLLMServerEngine:
    """A :class:`~asyncrl.engines.RolloutEngine` over vLLM servers reached by
    HTTP. Build it with :meth:`for_policy`, or from :class:`ServerClient` s of
    running servers (started with ``VLLM_SERVER_DEV_MODE=1``,
    ``--logprobs-mode processed_logprobs`` and ``--generation-config vllm``).
    ``initial_weights``: loaded into the servers before the first generation (the
    servers then hold the trainer's ``weight_version``). Use it from one event
    loop at a time.
    """

    def __init__(
        self,
        clients: Sequence[ServerClient],
        tokenizer: Tokenizer,
        generation: GenerationConfig | None = None,
        *,
        launched: Sequence[LaunchedServer] = (),
        weights_dir: str | Path | None = None,
        weight_version: int = 0,
        initial_weights: Mapping[str, torch.Tensor] | None = None,
        recompute_kv_on_update: bool = False,
        owned_dirs: Sequence[Path] = (),
        api: Literal["completions", "generate"] = "completions",
        fleet: Callable[[VLLMServerEngine], ServerFleet] | None = None,
    ) -> None:
        if not clients:
            raise ConfigError("policy.vllm_server: no server to drive; list urls or set "
                              "num_servers")
        self.tokenizer = tokenizer
        self.generation = generation or GenerationConfig()
        self.recompute_kv_on_update = recompute_kv_on_update
        self.api, self.api_name = APIS[api], api
        self._owned_dirs = [Path(d) for d in owned_dirs]
        by_url = {s.url: s for s in launched}
        # At once: a server's first /server_info takes seconds (it collects its environment).
        with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
            self._servers = list(pool.map(
                lambda c: connect(c, by_url.get(c.url), weight_version, api), clients))
        if weights_dir is None:
            weights_dir = Path(tempfile.mkdtemp(prefix="asyncrl-vllm-server-weights-"))
            self._owned_dirs.append(weights_dir)
        self._weights_dir = Path(weights_dir)
        self._weights_dir.mkdir(parents=True, exist_ok=True)
        #: How weight updates reach the servers (the ``http`` route).
        self.transport = ServerReloadTransport(self._weights_dir, self._reload_all)
        self._version = weight_version
        #: The servers label tokens "default" (or so) until a version is set.
        self._first_version = weight_version
        #: Written now (the trainer may change the tensors later), loaded before
        #: the first generation.
        self._initial = initial_weights is not None
        if initial_weights is not None:
            write_safetensors(initial_weights, self._weights_dir)
        #: Request ids unique across engines sharing a server.
        self._tag = uuid.uuid4().hex[:12]
        self._request_ids = itertools.count()
        self._running: dict[GroupId, tuple[Run, Server]] = {}
        self._sync_lock = asyncio.Lock()
        self._closed = False
        #: Servers joining and leaving while the run goes on (``asyncrl fleet``).
        self._fleet = fleet(self) if fleet is not None else ServerFleet(
            self, client_for=lambda url, key: ServerClient(url, timeout_s=clients[0].timeout_s,
                                                           key=key))

    @classmethod
    def for_policy(
        cls,
        policy: PolicyConfig,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        *,
        seed: int,
        work_dir: str | Path | None = None,
        weights: Mapping[str, Any] | None = None,
        weight_version: int = 0,
        recompute_kv_on_update: bool = False,
    ) -> VLLMServerEngine:
        """The engine ``policy.vllm_server`` describes, holding ``model`` (or
        ``weights``) as ``weight_version``: servers at ``urls`` get those weights
        loaded (with the key in the variable ``api_key_env`` names); otherwise
        ``num_servers`` servers are started on 127.0.0.1, every path behind a
        random key of the run's, from ``policy.model_name_or_path`` (or the model
        saved into ``work_dir/vllm_model``), their logs in ``work_dir`` (a
        temporary directory when None)."""
        from asyncrl.policy.hf import save_policy

        block = policy.vllm_server
        owned: list[Path] = []
        base = Path(work_dir) if work_dir is not None else None
        if not block.launches:
            key = block.read_key()
            clients = [ServerClient(url, timeout_s=block.request_timeout_s, key=key)
                       for url in block.urls]
            start = weights if weights is not None else model.state_dict()
            return cls(clients, tokenizer, policy.generation, weights_dir=block.weights_dir,
                       weight_version=weight_version, initial_weights=start,
                       recompute_kv_on_update=recompute_kv_on_update, api=block.api,
                       fleet=lambda e: ServerFleet.of(e, block, key))
        if base is None:
            base = Path(tempfile.mkdtemp(prefix="asyncrl-vllm-server-"))
            owned.append(base)
        if policy.model_name_or_path is not None and weights is None:
            model_dir = Path(policy.model_name_or_path).expanduser()
        else:
            model_dir = save_policy(model, tokenizer, base / "vllm_model", state_dict=weights)
        args = setup.engine_args(policy, model_dir, seed=seed, log_stats=True)
        servers = launch(model_dir, args, block.server_count, log_dir=base,
                         timeout_s=block.startup_timeout_s, env=block.env)
        try:
            clients = [ServerClient(s.url, timeout_s=block.request_timeout_s, key=s.key)
                       for s in servers]
            return cls(clients, tokenizer, policy.generation, launched=servers,
                       weights_dir=block.weights_dir, weight_version=weight_version,
                       recompute_kv_on_update=recompute_kv_on_update, owned_dirs=owned,
                       api=block.api, fleet=lambda e: ServerFleet.of(
                           e, block, None, start=Starter(model_dir, args, base, block)))
        except BaseException:
            for server in servers:
                server.stop()
            for d in owned:
                shutil.rmtree(d, ignore_errors=True)
            raise

    # ------------------------------------------------------------ protocol
    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def context_length(self) -> int:
        """Longest prompt + completion every server takes (their ``max_model_len``)."""
        return min(s.max_model_len for s in self._servers)

    @property
    def fleet(self) -> ServerFleet:
        return self._fleet

    @property
    def healthy(self) -> bool:
        return not self._closed and any(s.alive for s in self._servers)

    @property
    def urls(self) -> list[str]:
        """The servers still in use."""
        return [s.client.url for s in self._servers if s.alive]

    @property
    def launched(self) -> list[LaunchedServer]:
        """The servers this engine started (and stops at close)."""
        return [s.launched for s in self._servers if s.launched is not None]

    async def generate(self, request: GenerationRequest) -> GroupResult:
        self._check_open("generate")
        gid = request.group_id
        if gid in self._running:
            raise ValueError(f"group {gid!r} is already being generated")
        refuse_pinned(request, self._version, "the vLLM servers")
        await self._load_initial()
        prompt_ids = encode_prompt_or_fail(self.tokenizer, request.prompt)
        limit = request.max_new_tokens or self.generation.max_new_tokens
        check_prompt_fits(gid, len(prompt_ids), limit, self.context_length)
        server = self._pick()
        run = Run.plan(request, prompt_ids, start=start_weight(request, self._version),
                       limit=limit, tag=f"asyncrl-{self._tag}-{next(self._request_ids)}")
        run.tasks = [asyncio.ensure_future(self._stream(server, run, sub)) for sub in run.subs]
        self._running[gid] = (run, server)
        server.inflight += 1
        try:
            if run.tasks:
                await asyncio.wait(run.tasks)
        finally:
            server.inflight -= 1
            del self._running[gid]
            for task in run.tasks:  # cancelled (the group was): close the streams
                task.cancel()
        failure = next((t.exception() for t in run.tasks
                        if not t.cancelled() and t.exception() is not None), None)
        if failure is not None and not run.aborting:
            raise await self._classify(failure, server, gid) from failure
        completions = run.completions(self._label_version)
        if run.aborting:
            partial = partial_result(request, run.prompt_ids, run.start, completions)
            if gid in self.fleet.handover:  # its server left the fleet: continue elsewhere
                self.fleet.handover.discard(gid)
                raise EngineLeft(f"{server.client.url} left the fleet", partial=partial)
            raise GroupAborted(f"group {gid!r} aborted", partial=partial)
        if not all(c.finished for c in completions):
            raise GenerationError(f"the vLLM server at {server.client.url} ended group {gid!r} "
                                  "before it finished (aborted by someone else?)")
        return GroupResult(gid, run.prompt_ids, with_texts(self.tokenizer, completions),
                           run.start)

    async def update_weights(self, weights: Any, version: int) -> None:
        self._check_open("update_weights")
        if version < self._version:
            raise ValueError(
                f"weight version must not go back (holds {self._version}, got {version})")
        update = WeightUpdate(version, weights)
        async with self._sync_lock:
            self._initial = False  # superseded
            await self.transport.stage(update)
            await self.transport.load(update)

    async def abort(self, group_ids: Sequence[GroupId]) -> None:
        """The servers abort the groups' requests; their ``generate`` raises
        GroupAborted with the tokens streamed so far as ``partial``."""
        entries = [self._running[g] for g in group_ids if g in self._running]
        for run, _ in entries:
            run.aborting = True
        by_server: dict[int, tuple[Server, list[str]]] = {}
        for run, server in entries:
            ids = by_server.setdefault(id(server), (server, []))[1]
            ids += [self.api.external_id(sub.request_id) for sub in run.subs]
        await asyncio.gather(*(self._abort_on(server, ids)
                               for server, ids in by_server.values()))
        tasks = [t for run, _ in entries for t in run.tasks if not t.done()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=ABORT_GRACE_S)
            for task in late:  # not registered yet, or the server is gone: close the stream
                task.cancel()
            if late:
                await asyncio.wait(late)

    async def snapshot(self, group_ids: Sequence[GroupId]) -> dict[GroupId, GroupResult]:
        """The tokens each group still generating has streamed so far."""
        out = {}
        for gid in group_ids:
            if gid in self._running:
                run, _ = self._running[gid]
                out[gid] = partial_result(run.request, run.prompt_ids, run.start,
                                          run.completions(self._label_version))
        return out

    async def invalidate_cache(self) -> None:
        if self.recompute_kv_on_update:
            return  # every update already recomputed the running requests' KV
        async with self._sync_lock:
            await self._each_live(lambda s: s.client.post(
                "/reset_prefix_cache", params={"reset_running_requests": "true"}))

    async def pressure(self) -> EnginePressure | None:
        """The live servers' load, from their ``/metrics`` (:mod:`~asyncrl.engines.vllm.pressure`):
        the KV-cache usage is a gauge, the value at this read only."""
        return await servers_pressure(s.client for s in self._servers if s.alive)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.abort(list(self._running))
        finally:
            for server in self._servers:
                with contextlib.suppress(Exception):
                    await server.client.close()
                if server.launched is not None:
                    await asyncio.to_thread(server.launched.stop)
            for d in self._owned_dirs:
                shutil.rmtree(d, ignore_errors=True)

    # ------------------------------------------------------------ generation
    async def _stream(self, server: Server, run: Run, sub: Sub) -> None:
        """One generation request: what it streams goes into ``sub``, each token
        labelled with the version the server held when it arrived (replaced by
        the server's own labels when the API gives them)."""
        req, g = run.request, self.generation
        sampling = {
            "n": len(sub.indices), "max_tokens": sub.max_tokens,
            "temperature": g.temperature if req.temperature is None else req.temperature,
            "top_p": g.top_p if req.top_p is None else req.top_p,
            "seed": sub.seed, "stop_token_ids": [self.tokenizer.eos_id], "logprobs": 0,
        }
        body = {"model": server.model, "stream": True, "request_id": sub.request_id,
                # A new prompt never reuses KV blocks computed with other weights.
                "cache_salt": f"v{server.version}", **self.api.body(sub.prompt_ids, sampling)}
        async for event in server.client.stream(self.api.path, body):
            label = str(server.version)
            for choice in event.get("choices", ()):
                add_choice(sub, choice, label)

    async def _classify(self, exc: BaseException, server: Server,
                        gid: GroupId) -> BaseException:
        """The typed error for a group's failed request (docs/controller.md)."""
        url = server.client.url
        if isinstance(exc, ServerRefused) and 400 <= exc.status < 500:
            return PromptError(f"the vLLM server at {url} rejected group {gid!r}: {exc}")
        if isinstance(exc, ServerGone):
            if not await self._still_alive(server):
                if not self.healthy:
                    return BackendLost(f"every vLLM server is gone (the last, {url}, while "
                                       f"generating group {gid!r}: {exc})")
                return EngineUnavailable(
                    f"the vLLM server at {url} is gone ({exc}); group {gid!r} goes to "
                    f"the other servers: {', '.join(self.urls)}")
            return GenerationError(f"the connection to the vLLM server at {url} broke while "
                                   f"generating group {gid!r}: {exc}")
        if isinstance(exc, (ServerRefused, GenerationError)):
            return GenerationError(f"the vLLM server at {url} failed group {gid!r}: {exc}")
        return exc  # our own bug: not classified

    def _pick(self) -> Server:
        live = [s for s in self._servers if s.alive and not s.draining]
        if not live:
            raise BackendLost("every vLLM server of policy.engine: vllm_server is gone")
        return min(live, key=lambda s: s.inflight)

    def weights_written(self) -> bool:
        """Whether the weights directory holds the engine's version (a joining server loads it)."""
        return self._initial or self._version != self._first_version or any(
            self._weights_dir.glob("*.safetensors"))

    # ------------------------------------------------------------ weights
    async def _load_initial(self) -> None:
        """Servers given by URL hold whatever they were started with: before the
        first generation they get the policy's starting weights."""
        if not self._initial:
            return
        async with self._sync_lock:
            if self._initial:
                await self._reload_all(self._version)
                self._initial = False

    async def _reload_all(self, version: int) -> None:
        """Every live server loads the weights written into the weights directory
        as ``version`` (under the sync lock)."""
        await self._each_live(lambda s: self._load_one(s, version))
        self._version = version

    async def _load_one(self, server: Server, version: int) -> None:
        client = server.client
        await client.post("/pause", params={"mode": "keep", "clear_cache": "false"})
        try:
            await client.post("/collective_rpc", {
                "method": "reload_weights", "kwargs": {"weights_path": str(self._weights_dir)}})
            await client.post("/update_weight_version", {"new_version": str(version)})
            if self.recompute_kv_on_update:  # still paused: no token over stale KV
                await client.post("/reset_prefix_cache",
                                  params={"reset_running_requests": "true"})
            # Nothing was sampled since the pause: what arrives from now on is new.
            server.version = version
        except BaseException:
            with contextlib.suppress(ServerGone, ServerRefused):
                await client.post("/resume")  # generation must not stay paused
            raise
        await client.post("/resume")

    async def _each_live(self, call: Any) -> None:
        """``call(server)`` on every live server at once; a server that fails it
        and is gone is dropped, any other failure is raised."""
        live = [s for s in self._servers if s.alive]
        results = await asyncio.gather(*(call(s) for s in live), return_exceptions=True)
        for server, result in zip(live, results):
            if isinstance(result, (ServerGone, ServerRefused)):
                if await self._still_alive(server):
                    raise GenerationError(f"the vLLM server at {server.client.url} failed a "
                                          f"control call: {result}") from result
            elif isinstance(result, BaseException):
                raise result
        if not self.healthy:
            raise BackendLost("every vLLM server of policy.engine: vllm_server is gone")

    # ------------------------------------------------------------ health
    async def _still_alive(self, server: Server) -> bool:
        """Whether the server still serves; one that does not is dropped."""
        if not server.alive:
            return False
        gone = server.launched is not None and not server.launched.running
        if gone or not await server.client.healthy():
            server.alive = False
            left = ", ".join(self.urls) or "none"
            log.warning("the vLLM server at %s is gone; servers left: %s", server.client.url,
                        left)
        return server.alive

    async def _abort_on(self, server: Server, request_ids: list[str]) -> None:
        if server.alive and request_ids:
            with contextlib.suppress(ServerGone, ServerRefused):
                await server.client.post("/abort_requests", {"request_ids": request_ids})

    def _label_version(self, label: str) -> int:
        """The weight version of a label (a server's own before any was set: the first)."""
        return int(label) if label.isdigit() else self._first_version

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"VLLMServerEngine.{what} called after close()")


class ServerReloadTransport:
    """``vllm_server``'s weight route: the update is written as safetensors into
    the engine's weights directory while the servers generate (``stage``), then
    every live server reloads it over HTTP (``load``: ``/pause`` keeping its
    requests, ``reload_weights``, ``/update_weight_version``, ``/resume``; a
    server found gone is dropped)."""

    route = "http"
    kinds = frozenset({"full"})

    def __init__(self, directory: Path, reload_all: Callable[[int], Awaitable[None]]) -> None:
        self.directory, self._reload_all = directory, reload_all

    async def stage(self, update: WeightUpdate) -> None:
        check_kind(self, update)
        await asyncio.to_thread(write_safetensors, update.tensors, self.directory)

    async def load(self, update: WeightUpdate) -> None:
        await self._reload_all(update.version)


__all__ = ["ServerReloadTransport", "VLLMServerEngine"]
