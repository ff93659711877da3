"""Fakes that satisfy asyncrl's backend protocols, for controller tests.

They take virtual time (``tests.vtime.advance``, which refuses a delay on a real
loop) and record what
the controller did to them, so tests can check weight-sync order, aborts and
cache invalidation.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.engines.capabilities import EnginePressure
from asyncrl.errors import GenerationError, RewardError
from asyncrl.types import Completion, GenerationRequest, GroupAborted, GroupResult, Prompt, Rollout
from tests.vtime import advance


class FakeSource:
    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.position = 0

    def next_prompt(self) -> Prompt | None:
        if self.limit is not None and self.position >= self.limit:
            return None
        prompt = Prompt(self.position, f"p{self.position}", answer=self.position % 7)
        self.position += 1
        return prompt

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


class FakeTask:
    name = "fake"
    target_reward = 1.0

    def __init__(self, num_prompts: int | None = None) -> None:
        self.num_prompts = num_prompts

    def prompt_source(self, seed: int) -> FakeSource:
        return FakeSource(self.num_prompts)

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 1.0 if completion == str(prompt.answer) else 0.0


class FlatTask(FakeTask):
    """Most groups carry no signal: a prompt is *flat* with probability ``rate``
    (decided by its id, so a retry or a resumed run agrees) and then every
    completion gets the same reward (0 or 1, by the id's parity: too hard or too
    easy). Other prompts get FakeTask's rewards, which differ across the
    FakeEngine's completions whenever there are two or more."""

    def __init__(self, rate: float, num_prompts: int | None = None) -> None:
        super().__init__(num_prompts)
        self.rate = rate

    def flat(self, prompt_id: int) -> bool:
        return random.Random(prompt_id * 7919 + 17).random() < self.rate

    def reward(self, prompt: Prompt, completion: str) -> float:
        if self.flat(prompt.prompt_id):
            return float(prompt.prompt_id % 2)
        return super().reward(prompt, completion)


class InlineScorer:
    """A Scorer that scores on the event loop, after ``delay`` virtual seconds.

    The default scorer uses a worker thread, whose completion would land at a
    real-time-dependent point of a virtual-time test; this one keeps controller
    tests deterministic. ``fail(prompt)`` makes scoring raise a RewardError.
    """

    def __init__(self, task: FakeTask, delay: float = 0.0,
                 fail: Callable[[Prompt], bool] | None = None) -> None:
        self.task = task
        self.delay = delay
        self.fail = fail or (lambda _p: False)
        self.calls = 0

    async def score(self, prompt: Prompt, completions: Sequence[str]) -> list[float]:
        self.calls += 1
        if self.delay:
            await advance(self.delay)
        if self.fail(prompt):
            raise RewardError(f"injected reward failure for prompt {prompt.prompt_id}")
        return [self.task.reward(prompt, c) for c in completions]

    async def close(self) -> None:
        return None


Latency = Callable[[GenerationRequest], float]


class FakeEngine:
    """Generates after ``latency(request)`` virtual seconds; may fail on purpose:
    ``fail(request)`` true raises ``error`` (an infra GenerationError by default).

    Completions are one token long, or ``lengths(request)[i]`` tokens; one as long
    as ``max_new_tokens`` ends with ``finish_reason`` length (cut off)."""

    def __init__(
        self,
        latency: Latency | float = 1.0,
        *,
        fail: Callable[[GenerationRequest], bool] | None = None,
        error: Callable[[str], BaseException] = GenerationError,
        lengths: Callable[[GenerationRequest], Sequence[int]] | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        self.lengths = lengths or (lambda r: [1] * r.num_generations)
        self.max_new_tokens = max_new_tokens
        self.latency = latency if callable(latency) else (lambda _r, x=latency: x)
        self.fail = fail or (lambda _r: False)
        self.fail_error = error
        self.weight_version = 0
        self.versions_seen: list[int] = []
        self.aborted: list[Any] = []
        self.invalidations = 0
        self.generated = 0
        self.active = 0
        self.max_active = 0
        self._cancel: dict[Any, asyncio.Future[None]] = {}

    async def generate(self, request: GenerationRequest) -> GroupResult:
        start = self.weight_version if request.start_weight is None else request.start_weight
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await advance(self.latency(request))
        finally:
            self.active -= 1
        if request.group_id in self.aborted:
            raise GroupAborted(request.group_id)
        if self.fail(request):
            raise self.fail_error(f"injected failure of group {request.group_id}")
        self.generated += 1
        n = request.num_generations
        texts = [str((request.prompt.prompt_id + i) % 7) for i in range(n)]
        # Every token sampled with the weights held at the end: one span, built
        # directly (Completion.of would convert lists the fake makes as ints and
        # floats already; the record still checks itself when it is made).
        v = self.weight_version
        completions = [Completion([3] * k, [-0.5] * k, ((v, k),) if k else (),
                                  "length" if k == self.max_new_tokens else "stop", text)
                       for k, text in zip(self.lengths(request), texts)]
        return GroupResult(request.group_id, [1, 2], completions, start)

    async def update_weights(self, weights: Any, version: int) -> None:
        self.versions_seen.append(version)
        self.weight_version = version

    async def abort(self, group_ids: Sequence[Any]) -> None:
        self.aborted.extend(group_ids)

    async def invalidate_cache(self) -> None:
        self.invalidations += 1

    async def close(self) -> None:
        return None


class PressuredEngine(FakeEngine):
    """A FakeEngine that reports its load (``asyncrl.engines.ReportsPressure``)
    as a batching engine with room for ``room`` groups would: groups beyond it
    wait, the KV-cache usage is the fraction of the room in use, and each group
    that starts while ``preempt_over`` or more generate preempts one (thrash)."""

    def __init__(self, latency: Latency | float = 1.0, *, room: int,
                 preempt_over: int | None = None) -> None:
        super().__init__(latency)
        self.room = room
        self.preempt_over = preempt_over
        self.preemptions = 0
        self.reads = 0

    async def generate(self, request: GenerationRequest) -> GroupResult:
        if self.preempt_over is not None and self.active >= self.preempt_over:
            self.preemptions += 1
        return await super().generate(request)

    async def pressure(self) -> EnginePressure:
        self.reads += 1
        running = min(self.active, self.room)
        return EnginePressure(running, self.active - running, running / self.room,
                              self.preemptions)


class FakeTrainer:
    """Takes ``step_time`` virtual seconds per optimizer step, ``chunk_time`` per chunk.

    It keeps every chunk it trained (``chunks``) for tests to inspect;
    ``keep_chunks=False`` keeps none, as a real trainer does (a benchmark's
    heap then holds only what the controller holds)."""

    def __init__(self, step_time: float = 1.0, chunk_time: float = 0.0,
                 fail_at_step: int | None = None, *, keep_chunks: bool = True) -> None:
        self.step_time = step_time
        self.chunk_time = chunk_time
        self.fail_at_step = fail_at_step
        self.keep_chunks = keep_chunks
        self.chunks: list[tuple[int, list[Rollout]]] = []
        self.steps: list[int] = []

    async def train_chunk(self, rollouts: Sequence[Rollout], *, step: int) -> dict[str, float]:
        if self.fail_at_step is not None and step >= self.fail_at_step:
            raise ValueError(f"injected trainer failure at step {step}")
        if self.keep_chunks:
            self.chunks.append((step, list(rollouts)))
        if self.chunk_time:
            await advance(self.chunk_time)
        return {"loss": 1.0 / (step + 1)}

    async def finish_step(self, *, step: int) -> dict[str, float]:
        await advance(self.step_time)
        self.steps.append(step)
        return {"grad_norm": 1.0}

    async def get_weights(self) -> Any:
        return {"step": len(self.steps)}

    def state_dict(self) -> dict[str, Any]:
        return {"steps": list(self.steps)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = list(state["steps"])

    async def close(self) -> None:
        return None


def lognormal_latency(seed: int, median: float = 1.0, sigma: float = 0.8) -> Latency:
    """Random per-attempt latency with a long tail: completions arrive out of order."""
    rng = random.Random(seed)
    return lambda _req: rng.lognormvariate(0.0, sigma) * median
