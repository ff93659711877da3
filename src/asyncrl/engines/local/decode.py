"""A decode batch: rows generated together over one KV cache, state on the device.

The host never waits for the device inside the decode loop. Each step enqueues
a forward pass, samples on the device (:mod:`asyncrl.engines.local.token_sampling`), writes
the token and its log-prob into device buffers, updates the rows' ``finished``
flags on the device, and starts a non-blocking copy of those flags to the host
(:class:`~asyncrl.policy.devices.HostCopy`). The host learns which rows stopped when a
copy has landed - on a GPU typically one step later - and then:

* copies the stopped rows' tokens and log-probs to the host in one transfer
  (also non-blocking), and
* drops them from the batch (device tensors and KV cache are re-indexed), so
  finished rows stop costing compute.

Rows that stopped but are not dropped yet keep being decoded (their tokens are
replaced by padding and never reported). A row cannot outrun its length limit
(``max_new_tokens`` less the tokens it continues from); at step ``limit``, the
largest of them, every row has stopped, which the host knows without asking the
device. On the CPU every copy is ready at once, so a row is dropped right after
the step that finished it.

A row *continues* a partial completion (a group resumed from a checkpoint) by
putting its tokens after the prompt: they are prefilled like the prompt.
Every step records the weight version it ran with, so each token's version is
known (:attr:`DecodeBatch.versions`).
"""

from __future__ import annotations

import inspect
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from asyncrl.engines.local.token_sampling import sample_tokens
from asyncrl.policy.devices import HostCopy
from asyncrl.record import Completion
from asyncrl.types import GenerationError, GenerationRequest


class DecodedGroup(Protocol):
    """What a batch reads from and writes to a group it decodes rows of (the
    local engine's groups satisfy it). Defined here, not imported from the
    engine, so that the batch does not depend on the engine that uses it."""

    request: GenerationRequest
    start_weight: int
    #: True once the group was aborted: the next step drops its rows.
    aborted: bool
    #: Completion ``i`` once row ``i`` ended, else None.
    done: Sequence[Completion | None]

    def open_indices(self) -> list[int]:
        """Called when the batch is made: the rows still to generate."""
        ...

    def context(self, i: int) -> list[int]:
        """Called at prefill: the token ids row ``i`` is prefilled with."""
        ...

    def remaining(self, i: int) -> int:
        """Called at prefill and when a row ends: the tokens row ``i`` may generate."""
        ...

    def add_row(self, i: int, tokens: list[int], logprobs: list[float], versions: list[int],
                finish_reason: str | None) -> None:
        """Called once per row, when its outputs reach the host."""
        ...


Row = tuple[DecodedGroup, int]  # (group, index of the completion in the group)


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward() keyword that takes the KV cache: ``cache`` in recent
    transformers, ``past_key_values`` before."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(output: Any) -> Any:
    """The KV cache a forward() returned (the attribute was renamed like the keyword)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


@dataclass(frozen=True)
class Sampling:
    """How every row of a batch samples: ``(temperature, top_p)``, the generator
    and the length limit."""

    temperature: float
    top_p: float
    rng: torch.Generator
    limit: int


@dataclass(frozen=True)
class ForwardArgs:
    """What the model's forward() takes, read once per engine."""

    cache_kw: str
    logits_to_keep: bool

    @classmethod
    def of(cls, model: torch.nn.Module) -> ForwardArgs:
        params = inspect.signature(model.forward).parameters
        return cls(cache_keyword(model), "logits_to_keep" in params)


class DecodeBatch:
    """Rows decoded together: left-padded ids, KV cache, outputs so far.

    Device state, never read by the host while decoding:

    * ``ids [rows, width + limit]``: the prompt (and the tokens a row continues
      from), left-padded to ``width``, then sampled token ``t`` in column
      ``width + t`` (left padding puts every row's next token in the same column);
    * ``mask`` (only when some prompt is padded) and ``positions``, which count
      real tokens only, so padding shifts no position;
    * ``logp [rows, limit]``: behavior log-probs; ``finished [rows]``;
    * ``cache``: covers ``ids[:, :width + t - 1]``; the last sampled token is
      fed at the next step. ``None`` means "prefill": run the whole of
      ``ids[:, :width + t]`` (at the start, and after a cache invalidation,
      with the weights held then).
    """

    def __init__(self, groups: list[DecodedGroup], *, pad_id: int, eos_id: int,
                 device: torch.device, sampling: Sampling, cache_epoch: int) -> None:
        #: Groups with rows here or outputs on the way (the engine removes them
        #: as they resolve).
        self.groups = list(groups)
        self.rows: list[Row] = [(g, i) for g in groups for i in g.open_indices()]
        self.sampling = sampling
        #: Steps the longest row may take; a row's own limit is ``g.remaining(i)``.
        self.limit = max((g.remaining(i) for g, i in self.rows), default=sampling.limit)
        self.pad_id, self.eos_id = pad_id, eos_id
        self.cache_epoch = cache_epoch
        #: The weight version pinned by the batch's group (deterministic mode), or None.
        self.pin = groups[0].request.weight_version if len(groups) == 1 else None
        self.width = max((len(g.context(i)) for g, i in self.rows), default=1)
        self.device = device
        self.ids: torch.Tensor | None = None  # device state: made by the first step
        self.cache: Any = None
        self.t = 0  # steps taken = tokens sampled per row
        #: Weight version of each step: token ``t`` of every row was sampled with
        #: ``versions[t]`` (unless pinned).
        self.versions: list[int] = []
        self._flags: deque[tuple[tuple[Row, ...], HostCopy]] = deque()
        self._outputs: deque[tuple[list[Row], HostCopy]] = deque()

    def _start(self) -> None:
        """Make the device state (in the engine's worker thread, like every step,
        so that it is made on the engine's stream)."""
        device = self.device
        width, limit, rows = self.width, self.limit, len(self.rows)
        # The left-padded rows as one nested list, made into one tensor: a torch
        # call per row would hold the interpreter (and its lock) once per row.
        pad, lengths, padded_rows = self.pad_id, [], []
        for g, i in self.rows:
            context = g.context(i)
            lengths.append(len(context))
            padded_rows.append([pad] * (width - len(context)) + context + [pad] * limit)
        ids = torch.tensor(padded_rows, dtype=torch.long)
        padded = min(lengths) < width
        mask = torch.tensor([[0] * (width - n) + [1] * (n + limit) for n in lengths],
                            dtype=torch.long) if padded else \
            torch.ones((len(lengths), width + limit), dtype=torch.long)
        # Rows with a shorter limit than the batch's (they continue a partial
        # completion) stop at it; without such rows no tensor at all.
        row_limit = [g.remaining(i) for g, i in self.rows]
        self.row_limit = (torch.tensor(row_limit).to(device, non_blocking=True)
                          if min(row_limit) < limit else None)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        # Non-blocking from pageable memory: the driver stages it, no device wait.
        self.ids = ids.to(device, non_blocking=True)
        self.positions = positions.to(device, non_blocking=True)
        # Without padding no mask at all: transformers then needs no look at it.
        self.mask = mask.to(device, non_blocking=True) if padded else None
        self.logp = torch.zeros((rows, limit), device=device)
        self.finished = torch.zeros(rows, dtype=torch.bool, device=device)

    @property
    def idle(self) -> bool:
        """No rows left and every output delivered: the batch can go."""
        return not self.rows and not self._outputs

    # ---------------------------------------------------------------- steps
    def step(self, model: torch.nn.Module, version: int, fwd: ForwardArgs) -> None:
        """One decoding step for every row: enqueue, never wait."""
        if self.ids is None:
            self._start()
        n = self.width + self.t
        if self.cache is None:  # prefill the prompt and the tokens so far
            ids, pos = self.ids[:, :n], self.positions[:, :n]
            extra = {"logits_to_keep": 1} if fwd.logits_to_keep else {}
        else:  # feed the last sampled token; the cache holds the rest
            ids, pos = self.ids[:, n - 1 : n], self.positions[:, n - 1 : n]
            extra = {fwd.cache_kw: self.cache}
        out = model(
            input_ids=ids,
            attention_mask=self.mask[:, :n] if self.mask is not None else None,
            position_ids=pos,
            use_cache=True,
            **extra,
        )
        self.cache = output_cache(out)
        s = self.sampling
        tokens, chosen = sample_tokens(out.logits[:, -1], s.temperature, s.top_p, s.rng)
        tokens = tokens.masked_fill(self.finished, self.pad_id)
        self.ids[:, n] = tokens
        self.logp[:, self.t] = chosen
        # Replaced, never written in place: a HostCopy on the CPU aliases it.
        finished = self.finished | (tokens == self.eos_id)
        if self.row_limit is not None:
            finished = finished | (self.row_limit <= self.t + 1)
        self.finished = finished
        self.t += 1
        self.versions.append(version)
        if self.t < self.limit:
            self._flags.append((tuple(self.rows), HostCopy(self.finished)))

    # ------------------------------------------------------- host bookkeeping
    def collect(self) -> None:
        """Start delivering the rows known to have stopped, and drop them and
        the rows of aborted groups from the batch."""
        if self.t >= self.limit:
            stopped = set(range(len(self.rows)))
        else:
            stopped = self._known_stopped()
        done = [r for r in sorted(stopped) if not self.rows[r][0].aborted]
        if done:
            idx = _index(done, self.device)
            tokens = self.ids.index_select(0, idx)[:, self.width : self.width + self.t]
            self._outputs.append(([self.rows[r] for r in done],
                                  HostCopy(tokens, self.logp.index_select(0, idx)[:, : self.t])))
        self._keep([r for r, (g, _) in enumerate(self.rows)
                    if r not in stopped and not g.aborted])

    def _known_stopped(self) -> set[int]:
        """Rows whose ``finished`` flag has reached the host (newest copy that
        landed), as indices into the current rows."""
        latest = None
        while self._flags and self._flags[0][1].ready():
            latest = self._flags.popleft()
        if latest is None:
            return set()
        rows_then, copy = latest
        flags = copy.host[0].tolist()
        stopped_then = {id(g): set() for g, _ in rows_then}
        for (g, i), stop in zip(rows_then, flags):
            if stop:
                stopped_then[id(g)].add(i)
        return {r for r, (g, i) in enumerate(self.rows) if i in stopped_then.get(id(g), ())}

    def _keep(self, keep: list[int]) -> None:
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[r] for r in keep]
        if self.ids is None:  # not started: nothing on the device yet
            return
        if not keep:
            self.cache = None
            return
        idx = _index(keep, self.device)
        self.ids, self.positions = self.ids[idx], self.positions[idx]
        self.logp, self.finished = self.logp[idx], self.finished[idx]
        if self.row_limit is not None:
            self.row_limit = self.row_limit[idx]
        if self.mask is not None:
            self.mask = self.mask[idx]
        if self.cache is not None:
            if hasattr(self.cache, "batch_select_indices"):
                self.cache.batch_select_indices(idx)
            else:  # legacy tuple-of-tuples cache
                self.cache = tuple(tuple(t[idx] for t in layer) for layer in self.cache)

    def deliver(self, *, wait: bool) -> None:
        """Hand the outputs whose copy has landed to their groups (waiting for
        the oldest one when ``wait``: the caller has nothing else to do)."""
        while self._outputs and (self._outputs[0][1].ready() or wait):
            rows, copy = self._outputs.popleft()
            tokens, logps = (t.tolist() for t in copy.wait())
            for (group, i), toks, lps in zip(rows, tokens, logps):
                n, reason = self._ending(toks, group.remaining(i))
                group.add_row(i, toks[:n], lps[:n], self._token_versions(group, n), reason)
            wait = False

    def _ending(self, tokens: list[int], limit: int) -> tuple[int, str | None]:
        """How many of a row's ``tokens`` are its own, and why it ended there
        (None: it has not ended yet)."""
        head = tokens[:limit]
        if self.eos_id in head:
            return head.index(self.eos_id) + 1, "stop"
        return len(head), ("length" if len(head) >= limit else None)

    def _token_versions(self, group: DecodedGroup, n: int) -> list[int]:
        if group.request.weight_version is not None:  # pinned: every step used the pin
            return [group.start_weight] * n
        return self.versions[:n]

    def read_rows(self, group: DecodedGroup) -> dict[int, tuple[list[int], list[float], list[int],
                                                           str | None]]:
        """The tokens so far of ``group``'s rows still in this batch, by
        completion index: ``(tokens, logprobs, versions, finish_reason)``.

        Called between steps (in the engine's thread), after :meth:`flush`;
        reads the device state back to the host, waiting for it.
        """
        found = [(r, i) for r, (g, i) in enumerate(self.rows) if g is group]
        if not found or self.ids is None:
            return {i: ([], [], [], None) for _, i in found}
        idx = _index([r for r, _ in found], self.device)
        tokens = self.ids.index_select(0, idx)[:, self.width : self.width + self.t].tolist()
        logps = self.logp.index_select(0, idx)[:, : self.t].tolist()
        out = {}
        for (_, i), toks, lps in zip(found, tokens, logps):
            n, reason = self._ending(toks, group.remaining(i))
            out[i] = (toks[:n], lps[:n], self._token_versions(group, n), reason)
        return out

    def flush(self) -> None:
        """Deliver every output on its way (waiting for it)."""
        while self._outputs:
            self.deliver(wait=True)

    @property
    def waiting_for_outputs(self) -> bool:
        return bool(self._outputs)


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long).to(device, non_blocking=True)


def check_finite(group: DecodedGroup) -> GenerationError | None:
    """A finished group whose behavior log-probs are not all finite (the model
    produced NaN or infinite logits) fails instead of training on garbage."""
    for row in group.done:
        if row is not None and not all(math.isfinite(lp) for lp in row.logprobs):
            return GenerationError(
                f"group {group.request.group_id!r}: the model produced non-finite "
                "log-probs (NaN or infinite logits); check the weights it was sent"
            )
    return None
