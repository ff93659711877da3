"""``LocalEngine``: batched sampling from a transformers causal LM, in-process.

How it works, top to bottom:

* ``generate`` turns a request into a *group* (``num_generations`` rows sharing
  one prompt), queues it and waits on the group's future.
* One scheduler coroutine runs *ticks* in a single worker thread. A tick does one
  decoding step - one forward pass and one sampled token per row - for every
  active *batch* (rows that share a KV cache, :mod:`asyncrl.engines.local.decode`).
  Between ticks the scheduler starts queued groups as a new batch, resolves
  finished groups and lets weight updates, cache invalidations and aborts in. So
  a weight update never lands mid-forward, and a group that spans one reports
  ``end_weight > start_weight``.
* Everything that touches the model (ticks, weight loads) runs in that one
  thread, in submission order: a weight update waits for at most one tick.
  Each decoding step records the weight version it ran with, so every token
  reports the version that sampled it (``Completion.versions``). With
  ``recompute_kv_on_update`` a weight load also drops every batch's KV cache in
  that thread, so the very next step re-prefills with the new weights: no token
  is ever sampled from new weights over KV computed with old ones. On
  CUDA the thread launches on a stream of its own, so generation overlaps with
  the trainer's work (:mod:`asyncrl.policy.devices`), and a tick only *enqueues* work:
  sampling and stopping happen on the device, and the host reads which rows
  stopped, and their tokens, from non-blocking copies once they land - never
  waiting for the GPU at a token. The model runs in its own dtype
  (``policy.dtype``); log-probs are computed in float32.

Sampling is from ``softmax(logits / temperature)`` restricted to the top-p
nucleus and renormalised (:mod:`asyncrl.engines.local.token_sampling`); ``behavior_logprobs``
are log-probs under exactly that distribution. A row ends at EOS (which is kept
in ``completion_ids``: the policy must learn to stop) or after
``max_new_tokens`` tokens (``finish_reason`` ``stop`` and ``length``). Groups
with the same sampling settings share a batch. A prompt too long for
``prompt + max_new_tokens`` to fit the model's context raises
:class:`~asyncrl.errors.PromptTooLong` (as in every engine: none ever cuts a
completion at the context, see :mod:`asyncrl.policy.context_length`).

Partial completions: :meth:`LocalEngine.snapshot` reads the tokens a group has
so far without stopping it (checkpoints), and :meth:`LocalEngine.abort` hands
them to the aborted ``generate`` (``GroupAborted.partial``). A request with a
``prefix`` continues those completions: their tokens are prefilled after the
prompt and ``max_new_tokens`` counts them.

Reproducibility: a request with a ``seed`` samples from its own
``torch.Generator`` and is decoded in a batch of its own, so its completions
depend only on (weights, prompt, seed, num_generations) - not on which other
groups run at the same time (batched matmuls are not bit-identical across batch
shapes, so sharing a batch could change the logits in the last bits). They stay
reproducible only if no weight update lands while the group generates.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

import torch

from asyncrl._util import supervision
from asyncrl.config import GenerationConfig
from asyncrl.engines.classify import encode_prompt_or_fail
from asyncrl.engines.completions import (
    partial_result,
    start_weight,
    with_texts,
)
from asyncrl.engines.local.decode import DecodeBatch, ForwardArgs, Sampling, check_finite
from asyncrl.engines.local.group import Group
from asyncrl.engines.local.token_sampling import sampling_logprobs
from asyncrl.engines.local.versions import PinnedVersions
from asyncrl.engines.transport import InProcessTransport, WeightUpdate
from asyncrl.errors import TokenizationError
from asyncrl.policy.context_length import check_prompt_fits, context_of
from asyncrl.policy.devices import check_device, worker_executor
from asyncrl.tasks.tokenizer import Tokenizer
from asyncrl.types import GenerationError, GenerationRequest, GroupAborted, GroupId, GroupResult

if TYPE_CHECKING:
    from asyncrl.config import PolicyConfig
    from asyncrl.engines.options import EngineOptions

__all__ = ["LocalEngine", "sampling_logprobs"]


class LocalEngine:
    """A :class:`~asyncrl.engines.RolloutEngine` that samples from a torch model
    in a background thread. The engine owns ``model``: pass it a copy, not the
    trainer's model (they run concurrently)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        generation: GenerationConfig | None = None,
        *,
        weight_version: int = 0,
        seed: int = 0,
        num_threads: int | None = None,
        pin_versions: bool = False,
        context_length: int | None = None,
        recompute_kv_on_update: bool = False,
    ) -> None:
        self.model = model.eval()
        #: How weight updates reach ``model`` (the ``in_process`` route).
        self.transport = InProcessTransport(self.model)
        #: Longest prompt + completion: a group that does not fit raises PromptTooLong
        #: (default: the model config's max_position_embeddings; None: no limit).
        self.context_length = (context_of(getattr(model, "config", None))
                               if context_length is None else context_length)
        self.tokenizer = tokenizer
        self.generation = generation or GenerationConfig()
        self._version = weight_version
        self._device = next(model.parameters()).device
        self._fwd = ForwardArgs.of(model)
        # Unseeded groups share one generator (seeded by the run seed), on the
        # model's device: sampling never leaves it.
        self._rng = torch.Generator(self._device).manual_seed(seed)
        self._executor, self._stream = worker_executor("engine", num_threads, self._device)
        self._groups: dict[GroupId, Group] = {}  # every group not yet resolved
        self._pending: deque[Group] = deque()  # groups waiting for a batch
        self._active: list[DecodeBatch] = []
        self._wakeup = asyncio.Event()
        self._scheduler: asyncio.Task | None = None
        self._closed = False
        #: Bumped by invalidate_cache (and by every weight load with
        #: recompute_kv_on_update); a batch whose cache is older re-prefills.
        self._cache_epoch = 0
        self.recompute_kv_on_update = recompute_kv_on_update
        #: Deterministic mode: the weight versions pinned requests may ask for.
        self._pinned = PinnedVersions(pin_versions, model, weight_version)

    @classmethod
    def from_config(
        cls, policy: PolicyConfig, options: EngineOptions, *, model: torch.nn.Module,
        tokenizer: Tokenizer, weight_version: int = 0,
    ) -> LocalEngine:
        """The engine for a policy, over ``model`` (built by :func:`asyncrl.policy.build.build_policy`;
        the engine owns it, so pass a copy of the trainer's), moved to
        ``policy.engine_device`` when that is set."""
        if policy.engine_device is not None:
            model = model.to(check_device(policy.engine_device, "policy.engine_device"))
        return cls(
            model,
            tokenizer,
            policy.generation,
            weight_version=weight_version,
            seed=options.seed,
            num_threads=policy.num_threads,
            pin_versions=options.pin_versions,
            recompute_kv_on_update=options.recompute_kv_on_update,
        )

    # ------------------------------------------------------------ protocol
    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def device(self) -> torch.device:
        """Where the engine's model is: weights handed to :meth:`update_weights`
        already there load without a trip through host memory."""
        return self._device

    async def generate(self, request: GenerationRequest) -> GroupResult:
        if self._closed:
            raise RuntimeError("LocalEngine.generate called after close()")
        if request.group_id in self._groups:
            raise ValueError(f"group {request.group_id!r} is already being generated")
        if request.num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {request.num_generations}")
        prompt_ids = encode_prompt_or_fail(self.tokenizer, request.prompt)
        if request.weight_version is not None:
            self._pinned.check(request.group_id, request.weight_version)
        group = Group(request, asyncio.get_running_loop().create_future(), prompt_ids,
                       start_weight(request, self._version), self.generation, self._device)
        check_prompt_fits(request.group_id, len(prompt_ids), group.limit, self.context_length)
        self._groups[request.group_id] = group
        if group.open_rows == 0:  # continues only finished completions
            self._finish(group)
            return await group.future
        self._pending.append(group)
        if self._scheduler is None:
            # Supervised by the run: if it ends with an error, the run hears of it.
            self._scheduler = supervision.spawn(self._run_ticks(), name="asyncrl-engine")
            self._scheduler.add_done_callback(self._scheduler_ended)
        self._wakeup.set()
        try:
            return await group.future
        except asyncio.CancelledError:
            self._abort(group)  # the caller gave up: stop spending compute on it
            raise

    async def update_weights(self, weights: Any, version: int) -> None:
        if version < self._version:
            raise ValueError(
                f"weight version must not go back (holds {self._version}, got {version})"
            )
        update = WeightUpdate(version, weights)
        await self.transport.stage(update)
        # Queued behind the running tick on the engine's thread, so it lands
        # between two decoding steps.
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self._load_weights, update
        )

    async def abort(self, group_ids: Sequence[GroupId]) -> None:
        """Stop the groups; their ``generate`` raises GroupAborted with the tokens
        they had (``partial``)."""
        groups = [g for g in map(self._groups.get, group_ids) if g is not None]
        if not groups:
            return
        partials = await self._partials(groups)
        for group, partial in zip(groups, partials):
            self._abort(group, partial)

    async def snapshot(self, group_ids: Sequence[GroupId]) -> dict[GroupId, GroupResult]:
        """The tokens each group still generating has so far, without stopping it
        (called when a checkpoint is written)."""
        groups = [g for g in map(self._groups.get, group_ids) if g is not None]
        partials = await self._partials(groups) if groups else []
        return {g.request.group_id: p for g, p in zip(groups, partials)}

    async def _partials(self, groups: list[Group]) -> list[GroupResult]:
        """Read the groups' tokens so far in the engine's thread, between two steps."""
        def read() -> list[dict[int, Any]]:
            for batch in {id(g.batch): g.batch for g in groups if g.batch is not None}.values():
                batch.flush()
            return [g.batch.read_rows(g) if g.batch is not None else {} for g in groups]

        rows = await asyncio.get_running_loop().run_in_executor(self._executor, read)
        return [partial_result(g.request, g.prompt_ids, g.start_weight, g.partial(r))
                for g, r in zip(groups, rows)]

    async def invalidate_cache(self) -> None:
        # Every active batch re-prefills (prompt + tokens so far) at its next step,
        # with the weights held then. Nothing crosses threads but this counter.
        if not self.recompute_kv_on_update:  # else the weight load already did
            self._cache_epoch += 1

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for group in list(self._groups.values()):
            self._abort(group)
        if self._scheduler is not None:
            self._scheduler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scheduler
        await asyncio.to_thread(self._executor.shutdown, wait=True)

    # ------------------------------------------------- event-loop side
    def _forget(self, group: Group) -> None:
        # A retry may reuse the group id: only remove this very attempt.
        if self._groups.get(group.request.group_id) is group:
            del self._groups[group.request.group_id]

    def _abort(self, group: Group, partial: GroupResult | None = None) -> None:
        group.aborted = True  # the next tick drops its rows
        self._forget(group)
        if group in self._pending:
            self._pending.remove(group)
        if not group.future.done():
            group.future.set_exception(
                GroupAborted(f"group {group.request.group_id!r} aborted", partial=partial))

    def _scheduler_ended(self, task: asyncio.Task[None]) -> None:
        """Supervision of the scheduler task: it ends only through :meth:`close`.

        Ending any other way (a bug outside the model calls, e.g. a tokenizer
        failing to decode, or a cancellation from outside) fails every waiting
        group with a :class:`GenerationError` (the controller retries it, and
        fails the run if it keeps happening) instead of leaving it waiting
        forever; the next ``generate`` starts a fresh scheduler.
        """
        if self._scheduler is task:
            self._scheduler = None
        if self._closed:
            return
        why = "it was cancelled" if task.cancelled() else f"{task.exception()!r}"
        waiting = [*self._groups.values(), *(g for b in self._active for g in b.groups)]
        for group in waiting:
            self._forget(group)
            if not group.future.done():
                group.future.set_exception(GenerationError(f"engine scheduler stopped: {why}"))
        self._pending.clear()
        self._active.clear()

    async def _run_ticks(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending and not self._active:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            self._start_pending()
            batches = list(self._active)
            failed = await loop.run_in_executor(self._executor, self._tick, batches)
            for batch in batches:
                exc = failed.get(id(batch))
                if exc is not None:
                    # A failed forward fails the groups it was decoding; other
                    # batches are unaffected. Torch reports device failures (out of
                    # memory, a CUDA error) as RuntimeError: infra, retried. Any
                    # other error is a bug and reaches the controller as it is.
                    self._active.remove(batch)
                    for group in batch.groups:
                        self._forget(group)
                        if not group.future.done():
                            group.future.set_exception(
                                GenerationError(f"generation failed: {exc!r}")
                                if isinstance(exc, RuntimeError) else exc)
                    continue
                for group in [g for g in batch.groups if g.open_rows == 0 or g.aborted]:
                    batch.groups.remove(group)
                    self._finish(group)
                if batch.idle:
                    self._active.remove(batch)

    def _start_pending(self) -> None:
        """Move queued groups into new batches while the row budget allows."""
        budget = self.generation.max_batch_sequences - sum(len(b.rows) for b in self._active)
        shared: dict[tuple, list[Group]] = {}
        while self._pending:
            n = self._pending[0].request.num_generations
            # A group larger than the whole budget still runs, alone.
            if n > budget and (self._active or shared):
                break
            group = self._pending.popleft()
            budget -= n
            # A batch samples all its rows one way: groups share one when their
            # sampling parameters and length limit agree. Seeded and pinned
            # groups get a batch of their own (see the module docstring).
            if group.rng is None and group.request.weight_version is None:
                shared.setdefault((group.sampling, group.limit), []).append(group)
            else:
                self._active.append(self._batch([group], group.rng))
        for groups in shared.values():
            self._active.append(self._batch(groups, self._rng))

    def _batch(self, groups: list[Group], rng: torch.Generator) -> DecodeBatch:
        temperature, top_p = groups[0].sampling
        batch = DecodeBatch(
            groups, pad_id=self.tokenizer.pad_id, eos_id=self.tokenizer.eos_id,
            device=self._device, sampling=Sampling(temperature, top_p, rng, groups[0].limit),
            cache_epoch=self._cache_epoch,
        )
        for group in groups:
            group.batch = batch
        return batch

    def _finish(self, group: Group) -> None:
        self._forget(group)
        if group.future.done():  # aborted or cancelled meanwhile
            return
        error = check_finite(group)
        if error is not None:
            group.future.set_exception(error)
            return
        try:
            completions = with_texts(self.tokenizer, [d for d in group.done if d is not None])
        except TokenizationError as exc:
            group.future.set_exception(exc)
            return
        group.future.set_result(GroupResult(group.request.group_id, group.prompt_ids,
                                            completions, group.start_weight))

    # ------------------------------------------------- worker-thread side
    def _load_weights(self, update: WeightUpdate) -> None:
        weights, version = update.tensors, update.version
        self.transport.load_now(update)
        if self.recompute_kv_on_update:  # before any step can run with the new weights
            self._cache_epoch += 1
        self._version = version
        self._pinned.record(version, weights)

    async def retain_weight_versions(self, versions: Collection[int]) -> None:
        """Deterministic mode: keep only these weight versions (and the current one).

        Called by the controller after every weight sync with the versions some
        live or future dispatch batch is pinned to.
        """
        keep = {*versions, self._version}
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self._pinned.keep_only, keep)

    def retained_weights(self) -> dict[int, dict[str, torch.Tensor]]:
        """The weight versions kept for pinned requests (saved in checkpoints)."""
        return self._pinned.snapshots()

    def restore_retained(self, snapshots: dict[int, dict[str, torch.Tensor]]) -> None:
        """Called on resume, after ``update_weights``: the older pinned versions."""
        self._pinned.restore(snapshots)

    @torch.inference_mode()
    def _tick(self, batches: list[DecodeBatch]) -> dict[int, Exception]:
        """One decoding step for every batch; the failures, by ``id(batch)``."""
        failed: dict[int, Exception] = {}
        stepped = False
        for batch in batches:
            try:
                batch.collect()  # aborted rows go before the step
                if batch.rows:
                    if batch.cache_epoch != self._cache_epoch:
                        batch.cache, batch.cache_epoch = None, self._cache_epoch
                    model = (self.model if batch.pin is None
                             else self._pinned.model(batch.pin, self.model))
                    batch.step(model, self._version, self._fwd)
                    stepped = True
                    batch.collect()  # on the CPU the flags are there at once
                batch.deliver(wait=False)
            except Exception as exc:
                failed[id(batch)] = exc
        if not stepped:
            # Nothing left to launch: wait for outputs still on their way
            # instead of spinning (at most once per batch, at its end).
            for batch in batches:
                if id(batch) not in failed and batch.waiting_for_outputs:
                    batch.deliver(wait=True)
                    break
        return failed

