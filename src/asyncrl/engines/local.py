"""``LocalEngine``: batched sampling from a transformers causal LM, in-process.

How it works, top to bottom:

* ``generate`` turns a request into a *group* (``num_generations`` rows sharing
  one prompt), queues it and waits on the group's future.
* One scheduler coroutine runs *ticks* in a single worker thread. A tick does one
  decoding step - one forward pass and one sampled token per row - for every
  active *batch* (rows that share a KV cache). Between ticks the scheduler starts
  queued groups as a new batch, resolves finished groups and lets weight updates,
  cache invalidations and aborts in. So a weight update never lands mid-forward,
  and a group that spans one reports ``end_weight > start_weight``.
* Everything that touches the model (ticks, weight loads) runs in that one
  thread, in submission order: a weight update waits for at most one tick.

Sampling is from ``softmax(logits / temperature)`` restricted to the top-p
nucleus and renormalised; ``behavior_logprobs`` are log-probs under exactly that
distribution. A row ends at EOS (which is kept in ``completion_ids``: the policy
must learn to stop) or after ``max_new_tokens`` tokens.

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
import copy
import inspect
from collections import deque
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from asyncrl.config import GenerationConfig
from asyncrl.tasks.tokenizer import Tokenizer, encode_prompt
from asyncrl.types import GenerationError, GenerationRequest, GroupAborted, GroupId, GroupResult

if TYPE_CHECKING:
    from asyncrl.config import RunConfig


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward() keyword that takes the KV cache: ``cache`` in recent
    transformers, ``past_key_values`` before."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(output: Any) -> Any:
    """The KV cache a forward() returned (the attribute was renamed like the keyword)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs ``[rows, vocab]`` of the distribution the engine samples from.

    ``softmax(logits / temperature)``, then, when ``top_p < 1``, only the
    smallest set of most likely tokens whose mass reaches ``top_p`` is kept
    (a token stays if the mass of the tokens ranked above it is below
    ``top_p``, so the top token always stays) and the rest get ``-inf``;
    the kept ones are renormalised to sum to one.
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    sorted_p = sorted_logp.exp()
    drop_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


class _Group:
    """One request being generated: its rows' tokens so far, and its future."""

    def __init__(
        self,
        request: GenerationRequest,
        future: asyncio.Future,
        prompt_ids: list[int],
        start_weight: int,
        generation: GenerationConfig,
    ) -> None:
        self.request = request
        self.future = future
        self.prompt_ids = prompt_ids
        self.start_weight = start_weight
        self.end_weight = start_weight
        n = request.num_generations
        self.completions: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] = [[] for _ in range(n)]
        self.open_rows = n
        self.aborted = False
        # Seeded groups draw from their own generator: their samples do not
        # depend on how many other rows were sampled before them.
        self.rng = None if request.seed is None else torch.Generator().manual_seed(request.seed)
        # The request's sampling overrides, else the engine's configuration.
        self.sampling = (
            generation.temperature if request.temperature is None else request.temperature,
            generation.top_p if request.top_p is None else request.top_p,
        )
        self.limit = (generation.max_new_tokens if request.max_new_tokens is None
                      else request.max_new_tokens)


class _Batch:
    """Rows decoded together: left-padded token ids, attention mask and KV cache.

    ``ids`` holds the prompt and every token sampled so far. When ``cache`` is
    set it covers ``ids[:, :-1]``: the last sampled token is fed at the next tick.
    ``cache is None`` means "prefill": run the whole of ``ids`` (at the start, and
    after a cache invalidation, with the weights held then).
    """

    def __init__(
        self, groups: list[_Group], pad_id: int, cache_epoch: int,
        sampling: tuple[float, float],
    ) -> None:
        #: Groups not yet finished (their rows may already be gone: aborted).
        self.groups = list(groups)
        #: (temperature, top_p) every row of the batch samples with.
        self.sampling = sampling
        self.rows = [(g, i) for g in groups for i in range(g.request.num_generations)]
        width = max(len(g.prompt_ids) for g in groups)
        self.ids = torch.full((len(self.rows), width), pad_id, dtype=torch.long)
        self.mask = torch.zeros((len(self.rows), width), dtype=torch.long)
        for r, (g, _) in enumerate(self.rows):
            n = len(g.prompt_ids)
            # Left padding: every row's next token goes in the same column.
            self.ids[r, width - n :] = torch.tensor(g.prompt_ids)
            self.mask[r, width - n :] = 1
        self.cache: Any = None
        self.cache_epoch = cache_epoch

    def keep(self, keep: list[int]) -> None:
        """Keep only the rows at ``keep`` (drop finished and aborted rows)."""
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        idx = torch.tensor(keep, dtype=torch.long)
        self.ids, self.mask = self.ids[idx], self.mask[idx]
        if self.cache is not None and keep:
            if hasattr(self.cache, "batch_select_indices"):
                self.cache.batch_select_indices(idx)
            else:  # legacy tuple-of-tuples cache
                self.cache = tuple(tuple(t[idx] for t in layer) for layer in self.cache)


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
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.generation = generation or GenerationConfig()
        self._version = weight_version
        self._device = next(model.parameters()).device
        self._cache_kw = cache_keyword(model)
        self._logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        # Unseeded groups share one generator (seeded by the run seed).
        self._rng = torch.Generator().manual_seed(seed)

        def init_thread() -> None:
            if num_threads is not None:
                torch.set_num_threads(num_threads)

        self._executor = ThreadPoolExecutor(
            1, thread_name_prefix="asyncrl-engine", initializer=init_thread
        )
        self._groups: dict[GroupId, _Group] = {}  # every group not yet resolved
        self._pending: deque[_Group] = deque()  # groups waiting for a batch
        self._active: list[_Batch] = []
        self._wakeup = asyncio.Event()
        self._scheduler: asyncio.Task | None = None
        self._closed = False
        #: Bumped by invalidate_cache; a batch whose cache is older re-prefills.
        self._cache_epoch = 0
        #: Deterministic mode: a copy of every weight version loaded, until the
        #: controller says it is no longer needed (retain_weight_versions), so a
        #: request pinned to one (GenerationRequest.weight_version) is generated
        #: with exactly those weights, whatever the engine holds now.
        self.pin_versions = pin_versions
        self._snapshots: dict[int, dict[str, torch.Tensor]] = {}
        self._pinned_models: dict[int, torch.nn.Module] = {}
        if pin_versions:
            self._snapshots[weight_version] = {
                k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()
            }

    @classmethod
    def from_config(
        cls, cfg: RunConfig, *, model: torch.nn.Module, tokenizer: Tokenizer
    ) -> LocalEngine:
        """The engine for a run, over ``model`` (built by :func:`asyncrl.policy.build_policy`;
        the engine owns it, so pass a copy of the trainer's)."""
        return cls(
            model,
            tokenizer,
            cfg.policy.generation,
            seed=cfg.seed,
            num_threads=cfg.policy.num_threads,
            pin_versions=cfg.deterministic,
        )

    # ------------------------------------------------------------ protocol
    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(self, request: GenerationRequest) -> GroupResult:
        if self._closed:
            raise RuntimeError("LocalEngine.generate called after close()")
        if request.group_id in self._groups:
            raise ValueError(f"group {request.group_id!r} is already being generated")
        if request.num_generations < 1:
            raise ValueError(f"num_generations must be >= 1, got {request.num_generations}")
        prompt_ids = encode_prompt(self.tokenizer, request.prompt.text)
        start = self._version
        if request.weight_version is not None:
            if request.weight_version not in self._snapshots:
                raise GenerationError(
                    f"group {request.group_id!r} is pinned to weight version "
                    f"{request.weight_version}, which this engine no longer holds (it keeps "
                    f"{sorted(self._snapshots)}); deterministic runs need "
                    "LocalEngine(pin_versions=True), and the controller to retain the version"
                )
            start = request.weight_version
        group = _Group(request, asyncio.get_running_loop().create_future(), prompt_ids, start,
                       self.generation)
        self._groups[request.group_id] = group
        self._pending.append(group)
        if self._scheduler is None:
            self._scheduler = asyncio.create_task(self._run_ticks(), name="asyncrl-engine")
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
        # Queued behind the running tick, so it lands between two decoding steps.
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self._load_weights, weights, version
        )

    async def abort(self, group_ids: Sequence[GroupId]) -> None:
        for gid in group_ids:
            group = self._groups.get(gid)
            if group is not None:
                self._abort(group)

    async def invalidate_cache(self) -> None:
        # Every active batch re-prefills (prompt + tokens so far) at its next step,
        # with the weights held then. Nothing crosses threads but this counter.
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
    def _forget(self, group: _Group) -> None:
        # A retry may reuse the group id: only remove this very attempt.
        if self._groups.get(group.request.group_id) is group:
            del self._groups[group.request.group_id]

    def _abort(self, group: _Group) -> None:
        group.aborted = True  # the next tick drops its rows
        self._forget(group)
        if group in self._pending:
            self._pending.remove(group)
        if not group.future.done():
            group.future.set_exception(GroupAborted(f"group {group.request.group_id!r} aborted"))

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
            try:
                await loop.run_in_executor(self._executor, self._tick, batches)
            except Exception as exc:
                # A failed forward fails the groups it was decoding; the
                # controller retries them. Later groups are unaffected.
                for batch in batches:
                    self._active.remove(batch)
                    for group in batch.groups:
                        self._forget(group)
                        if not group.future.done():
                            group.future.set_exception(
                                GenerationError(f"generation failed: {exc!r}")
                            )
                continue
            for batch in batches:
                for group in [g for g in batch.groups if g.open_rows == 0 or g.aborted]:
                    batch.groups.remove(group)
                    self._finish(group)
                if not batch.rows:
                    self._active.remove(batch)

    def _start_pending(self) -> None:
        """Move queued groups into new batches while the row budget allows."""
        budget = self.generation.max_batch_sequences - sum(len(b.rows) for b in self._active)
        default = (self.generation.temperature, self.generation.top_p)
        shared: list[_Group] = []
        while self._pending:
            n = self._pending[0].request.num_generations
            # A group larger than the whole budget still runs, alone.
            if n > budget and (self._active or shared):
                break
            group = self._pending.popleft()
            budget -= n
            # Seeded groups and groups with their own sampling parameters get a
            # batch of their own (a batch samples all its rows one way).
            if group.rng is None and group.sampling == default:
                shared.append(group)
            else:
                self._active.append(
                    _Batch([group], self.tokenizer.pad_id, self._cache_epoch, group.sampling))
        if shared:
            self._active.append(_Batch(shared, self.tokenizer.pad_id, self._cache_epoch, default))

    def _finish(self, group: _Group) -> None:
        self._forget(group)
        if group.future.done():  # aborted or cancelled meanwhile
            return
        eos = self.tokenizer.eos_id
        try:
            texts = [
                self.tokenizer.decode(c[:-1] if c and c[-1] == eos else c)
                for c in group.completions
            ]
        except Exception as exc:
            group.future.set_exception(GenerationError(f"decoding a completion failed: {exc!r}"))
            return
        group.future.set_result(
            GroupResult(
                group_id=group.request.group_id,
                prompt_ids=group.prompt_ids,
                completion_ids=group.completions,
                behavior_logprobs=group.logprobs,
                completion_texts=texts,
                start_weight=group.start_weight,
                end_weight=group.end_weight,
            )
        )

    # ------------------------------------------------- worker-thread side
    def _load_weights(self, weights: Any, version: int) -> None:
        self.model.load_state_dict(weights)
        self._version = version
        if self.pin_versions:
            self._snapshots[version] = weights

    async def retain_weight_versions(self, versions: Collection[int]) -> None:
        """Deterministic mode: keep only these weight versions (and the current one).

        Called by the controller after every weight sync with the versions some
        live or future dispatch batch is pinned to.
        """
        keep = {*versions, self._version}
        await asyncio.get_running_loop().run_in_executor(self._executor, self._drop_versions, keep)

    def _drop_versions(self, keep: set[int]) -> None:
        for old in [v for v in self._snapshots if v not in keep]:
            del self._snapshots[old]
            self._pinned_models.pop(old, None)

    def retained_weights(self) -> dict[int, dict[str, torch.Tensor]]:
        """The weight versions kept for pinned requests (saved in checkpoints)."""
        return dict(self._snapshots)

    def restore_retained(self, snapshots: dict[int, dict[str, torch.Tensor]]) -> None:
        """Called on resume, after ``update_weights``: the older pinned versions."""
        for version, weights in snapshots.items():
            self._snapshots.setdefault(int(version), weights)

    def _model_for(self, batch: _Batch) -> torch.nn.Module:
        pin = batch.groups[0].request.weight_version if batch.groups else None
        if pin is None:
            return self.model
        # A pinned group always runs on its version's own copy, even when the
        # engine holds that version: the main model and a copy with equal weights
        # can differ in the last bits, and which one ran must not depend on timing.
        model = self._pinned_models.get(pin)
        if model is None:
            model = copy.deepcopy(self.model)
            model.load_state_dict(self._snapshots[pin])
            self._pinned_models[pin] = model
        return model

    @torch.inference_mode()
    def _tick(self, batches: list[_Batch]) -> None:
        for batch in batches:
            self._step(batch)

    def _step(self, batch: _Batch) -> None:
        """One decoding step for every row of ``batch``."""
        batch.keep([r for r, (g, _) in enumerate(batch.rows) if not g.aborted])
        if not batch.rows:
            return
        if batch.cache_epoch != self._cache_epoch:
            batch.cache, batch.cache_epoch = None, self._cache_epoch
        logits = self._next_logits(batch)
        temperature, top_p = batch.sampling
        if temperature == 0:  # greedy (evaluation): the chosen token has probability 1
            tokens = logits.argmax(dim=-1)
            chosen = torch.zeros(len(tokens))
        else:
            logp = sampling_logprobs(logits, temperature, top_p)
            tokens = self._sample(batch, logp.exp())
            chosen = logp.gather(1, tokens[:, None])[:, 0]
        batch.ids = torch.cat([batch.ids, tokens[:, None]], dim=1)
        batch.mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=1)

        keep = []
        eos = self.tokenizer.eos_id
        for r, (group, i) in enumerate(batch.rows):
            token = int(tokens[r])
            group.completions[i].append(token)
            group.logprobs[i].append(float(chosen[r]))
            pinned = group.request.weight_version is not None
            group.end_weight = group.start_weight if pinned else self._version
            if token == eos or len(group.completions[i]) >= group.limit:
                group.open_rows -= 1
            else:
                keep.append(r)
        batch.keep(keep)

    def _next_logits(self, batch: _Batch) -> torch.Tensor:
        # Positions count real tokens only, so left padding does not shift them.
        positions = (batch.mask.cumsum(dim=1) - 1).clamp(min=0)
        if batch.cache is None:  # prefill the whole sequence
            ids, pos = batch.ids, positions
            extra = {"logits_to_keep": 1} if self._logits_to_keep else {}
        else:  # feed the last sampled token; the cache holds the rest
            ids, pos = batch.ids[:, -1:], positions[:, -1:]
            extra = {self._cache_kw: batch.cache}
        out = self._model_for(batch)(
            input_ids=ids.to(self._device),
            attention_mask=batch.mask.to(self._device),
            position_ids=pos.to(self._device),
            use_cache=True,
            **extra,
        )
        batch.cache = output_cache(out)
        return out.logits[:, -1].float().cpu()

    def _sample(self, batch: _Batch, probs: torch.Tensor) -> torch.Tensor:
        tokens = torch.empty(len(batch.rows), dtype=torch.long)
        by_rng: dict[int, tuple[torch.Generator, list[int]]] = {}
        for r, (group, _) in enumerate(batch.rows):
            rng = group.rng if group.rng is not None else self._rng
            by_rng.setdefault(id(rng), (rng, []))[1].append(r)
        for rng, rows in by_rng.values():
            idx = torch.tensor(rows, dtype=torch.long)
            tokens[idx] = torch.multinomial(probs[idx], 1, generator=rng)[:, 0]
        return tokens
