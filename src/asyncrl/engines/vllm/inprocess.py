"""``VLLMEngine``: rollouts from vLLM's async engine (``AsyncLLM``), behind the
:class:`~asyncrl.engines.RolloutEngine` protocol. See docs/engines.md.

How the protocol maps onto vLLM:

* ``generate`` - one vLLM request per prompt group, ``n = num_generations``,
  fed the token ids of :func:`~asyncrl.tasks.tokenizer.encode_prompt` (the ids
  ``LocalEngine`` feeds), sampled with ``policy.generation``'s temperature, top-p
  and ``max_new_tokens`` (or the request's own, as evaluation sets them),
  stopping at EOS (kept in ``completion_ids``); a prompt for which
  ``prompt + max_new_tokens`` exceeds ``max_model_len`` raises ``PromptTooLong``
  instead of being cut short at it (the local engine has no such cut). vLLM runs
  with ``logprobs_mode="processed_logprobs"`` and ``logprobs=0``: the log-prob of
  each sampled token under the distribution it was sampled from, after
  temperature and top-p - exactly what ``LocalEngine`` reports. Concurrent
  calls are separate requests that vLLM batches (continuous batching).
* ``update_weights`` - generation is paused with running requests kept, the
  weights are loaded, vLLM's weight-version label and :attr:`weight_version`
  are set, then generation resumes: the version this engine reports and the
  weights it samples with change together, with no token generated in between.
  The weights travel by the route ``policy.vllm.weight_transport`` picks
  (:mod:`asyncrl.engines.vllm.transport`): safetensors in a directory and
  vLLM's ``reload_weights`` (``disk``, on CPU and CUDA), or CUDA IPC handles
  through vLLM's weight-transfer API (``ipc``, one GPU).
* Prefix cache: a request's ``cache_salt`` is the version it was submitted
  under, so a new prompt never reuses KV blocks computed with other weights.
  ``invalidate_cache`` preempts the running requests, which then recompute their
  KV with the new weights. With ``recompute_kv_on_update`` that happens inside
  every update, while generation is paused: no token is sampled from new
  weights over KV of old ones.
* Per-token versions - vLLM labels each output token with the weight version
  that sampled it (``update_weight_version``); every token of the record carries
  its label. Finish reasons are vLLM's (``stop`` at EOS, ``length``).
* Requests stream their output (:mod:`asyncrl.engines.vllm.stream`), so
  ``abort`` (vLLM's abort) leaves each group the tokens it had: the aborted
  ``generate`` raises ``GroupAborted`` with them as ``partial``, and
  ``snapshot`` reads them without stopping the group. A request with a
  ``prefix`` continues its completions (prompt + prefix as prompt token ids, the
  remaining ``max_new_tokens``).
* ``pressure`` - requests running and waiting and preemptions as vLLM's
  scheduler reported them after its latest step, and the highest KV-cache
  usage since the last call (a stat logger vLLM calls;
  :mod:`asyncrl.engines.vllm.pressure`).
* ``close`` - shuts vLLM down; a reaper process kills its processes if this
  one dies without closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import shutil
import tempfile
import time
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl._util.bounded import append_bounded
from asyncrl.config import GenerationConfig
from asyncrl.engines.capabilities import EnginePressure
from asyncrl.engines.classify import encode_prompt_or_fail, vllm_failure
from asyncrl.engines.completions import (
    partial_result,
    refuse_pinned,
    start_weight,
    with_texts,
)
from asyncrl.engines.transport import WeightUpdate
from asyncrl.engines.vllm import setup
from asyncrl.engines.vllm import transport as transports
from asyncrl.engines.vllm.output import VLLMOutput, quiet_import
from asyncrl.engines.vllm.pressure import PressureGauge, stat_loggers
from asyncrl.engines.vllm.stream import Run, Sub, live_version_starts
from asyncrl.errors import BackendLost, ConfigError, GroupAborted
from asyncrl.policy.context_length import check_prompt_fits
from asyncrl.tasks.tokenizer import Tokenizer
from asyncrl.types import GenerationRequest, GroupId, GroupResult

if TYPE_CHECKING:
    import torch

    from asyncrl.config import PolicyConfig
    from asyncrl.engines.options import EngineOptions

log = logging.getLogger("asyncrl.engines.vllm")


class VLLMEngine:
    """A :class:`~asyncrl.engines.RolloutEngine` over a vLLM ``AsyncLLM``.

    Build it with :meth:`for_policy` (from a run config) or directly from
    ``vllm.AsyncEngineArgs`` keyword arguments (see
    :func:`~asyncrl.engines.vllm.setup.engine_args`). Starting vLLM takes tens
    of seconds and spawns processes: scripts must build the engine under
    ``if __name__ == "__main__":``. Use it from one event loop only.
    """

    def __init__(
        self,
        args: Mapping[str, Any],
        tokenizer: Tokenizer,
        generation: GenerationConfig | None = None,
        *,
        weight_version: int = 0,
        owned_dirs: Sequence[Path] = (),
        isolate_cores: bool = False,
        log_file: str | Path | None = None,
        recompute_kv_on_update: bool = False,
        weight_transport: str = "auto",
    ) -> None:
        setup.require_vllm()
        with quiet_import():
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.platforms import current_platform
            from vllm.v1.engine.async_llm import AsyncLLM

        #: vLLM's own output: ``log_file`` unless asyncrl is verbose (see vllm/output.py).
        self._output = VLLMOutput(log_file)
        #: vLLM's newest scheduler numbers and KV-cache peak (what ``pressure`` reports).
        self._gauge = PressureGauge()

        self.tokenizer = tokenizer
        self.generation = generation or GenerationConfig()
        self._version = weight_version
        #: vLLM labels tokens "default" until the first update sets a version.
        self._first_version = weight_version
        self.recompute_kv_on_update = recompute_kv_on_update
        self._owned_dirs = [Path(d) for d in owned_dirs]
        #: How weights reach vLLM: "ipc" or "disk" (policy.vllm.weight_transport).
        self.weight_route = transports.choose_route(
            weight_transport, cuda=bool(current_platform.is_cuda()),
            tensor_parallel_size=args.get("tensor_parallel_size", 1))
        args = {**args, "logprobs_mode": "processed_logprobs"}
        if self.weight_route == "ipc":
            args = transports.ipc_engine_args(args)
        before = setup.descendants()
        try:
            # In a session of its own: a terminal's Ctrl-C reaches asyncrl only.
            with setup.own_session(self._output.stream):
                self._llm = AsyncLLM.from_engine_args(
                    AsyncEngineArgs(**args), stat_loggers=stat_loggers(self._gauge))
        except Exception as exc:
            setup.Reaper(setup.descendants() - before).reap()
            setup.settle_spawned()
            self._remove_dirs()
            self._output.close()
            raise ConfigError(
                f"vLLM failed to start ({exc!r}; {self._output.where()} has the cause). On CPU "
                "the usual cause is memory: policy.vllm.gpu_memory_utilization is the "
                "fraction of the NUMA node's memory vLLM may use for the model, its "
                "activations and the KV cache - raise it for a larger model, lower it "
                "when other processes need the memory"
            ) from exc
        self._output.announce()
        self._reaper = setup.Reaper(setup.descendants() - before)
        self._former_cores = setup.isolate_cores(self._reaper.pids) if isolate_cores else None
        self._weights_dir = Path(tempfile.mkdtemp(prefix="asyncrl-vllm-weights-"))
        self._owned_dirs.append(self._weights_dir)
        self._transport = transports.transport_for(self.weight_route, self._llm, self._control,
                                                   self._weights_dir)
        self._request_ids = itertools.count()
        self._running: dict[GroupId, Run] = {}
        self._sync_lock = asyncio.Lock()
        self._closed = False
        #: Seconds each weight sync took (write, pause, load, resume), the newest ones
        #: of a long run; ``sync_count`` and ``sync_total_s`` count them all.
        self.sync_seconds: list[float] = []
        self.sync_count = 0
        self.sync_total_s = 0.0

    @classmethod
    def for_policy(
        cls,
        policy: PolicyConfig,
        options: EngineOptions,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        *,
        weights: Mapping[str, Any] | None = None,
        weight_version: int = 0,
    ) -> VLLMEngine:
        """The engine for a policy, starting from ``model`` (or ``weights``).

        vLLM loads a Hugging Face directory: ``policy.model_name_or_path`` itself
        when its files hold the starting weights, else ``model`` (with ``weights``)
        saved into ``options.work_dir/vllm_model`` (a temporary directory when None).
        """
        from asyncrl.policy.hf import save_policy

        setup.check_config(policy)
        owned: list[Path] = []
        work_dir = options.work_dir
        if policy.model_name_or_path is not None and weights is None:
            model_dir = Path(policy.model_name_or_path).expanduser()
        else:
            if work_dir is None:
                base = Path(tempfile.mkdtemp(prefix="asyncrl-vllm-model-"))
                owned.append(base)
            else:
                base = Path(work_dir)
            model_dir = save_policy(model, tokenizer, base / "vllm_model", state_dict=weights)
        args = setup.engine_args(policy, model_dir, seed=options.seed)
        return cls(args, tokenizer, policy.generation, weight_version=weight_version,
                   owned_dirs=owned, isolate_cores=policy.vllm.isolate_cpu_cores,
                   log_file=None if work_dir is None else Path(work_dir) / "vllm.log",
                   recompute_kv_on_update=options.recompute_kv_on_update,
                   weight_transport=policy.vllm.weight_transport)

    # ------------------------------------------------------------ protocol
    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def context_length(self) -> int:
        """Longest prompt + completion vLLM takes (its ``max_model_len``); a group
        that does not fit raises PromptTooLong, as in every engine."""
        return int(self._llm.model_config.max_model_len)

    @property
    def healthy(self) -> bool:
        return not self._closed and not self._llm.errored

    @property
    def process_ids(self) -> set[int]:
        """Pids of the processes vLLM started for this engine (engine core, workers)."""
        return set(self._reaper.pids)

    @property
    def num_unfinished_requests(self) -> int:
        """Sequences vLLM holds (running or queued; a group counts once per
        completion); 0 once every group is done or aborted."""
        return 0 if self._closed else self._llm.get_num_unfinished_requests()

    async def pressure(self) -> EnginePressure | None:
        """vLLM's load after its latest step, with the highest KV-cache usage
        since the last call (:mod:`~asyncrl.engines.vllm.pressure`)."""
        return None if self._closed else self._gauge.read()

    async def generate(self, request: GenerationRequest) -> GroupResult:
        if self._closed:
            raise RuntimeError("VLLMEngine.generate called after close()")
        gid = request.group_id
        if gid in self._running:
            raise ValueError(f"group {gid!r} is already being generated")
        refuse_pinned(request, self._version, "vLLM")
        prompt_ids = encode_prompt_or_fail(self.tokenizer, request.prompt)
        limit = request.max_new_tokens or self.generation.max_new_tokens
        # Checked here, not left to vLLM: it would cut the completions at its
        # max_model_len, where the local engine has no such cut.
        check_prompt_fits(gid, len(prompt_ids), limit, self.context_length)
        run = Run.plan(request, prompt_ids, start=start_weight(request, self._version),
                       limit=limit, tag=f"{gid}/{request.attempt}/{next(self._request_ids)}")
        # Each request runs in a task of its own, so that cancelling this call
        # cancels them (cancelling vLLM's generate() aborts the request inside
        # vLLM and frees its KV blocks), also before vLLM has registered them.
        run.tasks = [asyncio.ensure_future(self._stream(run, sub)) for sub in run.subs]
        self._running[gid] = run
        try:
            await asyncio.gather(*run.tasks)
        except Exception as exc:  # vLLM's errors, classified where they are raised
            for task in run.tasks:  # the group's other requests end with it
                task.cancel()
            raise vllm_failure(exc, gid, where=self._output.where()) from exc
        finally:
            if self._running.get(gid) is run:
                del self._running[gid]
        completions = run.completions(self._label_version)
        if run.aborting or not all(c.finished for c in completions):
            raise GroupAborted(f"group {gid!r} aborted",
                               partial=partial_result(request, run.prompt_ids, run.start,
                                                      completions))
        return GroupResult(gid, run.prompt_ids, with_texts(self.tokenizer, completions),
                           run.start)

    async def _stream(self, run: Run, sub: Sub) -> None:
        """Run one vLLM request, adding what it streams to ``sub``."""
        from vllm.inputs import tokens_input

        if run.aborting:
            return
        stream = self._llm.generate(
            tokens_input(sub.prompt_ids, cache_salt=f"v{self._version}"),
            self._params(run.request, sub), sub.request_id)
        async with contextlib.aclosing(stream):
            async for out in stream:
                for completion in out.outputs:
                    sub.add(completion)
                if run.aborting and not out.finished:
                    # Aborted before vLLM registered it: closing the stream aborts it.
                    break

    async def update_weights(self, weights: Any, version: int) -> None:
        if self._closed:
            raise RuntimeError("VLLMEngine.update_weights called after close()")
        if version < self._version:
            raise ValueError(
                f"weight version must not go back (holds {self._version}, got {version})"
            )
        t0 = time.perf_counter()
        update = WeightUpdate(version, weights)
        async with self._sync_lock:
            await self._transport.stage(update)  # while generation goes on
            try:
                await self._control(self._llm.pause_generation(mode="keep", clear_cache=False))
                await self._transport.load(update)
                self._version = version
                await self._control(self._llm.update_weight_version(str(version)))
                if self.recompute_kv_on_update and self._llm.get_num_unfinished_requests():
                    # Still paused: the running requests recompute their KV with
                    # the new weights before they sample another token.
                    await self._control(self._llm.reset_prefix_cache(reset_running_requests=True))
                elif self._llm.get_num_unfinished_requests() == 0:
                    # Frees blocks of older weights at once (the salt already keeps
                    # new requests off them); with requests running it cannot.
                    await self._control(self._llm.reset_prefix_cache())
            except BaseException:
                # Cancelled, or the load failed: generation must not stay paused.
                with contextlib.suppress(BackendLost):
                    await self._control(self._llm.resume_generation())
                raise
            await self._control(self._llm.resume_generation())
        took = time.perf_counter() - t0
        append_bounded(self.sync_seconds, took)
        self.sync_count += 1
        self.sync_total_s += took

    async def abort(self, group_ids: Sequence[GroupId]) -> None:
        """vLLM aborts the groups' requests and hands back what they streamed:
        their ``generate`` raises GroupAborted with those tokens as ``partial``.
        Returns once vLLM has dropped the requests."""
        from vllm.v1.engine.exceptions import EngineDeadError

        runs = [self._running[g] for g in group_ids if g in self._running]
        for run in runs:
            run.aborting = True
        ids = [sub.request_id for run in runs for sub in run.subs]
        if ids and not self._llm.errored:
            with contextlib.suppress(EngineDeadError):
                await self._llm.abort(ids)
        await asyncio.gather(*(t for run in runs for t in run.tasks), return_exceptions=True)

    async def snapshot(self, group_ids: Sequence[GroupId]) -> dict[GroupId, GroupResult]:
        """The tokens each group still generating has streamed so far, without
        stopping it (called when a checkpoint is written)."""
        out = {}
        for gid in group_ids:
            run = self._running.get(gid)
            if run is not None:
                completions = run.completions(
                    self._label_version, lambda sub: live_version_starts(self._llm, sub.request_id))
                out[gid] = partial_result(run.request, run.prompt_ids, run.start, completions)
        return out

    async def invalidate_cache(self) -> None:
        if self.recompute_kv_on_update:
            return  # every update already recomputed the running requests' KV
        async with self._sync_lock:
            await self._control(self._llm.reset_prefix_cache(reset_running_requests=True))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.abort(list(self._running))
            self._llm.shutdown()  # SIGTERM, then SIGKILL for what is left after 5 s
            await setup.wait_exited(self._reaper.pids, timeout=5)
        finally:
            leftover = self._reaper.pids & setup.descendants()
            if leftover:
                log.warning("vLLM processes %s outlived shutdown; killing them", sorted(leftover))
                self._reaper.reap()
            else:
                self._reaper.release()
            setup.settle_spawned()
            if self._former_cores is not None:
                setup.restore_cores(self._former_cores)
            self._remove_dirs()
            self._output.close()
            # Dropped now, while the interpreter is whole: vLLM's __del__ shuts
            # down again, which fails during interpreter teardown.
            self._llm = None
        if self.sync_count:
            log.info("vLLM weight syncs: %d, mean %.3fs, max of the last %d %.3fs",
                     self.sync_count, self.sync_total_s / self.sync_count,
                     len(self.sync_seconds), max(self.sync_seconds))

    # ------------------------------------------------------------ helpers
    async def _control(self, call: Awaitable[Any]) -> Any:
        """Await a control call to vLLM's engine core (pause, load, reset, ...).

        vLLM never answers a call that was pending when its engine core died, so
        the call races vLLM's output handler, which ends exactly then: a dead
        engine raises BackendLost instead of hanging the run.
        """
        if self._closed or self._llm.errored:
            if asyncio.iscoroutine(call):
                call.close()  # never started: no "never awaited" warning
            if self._closed:
                raise RuntimeError("VLLMEngine used after close()")
            raise BackendLost(f"the vLLM engine is dead; {self._output.where()} says why")
        handler = self._llm.output_handler  # started by the first request
        task = asyncio.ensure_future(call)
        if handler is None:
            return await task
        try:
            await asyncio.wait({task, handler}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not task.done():
            task.cancel()
            raise BackendLost("the vLLM engine died during a control call; "
                              f"{self._output.where()} says why")
        return task.result()

    def _params(self, request: GenerationRequest, sub: Sub) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        g = self.generation
        # The request's overrides (evaluation sets them), as LocalEngine reads them.
        return SamplingParams(
            n=len(sub.indices),
            temperature=g.temperature if request.temperature is None else request.temperature,
            top_p=g.top_p if request.top_p is None else request.top_p,
            max_tokens=sub.max_tokens,
            stop_token_ids=[self.tokenizer.eos_id],
            logprobs=0,  # the sampled token's log-prob only
            seed=sub.seed,
            detokenize=False,  # texts come from our tokenizer, like LocalEngine's
            # Streamed: a stopped group keeps the tokens it has.
            output_kind=RequestOutputKind.DELTA,
        )

    def _label_version(self, label: str) -> int:
        """The weight version of a vLLM label ("default": the first weights)."""
        return int(label) if label.isdigit() else self._first_version

    def _remove_dirs(self) -> None:
        for d in self._owned_dirs:
            shutil.rmtree(d, ignore_errors=True)
